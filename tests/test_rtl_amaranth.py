"""Fast tier: the scheduler RTL in Amaranth's simulator against the golden model."""

import random

import pytest
from amaranth.sim import Simulator

from fsedp.hw.layouts import dispatch_from_bits, gate_bits, req_init_bits
from fsedp.hw.scheduler import Scheduler
from fsedp.params import SchedulerParams
from fsedp.tb.scoreboard import DatapathModel, RoundChecker, random_round

#: Cycles a round may take before the test fails instead of hanging (a round of the sizes
#: here takes at most a few hundred).
LIMIT = 20_000


def run_scheduler(
    p: SchedulerParams, rounds: int, seed: int, stall: float = 0.3, round_kwargs=None
):
    rng = random.Random(seed)
    dut = Scheduler(p)
    checker = RoundChecker(p)
    rounds_data = [random_round(p, rng, **(round_kwargs or {})) for _ in range(rounds)]

    async def bench(ctx):
        dp = DatapathModel(p.chiplets, rng)
        now = 0
        for rnd in rounds_data:
            start = now
            while not ctx.get(dut.idle):
                await ctx.tick()
                now += 1
                assert now - start < LIMIT, f"not idle {LIMIT} cycles after the last round"
            for r, t in rnd.req_inits:
                ctx.set(dut.req_init.valid, 1)
                ctx.set(dut.req_init.payload.as_value(), req_init_bits(p, r, t))
                await ctx.tick()
                now += 1
                checker.init_request(r, t)
            ctx.set(dut.req_init.valid, 0)
            for i, (r, c, e) in enumerate(rnd.records):
                while rng.random() < stall:
                    ctx.set(dut.gate.valid, 0)
                    await ctx.tick()
                    now += 1
                ctx.set(dut.gate.valid, 1)
                ctx.set(
                    dut.gate.payload.as_value(), gate_bits(p, r, c, e, i == len(rnd.records) - 1)
                )
                await ctx.tick()
                now += 1
            ctx.set(dut.gate.valid, 0)
            checker.start_round(rnd.records)
            done_mask = 0
            await ctx.tick()
            now += 1
            start = now
            while not ctx.get(dut.idle):
                assert now - start < LIMIT, (
                    f"round of {len(rnd.records)} records not over after {LIMIT} cycles: "
                    f"{checker.beats} beats, n_active {ctx.get(dut.n_active)}"
                )
                ready = rng.random() >= stall
                ctx.set(dut.dispatch.ready, ready)
                if not done_mask:
                    done_mask = dp.ready_mask(now)
                ctx.set(dut.done.valid, bool(done_mask))
                ctx.set(dut.done.payload, done_mask)
                if ready and ctx.get(dut.dispatch.valid):
                    d = dispatch_from_bits(p, ctx.get(dut.dispatch.payload.as_value()))
                    checker.on_dispatch(d)
                    if d.kind == 0:
                        dp.on_dispatch(d.entry, now)
                if done_mask and ctx.get(dut.done.ready):
                    checker.on_done(done_mask)
                    dp.on_done(done_mask)
                    done_mask = 0
                await ctx.tick()
                now += 1
            ctx.set(dut.done.valid, 0)
            checker.end_round(
                ctx.get(dut.deferred),
                ctx.get(dut.n_active),
                {
                    "overflow": ctx.get(dut.overflow),
                    "bad_record": ctx.get(dut.bad_record),
                    "spurious_done": ctx.get(dut.spurious_done),
                },
            )

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return checker


@pytest.mark.parametrize(
    "chiplets,experts,requests,a6",
    [
        (4, 8, 4, {}),
        (5, 12, 3, {}),
        (9, 16, 8, {}),
        # A6's scheduler generics: the balanced order and experts at once (decisions 27-28)
        (4, 8, 4, {"balance": 3, "entry_dispatch": True}),
        (5, 12, 3, {"balance": 2}),
        (9, 16, 8, {"entry_dispatch": True}),
        (4, 16, 4, {"balance": 40, "entry_dispatch": True}),
    ],
)
def test_scheduler_matches_golden(chiplets, experts, requests, a6):
    p = SchedulerParams(
        chiplets=chiplets,
        experts=experts,
        requests=requests,
        theta_min=3,
        n_threshold=2,
        qos_width=2,
        **a6,
    )
    checker = run_scheduler(p, rounds=6, seed=chiplets * 100 + experts)
    assert not checker.mismatches, "\n".join(map(str, checker.mismatches[:5]))
    assert checker.beats > 0


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


@pytest.mark.parametrize(
    "kw",
    [
        dict(chiplets=4, experts=8),
        dict(chiplets=5, experts=12, sorter="parallel"),
        dict(chiplets=4, experts=32, sorter="stage"),
        dict(chiplets=9, experts=16, sorter="shuffle"),
        dict(chiplets=4, experts=16, balance=3, entry_dispatch=True),
    ],
    ids=["shuffle2-8", "parallel-12", "stage-32", "shuffle-16", "balance-16"],
)
def test_scheduler_latency_is_measured(kw):
    """``Scheduler.latency``: the ``last`` gate record of a round transferred in cycle 0,
    the first ``dispatch.valid`` comes in cycle ``latency`` (``+ n + 2`` with ``balance``:
    ``ORDER0``, then ``n`` positions built one per cycle, then ``ORDER`` sees ``built``),
    round after round; nothing is
    deferred (``theta_min = 0``: no expert is cold)."""
    p = SchedulerParams(requests=2, theta_min=0, n_threshold=2, qos_width=2, **kw)
    dut = Scheduler(p)
    rng = random.Random(p.experts)
    seen, want = [], []

    async def bench(ctx):
        ctx.set(dut.dispatch.ready, 1)
        for _ in range(3):
            records = [
                (rng.randrange(p.requests), rng.randrange(p.chiplets), rng.randrange(p.experts))
                for _ in range(rng.randint(1, 6))
            ]
            for i, (r, c, e) in enumerate(records):
                assert ctx.get(dut.gate.ready)
                ctx.set(dut.gate.valid, 1)
                ctx.set(dut.gate.payload.as_value(), gate_bits(p, r, c, e, i == len(records) - 1))
                await ctx.tick()  # the last record's transfer is cycle 0
            ctx.set(dut.gate.valid, 0)
            cycles = 1
            while not ctx.get(dut.dispatch.valid):
                await ctx.tick()
                cycles += 1
                assert cycles < 500, "no dispatch"
            assert ctx.get(dut.deferred) == 0
            n = ctx.get(dut.n_active)
            seen.append(cycles)
            want.append(dut.latency + (n + 2 if p.balance else 0))
            # completions for every dispatch until the round is over
            ctx.set(dut.done.valid, 1)
            ctx.set(dut.done.payload, (1 << p.chiplets) - 1)
            for _ in range(LIMIT):
                if ctx.get(dut.idle):
                    break
                await ctx.tick()
            ctx.set(dut.done.valid, 0)
            assert ctx.get(dut.idle), "round not over"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen == want


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
