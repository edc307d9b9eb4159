"""The runs of the ``fsedp rtl`` commands and the text of their outcomes: Verilog written
(and linted), the scheduler RTL run by its testbench against the golden model (``rounds``,
``cosim`` with the cocotb or the native driver, ``coverage``), the report pages of ``rtl
report`` and ``rtl datapath``, and the formal checks.  The command-line module
(:mod:`fsedp.cli.rtl`) parses and checks the options and calls these; each returns the JSON
document, the text and whether the run passed, so that ``--json`` and the text agree."""

import dataclasses
import tempfile
import time
from pathlib import Path

from fsedp import jsondoc
from fsedp.config import config_to_dict
from fsedp.files import build_dir, output_dir, sigterm_raises, work_folder
from fsedp.log import logger

__all__ = [
    "LATENCIES",
    "stats",
    "latency_stats",
    "run_tb",
    "verilog",
    "rounds",
    "cosim",
    "NATIVE_REPORT",
    "native_report_path",
    "cosim_native",
    "coverage",
    "report_page",
    "datapath_mesh",
    "datapath_page",
    "fpga_page",
    "datapath_ok",
    "formal_list",
    "formal",
]

_log = logger("rtl")

#: the latency lists a scheduler testbench reports (cycles), summarised by :func:`stats`
LATENCIES = (
    "latency_first_dispatch",
    "latency_first_dispatch_plain",
    "latency_first_dispatch_deferral",
    "latency_done_to_dispatch",
)


def stats(xs) -> dict:
    """``n``, ``min``, ``mean`` (two decimals) and ``max`` of ``xs``; ``{}`` when empty."""
    return (
        {"n": len(xs), "min": min(xs), "mean": round(sum(xs) / len(xs), 2), "max": max(xs)}
        if xs
        else {}
    )


def latency_stats(res: dict) -> dict:
    """:func:`stats` of each of a testbench report's :data:`LATENCIES`, as
    ``<name>_cycles``."""
    return {f"{k}_cycles": stats(res.get(k, [])) for k in LATENCIES}


def run_tb(p, sim, knobs, tag, opt="-O0", waves=False) -> dict:
    """The scheduler's cocotb testbench at ``p`` on ``sim``, built under ``build/cosim``
    (:func:`fsedp.tb.runner.run_tb`); its report."""
    from fsedp.tb.runner import run_tb as run

    return run(
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


def verilog(p, blocks, dp, dp_blocks, out, force: bool, lint: bool):
    """``fsedp rtl verilog``: the Verilog of ``blocks`` at the scheduler generics ``p`` and
    of ``dp_blocks`` at the datapath generics ``dp`` (the chip at both,
    :func:`fsedp.hw.generate.top_params`), written into the folder ``out`` whole
    or not at all (:func:`~fsedp.files.output_dir`), each linted by Verilator with ``lint``.
    ``(doc, text, ok)``: ok when every lint is clean."""
    from fsedp.hw.generate import top_params, write_verilog

    files, linted = [], {}
    with output_dir(out, force) as staged:
        for b in blocks:
            files.append(write_verilog(b, p, staged).name)
        for b in dp_blocks:
            files.append(write_verilog(b, top_params(b, p, dp), staged).name)
        if lint:
            from fsedp.tb.runner import lint_files

            linted = lint_files([staged / f for f in files])
    out = Path(out)
    linted = {str(out / Path(f).name): v for f, v in linted.items()}
    files = [str(out / f) for f in files]
    doc = {
        "params": dataclasses.asdict(p),
        "files": files,
        "lint": linted,
        "datapath_params": dataclasses.asdict(dp) if dp_blocks else None,
    }
    text = "\n".join(f"wrote {f}" + (f"  lint: {linted[f]}" if f in linted else "") for f in files)
    return doc, text, all(v == "clean" for v in linted.values())


def rounds(cfg, p, sched_rounds, sim: str, show_rounds: int):
    """``fsedp rtl rounds``: the run config ``cfg``'s scheduling rounds (``sched_rounds``,
    :func:`fsedp.workload.rounds`) through the scheduler RTL at its generics ``p`` on ``sim``
    beside the golden model; the full schedule of the first ``show_rounds`` rounds in the
    text.  ``(doc, text, ok)``: ok when RTL and golden model agree."""
    with tempfile.TemporaryDirectory() as tmp:
        rf = Path(tmp) / "rounds.json"
        rf.write_text(
            jsondoc.dumps([{"records": r.records, "req_inits": r.req_inits} for r in sched_rounds])
        )
        t0 = time.time()
        res = run_tb(
            p,
            sim,
            {
                "rounds_file": str(rf),
                "stall": 0.0,
                "per_token": 4,
                "max_delay": 4,
                "seed": cfg.scenario.seed,
                "log_rounds": len(sched_rounds),
            },
            tag="-run",
        )
    wall = time.time() - t0
    doc = {
        "config": config_to_dict(cfg),
        "params": dataclasses.asdict(p),
        "simulator": sim,
        "rounds": res.get("rounds", 0),
        "beats": res.get("beats", 0),
        "mismatches": res.get("mismatches"),
        "first_mismatches": res.get("first_mismatches", []),
        **latency_stats(res),
        "schedule": res.get("logs", []),
        "wall_s": round(wall, 1),
    }
    lines = [
        f"FSE-DP scheduler: {cfg.model.name} on {cfg.hardware.name} "
        f"({p.chiplets} chiplets, {p.experts} experts, {cfg.scenario.tokens_per_iteration} "
        f"tokens/iteration, top-{cfg.model.top_k}); RTL on {sim}"
    ]
    for log in doc["schedule"]:
        lines += _round_lines(p, log, full=log["round"] < show_rounds)
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
    return doc, "\n".join(lines), doc["mismatches"] == 0


def _round_lines(p, log: dict, full: bool) -> list[str]:
    """One scheduling round of the testbench's log: its summary line and, when ``full``,
    every beat (cycle, kind, expert, tokens, trajectory, entry chiplet, ring order)."""
    deferred = [r for r in range(p.requests) if log["deferred"] >> r & 1]
    beats = [ev for ev in log["events"] if ev["kind"] != "done"]
    span = (beats[-1]["cycle"] - beats[0]["cycle"]) if beats else 0
    lines = [
        f"\nround {log['round']}: {log['n_active']} experts to schedule, "
        f"deferred requests {deferred or 'none'}, {len(beats)} dispatch/pre-load "
        f"beats over {span} cycles"
    ]
    if not full:
        return lines
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
    return lines


def cosim(p, sim: str, knobs: dict, opt: str, waves: bool):
    """``fsedp rtl cosim`` with the cocotb driver: random scheduling rounds (``knobs``:
    rounds, seed, stall, reset_every, tokens, top_k) through the scheduler RTL at ``p`` on
    ``sim`` and its golden model.  A failing run records itself: the same seed again up to
    the failing round with every signal recorded.  ``(doc, text, ok)``."""
    seed = knobs["seed"]
    t0 = time.time()
    res = run_tb(p, sim, knobs, tag=f"-cosim{seed}", opt=opt, waves=waves)
    wall = time.time() - t0
    doc = {
        "params": dataclasses.asdict(p),
        "simulator": sim,
        "rounds": res.get("rounds"),
        "resets": res.get("resets"),
        "beats": res.get("beats"),
        "cycles": res.get("cycles"),
        "mismatches": res.get("mismatches"),
        "first_mismatches": res.get("first_mismatches", []),
        **latency_stats(res),
        "wall_s": round(wall, 1),
        "log": res.get("log"),
        "waves": res.get("waves"),
    }
    if doc["mismatches"] is None:
        doc["mismatches"] = "testbench failed before reporting"
    text = (
        f"cosim {sim}: {p.experts} experts, {p.chiplets} chiplets, {doc['rounds']} rounds "
        f"(+{doc['resets']} reset mid-round), {doc['beats']} dispatch beats, {doc['cycles']} "
        "cycles "
        f"in {doc['wall_s']} s\nmismatches: {doc['mismatches']}"
    )
    for m in doc["first_mismatches"]:
        text += f"\n  {m}"
    bad_round = res.get("first_mismatch_round")
    if bad_round is not None and not waves:
        # the rounds and stalls before the failing one replay identically
        again = run_tb(
            p,
            sim,
            {**knobs, "rounds": bad_round + 1},
            tag=f"-cosim{seed}-waves",
            opt=opt,
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
    return doc, text, doc["mismatches"] == 0 and res.get("failed") == 0


#: the JSON report of ``rtl cosim --driver native`` without ``--report``, in ``build/cosim``
NATIVE_REPORT = "native-{experts}x{chiplets}-seed{seed}.json"


def native_report_path(p, seed: int) -> Path:
    """Where ``rtl cosim --driver native`` writes its JSON report without ``--report``."""
    return build_dir(
        "cosim", NATIVE_REPORT.format(experts=p.experts, chiplets=p.chiplets, seed=seed)
    )


def cosim_native(p, knobs: dict, report, opt: str, progress_s: float, quiet: bool):
    """``fsedp rtl cosim --driver native``: the C++ driver, the golden model checking its
    transfers as they stream out (:mod:`fsedp.tb.native`), its JSON report rewritten at
    ``report`` (default :func:`native_report_path`) as it goes.  Progress lines every
    ``progress_s`` seconds unless ``quiet``; SIGTERM stops the run as Ctrl-C does, and a
    stopped run still reports what it checked.  ``(doc, text, ok)``."""
    from fsedp.tb.native import run_native

    report = Path(report or native_report_path(p, knobs["seed"]))

    def progress(run):
        rate = f"{run.cycles / run.wall_s:,.0f} cycles/s" if run.wall_s else ""
        _log.info(
            f"{run.rounds + run.resets}/{run.rounds_total} rounds checked, "
            f"{run.mismatches} mismatches, {run.cycles:,} cycles, {rate}"
        )

    with sigterm_raises(KeyboardInterrupt):
        run = run_native(
            p,
            knobs,
            build_dir("cosim"),
            opt=opt,
            report=report,
            progress=None if quiet else progress,
            progress_s=progress_s,
            log=None if quiet else _log.info,
        )
    summary = run.summary()
    doc = {
        "params": dataclasses.asdict(p),
        "simulator": "verilator",
        "driver": "native",
        **{k: v for k, v in summary.items() if k not in LATENCIES},
        **latency_stats(summary),
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
    return doc, text, run.complete and run.mismatches == 0


def coverage(p, rounds: int, batches: int, seed: int, opt: str, quiet: bool):
    """``fsedp rtl coverage``: functional coverage per block from checked native
    regressions, the stimulus steered at the bins still missed
    (:func:`fsedp.tb.coverage.close_coverage`).  ``(doc, text, ok)``: ok when every
    reachable bin was hit and nothing mismatched."""
    from fsedp.tb.coverage import close_coverage

    def say(msg):
        if not quiet:
            _log.info(msg)

    t0 = time.time()
    cov, history, mismatches = close_coverage(
        p, build_dir("cosim"), rounds=rounds, batches=batches, seed=seed, opt=opt, log=say
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
    return doc, "\n".join(lines), not missed and not mismatches


def report_page(command: str, sim: str, base, rows, doc: dict | None = None) -> str:
    """The page of ``fsedp rtl report`` (Markdown): how it was produced (``command``, today,
    ``sim``, the generics ``base`` other than E and C) and the tables of ``rows``
    (:func:`fsedp.experiments.rtl_report.rtl_report`); from ``doc`` (the command's JSON
    document) the library tables and the FPGA table where they were asked for."""
    from fsedp.experiments.rtl_report import format_report

    doc = doc or {}
    lib = doc.get("library")
    text = (
        "# RTL report: scheduling latency, cells, area, timing and power\n\n"
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d')} "
        f"({sim} for latency; Debian Yosys with ABC for cells"
        + (f"; `{lib['name']}` with Yosys, ABC and OpenSTA for area and timing" if lib else "")
        + f"). Parameters other than E and C: `{dataclasses.asdict(base)}`.\n\n"
        + format_report(rows, lib, doc.get("datapath"))
    )
    if doc.get("fpga"):
        from fsedp.experiments.fpga import fpga_table

        text += (
            "\n\nOn the FPGA (`fsedp rtl fpga`'s flow: Yosys `synth_ecp5`, nextpnr-ecp5, "
            "[`fpga.md`](fpga.md)), the scheduler and the chip top at the generics of the "
            "chip above:\n\n" + fpga_table(doc["fpga"])
        )
    return text


def datapath_mesh(sp, p, layers: int, sim: str, seed: int, stall, reset_every, opt, waves, quiet):
    """One ``--mesh`` of ``fsedp rtl datapath``: ``layers`` random layers through the chiplet
    array RTL at ``p`` (scheduler generics ``sp``) in lockstep with the golden model
    (:func:`fsedp.experiments.datapath_report.long_run`).  A failing run records itself:
    the same seed again up to the failing layer, every signal recorded.  The run's result,
    with ``params`` and ``sim``."""
    from fsedp.experiments.datapath_report import long_run

    if not quiet:
        _log.info(f"cosimulating {layers} layers on {p.rows}x{p.cols} ({sim}) ...")
    same = dict(sim=sim, seed=seed, stall=stall, reset_every=reset_every, opt=opt)
    res = long_run(sp, p, layers, waves=waves, **same)
    bad = res.get("first_mismatch_layer")
    if bad is not None and not waves:
        again = long_run(sp, p, bad + 1, waves=True, **same)
        res.update(waves=again.get("waves"), waves_layer=bad)
    res.update(params=dataclasses.asdict(p), sim=sim)
    return res


def datapath_page(command: str, text: str) -> str:
    """The page ``fsedp rtl datapath --out`` writes: a title, the command that made it, the
    date and ``text``."""
    return (
        f"# Chiplet datapath report\n\nProduced by `{command}` on "
        f"{time.strftime('%Y-%m-%d')}.\n\n" + text
    )


def fpga_page(command: str, rows) -> str:
    """The page ``fsedp rtl fpga`` writes into its report folder: a title, the command that
    made it, the date and :func:`fsedp.experiments.fpga.fpga_table` of ``rows``."""
    from fsedp.experiments.fpga import fpga_table

    return (
        f"# FPGA report\n\nProduced by `{command}` on {time.strftime('%Y-%m-%d')}.\n\n"
        + fpga_table(rows)
        + "\n"
    )


def datapath_ok(runs) -> bool:
    """Every datapath run passed: no failed test, no mismatch, no violation."""
    return all(
        r.get("failed") == 0 and r.get("mismatches") == 0 and not r.get("violations") for r in runs
    )


def formal_list(names):
    """``fsedp rtl formal --list``: each check of ``names`` with its block, depth and
    properties (:mod:`fsedp.tb.formal`).  ``(doc, text)``."""
    from fsedp.tb.formal import CHECKS, properties

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
    return doc, text


def formal(names, folder, force: bool, depth, solver: str, quiet: bool):
    """``fsedp rtl formal``: each check of ``names`` proved by bounded model checking
    (:func:`fsedp.tb.formal.prove`, ``depth`` cycles or the check's own) in its own folder
    of the work folder ``folder`` (:func:`~fsedp.files.work_folder`), a line printed as each
    property is decided unless ``quiet``.  ``(doc, text, ok)``: ok when every property
    holds."""
    with work_folder(folder, force) as out:
        results = _prove(names, out, depth, solver, quiet)
    doc = {
        "solver": solver,
        "checks": [dataclasses.asdict(r) | {"status": r.status} for r in results],
    }
    ok = all(r.status == "pass" for r in results)
    text = f"{sum(len(r.properties) for r in results)} properties: " + (
        "all hold" if ok else "FAILED: " + "; ".join(f for r in results for f in r.failed)
    )
    return doc, text, ok


def _prove(names, out, depth, solver: str, quiet: bool) -> list:
    """Each check of ``names`` proved in its own folder under ``out``, progress printed."""
    from fsedp.tb.formal import CHECKS, prove

    results = []
    for n in names:
        check = CHECKS[n]

        def progress(name, rec, n=n):
            if not quiet:
                extra = f", induction {rec['induction']}" if rec.get("induction") else ""
                why = f": {'; '.join(rec.get('failed', []))}" if rec["status"] != "pass" else ""
                vcd = f" (counterexample {rec['vcd']})" if rec.get("vcd") else ""
                print(
                    f"{n}: {name}: {rec['status']} at depth {rec['depth']} in "
                    f"{rec['seconds']} s{extra}{why}{vcd}",
                    flush=True,
                )

        results.append(prove(check, Path(out) / n, depth=depth, solver=solver, progress=progress))
    return results
