from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.layouts import key_layout
from fsedp.params import SchedulerParams
from fsedp.sw.sorter import bitonic_schedule, stage_count

__all__ = ["BitonicSorter"]


class BitonicSorter(wiring.Component):
    """Pipelined bitonic sorting network over ``p.sorter_lanes`` keys ``(count, id)``.

    Orders keys by descending count, ties to the lower id: lane 0 of the output holds the
    hottest expert.  The network is the compare-exchange schedule of
    :func:`fsedp.sw.sorter.bitonic_schedule`, the same one the golden model applies, with one
    register stage after every network stage.

    Parameters
    ----------
    p : SchedulerParams
        ``sorter_lanes`` (``E`` padded to a power of two) and ``count_width`` set the size.

    Members
    -------
    i : In(stream.Signature(ArrayLayout(key, N)))
        Unsorted keys.  ``i.ready`` is high whenever the pipeline can advance.
    o : Out(stream.Signature(ArrayLayout(key, N)))
        Sorted keys.  The pipeline stalls as a whole while ``o.valid & ~o.ready``; a vector
        held at the output stays valid and stable (the scheduler reads it in place).

    Latency is ``log2(N)*(log2(N)+1)/2`` cycles (one per stage); throughput one vector per
    cycle.
    """

    def __init__(self, p: SchedulerParams):
        self.p = p
        self.lanes = p.sorter_lanes
        self.schedule = bitonic_schedule(self.lanes)
        self.latency = stage_count(self.lanes)
        vec = data.ArrayLayout(key_layout(p), self.lanes)
        super().__init__({"i": In(stream.Signature(vec)), "o": Out(stream.Signature(vec))})

    def elaborate(self, platform):
        m = Module()
        vec = data.ArrayLayout(key_layout(self.p), self.lanes)
        advance = Signal()
        m.d.comb += [advance.eq(~self.o.valid | self.o.ready), self.i.ready.eq(advance)]

        lanes, valid = self.i.payload, self.i.valid
        for s, stage in enumerate(self.schedule):
            regs = Signal(vec, name=f"stage{s}")
            regs_valid = Signal(name=f"stage{s}_valid")
            with m.If(advance):
                m.d.sync += regs_valid.eq(valid)
                for a, b in stage:
                    x, y = lanes[a], lanes[b]
                    keep = (x.count > y.count) | ((x.count == y.count) & (x.id < y.id))
                    m.d.sync += [regs[a].eq(Mux(keep, x, y)), regs[b].eq(Mux(keep, y, x))]
            lanes, valid = regs, regs_valid
        m.d.comb += [self.o.payload.eq(lanes), self.o.valid.eq(valid)]
        return m
