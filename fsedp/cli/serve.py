"""``fsedp serve``: MoE-Prism QoS serving against FIFO and FullBatch."""

from fsedp.cli.common import JSON, model_configs, number, opt_number, positive, report, usage
from fsedp.cli.offload import device_profile
from fsedp.sw.policies.device import DEFAULT_DEVICE


def cmd_serve(args):
    import time

    from fsedp.experiments.serve import format_rows, run

    t0 = time.time()
    cont = args.batching == "continuous"
    if cont and args.policy == "fullbatch":
        raise usage("--policy", "fullbatch waits for full batches: it has no continuous form")
    every = ["qos", "fifo"] if cont else ["qos", "fifo", "fullbatch"]
    policies = every if args.policy == "all" else [args.policy]
    loads = ["low", "medium", "high"] if args.load == "all" else [args.load]
    rows = run(
        policies,
        loads,
        duration=args.duration,
        max_batch=args.max_batch,
        timeout=args.timeout,
        slo=args.slo,
        scale_to=args.scale_to,
        curve_path=args.curve,
        gate=args.gate,
        seed=args.seed,
        batching=args.batching,
        device=args.device,
        flops=args.tflops * 1e12 if args.tflops is not None else None,
        bandwidth=args.bandwidth * 1e9 if args.bandwidth is not None else None,
    )
    from fsedp.sw.policies.device import load_device

    dev = load_device(args.device)
    tflops = args.tflops if args.tflops is not None else dev.tflops
    gbs = args.bandwidth if args.bandwidth is not None else dev.memory_gbs
    text = (
        f"Serving (`fsedp serve --policy {args.policy} --load {args.load} --max-batch "
        f"{args.max_batch} --batching {args.batching} --gate {args.gate}`, "
        f"{time.time() - t0:.1f} s; "
        f"{args.duration:g} s of Poisson arrivals, "
        f"{args.scale_to} on {tflops:g} TFLOPS / {gbs:g} GB/s"
        + (f", device {args.device}" if args.device != DEFAULT_DEVICE else "")
        + ")\n\n"
        + format_rows(rows)
        + "\n"
    )
    return report(args, rows, text, "serve")


def add_parsers(sub):
    # a default in words below ("default: the model's") is none the parser holds: unset
    # (None), the command works it out; every other default and range is HelpFormatter's
    s = sub.add_parser(
        "serve",
        parents=[JSON],
        help="MoE-Prism QoS scheduling against FIFO and FullBatch on a Poisson workload",
        description="Serve a Poisson workload with quality "
        "floors through one instance; see docs/serving.md.",
    )
    s.add_argument(
        "--policy",
        choices=["qos", "fifo", "fullbatch", "all"],
        default="all",
        help="scheduler",
    )
    s.add_argument(
        "--load",
        choices=["low", "medium", "high", "all"],
        default="all",
        help="offered load: 0.4, 0.7, 1.3 x FIFO's capacity at full quality",
    )
    s.add_argument(
        "--batching",
        choices=["static", "continuous"],
        default="static",
        help="static batches run to completion, or continuous batching: requests join and "
        "leave the running batch at every step",
    )
    s.add_argument(
        "--duration",
        type=number("--duration", 1.0, 86_400.0),
        default=300.0,
        help="seconds of arrivals",
    )
    s.add_argument("--max-batch", type=positive("--max-batch"), default=32, help="largest batch")
    s.add_argument(
        "--timeout",
        type=number("--timeout", 0.0),
        default=2.0,
        help="timeout trigger, seconds a request may wait",
    )
    s.add_argument(
        "--slo",
        type=opt_number("--slo", 0.0),
        default=None,
        help="end-to-end latency SLO in seconds (default: 3 x a full batch at full quality)",
    )
    s.add_argument(
        "--scale-to",
        type=model_configs("--scale-to"),
        default="mixtral-8x7b",
        help="model config whose sizes the performance model uses",
    )
    s.add_argument(
        "--device",
        type=device_profile("--device"),
        default=DEFAULT_DEVICE,
        help="device profile: the accelerator's compute rate, memory bandwidth and step "
        "launch (a name under configs/devices or a .yaml file)",
    )
    s.add_argument(
        "--tflops",
        type=number("--tflops", 1e-9),
        default=None,
        help="compute rate (default: the device's)",
    )
    s.add_argument(
        "--bandwidth",
        type=number("--bandwidth", 1e-9),
        default=None,
        help="memory GB/s (default: the device's)",
    )
    s.add_argument(
        "--curve",
        default=None,
        help="quality curve JSON of `fsedp prism curve` (default: the committed model's)",
    )
    s.add_argument(
        "--gate",
        choices=["proxy", "finetuned"],
        default="proxy",
        help="MoE-Prism gate whose quality QoS serves with: proxy gating or the fine-tuned "
        "linear gate (needs a --curve of a `fsedp prism finetune` model)",
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default=None, help="folder for serve.json and serve.md")
    s.set_defaults(func=cmd_serve, out_kind="folder")
