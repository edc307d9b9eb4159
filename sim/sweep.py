"""Figure 9 of the paper as a sweep: every Table I model at 16 and 64 tokens per iteration
on the 2x2 test chip, EP, Hydra and FSE-DP side by side.

Micro-slices per expert: the smallest count (at least the hardware config's) for which the
chiplet's buffer holds 7 micro-slices (the default run's), capped at 256; the paper leaves
the size open, and the three largest experts of Table I do not fit 8 micro-slices in 4 MiB.
"""

import math

from ..config import CONFIG_DIR, WEIGHT_BYTES, _read_yaml, run_from_dict
from .run import run_experiment, summarize

__all__ = ["TABLE1", "figure9"]

TABLE1 = ("phi-3.5-moe", "yuan2.0-m32", "deepseek-moe-16b", "qwen3-30b-a3b")


def microslices_for(model: dict, hardware: dict, slots: int = 7) -> int:
    expert = 3 * model["d_model"] * model["d_ffn"] * WEIGHT_BYTES
    need = math.ceil(expert * slots / (hardware["onchip_buffer_kib"] * 1024))
    return min(256, max(hardware["microslices_per_expert"], need))


def figure9(models=TABLE1, tokens=(16, 64), layers: int = 8, strategies=("EP", "Hydra", "A2", "A3"),
            progress: bool = True, seed: int = 1) -> list[dict]:
    hw = _read_yaml(CONFIG_DIR / "hardware" / "chip2x2.yaml")
    rows = []
    for name in models:
        model = _read_yaml(CONFIG_DIR / "models" / f"{name}.yaml")
        m = microslices_for(model, hw)
        for t in tokens:
            cfg = run_from_dict({
                "hardware": {**hw, "microslices_per_expert": m}, "model": name,
                "scheduler": "default",
                "scenario": {"tokens_per_iteration": t, "rounds": 1, "seed": seed,
                             "trace": "synthetic", "skew": 1.1, "prefill_fraction": 0.5}},
                f"<figure9 {name} {t}>")
            run = run_experiment(cfg, strategies, n_iter=1, layers=layers, progress=progress)
            s = summarize(run)
            rows.append({"model": name, "tokens": t, "micro_slices": m,
                         "slots": run["setup"].dp.slots, **{k: s[k] for k in strategies}})
    return rows


def format_figure9(rows, strategies=("EP", "Hydra", "A2", "A3")) -> str:
    out = ["| model | tokens | M | A3 vs EP | A3 vs Hydra | A2 vs EP | x bound EP / Hydra / A3 "
           "| on-chip MB EP / A3 | utilization EP / A3 |",
           "|---|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        ep, hy, a3 = r["EP"], r["Hydra"], r["A3"]
        a2 = r["A2"]
        out.append(
            f"| {r['model']} | {r['tokens']} | {r['micro_slices']} | "
            f"{ep['moe_layer_us'] / a3['moe_layer_us']:.3f} | "
            f"{hy['moe_layer_us'] / a3['moe_layer_us']:.3f} | "
            f"{ep['moe_layer_us'] / a2['moe_layer_us']:.3f} | "
            f"{ep['x_bound']} / {hy['x_bound']} / {a3['x_bound']} | "
            f"{ep['onchip_mb']} / {a3['onchip_mb']} | "
            f"{ep['utilization'] * 100:.1f} % / {a3['utilization'] * 100:.1f} % |")
    return "\n".join(out)
