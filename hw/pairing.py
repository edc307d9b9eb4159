from amaranth import Module, Mux, Signal, signed
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.layouts import key_layout
from fsedp.params import SchedulerParams

__all__ = ["PairingUnit"]


class PairingUnit(wiring.Component):
    """Paired-load order over the sorter's output, read in place (no copy of the list).

    Position ``k`` of the order maps to sorted index ``k/2`` for even ``k`` and
    ``n-1-(k-1)/2`` for odd ``k`` (:func:`fsedp.sw.pairing.paired_index`); the pair partner
    of ``k`` is ``k ^ 1`` when it is below ``n``.  ``cold`` applies ``theta_min``.

    Members
    -------
    keys : In(ArrayLayout(key, N))
        The sorter's output vector (descending count).
    n : In(position_bits)
        Number of experts with a non-zero count.
    position : In(position_bits)
        Position in the paired order to look up.
    expert, count, cold : Out
        The expert at ``position``, its token count, and ``0 < count < theta_min``.
    partner : Out(position_bits), partner_valid : Out(1)
        Position of the other member of the pair.

    start : In(1), built : Out(1)
        With ``p.balance`` (the balanced order, decision 27; ablation A6): a pulse on
        ``start`` builds the order table from ``keys`` and ``n``, one position per cycle;
        ``built`` is high from ``n`` cycles after the pulse (at once for ``n = 0``) until the
        next one.  Without ``balance`` ``built`` is always high and ``start`` is ignored.

    Lookups are combinational (an N:1 multiplexer, and with ``balance`` a read of the order
    table): latency 0.
    """

    def __init__(self, p: SchedulerParams):
        self.p = p
        P = p.position_bits
        super().__init__(
            {
                "keys": In(data.ArrayLayout(key_layout(p), p.sorter_lanes)),
                "n": In(P),
                "position": In(P),
                "expert": Out(p.lane_id_bits),
                "count": Out(p.count_width),
                "cold": Out(1),
                "partner": Out(P),
                "partner_valid": Out(1),
                "start": In(1),
                "built": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        p = self.p
        if p.balance:
            index = self._balanced(m)
        else:
            half = self.position >> 1
            index = Mux(self.position[0], self.n - 1 - half, half)
            m.d.comb += self.built.eq(1)
        key = self.keys[index[: self.p.lane_id_bits]]
        partner = self.position ^ 1
        m.d.comb += [
            self.expert.eq(key.id),
            self.count.eq(key.count),
            self.cold.eq((key.count != 0) & (key.count < self.p.theta_min)),
            self.partner.eq(partner),
            self.partner_valid.eq(partner < self.n),
        ]
        return m

    def _balanced(self, m):
        """The order table of the balanced order and its builder; returns the sorted index
        at ``position``."""
        p = self.p
        lanes, P = p.sorter_lanes, p.position_bits
        m.submodules.order = order = memory.Memory(shape=p.lane_id_bits, depth=lanes, init=[])
        w = order.write_port()
        r = order.read_port(domain="comb")
        m.d.comb += r.addr.eq(self.position)
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
        m.d.comb += [
            take_hot.eq((surplus <= 0) | (cold_count >= p.balance)),
            pick.eq(Mux(take_hot, hot, cold[: P + 1])),
            self.built.eq(~busy),
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
            ]
            with m.If(take_hot):
                m.d.sync += hot.eq(hot + 1)
            with m.Else():
                m.d.sync += cold.eq(cold - 1)
        return r.data
