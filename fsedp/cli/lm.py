"""``fsedp lm ...``: the project's MoE language model (train, evaluate, record its routing)."""

from fsedp import jsondoc
from fsedp.cli.common import DATA, JSON, number, positive, trace_out, usage
from fsedp.errors import COMMAND_LINE, InputError


def load_lm(path=None):
    """:meth:`MoELM.load <fsedp.lm.model.MoELM.load>` of a user's weights (default: the
    committed model), a refusal on its one line alone."""
    from fsedp.lm.model import MoELM

    return MoELM.load(path)


def need_torch(command: str):
    """Refuse, before any file is read, a command that trains without torch installed."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise usage(command, "needs torch, the 'model' extra: pip install 'fsedp[model]'")


def cmd_lm_train(args):
    from fsedp.lm.build import train_command
    from fsedp.lm.config import LMConfig
    from fsedp.lm.train import TrainConfig

    try:
        cfg = LMConfig(
            layers=args.layers,
            experts=args.experts,
            top_k=args.top_k,
            d_model=args.d_model,
            d_ffn=args.d_ffn,
            shared_experts=args.shared_experts,
            vocab=args.vocab,
        )
    except InputError as e:  # the option the user wrote, not the config it makes
        field = {"heads": "d_model"}.get(e.field, e.field)  # the heads are fixed at 4
        raise e.at(COMMAND_LINE, f"--{field.replace('_', '-')}") from None
    need_torch("lm train")
    tc = TrainConfig(steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed, aux=args.aux)
    from fsedp.files import output_dir
    from fsedp.log import logger

    with output_dir(args.out, args.force) as staged:  # progress lines: logging, on stderr
        info = train_command(staged, cfg, tc, log=logger("lm").info, data=args.data)
    print(f"wrote {args.out}/moe_lm.npz, tokenizer.json, training.json ({info['seconds']} s)")
    return 0


def cmd_lm_eval(args):
    from fsedp.lm.build import evaluate

    res = evaluate(args.weights, args.tokenizer, args.max_tokens, data=args.data)
    if args.json:
        print(jsondoc.dumps(res))
    else:
        print(
            f"held-out WikiText-2 test, {res['tokens']} tokens: MoE LM perplexity "
            f"{res['moe_lm']}, bigram {res['bigram']}, unigram {res['unigram']} "
            f"({res['parameters']} parameters, {res['eval_seconds']} s)"
        )
    return 0


def cmd_lm_trace(args):
    from fsedp.lm.build import record_routing
    from fsedp.trace.io import save_trace

    out = trace_out(args.out, "--out")
    trace = record_routing(args.max_tokens, args.weights, args.tokenizer, data=args.data)
    save_trace(trace, out)
    print(
        f"{out}: {trace.tokens} tokens x {trace.layers} layers, top-{trace.top_k} of "
        f"{trace.num_experts} experts"
    )
    return 0


def add_parsers(sub):
    # a default in words below ("default: the model's") is none the parser holds: unset
    # (None), the command works it out; every other default and range is HelpFormatter's
    lm = sub.add_parser("lm", help="the project's small MoE language model: train, evaluate")
    lsub = lm.add_subparsers(dest="lm_cmd", required=True, parser_class=type(lm))
    t = lsub.add_parser(
        "train", parents=[DATA], help="train tokenizer and model (needs torch: the 'model' extra)"
    )
    t.add_argument("--out", default="build/lm", help="output folder")
    t.add_argument("--steps", type=positive("--steps"), default=3200, help="optimizer steps")
    t.add_argument("--batch", type=positive("--batch"), default=24, help="sequences per step")
    t.add_argument(
        "--lr",
        type=number("--lr", 0.0, 1.0),
        default=3e-3,
        help="peak learning rate",
    )
    t.add_argument(
        "--aux",
        type=number("--aux", 0.0, 10.0),
        default=0.03,
        help="weight of the load-balancing loss",
    )
    t.add_argument("--seed", type=int, default=0, help="seed of data order and initialisation")
    t.add_argument("--layers", type=positive("--layers"), default=4, help="transformer layers")
    t.add_argument(
        "--experts",
        type=positive("--experts"),
        default=16,
        help="routed experts per layer",
    )
    t.add_argument("--top-k", type=positive("--top-k"), default=2, help="experts per token")
    t.add_argument("--d-model", type=positive("--d-model"), default=128, help="hidden size")
    t.add_argument("--d-ffn", type=positive("--d-ffn"), default=128, help="neurons per expert")
    t.add_argument("--shared-experts", type=int, default=0, help="always-on experts")
    t.add_argument("--vocab", type=positive("--vocab"), default=2048, help="BPE vocabulary")
    t.set_defaults(func=cmd_lm_train, out_kind="folder")
    e = lsub.add_parser(
        "eval",
        parents=[DATA, JSON],
        help="held-out WikiText-2 test perplexity against n-gram baselines",
    )
    e.add_argument("--weights", default=None, help="weights .npz (default: the committed model)")
    e.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the committed one)")
    e.add_argument(
        "--max-tokens",
        type=positive("--max-tokens"),
        default=None,
        help="evaluate on the first N test tokens only",
    )
    e.set_defaults(func=cmd_lm_eval)
    r = lsub.add_parser(
        "trace", parents=[DATA], help="record the model's routing on held-out WikiText-2 test"
    )
    r.add_argument("--out", required=True, help="output trace (.npz)")
    r.add_argument(
        "--max-tokens",
        type=positive("--max-tokens"),
        default=8192,
        help="test tokens to route",
    )
    r.add_argument("--weights", default=None, help="weights .npz (default: the committed model)")
    r.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the committed one)")
    r.set_defaults(func=cmd_lm_trace, out_kind="file")
