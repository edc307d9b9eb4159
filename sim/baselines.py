"""EP and Hydra: the baselines, given the same DDR channels, links, compute and on-chip
memory as FSE-DP and the best streaming their buffers allow.

**EP** (expert parallelism): expert ``e`` lives on chiplet ``e mod C``.  Every token is sent
to the home chiplet of each of its experts (all-to-all over the die-to-die links) and its
result sent back.  Each chiplet streams the weights of its active experts from its own DDR
channel in micro-slice chunks into a ring of ``buffer / micro-slice`` slots (double
buffering and deeper: a chunk is loaded while earlier ones are computed) and computes each
chunk for all the expert's tokens.  The order of a chiplet's experts is Johnson's rule for
the two-stage flow shop (load, compute), which minimises its makespan.

**Hydra** (our reading of He et al., DAC 2025): EP whose expert-to-chiplet placement is
recomputed from the expert popularity seen before -- the same layer of the previous iteration,
or for the first iteration the previous layer -- by a greedy longest-processing-time packing
that balances each chiplet's ``max(load, compute)`` estimate.  Weights are streamed from DDR
every layer in this offloaded setting, so relocating an expert costs nothing extra.
"""

import math

import numpy as np

from fsedp.sim.regions import all_to_all_cycles
from fsedp.sim.result import LayerResult
from fsedp.sim.setup import Setup

__all__ = ["ep_home", "hydra_home", "ep_layer", "bounds", "link_bound", "held_tokens"]


def ep_home(experts: int, chiplets: int) -> list[int]:
    return [e % chiplets for e in range(experts)]


def hydra_home(setup: Setup, predicted: np.ndarray) -> list[int]:
    """Greedy LPT placement balancing ``max(load, compute)`` per chiplet."""
    n = setup.chiplets
    load_one = setup.expert_load_cycles()
    order = sorted(range(len(predicted)), key=lambda e: -int(predicted[e]))
    load = [0] * n
    comp = [0] * n
    home = [0] * len(predicted)
    for e in order:
        t = int(predicted[e])
        l_e = load_one if t else load_one // 2  # unseen experts: half likely active
        c_e = setup.expert_compute_cycles(t) if t else 0
        best = min(range(n), key=lambda c: (max(load[c] + l_e, comp[c] + c_e), c))
        home[e] = best
        load[best] += l_e
        comp[best] += c_e
    return home


def bounds(
    setup: Setup, counts: np.ndarray, slices: np.ndarray | None = None, ahead: int = 0
) -> tuple[int, int]:
    """(DDR, compute) lower bounds of a layer, in cycles, for any strategy: every active
    expert's micro-slices loaded once over all channels, and computed for its tokens; with
    ``slices`` (the slice table, micro-slices per expert, [D13]) only those it streams;
    ``ahead`` of them were loaded before the layer began (pre-loads across layers)."""
    n, dp = setup.chiplets, setup.dp
    per = np.full(len(counts), dp.micro_slices, np.int64) if slices is None else slices
    moved = int(per[counts > 0].sum()) - ahead
    ddr = math.ceil(moved * dp.ddr_interval / n)
    compute = math.ceil(int((counts * per).sum()) * dp.cycles_per_token / n)
    return ddr, compute


def held_tokens(chiplets: int, experts: int, pairs) -> np.ndarray:
    """Tokens per chiplet and expert, ``[chiplets, experts]``, from ``(chiplet, expert,
    tokens)`` triples."""
    held = np.zeros((chiplets, experts), np.int64)
    cet = np.array(list(pairs), np.int64).reshape(-1, 3)
    np.add.at(held, (cet[:, 0], cet[:, 1]), cet[:, 2])
    return held


def link_bound(
    setup: Setup,
    held: np.ndarray,
    slices: np.ndarray | None = None,
    ahead: int = 0,
    tokens_move: bool = True,
) -> int:
    """A lower bound of a layer, in cycles, that sees the die-to-die links as well as DDR and
    compute, for any strategy: weights streamed over rings (FSE-DP), tokens moved to the
    weights (EP, Hydra), an expert loaded from DDR more than once, or any mix.

    ``held[c, e]`` is the tokens on chiplet ``c`` routed to expert ``e``; ``slices`` and
    ``ahead`` as in :func:`bounds`.  For each active expert, every micro-slice is needed on
    each chiplet ``C`` that computes with it: a chiplet gets it from a DDR load of its own
    (``ddr_interval`` on one of the ``n`` channels) or over a link (its bytes over the link
    bandwidth, on one of the mesh's directed links), so ``k`` loads leave at least
    ``|C| - k`` link crossings; a token on a chiplet outside ``C`` crosses at least one link
    there and its result one back (its activation bytes each way).  At best the loads spread
    over all channels and the crossings over all directed links, so for an assignment the
    layer takes at least ``max(DDR, links)``, and for any ``0 <= lam <= 1`` at least
    ``lam * DDR + (1 - lam) * links``; that is linear in each expert's choice, so its
    minimum over all assignments is a sum of per-expert minima (over ``|C| = 1 ..`` the
    chiplets holding its tokens, taken in order of their tokens, and ``k = 1`` or ``k = |C|``:
    the objective is linear in ``k``).  Every ``lam`` gives a bound; the function of ``lam``
    is concave, and its maximum is found by golden-section search.  ``lam = 1`` is the DDR
    bound of :func:`bounds`, so this bound is never below it; it exceeds it where
    replicating weights over links costs more than the DDR time (large meshes, many chiplets
    per expert).  The result is at least the compute bound."""
    n, dp = setup.chiplets, setup.dp
    experts = held.shape[1]
    per = np.full(experts, dp.micro_slices, np.int64) if slices is None else slices
    ddr, compute = bounds(setup, held.sum(0), slices, ahead)
    active = np.flatnonzero(held.sum(0) > 0)
    links = sum(dp.neighbour(c, d) is not None for c in range(n) for d in range(4))
    if not len(active):
        return max(ddr, compute)
    bw = links * setup.link_bytes_per_cycle  # bytes per cycle over all directed links
    ddr_unit = dp.ddr_interval / n  # cycles of all channels per micro-slice load
    # tokens of each active expert, busiest chiplet first; ``out[c - 1]``: the tokens not on
    # the ``c`` busiest chiplets (0 beyond the chiplets holding any: those choices of ``C``
    # are dominated and change no minimum)
    t = -np.sort(-held[:, active], axis=0)
    out = (t.sum(0) - np.cumsum(t, axis=0)) * (2 * setup.act_bytes / bw)
    m = per[active].astype(np.float64)
    c = np.arange(1, n + 1, dtype=np.float64)[:, None]
    # one load per micro-slice and the rest over links, or a load on each chiplet of C
    a = np.concatenate([np.broadcast_to(m * ddr_unit, out.shape), c * m * ddr_unit])
    b = np.concatenate([(c - 1) * m * (setup.microslice_bytes / bw) + out, out])
    if not tokens_move:  # only C = the chiplets holding tokens: fewer would move some
        b[np.concatenate([out, out]) > 0] = np.inf
    saved = ahead * ddr_unit  # loads made before the layer (``bounds``' ``ahead``)
    # every ``lam`` mixes DDR with links no costlier than one load per micro-slice and its
    # ring over every chiplet holding tokens (``k = 1``, ``C`` those chiplets: their ``b`` is
    # the largest that choice can give), so when that ring's link time is within the bound
    # already, no ``lam`` exceeds it (most layers on Table I's meshes: no search)
    s = (t > 0).sum(0)
    if ((s - 1) * m).sum() * (setup.microslice_bytes / bw) <= max(ddr, compute):
        return max(ddr, compute)

    def at(lam: float) -> float:
        return float((lam * a + (1 - lam) * b).min(axis=0).sum()) - lam * saved

    lo, hi = 0.0, 1.0
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = at(x1), at(x2)
    for _ in range(40):
        if f1 < f2:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + g * (hi - lo)
            f2 = at(x2)
        else:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - g * (hi - lo)
            f1 = at(x1)
    best = max(f1, f2, at(0.0))
    # a layer lasts whole cycles; the margin keeps float rounding from lifting the bound
    return max(ddr, compute, math.ceil(best - 1e-6 * max(1.0, best)))


def _flow_shop(
    chunks: list[tuple[int, int]], slots: int, interval: int, latency: int, start: int
) -> tuple[int, list[tuple[int, int]], list[tuple[int, int]]]:
    """Two-stage pipeline over chunks ``(load_cycles, compute_cycles)`` with ``slots``
    buffer slots: a load is issued when the channel is free and a slot is free (the chunk
    ``slots`` earlier has been computed); compute starts when the chunk has arrived, the
    previous compute is done and the tokens are there (``start``).  Returns the makespan,
    the compute intervals and the load intervals."""
    issue_free = 0
    comp_end: list[int] = []
    intervals = []
    loads = []
    prev = start
    for k, (load, comp) in enumerate(chunks):
        slot_free = comp_end[k - slots] if k >= slots else 0
        issue = max(issue_free, slot_free)
        issue_free = issue + load
        loads.append((issue, issue_free))
        arrive = issue + load + latency
        begin = max(arrive, prev)
        prev = begin + comp
        comp_end.append(prev)
        intervals.append((begin, prev))
    return (comp_end[-1] if comp_end else start), intervals, loads


def flow_shop_arrays(load, comp, slots: int, latency: int, start: int):
    """:func:`_flow_shop` on integer arrays (compiled where numba is, the same loop in Python
    otherwise): ``(makespan, begin, end, issue, issue_end)``."""
    from fsedp.sim import fast

    k = len(load)
    begin, end = np.zeros(k, np.int64), np.zeros(k, np.int64)
    issue, issue_end = np.zeros(k, np.int64), np.zeros(k, np.int64)
    if fast.available():
        finish = fast._kernel.flow_shop(
            load, comp, slots, latency, start, begin, end, issue, issue_end
        )
    else:
        finish, iv, lv = _flow_shop(
            list(zip(load.tolist(), comp.tolist())), slots, 0, latency, start
        )
        if k:
            begin[:], end[:] = zip(*iv)
            issue[:], issue_end[:] = zip(*lv)
    return (int(finish) if k else start), begin, end, issue, issue_end


def _idle_arrays(starts, ends, begin: int, end: int, cycles: int, unit: str, acc: dict):
    """:func:`_idle` of intervals given as two arrays."""

    def add(k, v):
        if v > 0:
            acc[k] = acc.get(k, 0) + int(v)

    add("all-to-all", begin + cycles - end)
    if not len(starts):
        add("drain", end - begin)
        return
    add("fill", starts[0] - begin)
    gaps = starts[1:] - ends[:-1]
    add("starved" if unit == "compute" else "full", gaps[gaps > 0].sum())
    add("drain", end - ends[-1])


def _timeline_arrays(begins: list, ends: list) -> list[tuple[int, int]]:
    """:func:`_timeline` of per-chiplet interval arrays."""
    t = np.concatenate([*begins, *ends]) if begins else np.zeros(0, np.int64)
    if not len(t):
        return [(0, 0)]
    nb = sum(len(b) for b in begins)
    d = np.concatenate([np.ones(nb, np.int64), -np.ones(len(t) - nb, np.int64)])
    order = np.lexsort((d, t))
    t, level = t[order], np.cumsum(d[order])
    keep = np.ones(len(t), bool)
    keep[:-1] = t[:-1] != t[1:]
    out = list(zip(t[keep].tolist(), level[keep].tolist()))
    return out if out[0][0] == 0 else [(0, 0), *out]


def _idle(
    intervals: list[tuple[int, int]], begin: int, end: int, cycles: int, unit: str, acc: dict
):
    """Add the idle cycles of one unit (``unit`` = ``"ddr"`` or ``"compute"``) of a layer of
    ``cycles`` cycles to ``acc`` by cause: ``all-to-all`` before ``begin`` and after
    ``end``; ``fill`` before its first busy interval; ``drain`` after its last one (until
    ``end``); between intervals ``starved`` (compute) or ``full`` (DDR: no free slot)."""

    def add(k, v):
        if v > 0:
            acc[k] = acc.get(k, 0) + v

    add("all-to-all", begin + cycles - end)
    if not intervals:
        add("drain", end - begin)
        return
    add("fill", intervals[0][0] - begin)
    gap = "starved" if unit == "compute" else "full"
    for (_, b), (a, _) in zip(intervals, intervals[1:]):
        add(gap, a - b)
    add("drain", end - intervals[-1][1])


def _all_to_all(setup: Setup, records, home: list[int]) -> tuple[int, int]:
    """Cycles to send every (token, expert) activation to the expert's home chiplet (and,
    the same again, back), limited by the busiest chiplet's links; and the bytes sent
    (:func:`fsedp.sim.regions.all_to_all_cycles`)."""
    return all_to_all_cycles(setup, [(c, home[e]) for _, c, e in records])


def ep_layer(
    setup: Setup, records, home: list[int], name: str = "EP", whole: bool = False
) -> LayerResult:
    """Expert parallelism: every expert computed on its home chiplet, tokens moved there by
    an all-to-all and back.  Ours (``whole=False``) streams each expert's micro-slices
    through the buffer, so loading and computing overlap inside an expert and across
    experts, in Johnson's order.  The paper's (``whole=True``, strategy ``EP-paper``)
    loads a whole expert before computing it and holds whole experts: as many as the buffer
    takes, at least one (the buffer grows to one expert if it is smaller), so loading the
    next expert overlaps computing this one only when two fit."""
    n = setup.chiplets
    dp = setup.dp
    counts = np.zeros(setup.sp.experts, dtype=np.int64)
    for _, _, e in records:
        counts[e] += 1
    if whole:
        slots = max(1, setup.buffer_bytes // setup.expert_bytes)
        chunk_bytes, per_expert = setup.expert_bytes, 1
    else:
        slots = max(2, setup.buffer_bytes // setup.microslice_bytes)
        chunk_bytes, per_expert = setup.microslice_bytes, dp.micro_slices
    dispatch, a2a_bytes = _all_to_all(setup, records, home)
    finish = [0] * n
    busy = [0] * n
    intervals_all = []
    loads_all = []
    peak_tokens = [0] * n
    chunks_per_chiplet = [0] * n
    ddr_per_chiplet = [0] * n
    for c in range(n):
        mine = [e for e in range(len(counts)) if counts[e] and home[e] == c]
        jobs = [
            (setup.expert_load_cycles(), setup.expert_compute_cycles(int(counts[e])), e)
            for e in mine
        ]
        first = sorted((j for j in jobs if j[0] < j[1]), key=lambda j: j[0])
        last = sorted((j for j in jobs if j[0] >= j[1]), key=lambda j: -j[1])
        order = np.array([e for _, _, e in first + last], np.int64)
        comp = np.repeat(
            counts[order] * dp.cycles_per_token * (dp.micro_slices // per_expert), per_expert
        ).astype(np.int64)
        load = np.full(len(comp), dp.ddr_interval * (dp.micro_slices // per_expert), np.int64)
        finish[c], b, e, i, ie = flow_shop_arrays(
            load, comp, slots, setup.ddr_access_cycles, dispatch
        )
        loads_all.append((i, ie))
        busy[c] = int((e - b).sum())
        intervals_all.append((b, e))
        peak_tokens[c] = int(sum(counts[e] for e in mine))
        chunks_per_chiplet[c] = len(comp)
        ddr_per_chiplet[c] = len(mine) * setup.expert_bytes
    cycles = max(finish) + dispatch  # results travel back like the tokens came
    idle: dict = {"ddr": {}, "compute": {}}
    for c in range(n):
        # loads start at 0 (weights do not wait for tokens); compute after the all-to-all
        _idle_arrays(*loads_all[c], 0, max(finish), cycles, "ddr", idle["ddr"])
        _idle_arrays(*intervals_all[c], dispatch, max(finish), cycles, "compute", idle["compute"])
    ddr_b, comp_b = bounds(setup, counts)
    held = held_tokens(n, len(counts), ((c, e, 1) for _, c, e in records))
    timeline = _timeline_arrays([b for b, _ in intervals_all], [e for _, e in intervals_all])
    active = int(np.count_nonzero(counts))
    return LayerResult(
        strategy=name,
        cycles=cycles,
        bound=max(ddr_b, comp_b),
        busy=busy,
        ddr_bytes=active * setup.expert_bytes,
        d2d_bytes=2 * a2a_bytes,
        peak_weight_bytes=min(slots, max(chunks_per_chiplet)) * chunk_bytes,
        peak_token_bytes=max(peak_tokens) * setup.act_bytes * 2,
        ddr_cycles=ddr_b,
        compute_cycles=comp_b,
        link_bound=link_bound(setup, held),
        stream_bound=0,  # EP moves tokens
        timeline=timeline,
        decisions=active,
        ddr_per_chiplet=ddr_per_chiplet,
        idle=idle,
    )


def _timeline(intervals_per_chiplet) -> list[tuple[int, int]]:
    edges = []
    for iv in intervals_per_chiplet:
        for a, b in iv:
            edges.append((a, 1))
            edges.append((b, -1))
    edges.sort()
    out = [(0, 0)]
    level = 0
    for t, d in edges:
        level += d
        if out[-1][0] == t:
            out[-1] = (t, level)
        else:
            out.append((t, level))
    return out
