"""``fsedp offload``: an offload policy run on the project's MoE LM over held-out WikiText-2
(perplexity and modelled tokens per second), or on a routing trace alone (hit rate, bytes).

Policies: ``demand`` (the original: fetch every miss), ``drop``, ``random`` (substitute a
uniformly drawn resident expert), ``buddy`` (BuddyMoE, :mod:`fsedp.sw.policies.buddy`), ``prism``
(MoE-Prism sub-experts in an LRU cache: the ``active`` of ``sub_experts`` sub-experts of
every chosen expert with the largest activation norm for the token are fetched and run).
Steps are micro-batches of ``batch`` consecutive tokens.  The cost model takes its sizes from
a model config (``scale_to``, default DeepSeek-V2-Lite as in BuddyMoE's evaluation): the
routing and accuracy are the project's LM's, the bytes and FLOPs per expert are those of the
model a deployment would run (``docs/offload.md``).
"""

from dataclasses import dataclass, field

import numpy as np

from fsedp.config import ModelConfig, config_path, load_section
from fsedp.errors import COMMAND_LINE, InputError
from fsedp.lm.build import perplexity
from fsedp.lm.model import Hooks, MoELM, Routing
from fsedp.log import logger
from fsedp.sw.policies.buddy import BuddyConfig, BuddyProfile, random_substitute, substitute
from fsedp.sw.policies.device import DEFAULT_DEVICE, DeviceProfile, load_device
from fsedp.sw.policies.offload import (
    Cost,
    FrequencyPrefetcher,
    Link,
    OffloadRuntime,
    OraclePrefetcher,
    Prefetcher,
    TransitionPrefetcher,
    links,
    popularity_order,
)
from fsedp.trace import pair_counts

__all__ = [
    "OffloadConfig",
    "POLICIES",
    "PREFETCHERS",
    "profile_routing",
    "run_lm",
    "run_trace",
    "deployment_cost",
    "device_of",
    "link_of",
]

POLICIES = ("demand", "drop", "random", "buddy", "prism")
PREFETCHERS = ("none", "transition", "frequency", "oracle")


@dataclass(frozen=True)
class OffloadConfig:
    policy: str = "demand"
    cache_rate: float = 0.5
    prefetch: str = "transition"
    prefetch_count: int | None = None  # units prefetched per layer (default: capacity / 4)
    device: str = DEFAULT_DEVICE  # a device profile: a name under configs/devices or a file
    link: str | None = None  # a named link instead of the device's (links())
    bandwidth_gbs: float | None = None  # override the link's
    latency_us: float | None = None
    scale_to: str = "deepseek-v2-lite"
    flops: float | None = None  # override the device's expert rate (FLOP/s)
    overhead_us: float | None = None  # override the device's per-expert launch
    batch: int = 16
    seed: int = 0
    sub_experts: int = 4  # MoE-Prism: sub-experts per expert
    active: int = 4  # MoE-Prism: sub-experts run per chosen expert
    buddy: BuddyConfig = field(default_factory=BuddyConfig)

    def __post_init__(self):
        def bad(name, why):
            raise InputError("<command line>", f"--{name.replace('_', '-')}", why)

        if self.policy not in POLICIES:
            bad("policy", f"must be one of {', '.join(POLICIES)}, not {self.policy!r}")
        if self.prefetch not in PREFETCHERS:
            bad("prefetch", f"must be one of {', '.join(PREFETCHERS)}, not {self.prefetch!r}")
        if not 0 <= self.cache_rate <= 1:
            bad("cache_rate", f"must be in [0, 1], not {self.cache_rate}")
        if self.link is not None and self.link not in links():
            bad("link", f"must be one of {', '.join(links())}, not {self.link!r}")
        if self.batch < 1:
            bad("batch", f"must be >= 1, not {self.batch}")
        if self.sub_experts < 1 or not 1 <= self.active <= self.sub_experts:
            bad("active", f"must be in 1..sub_experts = {self.sub_experts}, not {self.active}")
        for name in ("bandwidth_gbs", "latency_us", "flops"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                bad(name, f"must be > 0, not {v}")
        if self.overhead_us is not None and self.overhead_us < 0:
            bad("overhead_us", f"must be >= 0, not {self.overhead_us}")


def device_of(cfg: OffloadConfig) -> DeviceProfile:
    """The device profile of ``cfg`` (``cfg.device``, loaded and checked)."""
    return load_device(cfg.device)


def expert_sizes(scale_to: str) -> tuple[int, int]:
    """``(d_model, d_ffn)`` of the model config ``scale_to``."""
    m = load_section(ModelConfig, config_path("models", scale_to, COMMAND_LINE, "--scale-to"))
    return m.d_model, m.d_ffn


def deployment_cost(
    cfg: OffloadConfig, units_per_expert: int = 1, sizes=None, weight_bytes: int = 2
) -> Cost:
    """The cost model of ``cfg``: the sizes of ``cfg.scale_to`` (or ``sizes``, ``(d_model,
    d_ffn)``) on ``cfg.device``, ``weight_bytes`` per weight (bf16, as offloaded);
    ``--tflops`` or ``--overhead-us`` replace the device's rate or launch (and then its
    table, which holds both)."""
    import dataclasses

    d, f = sizes or expert_sizes(cfg.scale_to)
    expert_bytes = 3 * d * f * weight_bytes
    cost = Cost.of(
        device_of(cfg),
        unit_bytes=expert_bytes / units_per_expert,
        unit_flops=2 * 3 * d * f / units_per_expert,
        dense_flops=2 * 4 * d * d,
    )
    if cfg.flops is not None or cfg.overhead_us is not None:
        cost = dataclasses.replace(
            cost,
            flops=cfg.flops if cfg.flops is not None else cost.flops,
            overhead_s=cfg.overhead_us * 1e-6 if cfg.overhead_us is not None else cost.overhead_s,
            table=None,
        )
    return cost


def link_of(cfg: OffloadConfig):
    """The link of ``cfg``: the device's, or the named ``cfg.link``, with the bandwidth and
    latency overrides."""
    base = links()[cfg.link] if cfg.link is not None else device_of(cfg).link()
    return Link(
        base.name,
        cfg.bandwidth_gbs or base.bandwidth_gbs,
        cfg.latency_us if cfg.latency_us is not None else base.latency_us,
    )


def profile_routing(model: MoELM, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Routing of the model on profiling tokens: ``ids [N, L, k]``, renormalised weights and
    the full router probabilities ``[N, L, E]``."""
    n = model.cfg.context
    rows = ids[: (len(ids) // n) * n].reshape(-1, n)
    rec = Routing()
    for s in range(0, len(rows), 16):
        r = Routing()
        model.forward(rows[s : s + 16], routing=r)
        rec.ids.append(np.stack(r.ids, 1))
        rec.weights.append(np.stack(r.weights, 1))
        rec.probs.append(np.stack(r.probs, 1))
    return np.concatenate(rec.ids), np.concatenate(rec.weights), np.concatenate(rec.probs)


def prefetcher(name: str, prof_units: np.ndarray, units: int):
    """The prefetcher ``name`` fitted on the profile's units ``[N, L, k]``, and each layer's
    units by popularity."""
    layers = prof_units.shape[1]
    orders = [popularity_order(prof_units[:, l], units) for l in range(layers)]
    if name == "frequency":
        return FrequencyPrefetcher(orders), orders
    if name == "oracle":
        return OraclePrefetcher(), orders
    if name == "transition":
        trans = [None] + [
            pair_counts(prof_units[:, l - 1], prof_units[:, l], units) for l in range(1, layers)
        ]
        return TransitionPrefetcher(trans, orders), orders
    return Prefetcher(), orders


class OffloadHook(Hooks):
    """Applies the miss policy per step in the forward pass and feeds the runtime."""

    def __init__(
        self,
        model: MoELM,
        cfg: OffloadConfig,
        runtime: OffloadRuntime,
        profile: BuddyProfile | None,
    ):
        self.m, self.cfg, self.rt, self.prof = model, cfg, runtime, profile
        self.rng = np.random.default_rng(cfg.seed)
        self.base = 0
        self.n = 0
        self.sub = cfg.sub_experts if cfg.policy == "prism" else 1
        self.gates = {
            "tae_blocked": 0,
            "margin_blocked": 0,
            "residency_bypass": 0,
            "substituted": 0,
            "no_buddy": 0,
            "missing": 0,
        }
        self._used = None

    def steps(self, n):
        b = self.cfg.batch
        return [(i // b, slice(i, min(n, i + b))) for i in range(0, n, b)]

    def route(self, layer, probs, ids, weights, tokens):
        if layer == 0:
            self.base += -(-self.n // self.cfg.batch) if self.n else 0
            self.n = len(ids)
        ids, weights = ids.copy(), weights.copy()
        pol = self.cfg.policy
        for _, rows in self.steps(len(ids)):
            if pol in ("demand", "prism"):
                continue
            res = self.rt.resident(layer)
            if pol == "drop":
                miss = ~res[ids[rows]]
                w = weights[rows]
                w[miss] = 0
                weights[rows] = w
                self.rt.stats.dropped += int(miss.sum())
            elif pol == "random":
                new, c = random_substitute(ids[rows], res, self.rng, self.cfg.buddy.rho)
                ids[rows] = new
                self.rt.stats.substituted += c
            elif pol == "buddy":
                new, info = substitute(
                    self.prof,
                    layer,
                    ids[rows],
                    weights[rows],
                    probs[rows],
                    res,
                    unit_bytes=self.rt.cost.unit_bytes,
                )
                ids[rows] = new
                for k in self.gates:
                    self.gates[k] += info.get(k, 0)
                self.rt.stats.substituted += info["substituted"]
        self._used = np.zeros((len(ids), self.rt.units), dtype=bool)
        return ids, weights

    def neurons(self, layer, expert, rows, act):
        if self.sub == 1:
            self._used[rows, expert] = True
            return None
        f = act.shape[1]
        groups = np.arange(f) * self.sub // f  # contiguous split
        norms = np.zeros((len(rows), self.sub))
        np.add.at(norms.T, groups, np.abs(act).T)
        keep = np.argsort(-norms, axis=1, kind="stable")[:, : self.cfg.active]
        mask = np.zeros((len(rows), self.sub), dtype=bool)
        np.put_along_axis(mask, keep, True, axis=1)
        self._used[rows[:, None], expert * self.sub + keep] = True
        return mask[:, groups]

    def after_layer(self, layer):
        for s, rows in self.steps(self.n):
            counts = self._used[rows].sum(0)
            units = np.nonzero(counts)[0]
            self.rt.layer_step(self.base + s, layer, units, counts[units], rows.stop - rows.start)


def run_lm(model: MoELM, test_ids: np.ndarray, prof_ids: np.ndarray, cfg: OffloadConfig) -> dict:
    """Perplexity and the offload runtime's figures of one policy on ``test_ids``."""
    E, sub = model.cfg.experts, (cfg.sub_experts if cfg.policy == "prism" else 1)
    p_ids, p_w, _ = profile_routing(model, prof_ids)
    units = E * sub
    capacity = int(round(cfg.cache_rate * units))
    if sub > 1:
        p_units = (p_ids[..., None] * sub + np.arange(sub)).reshape(len(p_ids), p_ids.shape[1], -1)
    else:
        p_units = p_ids
    pf, orders = prefetcher(cfg.prefetch, p_units, units)
    rt = OffloadRuntime(
        model.cfg.layers,
        units,
        capacity,
        link_of(cfg),
        deployment_cost(cfg, sub),
        pf,
        initial=orders,
        prefetch_count=cfg.prefetch_count,
    )
    prof = BuddyProfile(p_ids, p_w, E, cfg.buddy) if cfg.policy == "buddy" else None
    hook = OffloadHook(model, cfg, rt, prof)
    ppl = perplexity(model, test_ids, hook)
    stats = rt.timing().as_dict()
    out = {
        "policy": cfg.policy,
        "cache_rate": cfg.cache_rate,
        "perplexity": round(ppl, 3),
        **{k: v for k, v in stats.items() if k != "per_layer"},
        "per_layer": stats["per_layer"],
    }
    if prof is not None:
        out["gates"] = hook.gates
        out["buddy_list_size"] = [round(x, 2) for x in prof.list_sizes()]
        out["tau"] = [round(t, 4) for t in prof.tau]
    return out


def run_trace(trace, cfg: OffloadConfig, fit: float = 0.2) -> dict:
    """Routing-only figures (hit rate, prefetch accuracy, bytes, modelled time) of fetch on
    demand over a trace: the first ``fit`` share profiles the cache and prefetchers."""
    rt = trace_runtime(trace, cfg, fit)
    return {
        "trace": trace.name,
        "cache_rate": cfg.cache_rate,
        "prefetch": cfg.prefetch,
        **rt.timing().as_dict(),
    }


def trace_runtime(
    trace, cfg: OffloadConfig, fit: float = 0.2, cost: Cost | None = None, steps=None
) -> OffloadRuntime:
    """The offload runtime of :func:`run_trace` after its run (``cost``: another cost
    model, e.g. other sizes; ``steps``: only the first that many steps)."""
    e = trace.experts.astype(np.int64)
    n_fit = max(1, int(len(e) * fit))
    if n_fit >= len(e):  # figures over no token would read as a 0 hit rate
        raise InputError(
            trace.name,
            "experts",
            f"{len(e)} token: the cache and prefetchers are fitted on the first "
            f"{fit * 100:g} % of the tokens (at least one) and measured on the rest, so a trace "
            "needs at least 2 tokens",
        )
    units = trace.num_experts
    capacity = int(round(cfg.cache_rate * units))
    pf, orders = prefetcher(cfg.prefetch, e[:n_fit], units)
    rt = OffloadRuntime(
        trace.layers,
        units,
        capacity,
        link_of(cfg),
        cost or deployment_cost(cfg),
        pf,
        initial=orders,
        prefetch_count=cfg.prefetch_count,
    )
    test = e[n_fit:]
    if steps is not None:
        test = test[: steps * cfg.batch]
    for s, start in enumerate(range(0, len(test), cfg.batch)):
        chunk = test[start : start + cfg.batch]
        for l in range(trace.layers):
            u, c = np.unique(chunk[:, l], return_counts=True)
            rt.layer_step(s, l, u, c, len(chunk))
    return rt


# -- the paper-shaped tables -------------------------------------------------------------
#: BuddyMoE settings of Tables 2-4 (the paper's "tau" column is the CFT coverage alpha),
#: adapted to top-2: rho = 1 is the budget below k
BUDDY_SETTINGS = (
    ("BuddyMoE", dict(alpha=0.75, k_max=4)),
    ("BuddyMoE", dict(alpha=0.95, k_max=15)),
    ("BuddyMoE", dict(alpha=0.95, k_max=15, rho=1)),
    ("BuddyMoE", dict(alpha=0.99, k_max=2, rho=1)),
    ("BuddyMoE", dict(alpha=0.95, k_max=15, rho=1, eta=1.0)),
    ("BuddyMoE", dict(alpha=0.95, k_max=15, rho=1, tau_pct=50.0)),
    # control: the gates and budget of the row above, a random resident expert instead of a buddy
    (
        "Random + BuddyMoE gates",
        dict(alpha=0.95, k_max=15, rho=1, tau_pct=50.0, random_choice=True),
    ),
)
CACHE_RATES = (0.375, 0.5, 0.75)


def lm_data(
    max_tokens: int | None,
    profile_tokens: int = 16384,
    weights=None,
    data=None,
    model: MoELM | None = None,
    evaluate: bool = True,
):
    """The committed model (or ``model``, loaded and checked by the caller with the options
    that depend on it), held-out WikiText-2 test tokens and profiling tokens (the start of
    WikiText-2 validation, the calibration set) from the ``data`` folder; without one, the
    held-out tokens of the embedded trace (first half profiles, second half evaluates).

    Refused on one line: profiling tokens holding no window of the model's context, test
    tokens (with ``evaluate``) holding no window to predict, and ids beyond the model's
    vocabulary -- each naming the file the tokens came from."""
    from fsedp.lm.build import _need_data, _need_tokens
    from fsedp.lm.text import TEST_FILE, TRAIN_FILES, data_dir, encode_file, load_tokenizer

    if model is None:
        model = MoELM.load(weights)  # a bad weights file is reported before anything
    root = data_dir(data)
    if root is None or not (root / TEST_FILE).exists() or not (root / TRAIN_FILES[0]).exists():
        # no corpora (a user's fresh clone): the embedded trace's held-out tokens,
        # its first half to profile, the second to evaluate
        from fsedp.config import EMBEDDED_TRACE
        from fsedp.trace.io import load_trace

        ids = load_trace(EMBEDDED_TRACE).token_ids.astype(np.int64)
        half = len(ids) // 2
        where = f"{root / TEST_FILE} not found" if root is not None else "no --data folder"
        logger("offload").warning(
            f"{where}: using the {len(ids)} held-out WikiText-2 "
            "test tokens of the embedded trace (half to profile, half to evaluate)"
        )
        test = ids[half:]
        if max_tokens:
            test = test[: max_tokens + 1]
        test_file = prof_file = EMBEDDED_TRACE
        prof = ids[: min(half, profile_tokens)]
    else:
        tok = load_tokenizer()
        test_file = _need_data(root, TEST_FILE)
        test = encode_file(tok, test_file)
        if max_tokens:
            test = test[: max_tokens + 1]
        prof_file = _need_data(root, TRAIN_FILES[0])
        prof = encode_file(tok, prof_file)[:profile_tokens]
    if evaluate:
        _need_tokens(test, model, test_file)
    if len(prof) < model.cfg.context:
        raise InputError(
            prof_file,
            "<file>",
            f"{len(prof)} profiling tokens: fewer than one window of the LM's context of "
            f"{model.cfg.context} tokens, so nothing would be profiled",
        )
    top = max(int(test.max(initial=0)), int(prof.max(initial=0)))
    if top >= model.cfg.vocab:
        raise InputError(
            model.name,
            "embed",
            f"a vocabulary of {model.cfg.vocab} entries: the tokens (the committed tokenizer's) "
            f"reach id {top}",
        )
    return model, test, prof


def buddy_grid(model, test, prof, base: OffloadConfig, rates=CACHE_RATES, progress=None) -> list:
    import dataclasses

    rows = []
    for c in rates:
        runs = [
            ("Original (on demand)", dataclasses.replace(base, policy="demand", cache_rate=c), {}),
            ("Random", dataclasses.replace(base, policy="random", cache_rate=c), {}),
        ]
        for name, kw in BUDDY_SETTINGS:
            runs.append(
                (
                    name,
                    dataclasses.replace(
                        base,
                        policy="buddy",
                        cache_rate=c,
                        buddy=dataclasses.replace(base.buddy, **kw),
                    ),
                    kw,
                )
            )
        for name, cfg, kw in runs:
            r = run_lm(model, test, prof, cfg)
            rows.append(
                {
                    "method": name,
                    "cache_rate": c,
                    "alpha": kw.get("alpha"),
                    "k_max": kw.get("k_max"),
                    "rho": kw.get("rho"),
                    "eta": kw.get("eta"),
                    "tau_pct": kw.get("tau_pct", base.buddy.tau_pct) if kw else None,
                    **{
                        k: r[k]
                        for k in (
                            "perplexity",
                            "tokens_per_s",
                            "hit_rate",
                            "demand_fetches",
                            "substituted",
                            "bytes_moved_mb",
                        )
                    },
                }
            )
            if progress:
                progress(rows[-1])
    return rows


def prism_grid(model, test, prof, base: OffloadConfig, rates=CACHE_RATES, progress=None) -> list:
    import dataclasses

    rows = []
    for c in rates:
        runs = [("monolithic", dataclasses.replace(base, policy="demand", cache_rate=c), None)]
        for active in range(base.sub_experts, 0, -1):
            runs.append(
                (
                    f"sub-experts {active}/{base.sub_experts}",
                    dataclasses.replace(base, policy="prism", cache_rate=c, active=active),
                    active,
                )
            )
        for name, cfg, active in runs:
            r = run_lm(model, test, prof, cfg)
            ms = 1000.0 / r["tokens_per_s"] * cfg.batch if r["tokens_per_s"] else None
            rows.append(
                {
                    "method": name,
                    "cache_rate": c,
                    "active": active,
                    "perplexity": r["perplexity"],
                    "step_ms": round(ms, 3) if ms else None,
                    "tokens_per_s": r["tokens_per_s"],
                    "hit_rate": r["hit_rate"],
                    "bytes_moved_mb": r["bytes_moved_mb"],
                }
            )
            if progress:
                progress(rows[-1])
    return rows


def format_buddy(rows) -> str:
    out = []
    for c in sorted({r["cache_rate"] for r in rows}):
        out += [
            f"\n**Cache rate c = {c}**\n",
            "| method | alpha (CFT) | K_max | rho | eta | TAE pct | perplexity | tokens/s | hit "
            "rate | on-demand fetches | substituted |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            if r["cache_rate"] != c:
                continue
            f = lambda v: "-" if v is None else v
            out.append(
                f"| {r['method']} | {f(r['alpha'])} | {f(r['k_max'])} | {f(r['rho'])} | "
                f"{f(r['eta'])} | {f(r['tau_pct'])} | {r['perplexity']} | {r['tokens_per_s']} | "
                f"{r['hit_rate']} | "
                f"{r['demand_fetches']} | {r['substituted']} |"
            )
    return "\n".join(out)


def format_prism(rows) -> str:
    out = [
        "| cache rate | experts | perplexity | step latency (ms, 16 tokens) | tokens/s | hit rate "
        "| MB moved |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['cache_rate']} | {r['method']} | {r['perplexity']} | {r['step_ms']} | "
            f"{r['tokens_per_s']} | {r['hit_rate']} | {r['bytes_moved_mb']} |"
        )
    return "\n".join(out)


def plot_tradeoff(buddy_rows, prism_rows, path):
    """Perplexity against modelled throughput, one point per setting."""
    from fsedp.files import pyplot

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    marks = {0.375: "o", 0.5: "s", 0.75: "^"}
    colors = {
        "Original (on demand)": "k",
        "Random": "tab:red",
        "BuddyMoE": "tab:blue",
        "Random + BuddyMoE gates": "tab:orange",
    }
    for r in buddy_rows:
        axes[0].scatter(
            r["tokens_per_s"],
            r["perplexity"],
            marker=marks.get(r["cache_rate"], "o"),
            color=colors.get(r["method"], "tab:green"),
            alpha=0.8,
        )
    axes[0].set_yscale("log")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("modelled tokens/s")
    axes[0].set_ylabel("WikiText-2 test perplexity")
    axes[0].set_title(
        "BuddyMoE (blue), random (red), random with its gates (orange),\non demand (black); o "
        "0.375, square 0.5, triangle 0.75",
        fontsize=9,
    )
    for r in prism_rows:
        axes[1].scatter(
            r["tokens_per_s"],
            r["perplexity"],
            marker=marks.get(r["cache_rate"], "o"),
            color="k" if r["method"] == "monolithic" else "tab:purple",
            alpha=0.8,
        )
        axes[1].annotate(
            r["method"].replace("sub-experts ", ""),
            (r["tokens_per_s"], r["perplexity"]),
            fontsize=7,
        )
    axes[1].set_xlabel("modelled tokens/s")
    axes[1].set_ylabel("perplexity")
    axes[1].set_title("MoE-Prism sub-experts (purple) vs monolithic (black)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bench_substitution(
    tokens: int = 4096, experts: int = 64, k: int = 6, seed: int = 0, cfg=None
) -> dict:
    """Substitutions per second of Algorithm 1: the paper's plain loop, the vectorised
    version and the compiled one (numba), on ``tokens`` random tokens (top-``k`` of
    ``experts``, half of them resident, 16 buddies each); and the compiled one's time for one
    decode step (``cfg.batch`` tokens through every layer of ``cfg.scale_to``, one call per
    layer) against that step's compute time in the offload model with every expert resident
    (the shortest a step can be, so the largest share substitution can take)."""
    import time

    from fsedp.sw.policies.buddy import (
        algorithm1_compiled,
        algorithm1_loop,
        algorithm1_vectorized,
    )

    cfg = cfg or OffloadConfig()
    rng = np.random.default_rng(seed)
    S = np.stack([rng.choice(experts, k, replace=False) for _ in range(tokens)])
    M = rng.random(experts) < 0.5
    B = np.stack([rng.permutation(np.delete(np.arange(experts), i))[:16] for i in range(experts)])

    def best_of(f, repeat):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = f()
            times.append(time.perf_counter() - t0)
        return min(times), out

    loop, a = best_of(lambda: algorithm1_loop(S, M, B, 16), 1)
    vec, b = best_of(lambda: algorithm1_vectorized(S, M, B, 16), 10)
    algorithm1_compiled(S[:2], M, B, 16)  # compiles (or loads the cache) outside the timing
    comp, c = best_of(lambda: algorithm1_compiled(S, M, B, 16), 50)
    n = int((a != S).sum())
    assert np.array_equal(a, b) and np.array_equal(a, c)
    # one decode step: batch tokens, one call per layer
    model = load_section(
        ModelConfig, config_path("models", cfg.scale_to, COMMAND_LINE, "--scale-to")
    )
    step_rows = S[: cfg.batch]
    call, _ = best_of(lambda: algorithm1_compiled(step_rows, M, B, 16), 200)
    cost = deployment_cost(cfg)
    per_unit = np.bincount(step_rows.ravel(), minlength=experts)
    step_s = model.layers * cost.compute_s(per_unit[per_unit > 0], cfg.batch)
    sub_s = model.layers * call
    return {
        "tokens": tokens,
        "experts": experts,
        "top_k": k,
        "substitutions": n,
        "loop_per_s": round(n / loop),
        "vectorized_per_s": round(n / vec),
        "compiled_per_s": round(n / comp),
        "speedup": round(loop / vec, 1),
        "compiled_speedup": round(loop / comp, 1),
        "step": {
            "model": cfg.scale_to,
            "batch": cfg.batch,
            "layers": model.layers,
            "substitution_us": round(sub_s * 1e6, 1),
            "compute_ms": round(step_s * 1e3, 3),
            "share": round(sub_s / step_s, 5),
        },
    }
