"""FSE-DP trajectory scheduler golden model (Algorithm 1 with Algorithm 2 in front).

A *round* schedules one MoE layer of one iteration:

1. **Fill** - gate records enter the EIT (one per token and activated expert).
2. **Pass 1** - scan the EIT over all experts with every request included: ``n_e`` over all
   present requests gives each request's ``cold_hit`` bit.
3. **Token buffering** - Algorithm 2 decides the defer mask (:mod:`.token_buffer`).
4. **Pass 2** - scan again including only non-deferred requests; the merged counts feed the
   sorter, the merged masks are the trajectories ``T_e``; the EIT is cleared.
5. **Sort** - bitonic sort, descending count, ties to the lower id (:mod:`.sorter`).
6. **Schedule** - the paired-load order (:mod:`.pairing`) of the ``n`` experts with a
   non-zero count is the priority list.  Whenever a decision is possible the scheduler
   dispatches the *first* unscheduled expert of the list with ``T_e & ICV != 0`` to entry
   chiplet ``c* = lowest(T_e & ICV)``, sets ``ICV &= ~T_e`` and records ``T_e`` in slot
   ``c*``; then it checks the Rule 4 pre-load of the expert's partner (:mod:`.matcher`).
   When no expert is eligible it waits for a completion (a mask of slots) and releases the
   chiplets no running expert still covers.  The round ends when all ``n`` experts have been
   dispatched and have completed; the ICV is then all ones again.

Completions are only taken while no decision is possible (the RTL holds ``done.ready`` low
while it scans), which makes the sequence of decisions a function of the sequence of
completion masks alone: the cosimulation replays the RTL's accepted completions into this
model and compares every dispatch.
"""

from collections import Counter
from dataclasses import dataclass, field

from fsedp.params import BeatKind, SchedulerParams
from fsedp.sw.eit import EIT
from fsedp.sw.icv import ICV
from fsedp.sw.matcher import entry_chiplet, lowest_bit, next_hops, release_mask
from fsedp.sw.pairing import balanced_order, paired_index, partner
from fsedp.sw.sorter import sort_keys, sorter_keys
from fsedp.sw.token_buffer import TokenBuffer

__all__ = ["Dispatch", "RoundPlan", "Scheduler", "run_round", "layer_tokens"]

DISPATCH = BeatKind.DISPATCH
PRELOAD = BeatKind.PRELOAD


@dataclass(frozen=True)
class Dispatch:
    """One beat of the scheduler's dispatch stream.

    ``kind`` is ``DISPATCH`` (start streaming ``expert`` along ``traj`` entering at
    ``entry``) or ``PRELOAD`` (Rule 4: let chiplet ``entry`` pre-load the expert's
    micro-slices into free buffer slots).  ``next_hop`` is the ring routing table of the
    ring's embedding ``order`` (``fsedp.params.RING_ORDERS``; 0 unless ``ring_orders`` is 2
    or more).
    """

    kind: int
    expert: int
    count: int
    traj: int
    entry: int
    next_hop: tuple[int, ...]
    order: int = 0

    def as_dict(self) -> dict:
        return {
            "kind": "dispatch" if self.kind == DISPATCH else "preload",
            "expert": self.expert,
            "count": self.count,
            "traj": self.traj,
            "entry": self.entry,
            "next_hop": list(self.next_hop),
            "order": self.order,
        }


@dataclass
class RoundPlan:
    """What the front half of a round produced (inputs of the scheduling loop)."""

    defer: int  # defer bit-mask over requests
    cold_hit: int  # cold_hit bit-mask over requests
    present: int  # requests with at least one record
    counts: list[int]  # merged count per expert (after deferral)
    trajs: list[int]  # merged trajectory mask per expert
    sorted_keys: list[tuple[int, int]]  # sorter output (count, id) per lane
    n: int  # experts with a non-zero count
    order: list[int] = field(default_factory=list)  # expert ids in paired-load order


class Scheduler:
    #: ``order="paired"``: Algorithm 1 with the paired-load order and Rule 4 pre-loads of the
    #: partner (the RTL); ``"sorted"``: descending token count, no pre-loads (the paper's
    #: ablation A2, golden model and simulator only).
    #: With ``p.balance`` the paired order becomes the balanced one (decision 27 of
    #: ``docs/blocks/scheduler.md``); with ``p.entry_dispatch`` a dispatch makes only its
    #: entry chiplet busy (decision 28).  Both are generics of the RTL too.
    ORDERS = ("paired", "sorted")

    def __init__(self, p: SchedulerParams, order: str = "paired"):
        if order not in self.ORDERS:
            raise ValueError(f"order must be one of {self.ORDERS}, not {order!r}")
        self.p = p
        self.order = "balanced" if order == "paired" and p.balance else order
        self.eit = EIT(p)
        self.tb = TokenBuffer(p)
        self.icv = ICV(p)
        self.reset()

    # -- state ---------------------------------------------------------------------------
    def reset(self):
        """Power-on / mid-round reset: empty EIT, zero request table, all chiplets idle."""
        self.eit.reset()
        self.tb.reset()
        self.icv.reset()
        self.running = [0] * self.p.chiplets
        self.running_order = [0] * self.p.chiplets  # ring embedding of each running expert
        self.next_order = 0  # the embedding a tie goes to (round-robin)
        self.plan: RoundPlan | None = None
        self.scheduled: list[bool] = []
        self.preloaded: list[bool] = []
        self.spurious_done = False

    def init_request(self, request: int, t_qos: int):
        self.tb.init_request(request, t_qos)

    @property
    def in_round(self) -> bool:
        return self.plan is not None

    @property
    def round_done(self) -> bool:
        return self.plan is not None and all(self.scheduled) and not any(self.running)

    # -- front half ----------------------------------------------------------------------
    def start_round(self, records) -> RoundPlan:
        if self.plan is not None:
            raise RuntimeError("start_round while a round is in progress")
        p = self.p
        self.eit.clear_flags()
        self.spurious_done = False
        self.eit.write_many(records)
        everyone = (1 << p.requests) - 1
        # pass 1 (RTL: a scan of every expert over every request), then pass 2 over the
        # requests that were not deferred, clearing the table
        present = cold_hit = 0
        counts, _, pres = self.eit.merged(everyone)
        for c, r in zip(counts, pres):
            present |= r
            if 0 < c < p.theta_min:
                cold_hit |= r
        defer = self.tb.decide(present, cold_hit)
        counts, trajs, _ = self.eit.merged(everyone & ~defer, clear=True)
        keys = sort_keys(sorter_keys(counts, p.sorter_lanes), p.sorter)
        n = sum(1 for c in counts if c)
        plan = RoundPlan(defer, cold_hit, present, counts, trajs, keys, n)
        if self.order == "balanced":
            plan.order = balanced_order([e for _, e in keys[:n]], counts, p.balance)
        elif self.order == "paired":
            plan.order = [keys[paired_index(k, n)][1] for k in range(n)]
        else:
            plan.order = [keys[k][1] for k in range(n)]
        self.plan = plan
        self.scheduled = [False] * n
        self.preloaded = [False] * n
        self.orders: list[int | None] = [None] * n  # ring embedding, fixed at the first beat
        self._first = 0
        if n == 0:
            self.plan = None
        return plan

    # -- scheduling loop -----------------------------------------------------------------
    def _beat(self, kind: int, position: int, entry: int) -> Dispatch:
        e = self.plan.order[position]
        traj = self.plan.trajs[e]
        o = self.ring_order(position)
        hops = next_hops(traj, self.p.chiplets, self.p.ring_table(o))
        return Dispatch(kind, e, self.plan.counts[e], traj, entry, hops, o)

    def ring_order(self, position: int) -> int:
        """The ring embedding of the expert at ``position``, chosen at its first beat (a
        pre-load or its dispatch) and kept: with ``ring_orders`` 2, 4 or 8, the embedding whose
        running experts' trajectories hold fewer chiplets (their micro-slices' link use), ties
        taken in turn; else the ring path's first."""
        o = self.orders[position]
        if o is None:
            o = 0
            if self.p.ring_orders > 1:
                load = [0] * self.p.ring_orders
                for s, t in enumerate(self.running):
                    if t:
                        load[self.running_order[s]] += t.bit_count()
                k = self.p.ring_orders
                o = min(range(k), key=lambda x: (load[x], (x - self.next_order) % k))
                self.next_order = (o + 1) % k
            self.orders[position] = o
        return o

    def decide(self) -> list[Dispatch]:
        """Every dispatch and pre-load possible now, in order; stops when none is possible."""
        out = []
        if self.plan is None:
            return out
        n = self.plan.n
        order, trajs, scheduled = self.plan.order, self.plan.trajs, self.scheduled
        while True:
            icv = self.icv.value
            # the first position not scheduled whose trajectory is free (the ones before
            # ``_first`` are all scheduled)
            while self._first < n and scheduled[self._first]:
                self._first += 1
            k = next(
                (k for k in range(self._first, n) if not scheduled[k] and trajs[order[k]] & icv),
                None,
            )
            if k is None:
                break
            traj = self.plan.trajs[self.plan.order[k]]
            entry = entry_chiplet(traj, icv)
            out.append(self._beat(DISPATCH, k, entry))
            self.scheduled[k] = True
            self.running[entry] = traj
            self.running_order[entry] = self.orders[k]
            self.icv.update(alloc=self.alloc_mask(traj, entry))
            q = partner(k, n) if self.order != "sorted" else None
            if q is not None and not self.scheduled[q] and not self.preloaded[q]:
                qtraj = self.plan.trajs[self.plan.order[q]]
                if not qtraj & self.icv.value:
                    out.append(self._beat(PRELOAD, q, lowest_bit(qtraj)))
                    self.preloaded[q] = True
        return out

    def alloc_mask(self, traj: int, entry: int) -> int:
        """Chiplets a dispatch makes busy: its whole trajectory, or with ``entry_dispatch``
        (A6) its entry chiplet only."""
        return 1 << entry if self.p.entry_dispatch else traj

    def complete(self, done: int):
        """Experts in the slots of bit-mask ``done`` completed (one cycle, several allowed)."""
        valid = sum(1 << s for s, t in enumerate(self.running) if t)
        if done & ~valid:
            self.spurious_done = True
        done &= valid
        rel = done if self.p.entry_dispatch else release_mask(self.running, done)
        for s in range(self.p.chiplets):
            if done >> s & 1:
                self.running[s] = 0
        self.icv.update(release=rel)
        if self.round_done:
            self.plan = None

    @property
    def flags(self) -> dict:
        return {
            "overflow": self.eit.overflow,
            "bad_record": self.eit.bad_record,
            "spurious_done": self.spurious_done,
        }


def run_round(sched: Scheduler, records, pick_done=None) -> tuple[RoundPlan, list]:
    """Run a whole round; ``pick_done(running)`` chooses the completion mask each time the
    scheduler waits (default: the lowest running slot).  Returns the plan and the event list
    ``[("dispatch"|"preload", Dispatch) | ("done", mask)]``."""
    plan = sched.start_round(records)
    events = []
    while sched.plan is not None:
        for d in sched.decide():
            events.append(("dispatch" if d.kind == DISPATCH else "preload", d))
        if sched.plan is None:
            break
        running = sum(1 << s for s, t in enumerate(sched.running) if t)
        mask = pick_done(sched.running) if pick_done else running & -running
        events.append(("done", mask))
        sched.complete(mask)
    return plan, events


def layer_tokens(sp: SchedulerParams, records, defer: int) -> dict[tuple[int, int], int]:
    """Token count per (chiplet, expert) of the requests not deferred this round."""
    nr, nc, ne, cmax = sp.requests, sp.chiplets, sp.experts, sp.count_max
    counts = Counter(
        (c, e)
        for r, c, e in records
        if 0 <= r < nr and not defer >> r & 1 and 0 <= c < nc and 0 <= e < ne
    )
    # in the order of first appearance, like the records (the dict's order is used)
    return {k: min(v, cmax) for k, v in counts.items()}
