"""cocotb testbench of the EIT: random gate records (some out of range, some hammering one
entry past the count width) interleaved with merge scans (random include masks, with and
without clear); every scan result and the sticky flags must equal the golden EIT."""

import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from fsedp.hw.layouts import record_layout
from fsedp.sw.eit import EIT, GateRecord
from fsedp.tb.streams import knobs, params, resolved, start, u, write_report


@cocotb.test()
async def eit_vs_golden(dut):
    p, k = params(), knobs()
    rng = random.Random(k.get("seed", 1))
    gold = EIT(p)
    lay = record_layout(p)
    lim = (1 << p.request_bits, 1 << p.chiplet_bits, 1 << p.expert_bits)
    await start(dut)
    for name in ("rec__valid", "scan_en", "scan_clear", "flags_clear"):
        getattr(dut, name).value = 0
    # clear every entry first (what the scheduler's CLEAR phase does after reset)
    for e in range(p.experts):
        dut.scan_en.value, dut.scan_addr.value, dut.scan_include.value, dut.scan_clear.value = (
            1,
            e,
            0,
            1,
        )
        await RisingEdge(dut.clk)
    dut.scan_en.value = 0
    dut.flags_clear.value = 1
    await RisingEdge(dut.clk)
    dut.flags_clear.value = 0
    await RisingEdge(dut.clk)
    pending, scans = None, 0
    hot = rng.randrange(p.experts)
    for cycle in range(k.get("cycles", 1500)):
        op = rng.random()
        rec = scan = None
        dut.rec__valid.value = dut.scan_en.value = dut.scan_clear.value = 0
        if op < 0.6:
            if rng.random() < 0.05:
                rec = tuple(rng.randrange(x) for x in lim)  # possibly out of range
            else:
                e = hot if rng.random() < 0.3 else rng.randrange(p.experts)
                rec = (rng.randrange(p.requests), rng.randrange(p.chiplets), e)
            dut.rec__valid.value = 1
            dut.rec__payload.value = lay.const(
                dict(zip(("request", "chiplet", "expert"), rec))
            ).as_bits()
        elif op < 0.85:
            scan = (rng.randrange(p.experts), rng.getrandbits(p.requests), int(rng.random() < 0.1))
            dut.scan_en.value, dut.scan_addr.value = 1, scan[0]
            dut.scan_include.value, dut.scan_clear.value = scan[1], scan[2]
        await ReadOnly()
        if pending is not None:
            assert u(dut.scan_valid) == 1
            got = (u(dut.scan_count), u(dut.scan_mask), u(dut.scan_present))
            assert got == pending, f"cycle {cycle}: scan {got} != {pending}"
            scans += 1
        elif resolved(dut.scan_valid):
            assert u(dut.scan_valid) == 0
        await RisingEdge(dut.clk)
        pending = None
        if rec is not None:
            gold.write(GateRecord(*rec))
        if scan is not None:
            s = gold.scan(scan[0], scan[1], bool(scan[2]))
            pending = (s.count, s.mask, s.present)
    dut.rec__valid.value = dut.scan_en.value = 0
    await RisingEdge(dut.clk)
    await ReadOnly()
    assert (u(dut.overflow), u(dut.bad_record)) == (int(gold.overflow), int(gold.bad_record))
    write_report({"scans": scans, "overflow": gold.overflow, "bad_record": gold.bad_record})
