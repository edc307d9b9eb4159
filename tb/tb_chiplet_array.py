"""cocotb testbench of the chiplet array (``fsedp_chiplet_array``).

Driver: :class:`fsedp.tb.datapath_scoreboard.LayerDriver` (the scheduler golden model's dispatch
beats with random gaps, token-table writes, random link/DDR stalls, random ``done.ready``).
Monitor: every cycle, after ``ReadOnly``, the ``done``, ``events`` and ``occupancy`` ports
(``dispatch`` is always ready, a constant with no port; ``events`` and ``occupancy`` are the
flat bits of their ``ArrayLayout``, element ``c`` at ``c * width``).  Checkers: the
conservation/occupancy/release scoreboard, and the streaming golden model stepped with the
same inputs (lockstep, cycle-exact).

Knobs (``FSEDP_KNOBS``): ``layers``, ``seed``, ``stall``, ``gap``, ``done_stall``,
``tokens``, ``top_k``, ``reset_every`` (pulse reset in the middle of every N-th layer),
``max_layer_cycles`` (progress bound), ``lockstep`` (default on), ``rounds_file`` (JSON list
of ``{"records": [[request, chiplet, expert], ...], "req_inits": [[request, t_qos], ...]}``).
"""

import json
import os
import random
import time

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from fsedp.hw.layouts import (
    dispatch_bits,
    slices_bits,
    tokens_bits,
    unpack_events,
    unpack_occupancy,
)
from fsedp.params import DatapathParams, SchedulerParams
from fsedp.sw.streaming import StreamingArray
from fsedp.tb.datapath_scoreboard import LayerDriver, Violation, compare, stall_bits
from fsedp.tb.scoreboard import random_round
from fsedp.tb.streams import knobs, start, u, write_report


def _params():
    p = DatapathParams(**json.loads(os.environ["FSEDP_PARAMS"]))
    k = knobs()
    sp = SchedulerParams(**k["sched"])
    return p, sp, k


@cocotb.test()
async def chiplet_array(dut):
    p, sp, k = _params()
    rng = random.Random(k.get("seed", 1))
    layers = k.get("layers", 10)
    lockstep = k.get("lockstep", True)
    bound = k.get("max_layer_cycles", 50000)
    reset_every = k.get("reset_every", 0)
    rounds = None
    if k.get("rounds_file"):
        with open(k["rounds_file"]) as f:
            rounds = json.load(f)
        layers = len(rounds)
    drv = LayerDriver(
        sp,
        p,
        rng,
        stall=k.get("stall", 0.0),
        gap=k.get("gap", 0.0),
        done_stall=k.get("done_stall", 0.0),
    )
    model = StreamingArray(p)
    report = {
        "layers": 0,
        "cycles": 0,
        "computed": 0,
        "mismatches": 0,
        "first_mismatches": [],
        "first_mismatch_layer": None,
        "violations": [],
        "deadlocks": 0,
        "resets": 0,
        "layer_cycles": [],
        "dispatches": 0,
        "remote_loads": 0,
    }
    peak = [0] * p.chiplets

    dut.dispatch__valid.value = 0
    dut.tokens__valid.value = 0
    if p.slice_table:
        dut.slices__valid.value = 0
    dut.done__ready.value = 0
    dut.stall.value = 0
    dut.ddr_stall.value = 0
    await start(dut)
    t0 = time.time()
    cycle = 0
    for layer in range(layers):
        if rounds is not None:
            rec = [tuple(r) for r in rounds[layer]["records"]]
            inits = [tuple(r) for r in rounds[layer].get("req_inits", [])]
        else:
            rnd = random_round(sp, rng, tokens=k.get("tokens"), top_k=k.get("top_k"))
            rec, inits = rnd.records, rnd.req_inits
        drv.start_layer(rec, inits)
        start_cycle = cycle
        reset_at = (
            start_cycle + rng.randint(5, 60)
            if reset_every and layer % reset_every == reset_every - 1
            else None
        )
        while True:
            if cycle == reset_at:
                # reset in the middle of the layer: datapath, golden models and scoreboard
                dut.rst.value = 1
                dut.dispatch__valid.value = 0
                dut.tokens__valid.value = 0
                if p.slice_table:
                    dut.slices__valid.value = 0
                await RisingEdge(dut.clk)
                dut.rst.value = 0
                model.reset()
                drv.reset()
                report["resets"] += 1
                break
            was_done = drv.layer_done  # nothing left to present this layer
            inp = drv.inputs()
            dut.stall.value = stall_bits(inp)
            dut.ddr_stall.value = int(inp.ddr_stall)
            dut.done__ready.value = int(inp.done_ready)
            dut.dispatch__valid.value = int(inp.dispatch is not None)
            if inp.dispatch is not None:
                dut.dispatch__payload.value = dispatch_bits(p, inp.dispatch)
            dut.tokens__valid.value = int(inp.tokens is not None)
            if inp.tokens is not None:
                dut.tokens__payload.value = tokens_bits(p, *inp.tokens)
            if p.slice_table:
                dut.slices__valid.value = int(inp.slices is not None)
                if inp.slices is not None:
                    dut.slices__payload.value = slices_bits(p, *inp.slices)
            await ReadOnly()
            idle = u(dut.idle)  # a function of the registered state only
            ready = True  # ``dispatch`` is always ready: no ``dispatch__ready`` port
            done = u(dut.done__payload) if u(dut.done__valid) else 0
            events = unpack_events(p, u(dut.events))
            occ = unpack_occupancy(p, u(dut.occupancy))
            if lockstep:
                ref = model.step(inp)
                report["remote_loads"] += sum(h.dest != t for t, _, h, _ in ref.ddr_issues)
                diffs = compare(cycle, ref, ready, done, events, occ)
                if diffs:
                    if not report["mismatches"]:
                        report["first_mismatch_layer"] = layer
                    report["mismatches"] += len(diffs)
                    report["first_mismatches"] += diffs[: 5 - len(report["first_mismatches"])]
                    lockstep = False  # keep checking conservation on the RTL alone
            try:
                drv.outputs(cycle, ready, done, events, occ)
            except Violation as e:
                report["violations"].append(str(e))
                break
            for c in range(p.chiplets):
                peak[c] = max(peak[c], occ[c])
            cycle += 1
            await RisingEdge(dut.clk)
            if was_done and idle:
                break
            if cycle - start_cycle > bound:
                report["deadlocks"] += 1
                report["violations"].append(
                    f"layer {layer}: no completion within {bound} cycles (occupancy {occ})"
                )
                break
        if report["violations"]:
            break
        if reset_at is None or cycle < reset_at:
            try:
                drv.check.end_layer(occ)
            except Violation as e:
                report["violations"].append(str(e))
                break
            report["layer_cycles"].append(cycle - start_cycle)
        report["layers"] += 1
    await ReadOnly()
    flags = (u(dut.bad_dispatch), u(dut.orphan))
    report.update(
        cycles=cycle,
        computed=drv.check.computed,
        dispatches=drv.dispatched,
        peak_rtl=peak,
        peak_model=drv.check.peak if lockstep else None,
        bad_dispatch=flags[0],
        orphan=flags[1],
        wall_s=round(time.time() - t0, 2),
    )
    write_report(report)
    assert not report["violations"], report["violations"][:3]
    assert report["mismatches"] == 0, report["first_mismatches"]
    assert not report["bad_dispatch"] and not report["orphan"]
