"""Token gathering into regions of the mesh (strategy ``A8``).

On a large mesh an expert whose tokens sit on every chiplet streams over a ring through all
of them: every micro-slice crosses ``|C| - 1`` links or more, and every chiplet of the mesh
is entered by every micro-slice of every active expert.  ``A8`` moves tokens, not weights:
the mesh is tiled into equal rectangular *regions*; each active expert is given one region,
its tokens travel there (an all-to-all of their activations, and the results back, priced
as EP's), spread evenly over the region's chiplets, and the expert streams under A7's rules
on a ring inside the region, loaded by the region's own DDR channels.  Each expert is still
loaded from DDR exactly once; what changes is the links its micro-slices cross (``|R| - 1``
instead of ``|C| - 1``) and which DDR channels and compute units carry it.

In a *balanced* layer (compute about as long as DDR: :data:`BALANCED`) every unit must be
busy all the time, and a ring runs at the pace of the chiplet that holds most of the
streaming experts' tokens: an expert whose tokens sit unevenly on its ring (4 on one chiplet,
12 on the next) stalls the others behind the busy one while the light ones idle.  There the
whole mesh is not left as the gate wrote it: every expert's tokens are spread evenly over
the chiplets that already hold them (:func:`spread`; its ring is unchanged), priced by the
same all-to-all.

The tiling and the experts' regions are chosen per layer by a cost model (:func:`plan`),
before the layer streams, from the counts the gate writes -- the same counts the EIT holds.
For every tiling of the mesh into regions of at least two chiplets (the whole mesh, where
nothing moves, among them), experts are placed on regions by a balancing heuristic
(:func:`assign`) and the tiling is scored by the largest of each region's three loads: its
DDR time (its experts' micro-slices over its channels), its compute time (their MACs over
its chiplets) and its busiest link (every micro-slice enters every chiplet of the region it
was not loaded on through one of that chiplet's links inside the region), plus the
all-to-all twice.  The lowest score wins; a tiling within 1 % of it with a less loaded
busiest link is taken instead (the model does not see how links and loads interfere, and
links that are busy most of the time stall the rings: ``docs/simulator.md``).

Decisions where the papers are silent (``docs/simulator.md#a8-tokens-gathered-into-regions``):
regions are equal rectangles tiling the mesh (so every region is a small mesh whose snake
rings have one-hop legs where the region has an even side); the all-to-all happens before
the layer streams and the results return after it, each as long as EP's all-to-all of the
same tokens (a bound on the busiest chiplet's links; overlapping the gather with the first
DDR loads is left out, so the figure is pessimistic by at most that phase); inside its
region an expert's tokens are spread as evenly as whole tokens allow, tokens already in the
region staying where they are when their chiplet has room, the others going to the nearest
chiplet with room; the whole mesh of a balanced layer is evened out per expert inside its
own chiplets (never onto a chiplet outside its ring, which would lengthen it), with each
chiplet keeping its number of tokens where the counts allow (measured on 2x2, 3x3 and 4x4 at
1024 tokens, ``docs/simulator.md``).
"""

import math
from typing import NamedTuple

import numpy as np

from fsedp.params import mesh_position

__all__ = [
    "tilings",
    "regions_of",
    "assign",
    "gather",
    "spread",
    "all_to_all_cycles",
    "plan",
    "Plan",
]


def tilings(rows: int, cols: int) -> list[tuple[int, int]]:
    """Region shapes ``(rh, rw)`` that tile a ``rows x cols`` mesh with regions of at least
    two chiplets, largest first; ``(rows, cols)`` (one region: nothing moves) is first."""
    out = [
        (rh, rw)
        for rh in range(1, rows + 1)
        for rw in range(1, cols + 1)
        if rows % rh == 0 and cols % rw == 0 and rh * rw >= 2
    ]
    return sorted(out, key=lambda s: (-s[0] * s[1], s))


def regions_of(rows: int, cols: int, shape: tuple[int, int]) -> list[list[int]]:
    """The chiplets of each region of the tiling ``shape``, regions in row-major order of
    their corners, chiplets ascending (the mesh's snake numbering)."""
    rh, rw = shape
    if rows % rh or cols % rw:
        raise ValueError(f"regions of {rh}x{rw} do not tile a {rows}x{cols} mesh")
    out: dict = {}
    for c in range(rows * cols):
        r, k = mesh_position(c, cols)
        out.setdefault((r // rh, k // rw), []).append(c)
    return [out[key] for key in sorted(out)]


def _min_in_degree(region: list[int], cols: int) -> int:
    """The fewest links inside the region that enter one of its chiplets."""
    pos = {mesh_position(c, cols) for c in region}
    return min(
        sum((r + dr, k + dk) in pos for dr, dk in ((-1, 0), (1, 0), (0, -1), (0, 1)))
        for r, k in pos
    )


def assign(held: np.ndarray, per: np.ndarray, dp, regions: list[list[int]]) -> np.ndarray:
    """The region of every active expert (``-1`` for the others): ``held[c, e]`` tokens on
    chiplet ``c`` routed to expert ``e``, ``per[e]`` its micro-slices.

    Largest expert first (by the larger of its load and compute time), each goes to the
    region whose larger of DDR and compute time grows least, ties to the region holding most
    of its tokens already (fewer moves); then, while it lowers the largest region's time,
    one expert moves out of the busiest region or two experts of it and another trade
    places (at most ``4 E`` improvements)."""
    g = len(regions)
    size = np.array([len(r) for r in regions], np.float64)
    tokens = held.sum(0)
    active = np.flatnonzero(tokens > 0)
    load = per * dp.ddr_interval  # one channel's time for the expert
    work = tokens * per * dp.cycles_per_token  # one chiplet's time for all its tokens
    inside = np.array([held[r].sum(0) for r in regions])  # [g, experts]
    home = np.full(held.shape[1], -1, np.int64)
    ddr = np.zeros(g)
    comp = np.zeros(g)
    for e in sorted(active, key=lambda e: (-max(load[e], work[e]), e)):
        cost = np.maximum(ddr + load[e] / size, comp + work[e] / size)
        best = min(range(g), key=lambda r: (round(cost[r]), -inside[r, e], r))
        home[e] = best
        ddr[best] += load[e] / size[best]
        comp[best] += work[e] / size[best]
    for _ in range(4 * len(active)):
        t = np.maximum(ddr, comp)
        hi = int(np.argmax(t))
        best = None  # (new max of the two regions, expert out, expert in or -1)
        for a in active[home[active] == hi]:
            for lo in range(g):
                if lo == hi:
                    continue
                for b in [-1, *active[home[active] == lo]]:
                    dl = load[a] - (load[b] if b >= 0 else 0)
                    dw = work[a] - (work[b] if b >= 0 else 0)
                    new = max(
                        ddr[hi] - dl / size[hi],
                        comp[hi] - dw / size[hi],
                        ddr[lo] + dl / size[lo],
                        comp[lo] + dw / size[lo],
                    )
                    if new < t[hi] - 0.5 and (best is None or new < best[0]):
                        best = (new, a, b, lo)
        if best is None:
            break
        _, a, b, lo = best
        dl = load[a] - (load[b] if b >= 0 else 0)
        dw = work[a] - (work[b] if b >= 0 else 0)
        ddr[hi] -= dl / size[hi]
        comp[hi] -= dw / size[hi]
        ddr[lo] += dl / size[lo]
        comp[lo] += dw / size[lo]
        home[a] = lo
        if b >= 0:
            home[b] = hi
    return home


def gather(records, home: np.ndarray, regions: list[list[int]], cols: int, per, dp):
    """The records with every token on a chiplet of its expert's region, and the moves
    ``[(from, to)]`` it takes.  Experts in the order of their first record; each one's tokens
    spread over its region as evenly as whole tokens allow, the larger shares to the
    chiplets holding most of its tokens already, then to the least loaded so far (the DDR
    and compute time of the experts placed before it; then the lowest-numbered); a token
    already in the region stays where its chiplet has room, the others go to the nearest
    chiplet with room (then the lowest-numbered).  Records keep their order."""
    by_expert: dict = {}
    for i, rec in enumerate(records):
        by_expert.setdefault(rec[2], []).append(i)
    pos = [mesh_position(c, cols) for c in range(max(max(r) for r in regions) + 1)]
    load = [0.0] * len(pos)
    out = list(records)
    moves = []
    for e, idx in by_expert.items():
        region = regions[home[e]]
        q, rest = divmod(len(idx), len(region))
        have = {c: 0 for c in region}
        for i in idx:
            if records[i][1] in have:
                have[records[i][1]] += 1
        order = sorted(region, key=lambda c: (-min(have[c], q + 1), load[c], c))
        room = {c: q + (k < rest) for k, c in enumerate(order)}
        on = [c for c in order if room[c]]
        for c in on:  # its share of the expert's loads (Rule 4 spreads them) and MACs
            load[c] += per[e] * (dp.ddr_interval / len(on) + room[c] * dp.cycles_per_token)
        _place(records, idx, room, pos, out, moves)
    return out, moves


def _place(records, idx, room: dict, pos, out: list, moves: list):
    """Place the records ``idx`` of one expert by the token count ``room[c]`` each chiplet
    takes: a token stays where its chiplet has room, the others go to the nearest chiplet
    with room (then the lowest-numbered), written into ``out`` and ``moves``."""
    away = []
    for i in idx:
        c = records[i][1]
        if room.get(c, 0) > 0:
            room[c] -= 1
        else:
            away.append(i)
    for i in away:
        r, c, e = records[i]
        a = pos[c]
        d = min(
            (d for d in room if room[d] > 0),
            key=lambda d: (abs(a[0] - pos[d][0]) + abs(a[1] - pos[d][1]), d),
        )
        room[d] -= 1
        out[i] = (r, d, e)
        moves.append((c, d))


def spread(records, chiplets: int, cols: int):
    """The records with every expert's tokens spread evenly over the chiplets that hold
    them (its trajectory is unchanged; every chiplet keeps its number of tokens where the
    counts allow), and the moves ``[(from, to)]`` it takes.  An expert with ``N`` tokens
    on ``k`` chiplets gives each ``N // k``; the remainders go one token at a time, the
    experts with the fewest chiplets first (then the larger, then the lower id), each to its
    chiplets with the most tokens still to place to keep their totals (then holding most of
    the expert's, then the lowest-numbered); tokens move as in :func:`gather`.  Records keep
    their order."""
    by_expert: dict = {}
    for i, rec in enumerate(records):
        by_expert.setdefault(rec[2], []).append(i)
    pos = [mesh_position(c, cols) for c in range(chiplets)]
    have: dict = {}
    for e, idx in by_expert.items():
        have[e] = {}
        for i in idx:
            c = records[i][1]
            have[e][c] = have[e].get(c, 0) + 1
    # what each chiplet still takes after every expert's even share
    short = [0] * chiplets
    for _, c, _ in records:
        short[c] += 1
    for e, idx in by_expert.items():
        for c in have[e]:
            short[c] -= len(idx) // len(have[e])
    out = list(records)
    moves = []
    for e in sorted(by_expert, key=lambda e: (len(have[e]), -len(by_expert[e]), e)):
        idx, h = by_expert[e], have[e]
        q, rest = divmod(len(idx), len(h))
        extra = sorted(h, key=lambda c: (-short[c], -h[c], c))[:rest]
        for c in extra:
            short[c] -= 1
        room = {c: q + (c in extra) for c in sorted(h)}
        _place(records, idx, room, pos, out, moves)
    return out, moves


def all_to_all_cycles(setup, moves) -> tuple[int, int]:
    """Cycles to send one activation per ``(from, to)`` move, and the bytes sent: the
    busiest chiplet's bytes out or in over its links at the link bandwidth, plus the
    longest move's hops at the link latency (EP's all-to-all, :mod:`fsedp.sim.baselines`)."""
    n, dp = setup.chiplets, setup.dp
    out_bytes = [0] * n
    in_bytes = [0] * n
    hops = total = 0
    for c, d in moves:
        if c == d:
            continue
        out_bytes[c] += setup.act_bytes
        in_bytes[d] += setup.act_bytes
        total += setup.act_bytes
        hops = max(hops, dp.distance(c, d))
    if not total:
        return 0, 0
    degree = [sum(dp.neighbour(c, k) is not None for k in range(4)) for c in range(n)]
    busiest = max(max(out_bytes[c], in_bytes[c]) / degree[c] for c in range(n))
    return math.ceil(busiest / setup.link_bytes_per_cycle) + hops * setup.link_latency_cycles, total


class Plan(NamedTuple):
    """A layer's gathering: the region shape, the experts' regions, the gathered records,
    the moves, the all-to-all cycles (each way) and the cost model's score of every tiling
    (``scores[shape] = (cycles, busiest link cycles)``)."""

    shape: tuple
    regions: list
    home: np.ndarray
    records: list
    moves: list
    a2a: int
    scores: dict


def _score(setup, held, per, shape):
    """``(regions, home, ddr, compute, link)``: the experts' regions of the tiling ``shape``
    and the largest over its regions of DDR time, compute time and busiest-link time."""
    dp = setup.dp
    regions = regions_of(dp.rows, dp.cols, shape)
    home = assign(held, per, dp, regions)
    tokens = held.sum(0)
    ddr = comp = link = 0.0
    for g, region in enumerate(regions):
        mine = home == g
        if not mine.any():
            continue
        size = len(region)
        slices = float(per[mine].sum())
        ddr = max(ddr, slices * dp.ddr_interval / size)
        comp = max(comp, float((tokens[mine] * per[mine]).sum()) * dp.cycles_per_token / size)
        if size > 1:
            degree = _min_in_degree(region, dp.cols)
            link = max(link, slices * (1 - 1 / size) / degree * dp.link_cycles)
    return regions, home, ddr, comp, link


#: The smallest region A8 gathers into: a ring of two chiplets leaves each with half of an
#: expert's tokens, so experts turn compute-heavy and wait on the hot window (measured on
#: the 8x8 mesh: Qwen3-30B-A3B at 256 tokens, 1x2 regions 1.24x the bound, 2x2 1.02x).
MIN_REGION = 4
#: A layer whose compute bound is at least this share of its DDR bound is *balanced*: every
#: unit must be busy all the time, and the drain of regions finishing apart costs more than
#: the rings' link stalls (4x4 mesh, 1024 tokens: regions 1.12-1.26x, one ring 1.07-1.23x).
BALANCED = 0.75


def plan(setup, records, per: np.ndarray, shape: tuple[int, int] | None = None) -> Plan:
    """The gathering of one layer: the given region ``shape``, or (``None``) the tiling the
    cost model chooses (module docstring): of the whole mesh and the tilings into regions
    of at least :data:`MIN_REGION` chiplets, the lowest score -- within 1 %, the least loaded
    busiest link -- but the whole mesh in a balanced layer (:data:`BALANCED`) whose busiest
    link is loaded no longer than its DDR and compute take.  The whole mesh of a balanced
    layer has its tokens spread evenly on every expert's ring (:func:`spread`)."""
    dp = setup.dp
    n = dp.chiplets
    experts = len(per)
    held = np.zeros((n, experts), np.int64)
    for _, c, e in records:
        held[c, e] += 1
    whole = (dp.rows, dp.cols)
    if shape is not None:
        shapes = [shape]
    else:
        shapes = [s for s in tilings(dp.rows, dp.cols) if s == whole or s[0] * s[1] >= MIN_REGION]
    scores = {}
    best = None
    for s in shapes:
        regions, home, ddr, comp, link = _score(setup, held, per, s)
        t = max(ddr, comp, link)
        if s == whole and comp >= BALANCED * ddr:
            moved, moves = spread(records, n, dp.cols)
            a2a = all_to_all_cycles(setup, moves)[0]
        elif s == whole:
            moved, moves, a2a = list(records), [], 0
        else:
            moved, moves = gather(records, home, regions, dp.cols, per, dp)
            a2a = all_to_all_cycles(setup, moves)[0]
        total = t + 2 * a2a
        scores[s] = (round(total), round(link))
        cand = (total, link, s, regions, home, moved, moves, a2a)
        if best is None or _better(cand, best):
            best = cand
        if s == whole and shape is None and comp >= BALANCED * ddr and link <= max(ddr, comp):
            break  # balanced, and one ring's links keep up
    total, link, s, regions, home, moved, moves, a2a = best
    return Plan(s, regions, home, moved, moves, a2a, scores)


def _better(a, b) -> bool:
    """``a`` before ``b``: lower score, unless within 1 % of each other, then the less
    loaded busiest link (then the lower score)."""
    if abs(a[0] - b[0]) <= 0.01 * max(a[0], b[0]):
        return (a[1], a[0]) < (b[1], b[0])
    return a[0] < b[0]
