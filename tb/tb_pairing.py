"""cocotb testbench of the pairing unit (paired order): for random sorted key vectors and
every sorted index, the split, the index's position in the order and its partner equal the
golden paired order (:func:`fsedp.sw.pairing.paired_index`, :func:`~fsedp.sw.pairing.partner`)."""

import random

import cocotb
from amaranth.lib import data
from cocotb.triggers import ReadOnly, Timer

from fsedp.hw.layouts import key_layout
from fsedp.sw.pairing import paired_index, partner
from fsedp.sw.sorter import sort_keys, sorter_keys
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
        keys = sort_keys(sorter_keys(counts, p.sorter_lanes), p.sorter)
        n = sum(1 for c in counts if c)
        position = {paired_index(pos, n): pos for pos in range(n)}
        dut.keys.value = vec.const([{"count": c, "id": e, "traj": 0} for c, e in keys]).as_bits()
        dut.n.value = n
        if not n:
            await Timer(1, unit="ns")
        for i in range(n):
            dut.index.value = dut.hot_index.value = dut.cold_index.value = i
            await Timer(1, unit="ns")  # purely combinational: no clock
            await ReadOnly()
            split = u(dut.split)
            assert split == (n + 1) // 2, f"split {split} for n = {n}"
            got = u(dut.hot_position) if i < split else u(dut.cold_position)
            assert got == position[i], f"index {i} of {n}: position {got} != {position[i]}"
            q = partner(position[i], n)
            assert u(dut.partner_valid) == (q is not None), f"index {i} of {n}"
            if q is not None:
                assert u(dut.partner) == paired_index(q, n), f"partner of index {i} of {n}"
            checks += 1
            await Timer(1, unit="ns")
    write_report({"checks": checks})
