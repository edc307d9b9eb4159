"""``fsedp rtl ...``: Verilog, cosimulation of RTL against the golden models, latency and
area reports."""

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from fsedp.cli.common import (
    CONFIG,
    JSON,
    Parser,
    emit,
    field_options,
    int_at_least,
    load_config,
    number,
    positive,
    require_simulator,
    usage,
    write_output,
)
from fsedp.config import config_to_dict
from fsedp.errors import COMMAND_LINE, InputError
from fsedp.files import build_dir, output_dir, work_folder
from fsedp.log import logger
from fsedp.params import SchedulerParams
from fsedp.sw.sorter import SORTERS

_log = logger("rtl")
#: the scheduler generics the hardware commands take as options over the config's
SCHEDULER_OVERRIDES = ("experts", "chiplets", "balance", "entry_dispatch", "sorter", "eit_lanes")


def _params(args) -> SchedulerParams:
    cfg = load_config(args)
    p = cfg.scheduler_params()
    over = {
        k: getattr(args, k)
        for k in SCHEDULER_OVERRIDES
        if not any(getattr(args, k, None) is x for x in (None, False))
    }
    if over:
        try:
            p = dataclasses.replace(p, **over)
        except InputError as e:
            raise e.at(COMMAND_LINE, f"--{e.field.replace('_', '-')}") from None
    return p


def _run_tb(p, sim, knobs, tag, opt="-O0", waves=False):
    from fsedp.tb.runner import run_tb

    return run_tb(
        "scheduler",
        p,
        sim,
        build_dir("cosim"),
        knobs=knobs,
        seed=knobs.get("seed", 1),
        tag=tag,
        opt=opt,
        waves=waves,
    )


def _stats(xs):
    return (
        {"n": len(xs), "min": min(xs), "mean": round(sum(xs) / len(xs), 2), "max": max(xs)}
        if xs
        else {}
    )


#: the latency lists a scheduler testbench reports (cycles), summarised by :func:`_stats`
LATENCIES = (
    "latency_first_dispatch",
    "latency_first_dispatch_plain",
    "latency_first_dispatch_deferral",
    "latency_done_to_dispatch",
)


def _latency_stats(res: dict) -> dict:
    return {f"{k}_cycles": _stats(res.get(k, [])) for k in LATENCIES}


def cmd_rounds(args):
    from fsedp.workload import rounds as run_rounds

    cfg = load_config(args)
    p = cfg.scheduler_params()
    rounds = run_rounds(cfg)
    require_simulator(args.sim)
    with tempfile.TemporaryDirectory() as tmp:
        rf = Path(tmp) / "rounds.json"
        rf.write_text(
            json.dumps([{"records": r.records, "req_inits": r.req_inits} for r in rounds])
        )
        t0 = time.time()
        res = _run_tb(
            p,
            args.sim,
            {
                "rounds_file": str(rf),
                "stall": 0.0,
                "per_token": 4,
                "max_delay": 4,
                "seed": cfg.scenario.seed,
                "log_rounds": len(rounds),
            },
            tag="-run",
        )
    wall = time.time() - t0
    doc = {
        "config": config_to_dict(cfg),
        "params": dataclasses.asdict(p),
        "simulator": args.sim,
        "rounds": res.get("rounds", 0),
        "beats": res.get("beats", 0),
        "mismatches": res.get("mismatches"),
        "first_mismatches": res.get("first_mismatches", []),
        **_latency_stats(res),
        "schedule": res.get("logs", []),
        "wall_s": round(wall, 1),
    }
    lines = [
        f"FSE-DP scheduler: {cfg.model.name} on {cfg.hardware.name} "
        f"({p.chiplets} chiplets, {p.experts} experts, {cfg.scenario.tokens_per_iteration} "
        f"tokens/iteration, top-{cfg.model.top_k}); RTL on {args.sim}"
    ]
    for log in doc["schedule"]:
        deferred = [r for r in range(p.requests) if log["deferred"] >> r & 1]
        beats = [ev for ev in log["events"] if ev["kind"] != "done"]
        span = (beats[-1]["cycle"] - beats[0]["cycle"]) if beats else 0
        lines.append(
            f"\nround {log['round']}: {log['n_active']} experts to schedule, "
            f"deferred requests {deferred or 'none'}, {len(beats)} dispatch/pre-load "
            f"beats over {span} cycles"
        )
        if log["round"] >= args.show_rounds:
            continue
        lines.append(
            f"  {'cycle':>6}  {'event':<8} {'expert':>6} {'tokens':>6}  "
            f"{'trajectory':<{p.chiplets}}  entry  ring"
        )
        for ev in log["events"]:
            if ev["kind"] == "done":
                slots = [s for s in range(p.chiplets) if ev["slots"] >> s & 1]
                lines.append(f"  {ev['cycle']:>6}  done     slots {slots}")
                continue
            traj = "".join("x" if ev["traj"] >> c & 1 else "." for c in range(p.chiplets))
            ring, c = [ev["entry"]], ev["next_hop"][ev["entry"]]
            while c != ev["entry"] and len(ring) <= p.chiplets:
                ring.append(c)
                c = ev["next_hop"][c]
            lines.append(
                f"  {ev['cycle']:>6}  {ev['kind']:<8} {ev['expert']:>6} {ev['count']:>6}  "
                f"{traj}  {ev['entry']:>5}  {'->'.join(map(str, ring))}"
            )
    agree = "AGREE" if doc["mismatches"] == 0 else "DISAGREE"
    lf, ld = doc["latency_first_dispatch_cycles"], doc["latency_done_to_dispatch_cycles"]
    lines.append(
        f"\nRTL vs golden model: {agree} - {doc['beats']} dispatch beats over {doc['rounds']} "
        f"rounds, {doc['mismatches']} mismatches"
    )
    if lf:
        lines.append(
            f"latency, last gate record -> first dispatch: {lf['mean']} cycles "
            f"(max {lf['max']}; {lf['max'] / cfg.hardware.clock_mhz * 1000:.0f} ns at "
            f"{cfg.hardware.clock_mhz:g} MHz)"
        )
    if ld:
        lines.append(
            f"latency, completion -> next dispatch: mean {ld['mean']}, max {ld['max']} cycles"
        )
    for m in doc["first_mismatches"]:
        lines.append(f"  mismatch: {m}")
    emit(args, doc, "\n".join(lines))
    return 0 if doc["mismatches"] == 0 else 1


def cmd_verilog(args):
    from fsedp.hw.generate import BLOCKS, DATAPATH_BLOCKS, write_verilog

    p = _params(args)
    if args.lint:
        require_simulator("verilator")
    blocks = list(BLOCKS) if args.block == "all" else [args.block] if args.block in BLOCKS else []
    dp_blocks = [b for b in DATAPATH_BLOCKS if args.block in ("all", b)]
    if dp_blocks and getattr(args, "chiplets", None) is not None:
        if args.block != "all":
            raise usage(
                "--chiplets",
                f"does not apply to {args.block}; its mesh is "
                "hardware.rows x hardware.cols of the run config",
            )
        dp_blocks = []  # --chiplets reshapes the scheduler only
    files, lint = [], {}
    dp = None
    with output_dir(args.out, args.force) as staged:
        for b in blocks:
            files.append(write_verilog(b, p, staged).name)
        if dp_blocks:
            dp = dataclasses.replace(load_config(args).datapath_params(), experts=p.experts)
            for b in dp_blocks:
                files.append(write_verilog(b, dp, staged).name)
        if args.lint:
            from fsedp.tb.runner import lint_files

            lint = lint_files([staged / f for f in files])
    out = Path(args.out)
    lint = {str(out / Path(f).name): v for f, v in lint.items()}
    files = [str(out / f) for f in files]
    doc = {
        "params": dataclasses.asdict(p),
        "files": files,
        "lint": lint,
        "datapath_params": dataclasses.asdict(dp) if dp else None,
    }
    text = "\n".join(f"wrote {f}" + (f"  lint: {lint[f]}" if f in lint else "") for f in files)
    emit(args, doc, text)
    return 0 if all(v == "clean" for v in lint.values()) else 1


def cmd_cosim(args):
    p = _params(args)
    if args.top_k is not None and args.top_k > p.experts:
        raise usage("--top-k", f"must be at most the {p.experts} experts, not {args.top_k}")
    if args.tokens is not None and args.tokens > p.count_max:
        raise usage(
            "--tokens", f"must be at most 2**count_width - 1 = {p.count_max}, not {args.tokens}"
        )
    # the options' own rules before the tools: the answer must not depend on what is installed
    if args.driver == "native":
        if args.sim != "verilator":
            raise usage("--driver", f"native runs on Verilator only, not --sim {args.sim}")
        if args.waves:
            raise usage("--waves", "with --driver native a failing round records its own VCD")
    elif args.report:
        raise usage("--report", "is written by --driver native only")
    require_simulator(args.sim)
    knobs = {
        "rounds": args.rounds,
        "seed": args.seed,
        "stall": args.stall,
        "reset_every": args.reset_every,
        "tokens": args.tokens,
        "top_k": args.top_k,
    }
    if args.driver == "native":
        return _cosim_native(args, p, knobs)
    t0 = time.time()
    res = _run_tb(
        p, args.sim, knobs, tag=f"-cosim{args.seed}", opt=args.build_opt, waves=args.waves
    )
    wall = time.time() - t0
    doc = {
        "params": dataclasses.asdict(p),
        "simulator": args.sim,
        "rounds": res.get("rounds"),
        "resets": res.get("resets"),
        "beats": res.get("beats"),
        "cycles": res.get("cycles"),
        "mismatches": res.get("mismatches"),
        "first_mismatches": res.get("first_mismatches", []),
        **_latency_stats(res),
        "wall_s": round(wall, 1),
        "log": res.get("log"),
        "waves": res.get("waves"),
    }
    if doc["mismatches"] is None:
        doc["mismatches"] = "testbench failed before reporting"
    text = (
        f"cosim {args.sim}: {p.experts} experts, {p.chiplets} chiplets, {doc['rounds']} rounds "
        f"(+{doc['resets']} reset mid-round), {doc['beats']} dispatch beats, {doc['cycles']} "
        "cycles "
        f"in {doc['wall_s']} s\nmismatches: {doc['mismatches']}"
    )
    for m in doc["first_mismatches"]:
        text += f"\n  {m}"
    bad_round = res.get("first_mismatch_round")
    if bad_round is not None and not args.waves:
        # a failing run records itself: the same seed again up to the failing round, with
        # every signal recorded (the rounds and stalls before it replay identically)
        again = _run_tb(
            p,
            args.sim,
            {**knobs, "rounds": bad_round + 1},
            tag=f"-cosim{args.seed}-waves",
            opt=args.build_opt,
            waves=True,
        )
        doc["waves"] = again.get("waves")
        doc["waves_round"] = bad_round
    if doc["waves"]:
        text += f"\nwaveform: {doc['waves']}" + (
            f" (rounds 0..{bad_round}, the first mismatch in the last)"
            if doc.get("waves_round") is not None
            else ""
        )
    emit(args, doc, text)
    return 0 if doc["mismatches"] == 0 and res.get("failed") == 0 else 1


def _cosim_native(args, p, knobs):
    """``fsedp rtl cosim --driver native``: the C++ driver, the golden model checking its
    transfers as they stream out (:mod:`fsedp.tb.native`)."""
    import signal

    from fsedp.tb.native import native_missing, run_native

    why = native_missing()
    if why:
        raise usage("--driver", f"native: {why}")
    # --report was checked with the other outputs before any work (fsedp.cli.check_common)
    report = Path(
        args.report or build_dir("cosim", f"native-{p.experts}x{p.chiplets}-seed{args.seed}.json")
    )

    def progress(run):
        rate = f"{run.cycles / run.wall_s:,.0f} cycles/s" if run.wall_s else ""
        _log.info(
            f"{run.rounds + run.resets}/{run.rounds_total} rounds checked, "
            f"{run.mismatches} mismatches, {run.cycles:,} cycles, {rate}"
        )

    def stop(signum, frame):  # a stopped run still reports what it checked
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        run = run_native(
            p,
            knobs,
            build_dir("cosim"),
            opt=args.build_opt,
            report=report,
            progress=None if args.json else progress,
            progress_s=args.progress_every,
            log=None if args.json else _log.info,
        )
    finally:
        signal.signal(signal.SIGTERM, old)
    summary = run.summary()
    doc = {
        "params": dataclasses.asdict(p),
        "simulator": "verilator",
        "driver": "native",
        **{k: v for k, v in summary.items() if k not in LATENCIES},
        **_latency_stats(summary),
        "report": str(report),
    }
    rate = f"{run.cycles / run.wall_s:,.0f} cycles/s" if run.wall_s else "-"
    text = (
        f"cosim verilator, native driver: {p.experts} experts, {p.chiplets} chiplets, "
        f"{run.rounds} rounds (+{run.resets} reset mid-round) of {run.rounds_total}, "
        f"{run.beats} dispatch beats, {run.cycles} cycles in {run.wall_s} s ({rate}; "
        f"build {run.build_s} s, stimulus {run.stimulus_s} s)\nmismatches: {run.mismatches}"
    )
    for m in run.first_mismatches:
        text += f"\n  {m}"
    if run.stopped:
        text += f"\nstopped: {run.stopped}"
    if run.waves:
        text += f"\nwaveform: {run.waves} (round {run.first_mismatch_round}, the first mismatch)"
    text += f"\nreport: {report}"
    emit(args, doc, text)
    return 0 if run.complete and run.mismatches == 0 else 1


def cmd_coverage(args):
    """``fsedp rtl coverage``: functional coverage per block from checked native
    regressions, the stimulus steered at the bins still missed (:mod:`fsedp.tb.coverage`)."""
    from fsedp.tb.coverage import close_coverage
    from fsedp.tb.native import native_missing

    p = _params(args)
    why = native_missing()
    if why:
        raise usage("--build-opt", f"the native driver cannot be built here: {why}")

    def say(msg):
        if not args.json:
            _log.info(msg)

    t0 = time.time()
    cov, history, mismatches = close_coverage(
        p,
        build_dir("cosim"),
        rounds=args.rounds,
        batches=args.batches,
        seed=args.seed,
        opt=args.build_opt,
        log=say,
    )
    rep = cov.report()
    missed = cov.missed()
    doc = {
        "params": dataclasses.asdict(p),
        "blocks": rep,
        "batches": history,
        "mismatches": mismatches,
        "missed": missed,
        "wall_s": round(time.time() - t0, 1),
    }
    lines = [
        f"functional coverage: {p.experts} experts, {p.chiplets} chiplets, "
        f"{sum(h['rounds'] + h['resets'] for h in history)} checked rounds in "
        f"{len(history)} batches ({', '.join(h['profile'] for h in history)}), "
        f"{mismatches} mismatches, {doc['wall_s']} s"
    ]
    for block, r in rep.items():
        n = len(r["hit"]) + len(r["missed"])
        lines.append(f"{block}: {len(r['hit'])}/{n} reachable bins hit")
        for name, hits in r["hit"].items():
            lines.append(f"  hit     {name} ({hits})")
        for name in r["missed"]:
            lines.append(f"  MISSED  {name}")
        for name, why in r["unreachable"].items():
            lines.append(f"  n/a     {name}: {why}")
    emit(args, doc, "\n".join(lines))
    return 0 if not missed and not mismatches else 1


def cmd_report(args):
    from fsedp.experiments.rtl_report import format_report, rtl_report

    base = load_config(args).scheduler_params()
    if args.count_width is not None:
        try:
            base = dataclasses.replace(base, count_width=args.count_width)
        except InputError as e:
            raise e.at(COMMAND_LINE, f"--{e.field.replace('_', '-')}") from None
    experts = [positive("--experts", 4096)(x) for x in args.experts.split(",")]
    sorters = [x for x in args.sorters.split(",") if x]
    for kind in sorters:
        if kind not in SORTERS:
            raise usage("--sorters", f"{kind[:40]!r} is not one of {', '.join(SORTERS)}")
    chiplets = [positive("--chiplets", 4096)(x) for x in args.chiplets.split(",")]
    for e in experts:
        for c in chiplets:
            try:
                dataclasses.replace(base, experts=e, chiplets=c)
            except InputError as err:
                raise err.at(COMMAND_LINE, f"--{err.field}") from None
    if not args.no_latency:
        require_simulator(args.sim)
    try:
        rows = rtl_report(
            base,
            experts,
            chiplets,
            sim=args.sim,
            cells=not args.no_cells,
            latency=not args.no_latency,
            rounds=args.rounds,
            progress=not args.json,
            sorters=sorters,
        )
    except InputError as e:
        raise e.at(COMMAND_LINE, f"--{e.field.replace('_', '-')}") from None
    doc = {"base_params": dataclasses.asdict(base), "rows": rows}
    command = " ".join(["fsedp", *sys.argv[1:]]) if sys.argv[1:2] == ["rtl"] else "fsedp rtl report"
    text = (
        "# RTL report: scheduling latency and cell counts\n\n"
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d')} "
        f"({args.sim} for latency; Debian Yosys with ABC for cells). Parameters other than "
        f"E and C: `{dataclasses.asdict(base)}`.\n\n" + format_report(rows)
    )
    if args.out:
        write_output(args.out, text)
    emit(args, doc, text)
    return 0


def _mesh(text: str, layers: int) -> tuple[int, int, int]:
    """``ROWSxCOLS[:LAYERS]``."""
    try:
        shape, _, n = text.lower().partition(":")
        r, c = (int(x) for x in shape.split("x"))
        n = int(n) if n else layers
    except ValueError:
        raise usage(
            "--mesh", f"expected ROWSxCOLS[:LAYERS] such as 2x2 or 4x4:100, not {text[:40]!r}"
        ) from None
    if not (1 <= r <= 16 and 1 <= c <= 16):
        raise usage("--mesh", f"{text[:40]}: rows and cols must be in 1..16")
    if not 1 <= n <= 10**6:
        raise usage("--mesh", f"the number of layers must be in 1..1000000, not {n}")
    return r, c, n


def cmd_datapath(args):
    from fsedp.experiments.datapath_report import (
        cells_table,
        format_markdown,
        long_run,
        ring_table,
        run_params,
    )

    meshes = [(_mesh(m, args.layers), m) for m in args.mesh or []]
    doc, runs = {}, []
    if args.ring:
        doc["ring"] = ring_table()
    # A6's datapath rules (--hot-window, --preempt) and the slice table ([D13]) apply to
    # the cells and to every mesh
    rules = dict(
        hot_window=args.hot_window,
        preempt=args.preempt or None,
        slice_table=args.slice_table or None,
        cycles_per_token=args.cycles_per_token,
    )
    # [D10] a DDR channel per chiplet (remote loads) on every mesh and in the cells
    channels = (lambda r, c: r * c) if args.ddr_per_chiplet else (lambda r, c: None)
    cells_params = None
    if args.cells:
        _, cells_params = run_params(2, 2, ddr_channels=channels(2, 2), **rules)
        doc["cells"] = cells_table(cells_params)
    for (r, c, layers), mesh in meshes:
        try:
            sp, p = run_params(
                r,
                c,
                slots=args.slots,
                micro_slices=args.micro_slices,
                link_cycles=args.link_cycles,
                ddr_interval=args.ddr_interval,
                ddr_latency=args.ddr_latency,
                preload_entries=args.preload,
                rule5=args.rule5 or None,
                ddr_channels=channels(r, c),
                **rules,
            )
        except InputError as e:
            if e.field in ("rows", "cols", "chiplets"):
                raise e.at(COMMAND_LINE, "--mesh", f"{mesh}: {e.field} {e.reason}") from None
            raise e.at(COMMAND_LINE, f"--{e.field.replace('_', '-')}") from None
        require_simulator(args.sim)
        if not args.json:
            _log.info(f"cosimulating {layers} layers on {r}x{c} ({args.sim}) ...")
        same = dict(
            sim=args.sim,
            seed=args.seed,
            stall=args.stall,
            reset_every=args.reset_every,
            opt=args.build_opt,
        )
        res = long_run(sp, p, layers, waves=args.waves, **same)
        bad = res.get("first_mismatch_layer")
        if bad is not None and not args.waves:
            # a failing run records itself: the same seed up to the failing layer, waves on
            again = long_run(sp, p, bad + 1, waves=True, **same)
            res.update(waves=again.get("waves"), waves_layer=bad)
        res.update(
            params=dataclasses.asdict(p),
            sim=args.sim,
            command=f"fsedp rtl datapath --mesh {r}x{c}:{layers} "
            f"--sim {args.sim} --seed {args.seed} --stall {args.stall}"
            + (f" --reset-every {args.reset_every}" if args.reset_every else "")
            + "".join(
                f" --{k.replace('_', '-')} {v}"
                for k, v in rules.items()
                if v is not None and k not in ("preempt", "slice_table")
            )
            + (" --preempt" if args.preempt else "")
            + (" --slice-table" if args.slice_table else "")
            + (" --rule5" if args.rule5 else "")
            + (" --ddr-per-chiplet" if args.ddr_per_chiplet else ""),
        )
        runs.append(res)
    doc["runs"] = runs
    text = format_markdown(doc.get("ring"), doc.get("cells"), cells_params, runs)
    if args.out:
        write_output(
            args.out,
            "# Chiplet datapath report\n\nProduced by `fsedp rtl datapath` on "
            f"{time.strftime('%Y-%m-%d')}.\n\n" + text,
        )
    emit(args, doc, text)
    ok = all(
        r.get("failed") == 0 and r.get("mismatches") == 0 and not r.get("violations") for r in runs
    )
    return 0 if ok else 1


def cmd_formal(args):
    """Bounded model checking of the blocks' formal properties (``fsedp.tb.formal``)."""
    from fsedp.tb.formal import CHECKS, missing_tools, properties

    names = list(CHECKS) if not args.check else args.check
    for n in names:
        if n not in CHECKS:
            raise usage("--check", f"unknown check {n!r}; choose from {', '.join(CHECKS)}")
    if args.list:
        doc = {
            n: {
                "block": CHECKS[n].block,
                "depth": CHECKS[n].depth,
                "properties": properties(CHECKS[n]),
            }
            for n in names
        }
        text = "\n".join(
            f"{n}: depth {d['depth']}: {', '.join(d['properties'])}" for n, d in doc.items()
        )
        emit(args, doc, text)
        return 0
    missing = missing_tools(args.solver)
    if missing:
        raise usage(
            "--solver",
            f"formal checking needs {', '.join(missing)} on PATH (Debian: apt-get install "
            f"yosys {args.solver})",
        )
    with work_folder(args.out or build_dir("formal"), args.force) as out:
        results = _formal_runs(args, names, out)
    doc = {
        "solver": args.solver,
        "checks": [dataclasses.asdict(r) | {"status": r.status} for r in results],
    }
    ok = all(r.status == "pass" for r in results)
    text = f"{sum(len(r.properties) for r in results)} properties: " + (
        "all hold" if ok else "FAILED: " + "; ".join(f for r in results for f in r.failed)
    )
    emit(args, doc, text)
    return 0 if ok else 1


def _formal_runs(args, names, out) -> list:
    """Each check of ``names`` proved in its own folder under ``out``, progress printed."""
    from fsedp.tb.formal import CHECKS, prove

    results = []
    for n in names:
        check = CHECKS[n]

        def progress(name, rec, n=n):
            if not args.json:
                extra = f", induction {rec['induction']}" if rec.get("induction") else ""
                why = f": {'; '.join(rec.get('failed', []))}" if rec["status"] != "pass" else ""
                vcd = f" (counterexample {rec['vcd']})" if rec.get("vcd") else ""
                print(
                    f"{n}: {name}: {rec['status']} at depth {rec['depth']} in "
                    f"{rec['seconds']} s{extra}{why}{vcd}",
                    flush=True,
                )

        results.append(
            prove(check, Path(out) / n, depth=args.depth, solver=args.solver, progress=progress)
        )
    return results


def add_parsers(sub):
    from fsedp.hw.generate import BLOCKS, DATAPATH_BLOCKS

    rtl = sub.add_parser("rtl", help="hardware: Verilog, cosimulation, latency and area report")
    rsub = rtl.add_subparsers(dest="rtl_cmd", required=True, parser_class=Parser)
    sims = ["verilator", "icarus"]
    opts = ["-O0", "-O1", "-O2"]
    stall = number("--stall", 0.0, 0.95)
    seed = int_at_least("--seed", 0, 2**32 - 1)

    rr = rsub.add_parser(
        "rounds",
        parents=[CONFIG, JSON],
        help="the run config's scheduling rounds through the scheduler RTL "
        "and its golden model, schedule printed",
    )
    rr.add_argument("--sim", default="verilator", choices=sims)
    rr.add_argument(
        "--show-rounds",
        type=int_at_least("--show-rounds", 0),
        default=1,
        metavar="N",
        help="print the full schedule of the first N rounds",
    )
    rr.set_defaults(func=cmd_rounds)

    def sizes(p):
        field_options(p, SchedulerParams, SCHEDULER_OVERRIDES)

    v = rsub.add_parser("verilog", parents=[CONFIG, JSON], help="write the Verilog of every block")
    sizes(v)
    v.add_argument("--out", required=True, help="output folder")
    v.add_argument("--block", default="all", choices=["all", *BLOCKS, *DATAPATH_BLOCKS])
    v.add_argument("--lint", action="store_true", help="also run verilator --lint-only -Wall")
    v.set_defaults(func=cmd_verilog, out_kind="folder")

    c = rsub.add_parser(
        "cosim",
        parents=[CONFIG, JSON],
        help="random scheduling rounds through RTL and golden model",
    )
    sizes(c)
    c.add_argument("--sim", default="verilator", choices=sims)
    c.add_argument("--rounds", type=positive("--rounds", 10**6), default=100)
    c.add_argument("--seed", type=seed, default=1)
    c.add_argument(
        "--stall", type=stall, default=0.25, help="probability of a valid/ready stall (0..0.95)"
    )
    c.add_argument(
        "--reset-every",
        type=int_at_least("--reset-every", 0),
        default=0,
        help="reset mid-round every N rounds",
    )
    c.add_argument(
        "--tokens", type=positive("--tokens", 4096), help="tokens per round (default: random)"
    )
    c.add_argument(
        "--top-k", type=positive("--top-k", 64), help="experts per token (default: random 1..4)"
    )
    c.add_argument(
        "--build-opt",
        default="-O2",
        choices=opts,
        help="C++ optimisation of the Verilator model: -O0 builds fastest, "
        "-O2 simulates fastest (default, for long runs)",
    )
    c.add_argument(
        "--waves",
        action="store_true",
        help="record every signal (Verilator: VCD, Icarus: FST); the summary names the file",
    )
    c.add_argument(
        "--driver",
        default="cocotb",
        choices=("cocotb", "native"),
        help="cocotb: the Python testbench; native: a C++ driver with the golden model "
        "checking its transfers as they stream out, ~300x faster (regressions of 10^5 rounds)",
    )
    c.add_argument(
        "--report",
        help="native driver: JSON report, rewritten as the run goes "
        "(default build/cosim/native-<E>x<C>-seed<S>.json)",
    )
    c.add_argument(
        "--progress-every",
        type=number("--progress-every", 0.1, 3600),
        default=10.0,
        help="native driver: seconds between progress lines and report updates",
    )
    c.set_defaults(func=cmd_cosim)

    cv = rsub.add_parser(
        "coverage",
        parents=[CONFIG, JSON],
        help="functional coverage per block from checked regressions (native driver)",
    )
    sizes(cv)
    cv.add_argument(
        "--rounds", type=positive("--rounds", 10**6), default=2000, help="rounds per batch"
    )
    cv.add_argument(
        "--batches",
        type=positive("--batches", 100),
        default=8,
        help="at most this many batches, each steered at the bins still missed",
    )
    cv.add_argument("--seed", type=seed, default=1)
    cv.add_argument("--build-opt", default="-O2", choices=opts)
    cv.set_defaults(func=cmd_coverage)

    r = rsub.add_parser(
        "report", parents=[CONFIG, JSON], help="scheduling latency and Yosys cell counts"
    )
    r.add_argument("--experts", default="16,32,64,128,256")
    r.add_argument("--chiplets", default="4,9,16")
    r.add_argument("--sim", default="verilator", choices=sims)
    r.add_argument(
        "--rounds",
        type=positive("--rounds", 10**4),
        default=6,
        help="rounds simulated per size for latency",
    )
    r.add_argument("--no-cells", action="store_true")
    r.add_argument("--no-latency", action="store_true")
    r.add_argument(
        "--count-width",
        type=positive("--count-width", 4096),
        help="EIT count width (default: the config's; the first generation was measured at 10)",
    )
    r.add_argument(
        "--sorters",
        default="",
        help="comma-separated sorter variants to measure beside the default "
        f"({', '.join(SORTERS)}; cells only)",
    )
    r.add_argument("--out", help="also write the table (Markdown) to this file")
    r.set_defaults(func=cmd_report, out_kind="file")

    f = rsub.add_parser(
        "formal",
        parents=[JSON],
        help="formal properties of the scheduler blocks: bounded model checking (yosys-smtbmc)",
    )
    f.add_argument(
        "--check", action="append", help="a check (repeatable; default: all); --list names them"
    )
    f.add_argument("--list", action="store_true", help="list the checks and their properties")
    f.add_argument(
        "--depth",
        type=int_at_least("--depth", 1, 200),
        help="BMC depth in cycles (default: each check's stated depth)",
    )
    f.add_argument("--solver", default="z3", choices=["z3", "yices", "boolector"])
    f.add_argument("--out", help="work folder (Verilog, SMT-LIB, counterexample VCDs)")
    f.set_defaults(func=cmd_formal, out_kind="folder")

    d = rsub.add_parser(
        "datapath",
        parents=[JSON],
        help="chiplet datapath: ring streaming time, cells, long random cosimulation",
    )
    d.add_argument("--no-ring", dest="ring", action="store_false")
    d.add_argument("--no-cells", dest="cells", action="store_false")
    d.add_argument(
        "--mesh", action="append", help="cosimulate this mesh, ROWSxCOLS[:LAYERS] (repeatable)"
    )
    d.add_argument(
        "--layers",
        type=positive("--layers", 10**6),
        default=100,
        help="layers of a --mesh without :LAYERS",
    )
    d.add_argument("--sim", default="verilator", choices=sims)
    d.add_argument("--seed", type=seed, default=1)
    d.add_argument(
        "--stall",
        type=stall,
        default=0.25,
        help="probability of a stall per link, DDR, dispatch and done each cycle",
    )
    d.add_argument("--reset-every", type=int_at_least("--reset-every", 0), default=0)
    for name in (
        "slots",
        "micro-slices",
        "link-cycles",
        "ddr-interval",
        "ddr-latency",
        "preload",
        "hot-window",
        "cycles-per-token",
    ):
        d.add_argument(f"--{name}", type=int_at_least(f"--{name}", 0, 2**20))
    d.add_argument("--rule5", action="store_true")
    d.add_argument(
        "--ddr-per-chiplet",
        action="store_true",
        help="a DDR channel per chiplet with remote loads ([D10]) instead of one package channel",
    )
    d.add_argument(
        "--preempt", action="store_true", help="compute preemption ([D11], A6) in the ring buffers"
    )
    d.add_argument(
        "--slice-table",
        action="store_true",
        help="a micro-slice count per expert in the DDR controller ([D13], sub-expert streaming)",
    )
    d.add_argument("--build-opt", default="-O0", choices=opts)
    d.add_argument(
        "--waves", action="store_true", help="record every signal of each --mesh run (VCD/FST)"
    )
    d.add_argument("--out", help="also write the report (Markdown) to this file")
    d.set_defaults(func=cmd_datapath, out_kind="file")
