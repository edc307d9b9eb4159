"""Paired-load order golden model (FSE-DP Section IV-A, Figure 5).

The sorted list holds ``n`` experts with a non-zero count (after token buffering) in
descending count order.  The paired-load order takes them from both ends alternately:

    position 0 -> sorted[0]      (hottest)
    position 1 -> sorted[n-1]    (coldest)
    position 2 -> sorted[1]
    position 3 -> sorted[n-2]    ...

so positions ``2i`` and ``2i+1`` form the pair ``(hot, cold)``; with odd ``n`` the middle
expert is alone at position ``n-1``.  A pair is *not* dispatched as one unit: the pair only
sets the priority and decides Rule 4 pre-loads (see ``docs/blocks/scheduler.md``).

``theta_min`` classifies an expert as cold when ``0 < count < theta_min`` (hot otherwise).
Token buffering applies the same test to the counts of pass 1, before deferral; the
classification of the sorted list (``PairingUnit.cold``) is an observation output only.
"""

__all__ = ["balanced_order", "paired_index", "partner", "paired_order", "is_cold"]


def paired_index(position: int, n: int) -> int:
    """Index into the sorted list of the expert at ``position`` of the paired order."""
    if not 0 <= position < n:
        raise ValueError(f"position {position} outside 0..{n - 1}")
    return position // 2 if position % 2 == 0 else n - 1 - position // 2


def partner(position: int, n: int) -> int | None:
    """Position of the other member of the pair, or ``None`` for the lone middle expert."""
    other = position ^ 1
    return other if other < n else None


def paired_order(sorted_keys, n: int) -> list:
    return [sorted_keys[paired_index(k, n)] for k in range(n)]


def balanced_order(experts, counts, balance: int) -> list[int]:
    """The balanced order (``SchedulerParams.balance``; decision 27 of the scheduler):
    ``experts`` sorted by descending token count are taken from both ends: the hottest
    while the running surplus ``sum(counts[e] - balance)`` of the experts taken so far is at
    most 0 (or no expert below ``balance`` is left), else the coldest -- so that the compute
    of a hot expert is overlapped by the loading of enough cold ones, not just of one
    partner.
    ``balance`` is the token count at which an expert's compute equals its DDR time
    (``ddr_interval / cycles_per_token`` with one channel per chiplet)."""
    order = []
    i, j, surplus = 0, len(experts) - 1, 0
    while i <= j:
        if surplus <= 0 or counts[experts[j]] >= balance:
            e, i = experts[i], i + 1
        else:
            e, j = experts[j], j - 1
        order.append(e)
        surplus += counts[e] - balance
    return order


def is_cold(count: int, theta_min: int) -> bool:
    return 0 < count < theta_min
