"""``fsedp prism ...``: MoE-Prism refactoring into sub-experts, the router fine-tuning and the
quality curve."""

import numpy as np

from fsedp.cli.common import (
    DATA,
    DATA_OR_EMBEDDED,
    JSON,
    int_at_least,
    number,
    positive,
    report,
    usage,
)
from fsedp.cli.lm import load_lm, need_torch
from fsedp.lm.finetune import SCHEDULES, FinetuneConfig  # no torch at import
from fsedp.log import logger

_log = logger("prism")

#: ``fsedp prism refactor``'s sub-experts S and annealing proposals, also ``prism curve``'s
#: when it refactors itself
REFACTOR_S, REFACTOR_ITERS = 4, 3000


def cmd_prism_refactor(args):
    import time

    from fsedp.experiments.offload import lm_data
    from fsedp.experiments.prism import refactor_model
    from fsedp.lm.build import need_window

    if args.out and not args.out.endswith(".npz"):
        raise usage("--out", f"the refactored model is an .npz file, not {args.out!r}")
    if args.objective_k >= args.sub_experts:
        raise usage(
            "--objective-k",
            f"must be below --sub-experts = {args.sub_experts}, not {args.objective_k}",
        )
    t0 = time.time()
    model = load_lm(args.model)  # the user's file is checked first
    _sub_experts(model, args.sub_experts, args.gates)
    need_window(model, "--profile-tokens", args.profile_tokens, "profiling tokens")
    model, _, prof = lm_data(1, args.profile_tokens, data=args.data, model=model, evaluate=False)
    ref, part, report, _ = refactor_model(
        model,
        prof,
        S=args.sub_experts,
        K=args.objective_k,
        g=args.gates,
        top_p=args.top_p,
        t0=args.t0,
        cooling=args.cooling,
        iters=args.iters,
        seed=args.seed,
    )
    if not report:
        raise usage(
            "--profile-tokens",
            f"{args.profile_tokens} tokens activate no expert "
            f"often enough to refactor it; profile more tokens",
        )
    ref.save(args.out)
    c = np.array([r["cost"] for r in report])
    print(
        f"{args.out}: {len(report)} experts refactored into {args.sub_experts} sub-experts "
        f"({time.time() - t0:.0f} s); objective (sum of the {args.sub_experts - args.objective_k} "
        f"smallest sub-expert norms) contiguous {c[:, 0].sum():.1f}, greedy {c[:, 1].sum():.1f}, "
        f"annealed {c[:, 2].sum():.1f} ({(1 - c[:, 2].sum() / c[:, 0].sum()) * 100:.1f} % below "
        "contiguous)"
    )
    return 0


def _sub_experts(model, S: int, gates: int | None = None, option: str = "--sub-experts"):
    """Refuse ``S`` sub-experts that do not split the model's experts evenly, and more gate
    neurons than a sub-expert holds."""
    f = model.cfg.d_ffn
    if f % S:
        raise usage(option, f"{f} neurons do not split into {S}")
    if gates is not None and gates > f // S:
        raise usage(
            "--gates", f"a sub-expert of {f // S} neurons has at most {f // S}, not {gates}"
        )


def _refactored(path: str, option: str = "--refactored"):
    """A refactored model (checked: it holds a MoE-Prism partition) and its partition."""
    from fsedp.sw.policies.prism import LinearGate, Partition

    ref = load_lm(path)
    part = Partition.of(ref)
    if part is None:
        raise usage(option, f"{path} holds no MoE-Prism partition (prism.gates)")
    LinearGate.of(ref)  # a stored gate is checked now, before any work
    return ref, part


def cmd_prism_finetune(args):
    import time

    from fsedp import jsondoc
    from fsedp.lm.build import _need_data, train_stream
    from fsedp.lm.text import TRAIN_FILES, data_dir, load_tokenizer
    from fsedp.sw.policies.prism import LinearGate, linear_gate_init

    if not args.out.endswith(".npz"):
        raise usage("--out", f"the fine-tuned model is an .npz file, not {args.out!r}")
    need_torch("prism finetune")
    ref, part = _refactored(args.refactored)
    root = data_dir(args.data)
    for rel in TRAIN_FILES:  # before the tokenizer is loaded
        _need_data(root, rel)
    from fsedp.lm.finetune import finetune_router

    t0 = time.time()
    tok = load_tokenizer()
    if tok.get_vocab_size() != ref.cfg.vocab:
        raise usage(
            "--refactored",
            f"{args.refactored} has a vocabulary of {ref.cfg.vocab} entries, the "
            f"tokenizer {tok.get_vocab_size()}",
        )
    ids = train_stream(tok, root)
    if len(ids) < ref.cfg.context + 2:
        raise usage(
            "--data",
            f"{len(ids)} training tokens in {root}/text: fewer than one window of "
            f"{ref.cfg.context + 1}",
        )
    fc = FinetuneConfig(
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        schedule=args.schedule,
        distill=args.distill,
        seed=args.seed,
    )
    say = _log.info if args.verbose else (lambda s: None)
    gate, history = finetune_router(
        ref, LinearGate(*linear_gate_init(ref, part.S), part.S), ids, fc, say
    )
    gate.store(ref)
    ref.extra["prism.finetune"] = np.asarray(
        jsondoc.dumps({"config": fc.as_dict(), "train_tokens": int(len(ids)), "history": history})
    )
    ref.save(args.out)
    print(
        f"{args.out}: linear gate over {ref.cfg.experts} x {part.S} sub-experts per layer "
        f"fine-tuned, {args.steps} steps of {args.batch} x {ref.cfg.context} tokens, "
        f"{args.schedule} budgets, distillation {args.distill} ({time.time() - t0:.0f} s); "
        "final training cross-entropy "
        f"{history[-1]['train_ce']}"
    )
    return 0


def cmd_prism_curve(args):
    import time

    from fsedp.experiments.offload import lm_data
    from fsedp.experiments.prism import operating_points, plot_curve, quality_curve, refactor_model
    from fsedp.lm.build import need_window
    from fsedp.sw.policies.prism import profile_activations, refactor

    t0 = time.time()
    ref = None
    if args.refactored:
        for option, value in (("--sub-experts", args.sub_experts), ("--iters", args.iters)):
            if value is not None:
                raise usage(option, "is for refactoring now: --refactored is refactored already")
        ref, part = _refactored(args.refactored)  # the user's file is checked before the rest
        S = part.S
    model = load_lm()
    if ref is None:
        S = REFACTOR_S if args.sub_experts is None else args.sub_experts
        _sub_experts(model, S)
    elif ref.cfg.vocab != model.cfg.vocab:
        raise usage(
            "--refactored",
            f"{args.refactored} has a vocabulary of {ref.cfg.vocab} entries, the committed "
            f"LM and its tokenizer {model.cfg.vocab}",
        )
    need_window(model, "--max-tokens", args.max_tokens, "held-out test tokens")
    need_window(model, "--profile-tokens", args.profile_tokens, "profiling tokens")
    model, test, prof = lm_data(args.max_tokens, args.profile_tokens, data=args.data, model=model)
    if ref is None:
        iters = REFACTOR_ITERS if args.iters is None else args.iters
        ref, _, _, _ = refactor_model(model, prof, S=S, iters=iters)
    naive, _, _ = refactor(model, profile_activations(model, prof, 2048), S=S, contiguous=True)
    say = (lambda K, row: _log.info(f"K = {K}: {row}")) if args.verbose else None
    curve = quality_curve(model, ref, naive, test, say)
    ops = [operating_points(curve, s) for s in args.stable]
    cols = [
        ("original", "original"),
        ("contiguous", "contiguous split, proxy"),
        ("refactored", "refactored, proxy"),
        ("refactored_oracle", "refactored, oracle"),
        ("linear", "linear gate, untrained"),
        ("finetuned", "linear gate, fine-tuned"),
    ]
    cols = [(key, name) for key, name in cols if key in curve]
    lines = [
        f"MoE-Prism quality curve (`fsedp prism curve --max-tokens {args.max_tokens}`, "
        f"{time.time() - t0:.0f} s, {len(test) - 1} held-out tokens; full model {curve['full']})",
        "",
        "| active sub-experts K | " + " | ".join(name for _, name in cols) + " |",
        "|---:|" + "---:|" * len(cols),
    ]
    for K in range(1, model.cfg.top_k * S + 1):
        lines.append(
            f"| {K} | " + " | ".join(str(curve[key].get(K, "-")) for key, _ in cols) + " |"
        )
    sel = [(key, name) for key, name in cols if key in ops[0]["ratios"]]
    lines += [
        "",
        "| stable within | original points | "
        + " | ".join(f"{name} points (ratio)" for _, name in sel)
        + " |",
        "|---:|---|" + "---|" * len(sel),
    ]
    for o in ops:
        lines.append(
            f"| {o['stable']}x ({o['limit']}) | {o['original']} | "
            + " | ".join(f"{o[key]} ({o['ratios'][key]})" for key, _ in sel)
            + " |"
        )
    text = "\n".join(lines) + "\n"
    return report(
        args,
        {"curve": curve, "operating_points": ops},
        text,
        "curve",
        plot=lambda path: plot_curve(curve, path),
    )


def add_parsers(sub):
    # a default in words below ("default: the model's") is none the parser holds: unset
    # (None), the command works it out; every other default and range is HelpFormatter's
    pr = sub.add_parser(
        "prism",
        help="MoE-Prism: refactor the MoE LM into sub-experts, fine-tune their router, "
        "quality curve",
    )
    psub = pr.add_subparsers(dest="prism_cmd", required=True, parser_class=type(pr))
    r = psub.add_parser(
        "refactor",
        parents=[DATA_OR_EMBEDDED],
        help="partition every expert's neurons into sub-experts "
        "(greedy + simulated annealing) and pick gate neurons",
    )
    r.add_argument("--out", required=True, help="refactored model (.npz)")
    r.add_argument(
        "--model", default=None, help="weights to refactor (default: the committed model)"
    )
    r.add_argument("--sub-experts", type=positive("--sub-experts"), default=REFACTOR_S, help="S")
    r.add_argument(
        "--objective-k",
        type=positive("--objective-k"),
        default=2,
        help="sub-experts kept in the objective",
    )
    r.add_argument(
        "--gates",
        type=positive("--gates"),
        default=4,
        help="gate neurons per sub-expert",
    )
    r.add_argument(
        "--top-p",
        type=number("--top-p", 1e-6, 1.0),
        default=0.1,
        help="share of a token's neurons counted active for co-activation",
    )
    r.add_argument(
        "--t0",
        type=number("--t0", 0.0),
        default=0.01,
        help="initial annealing temperature, relative to the initial cost",
    )
    r.add_argument(
        "--cooling",
        type=number("--cooling", 1e-6, 1.0),
        default=0.999,
        help="per proposal",
    )
    r.add_argument(
        "--iters",
        type=int_at_least("--iters", 0),
        default=REFACTOR_ITERS,
        help="proposals per expert",
    )
    r.add_argument("--seed", type=int, default=0)
    r.add_argument(
        "--profile-tokens",
        type=positive("--profile-tokens"),
        default=16384,
        help="calibration tokens from WikiText-2 validation",
    )
    r.set_defaults(func=cmd_prism_refactor, out_kind="file")
    f = psub.add_parser(
        "finetune",
        parents=[DATA],
        help="train a linear gate over the sub-experts (router only, curriculum over K; "
        "needs torch, the 'model' extra)",
    )
    f.add_argument("--refactored", required=True, help="a `fsedp prism refactor` model (.npz)")
    f.add_argument("--out", required=True, help="the model with its fine-tuned gate (.npz)")
    fd = FinetuneConfig()  # the defaults
    f.add_argument(
        "--steps",
        type=positive("--steps"),
        default=fd.steps,
        help="training steps",
    )
    f.add_argument(
        "--batch",
        type=positive("--batch"),
        default=fd.batch,
        help="windows per step",
    )
    f.add_argument(
        "--lr",
        type=number("--lr", 1e-8, 1.0),
        default=fd.lr,
        help="peak learning rate",
    )
    f.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=fd.schedule,
        help="the curriculum over the budget K (increasing is the paper's)",
    )
    f.add_argument(
        "--distill",
        type=number("--distill", 0.0, 1e6),
        default=fd.distill,
        help="weight of the oracle-distillation term (our addition; 0 is the paper's "
        "cross-entropy alone)",
    )
    f.add_argument("--seed", type=int_at_least("--seed", 0), default=fd.seed, help="seed")
    f.add_argument("--verbose", action="store_true", help="log the training loss")
    f.set_defaults(func=cmd_prism_finetune, out_kind="file")
    c = psub.add_parser(
        "curve",
        parents=[DATA_OR_EMBEDDED, JSON],
        help="perplexity against active sub-experts; operating points",
    )
    c.add_argument("--refactored", default=None, help="a refactored model (default: refactor now)")
    c.add_argument(
        "--sub-experts",
        type=positive("--sub-experts"),
        default=None,
        help="S when refactoring now (default: as prism refactor; not with --refactored)",
    )
    c.add_argument(
        "--iters",
        type=int_at_least("--iters", 0),
        default=None,
        help="annealing proposals when refactoring now (default: as prism refactor; not with "
        "--refactored)",
    )
    c.add_argument(
        "--max-tokens",
        type=positive("--max-tokens"),
        default=8192,
        help="held-out test tokens",
    )
    c.add_argument("--profile-tokens", type=positive("--profile-tokens"), default=16384)
    c.add_argument(
        "--stable",
        type=lambda t: [number("--stable", 1.0, 100.0)(x) for x in t.split(",")],
        default=[1.5, 2.0],
        help="perplexity ratios to the full model that count as stable",
    )
    c.add_argument("--out", default=None, help="folder for curve.md, curve.json, curve.png")
    c.add_argument("--verbose", action="store_true")
    c.set_defaults(func=cmd_prism_curve, out_kind="folder")
