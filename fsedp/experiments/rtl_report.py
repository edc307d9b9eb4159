"""``fsedp rtl report``: scheduling latency in cycles (measured in RTL simulation) and Yosys
cell counts per block, over a grid of expert and chiplet counts."""

import dataclasses
import re
import shutil
import subprocess
import time

from fsedp.files import build_dir
from fsedp.hw.generate import BLOCKS, top_name, write_verilog
from fsedp.log import logger
from fsedp.params import SchedulerParams
from fsedp.sw.sorter import network

_log = logger("rtl_report")

#: Generic gate-level flow: memories stay macros ($mem, counted in bits), constant tables
#: stay logic (``proc -norom``), the rest is mapped to Yosys' internal gate library by ABC;
#: ``ltp -noff`` gives the longest combinational path in gates.
YOSYS_FLOW = (
    "hierarchy -top {top}; proc -norom; flatten; opt -full; memory -nomap; opt; wreduce; "
    "techmap; opt -fast; abc; opt_clean; stat; ltp -noff"
)

#: Area of each Yosys internal gate in NAND2 equivalents (the assumption of the report's
#: "NAND2-eq." column: typical ratios of a standard-cell library's X1 cells; a flip-flop
#: with enable or synchronous reset counts its gate).
NAND2_AREA = {
    "$_NOT_": 0.67,
    "$_BUF_": 1.0,
    "$_NAND_": 1.0,
    "$_NOR_": 1.0,
    "$_AND_": 1.33,
    "$_OR_": 1.33,
    "$_ANDNOT_": 1.33,
    "$_ORNOT_": 1.33,
    "$_XOR_": 2.33,
    "$_XNOR_": 2.33,
    "$_MUX_": 2.33,
    "$_AOI3_": 1.33,
    "$_OAI3_": 1.33,
    "$_AOI4_": 1.67,
    "$_OAI4_": 1.67,
    "$_DFF_P_": 4.33,
    "$_SDFF_": 5.0,
    "$_DFFE_": 5.33,
    "$_SDFFE_": 6.0,
    "$_SDFFCE_": 6.0,
}


#: Whole-scheduler cells of the first generation (two EIT scans, fully parallel bitonic
#: sorter, scan of the paired order), as measured by this report at commit ca8b52e with
#: ``abc -fast`` (``git show ca8b52e:docs/rtl-report.md``), per (E, C).
FIRST_GENERATION_CELLS = {
    (16, 4): 15203, (16, 9): 16212, (16, 16): 18199,
    (32, 4): 41484, (32, 9): 42501, (32, 16): 44475,
    (64, 4): 110782, (64, 9): 111798, (64, 16): 113784,
    (128, 4): 312618, (128, 9): 313634, (128, 16): 315620,
    (256, 4): 835021, (256, 9): 836038, (256, 16): 838023,
}  # fmt: skip
#: The parameters of those measurements (the comparison is printed only for rows with them).
FIRST_GENERATION_PARAMS = {"count_width": 10, "requests": 8, "theta_min": 2, "n_threshold": 4}
#: First generation, last gate record -> first dispatch (cycles), same source.
FIRST_GENERATION_LATENCY = {16: 48, 32: 85, 64: 155, 128: 290, 256: 554}

#: Assumptions of the area estimate against the paper's 0.43 mm^2 (Synopsys DC, UMC 28 nm,
#: the whole scheduler of a 4-chiplet prototype): a NAND2 X1 cell of a 28-nm library and a
#: small single-port SRAM's area per bit including its periphery.
UM2_PER_NAND2 = 0.5
UM2_PER_SRAM_BIT = 0.25
PAPER_MM2 = 0.43


def area_mm2(nand2: float | None, sram_bits: int | None) -> float | None:
    """Estimated area at 28 nm from NAND2 equivalents and SRAM bits."""
    if nand2 is None:
        return None
    return round((nand2 * UM2_PER_NAND2 + (sram_bits or 0) * UM2_PER_SRAM_BIT) / 1e6, 3)


def nand2_area(stat: str) -> float | None:
    """NAND2 equivalents of a Yosys ``stat`` listing (None if a gate type is unknown)."""
    total = 0.0
    for name, n in re.findall(r"^\s+(\$_\w+_)\s+(\d+)$", stat, re.M):
        key = name if name in NAND2_AREA else re.sub(r"_[PNX01]+_$", "_", name)
        if key not in NAND2_AREA:
            return None
        total += NAND2_AREA[key] * int(n)
    return round(total)


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
    ltp = re.search(r"Longest topological path in \S+ \(length=(\d+)\)", proc.stdout)
    stat = stat[: stat.find("Longest topological")] if ltp else stat
    cells = int(re.search(r"Number of cells:\s+(\d+)", stat).group(1))
    macros = sum(int(n) for n in re.findall(r"\$mem_v2\s+(\d+)", stat))
    # each black-boxed submodule is instantiated once and counted as one cell; SRAM macros
    # ($mem_v2) are reported as bits, not cells
    return {
        "cells": cells - len(blackbox) - macros,
        "nand2": nand2_area(stat),
        "gate_levels": int(ltp.group(1)) if ltp else None,
        "sram_macros": macros,
        "memory_bits": sram_bits(block, p),
        "seconds": round(time.time() - t0, 1),
    }


def sram_bits(block: str, p: SchedulerParams) -> int:
    """Bits of the single-cycle SRAMs: EIT banks ``R x E x (C + W)`` (padded to whole words
    of ``eit_lanes`` experts) and, with ``balance``, the order table ``N x log2(N)``."""
    if not isinstance(p, SchedulerParams):
        return None  # datapath: reported as the number of SRAM macros
    words = -(-p.experts // p.eit_lanes)
    eit = p.requests * words * p.eit_lanes * (p.chiplets + p.count_width)
    order = p.sorter_lanes * p.lane_id_bits if p.balance else 0
    return {"eit": eit, "pairing": order, "scheduler": eit + order}.get(block, 0)


def _key(p) -> str:
    import hashlib
    import json

    return ("s-" if isinstance(p, SchedulerParams) else "dp-") + hashlib.sha1(
        json.dumps(dataclasses.asdict(p), sort_keys=True).encode()
    ).hexdigest()[:10]


def _tb(block, p, sim, knobs):
    from fsedp.tb.runner import run_tb

    return run_tb(block, p, sim, build_dir("report") / "sim", knobs=knobs, seed=1, tag="-report")


def _sum(a, b, key):
    return a[key] + b[key] if a.get(key) is not None and b.get(key) is not None else None


def rtl_report(
    base: SchedulerParams,
    experts,
    chiplets,
    sim="verilator",
    cells=True,
    latency=True,
    rounds=6,
    progress=False,
    sorters=(),
) -> list[dict]:
    """One row per (E, C): latency measured in cosimulation (``rounds`` random rounds of 64
    tokens, top-8, no stalls), and with ``cells`` Yosys cells, NAND2 equivalents and gate
    levels per block; ``sorters`` adds the sorter variants' figures (cells and cycles)."""
    rows = []
    sorter_cache: dict[tuple, dict] = {}
    for e in experts:
        for c in chiplets:
            p = dataclasses.replace(base, experts=e, chiplets=c)
            row = {
                "experts": e,
                "chiplets": c,
                "first_generation_params": all(
                    getattr(p, k) == v for k, v in FIRST_GENERATION_PARAMS.items()
                ),
                "sorter": p.sorter,
                "sorter_cycles": network(p.sorter_lanes, p.sorter).cycles,
            }
            if progress:
                _log.info(f"E={e} C={c} ...")
            if latency:
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
                plain = res.get("latency_first_dispatch_plain", [])
                deferral = res.get("latency_first_dispatch_deferral", [])
                done, gaps = res.get("latency_done_to_dispatch", []), res.get("dispatch_gaps", [])
                row.update(
                    first_dispatch_max=max(plain, default=None),
                    first_dispatch_deferral_max=max(deferral, default=None),
                    done_to_dispatch_mean=round(sum(done) / len(done), 1) if done else None,
                    done_to_dispatch_max=max(done, default=None),
                    dispatch_gap_min=min(gaps, default=None),
                    cosim_mismatches=res.get("mismatches"),
                )
            if cells:
                blocks = {}
                for b in BLOCKS:
                    if b == "sorter":
                        key = (e, c, p.sorter)
                        if key not in sorter_cache:
                            sorter_cache[key] = yosys_cells("sorter", p)
                        blocks[b] = sorter_cache[key]
                    elif b == "scheduler":
                        glue = yosys_cells("scheduler", p, blackbox=("sorter",))
                        srt = blocks["sorter"]
                        levels = [x.get("gate_levels") for x in (glue, srt)]
                        blocks[b] = {
                            "cells": _sum(glue, srt, "cells"),
                            "nand2": _sum(glue, srt, "nand2"),
                            "gate_levels": max(levels) if None not in levels else None,
                            "memory_bits": glue.get("memory_bits"),
                            "note": glue.get("note") or srt.get("note"),
                        }
                    else:
                        blocks[b] = yosys_cells(b, p)
                row["cells"] = {b: v.get("cells") for b, v in blocks.items()}
                row["nand2"] = {b: v.get("nand2") for b, v in blocks.items()}
                row["gate_levels"] = {b: v.get("gate_levels") for b, v in blocks.items()}
                row["memory_bits"] = blocks["scheduler"].get("memory_bits")
                notes = {v.get("note") for v in blocks.values()} - {None}
                if notes:
                    row["note"] = "; ".join(sorted(notes))
                variants = {}
                for kind in sorters:
                    q = dataclasses.replace(p, sorter=kind)
                    key = (e, c, kind)
                    if key not in sorter_cache:
                        sorter_cache[key] = yosys_cells("sorter", q)
                    variants[kind] = {
                        "cycles": network(q.sorter_lanes, kind).cycles,
                        **{k: sorter_cache[key].get(k) for k in ("cells", "nand2", "gate_levels")},
                    }
                if variants:
                    row["sorter_variants"] = variants
            rows.append(row)
    return rows


def _v(x):
    return "-" if x is None else str(x)


def format_report(rows) -> str:
    """Markdown tables: latency, cells per block, sorter variants."""
    out = [
        "Latency in clock cycles, measured in RTL simulation (dispatch ready every cycle; "
        "from the cycle after the transfer to the first cycle with `dispatch.valid`).",
        "",
        "| E | C | sorter | sort cycles | last record -> 1st dispatch (max), no deferral | "
        "... in a deferral round | completion -> dispatch (mean / max) | "
        "min cycles between beats | cosim mismatches |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['experts']} | {r['chiplets']} | {r['sorter']} | {r['sorter_cycles']} | "
            f"{_v(r.get('first_dispatch_max'))} | {_v(r.get('first_dispatch_deferral_max'))} | "
            f"{_v(r.get('done_to_dispatch_mean'))} / {_v(r.get('done_to_dispatch_max'))} | "
            f"{_v(r.get('dispatch_gap_min'))} | {_v(r.get('cosim_mismatches'))} |"
        )
    if any("cells" in r for r in rows):
        names = list(BLOCKS)
        out += [
            "",
            "Yosys cells per block (generic gates after ABC; SRAMs counted in bits, not cells; "
            "`scheduler` is the whole top including every block), then the whole scheduler's "
            "area in NAND2 equivalents (`NAND2_AREA`) and its longest combinational path in "
            "gates (`ltp -noff`).",
            "",
            "| E | C | " + " | ".join(names) + " | scheduler NAND2-eq. | gate levels | SRAM bits |",
            "|---|---|" + "---|" * (len(names) + 3),
        ]
        for r in rows:
            cells = r.get("cells", {})
            out.append(
                f"| {r['experts']} | {r['chiplets']} | "
                + " | ".join(_v(cells.get(n)) for n in names)
                + f" | {_v(r.get('nand2', {}).get('scheduler'))} | "
                f"{_v(r.get('gate_levels', {}).get('scheduler'))} | {_v(r.get('memory_bits'))} |"
            )
        notes = sorted({r["note"] for r in rows if r.get("note")})
        if notes:
            out += ["", "Not measured: " + "; ".join(notes) + "."]
    if any("cells" in r for r in rows):
        out += [
            "",
            "Against the first generation (its whole-scheduler cells and first-dispatch latency "
            "as measured at commit ca8b52e, `abc -fast`, with "
            f"`{FIRST_GENERATION_PARAMS}`; its cells are shown only for rows with those "
            "parameters) and the paper's "
            f"{PAPER_MM2} mm^2 (Synopsys DC, UMC 28 nm, 4-chiplet prototype; expert count "
            f"not stated). Area estimate: {UM2_PER_NAND2} um^2 per NAND2 equivalent and "
            f"{UM2_PER_SRAM_BIT} um^2 per SRAM bit (28-nm assumptions, not a library "
            "mapping).",
            "",
            "| E | C | first gen. cells | cells | smaller by | first gen. 1st dispatch | "
            "1st dispatch | est. area mm^2 | paper mm^2 |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            same = r.get("first_generation_params", False)
            old = FIRST_GENERATION_CELLS.get((r["experts"], r["chiplets"])) if same else None
            new = r.get("cells", {}).get("scheduler")
            ratio = f"{old / new:.1f}x" if old and new else "-"
            area = area_mm2(r.get("nand2", {}).get("scheduler"), r.get("memory_bits"))
            out.append(
                f"| {r['experts']} | {r['chiplets']} | {_v(old)} | {_v(new)} | {ratio} | "
                f"{_v(FIRST_GENERATION_LATENCY.get(r['experts']))} | "
                f"{_v(r.get('first_dispatch_max'))} | {_v(area)} | {PAPER_MM2} |"
            )
    if any("sorter_variants" in r for r in rows):
        out += [
            "",
            "Sorter variants (`--sorter`; every one gives the same order):",
            "",
            "| E | C | variant | sort cycles | cells | NAND2-eq. | gate levels |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            for kind, v in r.get("sorter_variants", {}).items():
                out.append(
                    f"| {r['experts']} | {r['chiplets']} | {kind} | {v['cycles']} | "
                    f"{_v(v['cells'])} | {_v(v['nand2'])} | {_v(v['gate_levels'])} |"
                )
    return "\n".join(out)
