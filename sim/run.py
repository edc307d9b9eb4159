"""The main job: strategies side by side on a run config's workload; metrics, a terminal
table and a report folder (JSON, Markdown, PNG plots)."""

import math
import os
import time
from pathlib import Path

import numpy as np

from fsedp import jsondoc
from fsedp.config import RunConfig, config_to_dict
from fsedp.sim.baselines import ep_home, ep_layer, hydra_home
from fsedp.sim.buffering import SLACK, TokenBuffering
from fsedp.sim.fsedp import VARIANTS, fsedp_layer
from fsedp.sim.setup import Setup, make_setup
from fsedp.workload import iterations

__all__ = [
    "STRATEGIES",
    "run_experiment",
    "summarize",
    "format_table",
    "write_report",
    "binned_utilization",
]

#: ``EP``: our expert parallelism (micro-slices streamed, loading overlaps computing);
#: ``EP-paper``: the paper's (a whole expert loaded before it is computed)
BASELINES = ("EP", "EP-paper", "Hydra")
STRATEGIES = (*BASELINES, *VARIANTS)
DEFAULT_STRATEGIES = ("EP", "Hydra", "A1", "A2", "A3", "A6")


def _layer(setup: Setup, records, strategy: str, home, trace: bool, slices=None, log: bool = False):
    """One layer under a strategy whose layers are independent (EP and Hydra with their
    placement ``home``, A1-A4, A6).  Only the traced layer keeps its utilization timeline
    (the report plots that one; the others would only cost time to move between
    processes); ``log`` (FSE-DP) keeps its micro-slice event log too, for the trace viewer
    (:mod:`fsedp.sim.trace_events`)."""
    if strategy in BASELINES:
        r = ep_layer(setup, records, home, strategy, whole=strategy == "EP-paper")
    else:
        r = fsedp_layer(setup, records, strategy, trace=trace, slices=slices, log=log)
    if not trace:
        r.timeline = []
    return r


def _layer_task(setup: Setup, records, jobs, trace: bool, slices=None, log: bool = False):
    """A worker's share: one layer under every independent strategy, timed."""
    out = []
    for s, home in jobs:
        t0 = time.perf_counter()
        r = _layer(setup, records, s, home, trace, slices, log)
        out.append((s, r, time.perf_counter() - t0))
    return out


def run_experiment(
    cfg: RunConfig,
    strategies=DEFAULT_STRATEGIES,
    n_iter: int = 1,
    layers: int | None = None,
    progress: bool = True,
    setup: Setup | None = None,
    on_layer=None,
    workers: int | None = None,
    a5_slack: float | None = None,
    trace=None,
    slices: dict | None = None,
    trace_layers: int = 0,
) -> dict:
    """Simulate ``n_iter`` iterations x ``layers`` MoE layers under every strategy
    (``a5_slack``: A5's QoS slack, default 20 %).

    Returns ``{"setup": Setup, "layers": [Layer], "results": {strategy: [LayerResult]},
    "attention": [cycles per layer outside the routed experts: attention and shared experts],
    "wall_s": {strategy: s}}``.  ``on_layer(strategy,
    layer, result)`` is called after each simulated layer (the RTL check hooks in here).
    The layers of EP, Hydra (whose placements are computed here first), A1-A4 and A6-A8 are
    independent and run on ``workers`` processes, one task per layer (default: up to 2 CPUs;
    1 runs everything in this process); A5 (carried tokens) runs in order here.  Results do
    not depend on ``workers``.  ``trace``: a routing trace to use instead of the scenario's
    (:func:`fsedp.workload.scenario_trace`).  ``slices``: per ``(iteration, layer)`` the
    micro-slices each expert streams (the slice table, [D13]; FSE-DP A2, A3, A4 and A6 only).
    ``trace_layers``: the first that many layers of the last iteration keep their timeline,
    activity and (FSE-DP but A5) micro-slice event log, for the trace viewer; their indices
    in ``layers`` are ``run["traced"]`` (:mod:`fsedp.sim.trace_events`).  The report's plots
    use the first of them (traced in any case).
    """
    for s in strategies:
        if s not in STRATEGIES:
            raise ValueError(f"unknown strategy {s!r}; choose from {', '.join(STRATEGIES)}")
        if slices is not None and s not in ("A2", "A3", "A4", "A6", "A7", "A8"):
            raise ValueError(f"a slice table applies to A2, A3, A4, A6, A7 and A8, not {s}")
    slices = slices or {}
    setup = setup or make_setup(cfg)
    its = iterations(cfg, n_iter, layers, trace=trace)
    flat = [l for it in its for l in it]
    results = {s: [None] * len(flat) for s in strategies}
    wall = {s: 0.0 for s in strategies}
    if workers is None:
        workers = min(2, os.cpu_count() or 1)
    bar = None
    if progress:  # a bar on a terminal only (fsedp.log.progress), never in a log file
        from fsedp.log import progress as progress_bar

        bar = progress_bar(
            total=len(flat) * len(strategies),
            desc=f"{cfg.model.name} on {cfg.hardware.name}",
            unit="layer",
            leave=False,
        )
    per_iteration = sum(l.iteration == n_iter - 1 for l in flat)
    if not 0 <= trace_layers <= per_iteration:
        raise ValueError(
            f"trace_layers {trace_layers}: the last iteration has {per_iteration} layers"
        )
    last = [l.iteration == n_iter - 1 for l in flat]
    logged = [x and l.layer < trace_layers for x, l in zip(last, flat)]
    traced = [x and l.layer < max(1, trace_layers) for x, l in zip(last, flat)]
    experts = setup.sp.experts
    # the baselines' placements: EP's is fixed; Hydra's follows the expert counts of the
    # previous iteration (known from the workload, not from any result)
    homes: dict = {}
    history: dict = {}  # layer -> counts seen in the last iteration
    for i, lay in enumerate(flat):
        counts = lay.expert_counts(experts)
        for b in ("EP", "EP-paper"):
            if b in strategies:
                homes[b, i] = ep_home(experts, setup.chiplets)
        if "Hydra" in strategies:
            pred = history.get(lay.layer)
            if pred is None:
                pred = history.get(("prev",), None)
            homes["Hydra", i] = (
                hydra_home(setup, pred) if pred is not None else ep_home(experts, setup.chiplets)
            )
        history[lay.layer] = counts
        history[("prev",)] = counts
    # every strategy but A5 (whose layers carry tokens) has independent layers
    parallel = [s for s in strategies if s != "A5"]
    pool = futures = None
    if workers > 1 and on_layer is None and parallel and len(flat) > 1:
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=workers)
        futures = {
            pool.submit(
                _layer_task,
                setup,
                lay.records,
                [(s, homes.get((s, i))) for s in parallel],
                traced[i],
                slices.get((lay.iteration, lay.layer)),
                logged[i],
            ): i
            for i, lay in enumerate(flat)
        }
    try:
        a5 = TokenBuffering(setup, flat, a5_slack or SLACK) if "A5" in strategies else None
        for i, lay in enumerate(flat):
            for s in strategies:
                if futures is not None and s in parallel:
                    continue
                t0 = time.perf_counter()
                if s == "A5":
                    r = a5.layer(lay)
                else:
                    sl = slices.get((lay.iteration, lay.layer))
                    r = _layer(setup, lay.records, s, homes.get((s, i)), traced[i], sl, logged[i])
                wall[s] += time.perf_counter() - t0
                results[s][i] = r
                if on_layer is not None:
                    on_layer(s, lay, r)
                if bar is not None:
                    bar.update(1)
        if a5 is not None:
            t0 = time.perf_counter()
            results["A5"] += a5.flush()
            wall["A5"] += time.perf_counter() - t0
            qos = a5.qos()
        if futures is not None:
            from concurrent.futures import as_completed

            for f in as_completed(futures):
                i = futures[f]
                for s, r, dt in f.result():
                    results[s][i] = r
                    wall[s] += dt
                    if bar is not None:
                        bar.update(1)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    if bar is not None:
        bar.close()
    attention = [setup.dense_cycles(l.tokens) for l in flat]
    return {
        "setup": setup,
        "layers": flat,
        "results": results,
        "attention": attention,
        "wall_s": {s: round(w, 2) for s, w in wall.items()},
        "qos": qos if "A5" in strategies else None,
        "traced": [i for i, x in enumerate(logged) if x],
    }


def _busiest_link_bytes(rs) -> int:
    """Bytes over the busiest die-to-die link over all layers (FSE-DP's micro-slice
    traffic; 0 for a strategy that moves no micro-slices)."""
    links: dict = {}
    for r in rs:
        for k, b in r.link_bytes.items():
            links[k] = links.get(k, 0) + b
    return max(links.values(), default=0)


#: Causes of the gap to the lower bound, in display order (``docs/simulator.md``).
CAUSES = (
    "window",
    "fill",
    "drain",
    "all-to-all",
    "dispatch",
    "admission",
    "preload",
    "full",
    "stall",
    "ddr",
    "link",
    "held",
    "starved",
)


def _lost(rs, cycles: int) -> dict:
    """Share of the strategy's MoE time lost to each cause (:meth:`LayerResult.lost`, summed
    over layers); with the bound's share they add up to 1 up to rounding."""
    acc: dict = {}
    for r in rs:
        for k, v in r.lost().items():
            acc[k] = acc.get(k, 0) + v
    order = {k: i for i, k in enumerate(CAUSES)}
    return {
        k: round(acc[k] / cycles, 4)
        for k in sorted(acc, key=lambda k: order.get(k, len(order)))
        if cycles and acc[k]
    }


def _busiest_link_share(busiest: int, setup: Setup, cycles: int) -> float | None:
    """FSE-DP: the share of the MoE time the busiest die-to-die link is busy with
    micro-slices (near 1: the ring streaming is link-bound, whatever the DDR/compute bound)."""
    if not busiest or not cycles:
        return None
    return round(busiest / setup.microslice_bytes * setup.dp.link_cycles / cycles, 3)


def _imbalance(xs) -> float:
    mean = sum(xs) / len(xs) if xs else 0
    return round(max(xs) / mean, 3) if mean else 1.0


def summarize(run: dict) -> dict:
    """Per strategy: MoE-layer latency, speedup over EP, x-of-bound, utilization, on-chip
    memory, end-to-end throughput, traffic, and the breakdown of where time goes."""
    setup: Setup = run["setup"]
    ns = setup.ns_per_cycle
    att = sum(run["attention"])
    cfg = setup.cfg
    tokens = sum(l.tokens for l in run["layers"] if l.layer == 0) / max(
        1, len({l.iteration for l in run["layers"]})
    )
    out = {}
    base = sum(r.cycles for r in run["results"].get("EP", [])) or None
    n_layers = len(run["layers"])
    for s, rs in run["results"].items():
        cyc = sum(r.cycles for r in rs)
        bound = sum(r.bound for r in rs)
        link = sum(r.link_bound for r in rs)
        stream = sum(r.stream_bound for r in rs)
        busy = [sum(r.busy[c] for r in rs) for c in range(setup.chiplets)]
        ddr_per = [
            sum(r.ddr_per_chiplet[c] for r in rs if r.ddr_per_chiplet)
            for c in range(setup.chiplets)
        ]
        # one forward iteration of the whole model: the simulated layers' mean, times the
        # model's layers (MoE layer plus attention each)
        e2e_s = (cyc + att) / n_layers * cfg.model.layers * ns * 1e-9
        busiest = _busiest_link_bytes(rs)
        out[s] = {
            "moe_layer_us": round(cyc / n_layers * ns / 1000, 2),
            "speedup_vs_ep": round(base / cyc, 3) if base else None,
            "x_bound": round(cyc / bound, 3) if bound else None,
            "x_link_bound": round(cyc / link, 3) if link else None,
            "x_stream_bound": round(cyc / stream, 3) if stream else None,
            "utilization": round(sum(busy) / (setup.chiplets * cyc), 4) if cyc else 0,
            "onchip_mb": round(
                max(r.peak_weight_bytes + r.peak_token_bytes for r in rs) / 2**20, 2
            ),
            "deferrals": sum(bin(r.defer).count("1") for r in rs),
            "weights_mb": round(max(r.peak_weight_bytes for r in rs) / 2**20, 2),
            "tokens_mb": round(max(r.peak_token_bytes for r in rs) / 2**20, 3),
            "throughput_tok_s": round(tokens / e2e_s, 1) if e2e_s else None,
            "ddr_gb": round(sum(r.ddr_bytes for r in rs) / 1e9, 3),
            "d2d_gb": round(sum(r.d2d_bytes for r in rs) / 1e9, 3),
            "d2d_busiest_link_gb": round(busiest / 1e9, 3) if busiest else None,
            "busiest_link_share": _busiest_link_share(busiest, setup, cyc),
            "lost": _lost(rs, cyc),
            "breakdown": {
                "ddr_bound_share": round(sum(r.ddr_cycles for r in rs) / cyc, 3) if cyc else None,
                "compute_bound_share": round(sum(r.compute_cycles for r in rs) / cyc, 3)
                if cyc
                else None,
                "compute_imbalance": _imbalance(busy),
                "ddr_imbalance": _imbalance(ddr_per) if any(ddr_per) else None,
            },
            "decisions": sum(r.decisions for r in rs),
            "layers": n_layers,
            "flush_layers": len(rs) - n_layers,
            "wall_s": run["wall_s"].get(s),
        }
        shapes = [f"{r.gather['shape'][0]}x{r.gather['shape'][1]}" for r in rs if r.gather]
        if shapes:  # A8: the region shapes its layers gathered tokens into, most used first
            out[s]["regions"] = {
                k: shapes.count(k) for k in sorted(set(shapes), key=shapes.count, reverse=True)
            }
        if s == "A5" and run.get("qos"):
            out[s]["qos"] = run["qos"]
            out[s]["deferrals"] = run["qos"]["deferrals"]
    return out


def format_table(summary: dict, title: str) -> str:
    head = (
        f"{'strategy':<10} {'MoE layer':>10} {'speedup':>8} {'x bound':>8} {'x link':>7} "
        f"{'util':>6} {'on-chip':>8} {'e2e tok/s':>10} {'DDR imb':>8} {'PE imb':>7}"
    )
    lines = [
        title,
        head,
        f"{'':<10} {'(us)':>10} {'vs EP':>8} {'':>8} {'bound':>7} {'':>6} {'(MB)':>8}",
    ]
    for s, m in summary.items():
        b = m["breakdown"]
        speedup = f"{m['speedup_vs_ep']:>7.2f}x" if m["speedup_vs_ep"] else f"{'-':>8}"
        lines.append(
            f"{s:<10} {m['moe_layer_us']:>10.1f} {speedup} "
            f"{m['x_bound']:>7.2f}x {m['x_link_bound']:>6.2f}x "
            f"{m['utilization'] * 100:>5.1f}% {m['onchip_mb']:>8.2f} "
            f"{m['throughput_tok_s']:>10.1f} {b['ddr_imbalance'] or 0:>8.2f} "
            f"{b['compute_imbalance']:>7.2f}"
        )
    lines.append(
        "x bound: latency over the layer's lower bound (every active expert loaded once "
        "over all DDR channels, or all MACs spread evenly, whichever is larger); "
        "x link bound: over the bound that also sees the die-to-die links (every chiplet "
        "computing an expert gets its bytes by a DDR load or a link crossing, tokens may move "
        "instead; docs/simulator.md); imb: busiest chiplet over the mean (DDR bytes, compute "
        "cycles)"
    )
    lines += ["", *format_lost(summary)]
    if summary.get("A5", {}).get("qos"):
        lines += ["", format_qos(summary["A5"])]
    return "\n".join(lines)


def format_qos(a5: dict) -> str:
    """A5's token buffering against the requests' QoS slack, one line."""
    q = a5["qos"]
    d, sl = q["delay_us"], q["slack_us"]
    return (
        f"A5 token buffering: {q['deferrals']} deferrals, {q['delayed']} of {q['requests']} "
        f"requests delayed; delay mean / p99 / max {d['mean']} / {d['p99']} / {d['max']} us "
        f"against a slack of {sl['mean']} / {sl['p99']} / {sl['max']} us (worst delay "
        f"{q['delay_over_slack_max'] * 100:.0f} % of its slack, {q['violations']} over); "
        f"{a5['flush_layers']} flush layers; every deferred token computed"
    )


def format_lost(summary: dict) -> list[str]:
    """The gap to the bound by cause, one row per strategy (% of its MoE time)."""
    causes = [k for k in CAUSES if any(k in m.get("lost", {}) for m in summary.values())]
    head = f"{'strategy':<10} {'bound':>6} " + " ".join(f"{k:>10}" for k in causes)
    lines = ["Where the time over the bound goes (% of MoE-layer time; see docs/simulator.md)"]
    lines.append(head)
    for s, m in summary.items():
        bound = 100 / m["x_bound"] if m["x_bound"] else 0
        cells = " ".join(f"{m['lost'].get(k, 0) * 100:>9.1f}%" for k in causes)
        lines.append(f"{s:<10} {bound:>5.1f}% {cells}")
    return lines


def _label(s: str) -> str:
    return s if s in BASELINES else f"FSE-DP {s}"


def write_report(
    run: dict, summary: dict, out_dir: Path, command: str, force: bool = False
) -> list[str]:
    """Write ``summary.json``, ``report.md``, ``utilization.png`` (Figure 11),
    ``chiplets.png`` and, with an FSE-DP strategy, ``activity.png`` (Figure 13) into
    ``out_dir``, all or nothing (:func:`fsedp.files.output_dir`: a folder of ours is
    replaced, a folder with other files is refused unless ``force``)."""
    from fsedp.files import OUTPUT_MARKER, output_dir, pyplot

    plt = pyplot()

    setup: Setup = run["setup"]
    cfg = setup.cfg
    out_dir = Path(out_dir)
    n = len(run["layers"])
    with output_dir(out_dir, force) as tmp:
        doc = {
            "command": command,
            "config": config_to_dict(cfg),
            "summary": summary,
            "datapath": {k: v for k, v in vars(setup.dp).items()},
            "layers": {
                s: [
                    {
                        # A5's flush (deferred work run after the last iteration) included
                        "iteration": run["layers"][k].iteration if k < n else "flush",
                        "layer": run["layers"][k].layer if k < n else k - n,
                        "cycles": r.cycles,
                        "bound": r.bound,
                        "link_bound": r.link_bound,
                        "stream_bound": r.stream_bound,
                        "utilization": round(r.utilization, 4),
                        "bounding": r.bounding,
                        "lost": {c: round(v) for c, v in r.lost().items()},
                    }
                    for k, r in enumerate(rs)
                ]
                for s, rs in run["results"].items()
            },
        }
        (tmp / "summary.json").write_text(jsondoc.dumps(doc, indent=1))
        md = [
            f"# {cfg.model.name} on {cfg.hardware.name}",
            "",
            f"`{command}`",
            "",
            "| strategy | MoE layer (us) | speedup vs EP | x bound | x link bound | utilization "
            "| on-chip (MB) | e2e tokens/s | DDR imbalance | compute imbalance |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s, m in summary.items():
            b = m["breakdown"]
            md.append(
                f"| {_label(s)} | {m['moe_layer_us']} | {m['speedup_vs_ep']} | {m['x_bound']} "
                f"| {m['x_link_bound']} | {m['utilization'] * 100:.1f} % | {m['onchip_mb']} "
                f"| {m['throughput_tok_s']} "
                f"| {b['ddr_imbalance']} | {b['compute_imbalance']} |"
            )
        md += ["", "```", *format_lost(summary), "```"]
        if summary.get("A5", {}).get("qos"):
            md += ["", format_qos(summary["A5"])]
        md += [
            "",
            "![utilization](utilization.png)",
            "",
            "![per-chiplet activity](chiplets.png)",
            "",
        ]
        (tmp / "report.md").write_text("\n".join(md))

        # utilization of one layer (the first layer of the last iteration), binned: one
        # panel per strategy, the mean share of chiplets computing in each bin
        idx = max(i for i, l in enumerate(run["layers"]) if l.layer == 0)
        _plot_utilization(plt, run, idx, tmp / "utilization.png")

        fig, ax = plt.subplots(figsize=(8, 3.5))
        names = list(run["results"])
        width = 0.8 / max(1, len(names))
        for k, s in enumerate(names):
            rs = run["results"][s]
            total = sum(r.cycles for r in rs)
            frac = [sum(r.busy[c] for r in rs) / total * 100 for c in range(setup.chiplets)]
            ax.bar(np.arange(setup.chiplets) + k * width, frac, width, label=_label(s))
        ax.set_xlabel("chiplet")
        ax.set_ylabel("busy (% of MoE time)")
        ax.set_title("Per-chiplet compute activity over all simulated layers", pad=22)
        ax.set_xticks(np.arange(setup.chiplets) + 0.4 - width / 2)
        ax.set_xticklabels([str(c) for c in range(setup.chiplets)])
        # above the bars, not over them
        ax.legend(
            fontsize=7,
            ncol=len(names),
            loc="lower center",
            bbox_to_anchor=(0.5, 1.0),
            frameon=False,
            handlelength=1,
        )
        fig.tight_layout()
        fig.savefig(tmp / "chiplets.png", dpi=120)
        plt.close(fig)
        # Figure 13: activity of every chiplet over the traced layer (FSE-DP A3 if run)
        traced = next((s for s in ("A3", "A4", "A2", "A1") if s in run["results"]), None)
        if traced is not None:
            r = run["results"][traced][idx]
            kinds = ["compute", "DDR load", "D2D send", "D2D receive"]
            colours = dict(zip(kinds, ["tab:red", "tab:blue", "tab:green", "tab:olive"]))
            fig, ax = plt.subplots(figsize=(9, 0.6 + 0.9 * setup.chiplets))
            us = setup.ns_per_cycle / 1000
            for c in range(setup.chiplets):
                for k, kind in enumerate(kinds):
                    spans = [
                        (a * us, (b - a) * us)
                        for cc, kk, a, b in r.activity
                        if cc == c and kk == kind
                    ]
                    ax.broken_barh(
                        spans,
                        (c + k * 0.2, 0.18),
                        color=colours[kind],
                        label=kind if c == 0 else None,
                    )
            ax.set_yticks([c + 0.4 for c in range(setup.chiplets)])
            ax.set_yticklabels([f"chiplet {c}" for c in range(setup.chiplets)])
            ax.set_xlabel("time in the MoE layer (us)")
            ax.set_title(f"FSE-DP {traced}: activity of each chiplet over one MoE layer", pad=22)
            ax.legend(
                fontsize=7,
                ncol=4,
                loc="lower center",
                bbox_to_anchor=(0.5, 1.0),
                frameon=False,
                handlelength=1,
            )
            fig.tight_layout()
            fig.savefig(tmp / "activity.png", dpi=120)
            plt.close(fig)
            md_extra = "![activity per chiplet](activity.png)\n"
            (tmp / "report.md").write_text((tmp / "report.md").read_text() + md_extra)
    return sorted(str(p) for p in out_dir.iterdir() if p.name != OUTPUT_MARKER)


#: Bins of the utilization plot over the longest strategy's layer.
UTILIZATION_BINS = 150


def binned_utilization(timeline, cycles: int, edges, chiplets: int) -> np.ndarray:
    """The mean share of chiplets computing (0..1) in each bin ``[edges[k], edges[k+1])``
    (cycles) of a layer whose ``timeline`` is ``(cycle, computing chiplets)`` steps and that
    ends at ``cycles``; ``nan`` for a bin wholly after the end, the part up to the end for the
    bin it ends in.  Exact: the integral of the step function over each bin."""
    edges = np.asarray(edges, dtype=float)
    steps = [(t, v) for t, v in timeline if t < cycles] or [(0, 0)]
    t = np.array([a for a, _ in steps] + [cycles], dtype=float)
    v = np.array([b for _, b in steps], dtype=float)
    area = np.concatenate([[0.0], np.cumsum(v * np.diff(t))])  # integral up to each step

    def integral(x):
        x = np.clip(x, t[0], t[-1])
        k = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(v) - 1)
        return area[k] + v[k] * (x - t[k])

    lo, hi = edges[:-1], np.minimum(edges[1:], cycles)
    width = hi - lo
    out = np.full(len(lo), np.nan)
    inside = width > 0
    out[inside] = (integral(hi[inside]) - integral(lo[inside])) / width[inside] / chiplets
    return out


def _plot_utilization(plt, run: dict, idx: int, path: Path):
    """``utilization.png``: layer ``idx`` under every strategy, one panel each (shared time
    axis), the share of chiplets computing averaged over :data:`UTILIZATION_BINS` bins, the
    layer's end marked, its mean utilization and latency in the panel."""
    setup: Setup = run["setup"]
    us = setup.ns_per_cycle / 1000
    names = list(run["results"])
    rs = [run["results"][s][idx] for s in names]
    longest = max((r.cycles for r in rs), default=0) or 1
    edges = np.linspace(0, longest, UTILIZATION_BINS + 1)
    mid = (edges[:-1] + edges[1:]) / 2 * us
    fig, axes = plt.subplots(
        len(names), 1, sharex=True, sharey=True, figsize=(8, 1.0 + 0.85 * len(names)), squeeze=False
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    shares = [binned_utilization(r.timeline, r.cycles, edges, setup.chiplets) * 100 for r in rs]
    # the shared y axis up to the highest bin (a quarter at a time), so that a low
    # utilization is not a flat line at the bottom of a 0-100 % axis
    peak = max((float(np.nanmax(x)) for x in shares if np.isfinite(x).any()), default=0.0)
    top = 25 * max(1, math.ceil(peak / 25))
    for k, (s, r, ax, share) in enumerate(zip(names, rs, axes[:, 0], shares)):
        c = colours[k % len(colours)]
        ax.fill_between(mid, share, step="mid", color=c, alpha=0.35, linewidth=0)
        ax.step(mid, share, where="mid", color=c, linewidth=1)
        ax.axvline(r.cycles * us, color=c, linestyle="--", linewidth=0.8)
        ax.text(
            0.995,
            0.9,
            f"{_label(s)}: {r.cycles * us:.1f} us, {r.utilization * 100:.0f} % busy",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
        )
        ax.set_ylim(0, top * 1.05)
        ax.set_yticks(range(0, top + 1, 25 if top <= 75 else 50))
        ax.grid(axis="y", linewidth=0.3)
    axes[-1, 0].set_xlim(0, longest * us * 1.01)
    axes[-1, 0].set_xlabel("time in the MoE layer (us); dashed: the layer ends")
    fig.supylabel("chiplets computing (%)", fontsize=9)
    lay = run["layers"][idx]
    fig.suptitle(
        f"Compute utilization over one MoE layer ({setup.cfg.model.name}, {lay.tokens} tokens; "
        f"mean over {UTILIZATION_BINS} bins)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
