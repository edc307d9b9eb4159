"""Bench of the DDR controller (one body: Amaranth's simulator and cocotb, ``tb/bench.py``).

The DDR controller alone, against the golden DDR functions of :mod:`fsedp.sw.streaming.ddr`
cycle by cycle. The bench plays the scheduler (random dispatch beats: DISPATCH to a free
entry slot, PRELOAD, some malformed or to a busy slot, with pauses; ``done`` taken under
random back-pressure), the ring buffers (their free slots and the slot each names for a
reservation, random link arrivals in the room the loads leave ([D19]), random releases of
loaded slots), the compute units (``retire`` of micro-slices of running experts, now and
then of an unknown one) and DDR (random ``ddr_stall``), with a reset now and then. The
golden state is a :class:`~fsedp.sw.streaming.StreamingArray` whose DDR part runs
:func:`~fsedp.sw.streaming.ddr.issue`, :func:`~fsedp.sw.streaming.ddr.deliveries`,
:func:`~fsedp.sw.streaming.ddr.commit`, :func:`~fsedp.sw.streaming.ddr.take_dispatch` and
:func:`~fsedp.sw.streaming.ddr.retire_jobs` as ``StreamingArray.step`` does. Checked every
cycle: ``resv[a].valid``, ``deliver[ch]`` valid and payload (target, slot, micro-slice,
``held``), ``unhold``, ``done`` (a ``lib.stream``: held until taken,
:class:`~fsedp.tb.bench.StreamMonitor`), ``bad_dispatch``, ``orphan`` and ``busy``.

The report counts ``cycles``, ``beats``, ``jobs``, ``preloads``, ``bad`` (malformed beats or
beats to a busy slot), ``issues``, ``deliveries``, ``held``, ``unholds``, ``retired``,
``done`` (finished jobs reported), ``done_stalled`` (``done`` held by back-pressure),
``ddr_stalls``, ``full`` (a load held back by too few free slots), ``orphans`` and ``resets``.
Knobs: ``cycles``, ``seed``, ``reset_every``.
"""

import dataclasses
import random
from collections import Counter

from fsedp.hw.ddr_ctrl import DDRController
from fsedp.hw.layouts import dispatch_bits
from fsedp.params import DatapathParams
from fsedp.sw.scheduler import DISPATCH, PRELOAD, Dispatch
from fsedp.sw.streaming import StepIn, StreamingArray
from fsedp.sw.streaming import compute as sw_compute
from fsedp.sw.streaming import ddr as sw_ddr
from fsedp.sw.streaming.ring_buffer import Room
from fsedp.tb.bench import Bench, StreamDriver, StreamMonitor, cocotb_entry


def component(p):
    return DDRController(p)


def _beat(p, arr, rng) -> Dispatch:
    n = p.chiplets
    traj = rng.getrandbits(n) or 1 << rng.randrange(n)
    members = [c for c in range(n) if traj >> c & 1]
    kind = DISPATCH if rng.random() < 0.7 else PRELOAD
    free = [j for j in range(n) if not arr.jobs[j].valid and traj >> j & 1]
    entry = rng.choice(free) if kind == DISPATCH and free else rng.choice(members)
    # the scheduler never runs an expert twice at once (a retirement names only the expert)
    idle = [e for e in range(p.experts) if not any(j.valid and j.expert == e for j in arr.jobs)]
    expert = rng.choice(idle or [0])
    if rng.random() < 0.08:  # malformed: no trajectory, or an entry outside it
        traj, entry = (0, entry) if rng.random() < 0.5 else (traj & ~(1 << entry), entry)
    return Dispatch(kind, expert, 1, traj, entry, (0,) * n)


async def bench(b: Bench, p: DatapathParams, knobs: dict) -> dict:
    rng = random.Random(knobs.get("seed", 1))
    n, nc = p.chiplets, p.ddr_channels
    reset_every = knobs.get("reset_every", 200)
    arr = StreamingArray(p)
    seen = Counter()
    dispatch = StreamDriver(b, "dispatch", rng, 0.5)
    # done collects bits while not ready (documented): valid must stay, the mask may grow
    done = StreamMonitor(b, "done", rng, 0.3, stable=False)
    for cycle in range(knobs.get("cycles", 600)):
        if cycle % reset_every == reset_every - 1:
            await b.reset()
            arr.reset()
            dispatch.queue.clear()
            dispatch.beat = None
            done.pending = None
            seen["resets"] += 1
        free = [arr.free(c) for c in range(n)]
        b.case = f"cycle {cycle}: free {free}, jobs {arr.jobs}, pre {arr.pre}"
        # -- the environment's inputs -----------------------------------------------------
        if not dispatch.queue and rng.random() < 0.3:
            beat = _beat(p, arr, rng)
            dispatch.send(beat, dispatch_bits(p, beat))
        stall = rng.random() < 0.1
        running = [j.expert for j in arr.jobs if j.valid and j.loaded > j.retired]
        retire = [None] * n
        for c in range(n):
            if running and rng.random() < 0.3:
                retire[c] = rng.choice(running)
            elif rng.random() < 0.01:
                retire[c] = rng.randrange(p.experts)  # possibly an orphan
        for c in range(n):
            b.set(f"free.{c}", free[c])
            high = max((i for i, s in enumerate(arr.chips[c].slots) if not s.busy), default=0)
            b.set(f"resv.{c}.slot", high)
            b.set(f"retire.{c}.valid", retire[c] is not None)
            b.set(f"retire.{c}.payload", retire[c] or 0)
        b.set("ddr_stall", stall)
        done.drive()
        dispatch.drive()
        beat = await dispatch.sample()  # always ready: an offered beat is taken
        taken = await done.sample()

        # -- golden decisions -------------------------------------------------------------------
        b.check(await b.get("bad_dispatch"), int(arr.bad_dispatch), "bad_dispatch")
        b.check(await b.get("orphan"), int(arr.orphan), "orphan")
        busy = (
            any(j.valid for j in arr.jobs)
            or any(q.valid for q in arr.pre)
            or any(arr.fifos)
            or arr.done_pending != 0
        )
        b.check(await b.get("busy"), int(busy), "busy")
        room = Room.counting(arr, free)
        inp = StepIn(dispatch=beat, done_ready=done.ready_now, ddr_stall=stall)
        issues, used, issue_out = sw_ddr.issue(arr, inp, room)
        # the routers' link arrivals take what the loads leave ([D19])
        accept = [int(room.free[c] > 0 and rng.random() < 0.2) for c in range(n)]
        delivered = sw_ddr.deliveries(arr, inp)
        targets = [t for t, *_ in issue_out]
        for c in range(n):
            b.check(await b.get(f"resv.{c}.valid"), int(c in targets), f"resv[{c}].valid")
        got = dict(delivered)
        for ch in range(nc):
            d = got.get(ch)
            b.check(await b.get(f"deliver.{ch}.valid"), int(d is not None), f"deliver[{ch}]")
            if d is not None:
                t, slot, h, held = d
                want = {"target": t, "slot": slot, "packet": dataclasses.asdict(h), "held": held}
                b.check(
                    await b.get(f"deliver.{ch}.payload"),
                    b.encode(f"deliver.{ch}.payload", want),
                    f"deliver[{ch}].payload",
                )
                seen["held"] += held
        unhold = None
        if beat is not None and beat.kind == DISPATCH and beat.traj and beat.traj >> beat.entry & 1:
            if beat.expert < p.experts and not arr.jobs[beat.entry].valid:
                k = next(
                    (k for k, q in enumerate(arr.pre) if q.valid and q.expert == beat.expert), None
                )
                if k is not None:
                    unhold = (arr.pre[k].chiplet if nc == 1 else 0, beat.expert)
        b.check(await b.get("unhold.valid"), int(unhold is not None), "unhold.valid")
        if unhold is not None:
            want = b.encode("unhold.payload", {"chiplet": unhold[0], "expert": unhold[1]})
            b.check(await b.get("unhold.payload"), want, "unhold.payload")
            seen["unholds"] += 1
        b.check(
            taken if taken is not None else 0, arr.done_pending if done.ready_now else 0, "done"
        )
        if done.pending is None and taken is None:
            b.check(0, arr.done_pending, "done.valid")
        events = [(e, 0, True) if e is not None else None for e in retire]
        orphan = arr.orphan
        retired = sw_compute.retired(arr, events)
        seen["orphans"] += arr.orphan and not orphan
        await b.tick()

        # -- golden next state ------------------------------------------------------------------
        # the ring buffers: releases (on the registered state), link arrivals (lowest free)
        for c in range(n):
            slots = arr.chips[c].slots
            low = min((i for i, s in enumerate(slots) if not s.busy), default=None)
            for s in slots:
                if s.busy and not s.resv and rng.random() < 0.15:
                    s.busy = False
            if accept[c]:
                slots[low].busy, slots[low].resv, slots[low].held = True, False, False
        seen["full"] += any(
            j.valid
            and j.loaded < j.count
            and room.free[j.target] <= sw_ddr.need(arr, j.traj, j.target, j.expert)
            for j in arr.jobs
        )
        sw_ddr.commit(arr, delivered, issues, issue_out, used)
        if beat is not None:
            seen["beats"] += 1
            bad_before = arr.bad_dispatch
            jobs_before = sum(j.valid for j in arr.jobs)
            sw_ddr.take_dispatch(arr, beat)
            seen["bad"] += arr.bad_dispatch and not bad_before
            seen["jobs"] += sum(j.valid for j in arr.jobs) > jobs_before
            seen["preloads"] += beat.kind == PRELOAD
        done_valid = arr.done_pending != 0
        done_new = sw_ddr.retire_jobs(arr, retired)
        arr.done_pending = (0 if done_valid and done.ready_now else arr.done_pending) | done_new
        arr.now = (arr.now + 1) % (1 << arr.age_bits)
        seen["cycles"] += 1
        seen["issues"] += len(issues)
        seen["deliveries"] += len(delivered)
        seen["retired"] += sum(retired)
        seen["done"] += bin(taken or 0).count("1")
        seen["ddr_stalls"] += stall
    seen["done_stalled"] = done.stalled
    return dict(seen)


ddr_ctrl_vs_golden = cocotb_entry("ddr_ctrl_vs_golden", component, bench, DatapathParams)
