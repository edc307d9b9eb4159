"""Bench of the scheduler top (``fsedp_scheduler``) against the golden model: one body,
:func:`bench`, run in Amaranth's simulator (``tests/test_block_benches.py::test_scheduler``,
the fast tier) and by cocotb on the generated Verilog under Verilator and Icarus
(:data:`scheduler_vs_golden`: ``tests/test_cocotb.py``, ``fsedp rtl rounds``, ``cosim``
and ``report``, ``fsedp run --scheduler rtl``), through ``tb/bench.py``.

Driver -> DUT -> monitor -> checker, each part reusable on its own:

* :class:`RoundDriver` drives a round: its ``req_init`` beats, then its gate records (the
  last one flagged ``last``), on two :class:`~fsedp.tb.bench.StreamDriver`, each beat after
  a :func:`~fsedp.tb.stimulus.pause` of chance ``stall``.
* :class:`Completions` stands in for the chiplet array on ``done``: a completion model
  (:class:`~fsedp.tb.scoreboard.DatapathModel`, or :class:`~fsedp.tb.scoreboard.
  ScriptedDatapath` replaying recorded masks) says which slots complete; the due ones go out
  as one mask, held until taken.
* :class:`DispatchMonitor` is the ``dispatch`` sink (a :class:`~fsedp.tb.bench.
  StreamMonitor`): ``ready`` low in a chance ``stall`` of the cycles, a beat not taken must
  stay, unchanged; the beats taken are decoded.  :class:`Timing` measures the latencies and
  the gaps between beats.
* The checker: :class:`~fsedp.tb.scoreboard.RoundChecker` replays the completions the RTL
  accepted into the golden model and compares every beat and the end of every round (defer
  mask, active experts, sticky flags); :class:`Expected` compares the beats with decisions
  recorded by the simulator (``expected`` in the rounds file); with ``exact_latency`` every
  round's first dispatch must come exactly at ``Scheduler.latency`` (plus the deferral's
  re-merge and the balanced order's build).

A reset in the middle of every ``reset_every``-th round (drawn within the round's
expected span; when the round is over first, in the next one) resets the DUT, the driver,
the monitor and the golden model together; the bench then waits for ``idle``.  A round not
over within ``64 * (beats + 8 E) + 10000`` cycles is a mismatch and ends the run (an RTL
that hangs fails).  Every check goes into the report; :func:`verdict` fails the run after.

Knobs: ``rounds``, ``seed``, ``stall`` (chance of a pause before a beat and of
``dispatch.ready`` low), ``tokens``, ``top_k``, ``spread``, ``warm``, ``hammer``,
``bad_records`` (the rounds: :func:`~fsedp.tb.scoreboard.make_rounds`), ``rounds_file``
(JSON list of rounds ``{"records": [[r, c, e], ...], "req_inits": [[r, t], ...]}``,
optionally ``done_script`` and ``expected``), ``reset_every``, ``max_delay`` and
``per_token`` (the completion model), ``exact_latency``, ``log_rounds`` (rounds whose
events go into the report), ``debug`` (cycles to print), ``limit`` (cycles of the whole
run; default none: the rounds' budgets bound it).  The rounds are drawn from
``random.Random(seed)`` and the timing (pauses, back-pressure, completion delays, reset
points) from a second generator, so a run of fewer rounds replays the first rounds of a
longer one cycle for cycle (``fsedp rtl cosim`` reruns up to a failing round with waves).

Report (``fsedp rtl rounds``/``cosim``/``report`` and ``sim/rtl_check.py`` read it):
``rounds``, ``resets``, ``beats``, ``mismatches``, ``first_mismatches``,
``first_mismatch_round``, ``latency_first_dispatch`` (``_plain``, ``_deferral``: rounds
without and with a deferred request), ``latency_done_to_dispatch``, ``dispatch_gaps``
(cycles, counted from the cycle after the triggering transfer: one less than
``Scheduler.latency`` counts), ``cycles``, ``logs``, ``expected_mismatches``,
``dispatch_stalled`` (cycles a beat waited on ``ready``) and ``latency_checked``.
"""

import random

from fsedp.hw.layouts import dispatch_from_bits, gate_bits, req_init_bits
from fsedp.hw.scheduler import Scheduler
from fsedp.tb.bench import Bench, StreamDriver, StreamMonitor, cocotb_entry
from fsedp.tb.scoreboard import (
    DatapathModel,
    RoundChecker,
    ScriptedDatapath,
    make_rounds,
    reset_span,
)

__all__ = [
    "component",
    "RoundDriver",
    "Completions",
    "DispatchMonitor",
    "Timing",
    "Expected",
    "bench",
    "verdict",
    "scheduler_vs_golden",
]

#: the sticky error flags compared at the end of every round
FLAGS = ("overflow", "bad_record", "spurious_done")


def component(p):
    return Scheduler(p)


def round_budget(p, items: int) -> int:
    """Cycles a round of ``items`` stream beats may take before it counts as hung."""
    return 64 * (items + 8 * p.experts) + 10000


# -- driver ----------------------------------------------------------------------------------
class RoundDriver:
    """The stimulus of one round at a time: its ``req_init`` beats, then its gate records
    once every admission was taken; items ``("init", (r, t))`` and ``("rec", (r, c, e),
    last)``.  Per cycle: :meth:`drive`, then (after every other input is set)
    :meth:`sample`."""

    def __init__(self, b: Bench, p, rng: random.Random, stall: float):
        self.b, self.p = b, p
        self.init = StreamDriver(b, "req_init", rng, stall)
        self.gate = StreamDriver(b, "gate", rng, stall)
        self.records, self.pending = [], []

    def load(self, rnd) -> int:
        """Queue round ``rnd``; its number of stream beats."""
        for r, t in rnd.req_inits:
            self.init.send(("init", (r, t)), req_init_bits(self.p, r, t))
        self.records = [tuple(x) for x in rnd.records]
        self.pending = list(self.records)
        return len(rnd.req_inits) + len(self.records)

    def drive(self):
        if self.pending and self.init.idle:
            n = len(self.pending)
            for i, rec in enumerate(self.pending):
                last = i == n - 1
                self.gate.send(("rec", rec, last), gate_bits(self.p, *rec, last))
            self.pending = []
        self.init.drive()
        self.gate.drive()

    async def sample(self):
        """The item the coming edge transfers, or ``None``."""
        a = await self.init.sample()
        g = await self.gate.sample()
        return a if a is not None else g

    def abort(self):
        """Drop the round (after a reset): nothing more is offered."""
        for d in (self.init, self.gate):
            d.queue.clear()
            d.beat = d.gap = None
            self.b.set(d.valid, 0)
        self.records, self.pending = [], []


class Completions:
    """The chiplet array's stand-in on ``done``: once ``armed``, the slots ``model`` says
    are due go out as one mask, held until taken."""

    def __init__(self, b: Bench, model):
        self.b, self.model, self.mask = b, model, 0

    def drive(self, now: int, armed: bool):
        if armed and not self.mask:
            self.mask = self.model.ready_mask(now)
        self.b.set("done.valid", bool(self.mask))
        self.b.set("done.payload", self.mask)

    async def sample(self) -> int | None:
        """The mask the coming edge transfers, or ``None``."""
        return self.mask if self.mask and await self.b.get("done.ready") else None

    def taken(self):
        self.model.on_done(self.mask)
        self.mask = 0

    def abort(self):
        self.mask = 0
        self.b.set("done.valid", 0)


# -- monitor ---------------------------------------------------------------------------------
class DispatchMonitor:
    """The ``dispatch`` sink: random back-pressure (chance ``stall``), the ``lib.stream``
    rules (:class:`~fsedp.tb.bench.StreamMonitor`), the beats taken decoded into the golden
    model's :class:`~fsedp.sw.scheduler.Dispatch`."""

    def __init__(self, b: Bench, p, rng: random.Random, stall: float):
        self.p = p
        self.stream = StreamMonitor(b, "dispatch", rng, stall)

    def drive(self):
        self.stream.drive()

    async def sample(self):
        """``(valid, beat)``: whether a beat is offered and the one the coming edge takes
        (``None`` when none is)."""
        bits = await self.stream.sample()
        if bits is not None:
            return True, dispatch_from_bits(self.p, bits)
        return self.stream.pending is not None, None

    def abort(self):
        self.stream.pending = None


class Timing:
    """Latencies of the scheduler in cycles, counted from the cycle after the triggering
    transfer: the last gate record -> first ``dispatch.valid`` of the round, a completion ->
    the next ``dispatch.valid``, and the gaps between dispatch beats with no completion
    between them."""

    def __init__(self):
        self.first: list[tuple[int, int, bool]] = []  # (round, cycles, deferring round)
        self.done_to_dispatch: list[int] = []
        self.gaps: list[int] = []
        self.start_round()

    def start_round(self):
        self.t_last = self.t_done = self.last_beat = None
        self.first_seen = False

    def records_sent(self, now: int):
        self.t_last = now

    def offered(self, index: int, now: int, deferring: bool) -> int | None:
        """``dispatch.valid`` is up in cycle ``now``; the first-dispatch latency when this
        is the round's first."""
        first = None
        if self.t_last is not None and not self.first_seen:
            first = now - self.t_last
            self.first.append((index, first, deferring))
            self.first_seen = True
        if self.t_done is not None:
            self.done_to_dispatch.append(now - self.t_done)
            self.t_done = None
        return first

    def beat(self, now: int):
        if self.last_beat is not None:
            self.gaps.append(now - self.last_beat)
        self.last_beat = now

    def completion(self, now: int):
        self.t_done, self.last_beat = now, None


# -- checker ---------------------------------------------------------------------------------
class Expected:
    """Compares the beats of a round with the decisions the simulator recorded for it
    (``[kind, expert, entry, traj]`` each); the first ten differences."""

    def __init__(self):
        self.diffs: list[str] = []
        self.decisions = None
        self.seen = 0

    def start_round(self, decisions):
        self.decisions, self.seen = decisions, 0

    def _diff(self, text):
        if len(self.diffs) < 10:
            self.diffs.append(text)

    def beat(self, index: int, got):
        if self.decisions is None:
            return
        i, self.seen = self.seen, self.seen + 1
        want = self.decisions[i] if i < len(self.decisions) else None
        have = [got.kind, got.expert, got.entry, got.traj]
        if want != have:
            self._diff(f"round {index}, decision {i}: simulator {want}, RTL {have}")

    def end_round(self, index: int):
        if self.decisions is not None and self.seen != len(self.decisions):
            self._diff(
                f"round {index}: simulator made {len(self.decisions)} decisions, RTL {self.seen}"
            )


def first_dispatch_latency(p, latency: int, plan) -> int:
    """The cycles :class:`Timing` counts to the first dispatch of a round: ``latency - 1``
    (``Scheduler.latency``, counted from the transfer), plus ``ceil(E / eit_lanes) + 1`` when
    the round defers a request, plus ``n + 2`` with ``balance`` (``docs/blocks/scheduler.md``)."""
    extra = -(-p.experts // p.eit_lanes) + 1 if plan.defer else 0
    return latency - 1 + extra + (plan.n + 2 if p.balance else 0)


def verdict(b: Bench, report: dict, rounds: int):
    """Fail the run when the report holds a mismatch or a round was not run to its end."""
    problems = report["first_mismatches"] + report["expected_mismatches"]
    if report["rounds"] + report["resets"] != rounds:
        problems.append(f"{report['rounds']} rounds + {report['resets']} resets of {rounds}")
    if problems:
        b.fail(f"{report['mismatches']} mismatches:\n" + "\n".join(problems))


# -- the body --------------------------------------------------------------------------------
async def wait_idle(b: Bench, budget: int):
    """After reset the EIT is cleared (``E`` cycles), then ``idle`` rises."""
    await b.until(lambda: b.get("idle"), "idle after reset", budget)


async def bench(b: Bench, p, knobs: dict, report=None) -> dict:
    """Run the knobs' rounds through the scheduler; the report (passed to ``report``, when
    given, before :func:`verdict` fails the run)."""
    k = knobs
    seed, stall = k.get("seed", 1), k.get("stall", 0.25)
    reset_every = k.get("reset_every", 0)
    rounds = make_rounds(p, k, random.Random(seed))
    rng = random.Random(f"timing-{seed}")
    if "limit" not in k:
        b.limit = float("inf")
    checker = RoundChecker(p)
    driver = RoundDriver(b, p, rng, stall)
    monitor = DispatchMonitor(b, p, rng, stall)
    timing, expected = Timing(), Expected()
    resets = rounds_done = latency_checked = 0
    reset_due = False
    logs = []
    await wait_idle(b, round_budget(p, 0))

    for index, rnd in enumerate(rounds):
        script = getattr(rnd, "done_script", None)
        model = (
            ScriptedDatapath(p.chiplets, script)
            if script is not None
            else DatapathModel(
                p.chiplets, rng, max_delay=k.get("max_delay", 12), per_token=k.get("per_token", 0)
            )
        )
        done = Completions(b, model)
        items = driver.load(rnd)
        expected.start_round(getattr(rnd, "expected", None))
        timing.start_round()
        checker.round = index
        log = [] if index < k.get("log_rounds", 0) else None
        start, budget = b.cycle, round_budget(p, items)
        if reset_every and index % reset_every == reset_every - 1:
            reset_due = True  # in this round, or the next when this one is over first
        reset_at = start + rng.randrange(1, reset_span(p, items, stall)) if reset_due else None
        sent_last = over = False
        outcome = None  # "reset" or "hung" when the round did not end
        while not over:
            now = b.cycle
            b.case = f"round {index}"
            # -- drive (just after the edge) ------------------------------------------------
            driver.drive()
            monitor.drive()
            done.drive(now, sent_last)
            if now - start > budget:
                outcome = "hung"
                if script is not None:  # a scripted completion names a slot never filled
                    expected.diffs.append(
                        f"round {index}: no progress after {now - start} cycles; "
                        f"completions {model.script[:3]} still pending"
                    )
                else:
                    checker.miss("round not over", f"within {budget} cycles", "running")
                break
            if reset_at is not None and now >= reset_at:
                await b.reset(2)
                driver.abort()
                monitor.abort()
                done.abort()
                checker.reset()
                resets += 1
                reset_due = False
                outcome = "reset"
                break
            # -- sample (the values the coming edge sees) -------------------------------------
            idle = await b.get("idle")
            over = sent_last and bool(idle)
            if over:
                status = [await b.get(x) for x in ("deferred", "n_active")]
                flags = {x: await b.get(x) for x in FLAGS}
                if log is not None:
                    logs.append(
                        {
                            "round": index,
                            "deferred": status[0],
                            "n_active": status[1],
                            "events": log,
                        }
                    )
                checker.end_round(*status, flags)
                expected.end_round(index)
                rounds_done += 1
            valid, got = await monitor.sample()
            if valid:
                plan = checker.plan
                first = timing.offered(index, now, bool(plan and plan.defer))
                if first is not None and k.get("exact_latency") and plan is not None:
                    want = first_dispatch_latency(p, b.component.latency, plan)
                    latency_checked += 1
                    if first != want:
                        checker.miss("first dispatch latency (cycles)", want, first)
            sent = await driver.sample()
            completed = await done.sample()
            if k.get("debug") and now < k["debug"]:
                print(
                    f"c{now} sent={sent} idle={idle} sent_last={sent_last} valid={valid} "
                    f"got={got} done={done.mask} taken={completed}",
                    flush=True,
                )
            await b.tick()
            if over:
                break
            # -- bookkeeping of the transfers at this edge ------------------------------------
            now = b.cycle
            if sent is not None:
                if sent[0] == "init":
                    checker.init_request(*sent[1])
                elif sent[2]:
                    sent_last = True
                    timing.records_sent(now)
                    checker.start_round(driver.records)
            if got is not None:
                timing.beat(now)
                checker.on_dispatch(got)
                expected.beat(index, got)
                if got.kind == 0:
                    model.on_dispatch(got.entry, now, got.count, got.traj)
                if log is not None:
                    log.append({"cycle": now, **got.as_dict()})
            if completed is not None:
                if log is not None:
                    log.append({"cycle": now, "kind": "done", "slots": completed})
                checker.on_done(completed)
                done.taken()
                timing.completion(now)
        if outcome == "hung":
            break
        if outcome == "reset":
            await wait_idle(b, round_budget(p, 0))

    mismatches = checker.mismatches
    out = {
        "rounds": rounds_done,
        "resets": resets,
        "beats": checker.beats,
        "mismatches": len(mismatches),
        "first_mismatches": [str(m) for m in mismatches[:10]],
        "first_mismatch_round": mismatches[0].round if mismatches else None,
        "latency_first_dispatch": [x for _, x, _ in timing.first],
        # the same, split by whether token buffering deferred a request in the round
        "latency_first_dispatch_plain": [x for _, x, d in timing.first if not d],
        "latency_first_dispatch_deferral": [x for _, x, d in timing.first if d],
        "latency_done_to_dispatch": timing.done_to_dispatch,
        "cycles": b.cycle,
        "logs": logs,
        "dispatch_gaps": timing.gaps,
        "expected_mismatches": expected.diffs,
        "dispatch_stalled": monitor.stream.stalled,
        "latency_checked": latency_checked,
    }
    if report is not None:
        report(out)
    verdict(b, out, len(rounds))
    return out


async def _bench_reporting(b: Bench, p, knobs: dict) -> dict:
    """:func:`bench` writing its report (``FSEDP_REPORT``) before the verdict, so that a
    failing run still tells its mismatches to ``fsedp rtl cosim``/``rounds``."""
    from fsedp.tb.streams import write_report

    return await bench(b, p, knobs, report=write_report)


scheduler_vs_golden = cocotb_entry("scheduler_vs_golden", component, _bench_reporting)
