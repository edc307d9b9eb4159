"""Fast tier: the chiplet-array RTL in Amaranth's simulator, cycle by cycle against the
streaming golden model, with random link/DDR stalls and layers from the scheduler model."""

import dataclasses
import random

import pytest
from amaranth.sim import Simulator

from fsedp.hw.chiplet_array import ChipletArray
from fsedp.hw.layouts import (
    dispatch_bits,
    slices_bits,
    tokens_bits,
    unpack_events,
    unpack_occupancy,
)
from fsedp.params import DatapathParams, SchedulerParams
from fsedp.sw.scheduler import DISPATCH, Dispatch
from fsedp.sw.streaming import StreamingArray
from fsedp.tb.datapath_scoreboard import LayerDriver, compare, stall_bits
from fsedp.tb.scoreboard import random_round


def drive(ctx, dut, p: DatapathParams, inp):
    """Present one cycle's :class:`StepIn` on the array's ports."""
    ctx.set(dut.stall.as_value(), stall_bits(inp))
    ctx.set(dut.ddr_stall, inp.ddr_stall)
    ctx.set(dut.done.ready, inp.done_ready)
    ctx.set(dut.dispatch.valid, inp.dispatch is not None)
    if inp.dispatch is not None:
        ctx.set(dut.dispatch.payload.as_value(), dispatch_bits(p, inp.dispatch))
    ctx.set(dut.tokens.valid, inp.tokens is not None)
    if inp.tokens is not None:
        ctx.set(dut.tokens.payload.as_value(), tokens_bits(p, *inp.tokens))
    if p.slice_table:
        ctx.set(dut.slices.valid, inp.slices is not None)
        if inp.slices is not None:
            ctx.set(dut.slices.payload.as_value(), slices_bits(p, *inp.slices))


def sample(ctx, dut, p: DatapathParams) -> tuple:
    """The array's outputs of this cycle: ``(dispatch ready, done, events, occupancy)``."""
    ready = bool(ctx.get(dut.dispatch.ready))
    done = ctx.get(dut.done.payload) if ctx.get(dut.done.valid) else 0
    events = unpack_events(p, ctx.get(dut.events))
    return ready, done, events, unpack_occupancy(p, ctx.get(dut.occupancy))


def run_array(
    sp: SchedulerParams,
    p: DatapathParams,
    layers: int,
    seed: int,
    stall: float = 0.25,
    max_cycles: int = 20000,
    rounds: list | None = None,
    gap: float = 0.2,
    done_stall: float = 0.2,
    timed: bool = False,
):
    """``layers`` layers (random rounds, or ``rounds``: ``(records, req_inits)`` pairs)
    through the RTL and the golden model in lockstep (``timed``: beats and completions in the
    scheduler RTL's cycles, as the simulator presents them).  Per layer the result has the cycle
    of its first dispatch beat, the cycle at which it ended (the array idle, nothing left to
    present), the beats and the completion masks."""
    rng = random.Random(seed)
    dut = ChipletArray(p)
    model = StreamingArray(p)
    drv = LayerDriver(sp, p, rng, stall=stall, gap=gap, done_stall=done_stall, timed=timed)
    result = {"diffs": [], "cycles": 0, "layers": 0, "preemptions": 0, "remote": 0}
    result.update(first_beat=[], end=[], beats=[], script=[])

    async def bench(ctx):
        cycle = 0
        for i in range(layers):
            if rounds is None:
                rnd = random_round(sp, rng)
                drv.start_layer(rnd.records, rnd.req_inits)
            else:
                drv.start_layer(*rounds[i])
            start, first = cycle, None
            while not (drv.layer_done and ctx.get(dut.idle)):
                inp = drv.inputs()
                drive(ctx, dut, p, inp)
                ready, done, events, occ = sample(ctx, dut, p)
                waiting = [[s.rem for s in ch.slots] for ch in model.chips]
                ref = model.step(inp)
                result["remote"] += sum(h.dest != t for t, _, h, _ in ref.ddr_issues)
                result["preemptions"] += sum(
                    s.rem > 0 and s.rem != before[i]
                    for ch, before in zip(model.chips, waiting)
                    for i, s in enumerate(ch.slots)
                )
                result["diffs"] += compare(cycle, ref, ready, done, events, occ)
                if result["diffs"]:
                    return
                if inp.dispatch is not None and ready:
                    first = cycle if first is None else first
                    b = inp.dispatch
                    result["beats"].append([b.kind, b.expert, b.entry, b.traj])
                if done and inp.done_ready:
                    result["script"].append(done)
                drv.outputs(cycle, ready, done, events, occ)
                await ctx.tick()
                cycle += 1
                assert cycle - start < max_cycles, f"layer stuck after {max_cycles} cycles"
            drv.check.end_layer(unpack_occupancy(p, ctx.get(dut.occupancy)))
            result["first_beat"].append(first)
            result["end"].append(cycle)
            result["layers"] += 1
        result["cycles"] = cycle
        result["flags"] = (ctx.get(dut.bad_dispatch), ctx.get(dut.orphan))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    result["peak"] = drv.check.peak
    result["computed"] = drv.check.computed
    return result


SP4 = SchedulerParams(
    chiplets=4, experts=8, count_width=4, requests=4, theta_min=2, n_threshold=2, qos_width=2
)


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(link_cycles=1, ddr_interval=1, ddr_latency=1, slots=4, preload_entries=0),
        dict(
            link_cycles=3,
            ddr_interval=3,
            ddr_latency=12,
            slots=7,
            preload_entries=2,
            rule5=True,
            micro_slices=3,
            cycles_per_token=2,
        ),
        # [D12] every expert with a token is compute-heavy: one micro-slice ahead at most
        dict(hot_window=1, cycles_per_token=3, ddr_interval=2, ddr_latency=5, slots=6),
        # heavy only from 3 tokens on a chiplet
        dict(hot_window=2, cycles_per_token=2, ddr_interval=5, rule5=True, micro_slices=5),
        # [D11] a shorter micro-slice preempts a long computation
        dict(preempt=True, cycles_per_token=3, ddr_interval=2, ddr_latency=3),
        # every A6 rule at once, slots at the minimum
        dict(preempt=True, hot_window=2, cycles_per_token=2, link_cycles=1, slots=4),
        # [D10] a DDR channel per chiplet: chiplet-driven Rule 4, local and remote loads
        dict(ddr_channels=4, slots=6, micro_slices=8, ddr_interval=4, ddr_latency=6, link_cycles=1),
        dict(
            ddr_channels=4,
            link_cycles=1,
            ddr_interval=1,
            ddr_latency=1,
            slots=4,
            preload_entries=0,
        ),
        dict(ddr_channels=4, rule5=True, ddr_interval=2, ddr_latency=5, slots=6),
        dict(ddr_channels=4, preempt=True, hot_window=2, cycles_per_token=2, ddr_interval=3),
        # [D13] a micro-slice count per expert and layer (sub-expert streaming)
        dict(slice_table=True, micro_slices=6, ddr_interval=1, ddr_latency=3),
        dict(slice_table=True, micro_slices=5, rule5=True, preload_entries=2, link_cycles=1),
        dict(slice_table=True, ddr_channels=4, micro_slices=8, ddr_interval=3, ddr_latency=5),
        dict(slice_table=True, ddr_channels=4, micro_slices=4, hot_window=1, cycles_per_token=3),
        # [D16] forward-state admission: one channel, Rule 5 with pre-loads, a channel per
        # chiplet (remote loads), with A6's rules, slots at the minimum
        dict(admission="forward-state", link_cycles=1, ddr_interval=1, ddr_latency=1, slots=4),
        dict(admission="forward-state", rule5=True, preload_entries=2, slots=7, ddr_latency=9),
        dict(admission="forward-state", ddr_channels=4, slots=5, micro_slices=8, link_cycles=1),
        dict(
            admission="forward-state",
            ddr_channels=4,
            preempt=True,
            hot_window=2,
            cycles_per_token=2,
            ddr_interval=3,
        ),
        # partner pre-loads un-held while the top rung binds: with [D20]'s spare rung the
        # minimum slots no longer reach it (mutant state-unhold-keeps-claim-rtl survived them)
        dict(
            admission="forward-state",
            preload_entries=4,
            slots=8,
            ddr_latency=2,
            link_cycles=1,
            ddr_interval=1,
        ),
    ],
    ids=[
        "default",
        "fast-min-slots",
        "slow-rule5-preload",
        "hot-window-1",
        "hot-window-2-rule5",
        "preempt",
        "a6-min-slots",
        "ch4",
        "ch4-fast-min-slots",
        "ch4-rule5",
        "ch4-a6",
        "slices",
        "slices-rule5",
        "ch4-slices",
        "ch4-slices-hot",
        "state-fast-min-slots",
        "state-rule5-preload",
        "state-ch4",
        "state-ch4-a6",
        "state-preload4",
    ],
)
def test_array_2x2_matches_golden(kw):
    p = DatapathParams.for_scheduler(SP4, 2, 2, **kw)
    layers = 6 if p.ddr_channels > 1 else 4
    res = run_array(SP4, p, layers=layers, seed=11)
    assert not res["diffs"], "\n".join(res["diffs"][:5])
    assert res["layers"] == layers and res["computed"] > 0
    assert res["flags"] == (0, 0)
    assert (res["preemptions"] > 0) == p.preempt
    # remote loads exist exactly with a channel per chiplet under Rule 4
    assert (res["remote"] > 0) == (p.ddr_channels > 1 and not p.rule5)


SP8 = dataclasses.replace(SP4, chiplets=8, mesh_cols=2, ring_path="cycle")


@pytest.mark.parametrize(
    "kw",
    [
        dict(slots=8),
        dict(admission="forward-state", ddr_channels=8, slots=8, link_cycles=1, ddr_interval=1),
        dict(ddr_channels=8, slots=9, preempt=True, hot_window=2, cycles_per_token=2),
    ],
    ids=["count", "state-ch8", "ch8-a6"],
)
def test_array_cycle_path_matches_golden(kw):
    """The ``cycle`` ring path ([D17]) in RTL: on a 4x2 mesh its ring (0, 1, 2, 5, 6, 7, 4, 3
    in snake numbers) is not the snake's, so every station, DDR target and admission path of
    the datapath and the scheduler's next-hop tables follow the other sequence; lockstep
    with the golden model, 0 differences."""
    p = DatapathParams.for_scheduler(SP8, 4, 2, ring_path="cycle", **kw)
    assert p.ring_table(0)[0] == SP8.ring_table(0)[0] == (0, 1, 2, 5, 6, 7, 4, 3)
    res = run_array(SP8, p, layers=3, seed=5)
    assert not res["diffs"], "\n".join(res["diffs"][:5])
    assert res["layers"] == 3 and res["computed"] > 0 and res["flags"] == (0, 0)


def rtl_one_expert_cycles(p: DatapathParams, tokens, limit: int = 20_000) -> int:
    """``fsedp.experiments.datapath_report.one_expert_cycles`` measured on the RTL;
    ``tokens`` is a count for every chiplet or a list, one per chiplet."""
    from fsedp.experiments.datapath_report import full_ring_dispatch

    dut = ChipletArray(p)
    n = p.chiplets
    per = tokens if isinstance(tokens, list) else [tokens] * n
    out = {}

    async def bench(ctx):
        for c in range(n):
            ctx.set(dut.tokens.valid, 1)
            ctx.set(dut.tokens.payload.as_value(), tokens_bits(p, c, 0, per[c]))
            await ctx.tick()
        ctx.set(dut.tokens.valid, 0)
        beat = full_ring_dispatch(n, max(per))
        ctx.set(dut.dispatch.valid, 1)
        ctx.set(dut.dispatch.payload.as_value(), dispatch_bits(p, beat))
        ctx.set(dut.done.ready, 1)
        await ctx.tick()
        ctx.set(dut.dispatch.valid, 0)
        cycles = 1
        while not ctx.get(dut.done.valid):
            await ctx.tick()
            cycles += 1
            if cycles > limit:
                raise AssertionError(
                    f"no done after {limit} cycles: idle={ctx.get(dut.idle)} "
                    f"occupancy={ctx.get(dut.occupancy)} tokens={per}"
                )
        out["cycles"] = cycles + 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out["cycles"]


@pytest.mark.parametrize("slots,tokens,link", [(4, 1, 4), (6, 1, 4), (6, 8, 8)])
def test_ring_streaming_time_rtl_equals_golden(slots, tokens, link):
    from fsedp.experiments.datapath_report import one_expert_cycles

    p = DatapathParams(
        rows=2,
        cols=2,
        slots=slots,
        micro_slices=16,
        link_cycles=link,
        ddr_interval=1,
        ddr_latency=4,
    )
    assert rtl_one_expert_cycles(p, tokens) == one_expert_cycles(p, tokens)


def test_ring_chiplet_without_tokens_computes_one_cycle():
    """A trajectory chiplet with no tokens of the expert still passes each micro-slice
    through its PE for one cycle (``max(1, tokens) x cycles_per_token``, [D] of the compute
    unit): RTL equals golden, and both equal the run where that chiplet has one token."""
    from fsedp.experiments.datapath_report import one_expert_cycles

    p = DatapathParams(
        rows=2, cols=2, slots=6, micro_slices=6, link_cycles=1, ddr_interval=1, ddr_latency=2,
        cycles_per_token=3,
    )  # fmt: skip

    zero, one = [4, 0, 4, 4], [4, 1, 4, 4]
    assert rtl_one_expert_cycles(p, zero) == one_expert_cycles(p, zero) == one_expert_cycles(p, one)


@pytest.mark.parametrize("variant", ["A3", pytest.param("A4", marks=pytest.mark.slow), "A6"])
def test_simulator_layer_replays_on_rtl(variant):
    """A layer of the simulator's default chip (2x2, a DDR channel per chiplet, remote
    loads) on real routing (the embedded trace of our MoE LM) through the datapath RTL: the
    same beats, completions and cycles as :func:`fsedp.sim.fsedp.fsedp_layer` reports."""
    from fsedp.config import SYNTHETIC_ONLY, config_to_dict, default_run, run_from_dict
    from fsedp.sim.fsedp import fsedp_layer, make_scheduler, variant_params
    from fsedp.sim.setup import make_setup
    from fsedp.workload import iterations

    d = config_to_dict(default_run())
    d["model"] = dict(
        name="tiny", d_model=128, d_ffn=128, experts=16, top_k=2, shared_experts=0,
        layers=4, heads=4, params_b=0.1,
    )  # fmt: skip
    d["hardware"]["onchip_buffer_kib"] = 48  # 8 slots of a 2x2 mesh
    del d["scheduler"]["count_width"]
    d["scenario"].update(tokens_per_iteration=32, trace="model")
    for key in SYNTHETIC_ONLY:  # the synthetic generator's keys do not apply to a trace
        del d["scenario"][key]
    setup = make_setup(run_from_dict(d, "<replay>"))
    layer = iterations(setup.cfg, 1, 1)[0][0]
    res = fsedp_layer(setup, layer.records, variant, streaming="python", log=True)
    dp = variant_params(setup, variant)
    assert dp.ddr_channels == 4 and dp.rows * dp.cols == 4
    sp = make_scheduler(setup.sp, dp, variant).p
    rtl = run_array(
        sp, dp, 1, seed=0, stall=0, gap=0, done_stall=0,
        rounds=[(layer.records, ())], max_cycles=4 * res.cycles, timed=True,
    )  # fmt: skip
    assert not rtl["diffs"], "\n".join(rtl["diffs"][:5])
    assert rtl["flags"] == (0, 0)
    assert rtl["end"][0] - rtl["first_beat"][0] == res.cycles
    assert rtl["beats"] == res.beats and rtl["script"] == res.script
    # the layer exercises what the DDR channels add: loads outside the expert's trajectory
    assert (rtl["remote"] > 0) == (not dp.rule5)


def lockstep(p: DatapathParams, script: list, tail: int = 400) -> tuple[list, list]:
    """A scripted list of :class:`StepIn` (then ``tail`` idle cycles) through the RTL and
    the golden model: the differences and the golden model's events."""
    from fsedp.sw.streaming import StepIn

    dut, model = ChipletArray(p), StreamingArray(p)
    diffs, events = [], []

    async def bench(ctx):
        for cycle, inp in enumerate(script + [StepIn()] * tail):
            drive(ctx, dut, p, inp)
            ready, done, ev, occ = sample(ctx, dut, p)
            ref = model.step(inp)
            diffs.extend(compare(cycle, ref, ready, done, ev, occ))
            events.extend((c, e) for c, e in enumerate(ref.events) if e is not None)
            await ctx.tick()
        diffs.extend([] if ctx.get(dut.idle) and model.idle else ["not idle at the end"])

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return diffs, events


@pytest.mark.parametrize("channels", [1, 4])
def test_slice_table_count_is_fixed_at_the_first_beat(channels):
    """[D13] directed: expert 1 is pre-loaded while its table entry is 3 of 4, the entry is
    rewritten to 1 (and a write of 0 and one of 5 are ignored) before its DISPATCH takes the
    pre-load over: it streams the pre-load's 3; expert 2, dispatched after its entry became
    2, streams 2.  RTL equals golden, cycle for cycle."""
    from fsedp.sw.scheduler import PRELOAD
    from fsedp.sw.streaming import StepIn

    p = DatapathParams(
        rows=2, cols=2, experts=8, slots=8, micro_slices=4, preload_entries=2, ddr_interval=1,
        ddr_latency=2, slice_table=True, ddr_channels=channels,
    )  # fmt: skip
    traj = 0b0011
    hop = (1, 0, 0, 0)
    script = [StepIn(tokens=(c, e, 2)) for c in (0, 1) for e in (1, 2)]
    script += [StepIn(slices=(1, 3)), StepIn(slices=(2, 2))]
    script += [StepIn(dispatch=Dispatch(PRELOAD, 1, 2, traj, 0, hop))]
    script += [StepIn()] * 6
    script += [StepIn(slices=(1, 1)), StepIn(slices=(1, 0)), StepIn(slices=(1, 5))]
    script += [StepIn(dispatch=Dispatch(DISPATCH, 1, 2, traj, 1, hop))]
    script += [StepIn(dispatch=Dispatch(DISPATCH, 2, 2, traj, 0, hop))]
    diffs, events = lockstep(p, script)
    assert not diffs, "\n".join(diffs[:5])
    per = {
        (c, e): sum(1 for x in events if x[0] == c and x[1][0] == e) for c in (0, 1) for e in (1, 2)
    }
    assert per == {(0, 1): 3, (1, 1): 3, (0, 2): 2, (1, 2): 2}


@pytest.mark.parametrize(
    "channels,latency,interval", [(1, 1, 1), (1, 8, 2), (4, 1, 1), (4, 5, 3), (1, 37, 1)]
)
def test_ddr_latency_is_measured(channels, latency, interval):
    """``DDRController.latency``: every load of a dispatched expert, issued in cycle ``t``
    (``resv.valid``), is delivered on its channel in cycle ``t + latency``; with DDR
    stalls never earlier."""
    from fsedp.hw.ddr_ctrl import DDRController

    p = DatapathParams(
        rows=2, cols=2, experts=8, slots=8, micro_slices=6, ddr_interval=interval,
        ddr_latency=latency, ddr_channels=channels,
    )  # fmt: skip
    dut = DDRController(p)
    n = p.chiplets
    rng = random.Random(latency)
    delays = {False: [], True: []}

    async def bench(ctx):
        for stalls in (False, True):
            for c in range(n):
                ctx.set(dut.free[c], p.slots)
                ctx.set(dut.resv[c].slot, c)
            ctx.set(dut.done.ready, 1)
            beat = Dispatch(DISPATCH, 1 + stalls, 2, 0b1111, 0, (1, 2, 3, 0))
            ctx.set(dut.dispatch.valid, 1)
            ctx.set(dut.dispatch.payload.as_value(), dispatch_bits(p, beat))
            queues = [[] for _ in range(p.ddr_channels)]  # issue cycles per channel
            for cycle in range(40 * (latency + interval)):
                ctx.set(dut.ddr_stall, stalls and rng.random() < 0.3)
                for c in range(n):
                    if ctx.get(dut.resv[c].valid):
                        queues[c if channels > 1 else 0].append(cycle)
                for ch, q in enumerate(queues):
                    if ctx.get(dut.deliver[ch].valid):
                        delays[stalls].append(cycle - q.pop(0))
                        # the micro-slice retires at once: the job ends after M loads
                        ctx.set(dut.retire[ch].valid, 1)
                        ctx.set(dut.retire[ch].payload, 1 + stalls)
                await ctx.tick()
                ctx.set(dut.dispatch.valid, 0)
                for c in range(n):
                    ctx.set(dut.retire[c].valid, 0)
                if not ctx.get(dut.busy):
                    break
            assert not ctx.get(dut.busy) and not any(queues)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert delays[False] == [dut.latency] * p.micro_slices
    assert len(delays[True]) == p.micro_slices and min(delays[True]) >= dut.latency
    assert max(delays[True]) > dut.latency  # the stalls did delay some load


def test_rtl_refuses_what_it_does_not_implement():
    """Ring embeddings other than the ascending one (A7's ``ring_orders``) are refused by the
    RTL generators, eagerly, naming the value, so that no RTL run streams by rules it does
    not implement (forward-state admission, [D16], is implemented: the lockstep above)."""
    from fsedp.hw.ddr_ctrl import DDRController
    from fsedp.hw.router import Router
    from fsedp.hw.scheduler import Scheduler

    p = DatapathParams(rows=2, cols=2, ring_orders=4)
    for make in (lambda: ChipletArray(p), lambda: Router(p, 0), lambda: DDRController(p)):
        with pytest.raises(ValueError, match="ring_orders 4: the datapath RTL"):
            make()
    with pytest.raises(ValueError, match="ring_orders 2: the scheduler RTL"):
        Scheduler(SchedulerParams(ring_orders=2))
