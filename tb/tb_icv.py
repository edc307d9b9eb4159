"""Bench of the ICV (one body: Amaranth's simulator and cocotb, ``tb/bench.py``).

Random allocation and (multi-completion) release masks every cycle, with overlapping ones
(an allocation wins over a release of the same chiplet) and all-ones ones; the register must
equal the golden ICV after every edge, and a reset with updates pending sets it all ones.
The report counts ``cycles``, ``overlap``, ``all_ones`` and ``reset``.  Knobs: ``cycles``,
``reset_every``, ``seed``.
"""

import random
from collections import Counter

from fsedp.hw.icv import ICV
from fsedp.sw import icv as sw_icv
from fsedp.tb.bench import Bench, cocotb_entry


def component(p):
    return ICV(p)


async def bench(b: Bench, p, knobs: dict) -> dict:
    rng = random.Random(knobs.get("seed", 1))
    C = p.chiplets
    gold = sw_icv.ICV(p)
    full = (1 << C) - 1
    seen = Counter()
    cycles, reset_every = knobs.get("cycles", 1000), knobs.get("reset_every", 250)

    def masks():
        kind = rng.randrange(8)
        if kind == 0:  # released and allocated at once: the allocation wins
            alloc = rng.getrandbits(C) | 1 << rng.randrange(C)
            return alloc, alloc | rng.getrandbits(C)
        if kind == 1:
            return rng.choice([(full, 0), (0, full), (full, full), (0, 0)])
        alloc = rng.getrandbits(C) if rng.random() < 0.4 else 0
        release = rng.getrandbits(C) & rng.getrandbits(C) if rng.random() < 0.5 else 0
        return alloc, release

    b.check(await b.get("value"), gold.value, "value after reset")
    last = "reset"
    for cycle in range(cycles):
        if cycle % reset_every == reset_every - 1:  # reset, with updates pending
            b.set("alloc", rng.getrandbits(C))
            b.set("release", rng.getrandbits(C))
            await b.reset()
            gold.reset()
            seen["reset"] += 1
            last = "reset"
        alloc, release = masks()
        b.set("alloc", alloc)
        b.set("release", release)
        b.case = f"(last edge: {last}; now alloc {alloc:#x} release {release:#x})"
        b.check(await b.get("value"), gold.value, "value")
        await b.tick()
        last = f"from {gold.value:#x} with alloc {alloc:#x} release {release:#x}"
        gold.update(alloc=alloc, release=release)
        seen["cycles"] += 1
        seen["overlap"] += (alloc & release) != 0
        seen["all_ones"] += alloc == full or release == full
    b.check(await b.get("value"), gold.value, "value at the end")
    return dict(seen)


icv_vs_golden = cocotb_entry("icv_vs_golden", component, bench)
