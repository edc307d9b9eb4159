"""Paper figures as sweeps over models and token counts, described by experiment files
(``configs/experiments/*.yaml``, run by ``fsedp run --config FILE``) or by
``fsedp sweep figure9``.

Micro-slices per expert: the smallest count (at least the hardware config's) for which the
chiplet's buffer holds 7 micro-slices (the default run's), capped at 256; the paper leaves
the size open, and the three largest experts of Table I do not fit 8 micro-slices in 4 MiB.
"""

import math

from ..config import CONFIG_DIR, WEIGHT_BYTES, _read_yaml, run_from_dict
from .run import run_experiment, summarize

__all__ = ["TABLE1", "figure9", "load_experiment", "run_experiment_file", "FORMATS",
           "load_grid", "run_grid"]

TABLE1 = ("phi-3.5-moe", "yuan2.0-m32", "deepseek-moe-16b", "qwen3-30b-a3b")


def microslices_for(model: dict, hardware: dict, slots: int = 7) -> int:
    expert = 3 * model["d_model"] * model["d_ffn"] * WEIGHT_BYTES
    need = math.ceil(expert * slots / (hardware["onchip_buffer_kib"] * 1024))
    return min(256, max(hardware["microslices_per_expert"], need))


def sweep_config(hardware: dict, model: str, tokens: int, seed: int, source: str,
                 scheduler="default"):
    """The run config of one sweep point: a hardware mapping, a named model, the synthetic
    long-tailed trace (skew 1.1) at ``tokens`` per iteration."""
    return run_from_dict({"hardware": hardware, "model": model, "scheduler": scheduler,
                          "scenario": {"tokens_per_iteration": tokens, "rounds": 1, "seed": seed,
                                       "trace": "synthetic", "skew": 1.1,
                                       "prefill_fraction": 0.5}}, source)


def figure9(models=TABLE1, tokens=(16, 64), layers: int = 8, strategies=("EP", "Hydra", "A2", "A3"),
            progress: bool = True, seed: int = 1, hardware: str = "chip2x2",
            iterations: int = 1) -> list[dict]:
    hw = _read_yaml(CONFIG_DIR / "hardware" / f"{hardware}.yaml")
    rows = []
    for name in models:
        model = _read_yaml(CONFIG_DIR / "models" / f"{name}.yaml")
        m = microslices_for(model, hw)
        for t in tokens:
            cfg = sweep_config({**hw, "microslices_per_expert": m}, name, t, seed,
                               f"<figure9 {name} {t}>")
            run = run_experiment(cfg, strategies, n_iter=iterations, layers=layers,
                                 progress=progress)
            s = summarize(run)
            rows.append({"model": name, "tokens": t, "micro_slices": m,
                         "slots": run["setup"].dp.slots, **{k: s[k] for k in strategies}})
    return rows


def format_figure9(rows, strategies=("EP", "Hydra", "A2", "A3")) -> str:
    """Figure 9: each strategy's speedup over EP (MoE-layer latency), x bound, memory."""
    others = [x for x in strategies if x != "EP"]
    out = ["| model | tokens | M | " + " | ".join(f"{x} vs EP" for x in others)
           + " | x bound " + " / ".join(strategies) + " | on-chip MB " + " / ".join(strategies)
           + " | utilization " + " / ".join(strategies) + " |",
           "|---|---:|---:|" + "---:|" * len(others) + "---|---|---|"]
    for r in rows:
        ep = r["EP"]["moe_layer_us"]
        out.append(
            f"| {r['model']} | {r['tokens']} | {r['micro_slices']} | "
            + " | ".join(f"{ep / r[x]['moe_layer_us']:.3f}" for x in others) + " | "
            + " / ".join(str(r[x]["x_bound"]) for x in strategies) + " | "
            + " / ".join(str(r[x]["onchip_mb"]) for x in strategies) + " | "
            + " / ".join(f"{r[x]['utilization'] * 100:.1f} %" for x in strategies) + " |")
    return "\n".join(out)


def format_memory(rows, strategies) -> str:
    """Figure 12: peak on-chip memory (weights + tokens) per strategy."""
    out = ["| model | tokens | " + " | ".join(f"{s} MB (weights + tokens)" for s in strategies)
           + " | FSE-DP A3 saving vs EP |", "|---|---:|" + "---:|" * (len(strategies) + 1)]
    for r in rows:
        cells = [f"{r[s]['weights_mb']} + {r[s]['tokens_mb']}" for s in strategies]
        saving = (1 - r["A3"]["onchip_mb"] / r["EP"]["onchip_mb"]) * 100 if "A3" in r and "EP" in r else float("nan")
        out.append(f"| {r['model']} | {r['tokens']} | " + " | ".join(cells) + f" | {saving:.0f} % |")
    return "\n".join(out)


def format_ablation(rows, strategies) -> str:
    """Figure 15: compute utilization and speedup over EP of each configuration."""
    out = ["| model | tokens | " + " | ".join(f"{s} util / vs EP" for s in strategies) + " |",
           "|---|---:|" + "---|" * len(strategies)]
    for r in rows:
        cells = [f"{r[s]['utilization'] * 100:.1f} % / {r[s]['speedup_vs_ep'] or 0:.3f}"
                 for s in strategies]
        out.append(f"| {r['model']} | {r['tokens']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def format_throughput(rows, strategies) -> str:
    """Figure 14: end-to-end tokens per second (attention + MoE, the model's layers)."""
    out = ["| model | tokens | " + " | ".join(f"{s} tok/s (vs EP)" for s in strategies) + " |",
           "|---|---:|" + "---:|" * len(strategies)]
    for r in rows:
        ep = r["EP"]["throughput_tok_s"]
        out.append(f"| {r['model']} | {r['tokens']} | " + " | ".join(
            f"{r[s]['throughput_tok_s']} ({r[s]['throughput_tok_s'] / ep:.3f})" for s in strategies)
            + " |")
    return "\n".join(out)


FORMATS = {"latency": format_figure9, "throughput": format_throughput,
           "memory": format_memory, "ablation": format_ablation}

_FIELDS = {"experiment": str, "figure": str, "table": str, "hardware": str, "models": list,
           "tokens": list, "iterations": int, "layers": int, "strategies": list, "seed": int}


def _read_fields(path, fields: dict) -> dict:
    """The mapping of an experiment file with exactly ``fields`` (name -> type)."""
    from ..config import ConfigError

    file = str(path)
    d = _read_yaml(path)
    for k in d:
        if k not in fields:
            raise ConfigError(file, k, f"unknown field; expected one of {', '.join(fields)}")
    for k, t in fields.items():
        if k not in d:
            raise ConfigError(file, k, "missing")
        if not isinstance(d[k], t) or isinstance(d[k], bool):
            raise ConfigError(file, k, f"must be a {t.__name__}, not {d[k]!r}")
    return d


def load_experiment(path) -> dict:
    """An experiment file: ``experiment: sweep``, the ``figure`` it reproduces, the ``table``
    to print (``latency``, ``memory``, ``ablation``), ``hardware``, ``models``, ``tokens``,
    ``layers``, ``strategies``, ``seed``.  Errors name the file and the field."""
    from ..config import ConfigError, named_configs
    from .run import STRATEGIES

    file = str(path)
    d = _read_fields(path, _FIELDS)
    if d["experiment"] != "sweep":
        raise ConfigError(file, "experiment", f"must be 'sweep' or 'grid', not {d['experiment']!r}")
    if d["table"] not in FORMATS:
        raise ConfigError(file, "table", f"must be one of {', '.join(FORMATS)}, not {d['table']!r}")
    if d["hardware"] not in named_configs("hardware"):
        raise ConfigError(file, "hardware", f"no configs/hardware/{d['hardware']}.yaml")
    for m in d["models"]:
        if m not in named_configs("models"):
            raise ConfigError(file, "models", f"no configs/models/{m}.yaml")
    for t in d["tokens"]:
        if not isinstance(t, int) or isinstance(t, bool) or not 1 <= t <= 4096:
            raise ConfigError(file, "tokens", f"each must be an integer in 1..4096, not {t!r}")
    for s in d["strategies"]:
        if s not in STRATEGIES:
            raise ConfigError(file, "strategies", f"unknown {s!r}; choose from {', '.join(STRATEGIES)}")
    if "EP" not in d["strategies"]:
        raise ConfigError(file, "strategies", "must include EP (speedups are over EP)")
    for k in ("layers", "iterations"):
        if d[k] < 1:
            raise ConfigError(file, k, f"must be at least 1, not {d[k]}")
    return d


def run_experiment_file(d: dict, progress: bool = True) -> tuple[list[dict], str]:
    rows = figure9(d["models"], d["tokens"], layers=d["layers"], strategies=d["strategies"],
                   progress=progress, seed=d["seed"], hardware=d["hardware"],
                   iterations=d["iterations"])
    return rows, FORMATS[d["table"]](rows, d["strategies"])


# -- hardware grids (Figures 16-18) -----------------------------------------------------------
_GRID_FIELDS = {"experiment": str, "figure": str, "hardware": str, "model": str, "tokens": int,
                "layers": int, "strategies": list, "seed": int, "vary": dict}


def load_grid(path) -> dict:
    """``experiment: grid``: one model and token count, one or two hardware fields varied
    over lists of values (``vary: {onchip_buffer_kib: [...], ...}``; the key ``hardware``
    varies the hardware config itself)."""
    from ..config import ConfigError, named_configs
    from .run import STRATEGIES

    file = str(path)
    d = _read_fields(path, _GRID_FIELDS)
    if d["hardware"] not in named_configs("hardware"):
        raise ConfigError(file, "hardware", f"no configs/hardware/{d['hardware']}.yaml")
    if d["model"] not in named_configs("models"):
        raise ConfigError(file, "model", f"no configs/models/{d['model']}.yaml")
    for s in d["strategies"]:
        if s not in STRATEGIES:
            raise ConfigError(file, "strategies", f"unknown {s!r}; choose from {', '.join(STRATEGIES)}")
    hw = _read_yaml(CONFIG_DIR / "hardware" / f"{d['hardware']}.yaml")
    if not 1 <= len(d["vary"]) <= 2:
        raise ConfigError(file, "vary", f"must vary one or two fields, not {len(d['vary'])}")
    for k, vals in d["vary"].items():
        if k != "hardware" and k not in hw:
            raise ConfigError(file, f"vary.{k}", f"not a hardware field; expected one of "
                                                 f"{', '.join(x for x in hw if x != 'name')}")
        if not isinstance(vals, list) or not vals:
            raise ConfigError(file, f"vary.{k}", f"must be a non-empty list, not {vals!r}")
        if k == "hardware":
            for v in vals:
                if v not in named_configs("hardware"):
                    raise ConfigError(file, "vary.hardware", f"no configs/hardware/{v}.yaml")
    if d["layers"] < 1:
        raise ConfigError(file, "layers", f"must be at least 1, not {d['layers']}")
    return d


def run_grid(d: dict, progress: bool = True) -> tuple[list[dict], str]:
    import itertools

    from ..config import ConfigError

    keys = list(d["vary"])
    rows = []
    for values in itertools.product(*(d["vary"][k] for k in keys)):
        point = dict(zip(keys, values))
        hw = _read_yaml(CONFIG_DIR / "hardware" / f"{point.get('hardware', d['hardware'])}.yaml")
        hw.update({k: v for k, v in point.items() if k != "hardware"})
        try:
            cfg = sweep_config(hw, d["model"], d["tokens"], d["seed"],
                               f"<figure {d['figure']} {point}>")
            run = run_experiment(cfg, d["strategies"], n_iter=1, layers=d["layers"],
                                 progress=progress)
            rows.append({"point": point, **summarize(run)})
        except ConfigError as e:
            rows.append({"point": point, "infeasible": e.reason if hasattr(e, "reason") else str(e)})
    head = ("| " + " | ".join(keys) + " | " + " | ".join(
        f"{s} util / us" for s in d["strategies"]) + " |")
    out = [head, "|" + "---|" * (len(keys) + len(d["strategies"]))]
    for r in rows:
        cells = [str(r["point"][k]) for k in keys]
        if "infeasible" in r:
            cells += ["infeasible"] * len(d["strategies"])
        else:
            cells += [f"{r[s]['utilization'] * 100:.1f} % / {r[s]['moe_layer_us']}"
                      for s in d["strategies"]]
        out.append("| " + " | ".join(cells) + " |")
    notes = sorted({r["infeasible"] for r in rows if "infeasible" in r})
    table = "\n".join(out) + ("\n\ninfeasible: " + "; ".join(notes) if notes else "")
    return rows, table
