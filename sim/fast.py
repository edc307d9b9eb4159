"""The compiled streaming engine: one FSE-DP layer's cycles in :mod:`fsedp.sim.fast_kernel`
(numba), the scheduler golden model called from here whenever a job finishes.

The Python cycle model (:class:`fsedp.sw.streaming.StreamingArray`) stays the executable
specification and the RTL's reference; this engine must produce the same events at the same
cycles (every micro-slice load, transfer and computation, every layer's end cycle) and the
same bookkeeping (``tests/test_fast.py``).  Which one the simulator uses: ``compiled`` (the
default) when numba imports, else ``python``, said once on standard error; the environment
variable ``FSEDP_STREAMING=python|compiled`` or ``fsedp run --streaming`` chooses.
"""

import enum
import os

import numpy as np

from fsedp.log import logger
from fsedp.params import RING_ORDERS, DatapathParams
from fsedp.sw.scheduler_timing import SchedulerTiming
from fsedp.sw.streaming.probe import DDR_CAUSES, PE_CAUSES
from fsedp.sw.streaming.watchdog import slot_status, stalled

__all__ = [
    "STREAMING",
    "available",
    "streaming_engine",
    "run_layer",
    "python_events",
    "activity",
    "Event",
]

STREAMING = ("compiled", "python")


class Event(enum.IntEnum):
    """Kind of an event-log entry ``(kind, cycle, a, b, expert, index)``: a DDR ``LOAD``
    ``(target, slot)``, a link ``TRANSFER`` ``(src, direction)``, a ``COMPUTE`` that ends
    ``(chiplet, final)`` (:func:`python_events`, the kernel's log)."""

    LOAD = 0
    TRANSFER = 1
    COMPUTE = 2


_kernel = None
_said = False


def as_int64(mask: int) -> int:
    """A chiplet mask (a trajectory, up to 64 chiplets) as the kernel's ``int64`` holds it:
    bit 63 is the sign bit."""
    return mask - (1 << 64) if mask >> 63 else mask


def as_mask(value) -> int:
    """A chiplet mask read back from the kernel's ``int64`` (:func:`as_int64`'s inverse)."""
    return int(value) & ((1 << 64) - 1)


def available() -> bool:
    """Whether the compiled engine can run here (numba imports)."""
    global _kernel
    if _kernel is None:
        try:
            from fsedp.sim import fast_kernel

            _kernel = fast_kernel
        except ImportError:
            _kernel = False
    return _kernel is not False


def streaming_engine() -> str:
    """The engine the simulator uses now: ``FSEDP_STREAMING`` if set, else ``compiled`` where
    numba is installed; a fallback to ``python`` is said once per process."""
    global _said
    want = os.environ.get("FSEDP_STREAMING", "compiled")
    if want == "python":
        return "python"
    if available():
        return "compiled"
    if not _said:
        _said = True
        logger("fast").warning(
            "numba is not available; the simulator runs the Python streaming model (same "
            "results, slower: fsedp bench measures by how much)"
        )
    return "python"


_GEOMETRY_CACHE: dict = {}


def _geometry(p: DatapathParams):
    """Neighbour, XY-direction and distance tables of the mesh (made once per shape)."""
    key = (p.rows, p.cols)
    if key not in _GEOMETRY_CACHE:
        n = p.chiplets
        nb = [
            [-1 if p.neighbour(c, d) is None else p.neighbour(c, d) for d in range(4)]
            for c in range(n)
        ]
        _GEOMETRY_CACHE[key] = (
            np.array(nb, np.int64),
            np.array([[p.direction(a, b) for b in range(n)] for a in range(n)], np.int64),
            np.array([[p.distance(a, b) for b in range(n)] for a in range(n)], np.int64),
        )
    return _GEOMETRY_CACHE[key]


class _Arrays:
    """The kernel's state of a fresh :class:`StreamingArray` of ``p``."""

    def __init__(self, p: DatapathParams, expected, log_capacity: int = 0):
        k = _kernel
        n, K = p.chiplets, p.slots
        self.p = p
        P = np.zeros(k.NP, np.int64)
        P[k.P_N], P[k.P_K], P[k.P_E], P[k.P_M] = n, K, p.experts, p.micro_slices
        P[k.P_CPT], P[k.P_LINK] = p.cycles_per_token, p.link_cycles
        P[k.P_DINT], P[k.P_DLAT] = p.ddr_interval, p.ddr_latency
        P[k.P_NPRE], P[k.P_RULE5], P[k.P_CHAN] = p.preload_entries, p.rule5, p.ddr_channels
        P[k.P_PREEMPT], P[k.P_HOT] = p.preempt, p.hot_window
        P[k.P_ADMIT] = k.ADMIT_STATE if p.admission == "forward-state" else k.ADMIT_COUNT
        P[k.P_AGE] = p.ddr_age_bits
        P[k.P_FDEPTH] = p.ddr_fifo_depth
        P[k.P_H], P[k.P_LOG] = p.max_hops, log_capacity > 0
        P[k.P_COLS], P[k.P_ORDERS] = p.cols, p.ring_orders
        self.P = P
        self.NB, self.DIRT, self.DIST = _geometry(p)
        npre = max(1, p.preload_entries)
        chans = p.ddr_channels
        self.SL = np.zeros((n, K, k.NS), np.int64)
        self.CH = np.zeros((n, k.NC), np.int64)
        self.JB = np.zeros((n, k.NJ), np.int64)
        self.JH = np.zeros((n, n), np.int64)
        self.JRD = np.zeros((n, n), np.int64)
        self.JRR = np.zeros((n, n), np.int64)
        self.PR = np.zeros((npre, k.NQ), np.int64)
        self.QH = np.zeros((npre, n), np.int64)
        self.QRD = np.zeros((npre, n), np.int64)
        self.FF = np.zeros((chans, int(P[k.P_FDEPTH]), k.NF), np.int64)
        self.FQ = np.zeros((chans, 2), np.int64)
        self.GP = np.zeros(chans, np.int64)
        self.TK = np.zeros((n, p.experts), np.int64)
        self.MS = np.full(p.experts, p.micro_slices, np.int64)
        self.RO = np.zeros(p.experts, np.int64)
        # the ring embeddings' chiplet sequences and places (DatapathParams.ring_table)
        self.RG = np.array([p.ring_table(o) for o in range(len(RING_ORDERS))], np.int64)
        self.SC = np.zeros(k.NX, np.int64)
        self.SC[k.X_NTL] = 1
        self.DI = np.zeros(len(DDR_CAUSES), np.int64)
        self.PI = np.zeros(len(PE_CAUSES), np.int64)
        self.DW = np.full(chans, -1, np.int64)
        self.PW = np.full(n, -1, np.int64)
        self.started = np.zeros(n, np.int64)
        self.computed = np.zeros(n, np.int64)
        self.peak = np.zeros(n, np.int64)
        self.links = np.zeros((n, 4), np.int64)
        self.ddr_per = np.zeros(n, np.int64)
        self.busy = np.zeros(n, np.int64)
        self.EVL = np.zeros((max(1, log_capacity), 6), np.int64)
        self.expected = expected
        # the count of computing chiplets changes at most twice per computation
        self.TL = np.zeros(
            (2 * (int(expected.sum()) + p.micro_slices * p.experts) + 2, 2), np.int64
        )

    def tuples(self):
        """The kernel's state and bookkeeping tuples (``fast_kernel.STATE``, ``BOOKS``)."""
        return tuple(getattr(self, x) for x in _kernel.STATE), tuple(
            getattr(self, x) for x in _kernel.BOOKS
        )


def run_layer(
    dp: DatapathParams,
    sched,
    plan,
    tokens: dict,
    log: bool = False,
    trace: bool = False,
    slices: np.ndarray | None = None,
    ahead: list = (),
) -> dict:
    """The cycle loop of :func:`fsedp.sim.fsedp.fsedp_layer` on the compiled engine: the
    same bookkeeping (``busy``, ``peak``, ``timeline``, counts, idle causes, completion
    script, decisions) as the Python loop; with ``log`` the event list too.  ``ahead``:
    ``(chiplet, expert, index)`` pre-loaded before the layer (``ddr.load_ahead``).  A layer
    that reaches a state in which nothing can happen any more raises
    :class:`fsedp.sw.streaming.SimulationStalled` with the same state, at the same cycle, as
    the Python loop (``fsedp.sw.streaming.watchdog``)."""
    if not available():
        raise RuntimeError("the compiled streaming engine needs numba")
    k = _kernel
    n = dp.chiplets
    # the slice table [D13]: one count per expert
    per = np.full(dp.experts, dp.micro_slices, np.int64) if slices is None else slices
    expected = np.zeros(n, np.int64)
    for (c, e), t in tokens.items():
        if t:
            expected[c] += per[e]
    total = int(expected.sum())
    # each micro-slice is loaded once and crosses at most H links
    log = log or trace
    cap = (total + dp.micro_slices * dp.experts) * (dp.max_hops + 2) if log else 0
    a = _Arrays(dp, expected, cap)
    S, B = a.tuples()
    for (c, e), t in tokens.items():
        a.TK[c, e] = t  # the gate fills the tables with the records
    a.MS[:] = per
    for c, e, i in ahead:  # ddr.load_ahead: the lowest free slot, held, no trajectory yet
        slot = int(np.flatnonzero(a.SL[c, :, k.S_BUSY] == 0)[0])
        row = a.SL[c, slot]
        row[k.S_BUSY], row[k.S_HELD], row[k.S_DDR] = 1, k.AHEAD, 1
        row[k.S_CLAIM] = dp.held_claim
        row[k.S_EXPERT], row[k.S_INDEX], row[k.S_TRAJ], row[k.S_DEST] = e, i, 0, c
    # the scheduler RTL's timing of the round's decisions, the first beat in cycle 0
    timing = SchedulerTiming(sched)
    timing.begin(0)
    made, script = [], []
    # every expert is dispatched once and pre-loaded at most once per layer
    BT = np.zeros((2 * dp.experts + 2, 6), np.int64)
    while True:
        for cycle, b in timing.queue:
            if len(made) == len(BT):
                BT = np.concatenate([BT, np.zeros_like(BT)])
            BT[len(made)] = (b.kind, b.expert, b.entry, as_int64(b.traj), b.order, cycle)
            made.append([b.kind, b.expert, b.entry, b.traj])
        timing.queue.clear()  # the kernel presents them
        status, done = k.run(S, B, BT, len(made), sched.in_round, plan.n, timing.wait_at)
        pos = int(a.SC[k.X_BPOS])
        if status == k.STALLED:
            raise stalled("compiled", _state(a), sched)
        if status == k.ENDED:
            break
        done = as_mask(done)
        script.append(done)
        timing.completed(int(a.SC[k.X_CYCLE]) - 1, done)  # taken in the cycle just stepped
    assert pos == len(made)
    sc = a.SC
    out = {
        "cycles": int(sc[k.X_CYCLE]),
        "busy": [int(x) for x in a.busy],
        "peak": [int(x) for x in a.peak],
        "timeline": list(zip(a.TL[: sc[k.X_NTL], 0].tolist(), a.TL[: sc[k.X_NTL], 1].tolist())),
        "loads": int(sc[k.X_LOADS]),
        "transfers": int(sc[k.X_TRANSFERS]),
        "computations": int(sc[k.X_COMPUTATIONS]),
        "decisions": len(made),
        "ddr_per_loads": [int(x) for x in a.ddr_per],
        "link_transfers": {
            (c, d): int(a.links[c, d]) for c in range(n) for d in range(4) if a.links[c, d]
        },
        "script": script,
        "beats": made,
        "steps": int(sc[k.X_STEPS]),
        "idle": {
            "ddr": {DDR_CAUSES[i]: int(v) for i, v in enumerate(a.DI) if v},
            "compute": {PE_CAUSES[i]: int(v) for i, v in enumerate(a.PI) if v},
        },
        "flags": (bool(sc[k.X_BAD]), bool(sc[k.X_ORPHAN])),
    }
    if log:
        out["events"] = [tuple(row) for row in a.EVL[: sc[k.X_NEV]].tolist()]
    if trace:
        out["activity"] = activity(out["events"], dp, tokens)
    return out


def _state(a: "_Arrays") -> dict:
    """``watchdog.array_state`` of the kernel's arrays (the same values, field by field)."""
    k = _kernel
    SL, CH, JB, PR, SC = a.SL, a.CH, a.JB, a.PR, a.SC
    chiplets = []
    for c in range(a.p.chiplets):
        slots = []
        for i in range(a.p.slots):
            s = SL[c, i].tolist()
            if s[k.S_BUSY]:
                what = slot_status(
                    s[k.S_RESV],
                    s[k.S_WAIT],
                    s[k.S_HELD],
                    s[k.S_COMP],
                    s[k.S_COMPUTING],
                    s[k.S_SEND],
                    s[k.S_TX],
                )
                slots.append(
                    (i, s[k.S_EXPERT], s[k.S_INDEX], as_mask(s[k.S_TRAJ]), s[k.S_DEST], what)
                )
        cnt = int(CH[c, k.C_CNT])
        computing = (int(CH[c, k.C_CEXPERT]), int(CH[c, k.C_CINDEX]), cnt) if cnt else None
        chiplets.append({"computing": computing, "slots": slots})
    jobs = [
        {
            "entry": j,
            "expert": int(JB[j, k.J_EXPERT]),
            "traj": as_mask(JB[j, k.J_TRAJ]),
            "loaded": int(JB[j, k.J_LOADED]),
            "retired": int(JB[j, k.J_RETIRED]),
            "count": int(JB[j, k.J_COUNT]),
        }
        for j in range(a.p.chiplets)
        if JB[j, k.J_VALID]
    ]
    preloads = [
        {
            "expert": int(PR[q, k.Q_EXPERT]),
            "traj": as_mask(PR[q, k.Q_TRAJ]),
            "chiplet": int(PR[q, k.Q_CHIPLET]),
            "loaded": int(PR[q, k.Q_LOADED]),
            "count": int(PR[q, k.Q_COUNT]),
        }
        for q in range(a.p.preload_entries)
        if PR[q, k.Q_VALID]
    ]
    return {
        "cycle": int(SC[k.X_CYCLE]),
        "chiplets": chiplets,
        "jobs": jobs,
        "preloads": preloads,
        "ddr_queued": [int(x) for x in a.FQ[:, 1]],
        "done_pending": int(SC[k.X_DONE]),
        "bad_dispatch": bool(SC[k.X_BAD]),
        "orphan": bool(SC[k.X_ORPHAN]),
    }


def by_cycle(events: list):
    """``(cycle, events of that cycle)`` of an event list (ordered by cycle), in order."""
    i = 0
    while i < len(events):
        cycle = events[i][1]
        j = i
        while j < len(events) and events[j][1] == cycle:
            j += 1
        yield cycle, events[i:j]
        i = j


def activity(events: list, dp: DatapathParams, tokens: dict) -> list:
    """The per-chiplet activity spans of a layer (Figure 13, ``trace=True``) from its event
    list, in the Python loop's order: per cycle computations, loads, then transfers."""
    out = []
    for cycle, group in by_cycle(events):
        for kind, _, c, _, e, _ in group:
            if kind == Event.COMPUTE:
                dur = max(1, tokens.get((c, e), 0)) * dp.cycles_per_token
                out.append((c, "compute", cycle - dur + 1, cycle + 1))
        for kind, _, t, *_ in group:
            if kind == Event.LOAD:
                out.append((t, "DDR load", cycle, cycle + dp.ddr_interval))
        for kind, _, src, d, *_ in group:
            if kind == Event.TRANSFER:
                out.append((src, "D2D send", cycle, cycle + dp.link_cycles))
                out.append((dp.neighbour(src, d), "D2D receive", cycle, cycle + dp.link_cycles))
    return out


def python_events(cycle: int, out) -> list:
    """The event list of one :meth:`StreamingArray.step` in the kernel's order and form:
    transfers ``(1, cycle, src, dir, expert, index)``, loads ``(0, cycle, target, slot,
    expert, index)``, computations ``(2, cycle, chiplet, final, expert, index)``."""
    load, transfer, compute = int(Event.LOAD), int(Event.TRANSFER), int(Event.COMPUTE)
    ev = [(transfer, cycle, src, d, h.expert, h.index) for src, d, h in out.transfers]
    ev += [(load, cycle, t, slot, h.expert, h.index) for t, slot, h, _ in out.ddr_issues]
    ev += [(compute, cycle, c, int(e[2]), e[0], e[1]) for c, e in enumerate(out.events) if e]
    return ev
