"""cocotb testbench of the paired-load unit: for random sorted key vectors and every
position, the expert, count, cold flag and partner equal the golden paired order."""

import random

import cocotb
from amaranth.lib import data
from cocotb.triggers import ReadOnly, Timer

from fsedp.hw.layouts import key_layout
from fsedp.sw.pairing import is_cold, paired_index, partner
from fsedp.sw.sorter import bitonic_sort, sorter_keys
from fsedp.tb.streams import knobs, params, u, write_report


@cocotb.test()
async def pairing_vs_golden(dut):
    p, k = params(), knobs()
    rng = random.Random(k.get("seed", 1))
    vec = data.ArrayLayout(key_layout(p), p.sorter_lanes)
    checks = 0
    for _ in range(k.get("vectors", 12)):
        active = rng.randint(0, p.experts)
        counts = [0] * p.experts
        for e in rng.sample(range(p.experts), active):
            counts[e] = rng.randint(1, min(p.count_max, 2 * max(1, p.theta_min)))
        keys = bitonic_sort(sorter_keys(counts, p.sorter_lanes))
        n = sum(1 for c in counts if c)
        dut.keys.value = vec.const([{"count": c, "id": e} for c, e in keys]).as_bits()
        dut.n.value = n
        if not n:
            await Timer(1, unit="ns")
        for pos in range(n):
            dut.position.value = pos
            await Timer(1, unit="ns")  # purely combinational: no clock
            await ReadOnly()
            count, expert = keys[paired_index(pos, n)]
            assert (u(dut.expert), u(dut.count)) == (expert, count), f"position {pos} of {n}"
            assert u(dut.cold) == is_cold(count, p.theta_min)
            q = partner(pos, n)
            assert u(dut.partner_valid) == (q is not None)
            if q is not None:
                assert u(dut.partner) == q
            checks += 1
            await Timer(1, unit="ns")
    write_report({"checks": checks})
