"""Router of one chiplet: four die-to-die links (N/E/S/W) and the local ring buffer.

Golden model: steps 1-2 of :meth:`fsedp.sw.streaming.StreamingArray.step`.  Doc page:
``docs/blocks/datapath.md``.
"""

from amaranth import Array, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.common import check_chiplet, rr_pick
from fsedp.hw.layouts import packet_layout
from fsedp.hw.ring_buffer import LinkSignature
from fsedp.params import DatapathParams

__all__ = ["Router"]


class Router(wiring.Component):
    """Output links with their busy time, input arbitration with forward-count (or, with
    ``admission = "forward-state"``, forward-state [D16]) admission.

    XY routing needs no table here: the ring buffer stores each micro-slice with the
    direction of its next leg (computed on arrival from ``dest``), and offers per direction.

    Parameters
    ----------
    p : DatapathParams
    chiplet : int

    Members
    -------
    offer : In(LinkSignature) x 4
        The ring buffer's best candidate per direction.
    link_out : Out(LinkSignature) x 4
        To the neighbours: an offer is passed on while the link is idle and not stalled; a
        transfer keeps the link busy for ``link_cycles`` cycles.  Ports at the mesh edge
        never offer.
    link_in : In(LinkSignature) x 4
        From the neighbours (``link_in[d]`` comes from the neighbour in direction ``d``).
    stall : In(4)
        Per output link: no transfer may start this cycle (test hook, models a busy PHY).
    free : In
        Free slots of the ring buffer.
    resv : In(1)
        The DDR controller reserves a slot of this ring buffer this cycle: its load was
        admitted first, an arrival takes what it leaves ([D19]).
    admit, admit_spare : In(H + 2); only with forward-state admission
        The ring buffer's ``admit`` and ``admit_spare`` ([D16]): bit ``r`` set when a
        micro-slice with ``r`` hops to go may enter (with one more slot taken).
    resv_claim : In; only with forward-state admission
        The claim of the slot reserved this cycle (``resv``).
    rx : Out(stream.Signature(packet_layout))
        The granted input: round-robin over the inputs whose micro-slice is admissible
        (``payload.r < free - resv``; forward-state: ``admit[payload.r]`` and, with
        ``resv``, ``admit_spare[min(payload.r, resv_claim)]``), at most one per cycle.

    Latency: an accepted micro-slice is in the ring buffer at the next clock edge and usable
    ``link_cycles`` cycles after acceptance.
    """

    def __init__(self, p: DatapathParams, chiplet: int):
        check_chiplet(self, p, chiplet)
        self.p, self.chiplet = p, chiplet
        link = LinkSignature(p)
        super().__init__(
            {
                "offer": In(link).array(4),
                "link_out": Out(link).array(4),
                "link_in": In(link).array(4),
                "stall": In(4),
                "free": In(p.free_bits),
                "resv": In(1),
                "rx": Out(stream.Signature(packet_layout(p))),
                **(
                    {
                        "admit": In(p.held_claim + 1),
                        "admit_spare": In(p.held_claim + 1),
                        "resv_claim": In(p.hop_bits),
                    }
                    if p.admission == "forward-state"
                    else {}
                ),
            }
        )

    def elaborate(self, platform):
        p, c, L = self.p, self.chiplet, self.p.link_cycles
        m = Module()
        exists = [p.neighbour(c, d) is not None for d in range(4)]

        busy = [Signal(max(1, (L - 1).bit_length()), name=f"link_busy_{d}") for d in range(4)]
        for d in range(4):
            o, out = self.offer[d], self.link_out[d]
            if not exists[d]:
                m.d.comb += [out.valid.eq(0), o.ready.eq(0)]
                continue
            m.d.comb += [
                out.valid.eq(o.valid & (busy[d] == 0) & ~self.stall[d]),
                out.payload.eq(o.payload),
                o.ready.eq(out.valid & out.ready),
            ]
            with m.If(out.valid & out.ready):
                m.d.sync += busy[d].eq(L - 1)
            with m.Elif(busy[d] != 0):
                m.d.sync += busy[d].eq(busy[d] - 1)

        rr = Signal(2)
        admissible = [Signal(name=f"admissible_{d}") for d in range(4)]
        for d in range(4):
            i = self.link_in[d]
            r = i.payload.r
            # [D19] the DDR controller's load of this cycle is admitted first; the reservation
            # arrives late in the cycle, so it selects between two early comparisons
            if p.admission == "forward-state":
                lower = Mux(r < self.resv_claim, r, self.resv_claim)
                ok = self.admit.bit_select(r, 1) & (
                    ~self.resv | self.admit_spare.bit_select(lower, 1)
                )
            else:
                ok = Mux(self.resv, r + 1 < self.free, r < self.free)
            m.d.comb += admissible[d].eq(i.valid & ok if exists[d] else 0)
        anyv, g = rr_pick(admissible, rr, 2)
        grant = Signal(2)
        m.d.comb += [grant.eq(g), self.rx.valid.eq(anyv)]
        payloads = Array(self.link_in[d].payload.as_value() for d in range(4))
        m.d.comb += self.rx.payload.eq(payloads[grant])
        for d in range(4):
            m.d.comb += self.link_in[d].ready.eq(anyv & (grant == d) & self.rx.ready)
        with m.If(self.rx.valid & self.rx.ready):
            m.d.sync += rr.eq(grant + 1)
        return m
