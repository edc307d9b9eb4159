"""``fsedp rtl report``: scheduling latency in cycles (measured in RTL simulation) and Yosys
cell counts per block, over a grid of expert and chiplet counts."""

import dataclasses
import re
import shutil
import subprocess
import sys
import time

from fsedp.files import build_dir
from fsedp.hw.generate import BLOCKS, top_name, write_verilog
from fsedp.params import SchedulerParams
from fsedp.sw.sorter import stage_count

#: Generic gate-level flow: memories stay macros ($mem, counted in bits), the rest is mapped
#: to Yosys' internal gate library by ABC.
YOSYS_FLOW = (
    "hierarchy -top {top}; proc; flatten; opt -full; memory -nomap; opt; wreduce; "
    "techmap; opt -fast; abc -fast; opt_clean; stat"
)


def yosys_cells(block: str, p: SchedulerParams, blackbox: tuple[str, ...] = ()) -> dict:
    """Cells and memory bits of ``block`` with Debian's Yosys (ABC mapping)."""
    yosys = shutil.which("yosys")
    if yosys is None:
        return {
            "cells": None,
            "memory_bits": None,
            "note": "yosys not found (apt-get install yosys)",
        }
    src = write_verilog(block, p, build_dir("report") / "rtl" / _key(p))
    top = top_name(block)
    pre = "".join(f"blackbox {top}.{b}; " for b in blackbox)
    script = f"read_verilog -sv {src}; {pre}" + YOSYS_FLOW.format(top=top)
    t0 = time.time()
    proc = subprocess.run([yosys, "-p", script], capture_output=True, text=True)
    if proc.returncode != 0:
        return {
            "cells": None,
            "memory_bits": None,
            "note": " ".join(proc.stderr.strip().splitlines()[-1:]),
        }
    stat = proc.stdout[proc.stdout.rfind("Printing statistics") :]
    cells = int(re.search(r"Number of cells:\s+(\d+)", stat).group(1))
    macros = sum(int(n) for n in re.findall(r"\$mem_v2\s+(\d+)", stat))
    # each black-boxed submodule is instantiated once and counted as one cell; SRAM macros
    # ($mem_v2) are reported as bits, not cells
    return {
        "cells": cells - len(blackbox) - macros,
        "sram_macros": macros,
        "memory_bits": sram_bits(block, p),
        "seconds": round(time.time() - t0, 1),
    }


def sram_bits(block: str, p: SchedulerParams) -> int:
    """Bits of the single-cycle SRAMs: EIT banks ``R x E x (C + W)`` and the scheduler's
    trajectory memory ``E x C``."""
    if not isinstance(p, SchedulerParams):
        return None  # datapath: reported as the number of SRAM macros
    eit = p.requests * p.experts * (p.chiplets + p.count_width)
    return {"eit": eit, "scheduler": eit + p.experts * p.chiplets}.get(block, 0)


def _key(p) -> str:
    if isinstance(p, SchedulerParams):
        return f"e{p.experts}-c{p.chiplets}-r{p.requests}-w{p.count_width}"
    import hashlib
    import json

    return (
        "dp-"
        + hashlib.sha1(json.dumps(dataclasses.asdict(p), sort_keys=True).encode()).hexdigest()[:10]
    )


def _tb(block, p, sim, knobs):
    from fsedp.tb.runner import run_tb

    return run_tb(block, p, sim, build_dir("report") / "sim", knobs=knobs, seed=1, tag="-report")


def rtl_report(
    base: SchedulerParams,
    experts,
    chiplets,
    sim="verilator",
    cells=True,
    latency=True,
    rounds=6,
    progress=False,
) -> list[dict]:
    rows = []
    sorter_cache: dict[int, dict] = {}
    for e in experts:
        for c in chiplets:
            p = dataclasses.replace(base, experts=e, chiplets=c)
            row = {"experts": e, "chiplets": c, "sorter_stages": stage_count(p.sorter_lanes)}
            if progress:
                print(f"[report] E={e} C={c} ...", file=sys.stderr, flush=True)
            if latency:
                if e not in sorter_cache:
                    sorter_cache[e] = {
                        "latency": _tb("sorter", p, sim, {"vectors": 4, "stall": 0.0})["latency"]
                    }
                row["sorter_latency"] = sorter_cache[e]["latency"]
                res = _tb(
                    "scheduler",
                    p,
                    sim,
                    {
                        "rounds": rounds,
                        "stall": 0.0,
                        "tokens": 64,
                        "top_k": min(8, e),
                        "per_token": 2,
                        "max_delay": 4,
                    },
                )
                first, done, gaps = (
                    res.get("latency_first_dispatch", []),
                    res.get("latency_done_to_dispatch", []),
                    res.get("dispatch_gaps", []),
                )
                row.update(
                    first_dispatch_max=max(first, default=None),
                    done_to_dispatch_mean=round(sum(done) / len(done), 1) if done else None,
                    done_to_dispatch_max=max(done, default=None),
                    dispatch_gap_min=min(gaps, default=None),
                    cosim_mismatches=res.get("mismatches"),
                )
            if cells:
                blocks = {}
                for b in BLOCKS:
                    if b == "sorter":
                        if "cells" not in sorter_cache.setdefault(e, {}):
                            sorter_cache[e].update(yosys_cells("sorter", p))
                        blocks[b] = {k: sorter_cache[e].get(k) for k in ("cells", "memory_bits")}
                    elif b == "scheduler":
                        glue = yosys_cells("scheduler", p, blackbox=("sorter",))
                        total = (
                            glue["cells"] + blocks["sorter"]["cells"]
                            if glue["cells"] is not None and blocks["sorter"]["cells"] is not None
                            else None
                        )
                        blocks[b] = {"cells": total, "memory_bits": glue["memory_bits"]}
                    else:
                        blocks[b] = yosys_cells(b, p)
                row["cells"] = {b: v.get("cells") for b, v in blocks.items()}
                row["memory_bits"] = blocks["scheduler"]["memory_bits"]
            rows.append(row)
    return rows


def format_report(rows) -> str:
    """Markdown tables: latency, then cells per block."""
    out = [
        "Latency in clock cycles, measured in RTL simulation (dispatch ready every cycle).",
        "",
        "| E | C | sorter stages | sorter latency | last record -> 1st dispatch (max) | "
        "completion -> dispatch (mean / max) | min cycles between beats (dispatch or pre-load) | "
        "cosim mismatches |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['experts']} | {r['chiplets']} | {r['sorter_stages']} | "
            f"{r.get('sorter_latency', '-')} | "
            f"{r.get('first_dispatch_max', '-')} | {r.get('done_to_dispatch_mean', '-')} / "
            f"{r.get('done_to_dispatch_max', '-')} | {r.get('dispatch_gap_min', '-')} | "
            f"{r.get('cosim_mismatches', '-')} |"
        )
    if any("cells" in r for r in rows):
        names = list(BLOCKS)
        out += [
            "",
            "Yosys cells per block (generic gates after ABC; SRAMs counted in bits, not cells; "
            "`scheduler` is the whole top including every block).",
            "",
            "| E | C | " + " | ".join(names) + " | SRAM bits (EIT + trajectories) |",
            "|---|---|" + "---|" * (len(names) + 1),
        ]
        for r in rows:
            cells = r.get("cells", {})
            out.append(
                f"| {r['experts']} | {r['chiplets']} | "
                + " | ".join(str(cells.get(n, "-")) for n in names)
                + f" | {r.get('memory_bits', '-')} |"
            )
    return "\n".join(out)
