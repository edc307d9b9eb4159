"""Co-design across the papers: the FSE-DP chip moving fewer DDR bytes with the software
papers' techniques, each measured for speed on the simulated chip and for accuracy on the
project's MoE LM (``docs/codesign.md``).

So far: **buddy substitution on the DDR path** (BuddyMoE).  The LM runs the held-out text;
every ``tokens`` consecutive tokens are one iteration of the chip; per iteration and layer,
:func:`fsedp.sw.policies.buddy.substitute_cold` moves the tokens of a cold expert (at most
``theta`` of the iteration's tokens) to buddies the chip streams anyway, all of them or
none.  The routing the LM then uses -- the perplexity is measured with it -- is the routing
the chip simulates (FSE-DP A3), so both numbers come from one set of decisions.  Routing
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

__all__ = ["ChipBuddyHook", "deployment_config", "routing_trace", "buddy_on_chip"]


class ChipBuddyHook(Hooks):
    """Records the LM's routing and, with a profile, substitutes cold experts per iteration
    of ``tokens`` consecutive tokens (the rows of a forward batch, in text order)."""

    def __init__(self, layers: int, tokens: int, prof: BuddyProfile | None, theta: int):
        self.tokens, self.prof, self.theta = tokens, prof, theta
        self.ids = [[] for _ in range(layers)]
        self.weights = [[] for _ in range(layers)]
        self.info = {"cold": 0, "saved": 0, "kept": 0, "substituted": 0, "tae_blocked": 0}

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
        self.ids[layer].append(new)
        self.weights[layer].append(np.asarray(weights))
        return new, weights


def routing_trace(hook: ChipBuddyHook, token_ids, context: int, experts: int, name: str):
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


def deployment_config(model: MoELM, scale_to: str, tokens: int, base: RunConfig | None = None):
    """``base`` (default: the embedded 2x2 run) with the LM's routing shape (experts, top-k,
    layers, no shared expert) and ``scale_to``'s sizes (hidden and expert widths, heads)."""
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
    return dataclasses.replace(base, model=m, scenario=sc)


def buddy_on_chip(
    model: MoELM,
    test_ids: np.ndarray,
    prof_ids: np.ndarray,
    thetas=(1, 2, 4),
    tokens: int = 64,
    scale_to: str = "qwen3-30b-a3b",
    buddy: BuddyConfig | None = None,
    strategy: str = "A3",
    progress=None,
) -> dict:
    """FSE-DP alone and with buddy substitution at each ``theta``: perplexity on
    ``test_ids`` and the chip's throughput, bound and DDR bytes on the same routing."""
    from fsedp.experiments.offload import profile_routing
    from fsedp.sim.run import run_experiment, summarize

    buddy = buddy or BuddyConfig()
    p_ids, p_w, _ = profile_routing(model, prof_ids)
    prof = BuddyProfile(p_ids, p_w, model.cfg.experts, buddy)
    cfg = deployment_config(model, scale_to, tokens)
    ctx = model.cfg.context
    rows, traces = [], {}
    for theta in (0, *thetas):
        hook = ChipBuddyHook(model.cfg.layers, tokens, prof if theta else None, theta)
        ppl = model.perplexity(test_ids, hook)
        trace = routing_trace(hook, test_ids, ctx, model.cfg.experts, f"<lm theta={theta}>")
        n_iter = trace.tokens // tokens
        run = run_experiment(
            cfg, (strategy,), n_iter=n_iter, progress=False, trace=trace, workers=1
        )
        s = summarize(run)[strategy]
        traces[theta] = trace
        # the bytes the chip must move: every expert an iteration's tokens select, once
        active = sum(
            len(np.unique(trace.experts[i * tokens : (i + 1) * tokens, layer]))
            for i in range(n_iter)
            for layer in range(trace.layers)
        )
        rows.append(
            {
                "technique": "FSE-DP alone" if theta == 0 else f"+ buddy (theta {theta})",
                "theta": theta,
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
    return {"config": cfg, "rows": rows, "tokens": tokens, "scale_to": scale_to, "traces": traces}


def format_buddy(doc: dict) -> str:
    out = [
        f"Buddy substitution on the chip's DDR path: the project's MoE LM routing, "
        f"{doc['scale_to']} sizes, {doc['tokens']} tokens per iteration, 2x2 chip, FSE-DP A3",
        "",
        "| technique | perplexity (rise) | tokens/s (x FSE-DP alone) | MoE layer us | x bound "
        "| DDR GB (saved) | cold experts saved / kept | tokens moved |",
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
