"""``fsedp offload``: expert offloading policies (BuddyMoE, MoE-Prism) on the project's MoE
LM or a trace."""

from fsedp import jsondoc
from fsedp.cli.common import (
    DATA_OR_EMBEDDED,
    JSON,
    field_value,
    int_at_least,
    load_trace,
    model_configs,
    number,
    opt_number,
    positive,
    usage,
)
from fsedp.cli.lm import load_lm
from fsedp.errors import COMMAND_LINE, InputError
from fsedp.log import logger
from fsedp.sw.policies.device import DEFAULT_DEVICE, DeviceProfile

_log = logger("offload")


def _offload_config(args):
    from fsedp.experiments.offload import OffloadConfig
    from fsedp.sw.policies.buddy import BuddyConfig

    if args.kappa:
        # refused, not ignored: the offload model's experts are on one device or on the host
        raise InputError(
            COMMAND_LINE,
            "--kappa",
            f"{args.kappa} weighs a buddy's cross-link hops, and the offload model has one "
            "device (no hop): leave it at 0 (substitute() takes hops from Python)",
        )
    try:
        bc = BuddyConfig(
            alpha=args.alpha,
            k_max=args.k_max,
            weighted=args.weighted,
            eps=args.eps,
            warmup=args.warmup,
            warmup_weight=args.warmup_weight,
            tau=args.tau,
            tau_pct=args.tau_pct,
            temperature=args.temperature,
            gamma=args.gamma,
            beta=args.beta,
            budget_bytes=args.budget_mb * 1e6 if args.budget_mb is not None else None,
            eta=args.eta,
            kappa=args.kappa,
            diversity=args.diversity,
            unique=not args.allow_reuse,
            search=args.search,
            rho=args.rho,
        )
    except InputError as e:
        option = {"budget_bytes": "budget_mb"}.get(e.field, e.field)
        raise e.at(COMMAND_LINE, f"--{option.replace('_', '-')}") from None
    return OffloadConfig(
        policy=args.policy,
        cache_rate=args.cache_rate,
        prefetch=args.prefetch,
        prefetch_count=args.prefetch_count,
        device=args.device,
        link=args.link,
        bandwidth_gbs=args.bandwidth,
        latency_us=args.latency_us,
        scale_to=args.scale_to,
        flops=args.tflops * 1e12 if args.tflops is not None else None,
        overhead_us=args.overhead_us,
        batch=args.batch,
        seed=args.seed,
        sub_experts=args.sub_experts,
        active=args.active,
        buddy=bc,
    )


def cmd_offload(args):
    import dataclasses
    import time

    from fsedp.experiments.offload import (
        bench_substitution,
        buddy_grid,
        format_buddy,
        format_prism,
        lm_data,
        plot_tradeoff,
        prism_grid,
        run_lm,
        run_trace,
    )
    from fsedp.files import output_dir

    _check_modes(args)
    cfg = _offload_config(args)
    t0 = time.time()
    if args.replay or args.profile_device:
        return _replay(args, cfg)
    if args.bench_substitution:
        r = bench_substitution(cfg=cfg)
        st = r["step"]
        print(
            jsondoc.dumps(r)
            if args.json
            else f"Algorithm 1 on {r['tokens']} tokens, top-{r['top_k']} of {r['experts']}, "
            f"{r['substitutions']} substitutions: loop {r['loop_per_s']}/s, vectorised "
            f"{r['vectorized_per_s']}/s ({r['speedup']}x), compiled {r['compiled_per_s']}/s "
            f"({r['compiled_speedup']}x)\n"
            f"one decode step ({st['batch']} tokens x {st['layers']} layers of {st['model']}): "
            f"substitution {st['substitution_us']} us against {st['compute_ms']} ms of "
            f"compute with every expert resident ({st['share'] * 100:.3f} %)"
        )
        return 0
    if args.trace:
        from fsedp.config import EMBEDDED_TRACE

        trace = load_trace(EMBEDDED_TRACE if args.trace == "model" else args.trace)
        rows = []
        for c in args.cache_rates or [cfg.cache_rate]:
            for pf in args.prefetches or [cfg.prefetch]:
                rows.append(run_trace(trace, dataclasses.replace(cfg, cache_rate=c, prefetch=pf)))
        if args.json:
            print(jsondoc.dumps(rows))
            return 0
        print(
            f"routing-only offload on {trace.name} (fetch on demand, steps of {cfg.batch} "
            f"tokens, {_where(cfg)}, sizes of {cfg.scale_to}):\n"
        )
        print(
            "| cache rate | prefetcher | hit rate | resident hit rate | prefetch accuracy | "
            "on-demand fetches | MB moved | stall s | tokens/s "
            "|\n|---:|---|---:|---:|---:|---:|---:|---:|---:|"
        )
        for r in rows:
            print(
                f"| {r['cache_rate']} | {r['prefetch']} | {r['hit_rate']} | "
                f"{r['resident_hit_rate']} | "
                f"{r['prefetch_accuracy']} | {r['demand_fetches']} | {r['bytes_moved_mb']} | "
                f"{r['stall_s']} | {r['tokens_per_s']} |"
            )
        return 0
    model = _model(args)
    model, test, prof = lm_data(args.max_tokens, model=model, data=args.data)
    if args.grid:
        say = (lambda r: _log.info(jsondoc.dumps(r))) if args.verbose else None
        buddy = buddy_grid(model, test, prof, cfg, progress=say)
        prism = prism_grid(model, test, prof, cfg, progress=say)
        text = (
            f"Offload grid (`fsedp offload --grid --max-tokens {args.max_tokens}`, "
            f"{time.time() - t0:.0f} s, {len(test) - 1} held-out tokens)\n\n"
            "## BuddyMoE (Tables 2-4)\n"
            + format_buddy(buddy)
            + "\n\n## MoE-Prism offloading against monolithic experts\n\n"
            + format_prism(prism)
            + "\n"
        )
        if args.out:
            with output_dir(args.out, args.force) as out:
                (out / "offload.md").write_text(text)
                doc = {"buddy": buddy, "prism": prism}
                (out / "offload.json").write_text(jsondoc.dumps(doc, indent=1) + "\n")
                plot_tradeoff(buddy, prism, out / "tradeoff.png")
        print(jsondoc.dumps({"buddy": buddy, "prism": prism}) if args.json else text)
        return 0
    r = run_lm(model, test, prof, cfg)
    if args.json:
        print(jsondoc.dumps(r))
    else:
        print(
            f"{cfg.policy} at cache rate {cfg.cache_rate} on {len(test) - 1} held-out tokens: "
            f"perplexity {r['perplexity']}, {r['tokens_per_s']} tokens/s (modelled), hit rate "
            f"{r['hit_rate']}, {r['demand_fetches']} on-demand fetches, {r['prefetches']} "
            f"prefetches (accuracy {r['prefetch_accuracy']}), {r['substituted']} substituted, "
            f"{r['dropped']} dropped, {r['bytes_moved_mb']} MB moved, stall {r['stall_s']} s"
            + (f"; gates {r['gates']}" if "gates" in r else "")
        )
    return 0


def _where(cfg) -> str:
    """The link and device a report names."""
    if cfg.link is not None:
        return f"{cfg.link} link"
    return "pcie4 link" if cfg.device == DEFAULT_DEVICE else f"device {cfg.device}"


def _replay(args, cfg):
    """``--replay`` and ``--profile-device``: the model's decisions executed with torch on
    the current device, and a profile fitted from measured primitives."""
    import dataclasses

    from fsedp.experiments.replay import (
        format_replay,
        profile_device,
        replay_sizes,
        replay_trace,
        torch_device,
    )

    sizes = replay_sizes(cfg.scale_to, args.replay_scale)
    dev = torch_device()
    fitted = None
    if args.profile_device:
        from fsedp.files import check_output_file, read_text

        out = check_output_file(args.profile_device)  # refused before anything is measured
        name = FITTED_NAME if args.profile_name is None else args.profile_name
        fitted = profile_device(sizes, cfg.batch, dev, out, name=name)
        _log.info(f"wrote {out}")
        if not args.replay:
            print(jsondoc.dumps(fitted.as_dict()) if args.json else read_text(out, "yaml"), end="")
            return 0
        cfg = dataclasses.replace(cfg, device=str(out))
    from fsedp.config import EMBEDDED_TRACE

    trace = load_trace(EMBEDDED_TRACE if args.trace == "model" else args.trace)
    rows = []
    for c in args.cache_rates or [cfg.cache_rate]:
        for pf in args.prefetches or [cfg.prefetch]:
            run_cfg = dataclasses.replace(cfg, cache_rate=c, prefetch=pf)
            rows.append(
                replay_trace(
                    trace, run_cfg, sizes, dev, steps=args.replay_steps, repeat=args.replay_repeat
                )
            )
    if args.json:
        print(jsondoc.dumps({"device": str(dev), "profile": cfg.device, "rows": rows}))
    else:
        print(format_replay(trace.name, cfg, sizes, dev, rows, args.replay_scale))
    return 0


def _check_modes(args):
    """Refuse options the chosen mode would ignore (one of the LM run, ``--grid``,
    ``--trace`` and ``--bench-substitution``), before anything is loaded."""
    modes = [
        name
        for name, on in (
            ("--trace", args.trace is not None),
            ("--grid", args.grid),
            ("--bench-substitution", args.bench_substitution),
        )
        if on
    ]
    if len(modes) > 1:
        raise usage(modes[1], f"is a mode of its own: it does not combine with {modes[0]}")
    for option, value in (("--cache-rates", args.cache_rates), ("--prefetches", args.prefetches)):
        if value is not None and args.trace is None:
            raise usage(option, "is for the routing-only mode: it needs --trace")
    if args.trace is not None and args.policy != "demand":
        raise usage("--policy", f"--trace runs fetch on demand alone, not {args.policy}")
    if (args.replay or args.profile_device) and (args.grid or args.bench_substitution):
        other = "--grid" if args.grid else "--bench-substitution"
        raise usage(
            "--replay" if args.replay else "--profile-device", f"does not combine with {other}"
        )
    if args.profile_name is not None and args.profile_device is None:
        raise usage("--profile-name", "names the profile --profile-device writes: it needs one")
    if args.profile_device and args.trace is not None and not args.replay:
        raise usage("--profile-device", "with --trace it needs --replay (or leave out --trace)")
    if args.replay and args.trace is None:
        raise usage("--replay", "replays the decisions of the routing-only mode: it needs --trace")
    if not args.replay:
        if args.replay_repeat != 1:
            raise usage("--replay-repeat", "repeats the replay: it needs --replay")
        for option, value in (
            ("--replay-steps", args.replay_steps),
            ("--replay-scale", args.replay_scale != 1 or None),
        ):
            if value is not None and not args.profile_device:
                raise usage(option, "is for --replay or --profile-device")
    if args.out and not args.grid:
        raise usage("--out", "only --grid writes a folder (offload.md, offload.json, tradeoff.png)")


def _model(args):
    """The LM (``--model`` or the committed one), with the options that depend on it checked
    before any corpus or trace is read."""
    from fsedp.lm.build import need_window

    model = load_lm(args.model)
    need_window(model, "--max-tokens", args.max_tokens, "held-out test tokens")
    f = model.cfg.d_ffn
    if args.policy == "prism" and f % args.sub_experts:
        raise usage(
            "--sub-experts", f"must divide the LM's {f} neurons per expert, not {args.sub_experts}"
        )
    return model


def _prefetch_list(text):
    from fsedp.experiments.offload import PREFETCHERS

    names = text.split(",")
    bad = [n for n in names if n not in PREFETCHERS]
    if bad:
        raise usage(
            "--prefetches", f"each must be one of {', '.join(PREFETCHERS)}, not {bad[0][:40]!r}"
        )
    return names


def _rate_list(text):
    try:
        v = [float(x) for x in text.split(",")]
    except ValueError:
        raise usage("--cache-rates", f"must be comma-separated numbers, not {text!r}") from None
    if not all(0 <= x <= 1 for x in v):
        raise usage("--cache-rates", f"must be in [0, 1], not {text!r}")
    return v


def add_parsers(sub):
    # a default in words below ("default: the model's") is none the parser holds: unset
    # (None), the command works it out; every other default and range is HelpFormatter's
    from fsedp.experiments.offload import POLICIES, PREFETCHERS
    from fsedp.sw.policies.offload import links

    o = sub.add_parser(
        "offload",
        parents=[DATA_OR_EMBEDDED, JSON],
        help="offload policies (on demand, drop, random, BuddyMoE, "
        "MoE-Prism) on the project's MoE LM, or routing-only on a trace",
        description="Run an offload policy on the project's MoE LM over held-out "
        "WikiText-2 (perplexity, modelled tokens/s) or, with --trace, the "
        "routing-only figures of fetching on demand. See docs/offload.md.",
    )
    g = o.add_argument_group("run")
    g.add_argument("--policy", choices=POLICIES, default="demand", help="miss policy")
    g.add_argument(
        "--cache-rate",
        type=number("--cache-rate", 0.0, 1.0),
        default=0.5,
        help="resident share of each layer's experts c",
    )
    g.add_argument(
        "--prefetch",
        choices=PREFETCHERS,
        default="transition",
        help="prefetcher (transition: from the previous layer's experts)",
    )
    g.add_argument(
        "--prefetch-count",
        type=positive("--prefetch-count"),
        default=None,
        help="units prefetched per layer and step (default: cache capacity / 4)",
    )
    g.add_argument("--batch", type=positive("--batch"), default=16, help="tokens per step")
    g.add_argument(
        "--max-tokens",
        type=positive("--max-tokens"),
        default=16384,
        help="held-out test tokens evaluated",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of random substitution")
    g.add_argument(
        "--trace",
        default=None,
        help="routing-only mode on a trace file ('model': the embedded trace)",
    )
    g.add_argument(
        "--cache-rates", type=_rate_list, default=None, help="routing-only: several cache rates"
    )
    g.add_argument(
        "--prefetches",
        type=_prefetch_list,
        default=None,
        help="routing-only: several prefetchers, comma-separated",
    )
    g.add_argument(
        "--grid",
        action="store_true",
        help="the BuddyMoE and MoE-Prism tables at c = 0.375, 0.5, 0.75",
    )
    g.add_argument(
        "--out", default=None, help="with --grid: folder for offload.md, offload.json, tradeoff.png"
    )
    g.add_argument(
        "--bench-substitution",
        action="store_true",
        help="substitutions per second: vectorised Algorithm 1 against the plain loop",
    )
    g.add_argument("--verbose", action="store_true", help="print each grid row as it is done")
    h = o.add_argument_group("cost model")
    h.add_argument(
        "--device",
        type=device_profile("--device"),
        default=DEFAULT_DEVICE,
        help="device profile: the link and per-expert compute (a name under configs/devices "
        "or a .yaml file)",
    )
    h.add_argument(
        "--link",
        choices=sorted(links()),
        default=None,
        help="a named link instead of the device's (default: the device's); "
        + "; ".join(
            f"{k}: {v.bandwidth_gbs:g} GB/s, {v.latency_us:g} us" for k, v in links().items()
        ),
    )
    h.add_argument(
        "--bandwidth",
        type=number("--bandwidth", 1e-9),
        default=None,
        help="GB/s (default: the link's)",
    )
    h.add_argument(
        "--latency-us",
        type=number("--latency-us", 0.0),
        default=None,
        help="per transfer (default: the link's)",
    )
    h.add_argument(
        "--scale-to",
        type=model_configs("--scale-to"),
        default="deepseek-v2-lite",
        help="model config whose expert size and FLOPs are modelled",
    )
    h.add_argument(
        "--tflops",
        type=number("--tflops", 1e-9),
        default=None,
        help="expert compute rate (default: the device's)",
    )
    h.add_argument(
        "--overhead-us",
        type=number("--overhead-us", 0.0),
        default=None,
        help="launch overhead per expert and step (default: the device's)",
    )
    r = o.add_argument_group("replay on this machine's torch device (CUDA when present, else CPU)")
    r.add_argument(
        "--replay",
        action="store_true",
        help="with --trace: execute the model's decisions (copies into a real expert cache, "
        "eager SwiGLU experts) and print predicted against measured tokens/s",
    )
    r.add_argument(
        "--replay-scale",
        type=positive("--replay-scale", 1024),
        default=1,
        help="divide d_model and d_ffn of --scale-to by this (experts of 1/scale**2 the bytes) "
        "for the replay and the profile; the model then predicts those sizes",
    )
    r.add_argument(
        "--replay-steps",
        type=positive("--replay-steps"),
        default=None,
        help="replay only the first steps (default: all)",
    )
    r.add_argument(
        "--replay-repeat",
        type=positive("--replay-repeat", 100),
        default=1,
        help="run each replay this many times and report the median wall time (the spread "
        "beside it); the host store of experts is built once",
    )
    r.add_argument(
        "--profile-device",
        type=_profile_out,
        default=None,
        metavar="OUT.yaml",
        help="measure copies and expert FFNs here and write the fitted device profile; with "
        "--replay the replay is predicted with it",
    )
    r.add_argument(
        "--profile-name",
        # the rule of the profile's name field, checked before anything is measured
        type=field_value(DeviceProfile, "name", "--profile-name"),
        default=None,
        help=f"name field of the profile --profile-device writes (default: {FITTED_NAME})",
    )
    b = o.add_argument_group("BuddyMoE (Section 3)")
    b.add_argument(
        "--alpha",
        type=number("--alpha", 1e-9, 1.0),
        default=0.95,
        help="CFT coverage",
    )
    b.add_argument("--k-max", type=positive("--k-max"), default=16, help="longest buddy list")
    b.add_argument(
        "--weighted",
        action="store_true",
        help="probability-weighted co-activation counts (default: binary)",
    )
    b.add_argument("--eps", type=number("--eps", 0.0), default=1e-3, help="Laplace smoothing")
    b.add_argument("--warmup", type=int, default=0, help="profiling tokens down-weighted")
    b.add_argument(
        "--warmup-weight",
        type=number("--warmup-weight", 0.0, 1.0),
        default=0.5,
        help="their weight",
    )
    b.add_argument(
        "--tau",
        type=opt_number("--tau", 0.0, 1.0),
        default=None,
        help="TAE threshold (default none: the --tau-pct percentile per layer)",
    )
    b.add_argument(
        "--tau-pct",
        type=number("--tau-pct", 0.0, 100.0),
        default=15.0,
        help="percentile of the layer's TAE used as tau",
    )
    b.add_argument(
        "--temperature",
        type=number("--temperature", 1e-9),
        default=1.0,
        help="TAE temperature",
    )
    b.add_argument(
        "--gamma",
        type=opt_number("--gamma", 0.0, 1.0),
        default=None,
        help="probability-margin gate (default none: off)",
    )
    b.add_argument(
        "--beta",
        type=opt_number("--beta", 0.0, 1.0),
        default=None,
        help=(
            "residency gate: no substitution when this share of requested experts is off chip "
            "(default none: off)"
        ),
    )
    b.add_argument(
        "--budget-mb",
        type=opt_number("--budget-mb", 0.0),
        default=None,
        help="per-step transfer budget: substitute only beyond it (default none)",
    )
    b.add_argument(
        "--eta",
        type=number("--eta", 0.0),
        default=0.0,
        help="local router compatibility",
    )
    b.add_argument(
        "--kappa",
        type=number("--kappa", 0.0, 1.0),
        default=0.0,
        help="cross-link penalty (the offload model has one device and no hop: only 0 is "
        "taken; substitute() weighs hops from Python)",
    )
    b.add_argument(
        "--diversity",
        type=number("--diversity", 0.0, 1.0),
        default=0.5,
        help="score factor per earlier use of a buddy by the token",
    )
    b.add_argument(
        "--allow-reuse",
        action="store_true",
        help="allow a buddy the token already uses (default: Algorithm 1 forbids it)",
    )
    b.add_argument("--search", type=positive("--search"), default=16, help="H: buddies searched")
    b.add_argument(
        "--rho",
        type=lambda t: None if t.lower() == "none" else _nonneg("--rho")(t),
        default=None,
        help="replacement budget per token (default none: unlimited)",
    )
    p = o.add_argument_group("MoE-Prism")
    p.add_argument(
        "--sub-experts",
        type=positive("--sub-experts"),
        default=4,
        help="sub-experts per expert, contiguous neuron groups",
    )
    p.add_argument(
        "--active",
        type=positive("--active"),
        default=4,
        help="sub-experts run per chosen expert, the largest activation norms",
    )
    p.add_argument(
        "--model",
        default=None,
        help="weights (default: the committed model); a `fsedp prism refactor` output makes "
        "the sub-experts its annealed partition instead of the contiguous split",
    )
    o.set_defaults(func=cmd_offload, out_kind="folder")


#: the name of a fitted profile unless ``--profile-name`` gives one
FITTED_NAME = "fitted"


def _profile_out(text):
    """Converter of ``--profile-device``: a profile file ``--device`` can load, a name
    ending in ``.yaml``/``.yml`` (whether it can be written is checked before measuring, by
    :func:`~fsedp.files.check_output_file`)."""
    if not text.strip():
        raise usage("--profile-device", "must name the profile file to write (OUT.yaml), not ''")
    if not text.endswith((".yaml", ".yml")):
        raise usage(
            "--profile-device",
            f"must end in .yaml or .yml (the name --device loads a profile by), not {text[:60]!r}",
        )
    return text


def device_profile(option: str):
    """Converter of a ``--device`` option: a profile name under ``configs/devices`` or a
    ``.yaml`` file, loaded and checked (a bad one is refused on one line naming its file and
    field); the text itself is kept."""

    def conv(text):
        from fsedp.sw.policies.device import load_device

        load_device(text, COMMAND_LINE, option)
        return text

    return conv


def _nonneg(name):
    return int_at_least(name, 0)
