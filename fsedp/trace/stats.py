"""``fsedp trace stats``: what a routing trace looks like to a scheduler and to a predictor.

Per MoE layer and per window of ``W`` consecutive tokens (``W`` = tokens per iteration:
16, 64, 256, 1024):

* **load skew** (the long tail of FSE-DP's Figure 2): the fraction of experts a window
  activates (``active``), the share of the active experts that get at most 2 tokens of the
  window (``cold``: the long tail), the busiest expert's load over the active experts' mean
  (``peak_mean``) and the Gini coefficient of the loads over all experts;

per MoE layer:

* **co-activation concentration** (BuddyMoE, Section 3.2): for each expert ``i``, the share
  of its co-activations (other experts chosen by the same token at the same layer) that
  its top-``r`` peers cover, averaged over experts weighted by their activations, for
  ``r`` = 1, 2, 4, 8;
* **inter-layer predictability** (Speculative MoE, Appendix A): layer-to-layer transition
  counts fitted on the first 20 % of the tokens; for the other 80 %, the top-k experts
  predicted from the token's experts at the previous layer, scored as precision
  (|predicted and chosen| / k), next to the precision of always predicting the k most
  popular experts of the fitting part;
* **token-id predictability** (the same appendix): expert counts per vocabulary id fitted on
  the first 20 %, precision on the tokens of the other 80 % whose id was seen (``coverage``:
  their share), popularity as the fallback for unseen ids.

Precision is the top-k overlap used by Speculative MoE's Figure 12 (with exactly k experts
predicted and chosen, precision = recall = F1).
"""

import numpy as np

from fsedp.errors import InputError
from fsedp.trace.core import RoutingTrace, pair_counts

__all__ = ["WINDOWS", "trace_stats", "format_stats", "plot_stats"]

WINDOWS = (16, 64, 256, 1024)
PEERS = (1, 2, 4, 8)


def _gini(x: np.ndarray) -> float:
    x = np.sort(x.astype(np.float64))
    n = len(x)
    if n == 0 or x.sum() == 0:
        return 0.0
    return float((2 * np.arange(1, n + 1) - n - 1) @ x / (n * x.sum()))


def window_loads(experts: np.ndarray, num_experts: int, window: int) -> np.ndarray:
    """Loads ``[windows, E]`` of one layer's ``experts [T, k]`` in windows of ``window``."""
    t = (len(experts) // window) * window
    w = np.repeat(np.arange(t // window), window * experts.shape[1])
    flat = experts[:t].reshape(-1).astype(np.int64)
    return np.bincount(w * num_experts + flat, minlength=(t // window) * num_experts).reshape(
        -1, num_experts
    )


def skew(loads: np.ndarray) -> dict:
    active = loads > 0
    n_active = active.sum(1)
    cold = ((loads > 0) & (loads <= 2)).sum(1) / np.maximum(n_active, 1)
    mean_active = loads.sum(1) / np.maximum(n_active, 1)
    return {
        "active": float(active.mean()),
        "cold": float(cold.mean()),
        "peak_mean": float((loads.max(1) / np.maximum(mean_active, 1e-9)).mean()),
        "gini": float(np.mean([_gini(r) for r in loads])),
    }


def coactivation(experts: np.ndarray, num_experts: int) -> np.ndarray:
    """Co-activation counts ``M [E, E]`` of one layer (same token; diagonal zero)."""
    return pair_counts(experts, experts, num_experts, other_slots=True)


def concentration(m: np.ndarray, peers=PEERS) -> dict:
    tot = m.sum(1)
    srt = -np.sort(-m, axis=1)
    cum = np.cumsum(srt, axis=1)
    w = tot / max(1, tot.sum())
    return {
        f"top{r}": float((cum[:, min(r, m.shape[1]) - 1] / np.maximum(tot, 1)) @ w) for r in peers
    }


def _precision(pred: np.ndarray, chosen: np.ndarray) -> float:
    hits = (pred[:, :, None] == chosen[:, None, :]).any(-1).sum(1)
    return float(hits.mean() / chosen.shape[1]) if len(chosen) else float("nan")


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


def predictability(trace: RoutingTrace, fit: float = 0.2) -> dict:
    e, ne, k = trace.experts.astype(np.int64), trace.num_experts, trace.top_k
    n_fit = max(1, int(trace.tokens * fit))
    out = {"fit_tokens": n_fit, "layers": []}
    for l in range(trace.layers):
        row = {"layer": l}
        pop = np.bincount(e[:n_fit, l].reshape(-1), minlength=ne)
        test = e[n_fit:, l]
        row["popularity"] = _precision(np.tile(_topk(pop, k), (len(test), 1)), test)
        if l > 0:
            trans = pair_counts(e[:n_fit, l - 1], e[:n_fit, l], ne)
            score = trans[e[n_fit:, l - 1]].sum(1) + 1e-6 * pop
            row["inter_layer"] = _precision(_topk(score, k), test)
        if trace.token_ids is not None:
            tok = trace.token_ids.astype(np.int64)
            ids, inv = np.unique(tok[:n_fit], return_inverse=True)
            table = np.zeros((len(ids), ne), dtype=np.int64)
            np.add.at(table, (np.repeat(inv, k), e[:n_fit, l].reshape(-1)), 1)
            pos = np.searchsorted(ids, tok[n_fit:])
            pos[pos == len(ids)] = 0
            seen = ids[pos] == tok[n_fit:]
            score = np.where(seen[:, None], table[pos], 0) + 1e-6 * pop
            row["token_id"] = _precision(_topk(score, k)[seen], test[seen])
            row["token_id_all"] = _precision(_topk(score, k), test)
            row["coverage"] = float(seen.mean()) if len(seen) else float("nan")
        out["layers"].append(row)
    return out


def trace_stats(trace: RoutingTrace, windows=WINDOWS, fit: float = 0.2) -> dict:
    if not 0 < fit < 1:
        raise InputError(trace.name, "fit", f"must be in (0, 1), not {fit}")
    ne = trace.num_experts
    res = {
        "name": trace.name,
        "tokens": trace.tokens,
        "layers": trace.layers,
        "top_k": trace.top_k,
        "num_experts": ne,
        "skew": [],
        "coactivation": [],
    }
    for w in windows:
        if trace.tokens < w:
            continue
        for l in range(trace.layers):
            res["skew"].append(
                {"window": w, "layer": l, **skew(window_loads(trace.experts[:, l], ne, w))}
            )
    for l in range(trace.layers):
        m = coactivation(trace.experts[:, l].astype(np.int64), ne)
        res["coactivation"].append({"layer": l, **concentration(m)})
    res["predictability"] = predictability(trace, fit)
    return res


def _mean(rows, key):
    v = [r[key] for r in rows if key in r and r[key] == r[key]]
    return float(np.mean(v)) if v else float("nan")


def summary(stats: dict) -> dict:
    """Means over layers: the few numbers two traces are compared by."""
    out = {}
    for w in sorted({r["window"] for r in stats["skew"]}):
        rows = [r for r in stats["skew"] if r["window"] == w]
        for key in ("active", "cold", "peak_mean", "gini"):
            out[f"{key}@{w}"] = _mean(rows, key)
    for r in PEERS:
        out[f"coact_top{r}"] = _mean(stats["coactivation"], f"top{r}")
    rows = stats["predictability"]["layers"]
    for key in ("popularity", "inter_layer", "token_id", "coverage"):
        out[key] = _mean(rows, key)
    return out


def format_stats(stats: dict) -> str:
    s = summary(stats)
    lines = [
        f"# {stats['name']}: {stats['tokens']} tokens, {stats['layers']} MoE layers, "
        f"top-{stats['top_k']} of {stats['num_experts']} experts",
        "",
        "## Load skew per window (mean over layers and windows)",
        "",
        "| tokens per window | active experts | cold share (<= 2 tokens) | peak / mean | Gini |",
        "|---:|---:|---:|---:|---:|",
    ]
    for w in sorted({r["window"] for r in stats["skew"]}):
        lines.append(
            f"| {w} | {s[f'active@{w}']:.3f} | {s[f'cold@{w}']:.3f} | "
            f"{s[f'peak_mean@{w}']:.2f} | {s[f'gini@{w}']:.3f} |"
        )
    lines += [
        "",
        "## Co-activation concentration (share of an expert's co-activations "
        "covered by its top-r peers)",
        "",
        "| layer | " + " | ".join(f"top-{r}" for r in PEERS) + " |",
        "|---:|" + "---:|" * len(PEERS),
    ]
    for r in stats["coactivation"]:
        lines.append(f"| {r['layer']} | " + " | ".join(f"{r[f'top{p}']:.3f}" for p in PEERS) + " |")
    pr = stats["predictability"]
    lines += [
        "",
        f"## Predictability (fitted on the first {pr['fit_tokens']} tokens; "
        "top-k precision on the rest)",
        "",
        "| layer | popularity | inter-layer | token id (seen ids) | seen-id coverage |",
        "|---:|---:|---:|---:|---:|",
    ]

    def f(v):
        return "-" if v is None or v != v else f"{v:.3f}"

    for r in pr["layers"]:
        lines.append(
            f"| {r['layer']} | {f(r['popularity'])} | {f(r.get('inter_layer'))} | "
            f"{f(r.get('token_id'))} | {f(r.get('coverage'))} |"
        )
    return "\n".join(lines) + "\n"


def plot_stats(stats: dict, trace: RoutingTrace, out_dir) -> list:
    """PNG plots into ``out_dir``: sorted expert loads per window size (the long tail), cold
    share against window size, co-activation coverage, predictability per layer."""
    from pathlib import Path

    from fsedp.files import pyplot

    plt = pyplot()

    out_dir = Path(out_dir)
    files = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for w in WINDOWS:
        if trace.tokens < w:
            continue
        loads = window_loads(trace.experts[:, 0], trace.num_experts, w)
        curve = np.mean(-np.sort(-loads, axis=1), axis=0)
        ax.plot(np.arange(1, len(curve) + 1), curve / max(curve.sum(), 1), label=f"{w} tokens")
    ax.set_xlabel("expert rank in the window")
    ax.set_ylabel("share of the window's activations")
    ax.set_yscale("log")
    ax.set_title("Expert load, layer 0 (long tail)")
    ax.legend()
    fig.tight_layout()
    files.append(out_dir / "load_tail.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ws = sorted({r["window"] for r in stats["skew"]})
    for l in range(trace.layers):
        axes[0].plot(
            ws,
            [
                next(r["cold"] for r in stats["skew"] if r["window"] == w and r["layer"] == l)
                for w in ws
            ],
            marker="o",
            alpha=0.6,
        )
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("tokens per window")
    axes[0].set_ylabel("cold share of active experts")
    axes[0].set_title("Long tail vs tokens per iteration")
    for r in stats["coactivation"]:
        axes[1].plot(PEERS, [r[f"top{p}"] for p in PEERS], marker="o", alpha=0.6)
    axes[1].set_xlabel("top-r peers")
    axes[1].set_ylabel("co-activation coverage")
    axes[1].set_title("Co-activation concentration")
    rows = stats["predictability"]["layers"]
    ls = [r["layer"] for r in rows]
    for key, label in (
        ("popularity", "popularity"),
        ("inter_layer", "inter-layer"),
        ("token_id", "token id"),
    ):
        axes[2].plot(ls, [r.get(key, np.nan) for r in rows], marker="o", label=label)
    axes[2].set_xlabel("MoE layer")
    axes[2].set_ylabel("top-k precision")
    axes[2].set_title("Predictability")
    axes[2].legend()
    fig.tight_layout()
    files.append(out_dir / "stats.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)
    return files
