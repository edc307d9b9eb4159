"""Bench of one chiplet's router (one body: Amaranth's simulator and cocotb, ``tb/bench.py``).

The router alone, against the golden router functions of :mod:`fsedp.sw.streaming.router`
cycle by cycle: the bench plays the ring buffer (random ``offer`` per direction, random
``free``), the DDR controller (a random reservation ``resv``, admitted before the link
arrivals, [D19]), the neighbours (random ``link_in`` offers, withdrawn or replaced at will as a
link allows, and random ``link_out.ready``) and the PHYs (random ``stall``), and takes ``rx``
under random back-pressure.  Each cycle the golden state (a :class:`~fsedp.sw.streaming.
StreamingArray` whose slots are built from this cycle's offers: the router's own for its
outputs, the neighbours' for its inputs) gives, through :func:`~fsedp.sw.streaming.router.
offers` and :func:`~fsedp.sw.streaming.router.accept`, which links carry a transfer and which
input is granted (round robin, forward-count admission ``r < free - resv``); the link busy
times and
the round-robin pointer then advance by :func:`~fsedp.sw.streaming.router.commit` and
:func:`~fsedp.sw.streaming.ring_buffer.tick`.  Checked: ``link_out`` valid and payload,
``offer.ready``, ``rx`` valid and payload, ``link_in.ready``.

The report counts ``cycles``, ``sent`` (output transfers), ``granted`` (input transfers),
``busy_blocked`` (an offer held back by a busy link), ``stalled`` (by ``stall``),
``refused`` (an input not admissible: ``r >= free - resv``), ``resv_refused`` (refused only
for the reservation), ``contended`` (two or more admissible inputs), ``rx_stalled`` (a grant
not taken: ``rx.ready`` low) and ``edge`` (an offer toward the mesh edge, never passed on).
Knobs: ``cycles``, ``seed``, ``stall`` (chance of each random refusal).
"""

import dataclasses
import random
from collections import Counter

from fsedp.hw.router import Router
from fsedp.params import OPPOSITE, DatapathParams
from fsedp.sw.streaming import Header, Slot, StreamingArray
from fsedp.sw.streaming import ring_buffer as sw_rb
from fsedp.sw.streaming import router as sw_router
from fsedp.sw.streaming.ring_buffer import Room
from fsedp.tb.bench import Bench, cocotb_entry


def component(p, chiplet: int = 0):
    """The DUT: chiplet 0's (the generated Verilog's), or ``chiplet``'s."""
    return Router(p, chiplet)


def _header(p, rng) -> Header:
    return Header(
        rng.randrange(p.experts),
        rng.randrange(p.micro_slices),
        rng.getrandbits(p.chiplets) or 1,
        rng.randrange(p.chiplets),
        rng.randrange(p.chiplets),
        rng.randrange(min(p.slots + 2, 1 << p.hop_bits)),
    )


def _bits(h: Header | None) -> dict:
    """A header as a ``packet_layout`` value (field names are the same); zeros for none."""
    return dataclasses.asdict(h) if h is not None else {}


def _slot(h: Header, d: int) -> Slot:
    """A slot offering ``h`` toward direction ``d`` (the golden offer takes ``r - 1``)."""
    return Slot(
        busy=True, send=True, dir=d, r=h.r + 1, expert=h.expert, index=h.index,
        traj=h.traj, dest=h.dest, legs=h.legs,
    )  # fmt: skip


async def bench(b: Bench, p: DatapathParams, knobs: dict) -> dict:
    rng = random.Random(knobs.get("seed", 1))
    c = b.component.chiplet
    chance = knobs.get("stall", 0.3)
    arr = StreamingArray(p)
    nb = arr.nb[c]
    K = p.slots
    seen = Counter()
    offers = [None] * 4  # the ring buffer's offer per direction (held or replaced at will)
    inputs = [None] * 4  # the neighbours' offers
    for cycle in range(knobs.get("cycles", 400)):
        for d in range(4):
            if offers[d] is None or rng.random() < 0.3:
                offers[d] = _header(p, rng) if rng.random() < 0.6 else None
            if inputs[d] is None or rng.random() < 0.3:
                inputs[d] = _header(p, rng) if rng.random() < 0.5 else None
        stall = sum(1 << d for d in range(4) if rng.random() < chance / 2)
        free = rng.randrange(K + 1)
        resv = int(free > 0 and rng.random() < 0.3)  # the DDR controller reserves on free > 0
        out_ready = [rng.random() >= chance for _ in range(4)]
        rx_ready = rng.random() >= chance
        for d in range(4):
            b.set(f"offer.{d}.valid", offers[d] is not None)
            b.set(f"offer.{d}.payload", _bits(offers[d]))
            b.set(f"link_in.{d}.valid", inputs[d] is not None)
            b.set(f"link_in.{d}.payload", _bits(inputs[d]))
            b.set(f"link_out.{d}.ready", out_ready[d])
        b.set("stall", stall)
        b.set("free", free)
        b.set("resv", resv)
        b.set("rx.ready", rx_ready)
        b.case = (
            f"cycle {cycle}: offers {offers} inputs {inputs} free {free} resv {resv} "
            f"stall {stall:04b}"
        )

        # golden: this cycle's slots from the offers, link busy and rr from the state
        for i, ch in enumerate(arr.chips):
            ch.slots = [Slot() for _ in range(K)]
            if i != c:  # the neighbours' links are the bench's: never busy
                ch.link_busy = [0, 0, 0, 0]
        for d in range(4):
            if offers[d] is not None:
                arr.chips[c].slots[d] = _slot(offers[d], d)
            if inputs[d] is not None and nb[d] is not None:
                arr.chips[nb[d]].slots[0] = _slot(inputs[d], OPPOSITE[d])
        stalls = [0] * p.chiplets
        stalls[c] = stall
        out = sw_router.offers(arr, c, stall)
        frees = [K] * p.chiplets
        frees[c] = free
        room = Room.counting(arr, frees)
        if resv:
            room.take(c, 0)  # [D19] the load first: the arrivals take what it leaves
        acc = sw_router.accept(arr, stalls, room)[c]

        sent = []
        for d in range(4):
            valid = out[d] is not None
            b.check(await b.get(f"link_out.{d}.valid"), int(valid), f"link_out[{d}].valid")
            if valid:
                b.check(await b.get(f"link_out.{d}.payload"), b.encode(
                    f"link_out.{d}.payload", _bits(offers[d])
                ), f"link_out[{d}].payload")  # fmt: skip
            fire = valid and out_ready[d]
            b.check(await b.get(f"offer.{d}.ready"), int(fire), f"offer[{d}].ready")
            if fire:
                sent.append(d)
            if offers[d] is not None:
                if nb[d] is None:
                    seen["edge"] += 1
                elif arr.chips[c].link_busy[d]:
                    seen["busy_blocked"] += 1
                elif stall >> d & 1:
                    seen["stalled"] += 1
        b.check(await b.get("rx.valid"), int(acc is not None), "rx.valid")
        admissible = [d for d in range(4) if inputs[d] is not None and nb[d] is not None]
        seen["refused"] += sum(inputs[d].r >= free - resv for d in admissible)
        seen["resv_refused"] += sum(inputs[d].r == free - 1 for d in admissible) if resv else 0
        seen["contended"] += sum(inputs[d].r < free - resv for d in admissible) >= 2
        granted = None
        if acc is not None:
            d = acc[0]
            b.check(await b.get("rx.payload"), b.encode(
                "rx.payload", _bits(inputs[d])
            ), "rx.payload")  # fmt: skip
            if rx_ready:
                granted = d
            else:
                seen["rx_stalled"] += 1
        for d in range(4):
            b.check(await b.get(f"link_in.{d}.ready"), int(granted == d), f"link_in[{d}].ready")
        await b.tick()
        seen["cycles"] += 1
        seen["sent"] += len(sent)
        seen["granted"] += granted is not None

        # golden next state: counters down, then this cycle's transfers
        sw_rb.tick(arr, [[False] * K for _ in range(p.chiplets)])
        accepts = [None] * p.chiplets
        for d in sent:
            free_slot = next(i for i, s in enumerate(arr.chips[nb[d]].slots) if not s.busy)
            accepts[nb[d]] = (OPPOSITE[d], c, d, offers[d], free_slot)
        if granted is not None:
            accepts[c] = acc
        sw_router.commit(arr, accepts)
        for d in sent:
            offers[d] = None  # taken: the ring buffer offers its next candidate
        if granted is not None:
            inputs[granted] = None
    return dict(seen)


router_vs_golden = cocotb_entry("router_vs_golden", component, bench, DatapathParams)
