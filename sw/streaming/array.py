"""The chiplet array (golden model of ``fsedp.hw.chiplet_array``): ``rows x cols`` chiplets,
each a ring buffer, a router and a compute unit, and the DDR controller, stepped one clock
cycle at a time, with exact event skipping (:meth:`StreamingArray.fast_forward`)."""

from collections import deque
from dataclasses import dataclass, field

from fsedp.params import OPPOSITE, DatapathParams
from fsedp.sw.scheduler import Dispatch
from fsedp.sw.streaming import compute, ddr, probe, ring_buffer, router
from fsedp.sw.streaming.ddr import Job, Preload
from fsedp.sw.streaming.ring_buffer import Room, Slot, free_slots

__all__ = ["StepIn", "StepOut", "Chiplet", "StreamingArray"]


@dataclass
class StepIn:
    """Inputs of one cycle."""

    dispatch: Dispatch | None = None  # beat presented on the dispatch stream
    done_ready: bool = True
    stall: tuple[int, ...] = ()  # per chiplet, 4-bit mask of stalled output links
    ddr_stall: bool = False
    tokens: tuple[int, int, int] | None = None  # (chiplet, expert, count) table write
    slices: tuple[int, int] | None = None  # (expert, micro-slices) slice-table write [D13]


@dataclass
class StepOut:
    """Outputs of one cycle (what the RTL shows before the clock edge)."""

    dispatch_ready: bool
    done: int  # done.valid = done != 0; payload = done
    events: list  # per chiplet: None or (expert, index, final)
    occupancy: list[int]  # busy slots per chiplet (registered)
    transfers: list  # (src, dir, Header) accepted on links this cycle
    ddr_issues: list  # (target, slot, Header, held) per load issued
    ddr_deliveries: list  # (target, slot, Header, held) per load delivered
    ddr_idle: list | None = None  # with probes: per channel None (busy) or why it idles
    pe_idle: list | None = None  # with probes: per chiplet None (busy) or what it waits for


@dataclass
class Chiplet:
    slots: list
    link_busy: list = field(default_factory=lambda: [0, 0, 0, 0])
    rr: int = 0
    cnt: int = 0
    cslot: int = 0
    cexpert: int = 0
    cindex: int = 0
    cfinal: bool = False


class StreamingArray:
    """Cycle model of a ``rows x cols`` chiplet array and its DDR controller."""

    def __init__(self, p: DatapathParams, admission: bool = True, probes: bool = False):
        self.p = p
        #: ``True`` fills ``StepOut.ddr_idle`` and ``pe_idle`` (:mod:`.probe`) every cycle
        self.probes = probes
        #: ``False`` replaces forward-count admission by "any free slot" (the naive rule);
        #: only for showing the deadlock it prevents (``tests/test_streaming.py``).
        self.admission = admission
        self.age_bits = p.ddr_age_bits
        self.fifo_depth = p.ddr_fifo_depth
        #: DDR channels: 1 = one package-level controller, or one per chiplet
        self.channels = p.ddr_channels
        self.tokens = [[0] * p.experts for _ in range(p.chiplets)]
        self.nb = [[p.neighbour(c, d) for d in range(4)] for c in range(p.chiplets)]
        self.reset()

    def reset(self):
        """Synchronous reset: empty buffers, no jobs, DDR pipeline flushed, every expert's
        slice-table entry back to ``micro_slices`` (the token tables are memories and keep
        their contents)."""
        p = self.p
        #: micro-slices each expert streams ([D13]; ``micro_slices`` without ``slice_table``)
        self.slices = [p.micro_slices] * p.experts
        #: each expert's ring embedding (``fsedp.params.RING_ORDERS``), written by its beats:
        #: every station and DDR target of its micro-slices follows it
        self.ring_order = [0] * p.experts
        self.chips = [Chiplet([Slot() for _ in range(p.slots)]) for _ in range(p.chiplets)]
        self.jobs = [Job() for _ in range(p.chiplets)]
        self.pre = [Preload() for _ in range(p.preload_entries)]
        self.ddr_rr = 0
        self.gaps = [0] * self.channels
        self.now = 0
        self.fifos: list[deque] = [deque() for _ in range(self.channels)]
        #: whether the last :meth:`step` changed anything but counters, and (when it did
        #: not) how many cycles from its start no predicate can change (see :meth:`fast_forward`)
        self.last_active = True
        self._horizon = 0
        self.done_pending = 0
        self.bad_dispatch = False
        self.orphan = False
        self.cycle = 0

    # -- views ------------------------------------------------------------------------
    def free(self, c: int) -> int:
        return free_slots(self.chips[c].slots)

    @property
    def idle(self) -> bool:
        return (
            not any(s.busy for ch in self.chips for s in ch.slots)
            and not any(j.valid for j in self.jobs)
            and not any(q.valid for q in self.pre)
            and not any(self.fifos)
            and not self.done_pending
            and all(ch.cnt == 0 for ch in self.chips)
        )

    @property
    def stuck(self) -> bool:
        """Whether the last :meth:`step` left a fixed point: it changed nothing but counters
        and no counter is counting, so with no input (no beat, no stall, no table write)
        every further cycle decides nothing either; the layer loops' progress watchdog
        (:mod:`.watchdog`)."""
        return not self.last_active and self._horizon == 0

    # -- one clock cycle --------------------------------------------------------------
    def step(self, inp: StepIn) -> StepOut:
        """One clock cycle: every block decides from the registered state and this cycle's
        inputs, then every block takes its next state."""
        p = self.p
        n = p.chiplets
        stall = inp.stall or (0,) * n
        room = Room(self)
        free = list(room.free)

        # decisions: 1 router offers, 3 DDR issue, then 2 the routers' accepts in what
        # the loads leave ([D19]), 4 DDR delivery, 5 compute, 6 retirement
        issues, used, issue_out = ddr.issue(self, inp, room)
        accepts = router.accept(self, stall, room)
        delivered = ddr.deliveries(self, inp)
        events, starts = compute.decide(self)
        retired = compute.retired(self, events)
        done_valid = self.done_pending != 0
        out = StepOut(
            dispatch_ready=True,
            done=self.done_pending,
            events=events,
            occupancy=[p.slots - f for f in free],
            transfers=[(a[1], OPPOSITE[a[0]], a[3]) for a in accepts if a is not None],
            ddr_issues=issue_out,
            ddr_deliveries=[d for _, d in delivered],
        )
        if self.probes:
            out.ddr_idle = probe.ddr_idle(self, inp, used, issues, room.free)
            out.pe_idle = probe.pe_idle(self, starts)
        # Rule 3 on the registered state: evaluated once, used for activity and release
        release = [[sl.releasable for sl in ch.slots] for ch in self.chips]
        self.last_active = bool(
            any(a is not None for a in accepts)
            or issues
            or delivered
            or any(x is not None for x in starts)
            or any(e is not None for e in events)
            or done_valid
            or inp.dispatch is not None
            or inp.tokens is not None
            or inp.slices is not None
            or any(any(r) for r in release)
        )
        if not self.last_active:
            self._horizon = self._counters_horizon()

        # ---- next state -------------------------------------------------------------
        ring_buffer.tick(self, release)
        router.commit(self, accepts)
        ddr.commit(self, delivered, issues, issue_out, used)
        compute.commit(self, starts)
        # dispatch beat (sees the jobs as registered: a job retiring now is still busy)
        if inp.dispatch is not None:
            ddr.take_dispatch(self, inp.dispatch)
        done_new = ddr.retire_jobs(self, retired)
        self.done_pending = (0 if done_valid and inp.done_ready else self.done_pending) | done_new
        # token table
        if inp.tokens is not None:
            c, e, cnt = inp.tokens
            if 0 <= c < n and 0 <= e < p.experts:
                self.tokens[c][e] = cnt & (2**p.count_width - 1)
        # slice table [D13]: a write of an expert out of range, or of a count outside
        # 1 .. micro_slices, is ignored
        if inp.slices is not None and p.slice_table:
            e, cnt = inp.slices
            if 0 <= e < p.experts and 1 <= cnt <= p.micro_slices:
                self.slices[e] = cnt
        self.now = (self.now + 1) % (1 << self.age_bits)
        self.cycle += 1
        return out

    # -- event skipping -------------------------------------------------------------------
    def _counters_horizon(self) -> int:
        """Cycles from now until a counter reaches the value at which a decision can change
        (0: none is counting)."""
        h = None

        def low(v):
            nonlocal h
            h = v if h is None or v < h else h

        for ch in self.chips:
            for sl in ch.slots:
                if sl.wait:
                    low(sl.wait)
                if sl.tx:
                    low(sl.tx)
            for b in ch.link_busy:
                if b:
                    low(b)
            if ch.cnt > 1:
                low(ch.cnt - 1)
        for g in self.gaps:
            if g:
                low(g)
        for fifo in self.fifos:
            if fifo:
                age = (self.now - fifo[0][4]) % (1 << self.age_bits)
                if age < self.p.ddr_latency:
                    low(self.p.ddr_latency - age)
        return h or 0

    def fast_forward(self) -> int:
        """After a :meth:`step` in which nothing but counters changed, jump over the cycles
        that would repeat it (with no inputs and no stalls): the next :meth:`step` is the
        first one that can decide anything.  Returns the cycles skipped; the result is
        exactly that of stepping them one by one (``tests/test_streaming.py``)."""
        if self.last_active or self._horizon <= 1:
            return 0
        k = self._horizon - 1
        for ch in self.chips:
            for sl in ch.slots:
                if sl.wait:
                    sl.wait -= k
                if sl.tx:
                    sl.tx -= k
            ch.link_busy = [b - k if b else 0 for b in ch.link_busy]
            if ch.cnt:
                ch.cnt -= k
        self.gaps = [g - k if g else 0 for g in self.gaps]
        self.now = (self.now + k) % (1 << self.age_bits)
        self.cycle += k
        self.last_active = True
        return k
