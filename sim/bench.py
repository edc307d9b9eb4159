"""``fsedp bench``: speed of the simulator (wall time per simulated MoE layer, golden-model
steps and micro-slice events per second) and how it grows with tokens, experts and
chiplets.  A benchmark, not a test: ``fsedp bench --e2e 100 --out
docs/performance-bench.md`` (``make bench``) writes the figures with the command."""

import time

from fsedp.config import config_path
from fsedp.files import read_yaml
from fsedp.sim.baselines import ep_home, ep_layer
from fsedp.sim.fsedp import fsedp_layer
from fsedp.sim.setup import make_setup
from fsedp.sim.sweep import microslices_for, sweep_config
from fsedp.workload import iterations

__all__ = ["bench"]


def _cfg(hardware: str, tokens: int, model: str = "qwen3-30b-a3b"):
    hw = read_yaml(config_path("hardware", hardware))
    m = microslices_for(model, hw)
    return sweep_config(
        {**hw, "microslices_per_expert": m},
        model,
        tokens,
        1,
        f"<bench {hardware} {model} {tokens}>",
        scheduler={
            "count_width": 11,
            "requests": 16,
            "theta_min": 2,
            "n_threshold": 4,
            "qos_width": 4,
            "t_qos_init": 0,
        },
    )


POINTS = (
    ("chip2x2", 16, "qwen3-30b-a3b"),
    ("chip2x2", 64, "qwen3-30b-a3b"),
    ("chip2x2", 256, "qwen3-30b-a3b"),
    ("chip2x2", 64, "deepseek-moe-16b"),
    ("chip2x2", 64, "phi-3.5-moe"),
    ("mesh4x4", 64, "qwen3-30b-a3b"),
    ("mesh4x4", 256, "qwen3-30b-a3b"),
)


def _time_fsedp(setup, lays, engine: str) -> tuple[float, int, int, int]:
    """Seconds per layer of FSE-DP A3 on ``engine``, and the steps, events and cycles."""
    t0 = time.perf_counter()
    steps = cycles = events = 0
    for lay in lays:
        r = fsedp_layer(setup, lay.records, "A3", streaming=engine)
        cycles += r.cycles
        steps += r.steps
        events += r.events
    return (time.perf_counter() - t0) / len(lays), steps, events, cycles


def bench(points=POINTS, layers: int = 3, engines=("python", "compiled")) -> list[dict]:
    """Both streaming engines side by side on the same layers (the compiled one warmed up
    first, so compilation is not timed), and EP's closed form."""
    from fsedp.sim.fast import available

    engines = [e for e in engines if e == "python" or available()]
    rows = []
    for hw, tokens, model in points:
        cfg = _cfg(hw, tokens, model)
        setup = make_setup(cfg)
        lays = iterations(cfg, 1, layers)[0]
        if "compiled" in engines:
            fsedp_layer(setup, lays[0].records, "A3", streaming="compiled")
        per = {}
        for e in engines:
            per[e] = _time_fsedp(setup, lays, e)
        if len({v[1:] for v in per.values()}) != 1:
            raise RuntimeError(f"the engines disagree on {hw} {model} {tokens}: {per}")
        _, steps, events, cycles = per[engines[0]]
        t0 = time.perf_counter()
        for lay in lays:
            ep_layer(setup, lay.records, ep_home(setup.sp.experts, setup.chiplets))
        ep_s = (time.perf_counter() - t0) / len(lays)
        fastest = per[engines[-1]][0]
        rows.append(
            {
                "hardware": hw,
                "chiplets": setup.chiplets,
                "tokens": tokens,
                "model": model,
                "experts": setup.sp.experts,
                "micro_slices": setup.dp.micro_slices,
                "s_per_layer": {e: round(per[e][0], 6) for e in engines},
                "events_per_s": {e: round(events / (per[e][0] * len(lays))) for e in engines},
                "ratio": round(per["python"][0] / per["compiled"][0], 1)
                if "compiled" in per
                else None,
                "ep_s_per_layer": round(ep_s, 4),
                "steps_per_layer": steps // len(lays),
                "events_per_layer": events // len(lays),
                "simulated_cycles_per_layer": cycles // len(lays),
                "projected_100_iterations_s": round(100 * fastest * cfg.model.layers),
            }
        )
    return rows


def end_to_end(iterations_: int = 100, workers: int = 2) -> dict:
    """The issue's end-to-end target: ``iterations_`` iterations of Qwen3-30B-A3B at 256
    tokens on the 2x2 chip, all 48 layers, EP + Hydra + A3, wall time on ``workers``."""
    from fsedp.sim.run import run_experiment

    cfg = _cfg("chip2x2", 256)
    t0 = time.perf_counter()
    run = run_experiment(
        cfg, ["EP", "Hydra", "A3"], n_iter=iterations_, progress=False, workers=workers
    )
    return {
        "iterations": iterations_,
        "layers": len(run["layers"]),
        "workers": workers,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def format_bench(rows) -> str:
    engines = list(rows[0]["s_per_layer"]) if rows else []
    out = [
        "| hardware | model (experts, M) | tokens | events/layer | "
        + " | ".join(f"A3 s/layer {e}" for e in engines)
        + " | "
        + " | ".join(f"events/s {e}" for e in engines)
        + " | python / compiled | EP s/layer | simulated cycles/layer | 100 iterations, "
        "projected |",
        "|---|---|---:|---:|" + "---:|" * (2 * len(engines)) + "---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['hardware']} | {r['model']} ({r['experts']}, {r['micro_slices']}) | "
            f"{r['tokens']} | {r['events_per_layer']} | "
            + " | ".join(str(r["s_per_layer"][e]) for e in engines)
            + " | "
            + " | ".join(str(r["events_per_s"][e]) for e in engines)
            + f" | {r['ratio'] if r['ratio'] is not None else '-'}x | {r['ep_s_per_layer']} | "
            f"{r['simulated_cycles_per_layer']} | {r['projected_100_iterations_s']} s |"
        )
    return "\n".join(out)
