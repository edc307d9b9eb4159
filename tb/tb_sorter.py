"""cocotb testbench of the sorter (the variant of ``p.sorter``): every output vector == the
golden model's sort (:func:`fsedp.sw.sorter.sort_keys`, equal to stepping the network) of the
matching input vector, in order, trajectory masks riding along, under random valid
gaps and ready stalls; reports the measured latency in cycles (input accepted -> output
valid)."""

import random

import cocotb
from amaranth.lib import data
from cocotb.triggers import ReadOnly, RisingEdge

from fsedp.hw.layouts import key_layout
from fsedp.sw.sorter import network, sort_keys
from fsedp.tb.streams import knobs, params, start, u, write_report


@cocotb.test()
async def sorter_vs_golden(dut):
    p, k = params(), knobs()
    rng = random.Random(k.get("seed", 1))
    N = p.sorter_lanes
    vec = data.ArrayLayout(key_layout(p), N)
    vectors = []
    for i in range(k.get("vectors", 60)):
        hi = [1, 3, p.count_max][i % 3]  # many ties, and counts at the width limit
        ids = list(range(N))
        rng.shuffle(ids)
        vectors.append(
            [(rng.randint(0, hi), ids[j], rng.getrandbits(p.chiplets)) for j in range(N)]
        )
    await start(dut)
    stall = k.get("stall", 0.3)
    sent, expected, got, t_in, t_out = 0, [], 0, {}, {}
    now = 0
    while got < len(vectors):
        iv = int(sent < len(vectors) and rng.random() >= stall)
        if iv:
            dut.i__payload.value = vec.const(
                [{"count": c, "id": e, "traj": t} for c, e, t in vectors[sent]]
            ).as_bits()
        dut.i__valid.value = iv
        ready = int(rng.random() >= stall)
        dut.o__ready.value = ready
        await ReadOnly()
        took_in = iv and u(dut.i__ready)
        if u(dut.o__valid) and got not in t_out:
            t_out[got] = now
        if u(dut.o__valid) and ready:
            out = vec.from_bits(u(dut.o__payload))
            keys = [(int(out[j].count), int(out[j].id), int(out[j].traj)) for j in range(N)]
            assert keys == expected[got], f"vector {got}: {keys} != {expected[got]}"
            got += 1
        if took_in:
            expected.append(sort_keys(vectors[sent], p.sorter))
            t_in[sent] = now
            sent += 1
        await RisingEdge(dut.clk)
        now += 1
    latencies = [t_out[i] - t_in[i] for i in range(got)]
    # the minimum is the pipeline latency (the others include back-pressure)
    write_report(
        {
            "vectors": got,
            "steps": len(network(N, p.sorter).steps),
            "latency": min(latencies),
            "latencies": latencies,
        }
    )
