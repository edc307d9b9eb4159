from amaranth import Module, Mux
from amaranth.lib import data, wiring
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

    Purely combinational (an N:1 multiplexer): latency 0.
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
            }
        )

    def elaborate(self, platform):
        m = Module()
        half = self.position >> 1
        index = Mux(self.position[0], self.n - 1 - half, half)
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
