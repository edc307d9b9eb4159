"""cocotb testbench of the ICV: random allocation and (multi-completion) release masks every
cycle; the register must equal the golden ICV after every edge, and reset sets all ones."""

import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from fsedp.sw.icv import ICV
from fsedp.tb.streams import knobs, params, start, u, write_report


@cocotb.test()
async def icv_vs_golden(dut):
    p, k = params(), knobs()
    rng = random.Random(k.get("seed", 1))
    gold = ICV(p)
    await start(dut)
    full = (1 << p.chiplets) - 1
    cycles = k.get("cycles", 400)
    for cycle in range(cycles):
        if cycle == cycles // 2:  # reset in the middle
            dut.rst.value = 1
            await RisingEdge(dut.clk)
            dut.rst.value = 0
            gold.reset()
        alloc = rng.getrandbits(p.chiplets) if rng.random() < 0.4 else 0
        release = (
            rng.getrandbits(p.chiplets) & rng.getrandbits(p.chiplets) if rng.random() < 0.5 else 0
        )
        dut.alloc.value, dut.release.value = alloc, release
        await ReadOnly()
        assert u(dut.value) == gold.value, f"cycle {cycle}: {u(dut.value):b} != {gold.value:b}"
        await RisingEdge(dut.clk)
        gold.update(alloc=alloc, release=release)
    assert gold.value <= full
    write_report({"cycles": cycles})
