"""Bench of one chiplet's micro-slice ring buffer (one body: Amaranth's simulator and
cocotb, ``tb/bench.py``).

The ring buffer alone, against the golden slot model of :mod:`fsedp.sw.streaming` cycle by
cycle.  The bench plays its neighbours: the router (random micro-slices, stations and
transits, on ``rx`` with pauses; random ``offer.ready``), the DDR controller (reservations
``resv`` of the slot the buffer names, deliveries into them after a random delay, some
``held`` pre-loads, random ``unhold`` notices) and the compute unit (takes the candidate when
idle, ``done`` one to three cycles later), with a reset now and then.  The golden state is
one chiplet of a :class:`~fsedp.sw.streaming.StreamingArray`; each cycle gives, from it, the
free slots, the reserved slot (the highest free), per direction the offer
(:func:`~fsedp.sw.streaming.router.offers`: fewest hops left, ties to the lower slot) and the
compute candidate (:func:`~fsedp.sw.streaming.compute.decide`: Rule 1 before Rule 2, lower
slot first); the next state follows the golden :func:`~fsedp.sw.streaming.ring_buffer.tick`
(Rule 3 release, counters), :func:`~fsedp.sw.streaming.ring_buffer.store` (link arrivals
into the lowest free slot, DDR deliveries) and the reservation, transfer, compute and
un-hold updates of ``router.commit``, ``ddr.commit``, ``compute.commit``, ``take_dispatch``.
Checked every cycle: ``free``, ``occupancy``, ``rx.ready``, ``resv.slot``, ``offer[d]``
valid and payload, ``compute`` valid and payload.

The report counts ``cycles``, ``arrivals``, ``full`` (a micro-slice waiting on ``rx`` while no
slot is free: back-pressure), ``reservations``, ``deliveries``, ``held``, ``unheld``,
``sent``, ``computed``, ``rule1`` (a link arrival chosen over a present local one),
``released`` and ``resets``.  Knobs: ``cycles``, ``seed``, ``reset_every``.
"""

import dataclasses
import random
from collections import Counter

from fsedp.hw.ring_buffer import RingBuffer
from fsedp.params import DatapathParams
from fsedp.sw.streaming import Header, Slot, StreamingArray
from fsedp.sw.streaming import compute as sw_compute
from fsedp.sw.streaming import ring_buffer as sw_rb
from fsedp.sw.streaming import router as sw_router
from fsedp.tb.bench import Bench, StreamDriver, cocotb_entry


def component(p, chiplet: int = 0):
    """The DUT: chiplet 0's (the generated Verilog's), or ``chiplet``'s."""
    return RingBuffer(p, chiplet)


def _header(p, rng, c: int) -> Header:
    """A micro-slice arriving at chiplet ``c``: a station (``dest == c``, more legs or the
    last) or a transit; its trajectory holds ``c`` and ``dest``; ``r >= 1``."""
    dest = c if rng.random() < 0.5 else rng.randrange(p.chiplets)
    traj = rng.getrandbits(p.chiplets) | 1 << c | 1 << dest
    legs = rng.randrange(bin(traj).count("1"))
    return Header(
        rng.randrange(p.experts),
        rng.randrange(p.micro_slices),
        traj,
        dest,
        legs,
        rng.randint(1, min(p.max_hops + 1, (1 << p.hop_bits) - 1)),
    )


async def bench(b: Bench, p: DatapathParams, knobs: dict) -> dict:
    rng = random.Random(knobs.get("seed", 1))
    c, K, L = b.component.chiplet, p.slots, p.link_cycles
    reset_every = knobs.get("reset_every", 150)
    arr = StreamingArray(p)
    ch = arr.chips[c]
    seen = Counter()
    rx = StreamDriver(b, "rx", rng, 0.3)
    flight = []  # DDR loads in flight: [cycles left, slot, Header, held]
    busy_cu = None  # the compute unit: [cycles left, slot]

    for cycle in range(knobs.get("cycles", 400)):
        if cycle % reset_every == reset_every - 1:
            await b.reset()
            arr.reset()
            ch = arr.chips[c]
            rx.queue.clear()
            rx.beat = None
            flight, busy_cu = [], None
            seen["resets"] += 1
        ch.link_busy = [0, 0, 0, 0]  # the router's: its offers are the buffer's candidates
        slots = ch.slots
        free = sw_rb.free_slots(slots)
        b.case = f"cycle {cycle}: free {free}, slots {[_short(s) for s in slots]}"

        # -- the neighbours' inputs ----------------------------------------------------------
        if len(rx.queue) < 2 and rng.random() < 0.5:
            h = _header(p, rng, c)
            rx.send(h, _f(h))
        rx.drive()
        arrival = await rx.sample()
        if rx.beat is not None or arrival is not None:
            seen["full"] += free == 0
        free_after = free - (arrival is not None)
        resv = free_after >= 1 and rng.random() < 0.3
        b.set("resv.valid", resv)
        delivery = None
        if flight and flight[0][0] <= 0:
            delivery = flight.pop(0)
        b.set("ddr.valid", delivery is not None)
        if delivery is not None:
            _, slot, h, held = delivery
            b.set("ddr.payload", {"target": c, "slot": slot, "packet": _f(h), "held": held})
        unhold = None
        held_experts = [s.expert for s in slots if s.busy and s.held and not s.resv]
        if held_experts and rng.random() < 0.1:
            unhold = rng.choice(held_experts)
        b.set("unhold.valid", unhold is not None)
        b.set("unhold.payload", {"chiplet": c, "expert": unhold or 0})
        ready = [rng.random() < 0.6 for _ in range(4)]
        for d in range(4):
            b.set(f"offer.{d}.ready", ready[d])
        done = busy_cu is not None and busy_cu[0] == 1
        b.set("compute.done.valid", done)
        b.set("compute.done.payload", busy_cu[1] if done else 0)

        # -- golden decisions on the registered state ----------------------------------------
        b.check(await b.get("free"), free, "free")
        b.check(await b.get("occupancy"), K - free, "occupancy")
        b.check(await b.get("rx.ready"), int(free != 0), "rx.ready")
        high = max((i for i, s in enumerate(slots) if not s.busy), default=None)
        low = min((i for i, s in enumerate(slots) if not s.busy), default=None)
        if high is not None:
            b.check(await b.get("resv.slot"), high, "resv.slot (highest free)")
        offers = sw_router.offers(arr, c, 0)
        sent = []
        for d in range(4):
            i = offers[d]
            b.check(await b.get(f"offer.{d}.valid"), int(i is not None), f"offer[{d}].valid")
            if i is not None:
                s = slots[i]
                h = Header(s.expert, s.index, s.traj, s.dest, s.legs, s.r - 1)
                want = b.encode(f"offer.{d}.payload", _f(h))
                b.check(await b.get(f"offer.{d}.payload"), want, f"offer[{d}].payload")
                if ready[d]:
                    sent.append(i)
        ch.cnt = 0  # the bench is the compute unit: decide() then names the candidate
        _, starts = sw_compute.decide(arr)
        cand = starts[c]
        b.check(await b.get("compute.valid"), int(cand is not None), "compute.valid")
        take = None
        if cand is not None:
            s = slots[cand[0]]
            want = {"slot": cand[0], "expert": s.expert, "index": s.index, "final": s.final}
            b.check(await b.get("compute.payload"), b.encode("compute.payload", want), "compute")
            link = any(x.present and x.comp and not x.ddr for x in slots)
            local = any(x.present and x.comp and x.ddr for x in slots)
            seen["rule1"] += link and local
            if (busy_cu is None or done) and rng.random() < 0.7:
                take = cand[0]
        b.set("compute.take", take is not None)
        await b.tick()

        # -- golden next state ------------------------------------------------------------
        release = [[s.releasable for s in x.slots] for x in arr.chips]
        seen["released"] += sum(release[c])
        sw_rb.tick(arr, release)
        for i in sent:  # router.commit's source side
            slots[i].send, slots[i].tx = False, L - 1
            seen["sent"] += 1
        if arrival is not None:  # into the lowest slot free before the edge
            sw_rb.store(arr, c, low, arrival, wait=L - 1, ddr=False, held=False)
            seen["arrivals"] += 1
        if delivery is not None:
            _, slot, h, held = delivery
            sw_rb.store(arr, c, slot, h, wait=0, ddr=True, held=held)
            seen["deliveries"] += 1
        if resv:
            slots[high].busy, slots[high].resv = True, True
            h = _header(p, rng, c)
            held = rng.random() < 0.3
            flight.append([rng.randint(1, 4), high, h, held])
            seen["reservations"] += 1
            seen["held"] += held
        if unhold is not None:
            for s in slots:
                if s.busy and s.held and s.expert == unhold:
                    s.held = False
                    seen["unheld"] += 1
        if done:
            slots[busy_cu[1]].computing = False
            busy_cu = None
            seen["computed"] += 1
        if take is not None:
            slots[take].comp, slots[take].computing = False, True
            busy_cu = [rng.randint(1, 3), take]
        elif busy_cu is not None:
            busy_cu[0] -= 1
        for f in flight:
            f[0] -= 1
        seen["cycles"] += 1
    return dict(seen)


def _f(h: Header) -> dict:
    return dataclasses.asdict(h)


def _short(s: Slot) -> str:
    if not s.busy:
        return "-"
    names = ("resv", "held", "comp", "computing", "send", "ddr")
    flags = "".join(k[0] for k in names if getattr(s, k))
    return f"{s.expert}/{s.index}:{flags}w{s.wait}t{s.tx}"


ring_buffer_vs_golden = cocotb_entry("ring_buffer_vs_golden", component, bench, DatapathParams)
