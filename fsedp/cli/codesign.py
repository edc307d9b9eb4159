"""``fsedp codesign``: the FSE-DP chip with the software papers' techniques, speed on the
simulated chip and accuracy on the project's MoE LM from one set of decisions
(``docs/codesign.md``)."""

import json

from fsedp.cli.common import DATA_OR_EMBEDDED, JSON, positive, usage


def _thetas(text: str) -> list[int]:
    out = []
    for x in text.split(","):
        try:
            v = int(x)
        except ValueError:
            raise usage(
                "--theta", f"must be integers separated by commas, not {x[:20]!r}"
            ) from None
        if not 1 <= v <= 4096:
            raise usage("--theta", f"each must be in 1..4096, not {v}")
        out.append(v)
    return out


def cmd_codesign(args):
    from fsedp.config import config_path
    from fsedp.errors import COMMAND_LINE
    from fsedp.experiments.codesign import buddy_on_chip, format_buddy
    from fsedp.experiments.offload import lm_data
    from fsedp.files import write_text

    thetas = _thetas(args.theta)
    config_path("models", args.scale_to, COMMAND_LINE, "--scale-to")  # refused before work
    model, test, prof = lm_data(args.max_tokens, weights=args.model, data=args.data)
    if len(test) - 1 < max(args.tokens, model.cfg.context):
        raise usage("--max-tokens", f"{len(test) - 1} test tokens hold no whole iteration")
    doc = buddy_on_chip(
        model, test, prof, thetas=thetas, tokens=args.tokens, scale_to=args.scale_to
    )
    text = format_buddy(doc)
    out = {k: v for k, v in doc.items() if k not in ("config", "traces")}
    if args.out:
        write_text(args.out, text + "\n")
    print(json.dumps(out, indent=1) if args.json else text)
    return 0


def add_parsers(sub):
    c = sub.add_parser(
        "codesign",
        parents=[DATA_OR_EMBEDDED, JSON],
        help="the chip moving fewer bytes: BuddyMoE on the DDR path, speed and perplexity",
        description="FSE-DP on the simulated 2x2 chip with buddy substitution of cold "
        "experts, measured for tokens/s, bound and DDR bytes on the chip and for perplexity "
        "on the project's MoE LM, from one set of decisions. See docs/codesign.md.",
    )
    c.add_argument(
        "--theta",
        default="1,2,4",
        help="cold thresholds: an expert with at most theta of an iteration's tokens may "
        "be replaced by buddies (default 1,2,4)",
    )
    c.add_argument(
        "--tokens", type=positive("--tokens", 4096), default=64, help="tokens per iteration"
    )
    c.add_argument(
        "--scale-to",
        default="qwen3-30b-a3b",
        help="model config whose expert and hidden sizes the chip moves (default qwen3-30b-a3b)",
    )
    c.add_argument(
        "--max-tokens",
        type=positive("--max-tokens"),
        default=None,
        help="held-out test tokens evaluated (default: all)",
    )
    c.add_argument("--model", default=None, help="LM weights (default: the committed model)")
    c.add_argument("--out", default=None, help="also write the table to this file")
    c.set_defaults(func=cmd_codesign, out_kind="file")
