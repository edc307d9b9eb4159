from amaranth import Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.common import sat_add
from fsedp.hw.layouts import entry_layout, record_layout
from fsedp.params import SchedulerParams

__all__ = ["EIT"]


class EIT(wiring.Component):
    """Expert Information Table: one single-cycle SRAM bank per request, ``E`` entries each
    (trajectory mask and token count, :func:`fsedp.hw.layouts.entry_layout`).

    Records are accumulated by a read-modify-write pipeline whose read port is transparent to
    the write port, so back-to-back records on the same entry need no stall.  A scan reads
    one expert from every bank and merges the requests in ``scan_include``: saturating sum of
    counts, OR of masks, and the bit-vector of requests present on the expert.  Behaviour on
    overflow and bad input is that of :class:`fsedp.sw.eit.EIT`.

    Members
    -------
    rec : In(stream.Signature(record_layout))
        Gate records; always ready (one per cycle).  Do not scan in the same cycle.
    scan_en, scan_addr, scan_include, scan_clear : In
        Start a scan of expert ``scan_addr``; with ``scan_clear`` the entries of every bank
        are zeroed one cycle later (after the read).
    scan_valid, scan_count, scan_mask, scan_present : Out
        Scan result, latency 1.
    flags_clear : In(1)
        Clears the sticky flags (the start of a round).
    overflow, bad_record : Out(1)
        Sticky: a count saturated; a record was out of range and dropped.

    Throughput: one record or one scan per cycle.
    """

    def __init__(self, p: SchedulerParams):
        self.p = p
        super().__init__(
            {
                "rec": In(stream.Signature(record_layout(p))),
                "scan_en": In(1),
                "scan_addr": In(p.expert_bits),
                "scan_include": In(p.requests),
                "scan_clear": In(1),
                "scan_valid": Out(1),
                "scan_count": Out(p.count_width),
                "scan_mask": Out(p.chiplets),
                "scan_present": Out(p.requests),
                "flags_clear": In(1),
                "overflow": Out(1),
                "bad_record": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        p = self.p
        layout = entry_layout(p)
        rec = self.rec.payload
        m.d.comb += self.rec.ready.eq(1)

        ok = (rec.request < p.requests) & (rec.chiplet < p.chiplets) & (rec.expert < p.experts)
        take = self.rec.valid & ok
        bad_now = self.rec.valid & ~ok

        # stage 1 -> 2 of the read-modify-write and of the scan
        w_valid = Signal()
        w_req = Signal.like(rec.request)
        w_chip = Signal.like(rec.chiplet)
        w_addr = Signal(p.expert_bits)
        s_valid, s_clear = Signal(), Signal()
        s_addr = Signal(p.expert_bits)
        s_include = Signal(p.requests)
        m.d.sync += [
            w_valid.eq(take),
            w_req.eq(rec.request),
            w_chip.eq(rec.chiplet),
            w_addr.eq(rec.expert),
            s_valid.eq(self.scan_en),
            s_clear.eq(self.scan_en & self.scan_clear),
            s_addr.eq(self.scan_addr),
            s_include.eq(self.scan_include),
        ]

        overflow_now = Signal()
        entries = []
        for r in range(p.requests):
            mem = memory.Memory(shape=layout, depth=p.experts, init=[])
            m.submodules[f"bank{r}"] = mem
            wp = mem.write_port()
            rp = mem.read_port(transparent_for=(wp,))
            m.d.comb += rp.addr.eq(Mux(self.scan_en, self.scan_addr, rec.expert))
            entries.append(rp.data)
            hit = w_valid & (w_req == r)
            full = rp.data.count == p.count_max
            with m.If(s_clear):
                m.d.comb += [wp.addr.eq(s_addr), wp.en.eq(1), wp.data.eq(0)]
            with m.Elif(hit):
                m.d.comb += [
                    wp.addr.eq(w_addr),
                    wp.en.eq(1),
                    wp.data.mask.eq(rp.data.mask | (1 << w_chip)),
                    wp.data.count.eq(Mux(full, rp.data.count, rp.data.count + 1)),
                ]
            with m.If(hit & full):
                m.d.comb += overflow_now.eq(1)

        total = 0
        mask = 0
        present = []
        for r, entry in enumerate(entries):
            inc = s_include[r]
            total = total + Mux(inc, entry.count, 0)
            mask = mask | Mux(inc, entry.mask, 0)
            present.append(entry.count != 0)
        count, over = sat_add(total, 0, p.count_max)
        m.d.comb += [
            self.scan_valid.eq(s_valid),
            self.scan_count.eq(count),
            self.scan_mask.eq(mask),
            self.scan_present.eq(sum((bit << r for r, bit in enumerate(present)), 0)),
        ]
        with m.If(s_valid & over):
            m.d.comb += overflow_now.eq(1)

        with m.If(self.flags_clear):
            m.d.sync += [self.overflow.eq(overflow_now), self.bad_record.eq(bad_now)]
        with m.Else():
            m.d.sync += [
                self.overflow.eq(self.overflow | overflow_now),
                self.bad_record.eq(self.bad_record | bad_now),
            ]
        return m
