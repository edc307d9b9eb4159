"""``fsedp bench``: speed of the simulator (wall time per simulated MoE layer, golden-model
steps and micro-slice events per second) and how it grows with tokens, experts and
chiplets.  A benchmark, not a test: the
figures go to ``docs/results.md`` with the command."""

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


def bench(points=POINTS, layers: int = 3) -> list[dict]:
    rows = []
    for hw, tokens, model in points:
        cfg = _cfg(hw, tokens, model)
        setup = make_setup(cfg)
        lays = iterations(cfg, 1, layers)[0]
        t0 = time.perf_counter()
        steps = cycles = events = 0
        for lay in lays:
            r = fsedp_layer(setup, lay.records, "A3")
            cycles += r.cycles
            steps += r.steps
            events += r.events
        fsedp_s = (time.perf_counter() - t0) / len(lays)
        t0 = time.perf_counter()
        for lay in lays:
            ep_layer(setup, lay.records, ep_home(setup.sp.experts, setup.chiplets))
        ep_s = (time.perf_counter() - t0) / len(lays)
        per_iter = fsedp_s * cfg.model.layers
        rows.append(
            {
                "hardware": hw,
                "chiplets": setup.chiplets,
                "tokens": tokens,
                "model": model,
                "experts": setup.sp.experts,
                "micro_slices": setup.dp.micro_slices,
                "events_per_s": round(events / (fsedp_s * len(lays))),
                "fsedp_s_per_layer": round(fsedp_s, 3),
                "ep_s_per_layer": round(ep_s, 4),
                "steps_per_layer": steps // len(lays),
                "steps_per_s": round(steps / (fsedp_s * len(lays))),
                "simulated_cycles_per_layer": cycles // len(lays),
                "projected_100_iterations_s": round(100 * per_iter),
            }
        )
    return rows


def format_bench(rows) -> str:
    out = [
        "| hardware | model (experts, M) | tokens | FSE-DP A3 s/layer | EP s/layer | golden "
        "steps/layer "
        "| steps/s | micro-slice events/s | simulated cycles/layer | 100 iterations, projected |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['hardware']} | {r['model']} ({r['experts']}, {r['micro_slices']}) | "
            f"{r['tokens']} | {r['fsedp_s_per_layer']} | "
            f"{r['ep_s_per_layer']} | {r['steps_per_layer']} | {r['steps_per_s']} | "
            f"{r['events_per_s']} | "
            f"{r['simulated_cycles_per_layer']} | {r['projected_100_iterations_s']} s |"
        )
    return "\n".join(out)
