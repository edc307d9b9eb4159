"""Bench of the EIT (one body: Amaranth's simulator and cocotb, ``tb/bench.py``).

Rounds of random gate records (:func:`fsedp.tb.stimulus.eit_records`: some out of range, some
hammering one entry past the count width) driven on ``rec`` with random pauses
(:class:`~fsedp.tb.bench.StreamDriver`); after each round the merged registers, presence,
cold hits and sticky flags must equal the golden EIT's scan over every request, and after a
deferral re-merge (:func:`~fsedp.tb.stimulus.eit_include`, every word) its scan over the
included requests; then the table is cleared for the next round.  The report counts what
was hit (``count_max``, ``overflow``, ``bad_record``, ``cold_hit``, ``merges``,
``saturated_merge``).  Knobs: ``rounds``, ``seed``.
"""

import random
from collections import Counter

from fsedp.hw.eit import EIT
from fsedp.sw import eit as sw_eit
from fsedp.tb.bench import Bench, StreamDriver, cocotb_entry, unpack
from fsedp.tb.stimulus import eit_include, eit_records


def component(p):
    return EIT(p)


async def bench(b: Bench, p, knobs: dict) -> dict:
    rng = random.Random(knobs.get("seed", 1))
    gold = sw_eit.EIT(p)
    words = b.component.words
    everyone = (1 << p.requests) - 1
    seen = Counter()
    rec = StreamDriver(b, "rec", rng)

    async def merged():
        return (
            unpack(await b.get("count"), p.count_width, p.experts),
            unpack(await b.get("mask"), p.chiplets, p.experts),
        )

    await b.tick()
    for rnd in range(knobs.get("rounds", 40)):
        recs = eit_records(p, rng, rnd)
        raw = Counter((r, e) for r, c, e in recs if gold.valid(sw_eit.GateRecord(r, c, e)))
        gold.reset()
        for i, r in enumerate(recs):
            rec.send((i, r), dict(zip(("request", "chiplet", "expert"), r)))
        while not rec.idle:
            item = await rec.cycle()  # rec is always ready: a beat offered is a transfer
            # flags_clear is a one-cycle pulse with the round's first record: held over a
            # gap it would restart the flags again, dropping the first record's
            b.set("flags_clear", item is not None and item[0] == 0)
            if item is not None:
                gold.write(sw_eit.GateRecord(*item[1]))
            await b.tick()
        b.set("rec.valid", 0)
        b.set("flags_clear", 0)
        await b.tick(3)  # merged registers after 2 edges, cold_hit after 3
        b.case = f"round {rnd} ({len(recs)} records)"
        scans = [gold.scan(e, everyone) for e in range(p.experts)]
        counts, masks = await merged()
        b.check(counts, [s.count for s in scans], "merged counts")
        b.check(masks, [s.mask for s in scans], "merged masks")
        present = cold_hit = 0
        for s in scans:
            present |= s.present
            if 0 < s.count < p.theta_min:
                cold_hit |= s.present
        b.check((await b.get("present"), await b.get("cold_hit")), (present, cold_hit), "present")
        b.check(
            (await b.get("overflow"), await b.get("bad_record")),
            (int(gold.overflow), int(gold.bad_record)),
            "overflow, bad_record",
        )
        seen["rounds"] += 1
        seen["count_max"] += p.count_max in counts
        seen["overflow"] += gold.overflow
        seen["bad_record"] += gold.bad_record
        seen["cold_hit"] += cold_hit != 0
        await b.tick()
        include = eit_include(p, rng, rnd)
        if include is not None:  # a deferral round: merge the included requests again
            for a in range(words):
                b.set("merge_en", 1)
                b.set("merge_addr", a)
                b.set("merge_include", include)
                await b.tick()
            b.set("merge_en", 0)
            await b.tick(2)
            b.case = f"round {rnd}, re-merge over {include:#x}"
            scans = [gold.scan(e, include) for e in range(p.experts)]
            counts, masks = await merged()
            b.check(counts, [s.count for s in scans], "re-merged counts")
            b.check(masks, [s.mask for s in scans], "re-merged masks")
            seen["merges"] += 1
            # a request's own count saturated (more records than count_max) and is re-read
            seen["saturated_merge"] += any(
                n > p.count_max and include >> r & 1 for (r, _), n in raw.items()
            )
            await b.tick()
        b.set("clear", 1)
        await b.tick()
        b.set("clear", 0)
        await b.tick(2)
        b.case = f"round {rnd}, cleared"
        b.check((await b.get("present"), await merged()), (0, ([0] * p.experts,) * 2), "clear")
        await b.tick()
    return dict(seen)


eit_vs_golden = cocotb_entry("eit_vs_golden", component, bench)
