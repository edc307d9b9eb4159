"""``fsedp lm ...`` and ``fsedp trace ...``: the project's MoE LM and routing workloads."""

import json
import sys
from pathlib import Path

from .errors import InputError

__all__ = ["add_parsers"]


class UsageError(InputError):
    def __init__(self, field, reason):
        super().__init__("<command line>", field, reason)


def _positive(name):
    def conv(text):
        try:
            v = int(text)
        except ValueError:
            raise UsageError(name, f"must be an integer, not {text!r}") from None
        if v < 1:
            raise UsageError(name, f"must be at least 1, not {v}")
        return v
    return conv


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


# -- fsedp lm -----------------------------------------------------------------------------
def cmd_lm_train(args):
    from .lm.build import train_command
    from .lm.config import LMConfig
    from .lm.train import TrainConfig

    cfg = LMConfig(layers=args.layers, experts=args.experts, top_k=args.top_k,
                   d_model=args.d_model, d_ffn=args.d_ffn, shared_experts=args.shared_experts,
                   vocab=args.vocab)
    tc = TrainConfig(steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed, aux=args.aux)
    info = train_command(Path(args.out), cfg, tc, log=lambda s: print(s, flush=True))
    print(f"wrote {args.out}/moe_lm.npz, tokenizer.json, training.json ({info['seconds']} s)")
    return 0


def cmd_lm_eval(args):
    from .lm.build import evaluate

    res = evaluate(args.weights, args.tokenizer, args.max_tokens)
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
    trace = record_routing(args.max_tokens, args.weights, args.tokenizer)
    save_trace(trace, out)
    print(f"{out}: {trace.tokens} tokens x {trace.layers} layers, top-{trace.top_k} of "
          f"{trace.num_experts} experts")
    return 0


def add_parsers(sub):
    from .trace_io import FORMATS

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
    t.set_defaults(func=cmd_lm_train)
    e = lsub.add_parser("eval", help="held-out WikiText-2 test perplexity against n-gram baselines")
    e.add_argument("--weights", default=None, help="weights .npz (default: the committed model)")
    e.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the committed one)")
    e.add_argument("--max-tokens", type=_positive("--max-tokens"), default=None,
                   help="evaluate on the first N test tokens only")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_lm_eval)
    r = lsub.add_parser("trace", help="record the model's routing on held-out WikiText-2 test")
    r.add_argument("--out", required=True, help="output trace (.npz)")
    r.add_argument("--max-tokens", type=_positive("--max-tokens"), default=8192,
                   help="test tokens to route (default 8192)")
    r.add_argument("--weights", default=None, help="weights .npz (default: the committed model)")
    r.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the committed one)")
    r.set_defaults(func=cmd_lm_trace)
