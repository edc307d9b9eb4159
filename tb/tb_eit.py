"""cocotb testbench of the EIT: rounds of random gate records (``fsedp.tb.stimulus``, the
Amaranth tier's stimulus too: some out of range, some hammering one entry past the count
width) with random valid gaps; after each round the
merged registers, presence, cold hits and sticky flags must equal the golden EIT's scan over
every request, and after a deferral re-merge (random include mask, every word) its scan over
the included requests; then the table is cleared for the next round."""

import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from fsedp.hw.layouts import record_layout
from fsedp.sw.eit import EIT, GateRecord
from fsedp.tb.stimulus import eit_include, eit_records, pause
from fsedp.tb.streams import knobs, params, start, u, write_report


async def _settle(dut, cycles):
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    await ReadOnly()


def _merged(dut, p):
    """Per expert merged count and mask (the ports are packed arrays)."""
    counts, masks = u(dut.count), u(dut.mask)
    w, c = p.count_width, p.chiplets
    return (
        [(counts >> (e * w)) & ((1 << w) - 1) for e in range(p.experts)],
        [(masks >> (e * c)) & ((1 << c) - 1) for e in range(p.experts)],
    )


@cocotb.test()
async def eit_vs_golden(dut):
    p, k = params(), knobs()
    rng = random.Random(k.get("seed", 1))
    gold = EIT(p)
    lay = record_layout(p)
    words = -(-p.experts // p.eit_lanes)
    await start(dut)
    for name in ("rec__valid", "merge_en", "clear", "flags_clear"):
        getattr(dut, name).value = 0
    await RisingEdge(dut.clk)
    everyone = (1 << p.requests) - 1
    checks = merges = 0
    flagged = {"overflow": False, "bad_record": False}
    for rnd in range(k.get("rounds", 30)):
        recs = eit_records(p, rng, rnd)
        gold.reset()
        for i, rec in enumerate(recs):
            for _ in range(pause(rng)):
                # flags_clear is a one-cycle pulse with the round's first record: held over a
                # gap it would restart the flags again, dropping the first record's
                dut.rec__valid.value = dut.flags_clear.value = 0
                await RisingEdge(dut.clk)
            dut.rec__valid.value = 1
            dut.flags_clear.value = int(i == 0)
            dut.rec__payload.value = lay.const(
                dict(zip(("request", "chiplet", "expert"), rec))
            ).as_bits()
            gold.write(GateRecord(*rec))
            await RisingEdge(dut.clk)
        dut.rec__valid.value = dut.flags_clear.value = 0
        await _settle(dut, 3)  # merged registers after 2 edges, cold_hit after 3
        scans = [gold.scan(e, everyone) for e in range(p.experts)]
        counts, masks = _merged(dut, p)
        assert counts == [s.count for s in scans], f"round {rnd}: counts"
        assert masks == [s.mask for s in scans], f"round {rnd}: masks"
        present = cold_hit = 0
        for s in scans:
            present |= s.present
            if 0 < s.count < p.theta_min:
                cold_hit |= s.present
        assert (u(dut.present), u(dut.cold_hit)) == (present, cold_hit), f"round {rnd}"
        assert (u(dut.overflow), u(dut.bad_record)) == (gold.overflow, gold.bad_record)
        flagged["overflow"] |= gold.overflow
        flagged["bad_record"] |= gold.bad_record
        checks += 1
        await RisingEdge(dut.clk)
        include = eit_include(p, rng, rnd)
        if include is not None:  # a deferral round: merge again over the included requests
            for a in range(words):
                dut.merge_en.value, dut.merge_addr.value, dut.merge_include.value = 1, a, include
                await RisingEdge(dut.clk)
            dut.merge_en.value = 0
            await _settle(dut, 2)
            scans = [gold.scan(e, include) for e in range(p.experts)]
            counts, masks = _merged(dut, p)
            assert counts == [s.count for s in scans], f"round {rnd}: merged counts"
            assert masks == [s.mask for s in scans], f"round {rnd}: merged masks"
            merges += 1
            await RisingEdge(dut.clk)
        dut.clear.value = 1
        await RisingEdge(dut.clk)
        dut.clear.value = 0
        await _settle(dut, 2)
        assert u(dut.present) == 0 and not any(_merged(dut, p)[0]), f"round {rnd}: not cleared"
        await RisingEdge(dut.clk)
    write_report({"rounds": checks, "merges": merges, **flagged})
