"""A ``rows x cols`` chiplet array with its DDR controller: the datapath the scheduler's
dispatch stream drives.

Golden model: :class:`fsedp.sw.streaming.StreamingArray`.  Testbench:
``tb/tb_chiplet_array.py``.  Doc page: ``docs/blocks/datapath.md``.
"""

from amaranth import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.chiplet import Chiplet
from fsedp.hw.common import check_chiplet
from fsedp.hw.ddr_ctrl import DDRController
from fsedp.hw.layouts import dispatch_layout, events_layout, slices_layout, tokens_layout
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
    stall : In(ArrayLayout(4, chiplets))
        ``stall[c]`` bit ``d``: chiplet ``c``'s output link ``d`` (N/E/S/W) may not start a
        transfer this cycle (bit ``4 c + d`` of the port).  Test hook; tie to 0 in a product.
    ddr_stall : In(1)
        DDR busy this cycle.  Test hook; tie to 0 in a product.
    events : Out(ArrayLayout(event_layout, chiplets))
        Per chiplet, the compute completion of this cycle (observation).
    occupancy : Out(ArrayLayout(free_bits, chiplets))
        Per chiplet, allocated ring-buffer slots (observation).
    idle : Out(1)
        No job, pre-load, load, micro-slice or completion is left anywhere.
    bad_dispatch, orphan : Out(1)
        Sticky error flags (see :class:`DDRController`).

    Inside, ``wiring.connect`` joins every link output to its neighbour's opposite input
    (mesh-edge ports stay idle), each chiplet's reservation, delivery (one channel: valid on
    the target chiplet only), un-hold and retirement ports to the DDR controller's.

    Latency: a DDR load is delivered :attr:`DDRController.latency` cycles after its issue; a
    micro-slice crosses a link in ``link_cycles`` cycles.  Throughput: one dispatch beat
    per cycle (always ready); one load per ``ddr_interval`` cycles per DDR channel.
    """

    def __init__(self, p: DatapathParams):
        check_chiplet(self, p)
        self.p = p
        n = p.chiplets
        slices, st = slices_layout(p), p.slice_table
        super().__init__(
            {
                "dispatch": In(stream.Signature(dispatch_layout(p), always_ready=True)),
                "done": Out(stream.Signature(n)),
                "tokens": In(stream.Signature(tokens_layout(p), always_ready=True)),
                **({"slices": In(stream.Signature(slices, always_ready=True))} if st else {}),
                "stall": In(data.ArrayLayout(4, n)),
                "ddr_stall": In(1),
                "events": Out(events_layout(p)),
                "occupancy": Out(data.ArrayLayout(p.free_bits, n)),
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
        if p.hot_window:
            wiring.connect(m, wiring.flipped(self.tokens), ddr.tokens)
        m.d.comb += [
            ddr.ddr_stall.eq(self.ddr_stall),
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
                    wiring.connect(m, ch.link_out[d], chips[nb].link_in[OPPOSITE[d]])
            wiring.connect(m, ddr.resv[c], ch.resv)
            wiring.connect(m, ch.retire, ddr.retire[c])
            m.d.comb += [
                ch.stall.eq(self.stall[c]),
                ch.tokens.valid.eq(self.tokens.valid & (self.tokens.payload.chiplet == c)),
                ch.tokens.payload.eq(self.tokens.payload),
                ddr.free[c].eq(ch.free),
                *([ddr.admit[c].eq(ch.admit)] if p.admission == "forward-state" else []),
                self.events[c].eq(ch.event),
                self.occupancy[c].eq(ch.occupancy),
            ]
            if p.ddr_channels == 1:
                # one channel: its load goes to the target chiplet; un-hold on the
                # pre-load's chiplet
                load, unhold = ddr.deliver[0], ddr.unhold
                m.d.comb += [
                    ch.ddr.valid.eq(load.valid & (load.payload.target == c)),
                    ch.ddr.payload.eq(load.payload),
                    ch.unhold.valid.eq(unhold.valid & (unhold.payload.chiplet == c)),
                    ch.unhold.payload.eq(unhold.payload),
                ]
            else:
                # a channel per chiplet: channel c delivers into chiplet c; a pre-load's
                # micro-slices may be anywhere, so every chiplet un-holds
                wiring.connect(m, ddr.deliver[c], ch.ddr)
                wiring.connect(m, ddr.unhold, ch.unhold)
            busy = busy | ch.busy | (ch.occupancy != 0)
        m.d.comb += self.idle.eq(~busy)
        return m
