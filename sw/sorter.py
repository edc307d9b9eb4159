"""Sorting networks of the scheduler's sorter, described once and applied by the golden
model (here) and by every RTL variant (:mod:`fsedp.hw.sorter`).

A network is a sequence of *steps*.  A step optionally applies the perfect shuffle to the
lanes (the element at lane ``i`` moves to lane ``rotl(i)``, the lane index rotated left by
one bit), then applies compare-exchange pairs ``(a, b)``: after the exchange lane ``a`` holds
the element that comes first in the final order (the winner) and lane ``b`` the other one.

Variants (:data:`SORTERS`, the generic ``SchedulerParams.sorter``):

``parallel``
    The bitonic network, every stage in hardware with a register after each
    (``log2(N)(log2(N)+1)/2`` stages, one vector per cycle; the first generation).
``stage``
    The same stages executed one per cycle by a single reused stage.
``shuffle`` / ``shuffle2``
    The bitonic sort on a shuffle-exchange network (Stone, 1971): every step is a perfect
    shuffle followed by compare-exchanges between lanes ``2q`` and ``2q + 1`` only, so the
    hardware is ``N/2`` fixed comparators; one or two steps per cycle.  The input is taken
    as if ``log2(N) - 1`` shuffles had already been applied (the input order is arbitrary,
    so those steps are dropped): ``log2(N)^2 - log2(N) + 1`` steps, with shuffle-only steps
    put in front up to a multiple of the steps per cycle (every step of the hardware
    shuffles).

Order: descending token count; ties go to the lower expert id (ids are unique, so the order
is total and every variant gives the same result).  ``E`` that is not a power of two is
padded with lanes ``(count=0, id=E..N-1)``, which sort behind every real expert.
"""

from dataclasses import dataclass
from functools import cache

from fsedp.fields import specs
from fsedp.params import SchedulerParams

__all__ = [
    "SORTERS",
    "Step",
    "Network",
    "network",
    "bitonic_schedule",
    "stage_count",
    "winner_first",
    "apply_network",
    "sort_keys",
    "bitonic_sort",
    "sorter_keys",
    "shuffle_lane",
]

#: Sorter variants and the network steps each executes per clock cycle (``parallel`` is
#: pipelined: one step per register stage, a new vector every cycle).
SORTERS = {"parallel": 1, "stage": 1, "shuffle": 1, "shuffle2": 2}
assert tuple(SORTERS) == specs(SchedulerParams)["sorter"].choices


@dataclass(frozen=True)
class Step:
    shuffle: bool
    pairs: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Network:
    kind: str
    lanes: int
    steps: tuple[Step, ...]

    @property
    def per_cycle(self) -> int:
        """Steps per clock cycle."""
        return SORTERS[self.kind]

    @property
    def cycles(self) -> int:
        """Clock cycles from the input vector to the sorted one."""
        return -(-len(self.steps) // self.per_cycle)


def _check_lanes(lanes: int):
    if lanes < 1 or lanes & (lanes - 1):
        raise ValueError(f"sorter lanes must be a power of two, not {lanes}")


@cache
def bitonic_schedule(lanes: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Stages of compare-exchange pairs of the bitonic sorter: ``log2(n)*(log2(n)+1)/2``
    stages of ``n/2`` pairs each."""
    _check_lanes(lanes)
    stages = []
    k = 2
    while k <= lanes:
        j = k // 2
        while j >= 1:
            stage = []
            for i in range(lanes):
                partner = i ^ j
                if partner > i:
                    stage.append((i, partner) if i & k == 0 else (partner, i))
            stages.append(tuple(stage))
            j //= 2
        k *= 2
    return tuple(stages)


def stage_count(lanes: int) -> int:
    m = lanes.bit_length() - 1
    return m * (m + 1) // 2


def shuffle_lane(i: int, bits: int) -> int:
    """Lane that the perfect shuffle moves lane ``i`` to: ``i`` rotated left by one bit."""
    if bits == 0:
        return i
    return ((i << 1) | (i >> (bits - 1))) & ((1 << bits) - 1)


def _shuffle_exchange(lanes: int, per_cycle: int) -> tuple[Step, ...]:
    """The bitonic stages mapped onto the shuffle-exchange network.  After ``t`` shuffles
    logical lane ``x`` sits at physical lane ``rotl^t(x)``; the stage on logical bit ``b``
    needs ``t = -b (mod m)`` so that bit ``b`` is the physical bit 0."""
    m = lanes.bit_length() - 1
    if m == 0:
        return ()

    def physical(x, t):
        for _ in range(t % m):
            x = shuffle_lane(x, m)
        return x

    # the input counts as shuffled m - 1 - pad times: the loop below puts pad shuffle-only
    # steps first
    pad = -(m * m - m + 1) % per_cycle
    steps = []
    t = m - 1 - pad
    for stage in bitonic_schedule(lanes):
        a0, b0 = stage[0]
        b = (a0 ^ b0).bit_length() - 1
        while (t + 1) % m != (-b) % m:
            steps.append(Step(True, ()))
            t += 1
        t += 1
        pairs = []
        for a, b_ in stage:
            pa, pb = physical(a, t), physical(b_, t)
            assert pa ^ pb == 1, (pa, pb)
            pairs.append((pa, pb))
        steps.append(Step(True, tuple(sorted(pairs, key=lambda ab: min(ab)))))
    assert t % m == 0  # physical order == logical order at the end
    return tuple(steps)


@cache
def network(lanes: int, kind: str = "parallel") -> Network:
    """The sorting network of variant ``kind`` over ``lanes`` lanes (a power of two)."""
    _check_lanes(lanes)
    if kind not in SORTERS:
        raise ValueError(f"sorter must be one of {', '.join(SORTERS)}, not {kind!r}")
    if kind.startswith("shuffle"):
        steps = _shuffle_exchange(lanes, SORTERS[kind])
    else:
        steps = tuple(Step(False, stage) for stage in bitonic_schedule(lanes))
    return Network(kind, lanes, steps)


def winner_first(x, y) -> bool:
    """True when key ``x = (count, id, ...)`` goes before ``y``: higher count, then lower id."""
    return x[0] > y[0] or (x[0] == y[0] and x[1] < y[1])


def sorter_keys(counts, lanes: int) -> list[tuple[int, int]]:
    """Sorter input: lane ``i`` holds ``(counts[i], i)``; padding lanes hold ``(0, i)``."""
    return [(counts[i] if i < len(counts) else 0, i) for i in range(lanes)]


def apply_network(keys: list, net: Network) -> list:
    """Apply ``net`` step by step to ``keys`` exactly as the RTL does.  Keys are tuples
    ``(count, id, ...)``; fields after the id ride along (the RTL's trajectory mask)."""
    lanes = list(keys)
    if len(lanes) != net.lanes:
        raise ValueError(f"{len(lanes)} keys for a {net.lanes}-lane sorter")
    m = net.lanes.bit_length() - 1
    for step in net.steps:
        if step.shuffle:
            moved = [None] * len(lanes)
            for i, x in enumerate(lanes):
                moved[shuffle_lane(i, m)] = x
            lanes = moved
        for a, b in step.pairs:
            if not winner_first(lanes[a], lanes[b]):
                lanes[a], lanes[b] = lanes[b], lanes[a]
    return lanes


def sort_keys(keys: list, kind: str = "parallel") -> list:
    """Sort ``keys`` (a power-of-two number of lanes) as variant ``kind``'s network does.

    Every network sorts (higher count first, ties by lower id; ``tests/test_golden.py``
    shows :func:`apply_network` equal to this over every variant and lane count, and
    ``fsedp rtl formal`` proves the RTL sorts), so the result is computed with Python's sort
    -- 50x faster than stepping the network, and independent of the network the RTL is
    built from.  Ids are unique, so the order is total."""
    network(len(keys), kind)  # the same checks of lanes and variant (cached)
    return sorted(keys, key=_rank)


def _rank(x):
    return -x[0], x[1]


def bitonic_sort(keys: list) -> list:
    """The first generation's network (``parallel``): kept for the tests that name it."""
    return apply_network(keys, network(len(keys), "parallel"))
