"""Fast tier, Amaranth's Python simulator: the scheduler's building pieces outside the block
benches (the priority-encoder tree, every sorter network variant) and the regression
harness's payload codecs.  The scheduler top runs its bench ``tb/tb_scheduler.py`` in
``tests/test_block_benches.py::test_scheduler`` (the same body as under cocotb)."""

import random

import pytest
from amaranth.sim import Simulator

from fsedp.hw.layouts import dispatch_from_bits, gate_bits, req_init_bits
from fsedp.params import SchedulerParams


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("highest", [False, True])
def test_priority_encoder_tree(width, highest):
    """``first_set`` (the scheduler's eligibility search) on every input of small widths:
    whether any bit is set, and the lowest (highest) set index, 0 when none."""
    from amaranth import Module, Signal

    from fsedp.hw.common import first_set

    m = Module()
    x, any_, index = Signal(width), Signal(), Signal(8)
    a, i = first_set([x[k] for k in range(width)], highest)
    m.d.comb += [any_.eq(a), index.eq(i)]
    seen = []

    async def bench(ctx):
        for v in range(1 << width):
            ctx.set(x, v)
            want = (v.bit_length() - 1 if highest else (v & -v).bit_length() - 1) if v else 0
            assert (ctx.get(any_), ctx.get(index)) == (int(v != 0), want), v
            seen.append(v)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert len(seen) == 1 << width


@pytest.mark.parametrize("kind", ["parallel", "stage", "shuffle", "shuffle2"])
@pytest.mark.parametrize("experts", [8, 12, 32])
def test_sorter_variants_match_golden(kind, experts):
    """Each sorter network in RTL == the golden model's step-by-step application of the same
    description (trajectories riding along), many ties, at the measured latency."""
    from amaranth.lib import data

    from fsedp.hw.layouts import key_layout
    from fsedp.hw.sorter import Sorter
    from fsedp.sw.sorter import network, sort_keys

    p = SchedulerParams(experts=experts, chiplets=5, count_width=3)
    dut = Sorter(p, kind)
    lanes = p.sorter_lanes
    vec = data.ArrayLayout(key_layout(p), lanes)
    rng = random.Random(experts)
    latencies = []

    async def bench(ctx):
        for _ in range(6):
            ids = list(range(lanes))
            rng.shuffle(ids)
            keys = [(rng.randint(0, 2), i, rng.getrandbits(5)) for i in ids]
            ctx.set(
                dut.i.payload.as_value(),
                vec.const([{"count": c, "id": i, "traj": t} for c, i, t in keys]).as_bits(),
            )
            ctx.set(dut.i.valid, 1)
            assert ctx.get(dut.i.ready)
            await ctx.tick()
            ctx.set(dut.i.valid, 0)
            cycles = 1
            while not ctx.get(dut.o.valid):
                await ctx.tick()
                cycles += 1
                assert cycles <= 200, "the sorter never finished"
            out = vec.from_bits(ctx.get(dut.o.payload.as_value()))
            got = [(int(x.count), int(x.id), int(x.traj)) for x in out]
            assert got == sort_keys(keys, kind)
            latencies.append(cycles)
            ctx.set(dut.o.ready, 1)
            await ctx.tick()
            ctx.set(dut.o.ready, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert latencies == [dut.latency] * 6 and dut.latency == network(lanes, kind).cycles


@pytest.mark.parametrize("experts,chiplets", [(16, 4), (128, 4), (64, 16), (8, 9)])
def test_fast_payload_codecs_equal_amaranth_layouts(experts, chiplets):
    """The regression harness packs gate/req_init beats and decodes dispatch beats with
    shifts (``hw.layouts._pack``, ``dispatch_decoder``); they equal the Amaranth layouts'
    ``const``/``from_bits`` over random field values."""
    from amaranth.lib import data

    from fsedp.hw.layouts import dispatch_decoder, dispatch_layout, gate_layout, req_init_layout

    p = SchedulerParams(experts=experts, chiplets=chiplets)
    rng = random.Random(experts * 100 + chiplets)
    decode = dispatch_decoder(p)
    width = data.Layout.cast(dispatch_layout(p)).size
    for _ in range(300):
        r, c, e = rng.randrange(p.requests), rng.randrange(p.chiplets), rng.randrange(experts)
        last, t = rng.randrange(2), rng.randrange(p.qos_max + 1)
        want = gate_layout(p).const({"request": r, "chiplet": c, "expert": e, "last": last})
        assert gate_bits(p, r, c, e, bool(last)) == want.as_bits()
        assert (
            req_init_bits(p, r, t) == req_init_layout(p).const({"request": r, "t_qos": t}).as_bits()
        )
        bits = rng.getrandbits(width) & ~1 if rng.random() < 0.5 else rng.getrandbits(width)
        v = dispatch_layout(p).from_bits(bits)  # Amaranth's own view of the beat
        want = (int(v.kind), int(v.expert), int(v.count), int(v.traj), int(v.entry))
        got = decode(bits)
        assert (got.kind, got.expert, got.count, got.traj, got.entry) == want
        assert got.next_hop == tuple(int(v.next_hop[c]) for c in range(p.chiplets))
        assert dispatch_from_bits(p, bits) == got
