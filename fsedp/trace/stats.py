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

A figure undefined on the trace (a precision over no test tokens: a one-token trace keeps its
one token to fit; the token-id precision when no test token's id was seen) is ``None``
(``null`` in ``stats.json``) and its object carries ``"undefined": {figure: reason}``
(:func:`undefined`); the Markdown shows ``n/a (reason)``.  Windows longer than the trace are
left out of the load skew.
"""

import numpy as np

from fsedp.errors import InputError
from fsedp.trace.core import RoutingTrace, pair_counts

__all__ = ["WINDOWS", "trace_stats", "format_stats", "plot_stats"]

WINDOWS = (16, 64, 256, 1024)
PEERS = (1, 2, 4, 8)
#: Values of a dense table (windows x experts, tokens x experts) built at a time: the
#: statistics are computed in slices of rows of this size, so that their memory does not
#: grow with the length of the trace (at most 32 MiB of float64 a slice, about 1 GB in all
#: for the largest trace a file may hold, :data:`fsedp.trace.core.MAX_ENTRIES`).
BLOCK = 1 << 22


def _gini(x: np.ndarray) -> float:
    x = np.sort(x.astype(np.float64))
    n = len(x)
    if n == 0 or x.sum() == 0:
        return 0.0
    return float((2 * np.arange(1, n + 1) - n - 1) @ x / (n * x.sum()))


def _rows(n: int, width: int):
    """Slices ``[a, b)`` of ``n`` rows of ``width`` values, about :data:`BLOCK` values each."""
    step = max(1, BLOCK // max(1, width))
    for a in range(0, n, step):
        yield a, min(n, a + step)


def window_loads(experts: np.ndarray, num_experts: int, window: int) -> np.ndarray:
    """Loads ``[windows, E]`` of one layer's ``experts [T, k]`` in windows of ``window``."""
    t = (len(experts) // window) * window
    w = np.repeat(np.arange(t // window), window * experts.shape[1])
    flat = experts[:t].reshape(-1).astype(np.int64)
    return np.bincount(w * num_experts + flat, minlength=(t // window) * num_experts).reshape(
        -1, num_experts
    )


def _load_blocks(experts: np.ndarray, num_experts: int, window: int):
    """:func:`window_loads` of whole windows, a slice of windows at a time."""
    for a, b in _rows(len(experts) // window, num_experts):
        yield window_loads(experts[a * window : b * window], num_experts, window)


def skew(experts: np.ndarray, num_experts: int, window: int) -> dict:
    """Load skew of one layer's ``experts [T, k]`` over its windows of ``window`` tokens."""
    active, cold, peak, gini = 0, [], [], []
    for loads in _load_blocks(experts, num_experts, window):
        n_active = (loads > 0).sum(1)
        active += int(n_active.sum())
        cold.append(((loads > 0) & (loads <= 2)).sum(1) / np.maximum(n_active, 1))
        mean_active = loads.sum(1) / np.maximum(n_active, 1)
        peak.append(loads.max(1) / np.maximum(mean_active, 1e-9))
        gini += [_gini(r) for r in loads]
    n = len(gini)
    return {
        "active": float(active / (n * num_experts)),
        "cold": float(np.concatenate(cold).mean()),
        "peak_mean": float(np.concatenate(peak).mean()),
        "gini": float(np.mean(gini)),
    }


def concentration(experts: np.ndarray, num_experts: int, peers=PEERS) -> dict:
    """Co-activation concentration of one layer's ``experts [T, k]``: the co-activation
    counts (other experts chosen by the same token; :func:`fsedp.trace.core.pair_counts`
    with ``other_slots``) are counted sparsely, as (expert, peer) pairs, instead of in an
    ``[E, E]`` table, and each expert's top-``r`` peers are summed from its sorted row."""
    ne = num_experts
    e = experts.astype(np.int64)
    k = e.shape[1]
    keys = [e[:, x] * ne + e[:, y] for x in range(k) for y in range(k) if x != y]
    tot = np.zeros(ne)
    top = {r: np.zeros(ne) for r in peers}
    if keys:
        pair, cnt = np.unique(np.concatenate(keys), return_counts=True)
        row = pair // ne
        # each row's counts in decreasing order: sort by (row, -count)
        order = np.lexsort((-cnt, row))
        row, cnt = row[order], cnt[order].astype(np.float64)
        start = np.searchsorted(row, np.arange(ne))
        rank = np.arange(len(row)) - start[row]
        tot = np.bincount(row, weights=cnt, minlength=ne)
        for r in peers:
            keep = rank < min(r, ne)
            top[r] = np.bincount(row[keep], weights=cnt[keep], minlength=ne)
    w = tot / max(1, tot.sum())
    return {f"top{r}": float((top[r] / np.maximum(tot, 1)) @ w) for r in peers}


def _hits(pred: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Per row, how many of ``chosen [N, k]`` the row of ``pred [N, k']`` holds."""
    out = np.empty(len(chosen), dtype=np.int64)
    for a, b in _rows(len(chosen), pred.shape[1] * chosen.shape[1]):
        out[a:b] = (pred[a:b, :, None] == chosen[a:b, None, :]).any(-1).sum(1)
    return out


def _precision(pred: np.ndarray, chosen: np.ndarray) -> float | None:
    """The mean top-k precision of ``pred`` on ``chosen``; ``None`` over no rows."""
    if not len(chosen):
        return None
    return float(_hits(pred, chosen).mean() / chosen.shape[1])


def _put(row: dict, key: str, value, reason: str):
    """``row[key] = value``; a ``None`` value (undefined) with its reason in
    ``row["undefined"]``."""
    row[key] = value
    if value is None:
        row.setdefault("undefined", {})[key] = reason


def undefined(row: dict, key: str) -> str | None:
    """Why ``row[key]`` is undefined (``None``), else ``None``."""
    return row.get("undefined", {}).get(key)


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest scores of each row, largest first, ties to the lower
    index: ``argsort(-scores, kind="stable")[..., :k]``, found in linear time (a partition
    for the k-th largest value, then a sort of the ``k`` kept) instead of sorting rows of
    up to 4096 experts."""
    n = scores.shape[-1]
    if scores.ndim != 2 or n <= 4 * k:
        return np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    kth = np.partition(scores, n - k, axis=-1)[:, n - k : n - k + 1]  # the k-th largest
    keep = scores >= kth
    tie = scores == kth
    extra = keep.sum(1) - k  # ties beyond the k: keep the lowest-index ones
    rows = np.flatnonzero(extra)
    if len(rows):
        t = tie[rows]
        keep[rows] &= ~t | (
            np.cumsum(t, axis=1, dtype=np.int32) <= (t.sum(1) - extra[rows])[:, None]
        )
    idx = (np.flatnonzero(keep) % n).reshape(len(scores), k)  # increasing index in each row
    order = np.argsort(-np.take_along_axis(scores, idx, axis=1), axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1)


def _sparse_rows(keys: np.ndarray, counts: np.ndarray, rows: np.ndarray, ne: int) -> np.ndarray:
    """Dense rows ``[len(rows), ne]`` of a sparse count table (sorted ``keys = row * ne +
    column`` with their ``counts``)."""
    out = np.zeros((len(rows), ne), dtype=np.int64)
    lo = np.searchsorted(keys, rows * ne)
    n = np.searchsorted(keys, (rows + 1) * ne) - lo
    at = np.repeat(np.arange(len(rows)), n)
    src = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
    out[at, keys[src] - rows[at] * ne] = counts[src]
    return out


def predictability(trace: RoutingTrace, fit: float = 0.2) -> dict:
    e, ne, k = trace.experts.astype(np.int64), trace.num_experts, trace.top_k
    n_fit = max(1, int(trace.tokens * fit))
    out = {"fit_tokens": n_fit, "layers": []}
    n_test = trace.tokens - n_fit
    no_test = (
        f"no test tokens: the trace's {trace.tokens} token{'s' * (trace.tokens != 1)} "
        f"fit the predictors (the first {fit:.0%}, at least one)"
    )
    for l in range(trace.layers):
        row = {"layer": l}
        pop = np.bincount(e[:n_fit, l].reshape(-1), minlength=ne)
        test = e[n_fit:, l]
        _put(row, "popularity", _precision(np.tile(_topk(pop, k), (n_test, 1)), test), no_test)
        if l > 0:
            trans = pair_counts(e[:n_fit, l - 1], e[:n_fit, l], ne)
            prev = e[n_fit:, l - 1]
            pred = np.empty((len(test), k), dtype=np.int64)
            for a, b in _rows(len(test), ne):
                score = trans[prev[a:b, 0]]  # counts: their sum is exact in any order
                for j in range(1, prev.shape[1]):
                    score += trans[prev[a:b, j]]
                pred[a:b] = _topk(score + 1e-6 * pop, k)
            _put(row, "inter_layer", _precision(pred, test), no_test)
        if trace.token_ids is not None:
            tok = trace.token_ids.astype(np.int64)
            ids, inv = np.unique(tok[:n_fit], return_inverse=True)
            # the (id, expert) counts of the fitting part, sparse: [ids, E] may not fit
            keys, counts = np.unique(
                np.repeat(inv, k) * ne + e[:n_fit, l].reshape(-1), return_counts=True
            )
            pos = np.searchsorted(ids, tok[n_fit:])
            pos[pos == len(ids)] = 0
            seen = ids[pos] == tok[n_fit:]
            pred = np.empty((len(test), k), dtype=np.int64)
            for a, b in _rows(len(test), ne):
                table = _sparse_rows(keys, counts, pos[a:b], ne)
                score = np.where(seen[a:b, None], table, 0) + 1e-6 * pop
                pred[a:b] = _topk(score, k)
            never = (
                f"no test token's id occurs among the {n_fit} fitting tokens" if n_test else no_test
            )
            _put(row, "token_id", _precision(pred[seen], test[seen]), never)
            _put(row, "token_id_all", _precision(pred, test), no_test)
            _put(row, "coverage", float(seen.mean()) if n_test else None, no_test)
        if "undefined" in row:  # after the figures
            row["undefined"] = row.pop("undefined")
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
            res["skew"].append({"window": w, "layer": l, **skew(trace.experts[:, l], ne, w)})
    for l in range(trace.layers):
        res["coactivation"].append({"layer": l, **concentration(trace.experts[:, l], ne)})
    res["predictability"] = predictability(trace, fit)
    return res


def _mean(rows, key):
    v = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(v)) if v else None


def summary(stats: dict) -> dict:
    """Means over layers: the few numbers two traces are compared by; ``None`` where no layer
    has the figure (a trace without token ids, one layer, no test tokens)."""
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
    if not stats["skew"]:
        lines.append(
            f"| n/a (the trace's {stats['tokens']} tokens are fewer than a window of "
            f"{min(WINDOWS)}) | | | | |"
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

    def f(r, key):
        """A figure; ``n/a (reason)`` when undefined, ``-`` where it does not apply (layer 0
        has no inter-layer figure, a trace without ids no token-id figures)."""
        if (why := undefined(r, key)) is not None:
            return f"n/a ({why})"
        return "-" if r.get(key) is None else f"{r[key]:.3f}"

    for r in pr["layers"]:
        lines.append(
            f"| {r['layer']} | {f(r, 'popularity')} | {f(r, 'inter_layer')} | "
            f"{f(r, 'token_id')} | {f(r, 'coverage')} |"
        )
    return "\n".join(lines) + "\n"


def plot_stats(stats: dict, trace: RoutingTrace, out_dir) -> list:
    """PNG plots into ``out_dir``: sorted expert loads per window size (the long tail), cold
    share against window size, co-activation coverage, predictability per layer."""
    from pathlib import Path

    from fsedp.files import pyplot

    plt = pyplot()

    def n_a(ax, why: str):
        """An empty plot says why (a figure undefined on the trace): no legend, no warning."""
        ax.text(0.5, 0.5, f"n/a ({why})", ha="center", va="center", transform=ax.transAxes)

    no_window = f"{trace.tokens} tokens, fewer than a window of {min(WINDOWS)}"
    out_dir = Path(out_dir)
    files = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for w in WINDOWS:
        if trace.tokens < w:
            continue
        total, n = 0.0, 0
        for loads in _load_blocks(trace.experts[:, 0], trace.num_experts, w):
            total = total + (-np.sort(-loads, axis=1)).sum(0)
            n += len(loads)
        curve = total / n
        ax.plot(np.arange(1, len(curve) + 1), curve / max(curve.sum(), 1), label=f"{w} tokens")
    ax.set_xlabel("expert rank in the window")
    ax.set_ylabel("share of the window's activations")
    ax.set_yscale("log")
    ax.set_title("Expert load, layer 0 (long tail)")
    if ax.get_legend_handles_labels()[0]:  # a legend of nothing would warn
        ax.legend()
    else:  # the trace is shorter than every window
        n_a(ax, no_window)
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
    if not ws:
        n_a(axes[0], no_window)
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
        v = [np.nan if r.get(key) is None else r[key] for r in rows]
        if not np.isnan(v).all():  # an undefined figure (None) is a gap
            axes[2].plot(ls, v, marker="o", label=label)
    axes[2].set_xlabel("MoE layer")
    axes[2].set_ylabel("top-k precision")
    axes[2].set_title("Predictability")
    if axes[2].get_legend_handles_labels()[0]:
        axes[2].legend()
    else:
        n_a(axes[2], "no test tokens")
    fig.tight_layout()
    files.append(out_dir / "stats.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)
    return files
