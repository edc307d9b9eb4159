"""``fsedp trace ...``: routing traces (convert, statistics, synthesis, recording)."""

from fsedp.cli.common import JSON, load_trace, number, positive, trace_out
from fsedp.jsondoc import dumps


def cmd_trace_convert(args):
    from fsedp.trace.io import save_trace

    out = trace_out(args.out)
    trace = load_trace(args.input, args.format, args.num_experts)
    save_trace(trace, out)
    print(
        f"{out}: {trace.tokens} tokens x {trace.layers} layers, top-{trace.top_k} of "
        f"{trace.num_experts} experts"
        + (", with probabilities" if trace.scores is not None else "")
        + (", with token ids" if trace.token_ids is not None else "")
    )
    return 0


def cmd_trace_stats(args):
    from fsedp.files import output_dir
    from fsedp.trace.stats import format_stats, plot_stats, trace_stats

    trace = load_trace(args.input, args.format, args.num_experts)
    stats = trace_stats(trace, fit=args.fit)
    text = format_stats(stats)
    if args.out:
        with output_dir(args.out, args.force) as out:
            (out / "stats.json").write_text(dumps(stats, indent=1) + "\n")
            (out / "stats.md").write_text(text)
            plot_stats(stats, trace, out)
    if args.json:
        print(dumps(stats))
    else:
        print(
            text
            + (
                f"\nwritten: {args.out}/stats.json, stats.md, load_tail.png, stats.png"
                if args.out
                else ""
            )
        )
    return 0


def cmd_trace_synth(args):
    from fsedp.trace.io import save_trace
    from fsedp.trace.synth import MATCHED, fit

    out = trace_out(args.out, "--out")
    source = load_trace(args.like, args.format, None)
    model, info = fit(source, seed=args.seed)
    trace = model.sample(args.tokens or source.tokens, seed=args.seed)
    save_trace(trace, out)
    print(f"{out}: {trace.tokens} tokens like {source.name}; weights {info['params']}")
    print("| statistic | source | synthetic | tolerance |\n|---|---:|---:|---:|")

    def f(v):  # None: undefined on the trace (a trace without token ids, one layer)
        return "n/a" if v is None else f"{v:.3f}"

    for key, tol in MATCHED.items():
        print(f"| {key} | {f(info['source'][key])} | {f(info['synthetic'][key])} | {tol} |")
    return 0


def cmd_trace_record(args):
    from fsedp.trace.io import record_hf, save_trace

    out = trace_out(args.out, "--out")
    trace = record_hf(
        args.model,
        args.text,
        max_tokens=args.max_tokens,
        seq_len=args.seq_len,
        tokenizer_path=args.tokenizer,
    )
    save_trace(trace, out)
    print(
        f"{out}: {trace.tokens} tokens x {trace.layers} layers, top-{trace.top_k} of "
        f"{trace.num_experts} experts"
    )
    return 0


def add_parsers(sub):
    # a default in words below ("default: the model's") is none the parser holds: unset
    # (None), the command works it out; every other default and range is HelpFormatter's
    from fsedp.trace.io import FORMATS

    tr = sub.add_parser("trace", help="routing traces: convert, record, statistics, synthesis")
    tsub = tr.add_subparsers(dest="trace_cmd", required=True, parser_class=type(tr))
    fmt_help = (
        "input format (auto: .npz fsedp or FLAME by content, .jsonl, .npy); see fsedp/trace/io.py"
    )
    c = tsub.add_parser("convert", help="import a trace into the project's format (.npz)")
    c.add_argument("input")
    c.add_argument("out", metavar="OUT")
    c.add_argument("--format", choices=FORMATS, default="auto", help=fmt_help)
    c.add_argument(
        "--num-experts",
        type=positive("--num-experts"),
        default=None,
        help="experts per layer (default: largest id + 1; jsonl and npy only)",
    )
    c.set_defaults(func=cmd_trace_convert, out_kind="file")
    s = tsub.add_parser(
        "stats", parents=[JSON], help="load skew per window, co-activation, predictability"
    )
    s.add_argument("input")
    s.add_argument("--format", choices=FORMATS, default="auto", help=fmt_help)
    s.add_argument("--num-experts", type=positive("--num-experts"), default=None)
    s.add_argument(
        "--fit",
        type=number("--fit", 0.01, 0.99),
        default=0.2,
        help="share of tokens the predictors are fitted on",
    )
    s.add_argument("--out", default=None, help="folder for stats.json, stats.md and PNG plots")
    s.set_defaults(func=cmd_trace_stats, out_kind="folder")
    y = tsub.add_parser("synth", help="a seeded generator fitted to a trace, any length")
    y.add_argument("--like", required=True, help="the trace to fit")
    y.add_argument("--format", choices=FORMATS, default="auto", help=fmt_help)
    y.add_argument(
        "--tokens",
        type=positive("--tokens"),
        default=None,
        help="tokens to generate (default: as many as the source)",
    )
    y.add_argument("--seed", type=int, default=0)
    y.add_argument("--out", required=True, help="output trace (.npz)")
    y.set_defaults(func=cmd_trace_synth, out_kind="file")
    r = tsub.add_parser(
        "record", help="routing of a Hugging Face MoE model on a text (needs the 'model' extra)"
    )
    r.add_argument("--model", required=True, help="folder of a transformers MoE model")
    r.add_argument("--text", required=True, help="UTF-8 text file")
    r.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model's)")
    r.add_argument("--max-tokens", type=positive("--max-tokens"), default=4096)
    r.add_argument("--seq-len", type=positive("--seq-len"), default=256)
    r.add_argument("--out", required=True, help="output trace (.npz)")
    r.set_defaults(func=cmd_trace_record, out_kind="file")
