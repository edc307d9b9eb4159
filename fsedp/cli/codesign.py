"""``fsedp codesign``: the FSE-DP chip with the software papers' techniques, speed on the
simulated chip and accuracy on the project's MoE LM from one set of decisions
(``docs/codesign.md``)."""

from fsedp.cli.common import (
    DATA_OR_EMBEDDED,
    JSON,
    int_at_least,
    model_configs,
    positive,
    usage,
)
from fsedp.cli.lm import load_lm


def _ints(option: str, text: str, hi: int) -> list[int]:
    """A comma-separated list of integers in ``1..hi`` (empty: none)."""
    out = []
    for x in filter(None, text.split(",")):
        try:
            v = int(x)
        except ValueError:
            raise usage(option, f"must be integers separated by commas, not {x[:20]!r}") from None
        if not 1 <= v <= hi:
            raise usage(option, f"each must be in 1..{hi}, not {v}")
        out.append(v)
    return out


def cmd_codesign(args):
    from fsedp.cli.common import report
    from fsedp.experiments.codesign import (
        codesign,
        deployment_config,
        format_table,
        plot_tradeoff,
        techniques,
    )
    from fsedp.experiments.offload import lm_data

    # the options first, then those that depend on the LM, then the corpora
    thetas = _ints("--theta", args.theta, 4096)
    tokens = _ints("--tokens", args.tokens, 4096)
    if not tokens:
        raise usage("--tokens", "needs at least one count of tokens per iteration")
    scales = args.scale_to
    S = args.sub_experts
    budgets = _ints("--budget", args.budget, S)
    model = load_lm(args.model)  # the user's file is checked before the corpora
    if model.cfg.d_ffn % S:
        raise usage("--sub-experts", f"must divide the LM's d_ffn {model.cfg.d_ffn}, not {S}")
    for name in scales:
        M = deployment_config(model, name, tokens[0]).datapath_params().micro_slices
        if M % S:
            raise usage(
                "--sub-experts", f"must divide {name}'s {M} micro-slices per expert, not {S}"
            )
    ks = _ints("--prism", args.prism, model.cfg.top_k * S)
    need = max(max(tokens), model.cfg.context)
    if args.max_tokens is not None and args.max_tokens < need:
        raise usage(
            "--max-tokens",
            f"{args.max_tokens} test tokens: fewer than one iteration of {max(tokens)} tokens "
            f"or one window of the LM's context of {model.cfg.context}: at least {need}",
        )
    model, test, prof = lm_data(args.max_tokens, model=model, data=args.data)
    if len(test) - 1 < need:  # a short corpus (lm_data holds it to one window at least)
        raise usage(
            "--tokens",
            f"{max(tokens)} tokens per iteration: the held-out test set holds {len(test) - 1}",
        )
    cap = args.buddy_cap
    plan, cache, docs = techniques(thetas, ks, budgets, S, cap), {}, []
    for t in tokens:
        for name in scales:
            docs.append(
                codesign(
                    model, test, prof, plan, tokens=t, scale_to=name, cache=cache,
                    selector=args.selector, cap=cap,
                )
            )  # fmt: skip
    text = "\n\n".join(format_table(d) for d in docs)
    out = {
        "runs": [
            {k: v for k, v in d.items() if k not in ("config", "traces", "slices")} for d in docs
        ]
    }
    return report(args, out, text, "codesign", plot=lambda path: plot_tradeoff(docs, path))


def add_parsers(sub):
    # a default in words below ("default: the model's") is none the parser holds: unset
    # (None), the command works it out; every other default and range is HelpFormatter's
    c = sub.add_parser(
        "codesign",
        parents=[DATA_OR_EMBEDDED, JSON],
        help="the chip moving fewer bytes: BuddyMoE and MoE-Prism on the DDR path, "
        "speed and perplexity",
        description="FSE-DP on the simulated 2x2 chip with buddy substitution of cold "
        "experts and MoE-Prism sub-experts, alone and combined, measured for tokens/s, "
        "bound and DDR bytes on the chip and for perplexity on the project's MoE LM, from "
        "one set of decisions; then each with predicted pre-loads across layers, simulated, "
        "beside their upper bound. See docs/codesign.md.",
    )
    c.add_argument(
        "--theta",
        default="1,2",
        help="BuddyMoE cold thresholds: an expert with at most theta of an iteration's "
        "tokens may be replaced by buddies (empty: none)",
    )
    c.add_argument(
        "--buddy-cap",
        type=int_at_least("--buddy-cap", 0, 4096),
        default=None,
        help="BuddyMoE: save at most this many cold experts per iteration and layer, those "
        "whose moved tokens carry the least routing weight (default: no cap)",
    )
    c.add_argument(
        "--prism",
        default="6",
        help="MoE-Prism: sub-experts kept per token, of top_k x S (empty: none)",
    )
    c.add_argument(
        "--budget",
        default="3,2",
        help="MoE-Prism: sub-experts of an expert streamed per iteration, of S, the ones its "
        "tokens score highest (empty: none)",
    )
    c.add_argument(
        "--selector",
        choices=("proxy", "oracle"),
        default="proxy",
        help="MoE-Prism: rank a token's sub-experts by the gate neurons (proxy, the paper's "
        "training-free gating) or by their true activation norms (oracle: the bound for a "
        "trained router)",
    )
    c.add_argument(
        "--sub-experts",
        type=positive("--sub-experts", 64),
        default=4,
        help="MoE-Prism: sub-experts S per expert",
    )
    c.add_argument(
        "--tokens",
        default="64",
        help="tokens per iteration, one table each, comma-separated",
    )
    c.add_argument(
        "--scale-to",
        type=model_configs("--scale-to", many=True),
        default="qwen3-30b-a3b",
        help="model configs whose expert and hidden sizes the chip moves, one table each, "
        "comma-separated",
    )
    c.add_argument(
        "--max-tokens",
        type=positive("--max-tokens"),
        default=None,
        help="held-out test tokens evaluated (default: all)",
    )
    c.add_argument("--model", default=None, help="LM weights (default: the committed model)")
    c.add_argument(
        "--out",
        default=None,
        help="also write codesign.md, codesign.json and the trade-off plot codesign.png here",
    )
    c.set_defaults(func=cmd_codesign, out_kind="folder")
