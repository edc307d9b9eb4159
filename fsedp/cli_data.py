"""``fsedp lm ...`` and ``fsedp trace ...``: the project's MoE LM and routing workloads."""

import json
import sys
from pathlib import Path

import numpy as np

from .errors import InputError

__all__ = ["add_parsers"]


class UsageError(InputError):
    def __init__(self, field, reason):
        super().__init__("<command line>", field, reason)


def _int_at_least(name, low):
    def conv(text):
        try:
            v = int(text)
        except ValueError:
            raise UsageError(name, f"must be an integer, not {text!r}") from None
        if v < low:
            raise UsageError(name, f"must be at least {low}, not {v}")
        return v
    return conv


def _positive(name):
    return _int_at_least(name, 1)


def _float(name, lo=None, hi=None):
    def conv(text):
        try:
            v = float(text)
        except ValueError:
            raise UsageError(name, f"must be a number, not {text!r}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise UsageError(name, f"must be in [{lo}, {hi}], not {v}")
        return v
    return conv


def _report(args, doc, text: str, stem: str, plot=None):
    """Print ``text`` (or ``doc`` as JSON with ``--json``); with ``--out DIR`` also write
    ``DIR/<stem>.json``, ``DIR/<stem>.md`` and, when ``plot`` is given, ``DIR/<stem>.png``
    (each written atomically)."""
    from .files import atomic_path

    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with atomic_path(out / f"{stem}.json") as tmp:
            tmp.write_text(json.dumps(doc, indent=1) + "\n")
        with atomic_path(out / f"{stem}.md") as tmp:
            tmp.write_text(text)
        if plot is not None:
            with atomic_path(out / f"{stem}.png") as tmp:
                plot(tmp)
    print(json.dumps(doc) if args.json else text)
    return 0


# -- fsedp lm -----------------------------------------------------------------------------
def cmd_lm_train(args):
    from .lm.build import train_command
    from .lm.config import LMConfig
    from .lm.train import TrainConfig

    cfg = LMConfig(layers=args.layers, experts=args.experts, top_k=args.top_k,
                   d_model=args.d_model, d_ffn=args.d_ffn, shared_experts=args.shared_experts,
                   vocab=args.vocab)
    tc = TrainConfig(steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed, aux=args.aux)
    info = train_command(Path(args.out), cfg, tc, log=lambda s: print(s, flush=True), data=args.data)
    print(f"wrote {args.out}/moe_lm.npz, tokenizer.json, training.json ({info['seconds']} s)")
    return 0


def cmd_lm_eval(args):
    from .lm.build import evaluate

    res = evaluate(args.weights, args.tokenizer, args.max_tokens, data=args.data)
    if args.json:
        print(json.dumps(res))
    else:
        print(f"held-out WikiText-2 test, {res['tokens']} tokens: MoE LM perplexity "
              f"{res['moe_lm']}, bigram {res['bigram']}, unigram {res['unigram']} "
              f"({res['parameters']} parameters, {res['eval_seconds']} s)")
    return 0


# -- fsedp trace --------------------------------------------------------------------------
def _load(path, fmt="auto", num_experts=None):
    from .trace_io import load_any

    return load_any(path, fmt, num_experts)


def _check_out(path: str, field: str = "OUT"):
    p = Path(path)
    if p.suffix.lower() != ".npz":
        raise UsageError(field, f"the project's trace format is an .npz file, not {path!r}")
    return p


def cmd_trace_convert(args):
    from .trace_io import save_trace

    out = _check_out(args.out)
    trace = _load(args.input, args.format, args.num_experts)
    save_trace(trace, out)
    print(f"{out}: {trace.tokens} tokens x {trace.layers} layers, top-{trace.top_k} of "
          f"{trace.num_experts} experts" + (", with probabilities" if trace.scores is not None else "")
          + (", with token ids" if trace.token_ids is not None else ""))
    return 0


def cmd_trace_stats(args):
    from .files import atomic_path
    from .trace_stats import format_stats, plot_stats, trace_stats

    trace = _load(args.input, args.format, args.num_experts)
    stats = trace_stats(trace, fit=args.fit)
    text = format_stats(stats)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with atomic_path(out / "stats.json") as tmp:
            tmp.write_text(json.dumps(stats, indent=1) + "\n")
        with atomic_path(out / "stats.md") as tmp:
            tmp.write_text(text)
        plot_stats(stats, trace, out)
    if args.json:
        print(json.dumps(stats))
    else:
        print(text + (f"\nwritten: {args.out}/stats.json, stats.md, load_tail.png, stats.png"
                      if args.out else ""))
    return 0


def cmd_trace_synth(args):
    from .trace_io import save_trace
    from .trace_synth import MATCHED, fit

    out = _check_out(args.out, "--out")
    source = _load(args.like, args.format, None)
    model, info = fit(source, seed=args.seed)
    trace = model.sample(args.tokens or source.tokens, seed=args.seed)
    save_trace(trace, out)
    print(f"{out}: {trace.tokens} tokens like {source.name}; weights {info['params']}")
    print("| statistic | source | synthetic | tolerance |\n|---|---:|---:|---:|")
    for key, tol in MATCHED.items():
        print(f"| {key} | {info['source'][key]:.3f} | {info['synthetic'][key]:.3f} | {tol} |")
    return 0


def cmd_trace_record(args):
    from .trace_io import record_hf, save_trace

    out = _check_out(args.out, "--out")
    trace = record_hf(args.model, args.text, max_tokens=args.max_tokens, seq_len=args.seq_len,
                      tokenizer_path=args.tokenizer)
    save_trace(trace, out)
    print(f"{out}: {trace.tokens} tokens x {trace.layers} layers, top-{trace.top_k} of "
          f"{trace.num_experts} experts")
    return 0


def cmd_lm_trace(args):
    from .lm.build import record_routing
    from .trace_io import save_trace

    out = _check_out(args.out, "--out")
    trace = record_routing(args.max_tokens, args.weights, args.tokenizer, data=args.data)
    save_trace(trace, out)
    print(f"{out}: {trace.tokens} tokens x {trace.layers} layers, top-{trace.top_k} of "
          f"{trace.num_experts} experts")
    return 0


# -- fsedp offload ------------------------------------------------------------------------
def _offload_config(args):
    from .offload_eval import OffloadConfig
    from .sw.buddy import BuddyConfig

    try:
        bc = BuddyConfig(alpha=args.alpha, k_max=args.k_max, weighted=args.weighted, eps=args.eps,
                         warmup=args.warmup, warmup_weight=args.warmup_weight, tau=args.tau,
                         tau_pct=args.tau_pct, temperature=args.temperature, gamma=args.gamma,
                         beta=args.beta,
                         budget_bytes=args.budget_mb * 1e6 if args.budget_mb is not None else None,
                         eta=args.eta, kappa=args.kappa, diversity=args.diversity,
                         unique=not args.allow_reuse, search=args.search, rho=args.rho)
    except ValueError as e:
        name, _, why = str(e).partition(":")
        raise UsageError(f"--{name.replace('_', '-')}", why.strip()) from None
    return OffloadConfig(policy=args.policy, cache_rate=args.cache_rate, prefetch=args.prefetch,
                         prefetch_count=args.prefetch_count, link=args.link,
                         bandwidth_gbs=args.bandwidth, latency_us=args.latency_us,
                         scale_to=args.scale_to, flops=args.tflops * 1e12,
                         overhead_us=args.overhead_us, batch=args.batch, seed=args.seed,
                         sub_experts=args.sub_experts, active=args.active, buddy=bc)


def cmd_offload(args):
    import dataclasses
    import time

    from .files import atomic_path
    from .offload_eval import (bench_substitution, buddy_grid, format_buddy, format_prism,
                               lm_data, plot_tradeoff, prism_grid, run_lm, run_trace)

    cfg = _offload_config(args)
    t0 = time.time()
    if args.bench_substitution:
        r = bench_substitution()
        print(json.dumps(r) if args.json else
              f"Algorithm 1 on {r['tokens']} tokens, top-{r['top_k']} of {r['experts']}, "
              f"{r['substitutions']} substitutions: loop {r['loop_per_s']}/s, vectorised "
              f"{r['vectorized_per_s']}/s ({r['speedup']}x)")
        return 0
    if args.trace:
        from .config import EMBEDDED_TRACE
        trace = _load(EMBEDDED_TRACE if args.trace == "model" else args.trace)
        rows = []
        for c in args.cache_rates or [cfg.cache_rate]:
            for pf in (args.prefetches or [cfg.prefetch]):
                rows.append(run_trace(trace, dataclasses.replace(cfg, cache_rate=c, prefetch=pf)))
        if args.json:
            print(json.dumps(rows))
            return 0
        print(f"routing-only offload on {trace.name} (fetch on demand, steps of {cfg.batch} "
              f"tokens, {cfg.link} link, sizes of {cfg.scale_to}):\n")
        print("| cache rate | prefetcher | hit rate | resident hit rate | prefetch accuracy | "
              "on-demand fetches | MB moved | stall s | tokens/s |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['cache_rate']} | {r['prefetch']} | {r['hit_rate']} | {r['resident_hit_rate']} | "
                  f"{r['prefetch_accuracy']} | {r['demand_fetches']} | {r['bytes_moved_mb']} | "
                  f"{r['stall_s']} | {r['tokens_per_s']} |")
        return 0
    model, test, prof = lm_data(args.max_tokens, weights=args.model, data=args.data)
    if args.grid:
        say = (lambda r: print(json.dumps(r), file=sys.stderr, flush=True)) if args.verbose else None
        buddy = buddy_grid(model, test, prof, cfg, progress=say)
        prism = prism_grid(model, test, prof, cfg, progress=say)
        text = (f"Offload grid (`fsedp offload --grid --max-tokens {args.max_tokens}`, "
                f"{time.time() - t0:.0f} s, {len(test) - 1} held-out tokens)\n\n"
                "## BuddyMoE (Tables 2-4)\n" + format_buddy(buddy)
                + "\n\n## MoE-Prism offloading against monolithic experts\n\n" + format_prism(prism) + "\n")
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            with atomic_path(out / "offload.md") as tmp:
                tmp.write_text(text)
            with atomic_path(out / "offload.json") as tmp:
                tmp.write_text(json.dumps({"buddy": buddy, "prism": prism}, indent=1) + "\n")
            with atomic_path(out / "tradeoff.png") as tmp:
                plot_tradeoff(buddy, prism, tmp)
        print(json.dumps({"buddy": buddy, "prism": prism}) if args.json else text)
        return 0
    r = run_lm(model, test, prof, cfg)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{cfg.policy} at cache rate {cfg.cache_rate} on {len(test) - 1} held-out tokens: "
              f"perplexity {r['perplexity']}, {r['tokens_per_s']} tokens/s (modelled), hit rate "
              f"{r['hit_rate']}, {r['demand_fetches']} on-demand fetches, {r['prefetches']} "
              f"prefetches (accuracy {r['prefetch_accuracy']}), {r['substituted']} substituted, "
              f"{r['dropped']} dropped, {r['bytes_moved_mb']} MB moved, stall {r['stall_s']} s"
              + (f"; gates {r['gates']}" if "gates" in r else ""))
    return 0


def _rate_list(text):
    try:
        v = [float(x) for x in text.split(",")]
    except ValueError:
        raise UsageError("--cache-rates", f"must be comma-separated numbers, not {text!r}") from None
    if not all(0 <= x <= 1 for x in v):
        raise UsageError("--cache-rates", f"must be in [0, 1], not {text!r}")
    return v


def _opt_float(name, lo=None, hi=None):
    conv = _float(name, lo, hi)
    return lambda text: None if text.lower() == "none" else conv(text)


def add_offload_parser(sub):
    from .offload_eval import POLICIES, PREFETCHERS
    from .sw.offload import LINKS

    o = sub.add_parser("offload", help="offload policies (on demand, drop, random, BuddyMoE, "
                       "MoE-Prism) on the project's MoE LM, or routing-only on a trace",
                       description="Run an offload policy on the project's MoE LM over held-out "
                       "WikiText-2 (perplexity, modelled tokens/s) or, with --trace, the "
                       "routing-only figures of fetching on demand. See docs/offload.md.")
    g = o.add_argument_group("run")
    g.add_argument("--policy", choices=POLICIES, default="demand", help="miss policy (default demand)")
    g.add_argument("--cache-rate", type=_float("--cache-rate", 0.0, 1.0), default=0.5,
                   help="resident share of each layer's experts c (default 0.5)")
    g.add_argument("--prefetch", choices=PREFETCHERS, default="transition",
                   help="prefetcher (default transition: previous layer)")
    g.add_argument("--prefetch-count", type=_positive("--prefetch-count"), default=None,
                   help="units prefetched per layer and step (default: cache capacity / 4)")
    g.add_argument("--batch", type=_positive("--batch"), default=16, help="tokens per step (default 16)")
    g.add_argument("--max-tokens", type=_positive("--max-tokens"), default=16384,
                   help="held-out test tokens evaluated (default 16384)")
    g.add_argument("--seed", type=int, default=0, help="seed of random substitution (default 0)")
    g.add_argument("--trace", default=None, help="routing-only mode on a trace file ('model': the embedded trace)")
    g.add_argument("--cache-rates", type=_rate_list, default=None, help="routing-only: several cache rates")
    g.add_argument("--prefetches", type=lambda t: t.split(","), default=None,
                   help="routing-only: several prefetchers, comma-separated")
    g.add_argument("--grid", action="store_true", help="the BuddyMoE and MoE-Prism tables at c = 0.375, 0.5, 0.75")
    g.add_argument("--out", default=None, help="with --grid: folder for offload.md, offload.json, tradeoff.png")
    g.add_argument("--bench-substitution", action="store_true",
                   help="substitutions per second: vectorised Algorithm 1 against the plain loop")
    g.add_argument("--json", action="store_true")
    g.add_argument("--verbose", action="store_true", help="print each grid row as it is done")
    g.add_argument("--data", default=None, help="data folder holding text/ (default $FSEDP_DATA; without one, the embedded trace's held-out tokens)")
    h = o.add_argument_group("cost model")
    h.add_argument("--link", choices=sorted(LINKS), default="pcie4",
                   help="pcie4: 25 GB/s, 10 us; ddr-chip: 102.4 GB/s, 0.1 us (default pcie4)")
    h.add_argument("--bandwidth", type=_float("--bandwidth", 1e-9), default=None, help="GB/s (default: the link's)")
    h.add_argument("--latency-us", type=_float("--latency-us", 0.0), default=None, help="per transfer (default: the link's)")
    h.add_argument("--scale-to", default="deepseek-v2-lite",
                   help="model config whose expert size and FLOPs are modelled (default deepseek-v2-lite)")
    h.add_argument("--tflops", type=_float("--tflops", 1e-9), default=50.0, help="compute rate (default 50)")
    h.add_argument("--overhead-us", type=_float("--overhead-us", 0.0), default=5.0,
                   help="launch overhead per expert and step (default 5)")
    b = o.add_argument_group("BuddyMoE (Section 3)")
    b.add_argument("--alpha", type=_float("--alpha", 1e-9, 1.0), default=0.95, help="CFT coverage (default 0.95)")
    b.add_argument("--k-max", type=_positive("--k-max"), default=16, help="longest buddy list (default 16)")
    b.add_argument("--weighted", action="store_true", help="probability-weighted co-activation counts (default: binary)")
    b.add_argument("--eps", type=_float("--eps", 0.0), default=1e-3, help="Laplace smoothing (default 1e-3)")
    b.add_argument("--warmup", type=int, default=0, help="profiling tokens down-weighted (default 0)")
    b.add_argument("--warmup-weight", type=_float("--warmup-weight", 0.0, 1.0), default=0.5,
                   help="their weight (default 0.5)")
    b.add_argument("--tau", type=_opt_float("--tau", 0.0, 1.0), default=None,
                   help="TAE threshold (default none: the --tau-pct percentile per layer)")
    b.add_argument("--tau-pct", type=_float("--tau-pct", 0.0, 100.0), default=15.0,
                   help="percentile of the layer's TAE used as tau (default 15)")
    b.add_argument("--temperature", type=_float("--temperature", 1e-9), default=1.0, help="TAE temperature (default 1)")
    b.add_argument("--gamma", type=_opt_float("--gamma", 0.0, 1.0), default=None,
                   help="probability-margin gate (default none: off)")
    b.add_argument("--beta", type=_opt_float("--beta", 0.0, 1.0), default=None,
                   help="residency gate: no substitution when this share of requested experts is off chip (default none: off)")
    b.add_argument("--budget-mb", type=_opt_float("--budget-mb", 0.0), default=None,
                   help="per-step transfer budget: substitute only beyond it (default none)")
    b.add_argument("--eta", type=_float("--eta", 0.0), default=0.0, help="local router compatibility (default 0)")
    b.add_argument("--kappa", type=_float("--kappa", 0.0, 1.0), default=0.0, help="cross-link penalty (default 0)")
    b.add_argument("--diversity", type=_float("--diversity", 0.0, 1.0), default=0.5,
                   help="score factor per earlier use of a buddy by the token (default 0.5)")
    b.add_argument("--allow-reuse", action="store_true", help="allow a buddy the token already uses (default: Algorithm 1 forbids it)")
    b.add_argument("--search", type=_positive("--search"), default=16, help="H: buddies searched (default 16)")
    b.add_argument("--rho", type=lambda t: None if t.lower() == "none" else _nonneg("--rho")(t), default=None,
                   help="replacement budget per token (default none: unlimited)")
    p = o.add_argument_group("MoE-Prism")
    p.add_argument("--sub-experts", type=_positive("--sub-experts"), default=4,
                   help="sub-experts per expert, contiguous neuron groups (default 4)")
    p.add_argument("--active", type=_positive("--active"), default=4,
                   help="sub-experts run per chosen expert, the largest activation norms (default 4)")
    p.add_argument("--model", default=None,
                   help="weights (default: the committed model); a `fsedp prism refactor` output makes "
                        "the sub-experts its annealed partition instead of the contiguous split")
    o.set_defaults(func=cmd_offload)


def _nonneg(name):
    return _int_at_least(name, 0)


# -- fsedp prism --------------------------------------------------------------------------
def cmd_prism_refactor(args):
    import time

    from .lm.model import MoELM
    from .offload_eval import lm_data
    from .prism_eval import refactor_model

    if args.out and not args.out.endswith(".npz"):
        raise UsageError("--out", f"the refactored model is an .npz file, not {args.out!r}")
    if args.objective_k >= args.sub_experts:
        raise UsageError("--objective-k", f"must be below --sub-experts = {args.sub_experts}, not {args.objective_k}")
    t0 = time.time()
    user_model = MoELM.load(args.model) if args.model else None    # checked first
    model, _, prof = lm_data(1, args.profile_tokens, data=args.data)
    if user_model is not None:
        model = user_model
    if model.cfg.d_ffn % args.sub_experts:
        raise UsageError("--sub-experts", f"{model.cfg.d_ffn} neurons do not split into {args.sub_experts}")
    ref, part, report, _ = refactor_model(model, prof, S=args.sub_experts, K=args.objective_k,
                                          g=args.gates, top_p=args.top_p, t0=args.t0,
                                          cooling=args.cooling, iters=args.iters, seed=args.seed)
    ref.save(args.out)
    c = np.array([r["cost"] for r in report])
    print(f"{args.out}: {len(report)} experts refactored into {args.sub_experts} sub-experts "
          f"({time.time() - t0:.0f} s); objective (sum of the {args.sub_experts - args.objective_k} "
          f"smallest sub-expert norms) contiguous {c[:, 0].sum():.1f}, greedy {c[:, 1].sum():.1f}, "
          f"annealed {c[:, 2].sum():.1f} ({(1 - c[:, 2].sum() / c[:, 0].sum()) * 100:.1f} % below contiguous)")
    return 0


def cmd_prism_curve(args):
    import time

    from .lm.model import MoELM
    from .offload_eval import lm_data
    from .prism_eval import operating_points, plot_curve, quality_curve, refactor_model
    from .sw.prism import profile_activations, refactor

    t0 = time.time()
    ref = None
    if args.refactored:                       # the user's file is checked before anything else
        ref = MoELM.load(args.refactored)
        from .sw.prism import Partition
        if Partition.of(ref) is None:
            raise UsageError("--refactored", f"{args.refactored} holds no MoE-Prism partition (prism.gates)")
        S = Partition.of(ref).S
    model, test, prof = lm_data(args.max_tokens, args.profile_tokens, data=args.data)
    if ref is None:
        S = args.sub_experts
        ref, _, _, _ = refactor_model(model, prof, S=S, iters=args.iters)
    naive, _, _ = refactor(model, profile_activations(model, prof, 2048), S=S, contiguous=True)
    say = (lambda K, row: print(f"K = {K}: {row}", file=sys.stderr, flush=True)) if args.verbose else None
    curve = quality_curve(model, ref, naive, test, say)
    ops = [operating_points(curve, s) for s in args.stable]
    lines = [f"MoE-Prism quality curve (`fsedp prism curve --max-tokens {args.max_tokens}`, "
             f"{time.time() - t0:.0f} s, {len(test) - 1} held-out tokens; full model {curve['full']})", "",
             "| active sub-experts K | original | contiguous split, proxy | refactored, proxy | refactored, oracle |",
             "|---:|---:|---:|---:|---:|"]
    for K in range(1, model.cfg.top_k * S + 1):
        lines.append(f"| {K} | {curve['original'].get(K, '-')} | {curve['contiguous'][K]} | "
                     f"{curve['refactored'][K]} | {curve['refactored_oracle'][K]} |")
    lines += ["", "| stable within | original points | refactored points | ratio |", "|---:|---|---|---:|"]
    for o in ops:
        lines.append(f"| {o['stable']}x ({o['limit']}) | {o['original']} | {o['refactored']} | {o['ratio']} |")
    text = "\n".join(lines) + "\n"
    return _report(args, {"curve": curve, "operating_points": ops}, text, "curve",
                   plot=lambda path: plot_curve(curve, path))


def add_prism_parser(sub):
    pr = sub.add_parser("prism", help="MoE-Prism: refactor the MoE LM into sub-experts, quality curve")
    psub = pr.add_subparsers(dest="prism_cmd", required=True, parser_class=type(pr))
    r = psub.add_parser("refactor", help="partition every expert's neurons into sub-experts "
                        "(greedy + simulated annealing) and pick gate neurons")
    r.add_argument("--out", required=True, help="refactored model (.npz)")
    r.add_argument("--model", default=None, help="weights to refactor (default: the committed model)")
    r.add_argument("--sub-experts", type=_positive("--sub-experts"), default=4, help="S (default 4)")
    r.add_argument("--objective-k", type=_positive("--objective-k"), default=2,
                   help="sub-experts kept in the objective (default 2)")
    r.add_argument("--gates", type=_positive("--gates"), default=4, help="gate neurons per sub-expert (default 4)")
    r.add_argument("--top-p", type=_float("--top-p", 1e-6, 1.0), default=0.1,
                   help="share of a token's neurons counted active for co-activation (default 0.1)")
    r.add_argument("--t0", type=_float("--t0", 0.0), default=0.01,
                   help="initial annealing temperature, relative to the initial cost (default 0.01)")
    r.add_argument("--cooling", type=_float("--cooling", 1e-6, 1.0), default=0.999, help="per proposal (default 0.999)")
    r.add_argument("--iters", type=_int_at_least("--iters", 0), default=3000, help="proposals per expert (default 3000)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--profile-tokens", type=_positive("--profile-tokens"), default=16384,
                   help="calibration tokens from WikiText-2 validation (default 16384)")
    r.add_argument("--data", default=None, help="data folder holding text/ (default $FSEDP_DATA; without one, the embedded trace's held-out tokens)")
    r.set_defaults(func=cmd_prism_refactor)
    c = psub.add_parser("curve", help="perplexity against active sub-experts; operating points")
    c.add_argument("--refactored", default=None, help="a refactored model (default: refactor now)")
    c.add_argument("--sub-experts", type=_positive("--sub-experts"), default=4, help="S when refactoring now (default 4)")
    c.add_argument("--iters", type=_int_at_least("--iters", 0), default=3000, help="annealing proposals when refactoring now")
    c.add_argument("--max-tokens", type=_positive("--max-tokens"), default=8192, help="held-out test tokens (default 8192)")
    c.add_argument("--profile-tokens", type=_positive("--profile-tokens"), default=16384)
    c.add_argument("--stable", type=lambda t: [float(x) for x in t.split(",")], default=[1.5, 2.0],
                   help="perplexity ratios to the full model that count as stable (default 1.5,2.0)")
    c.add_argument("--out", default=None, help="folder for curve.md, curve.json, curve.png")
    c.add_argument("--json", action="store_true")
    c.add_argument("--verbose", action="store_true")
    c.add_argument("--data", default=None, help="data folder holding text/ (default $FSEDP_DATA; without one, the embedded trace's held-out tokens)")
    c.set_defaults(func=cmd_prism_curve)


# -- fsedp serve --------------------------------------------------------------------------
def cmd_serve(args):
    import time

    from .serve_eval import format_rows, run

    t0 = time.time()
    policies = ["qos", "fifo", "fullbatch"] if args.policy == "all" else [args.policy]
    loads = ["low", "medium", "high"] if args.load == "all" else [args.load]
    rows = run(policies, loads, duration=args.duration, max_batch=args.max_batch,
               timeout=args.timeout, slo=args.slo, scale_to=args.scale_to, curve_path=args.curve,
               seed=args.seed, flops=args.tflops * 1e12, bandwidth=args.bandwidth * 1e9)
    text = (f"Serving (`fsedp serve --policy {args.policy} --load {args.load} --max-batch "
            f"{args.max_batch}`, {time.time() - t0:.1f} s; {args.duration:g} s of Poisson arrivals, "
            f"{args.scale_to} on {args.tflops:g} TFLOPS / {args.bandwidth:g} GB/s)\n\n" + format_rows(rows) + "\n")
    return _report(args, rows, text, "serve")


def add_serve_parser(sub):
    s = sub.add_parser("serve", help="MoE-Prism QoS scheduling against FIFO and FullBatch on a "
                       "Poisson workload", description="Serve a Poisson workload with quality "
                       "floors through one instance; see docs/serving.md.")
    s.add_argument("--policy", choices=["qos", "fifo", "fullbatch", "all"], default="all",
                   help="scheduler (default all)")
    s.add_argument("--load", choices=["low", "medium", "high", "all"], default="all",
                   help="offered load: 0.4, 0.7, 1.3 x FIFO's capacity at full quality (default all)")
    s.add_argument("--duration", type=_float("--duration", 1.0), default=300.0, help="seconds of arrivals (default 300)")
    s.add_argument("--max-batch", type=_positive("--max-batch"), default=32, help="largest batch (default 32)")
    s.add_argument("--timeout", type=_float("--timeout", 0.0), default=2.0,
                   help="timeout trigger, seconds a request may wait (default 2)")
    s.add_argument("--slo", type=_opt_float("--slo", 0.0), default=None,
                   help="end-to-end latency SLO in seconds (default: 3 x a full batch at full quality)")
    s.add_argument("--scale-to", default="mixtral-8x7b",
                   help="model config whose sizes the performance model uses (default mixtral-8x7b)")
    s.add_argument("--tflops", type=_float("--tflops", 1e-9), default=150.0, help="compute rate (default 150)")
    s.add_argument("--bandwidth", type=_float("--bandwidth", 1e-9), default=2000.0, help="memory GB/s (default 2000)")
    s.add_argument("--curve", default=None,
                   help="quality curve JSON of `fsedp prism curve` (default: the committed model's)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default=None, help="folder for serve.json and serve.md")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_serve)


# -- fsedp shuffle ------------------------------------------------------------------------
def cmd_shuffle(args):
    import time

    from .config import EMBEDDED_TRACE
    from .shuffle_eval import evaluate, format_report

    t0 = time.time()
    emb = None
    if args.trace == "model":
        from .lm.model import MoELM
        trace = _load(EMBEDDED_TRACE)
        emb = MoELM.load().w["embed"]
    else:
        trace = _load(args.trace, args.format)
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in ("cem", "metis", "kmeans")]
    if bad or not methods:
        raise UsageError("--methods", f"choose from cem, metis, kmeans, not {args.methods!r}")
    r = evaluate(trace, devices=args.devices, fit=args.fit, slack=args.slack, cem_iters=args.cem_iters,
                 cem_samples=args.cem_samples, elite=args.elite, seed=args.seed, embeddings=emb,
                 methods=methods)
    text = (f"`fsedp shuffle {args.trace} --devices {args.devices}` ({time.time() - t0:.1f} s)\n\n"
            + format_report(r))
    return _report(args, r, text, "shuffle")


def add_shuffle_parser(sub):
    from .trace_io import FORMATS

    s = sub.add_parser("shuffle", help="Speculative MoE: token-to-expert prediction, co-clustering "
                       "(CEM, METIS, k-means), local activation rate, all-to-all volume")
    s.add_argument("trace", nargs="?", default="model",
                   help="routing trace with token ids (default 'model': the embedded trace of the "
                        "project's LM, with its embeddings for unseen tokens)")
    s.add_argument("--format", choices=FORMATS, default="auto")
    s.add_argument("--devices", type=_positive("--devices"), default=4, help="expert-parallel devices (default 4)")
    s.add_argument("--fit", type=_float("--fit", 0.01, 0.99), default=0.2,
                   help="share of tokens the tables and placements are fitted on (default 0.2)")
    s.add_argument("--slack", type=_float("--slack", 0.0, 10.0), default=0.1,
                   help="token-load relaxation: a device takes up to (1 + slack) of an even share (default 0.1)")
    s.add_argument("--cem-iters", type=_positive("--cem-iters"), default=20, help="CEM iterations (default 20)")
    s.add_argument("--cem-samples", type=_positive("--cem-samples"), default=32, help="samples per iteration (default 32)")
    s.add_argument("--elite", type=_float("--elite", 1e-6, 1.0), default=0.1, help="elite fraction (default 0.1)")
    s.add_argument("--methods", default="cem,metis,kmeans", help="placements to compare (default cem,metis,kmeans)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default=None, help="folder for shuffle.json and shuffle.md")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_shuffle)


def add_parsers(sub):
    from .trace_io import FORMATS

    add_offload_parser(sub)
    add_prism_parser(sub)
    add_serve_parser(sub)
    add_shuffle_parser(sub)

    tr = sub.add_parser("trace", help="routing traces: convert, record, statistics, synthesis")
    tsub = tr.add_subparsers(dest="trace_cmd", required=True, parser_class=type(tr))
    fmt_help = ("input format (default auto: .npz fsedp or FLAME by content, .jsonl, .npy); "
                "see fsedp/trace_io.py")
    c = tsub.add_parser("convert", help="import a trace into the project's format (.npz)")
    c.add_argument("input")
    c.add_argument("out", metavar="OUT")
    c.add_argument("--format", choices=FORMATS, default="auto", help=fmt_help)
    c.add_argument("--num-experts", type=_positive("--num-experts"), default=None,
                   help="experts per layer (default: largest id + 1; jsonl and npy only)")
    c.set_defaults(func=cmd_trace_convert)
    s = tsub.add_parser("stats", help="load skew per window, co-activation, predictability")
    s.add_argument("input")
    s.add_argument("--format", choices=FORMATS, default="auto", help=fmt_help)
    s.add_argument("--num-experts", type=_positive("--num-experts"), default=None)
    s.add_argument("--fit", type=_float("--fit", 0.01, 0.99), default=0.2,
                   help="share of tokens the predictors are fitted on (default 0.2)")
    s.add_argument("--out", default=None, help="folder for stats.json, stats.md and PNG plots")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_trace_stats)
    y = tsub.add_parser("synth", help="a seeded generator fitted to a trace, any length")
    y.add_argument("--like", required=True, help="the trace to fit")
    y.add_argument("--format", choices=FORMATS, default="auto", help=fmt_help)
    y.add_argument("--tokens", type=_positive("--tokens"), default=None,
                   help="tokens to generate (default: as many as the source)")
    y.add_argument("--seed", type=int, default=0)
    y.add_argument("--out", required=True, help="output trace (.npz)")
    y.set_defaults(func=cmd_trace_synth)
    r = tsub.add_parser("record", help="routing of a Hugging Face MoE model on a text "
                        "(needs the 'model' extra)")
    r.add_argument("--model", required=True, help="folder of a transformers MoE model")
    r.add_argument("--text", required=True, help="UTF-8 text file")
    r.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model's)")
    r.add_argument("--max-tokens", type=_positive("--max-tokens"), default=4096)
    r.add_argument("--seq-len", type=_positive("--seq-len"), default=256)
    r.add_argument("--out", required=True, help="output trace (.npz)")
    r.set_defaults(func=cmd_trace_record)

    lm = sub.add_parser("lm", help="the project's small MoE language model: train, evaluate")
    lsub = lm.add_subparsers(dest="lm_cmd", required=True, parser_class=type(lm))
    t = lsub.add_parser("train", help="train tokenizer and model (needs torch: the 'model' extra)")
    t.add_argument("--out", default="build/lm", help="output folder (default build/lm)")
    t.add_argument("--steps", type=_positive("--steps"), default=3200, help="optimizer steps (default 3200)")
    t.add_argument("--batch", type=_positive("--batch"), default=24, help="sequences per step (default 24)")
    t.add_argument("--lr", type=_float("--lr", 0.0, 1.0), default=3e-3, help="peak learning rate (default 3e-3)")
    t.add_argument("--aux", type=_float("--aux", 0.0, 10.0), default=0.03,
                   help="weight of the load-balancing loss (default 0.03)")
    t.add_argument("--seed", type=int, default=0, help="seed of data order and initialisation (default 0)")
    t.add_argument("--layers", type=_positive("--layers"), default=4, help="transformer layers (default 4)")
    t.add_argument("--experts", type=_positive("--experts"), default=16, help="routed experts per layer (default 16)")
    t.add_argument("--top-k", type=_positive("--top-k"), default=2, help="experts per token (default 2)")
    t.add_argument("--d-model", type=_positive("--d-model"), default=128, help="hidden size (default 128)")
    t.add_argument("--d-ffn", type=_positive("--d-ffn"), default=128, help="neurons per expert (default 128)")
    t.add_argument("--shared-experts", type=int, default=0, help="always-on experts (default 0)")
    t.add_argument("--vocab", type=_positive("--vocab"), default=2048, help="BPE vocabulary (default 2048)")
    t.add_argument("--data", default=None, help="data folder holding text/ (default $FSEDP_DATA; required)")
    t.set_defaults(func=cmd_lm_train)
    e = lsub.add_parser("eval", help="held-out WikiText-2 test perplexity against n-gram baselines")
    e.add_argument("--weights", default=None, help="weights .npz (default: the committed model)")
    e.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the committed one)")
    e.add_argument("--max-tokens", type=_positive("--max-tokens"), default=None,
                   help="evaluate on the first N test tokens only")
    e.add_argument("--json", action="store_true")
    e.add_argument("--data", default=None, help="data folder holding text/ (default $FSEDP_DATA; required)")
    e.set_defaults(func=cmd_lm_eval)
    r = lsub.add_parser("trace", help="record the model's routing on held-out WikiText-2 test")
    r.add_argument("--out", required=True, help="output trace (.npz)")
    r.add_argument("--max-tokens", type=_positive("--max-tokens"), default=8192,
                   help="test tokens to route (default 8192)")
    r.add_argument("--weights", default=None, help="weights .npz (default: the committed model)")
    r.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the committed one)")
    r.add_argument("--data", default=None, help="data folder holding text/ (default $FSEDP_DATA; required)")
    r.set_defaults(func=cmd_lm_trace)
