"""Co-design across the papers: the FSE-DP chip moving fewer DDR bytes with the software
papers' techniques, each measured for speed on the simulated chip and for accuracy on the
project's MoE LM (``docs/codesign.md``).

The LM runs the held-out text; every ``tokens`` consecutive tokens are one iteration of the
chip (:class:`ChipHook`).  Per iteration and layer, **buddy substitution on the DDR path**
(BuddyMoE, :func:`fsedp.sw.policies.buddy.substitute_cold`) moves the tokens of a cold
expert (at most ``theta`` of the iteration's tokens) to buddies the chip streams anyway,
all of them or none; **MoE-Prism** keeps each token's ``K`` best sub-experts (and, with a
budget ``J``, only the ``J`` sub-experts of an expert that its iteration's tokens score
highest), and the chip streams of each expert only the micro-slices of the sub-experts
some token of the iteration kept (the slice table, [D13]).  The routing the LM then uses --
the perplexity is measured with it -- is the routing the chip simulates (FSE-DP A3), so
both numbers come from one set of decisions.  Routing
and accuracy are the LM's (16 experts, top-2, 4 layers); byte and FLOP sizes come from a
deployment model config (``scale_to``, as ``fsedp offload --scale-to``), with the LM's
expert count, top-k and layers.
"""

import dataclasses

import numpy as np

from fsedp.config import RunConfig, config_path, default_run, load_model
from fsedp.errors import COMMAND_LINE
from fsedp.lm.build import perplexity
from fsedp.lm.model import Hooks, MoELM
from fsedp.sw.policies.buddy import BuddyConfig, BuddyProfile, substitute_cold
from fsedp.trace.core import RoutingTrace

__all__ = [
    "ChipHook",
    "TECHNIQUES",
    "techniques",
    "deployment_config",
    "routing_trace",
    "slice_plan",
    "preload_bound",
    "ahead_plan",
    "preload_run",
    "needed",
    "transition_rank",
    "oracle_rank",
    "codesign",
    "format_table",
    "plot_tradeoff",
]


class ChipHook(Hooks):
    """Applies the chip-side techniques in the LM's forward pass, per iteration of ``tokens``
    consecutive tokens (the rows of a forward batch, in text order), and records the
    routing the chip then streams.

    * with ``prof``: BuddyMoE on the DDR path (:func:`substitute_cold` at ``theta``, at
      most ``cap`` cold experts saved per iteration and layer);
    * with ``sub`` (a :class:`fsedp.sw.policies.prism.SubExpertHook` on a refactored
      model): MoE-Prism, each token computing only its ``K`` best sub-experts of its
      experts (proxy gating); with ``budget`` J, only the ``J`` sub-experts of each
      expert with the highest proxy score summed over the iteration's tokens of that
      expert are streamed, and a token keeps only those.  ``masks[layer]`` records, per
      token and expert slot, the bit mask of the sub-experts it computes: the chip streams
      the union over the iteration (:func:`slice_plan`).
    """

    def __init__(
        self,
        layers: int,
        tokens: int,
        prof=None,
        theta: int = 0,
        sub=None,
        budget: int = 0,
        cap: int | None = None,
    ):
        self.tokens, self.prof, self.theta, self.sub = tokens, prof, theta, sub
        self.budget, self.cap = budget, cap
        self.ids = [[] for _ in range(layers)]
        self.weights = [[] for _ in range(layers)]
        self.masks = [[] for _ in range(layers)]
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
                    self.prof, layer, ids[rows], weights[rows], probs[rows], self.theta, self.cap
                )
                for k in self.info:
                    self.info[k] += info.get(k, 0)
        w = np.asarray(weights)
        self.ids[layer].append(new)
        self.weights[layer].append(w)
        if self.sub is not None:
            self.sub._select(layer, new, w)
            keep, S = self.sub._keep, self.sub.S  # [n, k, S], K per token
            if self.budget:
                score = self.sub._score
                for s in range(0, len(new), self.tokens):
                    rows = slice(s, s + self.tokens)
                    ids_i, keep_i = new[rows], keep[rows]  # views: keep_i edits keep
                    for e in np.unique(ids_i):
                        sel = ids_i == e
                        total = score[rows][sel].sum(axis=0)
                        streamed = np.zeros(S, dtype=bool)
                        streamed[np.argsort(-total, kind="stable")[: self.budget]] = True
                        keep_i[sel] &= streamed
            self.masks[layer].append((keep * (1 << np.arange(S))).sum(axis=2))
        return new, weights

    def neurons(self, layer, expert, rows, act):
        return None if self.sub is None else self.sub._mask(expert, rows, act)


def slice_plan(hook: ChipHook, tokens: int, n_iter: int, M: int) -> dict:
    """Per ``(iteration, layer)``: the micro-slices each expert streams, the union of the
    sub-experts its tokens of the iteration kept (``hook.masks``) times ``M / S`` each
    (sub-expert ``s`` of ``S`` is micro-slices ``s M / S .. (s + 1) M / S - 1``, [D13]);
    0 when its tokens kept none."""
    S = hook.sub.S
    if M % S:
        raise ValueError(f"{S} sub-experts do not divide {M} micro-slices per expert")
    out = {}
    for layer, parts in enumerate(hook.masks):
        ids = np.concatenate(hook.ids[layer])
        masks = np.concatenate(parts)
        for i in range(n_iter):
            rows = slice(i * tokens, (i + 1) * tokens)
            union: dict = {}
            for e, m in zip(ids[rows].ravel().tolist(), masks[rows].ravel().tolist()):
                union[e] = union.get(e, 0) | m
            out[i, layer] = {e: m.bit_count() * (M // S) for e, m in union.items()}
    return out


def needed(trace, tokens: int, i: int, layer: int, M: int, slices: dict | None) -> dict:
    """The micro-slices each expert iteration ``i`` of ``tokens`` uses at ``layer`` must
    stream: its slice-table count, or all ``M``."""
    per = slices[i, layer] if slices else {}
    used = np.unique(trace.experts[i * tokens : (i + 1) * tokens, layer]).tolist()
    return {e: per.get(e, M) for e in used}


def attention_window(setup, tokens: int) -> int:
    """Micro-slice loads the DDR channels could make while an attention block of ``tokens``
    computes (``Setup.attention_ddr_idle_cycles`` on every channel; 0 when DDR-bound)."""
    dp = setup.dp
    return setup.attention_ddr_idle_cycles(tokens) // dp.ddr_interval * dp.ddr_channels


def drain_window(result, dp) -> int:
    """Micro-slice loads the DDR channels could make in a layer's drain (its ``drain`` idle
    channel-cycles in the simulator's breakdown)."""
    return result.idle["ddr"].get("drain", 0) // dp.ddr_interval


def preload_bound(
    run: dict, trace, tokens: int, rank, slices: dict | None = None, strategy: str = "A3"
) -> dict:
    """**An upper bound** on predicted pre-loads across layers, from
    a simulated run on ``trace``: the DDR channels idle in the drain of MoE layer ``l - 1``
    (the simulator's idle breakdown) and, while the attention block before MoE layer ``l``
    (``l >= 1``) computes, for ``Setup.attention_ddr_idle_cycles`` each; in those windows
    the chip could pre-load micro-slices of the experts ``rank(i, l)`` expects (best
    first, whole experts), into free slots only: a chiplet keeps the ``H + 1`` slots a
    Rule 4 pre-load needs free ([D3]), so at most ``C x (K - H - 1)`` micro-slices wait.  A
    pre-loaded micro-slice of an expert the layer really uses (up to its slice-table count)
    is one DDR load the layer no longer makes: at best ``ddr_interval / channels`` cycles
    of a DDR-bound layer; one of an expert it does not use was loaded in vain.  Not a
    simulation of the binding: the bound assumes every useful micro-slice shortens the layer
    and sits where its trajectory starts."""
    setup = run["setup"]
    dp = setup.dp
    n, M, ch = dp.chiplets, dp.micro_slices, dp.ddr_channels
    cap = n * dp.held_room
    attention = attention_window(setup, tokens)
    results = {
        (lay.iteration, lay.layer): r for lay, r in zip(run["layers"], run["results"][strategy])
    }
    n_iter = len({lay.iteration for lay in run["layers"]})
    useful = vain = windows = 0
    for i in range(n_iter):
        for layer in range(1, trace.layers):
            need = needed(trace, tokens, i, layer, M, slices)
            drain = drain_window(results[i, layer - 1], dp)
            windows += attention + drain
            left = min(cap, attention + drain)
            for e in rank(i, layer):
                if left <= 0:
                    break
                take = min(M, left)
                left -= take
                got = min(take, need.get(int(e), 0))
                useful += got
                vain += take - got
    moe = sum(r.cycles for r in run["results"][strategy])
    total = moe + sum(run["attention"])
    saved = useful * dp.ddr_interval / ch
    boundaries = n_iter * (trace.layers - 1)
    return {
        "attention_window_micro_slices": attention,
        "mean_window_micro_slices": round(windows / boundaries, 1) if boundaries else 0,
        "buffer_micro_slices": cap,
        "useful_mb": round(useful * setup.microslice_bytes / 2**20, 1),
        "vain_mb": round(vain * setup.microslice_bytes / 2**20, 1),
        "precision": round(useful / (useful + vain), 3) if useful + vain else None,
        "moe_time_hidden": round(saved / moe, 4) if moe else 0,
        "speedup_at_most": round(total / (total - saved), 4) if total > saved else None,
    }


def ahead_plan(rank, window: int, dp, need: dict, room: int | None = None) -> tuple[list, int]:
    """What the chip pre-loads for a layer in a window of ``window`` micro-slice loads:
    the experts ``rank`` expects, best first, each from micro-slice 0 on, striped round-robin
    over the chiplets with room (``room`` each, at most and by default
    ``DatapathParams.held_room``), until the window or the room runs out.
    ``need`` (expert -> micro-slices the layer streams of it) decides which are useful: the
    rest were loaded in vain and are flushed when the layer's gate writes its tables.
    Returns ``(ahead, vain)``: the useful ones as ``(chiplet, expert, index)``, and how
    many were loaded in vain."""
    n = dp.chiplets
    left = [dp.held_room if room is None else min(room, dp.held_room)] * n
    budget = min(window, sum(left))
    ahead, vain, c = [], 0, 0
    for e in rank:
        e = int(e)
        for i in range(dp.micro_slices):
            if budget <= 0:
                return ahead, vain
            while not left[c]:
                c = (c + 1) % n
            left[c] -= 1
            budget -= 1
            if i < need.get(e, 0):
                ahead.append((c, e, i))
            else:
                vain += 1
            c = (c + 1) % n
    return ahead, vain


def preload_run(
    run: dict,
    trace,
    tokens: int,
    rank,
    slices: dict | None = None,
    strategy: str = "A3",
    room: int | None = None,
) -> dict:
    """**Predicted pre-loads across layers, simulated**: the run's
    layers again, in order, each MoE layer ``l >= 1`` starting with the micro-slices the
    chip pre-loaded while layer ``l - 1`` drained and attention ran (:func:`ahead_plan`),
    held until their expert's first beat binds them to its trajectory
    (``ddr.bind_ahead``, on both streaming engines).  The window is the DDR's idle time in
    the drain of layer ``l - 1`` *as simulated here* plus its idle time in attention
    (``Setup.attention_ddr_idle_cycles``).  Returns the measured gain beside the run's:
    tokens/s, MoE time, and the pre-loaded bytes that were useful and in vain."""
    from fsedp.sim.fsedp import fsedp_layer
    from fsedp.sim.run import summarize

    setup = run["setup"]
    dp = setup.dp
    M = dp.micro_slices
    attention = attention_window(setup, tokens)
    base = run["results"][strategy]
    out, useful, vain, prev = [], 0, 0, None
    for lay, r in zip(run["layers"], base):
        if lay.layer == 0:
            out.append(r)  # nothing is predicted for a first layer
        else:
            per = (slices or {}).get((lay.iteration, lay.layer))
            need = needed(trace, tokens, lay.iteration, lay.layer, M, slices)
            window = attention + drain_window(prev, dp)
            ahead, v = ahead_plan(rank(lay.iteration, lay.layer), window, dp, need, room)
            useful, vain = useful + len(ahead), vain + v
            out.append(fsedp_layer(setup, lay.records, strategy, slices=per, ahead=ahead))
        prev = out[-1]
    before = summarize(run)[strategy]
    after = summarize({**run, "results": {strategy: out}})[strategy]
    mb = setup.microslice_bytes / 2**20
    return {
        "useful_mb": round(useful * mb, 1),
        "vain_mb": round(vain * mb, 1),
        "precision": round(useful / (useful + vain), 3) if useful + vain else None,
        "tokens_per_s": after["throughput_tok_s"],
        "speedup": round(after["throughput_tok_s"] / before["throughput_tok_s"], 4),
        "moe_layer_us": after["moe_layer_us"],
        "moe_time_saved": round(1 - after["moe_layer_us"] / before["moe_layer_us"], 4),
        "x_bound": after["x_bound"],
        "ddr_gb": round(after["ddr_gb"] + (useful + vain) * setup.microslice_bytes / 1e9, 3),
        "below_bound": sum(x.cycles < x.bound for x in out),
    }


def transition_rank(pred, trace, tokens: int, experts: int):
    """The inter-layer predictor of the offload model (``pred``, a ``TransitionPrefetcher``
    of :func:`fsedp.experiments.offload.prefetcher`): layer ``l``'s experts ranked by the
    profile's transition counts from the iteration's experts at layer ``l - 1``
    (popularity as tie-break)."""

    def rank(i, layer):
        prev = trace.experts[i * tokens : (i + 1) * tokens, layer - 1]
        return pred.predict(layer, prev, tokens, experts)

    return rank


def oracle_rank(trace, tokens: int):
    """The experts layer ``l`` really uses, most tokens first (the best any predictor can
    do)."""

    def rank(i, layer):
        ids = trace.experts[i * tokens : (i + 1) * tokens, layer].ravel()
        counts = np.bincount(ids, minlength=trace.num_experts)
        return [int(e) for e in np.argsort(-counts, kind="stable") if counts[e]]

    return rank


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
    sc = dataclasses.replace(
        base.scenario, tokens_per_iteration=tokens, trace="model", skew=None, prefill_fraction=None
    )
    return dataclasses.replace(base, model=m, scenario=sc)


def techniques(thetas=(1, 2), ks=(6,), budgets=(3, 2), S: int = 4, cap=None) -> list:
    """``(name, buddy theta, (S, K, J) or None)`` of ``fsedp codesign``: FSE-DP alone,
    buddy substitution at each theta, MoE-Prism keeping ``K`` sub-experts per token (of
    ``top_k x S``), MoE-Prism streaming a budget of ``J`` sub-experts per expert and
    iteration (``K = None``: a token keeps all that are streamed), and each Prism setting
    combined with the theta at the same position (or the last).  ``cap``: the names say
    the iteration-level cap :func:`codesign` is given."""
    out = [("FSE-DP alone", 0, None)]
    c = "" if cap is None else f", cap {cap}"
    out += [(f"+ buddy (theta {t}{c})", t, None) for t in thetas]
    prism = [(f"prism (K {k})", (S, k, 0)) for k in ks]
    prism += [(f"prism (budget {j} of {S})", (S, None, j)) for j in budgets]
    out += [(f"+ {name}", 0, p) for name, p in prism]
    for i, (name, p) in enumerate(prism):
        if thetas:
            t = thetas[min(i, len(thetas) - 1)]
            out.append((f"+ buddy (theta {t}{c}) + {name}", t, p))
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
    cache: dict | None = None,
    selector: str = "proxy",
    cap: int | None = None,
) -> dict:
    """Each technique of ``plan`` (``(name, theta, (S, K, J) or None)``, see
    :func:`techniques`): perplexity on ``test_ids`` with the routing it makes, and the
    chip's throughput, bound and DDR bytes on that routing.  The first must be FSE-DP alone
    (theta 0, no sub-experts): the others are relative to it.  MoE-Prism runs on the LM
    refactored into ``S`` sub-experts (annealed partition, ``prism_iters`` steps), which
    computes what the LM computes when every sub-expert is kept; the chip streams the
    sub-experts kept through its slice table (:func:`slice_plan`).  ``cache`` (a dict kept
    between calls) reuses the LM's side -- profile, refactored models, perplexities and
    routings, which do not depend on ``scale_to`` -- when only the deployment sizes
    change.  ``selector``: how a token ranks its sub-experts, ``"proxy"`` (MoE-Prism's
    training-free gate neurons) or ``"oracle"`` (the true activation norms: the best any
    trained router could rank them, a bound).  ``cap``: buddy substitution saves at most
    that many cold experts per iteration and layer (:func:`substitute_cold`)."""
    from fsedp.experiments.offload import prefetcher, profile_routing
    from fsedp.experiments.prism import refactor_model
    from fsedp.sim.run import run_experiment, summarize
    from fsedp.sw.policies.prism import Partition, SubExpertHook

    if plan[0][1:] != (0, None):
        raise ValueError("the first technique must be FSE-DP alone (theta 0, no sub-experts)")
    cache = {} if cache is None else cache
    buddy = buddy or BuddyConfig()
    if "profile" not in cache:
        p_ids, p_w, _ = profile_routing(model, prof_ids)
        cache["profile"] = BuddyProfile(p_ids, p_w, model.cfg.experts, buddy)
        cache["transition"] = prefetcher("transition", p_ids, model.cfg.experts)[0]
    prof = cache["profile"]
    cfg = deployment_config(model, scale_to, tokens)
    M = cfg.datapath_params().micro_slices
    slot_bytes = cfg.model.expert_bytes // M
    rows, traces, plans = [], {}, {}
    for name, theta, sub in plan:
        if sub is not None and M % sub[0]:
            raise ValueError(f"{sub[0]} sub-experts do not divide the chip's {M} micro-slices")
        key = (name, theta, sub, tokens, selector, cap if theta else None)
        if key not in cache:
            lm, hook_sub, budget = model, None, 0
            if sub is not None:
                S, K, budget = sub
                if ("refactored", S) not in cache:
                    cache["refactored", S] = refactor_model(
                        model, prof_ids, S=S, iters=prism_iters
                    )[0]
                lm = cache["refactored", S]
                hook_sub = SubExpertHook(lm, Partition.of(lm), K or model.cfg.top_k * S, selector)
            hook = ChipHook(
                model.cfg.layers, tokens, prof if theta else None, theta, hook_sub, budget, cap
            )
            ppl = perplexity(lm, test_ids, hook)
            trace = routing_trace(hook, test_ids, model.cfg.context, model.cfg.experts, f"<{name}>")
            cache[key] = (ppl, trace, hook, hook.info)
        ppl, trace, hook, info = cache[key]
        n_iter = trace.tokens // tokens
        slices = slice_plan(hook, tokens, n_iter, M) if sub is not None else None
        run = run_experiment(
            cfg, (strategy,), n_iter=n_iter, progress=False, trace=trace, workers=1,
            slices=slices,
        )  # fmt: skip
        s = summarize(run)[strategy]
        traces[name], plans[name] = trace, slices
        transition = transition_rank(cache["transition"], trace, tokens, model.cfg.experts)
        # the bytes the chip must move: every micro-slice an iteration's tokens select, once
        moved = sum(
            sum(needed(trace, tokens, i, layer, M, slices).values())
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
                "micro_slices_loaded": moved,
                "ddr_lower_bound_gb": round(moved * slot_bytes / 1e9, 3),
                **info,
                "preload": preload_bound(run, trace, tokens, transition, slices, strategy),
                "preload_oracle": preload_bound(
                    run, trace, tokens, oracle_rank(trace, tokens), slices, strategy
                ),
                "preload_sim": preload_run(run, trace, tokens, transition, slices, strategy),
                "preload_sim_oracle": preload_run(
                    run, trace, tokens, oracle_rank(trace, tokens), slices, strategy
                ),
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
        "config": cfg,
        "selector": selector,
        "buddy_cap": cap,
        "rows": rows,
        "tokens": tokens,
        "scale_to": scale_to,
        "traces": traces,
        "slices": plans,
    }


def format_table(doc: dict) -> str:
    out = [
        f"The chip moving fewer bytes: the project's MoE LM routing, {doc['scale_to']} sizes, "
        f"{doc['tokens']} tokens per iteration, 2x2 chip, FSE-DP A3"
        + (", sub-experts ranked by the oracle" if doc.get("selector") == "oracle" else ""),
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
    first = doc["rows"][0]["preload"]
    out += [
        "",
        "Predicted pre-loads across layers (`preload_run`, simulated): while MoE layer l - 1 "
        "drains and attention runs, the idle DDR loads micro-slices of the experts the "
        "transition predictor expects in layer l into free slots; they wait held and bind to "
        "their trajectory at dispatch.  Between two layers the DDR idles for "
        f"{first['mean_window_micro_slices']} micro-slice loads on average "
        f"({first['attention_window_micro_slices']} of them during attention); the buffers "
        f"hold {first['buffer_micro_slices']} beside the room Rule 4 pre-loads keep",
        "",
        "| technique | pre-loaded useful / vain MiB (precision) | tokens/s with pre-loads (gain) "
        "| x bound | oracle predictor: gain | upper bound (`preload_bound`): gain at most |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        p, o, b = r["preload_sim"], r["preload_sim_oracle"], r["preload"]
        out.append(
            f"| {r['technique']} | {p['useful_mb']} / {p['vain_mb']} ({p['precision']}) "
            f"| {p['tokens_per_s']} ({(p['speedup'] - 1) * 100:+.2f} %) | {p['x_bound']} "
            f"| {(o['speedup'] - 1) * 100:+.2f} % | {(b['speedup_at_most'] - 1) * 100:+.2f} % |"
        )
    return "\n".join(out)


def plot_tradeoff(docs: list, path):
    """Perplexity against the chip's tokens/s, one point per technique, one panel per
    deployment size and tokens per iteration (the trade-off plot of ``fsedp codesign
    --out DIR``), with the issue's target lines (+5 % perplexity, 1.3x tokens/s)."""
    from fsedp.files import pyplot

    plt = pyplot()
    cols = min(2, len(docs))
    rows = -(-len(docs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.6 * rows), squeeze=False)
    for ax in axes.ravel()[len(docs) :]:
        ax.set_visible(False)
    for ax, doc in zip(axes.ravel(), docs):
        for r in doc["rows"]:
            color = "k" if r["theta"] == 0 and not r["sub_experts"] else (
                "tab:purple" if r["sub_experts"] and r["theta"] else
                "tab:orange" if r["sub_experts"] else "tab:blue"
            )  # fmt: skip
            ax.scatter(r["tokens_per_s"], r["perplexity"], color=color)
            ax.annotate(
                r["technique"].lstrip("+ "), (r["tokens_per_s"], r["perplexity"]), fontsize=7
            )
        base = doc["rows"][0]
        ax.axhline(base["perplexity"] * 1.05, color="grey", lw=0.8, ls="--")
        ax.axvline(base["tokens_per_s"] * 1.3, color="grey", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("tokens/s, 2x2 chip, FSE-DP A3")
        ax.set_ylabel("held-out perplexity (project LM)")
        ax.set_title(f"{doc['scale_to']} sizes, {doc['tokens']} tokens per iteration", fontsize=9)
    fig.suptitle(
        "FSE-DP alone (black), buddy (blue), prism (orange), both (purple); "
        "dashed: +5 % perplexity, dotted: 1.3x tokens/s",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
