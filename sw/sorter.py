"""Bitonic sorter golden model and the compare-exchange schedule shared with the RTL.

:func:`bitonic_schedule` is generated once and drives both :func:`bitonic_sort` (here) and
:class:`fsedp.hw.sorter.BitonicSorter` (one comparator per pair, one register per stage).

Order: descending token count; ties go to the lower expert id (ids are unique, so the order
is total and the result deterministic).  ``E`` that is not a power of two is padded with
lanes ``(count=0, id=E..N-1)``, which sort behind every real expert.
"""

from functools import cache

__all__ = ["bitonic_schedule", "stage_count", "winner_first", "bitonic_sort", "sorter_keys"]


@cache
def bitonic_schedule(lanes: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Stages of compare-exchange pairs ``(a, b)``: after the exchange lane ``a`` holds the
    element that comes first in the final order (the winner) and lane ``b`` the other one.

    ``lanes`` must be a power of two; there are ``log2(n)*(log2(n)+1)/2`` stages of ``n/2``
    pairs each.
    """
    if lanes < 1 or lanes & (lanes - 1):
        raise ValueError(f"bitonic sorter lanes must be a power of two, not {lanes}")
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


def winner_first(x: tuple[int, int], y: tuple[int, int]) -> bool:
    """True when key ``x = (count, id)`` goes before ``y``: higher count, then lower id."""
    return x[0] > y[0] or (x[0] == y[0] and x[1] < y[1])


def sorter_keys(counts, lanes: int) -> list[tuple[int, int]]:
    """Sorter input: lane ``i`` holds ``(counts[i], i)``; padding lanes hold ``(0, i)``."""
    return [(counts[i] if i < len(counts) else 0, i) for i in range(lanes)]


def bitonic_sort(keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Apply the shared schedule to ``keys`` exactly as the RTL network does."""
    lanes = list(keys)
    for stage in bitonic_schedule(len(lanes)):
        for a, b in stage:
            if not winner_first(lanes[a], lanes[b]):
                lanes[a], lanes[b] = lanes[b], lanes[a]
    return lanes
