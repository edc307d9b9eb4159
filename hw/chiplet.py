"""One chiplet of the datapath: router + micro-slice ring buffer + compute model.

Golden model: :class:`fsedp.sw.streaming.StreamingArray` (one entry of ``chips``).  Doc
page: ``docs/blocks/datapath.md``.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.common import check_chiplet
from fsedp.hw.layouts import event_layout, tokens_layout
from fsedp.hw.ring_buffer import (
    ComputeSignature,
    DeliverySignature,
    LinkSignature,
    ReservationSignature,
    RetireSignature,
    RingBuffer,
    UnholdSignature,
)
from fsedp.hw.router import Router
from fsedp.params import DatapathParams

__all__ = ["ComputeModel", "Chiplet"]


def token_cycles(p: DatapathParams, count):
    """Compute cycles of a micro-slice of an expert with ``count`` tokens here."""
    return Mux(count == 0, 1, count) * p.cycles_per_token


class ComputeModel(wiring.Component):
    """The PE array as a timer: a micro-slice takes ``max(1, tokens) * cycles_per_token``
    cycles, ``tokens`` being this chiplet's count for the expert (a ``lib.memory`` table of
    ``experts`` entries written through ``tokens``).

    With ``p.preempt`` ([D11]) the ring buffer keeps every slot's duration and offers, while
    a computation runs, the shortest waiting one; the compute unit starts it when it is
    shorter than what is left (``remaining - 1``) and hands the remainder back with
    ``preempted`` (the buffer stores it in the slot).  The table then also answers the
    buffer's two arrival lookups (``look_expert`` -> ``look_cycles``, a write in the same
    cycle bypassed) and announces each write in cycles (``write``).

    Members
    -------
    tokens : In(stream.Signature(tokens_layout)), always ready
        Table write (``chiplet`` is ignored here; the array routes by it).
    compute : In(ComputeSignature)
        The ring buffer's compute candidate (``valid``, ``payload``); ``take`` starts it:
        when idle or in the last cycle of the current micro-slice (with ``p.preempt``
        whenever offered: the buffer offers only what is to start); ``done``: the current
        micro-slice's slot, valid in its last cycle; ``remaining``, ``preempted``,
        ``look_*`` and ``write`` with ``p.preempt``.
    event : Out(event_layout)
        Completion event (valid in the last cycle of a compute) for the observation port.
    busy : Out(1)

    Latency: a micro-slice started in cycle ``t`` ends (``done``) in cycle ``t + cycles``.
    Throughput: back to back, the next one starting in the last cycle of the current one.
    """

    def __init__(self, p: DatapathParams):
        self.p = p
        super().__init__(
            {
                "tokens": In(stream.Signature(tokens_layout(p), always_ready=True)),
                "compute": In(ComputeSignature(p)),
                "event": Out(event_layout(p)),
                "busy": Out(1),
            }
        )

    def elaborate(self, platform):
        p = self.p
        m = Module()
        m.submodules.table = table = memory.Memory(shape=p.count_width, depth=p.experts, init=[])
        w = table.write_port()
        r = table.read_port(domain="comb")
        wr = self.tokens.payload
        cand, cu = self.compute.payload, self.compute
        m.d.comb += [
            w.addr.eq(self.tokens.payload.expert),
            w.data.eq(self.tokens.payload.count),
            w.en.eq(self.tokens.valid),
            r.addr.eq(cand.expert),
        ]

        cnt = Signal(p.compute_bits)
        slot = Signal(p.slot_bits)
        expert = Signal(p.expert_bits)
        index = Signal(p.index_bits)
        final = Signal()
        cycles = Signal(p.compute_bits)
        if p.preempt:
            # the buffer's candidate is already the one to start: a waiting one when idle
            # or ending, a shorter one than what is left while running
            m.d.comb += [
                cycles.eq(cand.cycles),
                cu.take.eq(cu.valid),
                cu.preempted.eq(cu.valid & (cnt > 1)),
                cu.remaining.eq(cnt),
                cu.write.valid.eq(self.tokens.valid),
                cu.write.payload.expert.eq(wr.expert),
                cu.write.payload.cycles.eq(token_cycles(p, wr.count)),
            ]
            for k in range(2):
                look = table.read_port(domain="comb")
                hit = self.tokens.valid & (wr.expert == cu.look_expert[k])
                m.d.comb += [
                    look.addr.eq(cu.look_expert[k]),
                    cu.look_cycles[k].eq(token_cycles(p, Mux(hit, wr.count, look.data))),
                ]
        else:
            m.d.comb += [
                cycles.eq(token_cycles(p, r.data)),
                cu.take.eq(cu.valid & (cnt <= 1)),
            ]
        m.d.comb += [
            cu.done.valid.eq(cnt == 1),
            cu.done.payload.eq(slot),
            self.event.valid.eq(cnt == 1),
            self.event.expert.eq(expert),
            self.event.index.eq(index),
            self.event.final.eq(final),
            self.busy.eq(cnt != 0),
        ]
        with m.If(cu.take):
            m.d.sync += [
                cnt.eq(cycles),
                slot.eq(cand.slot),
                expert.eq(cand.expert),
                index.eq(cand.index),
                final.eq(cand.final),
            ]
        with m.Elif(cnt != 0):
            m.d.sync += cnt.eq(cnt - 1)
        return m


class Chiplet(wiring.Component):
    """Router, ring buffer and compute model of chiplet ``chiplet``.

    Members
    -------
    link_out, link_in : LinkSignature x 4
        Die-to-die links N/E/S/W.
    stall : In(4)
    tokens : In(stream.Signature(tokens_layout)), always ready
    free : Out
        Free slots (registered state, for DDR admission).
    admit : Out; only with forward-state admission
        The ring buffer's admission vector for DDR loads (``admit_load``: [D16] with the
        rung below a load left to the ring's traffic, [D20]).
    resv : In(ReservationSignature)
        The DDR controller reserves a slot for a load it issues (answered in the cycle);
        the router admits a link arrival in what the load leaves ([D19]).
    ddr : In(DeliverySignature), always ready
        A DDR load arriving in its reserved slot.
    unhold : In(UnholdSignature), always ready
        Held pre-loaded micro-slices of ``payload.expert`` may stream (``payload.chiplet``
        is ignored here; the array routes by it).
    retire : Out(RetireSignature), always ready
        A micro-slice of ``payload`` finished its last station here (``event`` with
        ``final``).
    event : Out(event_layout)
    occupancy : Out
    busy : Out(1)
        The compute model is working.

    Latency: a link arrival is usable ``link_cycles`` cycles after its acceptance, a DDR
    delivery the cycle after; a micro-slice started in cycle ``t`` ends in cycle
    ``t + max(1, tokens) * cycles_per_token``.  Throughput: one link arrival and one DDR
    delivery per cycle, one transfer start per link per cycle, one micro-slice computing.
    """

    def __init__(self, p: DatapathParams, chiplet: int):
        check_chiplet(self, p, chiplet)
        self.p, self.chiplet = p, chiplet
        link = LinkSignature(p)
        super().__init__(
            {
                "link_out": Out(link).array(4),
                "link_in": In(link).array(4),
                "stall": In(4),
                "tokens": In(stream.Signature(tokens_layout(p), always_ready=True)),
                "free": Out(p.free_bits),
                "resv": In(ReservationSignature(p)),
                "ddr": In(DeliverySignature(p)),
                "unhold": In(UnholdSignature(p)),
                "retire": Out(RetireSignature(p)),
                "event": Out(event_layout(p)),
                "occupancy": Out(p.free_bits),
                "busy": Out(1),
                **({"admit": Out(p.held_claim + 1)} if p.admission == "forward-state" else {}),
            }
        )

    def elaborate(self, platform):
        p, c = self.p, self.chiplet
        m = Module()
        m.submodules.router = router = Router(p, c)
        m.submodules.buffer = buf = RingBuffer(p, c)
        m.submodules.compute = cu = ComputeModel(p)
        for d in range(4):
            wiring.connect(m, buf.offer[d], router.offer[d])
            wiring.connect(m, router.link_out[d], wiring.flipped(self.link_out[d]))
            wiring.connect(m, wiring.flipped(self.link_in[d]), router.link_in[d])
        wiring.connect(m, router.rx, buf.rx)
        wiring.connect(m, wiring.flipped(self.tokens), cu.tokens)
        wiring.connect(m, wiring.flipped(self.resv), buf.resv)
        wiring.connect(m, wiring.flipped(self.ddr), buf.ddr)
        wiring.connect(m, wiring.flipped(self.unhold), buf.unhold)
        wiring.connect(m, buf.compute, cu.compute)
        m.d.comb += [
            router.stall.eq(self.stall),
            router.free.eq(buf.free),
            router.resv.eq(self.resv.valid),
            self.free.eq(buf.free),
            self.retire.valid.eq(cu.event.valid & cu.event.final),
            self.retire.payload.eq(cu.event.expert),
            self.event.eq(cu.event),
            self.occupancy.eq(buf.occupancy),
            self.busy.eq(cu.busy),
        ]
        if p.admission == "forward-state":
            m.d.comb += [
                router.admit.eq(buf.admit),
                router.admit_spare.eq(buf.admit_spare),
                router.resv_claim.eq(self.resv.claim),
                self.admit.eq(buf.admit_load),
            ]
        return m
