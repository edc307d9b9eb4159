from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.layouts import req_init_layout
from fsedp.params import SchedulerParams

__all__ = ["TokenBufferUnit"]


class TokenBufferUnit(wiring.Component):
    """Token buffering (Algorithm 2) for all ``R`` requests of the request table at once.

    State per request: QoS timer ``T_QoS`` (``qos_width`` bits) and forward-pass counter
    ``C_fw`` (``cfw_width`` bits), both saturating; reset to 0.  The decision rule is that of
    :mod:`fsedp.sw.token_buffer`.

    Members
    -------
    init : In(stream.Signature(req_init_layout))
        Admit request ``request`` with ``T_QoS = t_qos``, ``C_fw = 0``.  Ready unless
        ``decide`` is high.
    decide : In(1)
        One-cycle strobe: run Algorithm 2 for the requests in ``present``.
    present, cold_hit : In(R)
        Requests with records this round; requests touching a cold expert.
    defer : Out(R)
        Defer mask of the last decision, valid from the cycle after ``decide``.
    t_qos, c_fw : Out
        The request table, for observation.

    Latency: :attr:`latency` (1) cycle: a ``decide`` strobe of cycle 0 shows on ``defer``,
    ``t_qos`` and ``c_fw`` in cycle 1, an ``init`` transfer on ``t_qos``/``c_fw`` likewise.
    Throughput: one decision or one admission per cycle.
    """

    def __init__(self, p: SchedulerParams):
        self.p = p
        R = p.requests
        super().__init__(
            {
                "init": In(stream.Signature(req_init_layout(p))),
                "decide": In(1),
                "present": In(R),
                "cold_hit": In(R),
                "defer": Out(R),
                "t_qos": Out(data.ArrayLayout(p.qos_width, R)),
                "c_fw": Out(data.ArrayLayout(p.cfw_width, R)),
            }
        )

    @property
    def latency(self) -> int:
        """Cycles from ``decide`` (cycle 0) to its ``defer`` mask (cycle ``latency``)."""
        return 1

    def elaborate(self, platform):
        m = Module()
        p = self.p
        m.d.comb += self.init.ready.eq(~self.decide)
        with m.If(self.decide):
            for r in range(p.requests):
                t, c = self.t_qos[r], self.c_fw[r]
                refill = c >= p.n_threshold
                t1 = Signal(p.qos_width, name=f"t1_{r}")
                m.d.comb += t1.eq(Mux(refill, Mux(t == p.qos_max, t, t + 1), t))
                c1 = Mux(refill, 0, c)
                go = self.cold_hit[r] & (t1 != 0)
                with m.If(self.present[r]):
                    m.d.sync += self.defer[r].eq(go)
                    with m.If(go):
                        m.d.sync += [t.eq(t1 - 1), c.eq(0)]
                    with m.Else():
                        m.d.sync += [t.eq(t1), c.eq(Mux(c1 == p.cfw_max, c1, c1 + 1))]
                with m.Else():
                    m.d.sync += self.defer[r].eq(0)
        with m.Elif(self.init.valid):
            for r in range(p.requests):
                with m.If(self.init.payload.request == r):
                    m.d.sync += [self.t_qos[r].eq(self.init.payload.t_qos), self.c_fw[r].eq(0)]
        return m
