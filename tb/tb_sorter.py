"""Bench of the sorter, the variant of ``p.sorter`` (one body: Amaranth's simulator and
cocotb, ``tb/bench.py``).

Key vectors with many ties and counts at the width limit, trajectory masks riding along, go
in on the ``i`` stream with random pauses (:class:`~fsedp.tb.bench.StreamDriver`) and come out
on ``o`` under random back-pressure (:class:`~fsedp.tb.bench.StreamMonitor`, which also checks
that a vector not taken stays); every output vector must equal the golden sort
(:func:`fsedp.sw.sorter.sort_keys`, equal to stepping the network) of the matching input, in
order.  Reports ``vectors``, the network's ``steps``, the measured ``latency`` (input
accepted -> output valid, the minimum: the others include back-pressure), ``latencies`` and
``stalled`` (output beats held by back-pressure).  Knobs: ``vectors``, ``stall`` (the pause
chance of both streams), ``seed``.
"""

import random

from amaranth.lib import data

from fsedp.hw.layouts import key_layout
from fsedp.hw.sorter import Sorter
from fsedp.sw.sorter import network, sort_keys
from fsedp.tb.bench import Bench, StreamDriver, StreamMonitor, cocotb_entry


def component(p):
    return Sorter(p)


async def bench(b: Bench, p, knobs: dict) -> dict:
    rng = random.Random(knobs.get("seed", 1))
    N = p.sorter_lanes
    vec = data.ArrayLayout(key_layout(p), N)
    stall = knobs.get("stall", 0.3)
    drv = StreamDriver(b, "i", rng, stall)
    mon = StreamMonitor(b, "o", rng, stall)
    total = knobs.get("vectors", 60)
    for i in range(total):
        hi = [1, 3, p.count_max][i % 3]  # many ties, and counts at the width limit
        ids = list(range(N))
        rng.shuffle(ids)
        keys = [(rng.randint(0, hi), ids[j], rng.getrandbits(p.chiplets)) for j in range(N)]
        drv.send(keys, vec.const([{"count": c, "id": e, "traj": t} for c, e, t in keys]))
    expected, t_in, t_out, got = [], [], {}, 0
    while got < total:
        mon.drive()  # i.ready follows o.ready: set it before the driver samples i.ready
        drv.drive()
        sent = await drv.sample()
        out = await mon.sample()
        if mon.pending is not None or out is not None:
            t_out.setdefault(got, b.cycle)
        if out is not None:
            o = vec.from_bits(out)
            keys = [(int(o[j].count), int(o[j].id), int(o[j].traj)) for j in range(N)]
            b.case = f"vector {got}"
            if got >= len(expected):
                b.fail("an output vector with no input vector")
            b.check(keys, expected[got], "sorted vector")
            got += 1
        if sent is not None:
            expected.append(sort_keys(sent, p.sorter))
            t_in.append(b.cycle)
        await b.tick()
    latencies = [t_out[i] - t_in[i] for i in range(got)]
    return {
        "vectors": got,
        "steps": len(network(N, p.sorter).steps),
        "latency": min(latencies),
        "latencies": latencies,
        "stalled": mon.stalled,
    }


sorter_vs_golden = cocotb_entry("sorter_vs_golden", component, bench)
