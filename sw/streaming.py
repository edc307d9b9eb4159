"""Micro-slice streaming golden model: ring buffers, routers and the DDR controller of a
chiplet array, cycle by cycle (virtualization Rules 1-5 of FSE-DP, Section IV-C).

This is the executable specification of the datapath RTL (``fsedp.hw.ring_buffer``,
``router``, ``chiplet``, ``ddr_ctrl``, ``chiplet_array``): both compute the same next state
from the same registered state and inputs, so the cosimulation compares them cycle by cycle
(``tb/tb_chiplet_array.py``, ``tests/test_datapath_rtl.py``).  The page ``docs/blocks/datapath.md`` explains the
rules with figures; the decisions taken where the paper is silent are marked **[D]**.

Objects
-------
* **Micro-slice** (packet): ``expert``, ``index`` (0..M-1), ``traj`` (trajectory mask),
  ``dest`` (next chiplet that computes it), ``legs`` (ring legs left after ``dest``) and
  ``r`` (physical link hops left).  Every router stores a micro-slice in a slot of its ring
  buffer before forwarding it (store-and-forward), computing it only where it is a *station*
  (``dest`` is the chiplet itself); other routers on an XY path only forward it (*transit*).
* **Slot** of a ring buffer: ``busy`` (allocated), ``resv`` (reserved by a DDR load still in
  flight), ``wait`` (cycles until its data has arrived), ``held`` (a Rule 4 pre-load waiting
  for its expert's dispatch), ``comp`` (compute pending here), ``computing``, ``send``
  (forward pending), ``tx`` (cycles of the outgoing transfer left), ``ddr`` (loaded from DDR
  here, i.e. *local*), ``final`` (last station).

Per cycle (all decisions from the registered state and this cycle's inputs)
--------------------------------------------------------------------------
1. **Offer** (router output port ``d``, Rules 1-2 forwarding): among the slots ready to
   forward in direction ``d`` the one with the fewest hops left ``r`` (ties: lowest slot),
   if the link is not busy and not stalled.  [D] An offer that is not accepted may be
   replaced by a better one the next cycle (the link is an offer/accept interface, see the
   deadlock argument).
2. **Accept** (router input side): the neighbour takes at most one micro-slice per cycle,
   round-robin over its four inputs among the *admissible* offers: a micro-slice that will
   still have ``r`` hops to go is admitted only while the buffer has more than ``r`` free
   slots (forward-count admission [D]; this is what makes streaming deadlock-free).
3. **DDR issue** (Rule 4): every ``ddr_interval`` cycles (per channel) the controller loads
   the next micro-slice of a running expert (round-robin over the running experts) into the
   next chiplet of its trajectory in ring order, starting at the entry -- every chiplet of
   the trajectory loads its share, as chiplet 1 loads slice 1 in Figure 6 [D] -- or with
   Rule 5 into the trajectory chiplet with the most free slots, reserving a slot under the
   same admission (``r`` = hops of its whole path).  With one DDR channel per chiplet
   (``ddr_channels = rows x cols``, simulator only) Rule 4 is chiplet-driven: every chiplet
   whose channel is free and that has room loads the next micro-slice of a running expert
   covering it, else pre-loads one of an expert of its trajectory; a chiplet that has
   neither loads for a running expert, else a pre-load, whose trajectory does not cover it
   (a *remote* load [D]: the micro-slice enters the trajectory at the chiplet with the
   shortest whole path, never more than ``H`` hops; ``DatapathParams.remote_entry``), as
   Algorithm 1 pre-loads "to any idle buffer" and a die "loads weights from DDR or from
   peer dies" (Section V).  This keeps every channel busy while any expert has micro-slices
   to load.  Pre-loads (Rule 4 of Algorithm 1) come after running experts and are admitted
   only while more than ``H + 1`` slots are free; their slots are *held* until the expert
   is dispatched.
4. **DDR delivery**: ``ddr_latency`` cycles after its issue (later while DDR is stalled).
5. **Compute** (Rules 1-2): a chiplet whose compute unit is free starts the pending
   micro-slice received over a link (Rule 1), else a local one loaded from DDR (Rule 2),
   lowest slot first; it takes ``max(1, tokens) * cycles_per_token`` cycles, ``tokens``
   being the chiplet's token count for that expert.  A new compute may start in the last
   cycle of the previous one.
6. **Release** (Rule 3): a slot whose micro-slice is computed (if a station) and forwarded
   (if not the end of its path) is freed in the next cycle.  The last station *retires* the
   micro-slice; when all ``M`` micro-slices of an expert are retired, its entry slot is
   reported on the ``done`` stream (a mask of slots, as the scheduler takes it).

Timing: a transfer accepted in cycle ``t`` keeps the link busy until ``t + L`` and the
micro-slice is usable at the receiver from ``t + L`` (``L = link_cycles``); a DDR delivery
in cycle ``t`` is usable from ``t + 1``.
"""

from collections import deque
from dataclasses import dataclass, field

from .params import DatapathParams, _ring_after, bits_for
from .scheduler import DISPATCH, PRELOAD, Dispatch

__all__ = ["Header", "Slot", "StepIn", "StepOut", "StreamingArray", "arrive", "OPPOSITE"]

OPPOSITE = (2, 3, 0, 1)


@dataclass(frozen=True)
class Header:
    """A micro-slice as it travels: on a link ``r`` counts the hops left *after* the
    receiver, in a DDR load the hops of the whole path."""

    expert: int
    index: int
    traj: int
    dest: int
    legs: int
    r: int


@dataclass
class Slot:
    busy: bool = False
    resv: bool = False
    wait: int = 0
    held: bool = False
    comp: bool = False
    computing: bool = False
    send: bool = False
    tx: int = 0
    ddr: bool = False
    final: bool = False
    dir: int = 0
    r: int = 0
    expert: int = 0
    # slot storage (the RTL's lib.memory): the next leg of the micro-slice
    index: int = 0
    traj: int = 0
    dest: int = 0
    legs: int = 0

    @property
    def present(self) -> bool:
        return self.busy and not self.resv and self.wait == 0 and not self.held

    @property
    def releasable(self) -> bool:
        return (self.busy and not self.resv and self.wait == 0 and not self.held
                and not self.comp and not self.computing and not self.send and self.tx == 0)


def arrive(p: DatapathParams, c: int, h: Header) -> dict:
    """Slot fields of micro-slice ``h`` stored at chiplet ``c`` (station or transit)."""
    if h.dest == c:                     # a station: compute here, then the next ring leg
        if h.legs:
            nxt = next(m for m in ((c + s) % p.chiplets for s in range(1, p.chiplets + 1))
                       if h.traj >> m & 1)
            return dict(comp=True, send=True, final=False, dest=nxt, legs=h.legs - 1,
                        dir=p.direction(c, nxt), r=h.r)
        return dict(comp=True, send=False, final=True, dest=c, legs=0, dir=0, r=h.r)
    return dict(comp=False, send=True, final=False, dest=h.dest, legs=h.legs,
                dir=p.direction(c, h.dest), r=h.r)


@dataclass
class StepIn:
    """Inputs of one cycle."""

    dispatch: Dispatch | None = None      # beat presented on the dispatch stream
    done_ready: bool = True
    stall: tuple[int, ...] = ()           # per chiplet, 4-bit mask of stalled output links
    ddr_stall: bool = False
    tokens: tuple[int, int, int] | None = None   # (chiplet, expert, count) table write


@dataclass
class StepOut:
    """Outputs of one cycle (what the RTL shows before the clock edge)."""

    dispatch_ready: bool
    done: int                              # done.valid = done != 0; payload = done
    events: list                           # per chiplet: None or (expert, index, final)
    occupancy: list[int]                   # busy slots per chiplet (registered)
    transfers: list                        # (src, dir, Header) accepted on links this cycle
    ddr_issues: list                       # (target, slot, Header, held) per load issued
    ddr_deliveries: list                   # (target, slot, Header, held) per load delivered


@dataclass
class Job:
    valid: bool = False
    expert: int = 0
    traj: int = 0
    loaded: int = 0
    retired: int = 0
    target: int = 0         # chiplet of the next load (Rule 4 striping), starts at the entry


@dataclass
class Preload:
    valid: bool = False
    expert: int = 0
    traj: int = 0
    chiplet: int = 0
    loaded: int = 0


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

    def __init__(self, p: DatapathParams, admission: bool = True):
        self.p = p
        #: ``False`` replaces forward-count admission by "any free slot" (the naive rule);
        #: only for showing the deadlock it prevents (``tests/test_streaming.py``).
        self.admission = admission
        self.age_bits = bits_for(p.ddr_latency + 1) + 8
        self.fifo_depth = -(-p.ddr_latency // p.ddr_interval) + 2
        #: DDR channels: 1 = one package-level controller (the RTL), or one per chiplet
        self.channels = p.ddr_channels
        self.tokens = [[0] * p.experts for _ in range(p.chiplets)]
        self.nb = [[p.neighbour(c, d) for d in range(4)] for c in range(p.chiplets)]
        self.reset()

    def reset(self):
        """Synchronous reset: empty buffers, no jobs, DDR pipeline flushed (the token tables
        are memories and keep their contents)."""
        p = self.p
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
        return sum(not s.busy for s in self.chips[c].slots)

    @property
    def idle(self) -> bool:
        return (not any(s.busy for ch in self.chips for s in ch.slots)
                and not any(j.valid for j in self.jobs) and not any(q.valid for q in self.pre)
                and not any(self.fifos) and not self.done_pending
                and all(ch.cnt == 0 for ch in self.chips))

    def _offers(self, c: int, stall: int) -> list:
        """Per direction, the slot offered on that output link (or None): one pass over the
        slots, fewest hops left first, ties to the lower slot."""
        ch = self.chips[c]
        best = [None, None, None, None]
        best_r = [0, 0, 0, 0]
        for i, s in enumerate(ch.slots):
            if s.send and s.busy and not s.resv and s.wait == 0 and not s.held and s.tx == 0:
                d = s.dir
                if best[d] is None or s.r < best_r[d]:
                    best[d], best_r[d] = i, s.r
        nb, busy = self.nb[c], ch.link_busy
        return [b if b is not None and nb[d] is not None and not busy[d] and not stall >> d & 1
                else None for d, b in enumerate(best)]

    # -- one clock cycle --------------------------------------------------------------
    def step(self, inp: StepIn) -> StepOut:
        p = self.p
        n = p.chiplets
        stall = inp.stall or (0,) * n
        free = [self.free(c) for c in range(n)]

        # 1. offers
        offers = [self._offers(c, stall[c]) for c in range(n)]

        # 2. accepts: input port d of chiplet c is fed by its neighbour in direction d
        accepts = [None] * n          # (input dir, src chiplet, src slot, Header)
        for c in range(n):
            ch = self.chips[c]
            for k in range(4):
                d = (ch.rr + k) % 4
                src = self.nb[c][d]
                if src is None:
                    continue
                s = offers[src][OPPOSITE[d]]
                if s is None:
                    continue
                sl = self.chips[src].slots[s]
                h = Header(sl.expert, sl.index, sl.traj, sl.dest, sl.legs, sl.r - 1)
                if (h.r if self.admission else 0) < free[c]:
                    slot = min(i for i, x in enumerate(ch.slots) if not x.busy)
                    accepts[c] = (d, src, s, h, slot)
                    break
        free2 = [free[c] - (accepts[c] is not None) for c in range(n)]

        # 3. DDR issue: running experts round-robin, then pre-loads; one load per channel
        issues = []                   # (kind, index, target, expert, traj, micro-slice)
        used = [False] * self.channels
        def channel_ok(target):
            ch = target if self.channels > 1 else 0
            return (not used[ch] and self.gaps[ch] == 0 and not inp.ddr_stall
                    and len(self.fifos[ch]) < self.fifo_depth)
        if self.channels > 1 and not p.rule5:
            # Rule 4 with a channel per chiplet: every chiplet with room loads the next
            # micro-slice of a running expert that covers it (round-robin over experts);
            # a chiplet that none of them covers loads for one it does not cover (a
            # *remote* load, sent to the expert's trajectory) [D]
            extra = [0] * n
            idle_channel = []
            for c in range(n):
                if not channel_ok(c):
                    continue
                for k in range(n):
                    j = (self.ddr_rr + k) % n
                    job = self.jobs[j]
                    if job.valid and job.traj >> c & 1 \
                            and job.loaded + extra[j] < p.micro_slices \
                            and free2[c] > self._need(job.traj, c):
                        issues.append(("job", j, c, job.expert, job.traj, job.loaded + extra[j], c))
                        extra[j] += 1
                        used[c] = True
                        free2[c] -= 1
                        break
                else:
                    idle_channel.append(c)
        else:
            for k in range(n):
                j = (self.ddr_rr + k) % n
                job = self.jobs[j]
                if not job.valid or job.loaded >= p.micro_slices:
                    continue
                target = self._ddr_target(j, job, free2, channel_ok)
                if target is not None:
                    issues.append(("job", j, target, job.expert, job.traj, job.loaded, target))
                    used[target if self.channels > 1 else 0] = True
                    free2[target] -= 1
        if self.channels > 1:
            # with a channel per chiplet, a pre-load goes to any idle buffer (Algorithm 1:
            # "pre-load e to any idle buffer"), chiplet-driven like Rule 4: of its trajectory
            # first, else a remote one that reaches the trajectory within H hops
            pre_extra = [0] * len(self.pre)
            for c in range(n):
                if not channel_ok(c) or free2[c] <= p.max_hops + 1:
                    continue
                for k, q in enumerate(self.pre):
                    if q.valid and q.traj >> c & 1 and q.loaded + pre_extra[k] < p.micro_slices:
                        issues.append(("pre", k, c, q.expert, q.traj, q.loaded + pre_extra[k], c))
                        pre_extra[k] += 1
                        used[c] = True
                        free2[c] -= 1
                        break
            if not p.rule5 and self.admission:
                for c in idle_channel:
                    if not channel_ok(c):
                        continue
                    for k in range(n):
                        j = (self.ddr_rr + k) % n
                        job = self.jobs[j]
                        if not job.valid or job.loaded + extra[j] >= p.micro_slices:
                            continue
                        dest, r = p.remote_entry(job.traj, c)
                        if free2[c] > r:
                            issues.append(("job", j, c, job.expert, job.traj,
                                           job.loaded + extra[j], dest))
                            extra[j] += 1
                            used[c] = True
                            free2[c] -= 1
                            break
                    else:
                        if free2[c] <= p.max_hops + 1:
                            continue
                        for k, q in enumerate(self.pre):
                            if not q.valid or q.loaded + pre_extra[k] >= p.micro_slices:
                                continue
                            dest, _ = p.remote_entry(q.traj, c)
                            issues.append(("pre", k, c, q.expert, q.traj,
                                           q.loaded + pre_extra[k], dest))
                            pre_extra[k] += 1
                            used[c] = True
                            free2[c] -= 1
                            break
        else:
            for k, q in enumerate(self.pre):
                if q.valid and q.loaded < p.micro_slices and channel_ok(q.chiplet) \
                        and free2[q.chiplet] > p.max_hops + 1:
                    issues.append(("pre", k, q.chiplet, q.expert, q.traj, q.loaded, q.chiplet))
                    used[0] = True
                    free2[q.chiplet] -= 1
        issue_out = []
        for kind, idx, target, expert, traj, index, dest in issues:
            slots = self.chips[target].slots
            slot = max(i for i, x in enumerate(slots) if not x.busy)
            h = Header(expert, index, traj, dest, bin(traj).count("1") - 1,
                       p.path_hops(traj, dest) + p.distance(target, dest))
            issue_out.append((target, slot, h, kind == "pre"))

        # 4. DDR delivery
        dispatch_e = (inp.dispatch.expert if inp.dispatch is not None
                      and inp.dispatch.kind == DISPATCH else None)
        deliveries = []
        for ch, fifo in enumerate(self.fifos):
            if fifo and not inp.ddr_stall:
                target, slot, h, held, ts = fifo[0]
                if (self.now - ts) % (1 << self.age_bits) >= p.ddr_latency:
                    if held and (any(j.valid and j.expert == h.expert for j in self.jobs)
                                 or dispatch_e == h.expert):
                        held = False
                    deliveries.append((ch, (target, slot, h, held)))

        # 5. compute
        events = [None] * n
        starts = [None] * n
        for c in range(n):
            ch = self.chips[c]
            if ch.cnt == 1:
                events[c] = (ch.cexpert, ch.cindex, ch.cfinal)
            if ch.cnt <= 1:
                cand = [i for i, s in enumerate(ch.slots) if s.present and s.comp]
                pick = next((i for i in cand if not ch.slots[i].ddr), None)
                if pick is None and cand:
                    pick = cand[0]
                if pick is not None:
                    s = ch.slots[pick]
                    starts[c] = (pick, max(1, self.tokens[c][s.expert]) * p.cycles_per_token)

        # 6. retire, done
        done_new = 0
        retired = [0] * n
        for c in range(n):
            ev = events[c]
            if ev is not None and ev[2]:
                j = next((j for j in range(n) if self.jobs[j].valid and self.jobs[j].expert == ev[0]),
                         None)
                if j is None:
                    self.orphan = True
                else:
                    retired[j] += 1
        done_valid = self.done_pending != 0
        out = StepOut(dispatch_ready=True, done=self.done_pending, events=events,
                      occupancy=[p.slots - f for f in free],
                      transfers=[(a[1], OPPOSITE[a[0]], a[3]) for a in accepts if a is not None],
                      ddr_issues=issue_out, ddr_deliveries=[d for _, d in deliveries])
        # Rule 3 on the registered state: evaluated once, used for activity and release
        release = [[sl.releasable for sl in ch.slots] for ch in self.chips]
        self.last_active = bool(any(a is not None for a in accepts) or issues or deliveries
                                or any(x is not None for x in starts)
                                or any(e is not None for e in events) or done_valid
                                or inp.dispatch is not None or inp.tokens is not None
                                or any(any(r) for r in release))
        if not self.last_active:
            self._horizon = self._counters_horizon()

        # ---- next state -------------------------------------------------------------
        # slots: release (registered condition), counters
        for ch, rel in zip(self.chips, release):
            for s, free_it in zip(ch.slots, rel):
                if free_it:
                    s.busy = False
                if s.wait:
                    s.wait -= 1
                if s.tx:
                    s.tx -= 1
            ch.link_busy = [max(0, b - 1) for b in ch.link_busy]
        # transfers
        for c in range(n):
            a = accepts[c]
            if a is None:
                continue
            d, src, s, h, slot = a
            sch = self.chips[src]
            sch.slots[s].send = False
            sch.slots[s].tx = p.link_cycles - 1
            sch.link_busy[OPPOSITE[d]] = p.link_cycles - 1
            self.chips[c].rr = (d + 1) % 4
            self._store(c, slot, h, wait=p.link_cycles - 1, ddr=False, held=False)
        # DDR
        for ch, (target, slot, h, held) in deliveries:
            self.fifos[ch].popleft()
            self._store(target, slot, h, wait=0, ddr=True, held=held)
        for (kind, idx, *_), (t, slot, h, held) in zip(issues, issue_out):
            ch = t if self.channels > 1 else 0
            sl = self.chips[t].slots[slot]
            sl.busy, sl.resv = True, True
            self.fifos[ch].append((t, slot, h, held, self.now))
            if kind == "job":
                job = self.jobs[idx]
                job.loaded += 1
                job.target = _ring_after(job.traj, t, n)
                self.ddr_rr = (idx + 1) % n
            else:
                self.pre[idx].loaded += 1
        for ch in range(self.channels):
            if used[ch]:
                self.gaps[ch] = p.ddr_interval - 1
            elif self.gaps[ch]:
                self.gaps[ch] -= 1
        # compute
        for c in range(n):
            ch = self.chips[c]
            if ch.cnt == 1:
                ch.slots[ch.cslot].computing = False
            if starts[c] is not None:
                i, cycles = starts[c]
                s = ch.slots[i]
                s.comp, s.computing = False, True
                ch.cnt, ch.cslot = cycles, i
                ch.cexpert, ch.cindex, ch.cfinal = s.expert, s.index, s.final
            elif ch.cnt:
                ch.cnt -= 1
        # dispatch beat (sees the jobs as registered: a job retiring now is still busy)
        if inp.dispatch is not None:
            self._take_dispatch(inp.dispatch)
        # jobs
        for j in range(n):
            if retired[j]:
                job = self.jobs[j]
                job.retired += retired[j]
                if job.retired >= p.micro_slices:
                    job.valid = False
                    done_new |= 1 << j
        self.done_pending = (0 if done_valid and inp.done_ready else self.done_pending) | done_new
        # token table
        if inp.tokens is not None:
            c, e, cnt = inp.tokens
            if 0 <= c < n and 0 <= e < p.experts:
                self.tokens[c][e] = cnt & (2**p.count_width - 1)
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

    def _ddr_target(self, j: int, job: Job, free2: list[int], channel_ok) -> int | None:
        p = self.p
        if not p.rule5:
            t = job.target
            return t if channel_ok(t) and free2[t] > self._need(job.traj, t) else None
        best = None
        for a in range(p.chiplets):
            if job.traj >> a & 1 and channel_ok(a) and free2[a] > self._need(job.traj, a):
                if best is None or free2[a] > free2[best]:
                    best = a
        return best

    def _need(self, traj: int, a: int) -> int:
        return self.p.path_hops(traj, a) if self.admission else 0

    def _store(self, c: int, slot: int, h: Header, wait: int, ddr: bool, held: bool):
        s = self.chips[c].slots[slot]
        f = arrive(self.p, c, h)
        s.busy, s.resv, s.wait, s.held, s.ddr = True, False, wait, held, ddr
        s.computing, s.tx = False, 0
        s.comp, s.send, s.final, s.dir, s.r = f["comp"], f["send"], f["final"], f["dir"], f["r"]
        s.expert, s.index, s.traj, s.dest, s.legs = h.expert, h.index, h.traj, f["dest"], f["legs"]

    def _take_dispatch(self, b: Dispatch):
        p = self.p
        n = p.chiplets
        if b.traj == 0 or b.traj >> n or not 0 <= b.entry < n or not b.traj >> b.entry & 1 \
                or not 0 <= b.expert < p.experts:
            self.bad_dispatch = True
            return
        if b.kind == PRELOAD:
            k = next((k for k, q in enumerate(self.pre) if not q.valid), None)
            if k is not None:
                self.pre[k] = Preload(True, b.expert, b.traj, b.entry, 0)
            return
        if self.jobs[b.entry].valid:
            self.bad_dispatch = True
            return
        loaded = 0
        k = next((k for k, q in enumerate(self.pre) if q.valid and q.expert == b.expert), None)
        if k is not None:
            q = self.pre[k]
            loaded = q.loaded       # already includes an issue of this cycle
            q.valid = False
            for c in (range(n) if self.channels > 1 else (q.chiplet,)):
                for s in self.chips[c].slots:
                    if s.busy and s.held and s.expert == b.expert:
                        s.held = False
        self.jobs[b.entry] = Job(True, b.expert, b.traj, loaded, 0, b.entry)
