"""``fsedp run``, ``fsedp sweep``, ``fsedp bench``: the simulator's commands (the main job,
paper figures as sweeps, the simulator's speed)."""

import os
import time
from pathlib import Path

from fsedp.cli.common import (
    CONFIG,
    JSON,
    add_force,
    emit,
    invoked,
    load_config,
    positive,
    require_simulator,
    usage,
    write_output,
)
from fsedp.config import MAX_TOKENS_PER_ITERATION, config_path, config_to_dict
from fsedp.errors import COMMAND_LINE
from fsedp.files import build_dir, check_output_file, check_output_folder, output_folder


def cmd_run(args):
    """The main job: EP, Hydra and FSE-DP side by side on the run config's workload."""
    set_streaming(args)
    from fsedp.sim.run import (
        DEFAULT_STRATEGIES,
        STRATEGIES,
        format_table,
        run_experiment,
        summarize,
        write_report,
    )

    if args.config:
        from fsedp.files import read_yaml

        if "experiment" in read_yaml(args.config):
            return _run_experiment_file(args)
    for option, given in (
        ("--engine", args.engine != "local"),
        ("--address", args.address is not None),
    ):
        if given:
            raise usage(option, "applies to experiment files (experiment: sweep or grid)")
    if args.trace_layers is not None and args.trace_events is None:
        raise usage("--trace-layers", "needs --trace-events FILE.json")
    cfg = load_config(args)
    strategies = (
        [x.strip() for x in args.strategies.split(",") if x.strip()]
        if args.strategies is not None
        else list(DEFAULT_STRATEGIES)
    )
    bad = [x for x in strategies if x not in STRATEGIES]
    if bad or not strategies:
        raise usage(
            "--strategies",
            f"unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(STRATEGIES)}",
        )
    out = check_output_folder(
        args.out or build_dir("run", Path(cfg.source).stem.strip("<>")), args.force
    )
    events_file, trace_layers = _trace_events_option(args, cfg, out)
    check = None
    if args.scheduler == "rtl":
        require_simulator("verilator")
        from fsedp.sim.rtl_check import RTLSchedulerCheck

        check = RTLSchedulerCheck(cfg, build_dir("run-rtl"))
    t0 = time.time()
    run = run_experiment(
        cfg,
        strategies,
        n_iter=args.iterations,
        layers=args.layers,
        progress=not args.json,
        on_layer=check.record if check else None,
        workers=args.workers,
        trace_layers=trace_layers,
    )
    summary = summarize(run)
    doc = {"config": config_to_dict(cfg), "summary": summary, "wall_s": round(time.time() - t0, 1)}
    if check is not None:
        doc["rtl_check"] = check.finish()
    command = invoked("run")
    doc["report"] = write_report(run, summary, out, command, force=args.force)
    title = (
        f"{cfg.model.name} on {cfg.hardware.name}: {cfg.scenario.tokens_per_iteration} tokens "
        f"per iteration, {args.iterations} iteration(s) x {len(run['layers']) // args.iterations} "
        f"MoE layers (simulated, golden models)"
    )
    text = format_table(summary, title) + f"\nreport: {out}/ (summary.json, report.md, *.png)"
    if events_file is not None:
        doc["trace_events"] = _write_trace_events(run, events_file, command)
        text += f"\ntrace events: {events_file} (open in ui.perfetto.dev or chrome://tracing)"
    if check is not None:
        rc = doc["rtl_check"]
        text += (
            f"\nscheduler RTL (Verilator) vs golden model: {rc['layers']} layers, "
            f"{rc['beats']} decisions, {'AGREE' if rc['mismatches'] == 0 else 'DISAGREE'}"
        )
        if rc["first_mismatch"]:
            text += f"\n  first difference: {rc['first_mismatch']}"
    emit(args, doc, text)
    return 0 if check is None or doc["rtl_check"]["mismatches"] == 0 else 1


def _trace_events_option(args, cfg, out: Path):
    """``--trace-events FILE`` and ``--trace-layers N``, checked before any work: the file
    can be written (not a folder, not a link, not inside the report folder, which is
    replaced as a whole) and ``N`` layers exist in an iteration.  ``(path or None,
    layers to trace)``."""
    if args.trace_events is None:
        return None, 0
    if not args.trace_events.strip():
        raise usage("--trace-events", "must not be empty")
    path = check_output_file(args.trace_events)
    try:
        inside = path.resolve().is_relative_to(Path(out).resolve())
    except (OSError, RuntimeError):
        inside = False
    if inside:
        raise usage(
            "--trace-events",
            f"{path} is inside the report folder {out}, which each run replaces: name a file "
            "outside it",
        )
    n = args.trace_layers or 1
    per_iteration = args.layers or cfg.model.layers
    if n > per_iteration:
        raise usage(
            "--trace-layers",
            f"{n} layers asked, an iteration has {per_iteration} (--layers or the model's)",
        )
    return path, n


def _write_trace_events(run: dict, path: Path, command: str) -> str:
    """The traced layers of ``run`` in the Trace Event Format (:mod:`fsedp.sim.trace_events`),
    checked, written all at once."""
    from fsedp import jsondoc
    from fsedp.files import write_text
    from fsedp.sim.trace_events import check_trace_events, trace_events

    idx = run["traced"]
    doc = trace_events(
        run["setup"],
        [run["layers"][i] for i in idx],
        {s: [rs[i] for i in idx] for s, rs in run["results"].items()},
        other={"command": command},
    )
    check_trace_events(doc)
    write_text(path, jsondoc.dumps(doc, separators=(",", ":")))
    return str(path)


def _executor(args) -> dict:
    """The sweep executor's options (``--engine``, ``--address``, ``--workers``, ``--cache``,
    ``--no-cache``) for :func:`fsedp.sim.executor.run_points`."""
    from fsedp.sim.executor import PointCache, default_cache_dir

    for option, value in (("--address", args.address), ("--cache", args.cache)):
        if value is not None and not value.strip():
            raise usage(option, "must not be empty")
    if args.address and args.engine != "ray":
        raise usage("--address", "needs --engine ray")
    if args.cache and args.no_cache:
        raise usage("--cache", "--cache and --no-cache exclude each other")
    root = None
    if not args.no_cache:
        root = output_folder(args.cache or default_cache_dir())
    return dict(
        engine=args.engine,
        address=args.address,
        workers=args.workers,
        cache=PointCache(root),
    )


def _run_experiment_file(args):
    """``fsedp run --config configs/experiments/figN.yaml``: a paper figure as a sweep."""
    from fsedp.files import read_yaml
    from fsedp.sim.sweep import load_experiment, load_grid, run_experiment_file, run_grid

    kind = read_yaml(args.config).get("experiment")
    for option, value in (
        ("--trace-events", args.trace_events),
        ("--trace-layers", args.trace_layers),
    ):
        if value is not None:
            raise usage(option, "applies to a run config, not to an experiment file")
    if args.out:
        check_output_file(args.out)
    t0 = time.time()
    if kind == "grid":
        exp = load_grid(args.config)
        rows, table = run_grid(exp, progress=not args.json, **_executor(args))
        what = "grid over " + ", ".join(exp["vary"])
    else:
        exp = load_experiment(args.config)
        rows, table = run_experiment_file(exp, progress=not args.json, **_executor(args))
        what = exp["table"]
    text = (
        f"Figure {exp['figure']} ({what}), `fsedp run --config {args.config}`, "
        f"{time.time() - t0:.0f} s:\n\n{table}"
    )
    if args.out:
        write_output(args.out, text)
    emit(args, {"experiment": exp, "rows": rows, "table": table}, text)
    return 0


def cmd_sweep(args):
    from fsedp.sim.sweep import TABLE1, figure9, format_figure9

    set_streaming(args)
    conv = positive("--tokens", MAX_TOKENS_PER_ITERATION)  # the run config's range
    tokens = [conv(x) for x in args.tokens.split(",")]
    models = (
        [x.strip() for x in args.models.split(",")] if args.models is not None else list(TABLE1)
    )
    for m in models:
        config_path("models", m, COMMAND_LINE, "--models")
    t0 = time.time()
    rows = [
        r
        for r in figure9(
            models, tokens, layers=args.layers, progress=not args.json, **_executor(args)
        )
        if "infeasible" not in r
    ]
    command = f"fsedp sweep figure9 --layers {args.layers} --tokens {args.tokens}" + (
        f" --models {args.models}" if args.models else ""
    )
    text = f"Figure 9 sweep ({time.time() - t0:.0f} s): `{command}`\n\n" + format_figure9(rows)
    if args.out:
        write_output(args.out, text)
    emit(args, {"rows": rows, "command": command}, text)
    return 0


def cmd_bench(args):
    from fsedp.sim.bench import bench, end_to_end, format_bench

    t0 = time.time()
    rows = bench(layers=args.layers)
    command = f"fsedp bench --layers {args.layers}" + (f" --e2e {args.e2e}" if args.e2e else "")
    text = (
        f"Simulator speed (`{command}`, {time.time() - t0:.0f} s, "
        f"{time.strftime('%Y-%m-%d')}):\n\n" + format_bench(rows)
    )
    doc = {"rows": rows}
    if args.e2e:
        e2e = doc["end_to_end"] = end_to_end(args.e2e, args.workers or 2)
        text += (
            f"\n\nQwen3-30B-A3B, 256 tokens, 2x2 chip, EP + Hydra + A3, {e2e['iterations']} "
            f"iterations x 48 layers ({e2e['layers']} layers) on {e2e['workers']} processes: "
            f"{e2e['wall_s']} s"
        )
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    if ratios:
        doc["speedup"] = [min(ratios), max(ratios)]
        text += (
            f"\n\nThe compiled engine is {min(ratios):.0f}-{max(ratios):.0f}x the Python golden "
            "model (python / compiled, over the points above), equal to it event for event."
        )
    if args.out:
        write_output(
            args.out,
            "# Simulator speed\n\nWritten by `fsedp bench --out FILE` (`make bench`), not by "
            f"hand: the Python golden model and the compiled engine side by side.\n\n{text}",
        )
    emit(args, doc, text)
    return 0


def set_streaming(args):
    """``--streaming``: the engine of the FSE-DP layers, for this process and its workers."""
    if getattr(args, "streaming", None):
        os.environ["FSEDP_STREAMING"] = args.streaming


def _streaming_argument(p):
    from fsedp.sim.fast import STREAMING

    p.add_argument(
        "--streaming",
        choices=list(STREAMING),
        help="FSE-DP layers on the compiled engine (default where numba is installed) or on "
        "the Python golden model; the results are the same",
    )


def _executor_arguments(p):
    """Options of the sweep executor (experiment files and ``fsedp sweep``)."""
    g = p.add_argument_group("sweeps (experiment files, fsedp sweep)")
    g.add_argument(
        "--engine",
        default="local",
        choices=["local", "ray"],
        help="run the points in a local process pool or on Ray (pip install 'fsedp[ray]')",
    )
    g.add_argument(
        "--address",
        help="an existing Ray cluster (HOST:PORT, ray://HOST:10001 or auto; refused after "
        "20 s without an answer)",
    )
    g.add_argument(
        "--cache",
        help="folder of finished points (default $FSEDP_CACHE or ~/.cache/fsedp/points); "
        "a restarted or extended sweep computes only what is new",
    )
    g.add_argument("--no-cache", action="store_true", help="compute every point")


def add_parsers(sub):
    # a default in words below ("default: the model's") is none the parser holds: unset
    # (None), the command works it out; every other default and range is HelpFormatter's
    run = sub.add_parser(
        "run", parents=[CONFIG, JSON], help="main job: EP, Hydra and FSE-DP simulated side by side"
    )
    run.add_argument(
        "--iterations",
        type=positive("--iterations", 100_000),
        default=1,
        help="forward iterations",
    )
    run.add_argument(
        "--layers",
        type=positive("--layers", 1024),
        help="MoE layers per iteration (default: the model's)",
    )
    run.add_argument(
        "--strategies",
        default=None,
        help="comma-separated: EP, Hydra, A1..A8 (FSE-DP ablations; default: EP, Hydra, "
        "A1, A2, A3 and A6)",
    )
    run.add_argument(
        "--scheduler",
        default="golden",
        choices=["golden", "rtl"],
        help="rtl: also replay every FSE-DP layer's decisions through the "
        "scheduler RTL under Verilator and stop at the first difference",
    )
    run.add_argument(
        "--workers",
        type=positive("--workers", 256),
        help="processes: the FSE-DP layers of a run, the points of an experiment file (or "
        "Ray CPUs of a local instance; default: up to 2)",
    )
    run.add_argument(
        "--out",
        help="report folder (default ./build/run/<config name>); with an experiment file, "
        "the table's Markdown file",
    )
    run.add_argument(
        "--trace-events",
        metavar="FILE.json",
        help="also write the traced layers in the Trace Event Format, for ui.perfetto.dev or "
        "chrome://tracing: per strategy the DDR loads, computations and D2D transfers of "
        "every chiplet and the scheduler's decisions (docs/simulator.md, Trace viewer)",
    )
    run.add_argument(
        "--trace-layers",
        type=positive("--trace-layers", 1024),
        metavar="N",
        help="with --trace-events: the first N layers of the last iteration (default: the "
        "one layer the report plots)",
    )
    add_force(run)
    _executor_arguments(run)
    _streaming_argument(run)
    run.set_defaults(func=cmd_run)

    sw = sub.add_parser(
        "sweep",
        parents=[JSON],
        help="paper experiments as sweeps (figure9: speedup of every "
        "Table I model at 16 and 64 tokens)",
    )
    sw.add_argument("experiment", choices=["figure9"])
    sw.add_argument("--models", help="comma-separated model configs (default: Table I)")
    sw.add_argument("--tokens", default="16,64")
    sw.add_argument(
        "--layers",
        type=positive("--layers", 1024),
        default=8,
        help="MoE layers simulated per point",
    )
    sw.add_argument("--out", help="also write the table (Markdown) to this file")
    sw.add_argument(
        "--workers",
        type=positive("--workers", 256),
        help="processes (or Ray CPUs of a local instance; default: up to 2)",
    )
    _executor_arguments(sw)
    _streaming_argument(sw)
    sw.set_defaults(func=cmd_sweep, out_kind="file")

    bn = sub.add_parser(
        "bench", parents=[JSON], help="simulator speed: seconds per MoE layer, steps per second"
    )
    bn.add_argument(
        "--layers", type=positive("--layers", 1024), default=3, help="MoE layers measured per point"
    )
    bn.add_argument(
        "--e2e",
        type=positive("--e2e", 1000),
        help="also time this many iterations of the end-to-end target (Qwen3-30B-A3B, 256 "
        "tokens, 2x2, all 48 layers, EP + Hydra + A3)",
    )
    bn.add_argument("--workers", type=positive("--workers", 256), help="processes of --e2e")
    bn.add_argument("--out", help="also write the result (Markdown) to this file")
    bn.set_defaults(func=cmd_bench, out_kind="file")
