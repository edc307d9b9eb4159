"""The layer loops' progress watchdog (``fsedp.sw.streaming.watchdog``): a scheduler decision
the datapath cannot serve stops both streaming engines at once, at the same cycle, with
:class:`SimulationStalled` and the same layer state; a legal layer never trips it, however
long it stays quiet.

The contradicting runs go through a subprocess with a time limit (pytest-timeout is not a
dependency): a watchdog that fails to fire makes the test fail, not hang.  Run as a script
(``python tests/test_watchdog.py``) this file prints that subprocess's JSON."""

import dataclasses
import json
import pickle
import subprocess
import sys
import time

import pytest
from tiny import TINY

from fsedp.config import run_from_dict
from fsedp.params import DatapathParams, SchedulerParams
from fsedp.sim.fsedp import fsedp_layer
from fsedp.sim.setup import make_setup
from fsedp.sw.scheduler import DISPATCH, PRELOAD, Dispatch, Scheduler
from fsedp.sw.streaming import SimulationStalled, StepIn, StreamingArray
from fsedp.sw.streaming.watchdog import MESSAGE_CHARS, array_state
from fsedp.workload import iterations

#: the scheduler decisions the datapath cannot serve (:class:`Contradicting`)
CASES = ("off-trajectory", "busy-entry", "dropped", "as-preload")
#: a pre-load of an expert outside the round: the round closes, the array never idles
STRAY = "stray-preload"
#: wall seconds a stalled layer may take on either engine (it stops within a few hundred
#: to a few thousand simulated cycles; compilation is not timed)
STOP_S = 10.0
#: the subprocess's limit: numba may have to compile the kernel first
SUBPROCESS_S = 900


class Contradicting(Scheduler):
    """The scheduler golden model with its first eligible dispatch beat made one the datapath
    cannot serve (the scheduler still believes it made the original decision):

    * ``off-trajectory``: the entry chiplet is outside the trajectory (refused: bad_dispatch);
    * ``busy-entry``: the beat reuses the entry slot (and trajectory) of the job dispatched
      just before it, still running (refused: bad_dispatch);
    * ``dropped``: the beat is never sent;
    * ``as-preload``: the beat is sent as a pre-load (its micro-slices are held for ever);
    * ``stray-preload``: a pre-load of an expert outside the round follows the first beat
      (the round closes as it should, but that expert's micro-slices are held for ever)."""

    def __init__(self, p: SchedulerParams, how: str):
        super().__init__(p)
        self.how = how
        self.hit = False

    def decide(self):
        out = super().decide()
        if self.hit:
            return out
        full = (1 << self.p.chiplets) - 1
        if self.how == STRAY and out:
            stray = min(set(range(self.p.experts)) - set(self.plan.order))
            hops = (0,) * self.p.chiplets
            out.append(Dispatch(PRELOAD, stray, 2, 0b0001, 0, hops))
            self.hit = True
            return out
        for i, b in enumerate(out):
            if b.kind != DISPATCH:
                continue
            if self.how == "off-trajectory" and b.traj != full:
                off = next(c for c in range(self.p.chiplets) if not b.traj >> c & 1)
                out[i] = dataclasses.replace(b, entry=off)
            elif self.how == "busy-entry" and i > 0 and out[0].kind == DISPATCH:
                out[i] = dataclasses.replace(b, entry=out[0].entry, traj=out[0].traj)
            elif self.how == "dropped":
                del out[i]
            elif self.how == "as-preload":
                out[i] = dataclasses.replace(b, kind=PRELOAD)
            else:
                continue
            self.hit = True
            break
        return out


def tiny_layer():
    cfg = run_from_dict(TINY, "tiny.yaml")
    return make_setup(cfg), iterations(cfg, 1, 1)[0][0].records


def run_cases() -> dict:
    """Every case on every engine: ``{case: {engine: {seconds, error, message, state,
    hit}}}`` (``state`` through JSON, as the parent reads it)."""
    from fsedp.sim.fast import available

    setup, records = tiny_layer()
    engines = ["python"] + (["compiled"] if available() else [])
    if "compiled" in engines:  # compile or load the kernel before timing anything
        fsedp_layer(setup, records, "A3", streaming="compiled")
    out = {}
    for how in (*CASES, STRAY):
        out[how] = {}
        # the stray pre-load's expert (0) is left out of its layer
        recs = [r for r in records if r[2] != 0] if how == STRAY else records
        for engine in engines:
            sched = Contradicting(setup.sp, how)
            t0 = time.perf_counter()
            got = {"error": None, "message": None, "state": None}
            try:
                fsedp_layer(setup, recs, "A3", sched=sched, streaming=engine)
            except SimulationStalled as e:
                got = {"error": type(e).__name__, "message": str(e), "state": e.state}
                got["engine"] = e.engine
            got["seconds"] = time.perf_counter() - t0
            got["hit"] = sched.hit
            out[how][engine] = got
    return json.loads(json.dumps(out))


@pytest.fixture(scope="module")
def stalls():
    try:
        proc = subprocess.run(
            [sys.executable, __file__],
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the contradicting layers ran for {SUBPROCESS_S} s: the watchdog did not fire")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("how", CASES)
def test_contradicting_decision_stops_both_engines_with_the_same_state(stalls, how):
    runs = stalls[how]
    for engine, got in runs.items():
        assert got["hit"], f"{how}: the contradicting beat was never made"
        assert got["error"] == "SimulationStalled", f"{how} on {engine}: the layer ended"
        assert got["engine"] == engine
        assert got["seconds"] < STOP_S, f"{how} on {engine}: {got['seconds']:.1f} s"
        msg, st = got["message"], got["state"]
        assert "\n" not in msg and len(msg) <= MESSAGE_CHARS
        assert msg.startswith(f"layer stalled at cycle {st['cycle']} ({engine} engine)")
        # the message is the state's (and survives a process boundary)
        again = pickle.loads(pickle.dumps(SimulationStalled(engine, st)))
        assert str(again) == msg and again.state == st and again.cycle == st["cycle"]
        # the contradiction is in the state: the scheduler waits for a done of an entry
        # slot that has no job, and the loop stopped in a fixed point (nothing in flight)
        waits = {int(s) for s in st["scheduler"]["running"]}
        assert waits - {j["entry"] for j in st["jobs"]}, st
        assert st["scheduler"]["in_round"] and not any(st["ddr_queued"])
        assert all(ch["computing"] is None for ch in st["chiplets"])
        assert st["bad_dispatch"] == (how in ("off-trajectory", "busy-entry"))
        if how == "as-preload":
            assert any("held" in s[5] for ch in st["chiplets"] for s in ch["slots"])
    if "compiled" not in runs:
        pytest.skip("numba is not installed: the Python engine only")
    assert runs["python"]["state"] == runs["compiled"]["state"]
    assert (
        str(SimulationStalled("compiled", runs["python"]["state"])) == (runs["compiled"]["message"])
    )


def test_a_stray_preload_stops_both_engines_after_the_round_closed(stalls):
    """Outside the round's open phase: every expert of the round was dispatched and has
    completed (the scheduler's round is closed), but a pre-load of an expert outside it
    holds its micro-slices for ever, so the array never idles -- the loop would go on, and
    the watchdog stops it, on both engines with the same state."""
    runs = stalls[STRAY]
    for engine, got in runs.items():
        assert got["hit"] and got["error"] == "SimulationStalled", (engine, got["error"])
        assert got["seconds"] < STOP_S and got["engine"] == engine
        st = got["state"]
        sch = st["scheduler"]
        assert sch == {"in_round": False, "running": {}, "undispatched": []}
        assert st["jobs"] == [] and len(st["preloads"]) == 1
        held = [s for ch in st["chiplets"] for s in ch["slots"]]
        stray = st["preloads"][0]["expert"]
        assert held and all("held" in s[5] and s[1] == stray for s in held)
        assert not st["bad_dispatch"] and not st["orphan"]
    if "compiled" not in runs:
        pytest.skip("numba is not installed: the Python engine only")
    assert runs["python"]["state"] == runs["compiled"]["state"]


def test_legal_layer_quiet_for_long_never_trips_the_watchdog():
    """The watchdog is not a time-out: a layer whose every DDR load takes 20 000 cycles (so
    nothing happens for thousands of cycles at a time) runs to its end on both engines."""
    from fsedp.sim.fast import available

    cfg = run_from_dict(TINY, "tiny.yaml")
    setup = make_setup(cfg, ddr_latency=20_000, link_cycles=500)
    records = iterations(cfg, 1, 1)[0][0].records
    py = fsedp_layer(setup, records, "A3", streaming="python")
    assert py.cycles > 2 * 20_000
    if available():
        fast = fsedp_layer(setup, records, "A3", streaming="compiled")
        assert dataclasses.asdict(fast) == dataclasses.asdict(py)


def test_stuck_is_a_fixed_point_and_never_set_while_streaming():
    """On the golden model itself: a legal expert streams to the end without ``stuck``
    before the array is idle; an expert pre-loaded and never dispatched reaches ``stuck``,
    after which no cycle changes anything but the cycle count."""
    sp = SchedulerParams(
        chiplets=4,
        experts=8,
        count_width=6,
        requests=4,
        theta_min=0,
        n_threshold=2,
        qos_width=2,
    )
    p = DatapathParams.for_scheduler(
        sp, 2, 2, slots=8, micro_slices=4, preload_entries=2, ddr_interval=3, ddr_latency=5
    )
    arr = StreamingArray(p)
    for c in range(4):
        arr.step(StepIn(tokens=(c, 1, c + 1)))
    arr.step(StepIn(dispatch=Dispatch(DISPATCH, 1, 10, 0b1111, 0, (1, 2, 3, 0))))
    for _ in range(2000):
        arr.step(StepIn())
        assert not arr.stuck or arr.idle
        if arr.idle:
            break
        arr.fast_forward()
    assert arr.idle

    arr.step(StepIn(dispatch=Dispatch(PRELOAD, 1, 10, 0b0011, 0, (1, 0, 0, 0))))
    for _ in range(2000):
        arr.step(StepIn())
        if arr.stuck:
            break
        arr.fast_forward()
    assert arr.stuck and not arr.idle
    frozen = {**array_state(arr), "cycle": None}
    assert any("held" in s[5] for ch in frozen["chiplets"] for s in ch["slots"])
    for _ in range(300):
        out = arr.step(StepIn())
        assert arr.stuck and not out.ddr_issues and not out.transfers
        assert {**array_state(arr), "cycle": None} == frozen


if __name__ == "__main__":
    print(json.dumps(run_cases()))
