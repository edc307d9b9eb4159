"""``fsedp prism refactor`` and ``fsedp prism curve``: MoE-Prism's offline refactoring of the
project's MoE LM and its quality curve (perplexity against active sub-experts, the paper's
Figure 9) with the count of distinct stable operating points (``docs/prism.md``)."""

from fsedp.lm.build import perplexity
from fsedp.lm.model import Hooks, MoELM
from fsedp.sw.policies.prism import (
    LinearGate,
    LinearGateHook,
    Partition,
    SubExpertHook,
    linear_gate_init,
    profile_activations,
    refactor,
)

__all__ = ["refactor_model", "quality_curve", "operating_points", "TopK"]


class TopK(Hooks):
    """The original model with its top ``k`` experts only (weights renormalised)."""

    def __init__(self, k: int):
        self.k = k

    def route(self, layer, probs, ids, weights, tokens):
        w = weights.copy()
        w[:, self.k :] = 0
        return ids, w / w.sum(1, keepdims=True)


def refactor_model(
    model: MoELM,
    prof_ids,
    S=4,
    K=2,
    g=4,
    top_p=0.1,
    t0=0.01,
    cooling=0.999,
    iters=3000,
    seed=0,
    max_rows=2048,
    log=None,
):
    acts = profile_activations(model, prof_ids, max_rows)
    return refactor(
        model,
        acts,
        S=S,
        K=K,
        g=g,
        top_p=top_p,
        t0=t0,
        cooling=cooling,
        iters=iters,
        seed=seed,
        log=log,
    ) + (acts,)


def quality_curve(model: MoELM, refactored: MoELM, naive: MoELM, test, progress=None) -> dict:
    """Perplexity at every total of active sub-experts ``K = 1 .. top_k x S`` for the
    refactored model and the naive contiguous split (both with proxy gating, and the
    refactored one also with oracle selection and with the untrained linear gate), the
    refactored model's fine-tuned linear gate if it holds one (``finetuned``), and the
    original model at top-1 .. top-k experts (``K = j x S``)."""
    part = Partition.of(refactored)
    naive_part = Partition.of(naive)
    S, k = part.S, model.cfg.top_k
    tuned = LinearGate.of(refactored)
    gates = {"linear": LinearGate(*linear_gate_init(refactored, S), S)}
    if tuned is not None:
        gates["finetuned"] = tuned
    out = {
        "S": S,
        "full": round(perplexity(model, test), 3),
        "original": {},
        "refactored": {},
        "refactored_oracle": {},
        "contiguous": {},
        **{key: {} for key in gates},
    }
    for j in range(1, k + 1):
        out["original"][j * S] = round(perplexity(model, test, TopK(j)), 3)
    for K in range(1, k * S + 1):
        for key, m, p, sel in (
            ("refactored", refactored, part, "proxy"),
            ("refactored_oracle", refactored, part, "oracle"),
            ("contiguous", naive, naive_part, "proxy"),
        ):
            out[key][K] = round(perplexity(m, test, SubExpertHook(m, p, K, sel).hooks), 3)
        for key, gate in gates.items():
            out[key][K] = round(
                perplexity(refactored, test, LinearGateHook(refactored, gate, K).hooks), 3
            )
        if progress:
            progress(K, {key: out[key][K] for key in out if key not in ("S", "full", "original")})
    return out


#: the deployable selectors whose operating points are counted (the oracle needs every
#: activation, the contiguous split is the ablation)
SELECTORS = ("refactored", "linear", "finetuned")


def operating_points(curve: dict, stable: float) -> dict:
    """Distinct compute budgets whose perplexity is within ``stable`` x the full model's:
    the original's (whole experts) and each selector's of :data:`SELECTORS` in the curve,
    with its ratio to the original's (``ratios``; ``ratio`` is proxy gating's)."""
    lim = stable * curve["full"]

    def count(points):
        return sorted(int(K) for K, p in points.items() if p <= lim)

    base = count(curve["original"])
    out = {"stable": stable, "limit": round(lim, 3), "original": base, "ratios": {}}
    for key in SELECTORS:
        if key in curve:
            out[key] = count(curve[key])
            out["ratios"][key] = round(len(out[key]) / len(base), 2) if base else None
    out["ratio"] = out["ratios"]["refactored"]
    return out


def plot_curve(curve: dict, path):
    from fsedp.files import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for key, label, style in (
        ("refactored", "refactored, proxy gating", "o-"),
        ("refactored_oracle", "refactored, oracle selection", "s--"),
        ("linear", "refactored, linear gate (untrained)", "v:"),
        ("finetuned", "refactored, linear gate fine-tuned", "P-"),
        ("contiguous", "contiguous split, proxy gating", "^:"),
        ("original", "original (top-1, top-2 experts)", "D"),
    ):
        if key not in curve:
            continue
        pts = sorted((int(K), p) for K, p in curve[key].items())
        ax.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            style,
            label=label,
            markersize=7 if key == "original" else 5,
        )
    ax.axhline(curve["full"], color="grey", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel(f"active sub-experts per token (S = {curve['S']} per expert)")
    ax.set_ylabel("WikiText-2 test perplexity")
    ax.set_title("MoE-Prism quality curve on the project's MoE LM")
    if ax.get_legend_handles_labels()[0]:  # a legend of nothing would warn
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
