from amaranth import Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.common import sat_add, tree_sum
from fsedp.hw.layouts import entry_layout, record_layout
from fsedp.params import SchedulerParams

__all__ = ["EIT"]


class EIT(wiring.Component):
    """Expert Information Table, kept merged while gate records arrive.

    Two views of the same table:

    * **Per (request, expert)** entries (trajectory mask, token count) in single-cycle SRAM:
      one bank per request, split into ``W = p.eit_lanes`` sub-banks by ``expert mod W``, so
      one read returns ``W`` experts.  An entry counts only while its *presence* bit is set;
      presence bits are flip-flops, cleared in one cycle, so the SRAM is never cleared.
    * **Per expert** registers, updated by every record: the merged count (saturating sum
      over requests of their saturating counts), the merged trajectory mask and the presence
      vector over requests.  They are what the sorter and token buffering read, so a round's
      merged view is ready two cycles after its last record (no scan).

    A deferral round (:class:`fsedp.hw.token_buffer.TokenBufferUnit` deferred some requests)
    re-merges the experts over the requests in ``merge_include``, ``W`` experts per cycle.
    Behaviour on overflow and bad input is that of :class:`fsedp.sw.eit.EIT`: the sticky
    ``overflow`` flag is raised by a saturating per-request increment or a saturating merged
    count (the golden model's scan over all requests), ``bad_record`` by a record out of
    range (dropped).

    Members
    -------
    rec : In(stream.Signature(record_layout)), always ready
        Gate records, one per cycle.  Do not merge in the same cycle.
    flags_clear : In(1)
        Clears the sticky flags (the start of a round).
    clear : In(1)
        Empties the table (merged registers and presence) at the next edge.
    merge_en, merge_addr, merge_include : In
        Re-merge experts ``merge_addr*W .. merge_addr*W + W - 1`` over the requests in
        ``merge_include``; the merged registers take the result two edges later.
    count : Out(ArrayLayout(count_width, E)), mask : Out(ArrayLayout(C, E))
        Merged count and trajectory mask per expert.
    present, cold_hit : Out(R)
        Requests with a token on some expert; requests with a token on a cold expert
        (``0 < count < theta_min``).  Registered: they follow the merged registers one cycle
        later.
    overflow, bad_record : Out(1)
        Sticky: a count saturated; a record was out of range and dropped.

    Latency: :attr:`latency` (2) cycles: a record transferred in cycle 0 (or a merge of word
    ``a`` issued in cycle 0) is in ``count``/``mask`` from cycle 2, and in ``present`` and
    ``cold_hit`` from cycle 3.  Throughput: one record or one merge per cycle.
    """

    def __init__(self, p: SchedulerParams):
        self.p = p
        E, C, R = p.experts, p.chiplets, p.requests
        super().__init__(
            {
                "rec": In(stream.Signature(record_layout(p), always_ready=True)),
                "flags_clear": In(1),
                "clear": In(1),
                "merge_en": In(1),
                "merge_addr": In(range(self.words)),
                "merge_include": In(R),
                "count": Out(data.ArrayLayout(p.count_width, E)),
                "mask": Out(data.ArrayLayout(C, E)),
                "present": Out(R),
                "cold_hit": Out(R),
                "overflow": Out(1),
                "bad_record": Out(1),
            }
        )

    @property
    def latency(self) -> int:
        """Cycles from a record's transfer (cycle 0) to the first cycle in which it counts
        in ``count``/``mask``: the per-request read-modify-write, then the merged registers."""
        return 2

    @property
    def words(self) -> int:
        """Words per sub-bank: ``ceil(E / W)``."""
        return -(-self.p.experts // self.p.eit_lanes)

    def elaborate(self, platform):
        m = Module()
        p = self.p
        E, R, W = p.experts, p.requests, p.eit_lanes
        lane_bits = W.bit_length() - 1
        layout = entry_layout(p)
        rec = self.rec.payload

        ok = (rec.request < p.requests) & (rec.chiplet < p.chiplets) & (rec.expert < E)
        take = self.rec.valid & ok
        bad_now = self.rec.valid & ~ok

        presence = [Signal(R, name=f"present{e}") for e in range(E)]

        # stage 1 -> 2 of the read-modify-write, and of the merge
        w_valid = Signal()
        w_req = Signal.like(rec.request)
        w_chip = Signal.like(rec.chiplet)
        w_exp = Signal(p.expert_bits)
        g_valid = Signal()
        g_addr = Signal.like(self.merge_addr)
        g_include = Signal(R)
        m.d.sync += [
            w_valid.eq(take & ~self.clear),
            w_req.eq(rec.request),
            w_chip.eq(rec.chiplet),
            w_exp.eq(rec.expert),
            g_valid.eq(self.merge_en),
            g_addr.eq(self.merge_addr),
            g_include.eq(self.merge_include),
        ]
        w_lane = w_exp[:lane_bits] if lane_bits else 0
        w_word = w_exp[lane_bits:]
        rd_word = Mux(self.merge_en, self.merge_addr, rec.expert[lane_bits:])

        # presence of the record's (request, expert) and the merged count it adds to
        w_present = Signal(R)
        w_total = Signal(p.count_width)
        w_mask = Signal(p.chiplets)
        with m.Switch(w_exp):
            for e in range(E):
                with m.Case(e):
                    m.d.comb += [
                        w_present.eq(presence[e]),
                        w_total.eq(self.count[e]),
                        w_mask.eq(self.mask[e]),
                    ]
        # presence of the experts of the word being re-merged, per lane
        g_present = [Signal(R, name=f"merge_present{j}") for j in range(W)]
        with m.Switch(g_addr):
            for word in range(self.words):
                with m.Case(word):
                    for j in range(W):
                        if word * W + j < E:
                            m.d.comb += g_present[j].eq(presence[word * W + j])

        overflow_now = Signal()
        old = Signal(layout)  # the record's entry before this record
        reads = [[None] * W for _ in range(R)]
        for r in range(R):
            for j in range(W):
                mem = memory.Memory(shape=layout, depth=self.words, init=[])
                m.submodules[f"bank{r}_{j}"] = mem
                wp = mem.write_port()
                rp = mem.read_port(transparent_for=(wp,))
                m.d.comb += rp.addr.eq(rd_word)
                reads[r][j] = rp.data
                hit = w_valid & (w_req == r) & (w_lane == j)
                with m.If(hit):
                    m.d.comb += old.eq(Mux(w_present[r], rp.data.as_value(), 0))
                m.d.comb += [
                    wp.addr.eq(w_word),
                    wp.en.eq(hit),
                    wp.data.mask.eq(old.mask | (1 << w_chip)),
                    wp.data.count.eq(Mux(old.count == p.count_max, old.count, old.count + 1)),
                ]
        full = old.count == p.count_max
        total_full = w_total == p.count_max
        with m.If(w_valid & (full | total_full)):
            m.d.comb += overflow_now.eq(1)

        # the record's new merged values (one adder, shared by every expert)
        new_total = Signal(p.count_width)
        new_mask = Signal(p.chiplets)
        new_present = Signal(R)
        m.d.comb += [
            new_total.eq(Mux(full | total_full, w_total, w_total + 1)),
            new_mask.eq(w_mask | (1 << w_chip)),
            new_present.eq(w_present | (1 << w_req)),
        ]
        # the re-merged values of the word's W experts (W adder trees over R requests)
        g_count, g_mask = [], []
        for j in range(W):
            terms, mask = [], 0
            for r in range(R):
                use = g_include[r] & g_present[j][r]
                terms.append(Mux(use, reads[r][j].count, 0))
                mask = mask | Mux(use, reads[r][j].mask, 0)
            count, _ = sat_add(tree_sum(terms), 0, p.count_max)
            g_count.append(Signal(p.count_width, name=f"merge_count{j}"))
            g_mask.append(Signal(p.chiplets, name=f"merge_mask{j}"))
            m.d.comb += [g_count[j].eq(count), g_mask[j].eq(mask)]

        # merged registers: one record (stage 2) or one merge word at a time
        for e in range(E):
            word, lane = divmod(e, W)
            with m.If(self.clear):
                m.d.sync += [self.count[e].eq(0), self.mask[e].eq(0), presence[e].eq(0)]
            with m.Elif(w_valid & (w_exp == e)):
                m.d.sync += [
                    self.count[e].eq(new_total),
                    self.mask[e].eq(new_mask),
                    presence[e].eq(new_present),
                ]
            with m.Elif(g_valid & (g_addr == word)):
                m.d.sync += [self.count[e].eq(g_count[lane]), self.mask[e].eq(g_mask[lane])]

        present, cold_hit = 0, 0
        for e in range(E):
            c = self.count[e]
            cold = (c != 0) & (c < p.theta_min) if p.theta_min > 1 else 0
            present = present | presence[e]
            cold_hit = cold_hit | Mux(cold, presence[e], 0)
        m.d.sync += [self.present.eq(present), self.cold_hit.eq(cold_hit)]

        with m.If(self.flags_clear):
            m.d.sync += [self.overflow.eq(overflow_now), self.bad_record.eq(bad_now)]
        with m.Else():
            m.d.sync += [
                self.overflow.eq(self.overflow | overflow_now),
                self.bad_record.eq(self.bad_record | bad_now),
            ]
        return m
