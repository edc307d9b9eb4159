"""Bench of the pairing unit (one body: Amaranth's simulator and cocotb, ``tb/bench.py``).

For sorted key vectors of none, one, all, all but one, then a random number of active
experts (counts around ``balance``, some at ``count_max``): the split, every sorted index's
position in the order, its partner and ``partner_valid`` (also past ``n``) equal the golden
paired order (:func:`fsedp.sw.pairing.paired_index`, :func:`~fsedp.sw.pairing.partner`) or,
with ``p.balance``, the balanced order (:func:`~fsedp.sw.pairing.balanced_order`), which the
unit builds in ``n`` cycles after ``start``.  Without ``balance`` the unit is combinational
and the bench never ticks.  The report counts ``checks``, ``hot``, ``cold``, ``odd`` and
``full``.  Knobs: ``vectors``, ``seed``.
"""

import random
from collections import Counter

from amaranth.lib import data

from fsedp.hw.layouts import key_layout
from fsedp.hw.pairing import PairingUnit
from fsedp.sw.pairing import balanced_order, paired_index, partner
from fsedp.sw.sorter import sort_keys, sorter_keys
from fsedp.tb.bench import Bench, cocotb_entry


def component(p):
    return PairingUnit(p)


def balanced_split(order: list[int], counts: list[int], balance: int) -> int:
    """Hot picks of :func:`balanced_order` over sorted indices ``0 .. n-1``: every index
    below the last pick is one, and the last pick (where both ends meet) is one when the
    golden rule takes the hot end there (surplus not positive or the count at least
    ``balance``)."""
    if not order:
        return 0
    last = order[-1]
    surplus = sum(counts[i] - balance for i in order[:-1])
    return last + (surplus <= 0 or counts[last] >= balance)


def pairing_counts(p, rng, v: int) -> list[int]:
    """Counts of the experts of vector ``v``: none, one, all, all but one, then a random
    number non-zero; around ``balance`` (or small), sometimes at ``count_max``."""
    active = [0, 1, p.experts, p.experts - 1][v] if v < 4 else rng.randint(0, p.experts)
    top = 2 * p.balance if p.balance else 2 * max(1, p.theta_min)
    counts = [0] * p.experts
    for e in rng.sample(range(p.experts), active):
        c = p.count_max if rng.random() < 0.1 else rng.randint(1, top)
        counts[e] = min(c, p.count_max)
    return counts


async def bench(b: Bench, p, knobs: dict) -> dict:
    rng = random.Random(knobs.get("seed", 1))
    vec = data.ArrayLayout(key_layout(p), p.sorter_lanes)
    seen = Counter()
    for v in range(knobs.get("vectors", 12 if p.experts > 64 else 60)):
        counts = pairing_counts(p, rng, v)
        keys = sort_keys(sorter_keys(counts, p.sorter_lanes), p.sorter)
        n = sum(1 for c in counts if c)
        sorted_counts = [c for c, _ in keys[:n]]
        if p.balance:
            order = balanced_order(list(range(n)), sorted_counts, p.balance)
            split = balanced_split(order, sorted_counts, p.balance)
        else:
            order = [paired_index(k, n) for k in range(n)]
            split = (n + 1) // 2
        position = {i: k for k, i in enumerate(order)}
        b.set("keys", vec.const([{"count": c, "id": e, "traj": 0} for c, e in keys]))
        b.set("n", n)
        b.case = f"vector {v}, n {n}, counts {sorted_counts[:16]}..."
        if p.balance:
            b.set("start", 1)
            await b.tick()
            b.set("start", 0)
            took = await b.until(lambda: b.get("built"), "built", p.experts + 2)
            b.check(took, n, "cycles to build the order")
        b.check(await b.get("split"), split, "split")
        for i in range(n + 1 if n < p.sorter_lanes else n):
            for port in ("index", "hot_index", "cold_index"):
                b.set(port, i)
            b.case = f"vector {v}, n {n}, index {i}, order {order[:16]}..."
            if i == n:  # past the list: no partner
                b.check(await b.get("partner_valid"), 0, "partner_valid past n")
                continue
            port = "hot_position" if i < split or p.balance else "cold_position"
            b.check(await b.get(port), position[i], "position")
            if p.balance:
                b.check(await b.get("cold_position"), position[i], "cold_position")
            q = partner(position[i], n)
            b.check(await b.get("partner_valid"), int(q is not None), "partner_valid")
            if q is not None:
                b.check(await b.get("partner"), order[q], "partner")
            seen["checks"] += 1
            seen["hot" if i < split else "cold"] += 1
        seen["odd"] += n % 2
        seen["full"] += n == p.experts
    if p.balance:
        await b.tick()
    return dict(seen)


pairing_vs_golden = cocotb_entry("pairing_vs_golden", component, bench)
