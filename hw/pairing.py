from amaranth import Array, Module, Mux, Signal, signed
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.layouts import key_layout
from fsedp.params import SchedulerParams

__all__ = ["PairingUnit"]


class PairingUnit(wiring.Component):
    """Where each expert of the sorted list stands in the dispatch order, for the
    scheduler's eligibility search (``docs/blocks/pairing.md``).

    The order takes experts from both ends of the sorted list: the ones below ``split``
    (sorted indices ``0 .. split-1``) from the hot end in ascending index, the others from
    the cold end in descending index.  So among eligible experts the first in the order is
    either the lowest eligible one below ``split`` or the highest eligible one at or above
    it: the scheduler finds both with two priority encoders and asks this unit for their
    positions.

    * Paired order (Algorithm 1): ``split = ceil(n/2)``, position ``2i`` below it and
      ``2(n-1-i)+1`` above it; the partner of index ``i`` is ``n-1-i`` (none for the lone
      middle expert of an odd ``n``).
    * Balanced order (``p.balance``, decision 27): built after the sort, one position per
      cycle, into an order table (position -> index) and its inverse (index -> position);
      the partner of index ``i`` is the expert at position ``pos(i) ^ 1``.

    Members
    -------
    keys : In(ArrayLayout(key, N))
        The sorter's output (descending count).
    n : In(position_bits)
        Experts with a non-zero count.
    hot_index, cold_index : In(lane_id_bits)
        Candidates of the hot and the cold end.
    hot_position, cold_position : Out(position_bits)
        Their positions in the order.
    index : In(lane_id_bits)
        An expert whose partner is wanted.
    partner : Out(lane_id_bits), partner_valid : Out(1)
        The other member of its pair.
    split : Out(lane_id_bits + 1)
        Sorted indices below it come from the hot end.
    start : In(1), built : Out(1)
        With ``p.balance``: a pulse on ``start`` builds the order from ``keys`` and ``n``;
        ``built`` is high from ``n`` cycles after the pulse (at once for ``n = 0``) until
        the next one.  Without ``balance`` ``built`` is always high.

    Lookups are combinational: latency 0.
    """

    def __init__(self, p: SchedulerParams):
        self.p = p
        P, L = p.position_bits, p.lane_id_bits
        super().__init__(
            {
                "keys": In(data.ArrayLayout(key_layout(p), p.sorter_lanes)),
                "n": In(P),
                "hot_index": In(L),
                "cold_index": In(L),
                "hot_position": Out(P),
                "cold_position": Out(P),
                "index": In(L),
                "partner": Out(L),
                "partner_valid": Out(1),
                "split": Out(L + 1),
                "start": In(1),
                "built": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        if self.p.balance:
            self._balanced(m)
            return m
        n = self.n
        other = n - 1 - self.index
        m.d.comb += [
            self.split.eq((n + 1) >> 1),
            self.hot_position.eq(self.hot_index << 1),
            self.cold_position.eq(((n - 1 - self.cold_index) << 1) | 1),
            self.partner.eq(other),
            self.partner_valid.eq((self.index < n) & (other != self.index)),
            self.built.eq(1),
        ]
        return m

    def _balanced(self, m):
        """The order table, its inverse and their builder (:func:`fsedp.sw.pairing.balanced_order`
        one position per cycle)."""
        p = self.p
        lanes, P = p.sorter_lanes, p.position_bits
        m.submodules.order = order = memory.Memory(shape=p.lane_id_bits, depth=lanes, init=[])
        w = order.write_port()
        r = order.read_port(domain="comb")
        inverse = Array(Signal(P, name=f"pos{i}") for i in range(lanes))
        # surplus of tokens over the balance point of the experts taken so far
        width = P + max(p.count_width, p.balance.bit_length()) + 2
        surplus = Signal(signed(width))
        hot = Signal(P + 1)  # next index from the hot end
        cold = Signal(signed(P + 2))  # next index from the cold end
        pos = Signal(P + 1)
        busy = Signal()
        take_hot = Signal()
        pick = Signal(P + 1)
        cold_count = self.keys[cold[: p.lane_id_bits]].count
        mine = inverse[self.index]
        m.d.comb += [
            take_hot.eq((surplus <= 0) | (cold_count >= p.balance)),
            pick.eq(Mux(take_hot, hot, cold[: P + 1])),
            self.built.eq(~busy),
            self.split.eq(hot),
            self.hot_position.eq(inverse[self.hot_index]),
            self.cold_position.eq(inverse[self.cold_index]),
            r.addr.eq(mine ^ 1),
            self.partner.eq(r.data),
            self.partner_valid.eq((self.index < self.n) & ((mine ^ 1) < self.n)),
        ]
        picked = self.keys[pick[: p.lane_id_bits]].count
        with m.If(self.start):
            m.d.sync += [
                surplus.eq(0),
                hot.eq(0),
                cold.eq(self.n - 1),
                pos.eq(0),
                busy.eq(self.n != 0),
            ]
        with m.Elif(busy):
            m.d.comb += [w.en.eq(1), w.addr.eq(pos), w.data.eq(pick)]
            m.d.sync += [
                surplus.eq(surplus + picked - p.balance),
                pos.eq(pos + 1),
                busy.eq(pos + 1 != self.n),
                inverse[pick[: p.lane_id_bits]].eq(pos),
            ]
            with m.If(take_hot):
                m.d.sync += hot.eq(hot + 1)
            with m.Else():
                m.d.sync += cold.eq(cold - 1)
