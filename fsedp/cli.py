"""``fsedp``: the command-line tool.

Every command that produces results takes ``--json`` and then prints one JSON document on
stdout.  A bad config, trace or argument prints one line ``fsedp: FILE: FIELD: REASON`` on
stderr and exits with status 2.
"""

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from .config import config_to_dict, default_run, load_run
from .errors import InputError
from .sw.params import ParamError, SchedulerParams

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage + message)
        raise UsageError(f"{self.prog}: {message}")


def _emit(args, doc: dict, text: str):
    if getattr(args, "json", False):
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(text)


def _write_text(path, text: str):
    """Write ``text`` (plus a final newline) to ``path`` all at once: a temporary file in the
    same folder is renamed over it, so a failed run leaves nothing half-written."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(out)


def _load(args):
    return load_run(args.config) if getattr(args, "config", None) else default_run()


def _params(args) -> SchedulerParams:
    cfg = _load(args)
    p = cfg.scheduler_params()
    over = {k: getattr(args, k) for k in ("experts", "chiplets") if getattr(args, k, None) is not None}
    if over:
        try:
            p = dataclasses.replace(p, **over)
        except ParamError as e:
            raise UsageError(f"--{e.field}: {e.reason}") from None
    return p


def _require_sim(sim: str):
    sys.path.insert(0, str(ROOT / "tb"))
    from runner import simulator_missing

    why = simulator_missing(sim)
    if why:
        raise UsageError(f"--sim {sim}: {why}")


def _run_tb(p, sim, knobs, tag, opt="-O0"):
    sys.path.insert(0, str(ROOT / "tb"))
    from runner import run_tb

    return run_tb("scheduler", p, sim, BUILD / "cosim", knobs=knobs, seed=knobs.get("seed", 1),
                  tag=tag, opt=opt)


def _stats(xs):
    return {"n": len(xs), "min": min(xs), "mean": round(sum(xs) / len(xs), 2), "max": max(xs)} if xs else {}


# -- fsedp run ---------------------------------------------------------------------------
def cmd_run(args):
    """The main job: EP, Hydra and FSE-DP side by side on the run config's workload."""
    from .sim.run import STRATEGIES, format_table, run_experiment, summarize, write_report

    if args.config:
        from .config import _read_yaml
        if "experiment" in _read_yaml(args.config):
            return _run_experiment_file(args)
    cfg = _load(args)
    strategies = [x.strip() for x in args.strategies.split(",") if x.strip()]
    bad = [x for x in strategies if x not in STRATEGIES]
    if bad or not strategies:
        raise UsageError(f"--strategies: unknown {', '.join(bad) or '(none given)'}; "
                         f"choose from {', '.join(STRATEGIES)}")
    if args.iterations < 1:
        raise UsageError(f"--iterations: must be at least 1, not {args.iterations}")
    if args.layers is not None and args.layers < 1:
        raise UsageError(f"--layers: must be at least 1, not {args.layers}")
    check = None
    if args.scheduler == "rtl":
        _require_sim("verilator")
        from .sim.rtl_check import RTLSchedulerCheck
        check = RTLSchedulerCheck(cfg, BUILD / "run-rtl")
    t0 = time.time()
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers: must be at least 1, not {args.workers}")
    run = run_experiment(cfg, strategies, n_iter=args.iterations, layers=args.layers,
                         progress=not args.json, on_layer=check.record if check else None,
                         workers=args.workers)
    summary = summarize(run)
    doc = {"config": config_to_dict(cfg), "summary": summary,
           "wall_s": round(time.time() - t0, 1)}
    if check is not None:
        doc["rtl_check"] = check.finish()
    command = "fsedp " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["run"] else "fsedp run"
    out = Path(args.out) if args.out else ROOT / "build" / "run" / Path(cfg.source).stem.strip("<>")
    doc["report"] = write_report(run, summary, out, command)
    title = (f"{cfg.model.name} on {cfg.hardware.name}: {cfg.scenario.tokens_per_iteration} tokens "
             f"per iteration, {args.iterations} iteration(s) x {len(run['layers']) // args.iterations} "
             f"MoE layers (simulated, golden models)")
    text = format_table(summary, title) + f"\nreport: {out}/ (summary.json, report.md, *.png)"
    if check is not None:
        rc = doc["rtl_check"]
        text += (f"\nscheduler RTL (Verilator) vs golden model: {rc['layers']} layers, "
                 f"{rc['beats']} decisions, {'AGREE' if rc['mismatches'] == 0 else 'DISAGREE'}")
        if rc["first_mismatch"]:
            text += f"\n  first difference: {rc['first_mismatch']}"
    _emit(args, doc, text)
    return 0 if check is None or doc["rtl_check"]["mismatches"] == 0 else 1


def _run_experiment_file(args):
    """``fsedp run --config configs/experiments/figN.yaml``: a paper figure as a sweep."""
    from .sim.sweep import load_experiment, run_experiment_file

    from .config import _read_yaml
    from .sim.sweep import load_grid, run_grid

    kind = _read_yaml(args.config).get("experiment")
    t0 = time.time()
    if kind == "grid":
        exp = load_grid(args.config)
        rows, table = run_grid(exp, progress=not args.json)
        what = "grid over " + ", ".join(exp["vary"])
    else:
        exp = load_experiment(args.config)
        rows, table = run_experiment_file(exp, progress=not args.json)
        what = exp["table"]
    text = (f"Figure {exp['figure']} ({what}), `fsedp run --config {args.config}`, "
            f"{time.time() - t0:.0f} s:\n\n{table}")
    if args.out:
        _write_text(args.out, text)
    _emit(args, {"experiment": exp, "rows": rows, "table": table}, text)
    return 0


# -- fsedp rtl rounds ------------------------------------------------------------------------
def cmd_rounds(args):
    from .scenario import build_rounds

    cfg = _load(args)
    p = cfg.scheduler_params()
    rounds = build_rounds(cfg)
    _require_sim(args.sim)
    with tempfile.TemporaryDirectory() as tmp:
        rf = Path(tmp) / "rounds.json"
        rf.write_text(json.dumps([{"records": r.records, "req_inits": r.req_inits} for r in rounds]))
        t0 = time.time()
        res = _run_tb(p, args.sim, {"rounds_file": str(rf), "stall": 0.0, "per_token": 4,
                                    "max_delay": 4, "seed": cfg.scenario.seed,
                                    "log_rounds": len(rounds)}, tag="-run")
    wall = time.time() - t0
    doc = {
        "config": config_to_dict(cfg), "params": dataclasses.asdict(p), "simulator": args.sim,
        "rounds": res.get("rounds", 0), "beats": res.get("beats", 0),
        "mismatches": res.get("mismatches"), "first_mismatches": res.get("first_mismatches", []),
        "latency_first_dispatch_cycles": _stats(res.get("latency_first_dispatch", [])),
        "latency_done_to_dispatch_cycles": _stats(res.get("latency_done_to_dispatch", [])),
        "schedule": res.get("logs", []), "wall_s": round(wall, 1),
    }
    lines = [f"FSE-DP scheduler: {cfg.model.name} on {cfg.hardware.name} "
             f"({p.chiplets} chiplets, {p.experts} experts, {cfg.scenario.tokens_per_iteration} "
             f"tokens/iteration, top-{cfg.model.top_k}); RTL on {args.sim}"]
    for log in doc["schedule"]:
        deferred = [r for r in range(p.requests) if log["deferred"] >> r & 1]
        beats = [ev for ev in log["events"] if ev["kind"] != "done"]
        span = (beats[-1]["cycle"] - beats[0]["cycle"]) if beats else 0
        lines.append(f"\nround {log['round']}: {log['n_active']} experts to schedule, "
                     f"deferred requests {deferred or 'none'}, {len(beats)} dispatch/pre-load "
                     f"beats over {span} cycles")
        if log["round"] >= args.show_rounds:
            continue
        lines.append(f"  {'cycle':>6}  {'event':<8} {'expert':>6} {'tokens':>6}  {'trajectory':<{p.chiplets}}  entry  ring")
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
            lines.append(f"  {ev['cycle']:>6}  {ev['kind']:<8} {ev['expert']:>6} {ev['count']:>6}  "
                         f"{traj}  {ev['entry']:>5}  {'->'.join(map(str, ring))}")
    agree = "AGREE" if doc["mismatches"] == 0 else "DISAGREE"
    lf, ld = doc["latency_first_dispatch_cycles"], doc["latency_done_to_dispatch_cycles"]
    lines.append(f"\nRTL vs golden model: {agree} - {doc['beats']} dispatch beats over {doc['rounds']} "
                 f"rounds, {doc['mismatches']} mismatches")
    if lf:
        lines.append(f"latency, last gate record -> first dispatch: {lf['mean']} cycles "
                     f"(max {lf['max']}; {lf['max'] / cfg.hardware.clock_mhz * 1000:.0f} ns at "
                     f"{cfg.hardware.clock_mhz:g} MHz)")
    if ld:
        lines.append(f"latency, completion -> next dispatch: mean {ld['mean']}, max {ld['max']} cycles")
    for m in doc["first_mismatches"]:
        lines.append(f"  mismatch: {m}")
    _emit(args, doc, "\n".join(lines))
    return 0 if doc["mismatches"] == 0 else 1


# -- fsedp rtl verilog -----------------------------------------------------------------------
def cmd_verilog(args):
    from .hw.generate import BLOCKS, DATAPATH_BLOCKS, write_verilog

    p = _params(args)
    blocks = list(BLOCKS) if args.block == "all" else [args.block] if args.block in BLOCKS else []
    dp_blocks = [b for b in DATAPATH_BLOCKS if args.block in ("all", b)]
    if dp_blocks and getattr(args, "chiplets", None) is not None:
        if args.block != "all":
            raise UsageError(f"--chiplets: does not apply to {args.block}; its mesh is "
                             "hardware.rows x hardware.cols of the run config")
        dp_blocks = []          # --chiplets reshapes the scheduler only
    out = Path(args.out)
    files, lint = [], {}
    for b in blocks:
        files.append(str(write_verilog(b, p, out)))
    dp = None
    if dp_blocks:
        dp = dataclasses.replace(_load(args).datapath_params(), experts=p.experts)
        for b in dp_blocks:
            files.append(str(write_verilog(b, dp, out)))
    if args.lint:
        lint = lint_files(files)
    doc = {"params": dataclasses.asdict(p), "files": files, "lint": lint,
           "datapath_params": dataclasses.asdict(dp) if dp else None}
    text = "\n".join(f"wrote {f}" + (f"  lint: {lint[f]}" if f in lint else "") for f in files)
    _emit(args, doc, text)
    return 0 if all(v == "clean" for v in lint.values()) else 1


def lint_files(files) -> dict:
    """``verilator --lint-only -Wall`` with the waivers of ``hw/lint.vlt``."""
    import subprocess

    sys.path.insert(0, str(ROOT / "tb"))
    from runner import verilator_env
    import os

    env = {**os.environ, **verilator_env()}
    waivers = Path(__file__).resolve().parents[1] / "hw" / "lint.vlt"
    result = {}
    for f in files:
        proc = subprocess.run(["verilator", "--lint-only", "-Wall", str(waivers), f],
                              capture_output=True, text=True, env=env)
        warnings = [l for l in proc.stderr.splitlines() if l.startswith("%")]
        result[f] = "clean" if proc.returncode == 0 and not warnings else "; ".join(warnings[:3])
    return result


# -- fsedp rtl cosim -------------------------------------------------------------------------
def cmd_cosim(args):
    p = _params(args)
    _require_sim(args.sim)
    knobs = {"rounds": args.rounds, "seed": args.seed, "stall": args.stall,
             "reset_every": args.reset_every, "tokens": args.tokens, "top_k": args.top_k}
    t0 = time.time()
    res = _run_tb(p, args.sim, knobs, tag=f"-cosim{args.seed}", opt=args.build_opt)
    wall = time.time() - t0
    doc = {"params": dataclasses.asdict(p), "simulator": args.sim, "rounds": res.get("rounds"),
           "resets": res.get("resets"), "beats": res.get("beats"), "cycles": res.get("cycles"),
           "mismatches": res.get("mismatches"), "first_mismatches": res.get("first_mismatches", []),
           "latency_first_dispatch_cycles": _stats(res.get("latency_first_dispatch", [])),
           "latency_done_to_dispatch_cycles": _stats(res.get("latency_done_to_dispatch", [])),
           "wall_s": round(wall, 1), "log": res.get("log")}
    if doc["mismatches"] is None:
        doc["mismatches"] = "testbench failed before reporting"
    text = (f"cosim {args.sim}: {p.experts} experts, {p.chiplets} chiplets, {doc['rounds']} rounds "
            f"(+{doc['resets']} reset mid-round), {doc['beats']} dispatch beats, {doc['cycles']} cycles "
            f"in {doc['wall_s']} s\nmismatches: {doc['mismatches']}")
    for m in doc["first_mismatches"]:
        text += f"\n  {m}"
    _emit(args, doc, text)
    return 0 if doc["mismatches"] == 0 and res.get("failed") == 0 else 1


# -- fsedp rtl report ------------------------------------------------------------------------
def cmd_report(args):
    from .report import format_report, rtl_report

    base = _load(args).scheduler_params()
    try:
        experts = [int(x) for x in args.experts.split(",")]
        chiplets = [int(x) for x in args.chiplets.split(",")]
    except ValueError:
        raise UsageError("--experts/--chiplets: expected comma-separated integers, "
                         f"not {args.experts!r} / {args.chiplets!r}") from None
    if not args.no_latency:
        _require_sim(args.sim)
    try:
        rows = rtl_report(base, experts, chiplets, sim=args.sim, cells=not args.no_cells,
                          latency=not args.no_latency, rounds=args.rounds, progress=not args.json)
    except ParamError as e:
        raise UsageError(f"--{e.field}: {e.reason}") from None
    doc = {"base_params": dataclasses.asdict(base), "rows": rows}
    command = " ".join(["fsedp", *sys.argv[1:]]) if sys.argv[1:2] == ["rtl"] else "fsedp rtl report"
    text = ("# RTL report: scheduling latency and cell counts\n\n"
            f"Produced by `{command}` on {time.strftime('%Y-%m-%d')} "
            f"({args.sim} for latency; Debian Yosys with ABC for cells). Parameters other than "
            f"E and C: `{dataclasses.asdict(base)}`.\n\n" + format_report(rows))
    if args.out:
        _write_text(args.out, text)
    _emit(args, doc, text)
    return 0


# -- fsedp rtl datapath ----------------------------------------------------------------------
def _mesh(text: str, layers: int) -> tuple[int, int, int]:
    """``ROWSxCOLS[:LAYERS]``."""
    try:
        shape, _, n = text.lower().partition(":")
        r, c = (int(x) for x in shape.split("x"))
        n = int(n) if n else layers
    except ValueError:
        raise UsageError(f"--mesh: expected ROWSxCOLS[:LAYERS] such as 2x2 or 4x4:100, "
                         f"not {text!r}") from None
    if n < 1:
        raise UsageError(f"--mesh: the number of layers must be at least 1, not {n}")
    return r, c, n


def cmd_datapath(args):
    from .datapath_report import cells_table, format_markdown, long_run, ring_table, run_params

    doc, runs = {}, []
    if args.ring:
        doc["ring"] = ring_table()
    cells_params = None
    if args.cells:
        _, cells_params = run_params(2, 2)
        doc["cells"] = cells_table(cells_params)
    for mesh in args.mesh or []:
        r, c, layers = _mesh(mesh, args.layers)
        try:
            sp, p = run_params(r, c, slots=args.slots, micro_slices=args.micro_slices,
                               link_cycles=args.link_cycles, ddr_interval=args.ddr_interval,
                               ddr_latency=args.ddr_latency, preload_entries=args.preload,
                               rule5=args.rule5 or None)
        except ParamError as e:
            if e.field in ("rows", "cols", "chiplets"):
                raise UsageError(f"--mesh {mesh}: {e.field} {e.reason}") from None
            raise UsageError(f"--{e.field.replace('_', '-')}: {e.reason}") from None
        _require_sim(args.sim)
        if not args.json:
            print(f"cosimulating {layers} layers on {r}x{c} ({args.sim}) ...", file=sys.stderr)
        res = long_run(sp, p, layers, sim=args.sim, seed=args.seed, stall=args.stall,
                       reset_every=args.reset_every, opt=args.build_opt)
        res.update(params=dataclasses.asdict(p), sim=args.sim,
                   command=f"fsedp rtl datapath --mesh {r}x{c}:{layers} "
                           f"--sim {args.sim} --seed {args.seed} --stall {args.stall}"
                           + (f" --reset-every {args.reset_every}" if args.reset_every else ""))
        runs.append(res)
    doc["runs"] = runs
    text = format_markdown(doc.get("ring"), doc.get("cells"), cells_params, runs)
    if args.out:
        _write_text(args.out, "# Chiplet datapath report\n\nProduced by `fsedp rtl datapath` on "
                    f"{time.strftime('%Y-%m-%d')}.\n\n" + text)
    _emit(args, doc, text)
    ok = all(r.get("failed") == 0 and r.get("mismatches") == 0 and not r.get("violations")
             for r in runs)
    return 0 if ok else 1


# -- fsedp sweep -----------------------------------------------------------------------------
def cmd_sweep(args):
    from .sim.sweep import TABLE1, figure9, format_figure9

    try:
        tokens = [int(x) for x in args.tokens.split(",")]
    except ValueError:
        raise UsageError(f"--tokens: expected comma-separated integers, not {args.tokens!r}") from None
    models = [x.strip() for x in args.models.split(",")] if args.models else list(TABLE1)
    if args.layers < 1:
        raise UsageError(f"--layers: must be at least 1, not {args.layers}")
    t0 = time.time()
    rows = figure9(models, tokens, layers=args.layers, progress=not args.json)
    command = f"fsedp sweep figure9 --layers {args.layers} --tokens {args.tokens}" + (
        f" --models {args.models}" if args.models else "")
    text = (f"Figure 9 sweep ({time.time() - t0:.0f} s): `{command}`\n\n" + format_figure9(rows))
    if args.out:
        _write_text(args.out, text)
    _emit(args, {"rows": rows, "command": command}, text)
    return 0


# -- fsedp bench ------------------------------------------------------------------------------
def cmd_bench(args):
    from .sim.bench import bench, format_bench

    if args.layers < 1:
        raise UsageError(f"--layers: must be at least 1, not {args.layers}")
    t0 = time.time()
    rows = bench(layers=args.layers)
    text = (f"Simulator speed (`fsedp bench --layers {args.layers}`, {time.time() - t0:.0f} s, "
            f"{time.strftime('%Y-%m-%d')}):\n\n" + format_bench(rows))
    _emit(args, {"rows": rows}, text)
    return 0


def build_parser() -> Parser:
    ap = Parser(prog="fsedp", description="FSE-DP co-design toolkit: golden model, RTL, cosimulation.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)

    run = sub.add_parser("run", help="main job: EP, Hydra and FSE-DP simulated side by side")
    run.add_argument("--config", help="run config YAML (default: the embedded default)")
    run.add_argument("--iterations", type=int, default=1, help="forward iterations (default 1)")
    run.add_argument("--layers", type=int, help="MoE layers per iteration (default: the model's)")
    run.add_argument("--strategies", default="EP,Hydra,A1,A2,A3",
                     help="comma-separated: EP, Hydra, A1..A5 (FSE-DP ablations)")
    run.add_argument("--scheduler", default="golden", choices=["golden", "rtl"],
                     help="rtl: also replay every FSE-DP layer's decisions through the "
                          "scheduler RTL under Verilator and stop at the first difference")
    run.add_argument("--workers", type=int,
                     help="processes for the FSE-DP layers (default: up to 2 CPUs)")
    run.add_argument("--out", help="report folder (default build/run/<config name>)")
    run.add_argument("--json", action="store_true")
    run.set_defaults(func=cmd_run)

    sw = sub.add_parser("sweep", help="paper experiments as sweeps (figure9: speedup of every "
                                      "Table I model at 16 and 64 tokens)")
    sw.add_argument("experiment", choices=["figure9"])
    sw.add_argument("--models", help="comma-separated model configs (default: Table I)")
    sw.add_argument("--tokens", default="16,64")
    sw.add_argument("--layers", type=int, default=8, help="MoE layers simulated per point")
    sw.add_argument("--out", help="also write the table (Markdown) to this file")
    sw.add_argument("--json", action="store_true")
    sw.set_defaults(func=cmd_sweep)

    bn = sub.add_parser("bench", help="simulator speed: seconds per MoE layer, steps per second")
    bn.add_argument("--layers", type=int, default=3, help="MoE layers measured per point")
    bn.add_argument("--json", action="store_true")
    bn.set_defaults(func=cmd_bench)

    rtl = sub.add_parser("rtl", help="hardware: Verilog, cosimulation, latency and area report")
    rsub = rtl.add_subparsers(dest="rtl_cmd", required=True, parser_class=Parser)

    rr = rsub.add_parser("rounds", help="the run config's scheduling rounds through the "
                                        "scheduler RTL and its golden model, schedule printed")
    rr.add_argument("--config", help="run config YAML (default: the embedded default)")
    rr.add_argument("--sim", default="verilator", choices=["verilator", "icarus"])
    rr.add_argument("--show-rounds", type=int, default=1, metavar="N",
                    help="print the full schedule of the first N rounds (default 1)")
    rr.add_argument("--json", action="store_true")
    rr.set_defaults(func=cmd_rounds)

    def common(p, sizes=True):
        p.add_argument("--config", help="run config YAML whose scheduler parameters to use")
        if sizes:
            p.add_argument("--experts", type=int, help="override the number of experts (8..256)")
            p.add_argument("--chiplets", type=int, help="override the number of chiplets (4..16)")
        p.add_argument("--json", action="store_true")

    from .hw.generate import BLOCKS, DATAPATH_BLOCKS

    v = rsub.add_parser("verilog", help="write the Verilog of every block")
    common(v)
    v.add_argument("--out", required=True, help="output folder")
    v.add_argument("--block", default="all", choices=["all", *BLOCKS, *DATAPATH_BLOCKS])
    v.add_argument("--lint", action="store_true", help="also run verilator --lint-only -Wall")
    v.set_defaults(func=cmd_verilog)

    c = rsub.add_parser("cosim", help="random scheduling rounds through RTL and golden model")
    common(c)
    c.add_argument("--sim", default="verilator", choices=["verilator", "icarus"])
    c.add_argument("--rounds", type=int, default=100)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--stall", type=float, default=0.25, help="probability of a valid/ready stall")
    c.add_argument("--reset-every", type=int, default=0, help="reset mid-round every N rounds")
    c.add_argument("--tokens", type=int, help="tokens per round (default: random)")
    c.add_argument("--top-k", type=int, help="experts per token (default: random 1..4)")
    c.add_argument("--build-opt", default="-O2", choices=["-O0", "-O1", "-O2"],
                   help="C++ optimisation of the Verilator model: -O0 builds fastest, "
                        "-O2 simulates fastest (default, for long runs)")
    c.set_defaults(func=cmd_cosim)

    r = rsub.add_parser("report", help="scheduling latency and Yosys cell counts")
    common(r, sizes=False)
    r.add_argument("--experts", default="16,32,64,128,256")
    r.add_argument("--chiplets", default="4,9,16")
    r.add_argument("--sim", default="verilator", choices=["verilator", "icarus"])
    r.add_argument("--rounds", type=int, default=6, help="rounds simulated per size for latency")
    r.add_argument("--no-cells", action="store_true")
    r.add_argument("--no-latency", action="store_true")
    r.add_argument("--out", help="also write the table (Markdown) to this file")
    r.set_defaults(func=cmd_report)

    d = rsub.add_parser("datapath", help="chiplet datapath: ring streaming time, cells, "
                                         "long random cosimulation")
    d.add_argument("--no-ring", dest="ring", action="store_false")
    d.add_argument("--no-cells", dest="cells", action="store_false")
    d.add_argument("--mesh", action="append",
                   help="cosimulate this mesh, ROWSxCOLS[:LAYERS] (repeatable)")
    d.add_argument("--layers", type=int, default=100, help="layers of a --mesh without :LAYERS")
    d.add_argument("--sim", default="verilator", choices=["verilator", "icarus"])
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--stall", type=float, default=0.25,
                   help="probability of a stall per link, DDR, dispatch and done each cycle")
    d.add_argument("--reset-every", type=int, default=0)
    d.add_argument("--slots", type=int)
    d.add_argument("--micro-slices", type=int)
    d.add_argument("--link-cycles", type=int)
    d.add_argument("--ddr-interval", type=int)
    d.add_argument("--ddr-latency", type=int)
    d.add_argument("--preload", type=int)
    d.add_argument("--rule5", action="store_true")
    d.add_argument("--build-opt", default="-O0", choices=["-O0", "-O1", "-O2"])
    d.add_argument("--out", help="also write the report (Markdown) to this file")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_datapath)

    from .cli_data import add_parsers
    add_parsers(sub)
    return ap


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except InputError as e:
        print(f"fsedp: {e}", file=sys.stderr)
        return 2
    except UsageError as e:
        print(f"fsedp: {e}" if not str(e).startswith("fsedp") else str(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
