"""cocotb testbench of the token-buffering unit (Algorithm 2): random admissions on the
``init`` stream and decision strobes with random present/cold-hit masks; the defer mask and
the request table (T_QoS, C_fw) must equal the golden model after every decision."""

import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from fsedp.hw.layouts import req_init_bits
from fsedp.sw.token_buffer import TokenBuffer
from fsedp.tb.streams import knobs, params, start, u, write_report


def table(dut, p, name, width):
    v = u(getattr(dut, name))
    return [v >> (r * width) & ((1 << width) - 1) for r in range(p.requests)]


@cocotb.test()
async def token_buffer_vs_golden(dut):
    p, k = params(), knobs()
    rng = random.Random(k.get("seed", 1))
    gold = TokenBuffer(p)
    await start(dut)
    decisions = defers = 0
    for cycle in range(k.get("cycles", 300)):
        decide = int(rng.random() < 0.5)
        init = int(rng.random() < 0.4)
        present, cold = rng.getrandbits(p.requests), rng.getrandbits(p.requests)
        r, t = rng.randrange(p.requests), rng.randrange(p.qos_max + 1)
        dut.decide.value, dut.present.value, dut.cold_hit.value = decide, present, cold
        dut.init__valid.value = init
        dut.init__payload.value = req_init_bits(p, r, t)
        await ReadOnly()
        assert u(dut.init__ready) == int(not decide)
        await RisingEdge(dut.clk)
        expected = None
        if decide:
            expected = gold.decide(present, cold)
            decisions += 1
            defers += bin(expected).count("1")
        elif init:
            gold.init_request(r, t)
        dut.decide.value, dut.init__valid.value = 0, 0
        await ReadOnly()
        if expected is not None:
            assert u(dut.defer) == expected, (
                f"cycle {cycle}: defer {u(dut.defer):b} != {expected:b}"
            )
        assert table(dut, p, "t_qos", p.qos_width) == gold.t_qos
        assert table(dut, p, "c_fw", p.cfw_width) == gold.c_fw
        await RisingEdge(dut.clk)
    write_report({"decisions": decisions, "defers": defers})
