"""Co-design across the papers: the FSE-DP chip moving fewer DDR bytes with the software
papers' techniques, each measured for speed on the simulated chip and for accuracy on the
project's MoE LM (``docs/codesign.md``).

The LM runs the held-out text; every ``tokens`` consecutive tokens are one iteration of the
chip (:class:`ChipHook`).  Per iteration and layer, **buddy substitution on the DDR path**
(BuddyMoE, :func:`fsedp.sw.policies.buddy.substitute_cold`) moves the tokens of a cold
expert (at most ``theta`` of the iteration's tokens) to buddies the chip streams anyway,
all of them or none; **MoE-Prism** keeps each token's ``K`` best sub-experts, streamed as
experts of the chip.  The routing the LM then uses -- the perplexity is measured with
it -- is the routing the chip simulates (FSE-DP A3), so both numbers come from one set of
decisions.  Routing
and accuracy are the LM's (16 experts, top-2, 4 layers); byte and FLOP sizes come from a
deployment model config (``scale_to``, as ``fsedp offload --scale-to``), with the LM's
expert count, top-k and layers.
"""

import dataclasses

import numpy as np

from fsedp.config import RunConfig, config_path, default_run, load_model
from fsedp.errors import COMMAND_LINE
from fsedp.lm.model import Hooks, MoELM
from fsedp.sw.policies.buddy import BuddyConfig, BuddyProfile, substitute_cold
from fsedp.trace.core import RoutingTrace

__all__ = [
    "ChipHook",
    "TECHNIQUES",
    "techniques",
    "deployment_config",
    "routing_trace",
    "codesign",
    "format_table",
    "plot_tradeoff",
]


class ChipHook(Hooks):
    """Applies the chip-side techniques in the LM's forward pass, per iteration of ``tokens``
    consecutive tokens (the rows of a forward batch, in text order), and records the
    routing the chip then streams.

    * with ``prof``: BuddyMoE on the DDR path (:func:`substitute_cold` at ``theta``);
    * with ``sub`` (a :class:`fsedp.sw.policies.prism.SubExpertHook` on a refactored
      model): MoE-Prism, each token computing only its ``K`` best sub-experts of its
      experts (proxy gating); the recorded routing is then over sub-experts, expert ``e``'s
      sub-expert ``s`` being ``e x S + s``, ``K`` per token, so the chip streams a
      sub-expert only when some token of the iteration selected it.
    """

    def __init__(self, layers: int, tokens: int, prof=None, theta: int = 0, sub=None):
        self.tokens, self.prof, self.theta, self.sub = tokens, prof, theta, sub
        self.ids = [[] for _ in range(layers)]
        self.weights = [[] for _ in range(layers)]
        self.info = {"cold": 0, "saved": 0, "kept": 0, "substituted": 0, "tae_blocked": 0}

    def moe_input(self, layer, h):
        if self.sub is not None:
            self.sub._h = h

    def route(self, layer, probs, ids, weights, tokens):
        new = np.array(ids, dtype=np.int64, copy=True)
        if self.prof is not None:
            for s in range(0, len(ids), self.tokens):
                rows = slice(s, s + self.tokens)
                new[rows], info = substitute_cold(
                    self.prof, layer, ids[rows], weights[rows], probs[rows], self.theta
                )
                for k in self.info:
                    self.info[k] += info.get(k, 0)
        w = np.asarray(weights)
        if self.sub is None:
            self.ids[layer].append(new)
            self.weights[layer].append(w)
        else:
            self.sub._select(layer, new, w)
            keep, S = self.sub._keep, self.sub.S  # [n, k, S], exactly K per token
            n = len(new)
            vid = new[:, :, None] * S + np.arange(S)
            self.ids[layer].append(vid[keep].reshape(n, -1))
            self.weights[layer].append(
                np.broadcast_to(w[:, :, None], keep.shape)[keep].reshape(n, -1)
            )
        return new, weights

    def neurons(self, layer, expert, rows, act):
        return None if self.sub is None else self.sub._mask(expert, rows, act)


def routing_trace(hook: ChipHook, token_ids, context: int, experts: int, name: str):
    """The routing ``hook`` recorded as a :class:`RoutingTrace`: one request per context
    window, tokens in text order."""
    ex = np.stack([np.concatenate(x) for x in hook.ids], axis=1)
    sc = np.stack([np.concatenate(x) for x in hook.weights], axis=1).astype(np.float32)
    n = len(ex)
    return RoutingTrace(
        experts=ex,
        scores=sc,
        token_ids=np.asarray(token_ids[:n], dtype=np.int32),
        request=np.arange(n, dtype=np.int32) // context,
        position=np.arange(n, dtype=np.int32) % context,
        num_experts=experts,
        name=name,
    )


def deployment_config(
    model: MoELM, scale_to: str, tokens: int, sub=None, base: RunConfig | None = None
):
    """``base`` (default: the embedded 2x2 run) with the LM's routing shape (experts, top-k,
    layers, no shared expert) and ``scale_to``'s sizes (hidden and expert widths, heads).
    With ``sub = (S, K)`` the chip's experts are the sub-experts: ``E x S`` of them,
    ``K`` per token, each ``d_ffn / S`` wide and cut into ``M / S`` micro-slices, so a
    micro-slice (and the buffer's slots, the link and DDR times per slot) stays the size
    it is for whole experts."""
    base = base or default_run()
    size = load_model(config_path("models", scale_to, COMMAND_LINE, "--scale-to"))
    m = dataclasses.replace(
        size,
        name=f"{size.name} sizes, project LM routing",
        experts=model.cfg.experts,
        top_k=model.cfg.top_k,
        layers=model.cfg.layers,
        shared_experts=0,
    )
    sc = dataclasses.replace(base.scenario, tokens_per_iteration=tokens, trace="model")
    cfg = dataclasses.replace(base, model=m, scenario=sc)
    if sub is None:
        return cfg
    S, K = sub
    micro = cfg.datapath_params().micro_slices
    m = dataclasses.replace(
        m,
        name=f"{m.name}, {S} sub-experts each",
        experts=m.experts * S,
        top_k=K,
        d_ffn=m.d_ffn // S,
    )
    hw = dataclasses.replace(cfg.hardware, microslices_per_expert=max(1, micro // S))
    return dataclasses.replace(cfg, model=m, hardware=hw)


def techniques(thetas=(1, 2), ks=(6, 4), S: int = 4) -> list:
    """``(name, buddy theta, (S, K) or None)`` of ``fsedp codesign``: FSE-DP alone, buddy
    substitution at each theta, MoE-Prism at each K (of ``top_k x S`` sub-experts per
    token), and each K combined with the theta at the same position (or the last)."""
    out = [("FSE-DP alone", 0, None)]
    out += [(f"+ buddy (theta {t})", t, None) for t in thetas]
    out += [(f"+ prism, sub-experts as experts (K {k})", 0, (S, k)) for k in ks]
    for i, k in enumerate(ks):
        if thetas:
            t = thetas[min(i, len(thetas) - 1)]
            out.append((f"+ buddy (theta {t}) + prism (K {k})", t, (S, k)))
    return out


TECHNIQUES = tuple(techniques())


def codesign(
    model: MoELM,
    test_ids: np.ndarray,
    prof_ids: np.ndarray,
    plan=TECHNIQUES,
    tokens: int = 64,
    scale_to: str = "qwen3-30b-a3b",
    buddy: BuddyConfig | None = None,
    strategy: str = "A3",
    prism_iters: int = 3000,
    progress=None,
) -> dict:
    """Each technique of ``plan`` (``(name, theta, (S, K) or None)``, see
    :func:`techniques`): perplexity on ``test_ids`` with the
    routing it makes, and the chip's throughput, bound and DDR bytes on that routing.  The
    first must be FSE-DP alone (theta 0, no sub-experts): the others are relative to it.
    MoE-Prism runs on the LM refactored into ``S`` sub-experts (annealed partition,
    ``prism_iters`` steps), which computes what the LM computes when every sub-expert is
    kept."""
    from fsedp.experiments.offload import profile_routing
    from fsedp.experiments.prism import refactor_model
    from fsedp.sim.run import run_experiment, summarize
    from fsedp.sw.policies.prism import Partition, SubExpertHook

    if plan[0][1:] != (0, None):
        raise ValueError("the first technique must be FSE-DP alone (theta 0, no sub-experts)")
    buddy = buddy or BuddyConfig()
    p_ids, p_w, _ = profile_routing(model, prof_ids)
    prof = BuddyProfile(p_ids, p_w, model.cfg.experts, buddy)
    refactored = {}
    rows, traces, configs = [], {}, []
    for name, theta, sub in plan:
        lm, hook_sub = model, None
        if sub is not None:
            S, K = sub
            if S not in refactored:
                refactored[S] = refactor_model(model, prof_ids, S=S, iters=prism_iters)[0]
            lm = refactored[S]
            hook_sub = SubExpertHook(lm, Partition.of(lm), K)
        cfg = deployment_config(model, scale_to, tokens, sub)
        configs.append(cfg)
        hook = ChipHook(model.cfg.layers, tokens, prof if theta else None, theta, hook_sub)
        ppl = lm.perplexity(test_ids, hook)
        trace = routing_trace(hook, test_ids, model.cfg.context, cfg.model.experts, f"<{name}>")
        n_iter = trace.tokens // tokens
        run = run_experiment(
            cfg, (strategy,), n_iter=n_iter, progress=False, trace=trace, workers=1
        )
        s = summarize(run)[strategy]
        traces[name] = trace
        # the bytes the chip must move: every (sub-)expert an iteration's tokens select, once
        active = sum(
            len(np.unique(trace.experts[i * tokens : (i + 1) * tokens, layer]))
            for i in range(n_iter)
            for layer in range(trace.layers)
        )
        rows.append(
            {
                "technique": name,
                "theta": theta,
                "sub_experts": list(sub) if sub else None,
                "perplexity": round(ppl, 3),
                "tokens_per_s": s["throughput_tok_s"],
                "moe_layer_us": s["moe_layer_us"],
                "x_bound": s["x_bound"],
                "ddr_gb": s["ddr_gb"],
                "iterations": n_iter,
                "experts_loaded": active,
                "ddr_lower_bound_gb": round(active * cfg.model.expert_bytes / 1e9, 3),
                **hook.info,
            }
        )
        if progress:
            progress(rows[-1])
    base = rows[0]
    for r in rows:
        r["perplexity_rise"] = round(r["perplexity"] / base["perplexity"] - 1, 4)
        r["speedup"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
        r["ddr_saved"] = round(1 - r["ddr_gb"] / base["ddr_gb"], 4) if base["ddr_gb"] else 0
    return {
        "config": configs[0],
        "rows": rows,
        "tokens": tokens,
        "scale_to": scale_to,
        "traces": traces,
    }


def format_table(doc: dict) -> str:
    out = [
        f"The chip moving fewer bytes: the project's MoE LM routing, {doc['scale_to']} sizes, "
        f"{doc['tokens']} tokens per iteration, 2x2 chip, FSE-DP A3",
        "",
        "| technique | perplexity (rise) | tokens/s (x FSE-DP alone) | MoE layer us | x bound "
        "| DDR GB (saved) | cold experts saved / kept | tokens moved to a buddy |",
        "|---|---|---|---:|---:|---|---|---:|",
    ]
    for r in doc["rows"]:
        out.append(
            f"| {r['technique']} | {r['perplexity']} ({r['perplexity_rise'] * 100:+.2f} %) "
            f"| {r['tokens_per_s']} ({r['speedup']:.3f}x) | {r['moe_layer_us']} "
            f"| {r['x_bound']} | {r['ddr_gb']} ({r['ddr_saved'] * 100:.1f} %) "
            f"| {r['saved']} / {r['kept']} | {r['substituted']} |"
        )
    return "\n".join(out)


def plot_tradeoff(doc: dict, path):
    """Perplexity against the chip's tokens/s, one point per technique (the trade-off plot
    of ``fsedp codesign --out DIR``)."""
    from fsedp.files import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in doc["rows"]:
        color = "k" if r["theta"] == 0 and not r["sub_experts"] else (
            "tab:purple" if r["sub_experts"] and r["theta"] else
            "tab:orange" if r["sub_experts"] else "tab:blue"
        )  # fmt: skip
        ax.scatter(r["tokens_per_s"], r["perplexity"], color=color)
        ax.annotate(r["technique"].lstrip("+ "), (r["tokens_per_s"], r["perplexity"]), fontsize=7)
    base = doc["rows"][0]
    ax.axhline(base["perplexity"] * 1.05, color="grey", lw=0.8, ls="--")
    ax.axvline(base["tokens_per_s"] * 1.3, color="grey", lw=0.8, ls=":")
    ax.set_xlabel(f"tokens/s on the 2x2 chip ({doc['scale_to']} sizes, FSE-DP A3)")
    ax.set_ylabel("held-out perplexity (project LM)")
    ax.set_title(
        "FSE-DP alone (black), buddy (blue), prism (orange), both (purple);\n"
        "dashed: +5 % perplexity, dotted: 1.3x tokens/s",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
