"""``fsedp rtl datapath``: measurements of the chiplet datapath.

* **ring**: cycles to stream one expert through every chiplet (rings of 4, 9, 16) against
  the ideal ``micro_slices x max(compute, link, DDR interval)`` plus the fill, at the
  deadlock-freedom minimum of slots and two above it (golden model; the lockstep
  cosimulation shows the RTL takes exactly the same cycles);
* **cells**: Yosys cell counts of each datapath component (Debian Yosys, ABC);
* **run**: a long random cosimulation of the RTL (cocotb) in lockstep with the golden model,
  with random stalls on every link and on DDR: conservation violations, deadlocks, peak
  occupancy per chiplet (RTL and golden model).
"""

import dataclasses

from fsedp.files import build_dir
from fsedp.params import DatapathParams, SchedulerParams, max_hops
from fsedp.sw.scheduler import DISPATCH, Dispatch
from fsedp.sw.streaming import StepIn, StreamingArray

__all__ = [
    "full_ring_dispatch",
    "one_expert_cycles",
    "ring_table",
    "cells_table",
    "long_run",
    "run_params",
    "format_markdown",
]


def full_ring_dispatch(n: int, tokens: int) -> Dispatch:
    """The dispatch of expert 0 on a trajectory of all ``n`` chiplets, entering at 0."""
    return ring_dispatch(n, range(n), tokens)


def ring_dispatch(n: int, chips, tokens: int) -> Dispatch:
    """The dispatch of expert 0 on the ring ``chips`` (ascending chiplet ids) of an
    ``n``-chiplet array, entering at the first, ``tokens`` on each of its chiplets."""
    chips = list(chips)
    hops = [0] * n
    for i, c in enumerate(chips):
        hops[c] = chips[(i + 1) % len(chips)]
    traj = sum(1 << c for c in chips)
    return Dispatch(DISPATCH, 0, tokens * len(chips), traj, chips[0], tuple(hops))


def one_expert_cycles(p: DatapathParams, tokens, chips=None, limit: int = 1_000_000) -> int:
    """Cycles from the dispatch of one expert on the ring ``chips`` (default: every chiplet)
    to its completion on the ``done`` port, both cycles counted.  ``tokens``: the tokens of
    the expert on each chiplet of the ring, one count or a list indexed by chiplet."""
    arr = StreamingArray(p)
    chips = list(range(p.chiplets)) if chips is None else list(chips)
    per = tokens if isinstance(tokens, list) else [tokens] * p.chiplets
    for c in chips:
        arr.step(StepIn(tokens=(c, 0, per[c])))
    arr.step(StepIn(dispatch=ring_dispatch(p.chiplets, chips, max(per[c] for c in chips))))
    cycles = 1
    while not arr.step(StepIn()).done:
        cycles += 1
        if cycles > limit:
            raise RuntimeError(f"one expert on ring {chips} not done after {limit} cycles")
    return cycles + 1


def one_expert_ideal(p: DatapathParams, tokens: int) -> tuple[int, int]:
    """``(ideal, fill)`` of :func:`one_expert_cycles`: *ideal* is the busiest resource --
    one chiplet's compute (``M x tokens x cycles_per_token``), the busiest link (micro-slices
    crossing it, Rule 4 striping the loads over the ring from chiplet 0, times
    ``link_cycles``), the DDR (loads per channel times ``ddr_interval``); *fill* is the DDR
    latency, the longest path's hops times ``link_cycles`` and one compute."""
    from fsedp.params import ring_after

    n, traj = p.chiplets, (1 << p.chiplets) - 1
    seq, pos = p.ring_table(0)
    load: dict = {}
    for i in range(p.micro_slices):
        c = seq[i % n]  # Rule 4 stripes the loads over the ring from its first chiplet
        for _ in range(n - 1):
            nxt = ring_after(traj, c, n, seq, pos)
            a = c
            while a != nxt:  # XY hops of the leg
                d = p.direction(a, nxt)
                load[(a, d)] = load.get((a, d), 0) + 1
                a = p.neighbour(a, d)
            c = nxt
    compute = p.micro_slices * tokens * p.cycles_per_token
    link = max(load.values(), default=0) * p.link_cycles
    ddr = -(-p.micro_slices // p.ddr_channels) * p.ddr_interval
    fill = p.ddr_latency + p.path_hops(traj, 0) * p.link_cycles + tokens * p.cycles_per_token
    return max(compute, link, ddr), fill


def ring_table(
    meshes=((2, 2), (3, 3), (4, 4)),
    cases=((1, 4), (4, 2), (8, 8)),
    micro_slices: int = 16,
    ddr_interval: int = 1,
    ddr_latency: int = 4,
) -> list[dict]:
    rows = []
    for r, c in meshes:
        hops = max_hops(r, c)
        for tokens, link in cases:
            base = dict(
                rows=r,
                cols=c,
                micro_slices=micro_slices,
                link_cycles=link,
                ddr_interval=ddr_interval,
                ddr_latency=ddr_latency,
            )
            p_min = DatapathParams(slots=hops + 1, **base)
            p_more = DatapathParams(slots=hops + 3, **base)
            ideal, fill = one_expert_ideal(p_min, tokens)
            at_min, more = one_expert_cycles(p_min, tokens), one_expert_cycles(p_more, tokens)
            rows.append(
                {
                    "mesh": f"{r}x{c}",
                    "tokens": tokens,
                    "link_cycles": link,
                    "ideal": ideal,
                    "fill": fill,
                    "slots_min": hops + 1,
                    "cycles_min": at_min,
                    "slots": hops + 3,
                    "cycles": more,
                    "x_ideal_plus_fill": round(more / (ideal + fill), 3),
                    "x_ideal_plus_fill_min": round(at_min / (ideal + fill), 3),
                }
            )
    return rows


def cells_table(p: DatapathParams) -> list[dict]:
    from fsedp.experiments.rtl_report import yosys_cells
    from fsedp.hw.generate import DATAPATH_BLOCKS

    return [{"block": b, **yosys_cells(b, p)} for b in DATAPATH_BLOCKS]


#: The blocks of one chiplet whose cells depend on the admission rule ([D16]); the DDR
#: controller's admission checks are per chiplet too, but its size is the package's.
CHIPLET_BLOCKS = ("ring_buffer", "router")


def admission_cells_table(meshes) -> list[dict]:
    """Per mesh ``(rows, cols)``: the cells of one chiplet's ring buffer and router under
    forward-count and forward-state admission, with ``H + 2`` slots and a DDR channel per
    chiplet (the simulator's chips)."""
    from fsedp.experiments.rtl_report import yosys_cells
    from fsedp.params import ADMISSION_RULES

    rows = []
    for r, c in meshes:
        row = {"mesh": f"{r}x{c}"}
        for rule in ADMISSION_RULES:
            _, p = run_params(r, c, ddr_channels=r * c, admission=rule)
            row["slots"] = p.slots
            for b in CHIPLET_BLOCKS:
                row[rule, b] = yosys_cells(b, p).get("cells")
        rows.append(row)
    return rows


def run_params(
    rows: int, cols: int, experts: int = 16, **kw
) -> tuple[SchedulerParams, DatapathParams]:
    """Scheduler and datapath generics of a random cosimulation (small, fast parameters)."""
    sp = SchedulerParams(
        chiplets=rows * cols,
        experts=experts,
        count_width=4,
        requests=4,
        theta_min=2,
        n_threshold=2,
        qos_width=2,
    )
    hops = max_hops(rows, cols)
    defaults = dict(
        slots=hops + 2,
        micro_slices=4,
        link_cycles=2,
        ddr_interval=2,
        ddr_latency=8,
        preload_entries=2,
        cycles_per_token=1,
    )
    defaults.update({k: v for k, v in kw.items() if v is not None})
    return sp, DatapathParams.for_scheduler(sp, rows, cols, **defaults)


def long_run(
    sp: SchedulerParams,
    p: DatapathParams,
    layers: int,
    sim: str = "verilator",
    seed: int = 1,
    stall: float = 0.25,
    reset_every: int = 0,
    opt: str = "-O0",
    waves: bool = False,
) -> dict:
    from fsedp.tb.runner import run_tb

    knobs = {
        "sched": dataclasses.asdict(sp),
        "layers": layers,
        "seed": seed,
        "stall": stall,
        "gap": stall,
        "done_stall": stall,
        "reset_every": reset_every,
    }
    return run_tb(
        "chiplet_array",
        p,
        sim,
        build_dir("datapath"),
        knobs=knobs,
        seed=seed,
        tag=f"-run{seed}-{layers}",
        opt=opt,
        waves=waves,
    )


def format_markdown(ring=None, cells=None, cells_params=None, runs=(), admission=None) -> str:
    out = []
    if ring:
        out += [
            "## Streaming one expert around a ring of every chiplet",
            "",
            "Golden model (the lockstep cosimulation makes the RTL take the same cycles); "
            "16 micro-slices, one DDR channel with interval 1 and latency 4 cycles, 1 cycle "
            "per token; Rule 4 stripes the loads over the ring. *ideal* = the busiest "
            "resource: one chiplet's compute, the busiest link (micro-slices crossing it x "
            "link cycles) or the DDR; *fill* = DDR latency + XY hops of the longest path x "
            "link cycles + one compute.",
            "",
            "| mesh | tokens/chiplet | link cycles | ideal | fill | slots (min) | cycles | "
            "x (ideal+fill) | slots (min+2) | cycles | x (ideal+fill) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in ring:
            out.append(
                f"| {r['mesh']} | {r['tokens']} | {r['link_cycles']} | {r['ideal']} | "
                f"{r['fill']} | {r['slots_min']} | {r['cycles_min']} | "
                f"{r['x_ideal_plus_fill_min']} | {r['slots']} | {r['cycles']} | "
                f"{r['x_ideal_plus_fill']} |"
            )
        out.append("")
    if cells:
        out += [
            "## Yosys cells per component",
            "",
            f"Parameters: `{dataclasses.asdict(cells_params)}`. Memories (slot storage, "
            "token tables, DDR queue) stay `$mem` macros and are not counted as cells.",
            "",
            "| block | cells | SRAM macros |",
            "|---|---:|---:|",
        ]
        for c in cells:
            n = c.get("cells")
            shown = n if n is not None else f"not measured: {c.get('note')}"
            out.append(f"| {c['block']} | {shown} | {c.get('sram_macros', '')} |")
        out.append("")
    if admission:
        out += [
            "## Admission rules: cells per chiplet",
            "",
            "Yosys cells (Debian Yosys, ABC) of one chiplet's ring buffer and router under "
            "forward-count admission ([D4]) and forward-state admission ([D16]: a claim per "
            "slot and, for every `i <= H + 1`, the count of claims of at least `i`), with "
            "`H + 2` slots and a DDR channel per chiplet; the slot storage stays a `$mem` "
            "macro.",
            "",
            "| mesh | slots | ring buffer, forward-count | ring buffer, forward-state | "
            "router, forward-count | router, forward-state | chiplet, x |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in admission:
            fc = [r["forward-count", b] for b in CHIPLET_BLOCKS]
            fs = [r["forward-state", b] for b in CHIPLET_BLOCKS]
            ratio = (
                f"{sum(fs) / sum(fc):.2f}" if None not in fc + fs and sum(fc) else "not measured"
            )
            out.append(
                f"| {r['mesh']} | {r['slots']} | {fc[0]} | {fs[0]} | {fc[1]} | {fs[1]} | {ratio} |"
            )
        out.append("")
    for run in runs:
        p = run["params"]
        out += [
            f"## Random cosimulation, {p['rows']}x{p['cols']}, {run['sim']}",
            "",
            f"`{run['command']}`",
            "",
            f"- layers: {run.get('layers')} ({run.get('resets', 0)} reset mid-layer), "
            f"cycles: {run.get('cycles')}, micro-slice computations checked: "
            f"{run.get('computed')}, dispatches: {run.get('dispatches')}, DDR channels: "
            f"{p.get('ddr_channels', 1)}, remote loads: {run.get('remote_loads', 0)}, "
            f"admission: {p.get('admission', 'forward-count')}",
            f"- lockstep mismatches: {run.get('mismatches')}, conservation violations: "
            f"{len(run.get('violations', []))}, deadlocks: {run.get('deadlocks')}",
            f"- peak occupancy per chiplet (slots of {p['slots']}): RTL "
            f"{run.get('peak_rtl')}, golden model {run.get('peak_model')}",
            f"- longest layer: {max(run.get('layer_cycles') or [0])} cycles; "
            f"wall time {run.get('wall_s')} s"
            + (f"; waveform {run['waves']}" if run.get("waves") else ""),
            "",
        ]
    return "\n".join(out)
