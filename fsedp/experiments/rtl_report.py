"""``fsedp rtl report``: scheduling latency in cycles (measured in RTL simulation), Yosys
cell counts per block, and with a Liberty library (``--liberty``) area, timing and power
of every block, sorter variant and the chip top mapped to it (the flow of
:mod:`fsedp.experiments.synth`), over a grid of expert and chiplet counts; with ``--fpga``
the ECP5 figures of the scheduler and the chip top (:mod:`fsedp.experiments.fpga`)."""

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

#: The paper's scheduler: Synopsys DC, UMC 28 nm, the whole scheduler of a 4-chiplet
#: prototype (expert count not stated).
PAPER_MM2 = 0.43


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
    library=None,
) -> list[dict]:
    """One row per (E, C): latency measured in cosimulation (``rounds`` random rounds of 64
    tokens, top-8, no stalls), and with ``cells`` Yosys cells and gate levels per block;
    ``sorters`` adds the sorter variants' figures (cells and cycles).  ``library`` (a
    :class:`Library`) adds each block's, the scheduler's and the sorter variants' figures
    mapped to it (``row["library"]``, ``row["library_sorters"]``), vectorless (the
    gate-level runs are :func:`chip_figures`' at one small size: their Verilator builds grow
    with the netlist)."""
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
                            "gate_levels": max(levels) if None not in levels else None,
                            "memory_bits": glue.get("memory_bits"),
                            "note": glue.get("note") or srt.get("note"),
                        }
                    else:
                        blocks[b] = yosys_cells(b, p)
                row["cells"] = {b: v.get("cells") for b, v in blocks.items()}
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
                        **{k: sorter_cache[key].get(k) for k in ("cells", "gate_levels")},
                    }
                if variants:
                    row["sorter_variants"] = variants
            if library is not None:  # vectorless; the gate-level runs: chip_figures
                row["library"] = {b: library.figures(b, p, False) for b in BLOCKS}
                if sorters and c == min(chiplets):
                    row["library_sorters"] = {
                        kind: library.figures("sorter", dataclasses.replace(p, sorter=kind), False)
                        for kind in sorters
                    }
            rows.append(row)
    return rows


@dataclasses.dataclass
class Library:
    """The blocks mapped to a Liberty library by :func:`fsedp.experiments.synth.synthesize`
    in one work folder (:func:`~fsedp.experiments.synth.workspace`) at ``clock_mhz``; with
    ``activity`` each block with a bench of its own runs it on its netlist and its power is
    also the recorded activity's."""

    lib: object
    work: object
    fo4: dict
    clock_mhz: float
    activity: bool = False
    progress: bool = False

    def figures(self, top: str, p, activity: bool = True) -> dict:
        """One top's figures (the keys of :data:`LIBRARY_KEYS`), or its ``error``; the
        gate-level run where ``activity`` and the library's ``activity`` both ask for it."""
        from fsedp.experiments import synth

        if self.progress:
            _log.info(f"{top}: mapping to {self.lib.name} ...")
        out = self.work / "files"
        out.mkdir(exist_ok=True)
        r = synth.synthesize(
            top, p, self.lib, self.clock_mhz, self.work, out, self.activity and activity, self.fo4
        )
        shutil.rmtree(out)  # the netlists are large; the figures are what the report keeps
        fig = {k: r.get(k) for k in LIBRARY_KEYS}
        fig["power_mw"] = (r.get("power_mw") or {}).get("total")
        a = r.get("activity") or {}
        fig["activity_power_mw"] = (r.get("activity_power_mw") or {}).get("total")
        if a and not a.get("no_bench"):
            from fsedp.experiments.activity import passed

            fig["activity"] = {
                "cycles": a.get("cycles"),
                "passed": passed(a),
                "input_cone": round(a["input_cone_cells"] / max(1, a["cells"]), 3)
                if "cells" in a
                else None,
                **{k: a.get(k) for k in ("bench", "check", "error", "pins_set")},
            }
        if r.get("error"):
            fig["error"] = r["error"]
        return fig


def chip_figures(library: Library, sp: SchedulerParams, dp) -> dict:
    """Every block of one chip -- the scheduler's at ``sp``, the datapath's (one chiplet's,
    the DDR controller) at the datapath generics ``dp`` -- and the chip top (the scheduler
    driving ``dp``'s chiplet array), mapped to ``library`` with the gate-level runs."""
    from fsedp.hw.generate import CHIP_BLOCKS, DATAPATH_BLOCKS, top_params

    tops = [*BLOCKS, *(t for t in DATAPATH_BLOCKS if t != "chiplet_array"), *CHIP_BLOCKS]
    return {t: library.figures(t, top_params(t, sp, dp)) for t in tops}


#: What the report keeps of a top mapped to a library.
LIBRARY_KEYS = (
    "cell_count",
    "flip_flops",
    "memory_bits",
    "area_um2",
    "arrival_ns",
    "arrival_fo4",
    "slack_ns",
    "cycle_fo4",
    "budget_fo4_28nm",
    "meets_28nm",
    "synth_s",
)


def _v(x):
    return "-" if x is None else str(x)


def format_report(rows, library: dict | None = None, datapath: dict | None = None) -> str:
    """Markdown tables: latency, cells per block, sorter variants; with ``library`` (how
    the tops were mapped: ``name``, ``clock_mhz``, ``fo4_ps``, ``activity``) the library
    tables of the rows and of ``datapath`` (:func:`datapath_figures`)."""
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
            "`scheduler` is the whole top including every block) and the whole scheduler's "
            "longest combinational path in gates (`ltp -noff`).",
            "",
            "| E | C | " + " | ".join(names) + " | gate levels | SRAM bits |",
            "|---|---|" + "---|" * (len(names) + 2),
        ]
        for r in rows:
            cells = r.get("cells", {})
            out.append(
                f"| {r['experts']} | {r['chiplets']} | "
                + " | ".join(_v(cells.get(n)) for n in names)
                + f" | {_v(r.get('gate_levels', {}).get('scheduler'))} | "
                f"{_v(r.get('memory_bits'))} |"
            )
        notes = sorted({r["note"] for r in rows if r.get("note")})
        if notes:
            out += ["", "Not measured: " + "; ".join(notes) + "."]
    if library:
        out += _library_tables(rows, library, datapath or {})
    if any("cells" in r for r in rows):
        lib_name = library["name"] if library else None
        out += [
            "",
            "Against the first generation (its whole-scheduler cells and first-dispatch latency "
            "as measured at commit ca8b52e, `abc -fast`, with "
            f"`{FIRST_GENERATION_PARAMS}`; its cells are shown only for rows with those "
            "parameters) and the paper's "
            f"{PAPER_MM2} mm^2 (Synopsys DC, UMC 28 nm, 4-chiplet prototype; expert count "
            "not stated)"
            + (
                f"; the area is the whole scheduler's mapped to `{lib_name}` (memories as "
                "flip-flops, see above)."
                if lib_name
                else "; without `--liberty` no area is given (it needs a library)."
            ),
            "",
            "| E | C | first gen. cells | cells | smaller by | first gen. 1st dispatch | "
            "1st dispatch | area mm^2"
            + (f" ({lib_name})" if lib_name else "")
            + " | paper mm^2 (UMC 28 nm) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            same = r.get("first_generation_params", False)
            old = FIRST_GENERATION_CELLS.get((r["experts"], r["chiplets"])) if same else None
            new = r.get("cells", {}).get("scheduler")
            ratio = f"{old / new:.1f}x" if old and new else "-"
            um2 = (r.get("library") or {}).get("scheduler", {}).get("area_um2")
            out.append(
                f"| {r['experts']} | {r['chiplets']} | {_v(old)} | {_v(new)} | {ratio} | "
                f"{_v(FIRST_GENERATION_LATENCY.get(r['experts']))} | "
                f"{_v(r.get('first_dispatch_max'))} | "
                f"{'-' if um2 is None else f'{um2 / 1e6:.3f}'} | {PAPER_MM2} |"
            )
    if any("sorter_variants" in r for r in rows):
        out += [
            "",
            "Sorter variants (`--sorter`; every one gives the same order), generic cells:",
            "",
            "| E | C | variant | sort cycles | cells | gate levels |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            for kind, v in r.get("sorter_variants", {}).items():
                out.append(
                    f"| {r['experts']} | {r['chiplets']} | {kind} | {v['cycles']} | "
                    f"{_v(v['cells'])} | {_v(v['gate_levels'])} |"
                )
    return "\n".join(out)


def _lib_row(first: str, f: dict, activity: bool) -> str:
    if f.get("error") and f.get("area_um2") is None:
        return f"| {first} | failed: {f['error'][:120]} |"
    a = f.get("activity")
    rec = "-"
    if a is not None and a.get("cycles") is None:
        rec = "FAILED: " + str(a.get("error"))[:80]
    elif a is not None:
        cone = (
            "" if a.get("input_cone") is None else f", {100 * a['input_cone']:.0f} % in input cones"
        )
        rec = (
            f"{_num(f.get('activity_power_mw'))} ({a['cycles']} cycles{cone}"
            f"{'' if a['passed'] else ', FAILED'})"
        )
    return (
        f"| {first} | {_v(f.get('cell_count'))} | {_v(f.get('flip_flops'))} | "
        f"{_num(f.get('area_um2'), '{:.0f}')} | {_num(f.get('arrival_ns'))} | "
        f"{_num(f.get('arrival_fo4'), '{:.1f}')} | {_num(f.get('slack_ns'))} | "
        f"{_num(f.get('cycle_fo4'), '{:.1f}')} "
        f"({'-' if f.get('meets_28nm') is None else 'met' if f['meets_28nm'] else 'missed'}) | "
        f"{_num(f.get('power_mw'))}"
        + (f" (failed: {f['error'][:100]})" if f.get("error") else "")
        + " |"
        + (f" {rec} |" if activity else "")
    )


def _num(x, fmt="{:.3f}"):
    return "-" if x is None else fmt.format(x)


def _library_tables(rows, library: dict, datapath: dict) -> list[str]:
    act = library.get("activity", False)
    from fsedp.experiments.synth import FO4_28NM_PS, budget_fo4

    head = (
        "| cells | flip-flops | area um^2 | critical path ns | in FO4 | slack ns | "
        f"cycle in FO4 (at 28 nm: {budget_fo4(library['clock_mhz']):.1f}) | "
        "power mW (vectorless) |" + (" power mW (recorded activity) |" if act else "")
    )
    rule = "|---|---|---|---|---|---|---|---|" + ("---|" if act else "")
    intro = (
        f"Mapped to `{library['name']}` and timed at {library['clock_mhz']:g} MHz (period "
        f"{1000 / library['clock_mhz']:.3f} ns) by the flow of `fsedp rtl synth` "
        "([`rtl-synthesis.md`](rtl-synthesis.md): Yosys and ABC with delay target, buffering "
        "and sizing; OpenSTA), pre-layout: no wires, ideal clock, memories as flip-flops. "
        f"FO4 of the library {_num(library.get('fo4_ps'), '{:.1f}')} ps. The cycle (critical "
        "path plus the capturing flip-flop's setup) in FO4 against the clock's period in "
        f"28-nm FO4 ({FO4_28NM_PS} ps assumed: `fsedp.experiments.synth.FO4_28NM_PS`, "
        "[`rtl-synthesis.md`](rtl-synthesis.md)): met or missed at the paper's technology. "
        "Power: OpenSTA's "
        "vectorless estimate (0.1 transitions per cycle at the inputs)"
        + (
            ", and from the activity of a gate-level run of the block's own bench on its "
            "mapped netlist (Verilator; registers and ports recorded, the other nets "
            "evaluated cycle by cycle; every cell output's toggles per cycle; the bench "
            "checks the netlist against the golden model: FAILED would say it did not pass "
            "or its recording did not check; the cells in input bits' cones, whose "
            "activities this OpenSTA re-propagates from the recorded input activity, are "
            "counted), for every block and the chip top of the "
            "small chip below (`-` in the grid: the Verilator build of a mapped netlist "
            "grows with it, see `rtl-synthesis.md`)."
            if act
            else "."
        )
    )
    out = ["", intro, ""]
    for r in rows:
        lib = r.get("library")
        if not lib:
            continue
        out += [
            f"E = {r['experts']}, C = {r['chiplets']}:",
            "",
            "| block " + head,
            "|---" + rule,
        ]
        out += [_lib_row(b, f, act) for b, f in lib.items()]
        out.append("")
    variants = [r for r in rows if r.get("library_sorters")]
    if variants:
        out += [
            "Sorter variants mapped to the library (at the smallest C of the grid):",
            "",
            "| E | C | variant " + head,
            "|---|---|---" + rule,
        ]
        for r in variants:
            for kind, f in r["library_sorters"].items():
                out.append(_lib_row(f"{r['experts']} | {r['chiplets']} | {kind}", f, act))
        out.append("")
    if datapath:
        out += [
            f"A small chip, every block and the chip top: {library.get('datapath', '')} "
            "(the scheduler's blocks at its generics, one chiplet's ring buffer and router, "
            "the chiplet, the DDR controller, and `fsedp_chip`, the scheduler and the "
            "chiplet array):",
            "",
            "| top " + head,
            "|---" + rule,
        ]
        out += [_lib_row(t, f, act) for t, f in datapath.items()]
    return out
