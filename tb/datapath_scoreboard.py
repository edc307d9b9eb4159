"""Stimulus and checking of the chiplet datapath, shared by the golden-model tests, the
Amaranth-simulator tests and the cocotb testbench (``tb/tb_chiplet_array.py``).

* :class:`LayerDriver` couples the scheduler golden model to a datapath (the golden
  :class:`~.streaming.StreamingArray` or the RTL): it writes the layer's token tables
  (and, with ``slice_table``, the micro-slice count of every expert, [D13]), presents the
  scheduler's dispatch beats (with random valid gaps), feeds accepted
  completions back into the scheduler and draws the random link and DDR stalls.
* :class:`Conservation` checks, from the datapath's outputs alone, that every micro-slice of
  every dispatched expert is computed exactly once on every chiplet of its trajectory, that
  no buffer holds more than ``K`` micro-slices and that all are freed at the end.
"""

import random
from collections import deque

from fsedp.params import DatapathParams, SchedulerParams
from fsedp.sw.scheduler import DISPATCH, Dispatch, Scheduler, layer_tokens
from fsedp.sw.streaming import StepIn

__all__ = ["LayerDriver", "Conservation", "Violation"]


class Violation(AssertionError):
    pass


class Conservation:
    """Per-layer conservation, occupancy and release checks."""

    def __init__(self, p: DatapathParams):
        self.p = p
        self.expected: set[tuple[int, int, int]] = set()  # (expert, index, chiplet)
        self.computed = 0
        self.peak = [0] * p.chiplets
        #: micro-slices each expert streams in this layer ([D13]; default ``micro_slices``)
        self.counts: dict[int, int] = {}

    def on_dispatch(self, b: Dispatch):
        if b.kind != DISPATCH:
            return
        for i in range(self.counts.get(b.expert, self.p.micro_slices)):
            for c in range(self.p.chiplets):
                if b.traj >> c & 1:
                    key = (b.expert, i, c)
                    if key in self.expected:
                        raise Violation(f"expert {b.expert} dispatched twice in one layer")
                    self.expected.add(key)

    def on_cycle(self, cycle: int, events, occupancy):
        for c, ev in enumerate(events):
            if ev is None:
                continue
            key = (ev[0], ev[1], c)
            if key not in self.expected:
                raise Violation(
                    f"cycle {cycle}: chiplet {c} computed micro-slice {ev[1]} of "
                    f"expert {ev[0]}, which is not (or no longer) owed there"
                )
            self.expected.remove(key)
            self.computed += 1
        for c, o in enumerate(occupancy):
            if o > self.p.slots:
                raise Violation(f"cycle {cycle}: chiplet {c} holds {o} > {self.p.slots} slots")
            self.peak[c] = max(self.peak[c], o)

    def end_layer(self, occupancy):
        if self.expected:
            missing = sorted(self.expected)[:5]
            raise Violation(
                f"{len(self.expected)} computations missing, e.g. "
                f"(expert, index, chiplet) {missing}"
            )
        if any(occupancy):
            raise Violation(f"slots still held at the end of the layer: {occupancy}")


class LayerDriver:
    """Runs layers through ``Scheduler`` + a datapath, one cycle per :meth:`inputs` /
    :meth:`outputs` pair.

    ``stall`` is the probability that a link (each direction of each chiplet) or DDR is
    stalled in a cycle; ``gap`` that the dispatch stream idles in a cycle; ``done_stall`` that
    the scheduler holds ``done.ready`` low.
    """

    def __init__(
        self,
        sp: SchedulerParams,
        p: DatapathParams,
        rng: random.Random,
        stall: float = 0.0,
        gap: float = 0.0,
        done_stall: float = 0.0,
        timed: bool = False,
        **policy,
    ):
        self.sp, self.p, self.rng = sp, p, rng
        self.stall, self.gap, self.done_stall = stall, gap, done_stall
        #: scheduler options beyond the generics (``order="sorted"``: ablation A2)
        self.sched = Scheduler(sp, **policy)
        #: ``timed``: beats presented and completions taken in the cycles of the scheduler
        #: RTL (:class:`fsedp.sw.scheduler_timing.SchedulerTiming`, as the simulator's layer
        #: loops do), the first beat in the cycle after the token tables are written; else
        #: every beat as soon as the array takes it
        self.timed = timed
        self.timing = None
        self.now = 0
        self.check = Conservation(p)
        self.token_writes: deque = deque()
        self.slice_writes: deque = deque()
        self.beats: deque = deque()
        self.cur: StepIn | None = None
        self.dispatched = 0

    def reset(self):
        """A reset of the whole system in the middle of a layer: the scheduler, the queues
        and the scoreboard of the layer start afresh (counts and peaks are kept)."""
        self.sched.reset()
        self.timing = None  # timed: the next layer starts a fresh timing
        self.token_writes.clear()
        self.slice_writes.clear()
        self.beats.clear()
        self.check.expected.clear()
        # a reset returns every slice-table entry to micro_slices
        self.check.counts.clear()

    def start_layer(self, records, req_inits=()):
        """Front half of a round in the scheduler; queue the token tables, the slice table
        and the dispatches.  With ``slice_table``, every expert with tokens streams a random
        ``1 .. micro_slices`` micro-slices in this layer, some written after a rejected
        out-of-range write."""
        for r, t in req_inits:
            self.sched.init_request(r, t)
        plan = self.sched.start_round(records)
        tok = layer_tokens(self.sp, records, plan.defer)
        if self.check.expected:
            raise Violation("a layer started before the previous one completed")
        self.token_writes.extend((c, e, n) for (c, e), n in sorted(tok.items()))
        if self.p.slice_table:
            M, rng = self.p.micro_slices, self.rng
            for e in sorted({e for _, e in tok}):
                cnt = rng.randint(1, M)
                if rng.random() < 0.2:  # ignored by the table: 0 or one past the end
                    bad = rng.choice([0, M + 1])
                    if bad < 2**self.p.slice_count_bits:
                        self.slice_writes.append((e, bad))
                self.slice_writes.append((e, cnt))
                self.check.counts[e] = cnt
        if self.timed:
            from fsedp.sw.scheduler_timing import SchedulerTiming

            self.timing = SchedulerTiming(self.sched)  # the round started: its plan
        else:
            self.beats.extend(self.sched.decide())
        return plan

    @property
    def layer_done(self) -> bool:
        return (
            not self.sched.in_round
            and not self.beats
            and not (self.timing is not None and self.timing.queue)
            and not self.token_writes
            and not self.slice_writes
        )

    def inputs(self) -> StepIn:
        rng, n = self.rng, self.p.chiplets
        stall = (
            tuple(sum(1 << d for d in range(4) if rng.random() < self.stall) for _ in range(n))
            if self.stall
            else (0,) * n
        )
        ddr_stall = bool(self.stall) and rng.random() < self.stall
        tokens = self.token_writes[0] if self.token_writes else None
        slices = self.slice_writes[0] if self.slice_writes else None
        beat = None
        writing = self.token_writes or self.slice_writes
        if self.timed:
            t = self.timing
            if not writing and t is not None and t.first_beat is None:
                t.begin(self.now)
            if t is not None and t.first_beat is not None:
                b = t.present(self.now)
                if b is not None:
                    self.beats.append(b)
                if self.beats:
                    beat = self.beats[0]
                ready = t.ready(self.now)
            else:
                ready = False
        else:
            if not writing and self.beats and not (self.gap and rng.random() < self.gap):
                beat = self.beats[0]
            ready = not (self.done_stall and rng.random() < self.done_stall)
        self.cur = StepIn(beat, ready, stall, ddr_stall, tokens, slices)
        return self.cur

    def outputs(self, cycle: int, dispatch_ready: bool, done: int, events, occupancy):
        """Take the datapath's outputs of the cycle whose inputs :meth:`inputs` gave."""
        cur = self.cur
        if cur.tokens is not None:
            self.token_writes.popleft()
        if cur.slices is not None:
            self.slice_writes.popleft()
        if cur.dispatch is not None and dispatch_ready:
            self.check.on_dispatch(self.beats.popleft())
            self.dispatched += cur.dispatch.kind == DISPATCH
        self.check.on_cycle(cycle, events, occupancy)
        self.now = cycle + 1
        if done and cur.done_ready:
            if self.timed:
                self.timing.completed(cycle, done)
            else:
                self.sched.complete(done)
                self.beats.extend(self.sched.decide())


def stall_bits(inp: StepIn) -> int:
    """``StepIn.stall`` as the array's ``stall`` port (bit ``4 c + d``)."""
    return sum(s << (4 * c) for c, s in enumerate(inp.stall))


def compare(cycle: int, model_out, ready: bool, done: int, events, occupancy) -> list[str]:
    """Differences between the RTL's outputs of a cycle and the golden model's."""
    diffs = []
    for name, rtl, ref in (
        ("dispatch.ready", ready, model_out.dispatch_ready),
        ("done", done, model_out.done),
        ("events", events, model_out.events),
        ("occupancy", occupancy, model_out.occupancy),
    ):
        if rtl != ref:
            diffs.append(f"cycle {cycle}: {name}: RTL {rtl} != model {ref}")
    return diffs
