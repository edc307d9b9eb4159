"""A ``rows x cols`` chiplet array with its DDR controller: the datapath the scheduler's
dispatch stream drives.

Golden model: :class:`fsedp.sw.streaming.StreamingArray`.  Testbench:
``tb/tb_chiplet_array.py``.  Doc page: ``docs/blocks/datapath.md``.
"""

from amaranth import Cat, Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.chiplet import Chiplet
from fsedp.hw.common import check_chiplet
from fsedp.hw.ddr_ctrl import DDRController
from fsedp.hw.layouts import dispatch_layout, event_layout, slices_layout, tokens_layout
from fsedp.params import OPPOSITE, DatapathParams

__all__ = ["ChipletArray"]


class ChipletArray(wiring.Component):
    """Chiplets on a mesh (snake-numbered), their links, and the DDR controller.

    Members
    -------
    dispatch : In(stream.Signature(dispatch_layout)), always ready
        The scheduler's dispatch stream (DISPATCH and PRELOAD beats).
    done : Out(stream.Signature(chiplets))
        Completion masks for the scheduler's ``done`` stream.
    tokens : In(stream.Signature(tokens_layout)), always ready
        Token-table writes (tokens of ``expert`` held on ``chiplet``) before a layer.
    slices : In(stream.Signature(slices_layout)), always ready; only with ``slice_table``
        Slice-table writes ([D13]): how many micro-slices ``expert`` streams, before a layer.
    stall : In(4 * chiplets)
        Bit ``4 c + d``: chiplet ``c``'s output link ``d`` (N/E/S/W) may not start a transfer
        this cycle.  Test hook; tie to 0 in a product.
    ddr_stall : In(1)
        DDR busy this cycle.  Test hook; tie to 0 in a product.
    events : Out(chiplets * event_layout)
        Per chiplet, the compute completion of this cycle (observation).
    occupancy : Out(chiplets * free_bits)
        Per chiplet, allocated ring-buffer slots (observation).
    idle : Out(1)
        No job, pre-load, load, micro-slice or completion is left anywhere.
    bad_dispatch, orphan : Out(1)
        Sticky error flags (see :class:`DDRController`).
    """

    def __init__(self, p: DatapathParams):
        check_chiplet(self, p)
        self.p = p
        n = p.chiplets
        super().__init__(
            {
                "dispatch": In(stream.Signature(dispatch_layout(p))),
                "done": Out(stream.Signature(n)),
                "tokens": In(stream.Signature(tokens_layout(p))),
                **({"slices": In(stream.Signature(slices_layout(p)))} if p.slice_table else {}),
                "stall": In(4 * n),
                "ddr_stall": In(1),
                "events": Out(n * event_layout(p).size),
                "occupancy": Out(n * p.free_bits),
                "idle": Out(1),
                "bad_dispatch": Out(1),
                "orphan": Out(1),
            }
        )

    def elaborate(self, platform):
        p = self.p
        n = p.chiplets
        m = Module()
        m.submodules.ddr = ddr = DDRController(p)
        chips = []
        for c in range(n):
            ch = Chiplet(p, c)
            m.submodules[f"chiplet{c}"] = ch
            chips.append(ch)
        wiring.connect(m, wiring.flipped(self.dispatch), ddr.dispatch)
        wiring.connect(m, ddr.done, wiring.flipped(self.done))
        if p.slice_table:
            wiring.connect(m, wiring.flipped(self.slices), ddr.slices)
        m.d.comb += [
            self.tokens.ready.eq(1),
            ddr.ddr_stall.eq(self.ddr_stall),
            *(
                [ddr.tokens.valid.eq(self.tokens.valid), ddr.tokens.payload.eq(self.tokens.payload)]
                if p.hot_window
                else []
            ),
            self.bad_dispatch.eq(ddr.bad_dispatch),
            self.orphan.eq(ddr.orphan),
        ]
        busy = ddr.busy
        for c, ch in enumerate(chips):
            for d in range(4):
                nb = p.neighbour(c, d)
                if nb is None:
                    m.d.comb += [ch.link_out[d].ready.eq(0), ch.link_in[d].valid.eq(0)]
                else:
                    # chiplet c's output d feeds input OPPOSITE[d] of its neighbour
                    m.d.comb += [
                        chips[nb].link_in[OPPOSITE[d]].valid.eq(ch.link_out[d].valid),
                        chips[nb].link_in[OPPOSITE[d]].payload.eq(ch.link_out[d].payload),
                        ch.link_out[d].ready.eq(chips[nb].link_in[OPPOSITE[d]].ready),
                    ]
            m.d.comb += [
                ch.stall.eq(self.stall[4 * c : 4 * c + 4]),
                ch.tokens.valid.eq(self.tokens.valid & (self.tokens.payload.chiplet == c)),
                ch.tokens.payload.eq(self.tokens.payload),
                ddr.free[c].eq(ch.free),
                ddr.accept[c].eq(ch.accept),
                ch.resv_valid.eq(ddr.resv_valid[c]),
                ddr.resv_slot[c].eq(ch.resv_slot),
                ch.unhold_expert.eq(ddr.unhold_expert),
                ddr.retire_valid[c].eq(ch.event.valid & ch.event.final),
                ddr.retire_expert[c].eq(ch.event.expert),
            ]
            if p.ddr_channels == 1:
                # one channel: its load goes to the target chiplet; un-hold on the
                # pre-load's chiplet
                m.d.comb += [
                    ch.ddr_valid.eq(ddr.deliver_valid[0] & (ddr.deliver[0].target == c)),
                    ch.ddr.eq(ddr.deliver[0]),
                    ch.unhold_valid.eq(ddr.unhold_valid & (ddr.unhold_chiplet == c)),
                ]
            else:
                # a channel per chiplet: channel c delivers into chiplet c; a pre-load's
                # micro-slices may be anywhere, so every chiplet un-holds
                m.d.comb += [
                    ch.ddr_valid.eq(ddr.deliver_valid[c]),
                    ch.ddr.eq(ddr.deliver[c]),
                    ch.unhold_valid.eq(ddr.unhold_valid),
                ]
            busy = busy | ch.busy | (ch.occupancy != 0)
        m.d.comb += [
            self.events.eq(Cat(*[ch.event.as_value() for ch in chips])),
            self.occupancy.eq(Cat(*[ch.occupancy for ch in chips])),
            self.idle.eq(~busy),
        ]
        return m
