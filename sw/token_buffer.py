"""Token buffering golden model (FSE-DP Algorithm 2) with its request table.

Per request ``r`` the table holds the QoS timer ``T_QoS(r)`` (``qos_width`` bits,
saturating) and the forward-pass counter ``C_fw(r)`` (wide enough for ``N_threshold``,
saturating).  Decisions taken once per round for every request *present* in the round
(at least one gate record), in this order::

    if C_fw(r) >= N_threshold:  T_QoS(r) += 1 (saturating); C_fw(r) = 0     # lines 2-5
    if cold_hit(r) and T_QoS(r) > 0:                                        # line 6
        defer r;  T_QoS(r) -= 1;  C_fw(r) = 0                               # lines 7-8
    else:
        C_fw(r) += 1 (saturating)

``cold_hit(r)``: some expert activated by r has ``0 < n_e < theta_min`` where ``n_e`` counts
the tokens of *all* requests present in the round (before any deferral).  ``C_fw`` counts
consecutive rounds in which the request was scheduled; a deferral restarts it.  Requests that
are absent from a round keep their state.  ``theta_min = 0`` never defers.

A deferred request's gate records are taken out of the layer: the EIT's merge scan excludes
its bank (the entries are cleared all the same) and the host re-presents its tokens in a later
iteration.
"""

from fsedp.params import SchedulerParams

__all__ = ["TokenBuffer"]


class TokenBuffer:
    def __init__(self, p: SchedulerParams):
        self.p = p
        self.reset()

    def reset(self):
        self.t_qos = [0] * self.p.requests
        self.c_fw = [0] * self.p.requests
        #: the paths of Algorithm 2 the last :meth:`decide` took (functional coverage)
        self.paths: set[str] = set()

    def init_request(self, request: int, t_qos: int):
        """Admit (or re-admit) a request: ``T_QoS = t_qos`` (saturated), ``C_fw = 0``.

        An id outside the table is ignored, as the RTL ignores the beat."""
        if not 0 <= request < self.p.requests:
            return
        self.t_qos[request] = min(t_qos, self.p.qos_max)
        self.c_fw[request] = 0

    def decide(self, present: int, cold_hit: int) -> int:
        """Run Algorithm 2 for every present request; return the defer bit-mask."""
        p = self.p
        defer = 0
        self.paths = set()
        for r in range(p.requests):
            if not present >> r & 1:
                continue
            t, c = self.t_qos[r], self.c_fw[r]
            if c >= p.n_threshold:
                self.paths.add("refill saturates" if t == p.qos_max else "refill")
                t = min(t + 1, p.qos_max)
                c = 0
            if cold_hit >> r & 1 and t > 0:
                self.paths.add("defer with C_fw > 0" if c else "defer")
                defer |= 1 << r
                t -= 1
                c = 0
            else:
                if cold_hit >> r & 1:
                    self.paths.add("cold hit, T_QoS 0")
                c = min(c + 1, p.cfw_max)
            self.t_qos[r], self.c_fw[r] = t, c
        return defer
