"""Paper figures as sweeps over models and token counts, described by experiment files
(``configs/experiments/*.yaml``, run by ``fsedp run --config FILE``) or by
``fsedp sweep figure9``.

Micro-slices per expert: :func:`fsedp.config.derived_microslices`, the smallest count (at
least the hardware config's, else 8) for which the chiplet's buffer holds 7 micro-slices (the
default run's), capped at 256; the paper leaves the size open, and the three largest experts
of Table I do not fit 8 micro-slices in 4 MiB.
"""

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from fsedp.config import (
    CONFIG_DIR,
    MICROSLICES_FLOOR,
    HardwareConfig,
    ModelConfig,
    config_path,
    derived_microslices,
    load_section,
    mesh_slots,
    run_from_dict,
)
from fsedp.errors import InputError
from fsedp.fields import Spec, build, check, spec, specs
from fsedp.files import read_bytes, read_yaml
from fsedp.sim.executor import run_points
from fsedp.sim.run import STRATEGIES, run_experiment, summarize

__all__ = [
    "TABLE1",
    "figure9",
    "load_experiment",
    "run_experiment_file",
    "FORMATS",
    "load_grid",
    "run_grid",
    "sweep_point",
    "point_result_error",
]

TABLE1 = ("phi-3.5-moe", "yuan2.0-m32", "deepseek-moe-16b", "qwen3-30b-a3b")


def microslices_for(model: str, hardware: dict) -> int:
    """Micro-slices per expert of a named model on a hardware mapping."""
    m = load_section(ModelConfig, config_path("models", model))
    return derived_microslices(
        m.expert_bytes,
        hardware["onchip_buffer_kib"],
        hardware.get("microslices_per_expert", MICROSLICES_FLOOR),
        mesh_slots(hardware["rows"], hardware["cols"]),
    )


def sweep_dict(hardware: dict, model: str, tokens: int, seed: int, scheduler="default") -> dict:
    """The run config (as a mapping) of one sweep point: a hardware mapping, a named model or
    a model file, the synthetic long-tailed trace (skew 1.1) at ``tokens`` per iteration."""
    return {
        "hardware": hardware,
        "model": model,
        "scheduler": scheduler,
        "scenario": {
            "tokens_per_iteration": tokens,
            "rounds": 1,
            "seed": seed,
            "trace": "synthetic",
            "skew": 1.1,
            "prefill_fraction": 0.5,
        },
    }


def sweep_config(
    hardware: dict, model: str, tokens: int, seed: int, source: str, scheduler="default"
):
    """:func:`sweep_dict`, validated."""
    return run_from_dict(sweep_dict(hardware, model, tokens, seed, scheduler), source)


def make_point(
    raw: dict, source: str, strategies, iterations: int, layers: int, a5_slack=None
) -> dict:
    """A sweep point (:mod:`fsedp.sim.executor`): the run config, what to simulate, and the
    digest of a model given as a file (named configs are part of the code version)."""
    point = {
        "config": raw,
        "source": source,
        "strategies": list(strategies),
        "iterations": iterations,
        "layers": layers,
    }
    if a5_slack is not None:
        point["a5_slack"] = a5_slack
    model = raw["model"]
    if isinstance(model, str) and Path(model).suffix in (".yaml", ".yml") and Path(model).is_file():
        point["model_sha256"] = hashlib.sha256(read_bytes(model, "yaml", "model")).hexdigest()
    return point


def sweep_point(point: dict, workers: int = 1) -> dict:
    """One sweep point, simulated here: the chiplet's slots and :func:`summarize`'s summary."""
    try:
        cfg = run_from_dict(point["config"], point["source"])
        run = run_experiment(
            cfg,
            point["strategies"],
            n_iter=point["iterations"],
            layers=point["layers"],
            progress=False,
            workers=workers,
            a5_slack=point.get("a5_slack"),
        )
    except InputError as e:  # a point the simulation itself refuses is listed, not fatal
        return {"infeasible": [e.file, e.field, e.reason]}
    return {"slots": run["setup"].dp.slots, "summary": summarize(run)}


# -- a sweep point's result, as computed and as cached ----------------------------------------
#: The kinds of value in a point's result: a finite number (an int or a float, not a bool),
#: the same or ``null``, a count (an int, at least 0).
NUMBER, NUMBER_OR_NULL, COUNT = "a finite number", "a finite number or null", "a count"
#: Mean, 99th percentile and maximum of A5's delays or slacks (us).
_STATS = {"mean": NUMBER, "p99": NUMBER, "max": NUMBER}
#: One strategy's summary in a point's result (:func:`fsedp.sim.run.summarize`): every field
#: it always has and the kind of its value -- an object for a nested one, ``(NUMBER,)`` for
#: an object of any keys with numbers (``lost``: the share of time lost per cause).  Further
#: fields are kept as they are (finite JSON like all of an entry).
SUMMARY_FIELDS = {
    "moe_layer_us": NUMBER,
    "speedup_vs_ep": NUMBER_OR_NULL,
    "x_bound": NUMBER_OR_NULL,
    "x_link_bound": NUMBER_OR_NULL,
    "x_stream_bound": NUMBER_OR_NULL,
    "utilization": NUMBER,
    "onchip_mb": NUMBER,
    "deferrals": COUNT,
    "weights_mb": NUMBER,
    "tokens_mb": NUMBER,
    "throughput_tok_s": NUMBER_OR_NULL,
    "ddr_gb": NUMBER,
    "d2d_gb": NUMBER,
    "d2d_busiest_link_gb": NUMBER_OR_NULL,
    "busiest_link_share": NUMBER_OR_NULL,
    "lost": (NUMBER,),
    "breakdown": {
        "ddr_bound_share": NUMBER_OR_NULL,
        "compute_bound_share": NUMBER_OR_NULL,
        "compute_imbalance": NUMBER,
        "ddr_imbalance": NUMBER_OR_NULL,
    },
    "decisions": COUNT,
    "layers": COUNT,
    "flush_layers": COUNT,
    "wall_s": NUMBER_OR_NULL,
}
#: A5's ``qos`` field, when its summary has one (:meth:`fsedp.sim.buffering.TokenBuffering.qos`).
QOS_FIELDS = {
    "requests": COUNT,
    "deferrals": COUNT,
    "delayed": COUNT,
    "delay_us": _STATS,
    "slack_us": _STATS,
    "delay_over_slack_max": NUMBER,
    "violations": COUNT,
}


def _mismatch(value, kind, where: str) -> str | None:
    """``None`` when ``value`` is of ``kind`` (:data:`SUMMARY_FIELDS`' notation), else the
    first field that is not, and why."""
    if isinstance(kind, dict):
        if not isinstance(value, dict):
            return f"{where}: not an object"
        for k, sub in kind.items():
            if k not in value:
                return f"{where}.{k}: missing"
            why = _mismatch(value[k], sub, f"{where}.{k}")
            if why:
                return why
        return None
    if isinstance(kind, tuple):
        if not isinstance(value, dict):
            return f"{where}: not an object"
        for k, v in value.items():
            why = _mismatch(v, kind[0], f"{where}.{k[:40]}")
            if why:
                return why
        return None
    if value is None and kind == NUMBER_OR_NULL:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{where}: not {kind}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: not {kind}"
    if kind == COUNT and not (isinstance(value, int) and value >= 0):
        return f"{where}: not {kind}"
    return None


def point_result_error(point: dict, result) -> str | None:
    """``None`` when ``result`` has the shape :func:`sweep_point` gives ``point``, else the
    first thing wrong; never raises (the ``check`` of the sweep's cache entries,
    :func:`fsedp.sim.executor.run_points`).  The shape: ``{"infeasible": [FILE, FIELD,
    REASON]}`` (three strings), or ``{"slots": COUNT, "summary": {STRATEGY: ...}}`` whose
    summary has exactly the point's strategies, each with :data:`SUMMARY_FIELDS` (and, where
    it has ``qos``, :data:`QOS_FIELDS`)."""
    if not isinstance(result, dict):
        return "the result is not an object"
    if "infeasible" in result:
        why = result["infeasible"]
        if list(result) != ["infeasible"] or not (
            isinstance(why, list) and len(why) == 3 and all(isinstance(x, str) for x in why)
        ):
            return "infeasible: not [file, field, reason] alone"
        return None
    if sorted(result) != ["slots", "summary"]:
        return "not an object of slots and summary"
    slots, summary = result["slots"], result["summary"]
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        return "slots: not a positive count"
    if not isinstance(summary, dict):
        return "summary: not an object"
    strategies = list(dict.fromkeys(point["strategies"]))
    if sorted(summary) != sorted(strategies):
        return f"summary: not the strategies {', '.join(strategies)}"
    for s in strategies:
        why = _mismatch(summary[s], SUMMARY_FIELDS, f"summary.{s}")
        if not why and "qos" in summary[s]:
            why = _mismatch(summary[s]["qos"], QOS_FIELDS, f"summary.{s}.qos")
        if why:
            return why
    return None


def figure9(
    models=TABLE1,
    tokens=(16, 64),
    layers: int = 8,
    strategies=("EP", "EP-paper", "Hydra", "A2", "A3"),
    progress: bool = True,
    seed: int = 1,
    hardware: str = "chip2x2",
    iterations: int = 1,
    a5_slack=None,
    **executor,
) -> list[dict]:
    """Every model at every token count; ``a5_slack``: a list of QoS slacks, A5 run at each
    (columns :func:`a5_label`); ``executor``: ``engine``, ``workers``, ``address``,
    ``cache`` of :func:`fsedp.sim.executor.run_points`."""
    slacks = list(a5_slack or []) if "A5" in strategies else []
    # the first slack runs with the other strategies, each further one as a point of its own
    main = [x for x in strategies if not (slacks and x == "A5")]
    first = ["A5"] if slacks else []
    hw = read_yaml(config_path("hardware", hardware))
    rows, points, feasible, costs = [], [], [], []
    for name in models:
        m = microslices_for(name, hw)
        for t in tokens:
            raw = sweep_dict({**hw, "microslices_per_expert": m}, name, t, seed)
            source = f"<figure9 {name} {t}>"
            row = {"model": name, "tokens": t, "micro_slices": m}
            try:
                cfg = run_from_dict(raw, source)
            except InputError as e:  # e.g. the buffer cannot hold deadlock freedom's slots
                rows.append({**row, "infeasible": e})
                continue
            per = iterations * min(layers or cfg.model.layers, cfg.model.layers) * t
            rows.append(row)
            costs.append(per * len(main + first))
            costs += [per] * len(slacks[1:])
            feasible.append((row, main + [a5_label(x) for x in slacks[:1]]))
            points.append(
                make_point(raw, source, main + first, iterations, layers, *(slacks[:1] or [None]))
            )
            for x in slacks[1:]:
                feasible.append((row, [a5_label(x)]))
                points.append(make_point(raw, source, ["A5"], iterations, layers, a5_slack=x))
    results = run_points(
        sweep_point,
        points,
        progress=progress,
        label="figure",
        costs=costs,
        check=point_result_error,
        **executor,
    )
    for (row, keys), res in zip(feasible, results):
        if "infeasible" in res:
            row["infeasible"] = InputError(*res["infeasible"])
            continue
        row["slots"] = res["slots"]
        for k in keys:
            row[k] = res["summary"]["A5" if k.startswith("A5 ") else k]
    # a row is shown when every one of its points ran
    return [r for r in rows if "infeasible" in r or all(k in r for k in main)]


def format_figure9(rows, strategies=("EP", "EP-paper", "Hydra", "A2", "A3")) -> str:
    """Figure 9: each strategy's speedup over EP (MoE-layer latency) -- ours and, when it is
    in ``strategies``, the paper's (``EP-paper``) --, x bound, memory."""
    others = [x for x in strategies if x != "EP"]
    paper = (
        [x for x in strategies if x not in ("EP", "EP-paper", "Hydra")]
        if "EP-paper" in strategies
        else []
    )
    out = [
        "| model | tokens | M | "
        + " | ".join([f"{x} vs EP" for x in others] + [f"{x} vs EP-paper" for x in paper])
        + " | x bound "
        + " / ".join(strategies)
        + " | on-chip MB "
        + " / ".join(strategies)
        + " | utilization "
        + " / ".join(strategies)
        + " |",
        "|---|---:|---:|" + "---:|" * (len(others) + len(paper)) + "---|---|---|",
    ]
    for r in rows:
        ep = r["EP"]["moe_layer_us"]
        ep_paper = r["EP-paper"]["moe_layer_us"] if paper else None
        out.append(
            f"| {r['model']} | {r['tokens']} | {r['micro_slices']} | "
            + " | ".join(
                [f"{ep / r[x]['moe_layer_us']:.3f}" for x in others]
                + [f"{ep_paper / r[x]['moe_layer_us']:.3f}" for x in paper]
            )
            + " | "
            + " / ".join(str(r[x]["x_bound"]) for x in strategies)
            + " | "
            + " / ".join(str(r[x]["onchip_mb"]) for x in strategies)
            + " | "
            + " / ".join(f"{r[x]['utilization'] * 100:.1f} %" for x in strategies)
            + " |"
        )
    return "\n".join(out)


def format_memory(rows, strategies) -> str:
    """Figure 12: peak on-chip memory (weights + tokens) per strategy."""
    out = [
        "| model | tokens | "
        + " | ".join(f"{s} MB (weights + tokens)" for s in strategies)
        + " | FSE-DP A3 saving vs EP |",
        "|---|---:|" + "---:|" * (len(strategies) + 1),
    ]
    for r in rows:
        cells = [f"{r[s]['weights_mb']} + {r[s]['tokens_mb']}" for s in strategies]
        saving = (
            (1 - r["A3"]["onchip_mb"] / r["EP"]["onchip_mb"]) * 100
            if "A3" in r and "EP" in r
            else float("nan")
        )
        out.append(
            f"| {r['model']} | {r['tokens']} | " + " | ".join(cells) + f" | {saving:.0f} % |"
        )
    return "\n".join(out)


def format_ablation(rows, strategies) -> str:
    """Figure 15: compute utilization and speedup over EP of each configuration."""
    out = [
        "| model | tokens | " + " | ".join(f"{s} util / vs EP" for s in strategies) + " |",
        "|---|---:|" + "---|" * len(strategies),
    ]
    for r in rows:
        cells = [
            f"{r[s]['utilization'] * 100:.1f} % / {r[s]['speedup_vs_ep'] or 0:.3f}"
            for s in strategies
        ]
        out.append(f"| {r['model']} | {r['tokens']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def format_throughput(rows, strategies) -> str:
    """Figure 14: end-to-end tokens per second (attention + MoE, the model's layers)."""
    out = [
        "| model | tokens | " + " | ".join(f"{s} tok/s (vs EP)" for s in strategies) + " |",
        "|---|---:|" + "---:|" * len(strategies),
    ]
    for r in rows:
        ep = r["EP"]["throughput_tok_s"]
        out.append(
            f"| {r['model']} | {r['tokens']} | "
            + " | ".join(
                f"{r[s]['throughput_tok_s']} ({r[s]['throughput_tok_s'] / ep:.3f})"
                for s in strategies
            )
            + " |"
        )
    return "\n".join(out)


def format_breakdown(rows, strategies) -> str:
    """Each strategy's x bound and x link bound, and where each FSE-DP strategy's time over
    the bound goes, by cause (% of its MoE-layer time;
    ``docs/simulator.md#where-the-time-goes``)."""
    fsedp = [x for x in strategies if x not in ("EP", "EP-paper", "Hydra")]
    out = [
        "| model | tokens | M | DDR / compute bound (% of EP) | x bound "
        + " / ".join(strategies)
        + " | x link bound "
        + " / ".join(strategies)
        + " | x stream bound "
        + " / ".join(fsedp)
        + " | busiest link busy (% of time) "
        + " / ".join(fsedp)
        + " | "
        + " | ".join(f"{x}: time over the bound by cause (%)" for x in fsedp)
        + " |",
        "|---|---:|---:|---|---|---|---|---|" + "---|" * len(fsedp),
    ]

    def causes(summary):
        big = sorted(
            ((k, v) for k, v in summary["lost"].items() if v >= 0.001), key=lambda kv: -kv[1]
        )
        text = ", ".join(f"{k} {v * 100:.1f}" for k, v in big) or "-"
        if summary.get("regions"):  # A8: the regions its layers gathered tokens into
            text = (
                "regions "
                + " ".join(f"{k} x{v}" for k, v in summary["regions"].items())
                + ": "
                + text
            )
        return text

    for r in rows:
        b = r[strategies[0]]["breakdown"]
        out.append(
            f"| {r['model']} | {r['tokens']} | {r['micro_slices']} | "
            f"{b['ddr_bound_share'] * 100:.0f} / {b['compute_bound_share'] * 100:.0f} | "
            + " / ".join(f"{r[x]['x_bound']:.3f}" for x in strategies)
            + " | "
            + " / ".join(f"{r[x]['x_link_bound']:.3f}" for x in strategies)
            + " | "
            + " / ".join(f"{r[x]['x_stream_bound']:.3f}" for x in fsedp)
            + " | "
            + " / ".join(f"{(r[x]['busiest_link_share'] or 0) * 100:.0f}" for x in fsedp)
            + " | "
            + " | ".join(causes(r[x]) for x in fsedp)
            + " |"
        )
    return "\n".join(out)


FORMATS = {
    "breakdown": format_breakdown,
    "latency": format_figure9,
    "throughput": format_throughput,
    "memory": format_memory,
    "ablation": format_ablation,
}


@dataclass(frozen=True)
class SweepFile:
    """``experiment: sweep``: a paper figure over models and token counts."""

    experiment: str = spec(str, choices=("sweep",), doc="the kind of experiment file")
    figure: str = spec(str, doc="the paper's figure it reproduces")
    table: str = spec(str, choices=tuple(FORMATS), doc="the table printed")
    hardware: str = spec(str, doc="a named hardware config or a file path")
    models: list = spec(list, items=str, doc="named model configs")
    tokens: list = spec(list, 1, 4096, items=int, doc="tokens per iteration")
    iterations: int = spec(int, 1, 1000, doc="forward iterations per point")
    strategies: list = spec(list, items=str, choices=STRATEGIES, doc="must include EP")
    seed: int = spec(int, 0, 2**32 - 1, doc="seed of the synthetic trace")
    layers: int | None = spec(
        int, 1, 1024, doc="MoE layers simulated per point (default: all the model's)", default=None
    )
    a5_slack: list | None = spec(
        list,
        0.01,
        1.0,
        items=float,
        doc="A5 at each of these QoS slacks, one column each (default: 0.2)",
        default=None,
    )


def a5_label(slack: float) -> str:
    """The column of A5 at a QoS slack (``A5 10%``)."""
    return f"A5 {round(slack * 100)}%"


@dataclass(frozen=True)
class GridFile:
    """``experiment: grid``: one model and token count, one or two hardware fields varied."""

    experiment: str = spec(str, choices=("grid",), doc="the kind of experiment file")
    figure: str = spec(str, doc="the paper's figure it reproduces")
    hardware: str = spec(str, doc="a named hardware config or a file path")
    model: str = spec(str, doc="a named model config or a file path")
    tokens: int = spec(int, 1, 4096, doc="tokens per iteration")
    layers: int = spec(int, 1, 1024, doc="MoE layers simulated per point")
    strategies: list = spec(list, items=str, choices=STRATEGIES, doc="strategies")
    seed: int = spec(int, 0, 2**32 - 1, doc="seed of the synthetic trace")
    vary: dict = spec(dict, doc="hardware field (or hardware) -> list of values")
    fixed: dict = spec(dict, doc="hardware field -> value, the same at every point", default=None)


def _resolve(kind: str, name: str, file: str, where: str) -> str:
    """A named config stays a name; a file path becomes relative to the current directory
    (it was relative to the experiment file), and its section is checked now."""
    path = config_path(kind, name, file, where)
    load_section(HardwareConfig if kind == "hardware" else ModelConfig, path)
    return name if path == CONFIG_DIR / kind / f"{name}.yaml" else str(path)


def _read(path, cls) -> tuple[str, dict]:
    file = str(path)
    d = read_yaml(path)
    kind = d.get("experiment")
    if kind not in ("sweep", "grid"):
        raise InputError(file, "experiment", f"must be 'sweep' or 'grid', not {str(kind)[:40]!r}")
    return file, build(cls, d, file)


def load_experiment(path) -> dict:
    """An experiment file: ``experiment: sweep``, the ``figure`` it reproduces, the ``table``
    to print (``latency``, ``memory``, ``ablation``, ``throughput``), ``hardware``,
    ``models``, ``tokens``, ``iterations``, ``layers``, ``strategies``, ``seed``
    (:class:`SweepFile`).  Errors name the file and the field."""
    file, d = _read(path, SweepFile)
    d["hardware"] = _resolve("hardware", d["hardware"], file, "hardware")
    d["models"] = [_resolve("models", m, file, f"models[{i}]") for i, m in enumerate(d["models"])]
    if "EP" not in d["strategies"]:
        raise InputError(file, "strategies", "must include EP (speedups are over EP)")
    return d


def run_experiment_file(d: dict, progress: bool = True, **executor) -> tuple[list[dict], str]:
    slacks = d.get("a5_slack") or []
    rows = figure9(
        d["models"],
        d["tokens"],
        layers=d.get("layers"),
        strategies=d["strategies"],
        progress=progress,
        seed=d["seed"],
        hardware=d["hardware"],
        iterations=d["iterations"],
        a5_slack=slacks,
        **executor,
    )
    ok = [r for r in rows if "infeasible" not in r]
    notes = [
        f"{r['model']} at {r['tokens']} tokens: {r['infeasible'].reason}"
        for r in rows
        if r not in ok
    ]
    columns = [x for x in d["strategies"] if not (slacks and x == "A5")]
    columns += [a5_label(x) for x in slacks if "A5" in d["strategies"]]
    table = FORMATS[d["table"]](ok, columns)
    return ok, table + ("\n\ninfeasible: " + "; ".join(notes) if notes else "")


# -- hardware grids (Figures 16-18) -----------------------------------------------------------
def load_grid(path) -> dict:
    """``experiment: grid`` (:class:`GridFile`): one model and token count, one or two
    hardware fields varied over lists of values (``vary: {onchip_buffer_kib: [...], ...}``;
    the key ``hardware`` varies the hardware config itself).  Every varied value is checked
    against the hardware field's declared range."""
    file, d = _read(path, GridFile)
    d["hardware"] = _resolve("hardware", d["hardware"], file, "hardware")
    d["model"] = _resolve("models", d["model"], file, "model")
    fields = {k: s for k, s in specs(HardwareConfig).items() if k != "name"}
    if not 1 <= len(d["vary"]) <= 2:
        raise InputError(file, "vary", f"must vary one or two fields, not {len(d['vary'])}")
    for k, vals in d["vary"].items():
        if k == "hardware":
            names = check(file, "vary.hardware", Spec(list, items=str), vals)
            d["vary"]["hardware"] = [
                _resolve("hardware", v, file, f"vary.hardware[{i}]") for i, v in enumerate(names)
            ]
        elif k in fields:
            s = fields[k]
            check(file, f"vary.{k}", Spec(list, s.lo, s.hi, items=s.kind), vals)
        else:
            raise InputError(
                file,
                f"vary.{str(k)[:40]}",
                f"not a hardware field; expected one of hardware, {', '.join(fields)}",
            )
    fixed = d.get("fixed") or {}
    for k, v in fixed.items():
        if k not in fields or k in d["vary"]:
            raise InputError(
                file,
                f"fixed.{str(k)[:40]}",
                "not a hardware field" if k not in fields else "is varied as well",
            )
        fixed[k] = check(file, f"fixed.{k}", fields[k], v)
    d["fixed"] = fixed
    return d


def run_grid(d: dict, progress: bool = True, **executor) -> tuple[list[dict], str]:
    import itertools

    keys = list(d["vary"])
    rows, points, feasible = [], [], []
    for values in itertools.product(*(d["vary"][k] for k in keys)):
        point = dict(zip(keys, values))
        hw = read_yaml(config_path("hardware", point.get("hardware", d["hardware"])))
        hw.update(d.get("fixed") or {})
        if "microslices_per_expert" not in hw:
            # a hardware config that leaves the micro-slice count to be derived gets it from
            # its own buffer, and keeps it while the grid varies other fields
            hw["microslices_per_expert"] = microslices_for(d["model"], hw)
        hw.update({k: v for k, v in point.items() if k != "hardware"})
        raw = sweep_dict(hw, d["model"], d["tokens"], d["seed"])
        source = f"<figure {d['figure']} {point}>"
        try:
            run_from_dict(raw, source)
        except InputError as e:
            rows.append({"point": point, "infeasible": e.reason})
            continue
        rows.append({"point": point})
        feasible.append(rows[-1])
        points.append(make_point(raw, source, d["strategies"], 1, d["layers"]))
    results = run_points(
        sweep_point, points, progress=progress, label="grid", check=point_result_error, **executor
    )
    for row, res in zip(feasible, results):
        if "infeasible" in res:
            row["infeasible"] = res["infeasible"][2]
        else:
            row.update(res["summary"])
    head = (
        "| "
        + " | ".join(keys)
        + " | "
        + " | ".join(f"{s} util / us" for s in d["strategies"])
        + " |"
    )
    out = [head, "|" + "---|" * (len(keys) + len(d["strategies"]))]
    for r in rows:
        cells = [str(r["point"][k]) for k in keys]
        if "infeasible" in r:
            cells += ["infeasible"] * len(d["strategies"])
        else:
            cells += [
                f"{r[s]['utilization'] * 100:.1f} % / {r[s]['moe_layer_us']}"
                for s in d["strategies"]
            ]
        out.append("| " + " | ".join(cells) + " |")
    notes = sorted({r["infeasible"] for r in rows if "infeasible" in r})
    table = "\n".join(out) + ("\n\ninfeasible: " + "; ".join(notes) if notes else "")
    return rows, table
