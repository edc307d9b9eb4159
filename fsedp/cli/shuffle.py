"""``fsedp shuffle``: Speculative MoE token and expert placement."""

from fsedp.cli.common import JSON, load_trace, number, positive, report, usage

METHODS = ("cem", "metis", "kmeans")


def _methods(text: str) -> list[str]:
    methods = [m for m in text.split(",") if m]
    if not methods or any(m not in METHODS for m in methods):
        raise usage("--methods", f"choose from {', '.join(METHODS)}, not {text[:60]!r}")
    return methods


def cmd_shuffle(args):
    import time

    from fsedp.config import EMBEDDED_TRACE
    from fsedp.experiments.shuffle import evaluate, format_report

    t0 = time.time()
    methods = args.methods  # checked by the parser, before any file is read
    emb = None
    if args.trace == "model":
        from fsedp.lm.model import MoELM

        trace = load_trace(EMBEDDED_TRACE)
        emb = MoELM.load().w["embed"]
    else:
        trace = load_trace(args.trace, args.format)
        if args.lm_embeddings:
            from fsedp.lm.model import MoELM

            emb = MoELM.load().w["embed"]
            if trace.token_ids is not None and trace.token_ids.size:
                top = int(trace.token_ids.max())
                if top >= len(emb):
                    raise usage(
                        "--lm-embeddings",
                        f"token id {top} of {args.trace} is outside the LM's vocabulary of "
                        f"{len(emb)}: the trace was not recorded with the project's LM",
                    )
    r = evaluate(
        trace,
        seeds=range(args.seed, args.seed + args.seeds),
        devices=args.devices,
        fit=args.fit,
        slack=args.slack,
        cem_iters=args.cem_iters,
        cem_samples=args.cem_samples,
        elite=args.elite,
        embeddings=emb,
        methods=methods,
    )
    text = (
        f"`fsedp shuffle {args.trace} --devices {args.devices}` ({time.time() - t0:.1f} s)\n\n"
        + format_report(r)
    )
    return report(args, r, text, "shuffle")


def add_parsers(sub):
    from fsedp.trace.io import FORMATS

    s = sub.add_parser(
        "shuffle",
        parents=[JSON],
        help="Speculative MoE: token-to-expert prediction, co-clustering "
        "(CEM, METIS, k-means), local activation rate, all-to-all volume",
    )
    s.add_argument(
        "trace",
        nargs="?",
        default="model",
        help="routing trace with token ids ('model': the embedded trace of the project's LM, "
        "with its embeddings for unseen tokens)",
    )
    s.add_argument("--format", choices=FORMATS, default="auto")
    s.add_argument(
        "--devices",
        type=positive("--devices"),
        default=4,
        help="expert-parallel devices",
    )
    s.add_argument(
        "--fit",
        type=number("--fit", 0.01, 0.99),
        default=0.2,
        help="share of tokens the tables and placements are fitted on",
    )
    s.add_argument(
        "--slack",
        type=number("--slack", 0.0, 10.0),
        default=0.1,
        help=("token-load relaxation: a device takes up to (1 + slack) of an even share"),
    )
    s.add_argument("--cem-iters", type=positive("--cem-iters"), default=20, help="CEM iterations")
    s.add_argument(
        "--cem-samples",
        type=positive("--cem-samples"),
        default=32,
        help="samples per iteration",
    )
    s.add_argument(
        "--elite",
        type=number("--elite", 1e-6, 1.0),
        default=0.1,
        help="elite fraction",
    )
    s.add_argument(
        "--methods",
        type=_methods,
        default="cem,metis,kmeans",
        help="placements to compare",
    )
    s.add_argument("--seed", type=int, default=0, help="first seed")
    s.add_argument(
        "--seeds",
        type=positive("--seeds", 30),
        default=1,
        help="seeds run from --seed on: means with 95 %% intervals and CEM's margin",
    )
    s.add_argument(
        "--lm-embeddings",
        action="store_true",
        help="a trace recorded with the project's LM (fsedp lm trace): its input embeddings "
        "give unseen token ids the table row of the nearest seen id",
    )
    s.add_argument("--out", default=None, help="folder for shuffle.json and shuffle.md")
    s.set_defaults(func=cmd_shuffle, out_kind="folder")
