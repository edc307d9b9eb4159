"""The golden timing of the scheduler's back half: in which cycle each decision of the
golden scheduler (:class:`fsedp.sw.scheduler.Scheduler`) is presented on the dispatch stream
and in which cycles a completion is taken, as the scheduler RTL (``hw/scheduler.py``) does
it with its states ``PICK``, ``CHECK``, ``EMIT_D``, ``PCHECK``, ``EMIT_P``, ``WAIT`` and
``DRAIN``.  One description, followed by the simulator's layer loops (the Python loop
``fsedp.sim.fsedp.python_loop`` and the compiled engine ``fsedp.sim.fast.run_layer``) and by
the chip's golden model (``tb/tb_chip.py``).

The decisions themselves are the golden scheduler's (a function of the gate records and of
the sequence of completion masks); this module only places them in cycles:

* ``PICK`` in cycle ``x`` finds the first eligible expert: its dispatch beat is presented by
  ``EMIT_D`` in ``x +`` :data:`PICK_TO_DISPATCH` (``CHECK`` between) and taken at once;
* after a dispatch whose partner is neither dispatched nor pre-loaded, ``PCHECK`` looks at the
  partner: the Rule 4 pre-load beat, if the golden scheduler makes one, is presented by
  ``EMIT_P`` :data:`DISPATCH_TO_PRELOAD` cycles after its dispatch; the next ``PICK`` follows
  ``EMIT_P`` (or a ``PCHECK`` that made no beat) in the next cycle.  So dispatches come every
  :data:`DISPATCH_CYCLES` cycles, one more with ``PCHECK``, two more with a pre-load;
* a ``PICK`` that finds nothing goes to ``WAIT``: ``done.ready`` is high from the next cycle
  on, and only there (a completion shown earlier waits);
* a completion taken in cycle ``c`` while experts remain to dispatch: ``PICK`` in
  ``c +`` :data:`DONE_TO_PICK`, its first beat in ``c + 3``;
* ``WAIT`` with every expert dispatched and none running: ``DRAIN``, then ``IDLE``
  :data:`DRAIN_CYCLES` later;
* a round's first beat comes :func:`front_latency` cycles after its ``last`` gate record
  (the RTL's ``Scheduler.latency``), plus the deferral's re-merge and the balanced order's
  build (:meth:`SchedulerTiming.last_record`).

The paper's ablation A2 (``order="sorted"``, no pre-loads, golden model and simulator only)
has no ``PCHECK``: a dispatch every :data:`DISPATCH_CYCLES` cycles.
"""

from collections import deque

from fsedp.sw.pairing import partner
from fsedp.sw.scheduler import DISPATCH, PRELOAD, Dispatch, Scheduler
from fsedp.sw.sorter import network

__all__ = [
    "PICK_TO_DISPATCH",
    "DISPATCH_CYCLES",
    "PCHECK_CYCLES",
    "PRELOAD_CYCLES",
    "DISPATCH_TO_PRELOAD",
    "DONE_TO_PICK",
    "DONE_TO_BEAT",
    "DRAIN_CYCLES",
    "FRONT_CYCLES",
    "REMERGE_EXTRA",
    "ORDER_EXTRA",
    "front_latency",
    "SchedulerTiming",
    "replay_round",
]

#: ``PICK`` -> ``CHECK`` -> ``EMIT_D``: the dispatch beat 2 cycles after its ``PICK``
PICK_TO_DISPATCH = 2
#: ``PICK``, ``CHECK``, ``EMIT_D``: a dispatch beat every 3 cycles
DISPATCH_CYCLES = 3
#: ``PCHECK``: one cycle after a dispatch whose partner is neither dispatched nor pre-loaded
PCHECK_CYCLES = 1
#: ``EMIT_P``: one cycle more when ``PCHECK`` makes a pre-load
PRELOAD_CYCLES = 1
#: ``EMIT_D`` -> ``PCHECK`` -> ``EMIT_P``: a pre-load 2 cycles after its dispatch
DISPATCH_TO_PRELOAD = PCHECK_CYCLES + PRELOAD_CYCLES
#: a completion taken in ``WAIT`` in cycle ``c``: ``PICK`` in ``c + 1``
DONE_TO_PICK = 1
#: ... and its first beat in ``c + 3``
DONE_TO_BEAT = DONE_TO_PICK + PICK_TO_DISPATCH
#: ``WAIT`` with the round over -> ``DRAIN`` -> ``IDLE``
DRAIN_CYCLES = 2
#: the front half beyond the sorter's latency ``L``: ``SETTLE`` (2), ``TB``, ``DEFER``,
#: ``SORT``, ``PICK``, ``CHECK``, then ``EMIT_D`` presents the first beat
FRONT_CYCLES = 8
#: a round that defers a request: ``DEFER`` re-merges ``ceil(E / eit_lanes)`` words, plus 1
REMERGE_EXTRA = 1
#: with ``balance``: ``ORDER0``, ``ORDER`` build the balanced order in ``n`` cycles, plus 2
ORDER_EXTRA = 2


def front_latency(p) -> int:
    """Cycles from the ``last`` gate record to the round's first beat when nothing is
    deferred and without ``balance`` (``hw/scheduler.py``'s ``Scheduler.latency``)."""
    return network(p.sorter_lanes, p.sorter).cycles + FRONT_CYCLES


class SchedulerTiming:
    """The cycles in which the scheduler RTL presents the golden scheduler's decisions and
    takes completions.

    The layer loops use :meth:`begin` (a round whose first beat is in a given cycle),
    :meth:`cycle` (the beat and ``done.ready`` of a cycle) and :meth:`completed` (a
    completion taken); :attr:`queue` holds the beats placed and not yet presented, in order,
    as ``(cycle, Dispatch)``, and :attr:`wait_at` the first cycle of ``WAIT`` after them.
    The chip's model adds :meth:`start_round`, :meth:`last_record` and :attr:`idle`.  The
    decisions of a ``PICK`` are placed when it is known to come (a completion, the round's
    first beat): the golden scheduler's state changes only with completions, and none is
    taken before ``WAIT``."""

    def __init__(self, sched: Scheduler):
        self.s = sched
        p = sched.p
        self.front = front_latency(p)
        self.words = -(-p.experts // p.eit_lanes)  # EIT bank words (deferral re-merge)
        self._clear()

    def _clear(self):
        self.state = "IDLE"
        self.queue: deque[tuple[int, Dispatch]] = deque()
        self.wait_at = None
        self.idle_at = None
        self.first_beat = None
        self.plan = self.s.plan

    def reset(self):
        """Reset: the golden scheduler and the timing."""
        self.s.reset()
        self._clear()

    # -- the chip: front half ------------------------------------------------------------
    def start_round(self, records):
        """The golden model's front half (decisions follow from the records alone)."""
        self.plan = self.s.start_round(records)
        self.state = "FILL"
        return self.plan

    def last_record(self, cycle: int):
        """The ``last`` gate record was transferred in ``cycle``: the first beat comes
        :func:`front_latency` later, plus the deferral's re-merge (``ceil(E / eit_lanes) +
        1``) and the balanced order's build (``n + 2``)."""
        first = cycle + self.front
        if self.plan.defer:
            first += self.words + REMERGE_EXTRA
        if self.s.p.balance:
            first += self.plan.n + ORDER_EXTRA
        self.begin(first)

    # -- the back half -------------------------------------------------------------------
    def begin(self, first: int):
        """The round's first ``PICK`` is in ``first -`` :data:`PICK_TO_DISPATCH`: its first
        beat in ``first``."""
        self.first_beat = first
        self.plan = self.s.plan
        self._pick(first - PICK_TO_DISPATCH)

    def _pick(self, x: int):
        """``PICK`` in cycle ``x``: the golden decisions, placed in cycles."""
        s = self.s
        if s.plan is None:
            self.state, self.wait_at = "BURST", x + 1
            return
        sched0 = list(s.scheduled)
        pre0 = list(s.preloaded)
        n = s.plan.n
        pos = {e: k for k, e in enumerate(s.plan.order)}
        pairs = s.order != "sorted"
        out = s.decide()
        t, i = x, 0  # t: the cycle of the PICK of out[i]
        while i < len(out):
            b = out[i]
            d = t + PICK_TO_DISPATCH  # CHECK, then EMIT_D (the array takes it at once)
            self.queue.append((d, b))
            t += DISPATCH_CYCLES
            k = pos.get(b.expert)
            if b.kind != DISPATCH or k is None:
                # not a decision the RTL makes (a scheduler that contradicts the golden one,
                # tests/test_watchdog.py): presented in a dispatch's cycles
                i += 1
                continue
            sched0[k] = True
            q = partner(k, n) if pairs else None
            if q is not None and not sched0[q] and not pre0[q]:  # PCHECK
                t += PCHECK_CYCLES
                if i + 1 < len(out) and out[i + 1].kind == PRELOAD:  # EMIT_P
                    i += 1
                    self.queue.append((d + DISPATCH_TO_PRELOAD, out[i]))
                    pre0[q] = True
                    t += PRELOAD_CYCLES
            i += 1
        self.state, self.wait_at = "BURST", t + 1  # PICK in t finds nothing: WAIT

    def ready(self, c: int) -> bool:
        """``done.ready`` in cycle ``c`` (``WAIT`` with the round not over); for the layer
        loops, which follow :attr:`s`'s round (the chip's model: :meth:`cycle`)."""
        return self.s.plan is not None and c >= self.wait_at

    def present(self, c: int) -> Dispatch | None:
        """The beat presented in cycle ``c`` (the array takes it in the same cycle)."""
        if self.queue and self.queue[0][0] == c:
            return self.queue.popleft()[1]
        return None

    def cycle(self, c: int) -> tuple:
        """``(beat or None, done.ready)`` of cycle ``c``, stepping the FSM's state (the
        chip's model, :attr:`idle`)."""
        if self.state == "BURST" and c >= self.wait_at:
            self.state = "WAIT"
        if self.state == "WAIT" and self.s.plan is None:
            # nsched == n and nothing running: DRAIN, then IDLE
            self.state, self.idle_at = "DRAIN", c + DRAIN_CYCLES
        if self.state == "DRAIN" and c >= self.idle_at:
            self.state = "IDLE"
        return self.present(c), self.state == "WAIT"

    def completed(self, c: int, mask: int):
        """A completion mask transferred in cycle ``c`` (in ``WAIT``): with experts left to
        dispatch, ``PICK`` in ``c +`` :data:`DONE_TO_PICK` places its decisions."""
        self.s.complete(mask)
        if self.s.plan is not None and not all(self.s.scheduled):
            self._pick(c + DONE_TO_PICK)

    @property
    def idle(self) -> bool:
        return self.state == "IDLE"


def replay_round(sched: Scheduler, shown) -> tuple[list, list]:
    """A layer loop's round replayed from its completions alone: ``sched`` with its round
    started, ``shown`` the ``(cycle, mask)`` from which each job's completion is shown (a
    job whose last micro-slice retires in cycle ``t`` shows it from ``t + 1``).  Returns the
    beats ``[(cycle, Dispatch)]`` and the completions taken ``[(cycle, mask)]`` (several
    shown before the scheduler waits are taken together), the first beat in cycle 0, as
    ``fsedp.sim.fsedp.python_loop`` presents and takes them."""
    timing = SchedulerTiming(sched)
    timing.begin(0)
    beats = list(timing.queue)
    taken = []
    events = sorted(shown)
    j = 0
    while j < len(events):
        c = max(events[j][0], timing.wait_at)
        mask = 0
        while j < len(events) and events[j][0] <= c:
            mask |= events[j][1]
            j += 1
        timing.queue.clear()
        timing.completed(c, mask)
        taken.append((c, mask))
        beats += timing.queue
    return beats, taken
