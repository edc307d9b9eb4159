"""One chiplet of the datapath: router + micro-slice ring buffer + compute model.

Golden model: :class:`fsedp.sw.streaming.StreamingArray` (one entry of ``chips``).  Doc
page: ``docs/blocks/datapath.md``.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.common import check_chiplet
from fsedp.hw.layouts import delivery_layout, event_layout, tokens_layout
from fsedp.hw.ring_buffer import LinkSignature, RingBuffer
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
    cycle bypassed) and announces each write in cycles (``write_cycles``).

    Members
    -------
    tokens : In(stream.Signature(tokens_layout)), always ready
        Table write (``chiplet`` is ignored here; the array routes by it).
    cand_valid, cand_expert, cand_index, cand_final : In
        The ring buffer's compute candidate.
    take : Out(1)
        Start the candidate: when idle or in the last cycle of the current micro-slice.
    done : Out(1), done_slot : Out
        The current micro-slice ends this cycle.
    cand_slot : In
    event : Out(event_layout)
        Completion event (valid in the last cycle of a compute) for the observation port.
    busy : Out(1)
    cand_cycles : In, remaining : Out, preempted : Out(1)   (``p.preempt`` only)
        The candidate's duration from the buffer; the countdown; a preemption this cycle.
    look_expert : In x 2, look_cycles : Out x 2, write_cycles : Out   (``p.preempt`` only)

    Latency: a micro-slice started in cycle ``t`` ends (``done``) in cycle ``t + cycles``.
    Throughput: back to back, the next one starting in the last cycle of the current one.
    """

    def __init__(self, p: DatapathParams):
        self.p = p
        extra = {}
        if p.preempt:
            extra = {
                "cand_cycles": In(p.compute_bits),
                "remaining": Out(p.compute_bits),
                "preempted": Out(1),
                "look_expert": In(p.expert_bits).array(2),
                "look_cycles": Out(p.compute_bits).array(2),
                "write_cycles": Out(p.compute_bits),
            }
        super().__init__(
            {
                **extra,
                "tokens": In(stream.Signature(tokens_layout(p))),
                "cand_valid": In(1),
                "cand_slot": In(p.slot_bits),
                "cand_expert": In(p.expert_bits),
                "cand_index": In(p.index_bits),
                "cand_final": In(1),
                "take": Out(1),
                "done": Out(1),
                "done_slot": Out(p.slot_bits),
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
        m.d.comb += [
            self.tokens.ready.eq(1),
            w.addr.eq(self.tokens.payload.expert),
            w.data.eq(self.tokens.payload.count),
            w.en.eq(self.tokens.valid),
            r.addr.eq(self.cand_expert),
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
                cycles.eq(self.cand_cycles),
                self.take.eq(self.cand_valid),
                self.preempted.eq(self.cand_valid & (cnt > 1)),
                self.remaining.eq(cnt),
                self.write_cycles.eq(token_cycles(p, wr.count)),
            ]
            for k in range(2):
                look = table.read_port(domain="comb")
                hit = self.tokens.valid & (wr.expert == self.look_expert[k])
                m.d.comb += [
                    look.addr.eq(self.look_expert[k]),
                    self.look_cycles[k].eq(token_cycles(p, Mux(hit, wr.count, look.data))),
                ]
        else:
            m.d.comb += [
                cycles.eq(token_cycles(p, r.data)),
                self.take.eq(self.cand_valid & (cnt <= 1)),
            ]
        m.d.comb += [
            self.done.eq(cnt == 1),
            self.done_slot.eq(slot),
            self.event.valid.eq(cnt == 1),
            self.event.expert.eq(expert),
            self.event.index.eq(index),
            self.event.final.eq(final),
            self.busy.eq(cnt != 0),
        ]
        with m.If(self.take):
            m.d.sync += [
                cnt.eq(cycles),
                slot.eq(self.cand_slot),
                expert.eq(self.cand_expert),
                index.eq(self.cand_index),
                final.eq(self.cand_final),
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
    tokens : In(stream.Signature(tokens_layout))
    free, accept : Out
        Free slots and whether a link arrival is accepted this cycle (for DDR admission).
    resv_valid : In(1), resv_slot : Out
    ddr_valid : In(1), ddr : In(delivery_layout)
    unhold_valid, unhold_expert : In
    event : Out(event_layout)
    occupancy : Out
    busy : Out(1)
        The compute model is working.
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
                "tokens": In(stream.Signature(tokens_layout(p))),
                "free": Out(p.free_bits),
                "accept": Out(1),
                "resv_valid": In(1),
                "resv_slot": Out(p.slot_bits),
                "ddr_valid": In(1),
                "ddr": In(delivery_layout(p)),
                "unhold_valid": In(1),
                "unhold_expert": In(p.expert_bits),
                "event": Out(event_layout(p)),
                "occupancy": Out(p.free_bits),
                "busy": Out(1),
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
        m.d.comb += [
            router.stall.eq(self.stall),
            router.free.eq(buf.free),
            self.free.eq(buf.free),
            self.accept.eq(buf.rx.valid & buf.rx.ready),
            buf.resv_valid.eq(self.resv_valid),
            self.resv_slot.eq(buf.resv_slot),
            buf.ddr_valid.eq(self.ddr_valid),
            buf.ddr.eq(self.ddr),
            buf.unhold_valid.eq(self.unhold_valid),
            buf.unhold_expert.eq(self.unhold_expert),
            cu.cand_valid.eq(buf.cmp_valid),
            cu.cand_slot.eq(buf.cmp_slot),
            cu.cand_expert.eq(buf.cmp_expert),
            cu.cand_index.eq(buf.cmp_index),
            cu.cand_final.eq(buf.cmp_final),
            buf.cmp_take.eq(cu.take),
            buf.cmp_done.eq(cu.done),
            buf.cmp_done_slot.eq(cu.done_slot),
            self.event.eq(cu.event),
            self.occupancy.eq(buf.occupancy),
            self.busy.eq(cu.busy),
        ]
        if p.preempt:
            m.d.comb += [
                cu.cand_cycles.eq(buf.cmp_cycles),
                buf.remaining.eq(cu.remaining),
                buf.preempted.eq(cu.preempted),
                buf.write_valid.eq(self.tokens.valid),
                buf.write_expert.eq(self.tokens.payload.expert),
                buf.write_cycles.eq(cu.write_cycles),
            ]
            for k in range(2):
                m.d.comb += [
                    cu.look_expert[k].eq(buf.look_expert[k]),
                    buf.look_cycles[k].eq(cu.look_cycles[k]),
                ]
        return m
