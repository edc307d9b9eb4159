"""cocotb testbench of the scheduler top (``fsedp_scheduler``) against the golden model.

Driver -> DUT -> monitor -> :class:`fsedp.tb.scoreboard.RoundChecker`.  One cycle-level loop
drives every stream (random valid gaps on ``gate``, random ``ready`` on ``dispatch``),
models the datapath's completions (:class:`fsedp.tb.scoreboard.DatapathModel`), optionally
resets the DUT in the middle of a round, and measures scheduling latency in cycles.

Knobs (``FSEDP_KNOBS``): rounds, seed, stall (probability of a valid gap or a ready
stall), tokens, top_k, reset_every, bad_records, max_delay and per_token (completion model
of :class:`DatapathModel`), log_rounds (rounds whose events go into the report), debug
(cycles to log), rounds_file (JSON list of rounds:
``{"records": [[r, c, e], ...], "req_inits": [[r, t], ...]}``).
"""

import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from fsedp.hw.layouts import dispatch_from_bits, gate_bits, req_init_bits
from fsedp.tb.scoreboard import (
    DatapathModel,
    RoundChecker,
    ScriptedDatapath,
    make_rounds,
    reset_span,
)
from fsedp.tb.streams import knobs, params, resolved, start, u, write_report


async def wait_idle(dut):
    """After reset the EIT is cleared (E cycles), then ``idle`` rises.  (On Icarus the
    combinational outputs stay X until the FSM first changes state.)"""
    while True:
        await ReadOnly()
        ok = resolved(dut.idle) and u(dut.idle)
        await RisingEdge(dut.clk)
        if ok:
            return


@cocotb.test()
async def scheduler_vs_golden(dut):
    p, k = params(), knobs()
    rng = random.Random(k.get("seed", 1))
    stall = k.get("stall", 0.25)
    reset_every = k.get("reset_every", 0)
    rounds = make_rounds(p, k, rng)
    checker = RoundChecker(p)
    await start(dut)
    await wait_idle(dut)

    gate_v, gate_p = dut.gate__valid, dut.gate__payload
    ri_v, ri_p = dut.req_init__valid, dut.req_init__payload
    d_v, d_r, d_p = dut.dispatch__valid, dut.dispatch__ready, dut.dispatch__payload
    dn_v, dn_r, dn_p = dut.done__valid, dut.done__ready, dut.done__payload
    for s in (gate_v, ri_v, dn_v):
        s.value = 0
    d_r.value = 0

    now = 0
    lat_first, lat_done, resets, rounds_done, logs = [], [], 0, 0, []
    expected_diffs = []
    gaps, last_beat = [], None  # cycles between back-to-back dispatch beats
    for index, rnd in enumerate(rounds):
        script = getattr(rnd, "done_script", None)
        expected = getattr(rnd, "expected", None)
        seen = []
        dp = (
            ScriptedDatapath(p.chiplets, script)
            if script is not None
            else DatapathModel(
                p.chiplets, rng, max_delay=k.get("max_delay", 12), per_token=k.get("per_token", 0)
            )
        )
        log = [] if index < k.get("log_rounds", 0) else None
        queue = [("init", x) for x in rnd.req_inits]
        queue += [("rec", x, i == len(rnd.records) - 1) for i, x in enumerate(rnd.records)]
        qi = 0
        sent_last = False
        done_mask = 0
        t_last = t_done = None
        start_cycle = now
        span = reset_span(p, len(queue), stall)
        reset_at = (
            start_cycle + rng.randrange(1, span)
            if reset_every and index % reset_every == reset_every - 1
            else None
        )
        aborted = diverged = False
        while True:
            # -- drive (just after the clock edge) ------------------------------------
            gv = rv = 0
            if qi < len(queue) and rng.random() >= stall:
                item = queue[qi]
                if item[0] == "init":
                    rv, ri_p.value = 1, req_init_bits(p, *item[1])
                else:
                    gv, gate_p.value = 1, gate_bits(p, *item[1], item[2])
            gate_v.value, ri_v.value = gv, rv
            ready = int(rng.random() >= stall)
            d_r.value = ready
            if sent_last and not done_mask:
                done_mask = dp.ready_mask(now)
            dn_v.value = int(bool(done_mask))
            dn_p.value = done_mask
            if script is not None and now - start_cycle > 64 * (len(queue) + 8 * p.experts) + 10000:
                # a scripted completion names a slot the RTL never filled: it diverged
                expected_diffs.append(
                    f"round {index}: no progress after {now - start_cycle} "
                    f"cycles; completions {dp.script[:3]} still pending"
                )
                diverged = True
                break
            if reset_at is not None and now >= reset_at:
                dut.rst.value = 1
                for _ in range(2):
                    await RisingEdge(dut.clk)
                    now += 1
                dut.rst.value = 0
                gate_v.value = ri_v.value = dn_v.value = 0
                checker.reset()
                resets += 1
                aborted = True
                break
            # -- sample (settled values of this cycle) ---------------------------------
            await ReadOnly()
            idle = u(dut.idle)
            if sent_last and idle:
                if log is not None:
                    logs.append(
                        {
                            "round": index,
                            "deferred": u(dut.deferred),
                            "n_active": u(dut.n_active),
                            "events": log,
                        }
                    )
                checker.end_round(
                    u(dut.deferred),
                    u(dut.n_active),
                    {
                        "overflow": u(dut.overflow),
                        "bad_record": u(dut.bad_record),
                        "spurious_done": u(dut.spurious_done),
                    },
                )
                rounds_done += 1
                if expected is not None and len(seen) != len(expected) and len(expected_diffs) < 10:
                    expected_diffs.append(
                        f"round {index}: simulator made {len(expected)} decisions, RTL {len(seen)}"
                    )
            if k.get("debug") and now < k["debug"]:
                dut._log.info(
                    f"c{now} gv={gv} gr={dut.gate__ready.value} idle={idle} qi={qi} "
                    f"st={dut.fsm_state.value} sent_last={sent_last} dv={d_v.value} "
                    f"dn={done_mask} dnr={dn_r.value}"
                )
            got = None
            if ready and u(d_v):
                got = dispatch_from_bits(p, u(d_p))
            if u(d_v) and t_last is not None and not lat_first_taken(lat_first, index):
                lat_first.append((index, now - t_last, bool(checker.plan and checker.plan.defer)))
            if u(d_v) and t_done is not None:
                lat_done.append(now - t_done)
                t_done = None
            done_taken = bool(done_mask) and u(dn_r)
            gate_taken = (gv and u(dut.gate__ready)) or (rv and u(dut.req_init__ready))
            await RisingEdge(dut.clk)
            now += 1
            if sent_last and idle:
                break
            # -- bookkeeping of the transfers at this edge ------------------------------
            if gate_taken:
                item = queue[qi]
                qi += 1
                if item[0] == "init":
                    checker.init_request(*item[1])
                elif item[2]:
                    sent_last, t_last = True, now
                    checker.start_round([x[1] for x in queue if x[0] == "rec"])
            if got is not None:
                if last_beat is not None:
                    gaps.append(now - last_beat)
                last_beat = now
                checker.on_dispatch(got)
                if expected is not None:
                    i = len(seen)
                    seen.append(got)
                    want = expected[i] if i < len(expected) else None
                    have = [got.kind, got.expert, got.entry, got.traj]
                    if want != have and len(expected_diffs) < 10:
                        expected_diffs.append(
                            f"round {index}, decision {i}: simulator {want}, RTL {have}"
                        )
                if got.kind == 0:
                    dp.on_dispatch(got.entry, now, got.count, got.traj)
                if log is not None:
                    log.append({"cycle": now, **got.as_dict()})
            if done_taken or (sent_last and idle):
                last_beat = None
            if done_taken:
                if log is not None:
                    log.append({"cycle": now, "kind": "done", "slots": done_mask})
                checker.on_done(done_mask)
                dp.on_done(done_mask)
                done_mask = 0
                t_done = now
        if diverged:
            break
        if aborted:
            # after reset the DUT clears its EIT, then is idle again
            await wait_idle(dut)
            now += 1

    report = {
        "rounds": rounds_done,
        "resets": resets,
        "beats": checker.beats,
        "mismatches": len(checker.mismatches),
        "first_mismatches": [str(m) for m in checker.mismatches[:10]],
        "first_mismatch_round": checker.mismatches[0].round if checker.mismatches else None,
        "latency_first_dispatch": [x for _, x, _ in lat_first],
        # the same, split by whether token buffering deferred a request in the round
        "latency_first_dispatch_plain": [x for _, x, d in lat_first if not d],
        "latency_first_dispatch_deferral": [x for _, x, d in lat_first if d],
        "latency_done_to_dispatch": lat_done,
        "cycles": now,
        "logs": logs,
        "dispatch_gaps": gaps,
        "expected_mismatches": expected_diffs,
    }
    write_report(report)
    assert not checker.mismatches, "\n".join(report["first_mismatches"])
    assert not expected_diffs, "\n".join(expected_diffs)
    assert rounds_done + resets == len(rounds)


def lat_first_taken(lat_first, index):
    return bool(lat_first) and lat_first[-1][0] == index
