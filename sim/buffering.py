"""Ablation A5: token buffering (FSE-DP Algorithm 2) across the iterations of a run, with
the host keeping every request within its QoS slack.

The scheduler golden model (and its request table) persists over the run.  A request that
Algorithm 2 defers at layer ``l`` of iteration ``i`` pauses there: its gate records of layers
``l ..`` of ``i`` join the same layers of iteration ``i + 1``; what is still deferred after the
last iteration runs at the end (the *flush*), so every token is computed.

Decisions where the paper is silent (``docs/simulator.md#a5-token-buffering``):

* **Request identity.**  The request table holds requests, not window positions: a request
  keeps its slot from its first token until its last record is computed.  A window whose
  requests and the previous window's would not fit the table together runs without
  buffering (the host clears the timers, below), so carried work always has a slot.
* **QoS slack.**  A request's *baseline* completion is the end of the last iteration holding
  one of its tokens (``b_r``); its *latency* ``L_r`` is that minus the start of its first
  iteration; the *delay* buffering adds is how much later its last record is computed.  With
  ``slack`` (20 %) the host guarantees ``delay <= slack x L_r``: deferring a request before
  its last iteration costs it nothing (the carried records run with its own next tokens);
  from its last iteration on, the host lets Algorithm 2 defer it only while its delay so far
  plus a conservative cost of one more deferral (1.25 x the longest iteration so far) stays
  within the slack; otherwise it clears the request's ``T_QoS`` and ``C_fw`` with a
  ``req_init`` beat before the layer -- the interface the scheduler RTL already has.
* **Time.**  Every layer takes its MoE cycles plus its dense part (attention and shared
  experts) for the tokens it holds; a flush layer likewise.
"""

import dataclasses

import numpy as np

from fsedp.sim.result import LayerResult
from fsedp.sim.setup import Setup

__all__ = ["TokenBuffering", "SLACK"]

#: QoS slack of a request: the share of its latency that buffering may add (the paper's 20 %).
SLACK = 0.2


class TokenBuffering:
    """Runs A5 over the layers of a run, in order (:meth:`layer`), then :meth:`flush`."""

    def __init__(self, setup: Setup, layers, slack: float = SLACK):
        from fsedp.sim.fsedp import a5_params
        from fsedp.sw.scheduler import Scheduler

        self.setup = setup
        self.slack = slack
        self.sched = Scheduler(a5_params(setup, slack))
        self.depth = self.sched.p.requests
        self.per_iter = max(1, sum(1 for l in layers if l.iteration == layers[0].iteration))
        # a_r, b_r: first and last iteration holding a token of request r
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.window: dict[int, set] = {}
        for l in layers:
            ids = set(l.requests.values())
            self.window.setdefault(l.iteration, set()).update(ids)
            for r in ids:
                self.first.setdefault(r, l.iteration)
                self.last[r] = l.iteration
        self.slot: dict[int, int] = {}  # request id -> table slot
        self.carry: dict[int, list] = {}  # layer -> (request id, chiplet, expert) carried in
        self.next_carry: dict[int, list] = {}
        self.paused: set = set()  # requests paused in this iteration
        self.iteration = None
        self.now = 0  # cycles since the start of the run
        self.iter_start: dict[int, int] = {}
        self.iter_end: dict[int, int] = {}
        self.longest = 0  # longest iteration so far
        self.done_at: dict[int, int] = {}  # request id -> cycle its last record was computed
        self.deferrals = 0
        self.layers_done = 0  # layers of the running iteration so far

    # -- the host ---------------------------------------------------------------------
    def _begin_iteration(self, i: int):
        if self.iteration is not None:
            self.iter_end[self.iteration] = self.now
            self.longest = max(self.longest, self.now - self.iter_start[self.iteration])
        self.iteration = i
        self.iter_start[i] = self.now
        self.layers_done = 0
        self.carry, self.next_carry, self.paused = self.next_carry, {}, set()
        # free the slots of requests with nothing left; admit this window's new ones
        pending = {r for recs in self.carry.values() for r, _, _ in recs}
        for r in list(self.slot):
            if r not in pending and self.last[r] < i:
                del self.slot[r]
        for r in sorted(self.window.get(i, ()), key=lambda r: (self.first[r], r)):
            if r not in self.slot:
                free = min(set(range(self.depth)) - set(self.slot.values()))
                self.slot[r] = free
                self.sched.init_request(free, self.setup.cfg.scheduler.t_qos_init)
        # buffering only when whatever is carried out of this window still fits the table
        self.buffering = len(set(self.slot) | self.window.get(i + 1, set())) <= self.depth

    def _may_defer(self, r: int, i: int) -> bool:
        if not self.buffering:
            return False
        if i < self.last[r]:
            return True  # its next tokens come later anyway
        elapsed = self.now - self.iter_start[i]
        projected = elapsed * self.per_iter / self.layers_done if self.layers_done else 0
        one = max(self.longest, projected)  # an iteration, as long as the longest so far
        end = self.iter_end.get(self.last[r])
        if end is None:  # its last iteration is the running one
            end = self.iter_start[i] + one
        latency = end - self.iter_start[self.first[r]]
        delay = max(0, self.now - end)
        return delay + 1.25 * one <= self.slack * latency

    # -- layers -------------------------------------------------------------------------
    def layer(self, lay) -> LayerResult:
        from fsedp.sim.fsedp import fsedp_layer

        if lay.iteration != self.iteration:
            self._begin_iteration(lay.iteration)
        i = lay.iteration
        records = self.carry.pop(lay.layer, []) + [
            (lay.requests[s], c, e) for s, c, e in lay.records
        ]
        live = [x for x in records if x[0] not in self.paused]
        held = [x for x in records if x[0] in self.paused]
        for r in {x[0] for x in live}:
            if not self._may_defer(r, i):
                self.sched.init_request(self.slot[r], 0)  # no buffering opportunity
        by_slot = {self.slot[r]: r for r in {x[0] for x in live}}
        res = fsedp_layer(
            self.setup, [(self.slot[r], c, e) for r, c, e in live], "A5", sched=self.sched
        )
        deferred = {by_slot[s] for s in by_slot if res.defer >> s & 1}
        self.deferrals += len(deferred)
        self.paused |= deferred
        held += [x for x in live if x[0] in deferred]
        if held:
            self.next_carry.setdefault(lay.layer, []).extend(held)
        ran = {x[0] for x in live if x[0] not in deferred}
        self._advance(res, live)
        self.layers_done += 1
        for r in ran:
            self.done_at[r] = self.now
        return res

    def _advance(self, res: LayerResult, records):
        """The clock moves by a layer: its MoE cycles and the dense part of its tokens."""
        tokens = len(records) // self.setup.cfg.model.top_k
        self.now += res.cycles + self.setup.dense_cycles(tokens)

    def flush(self) -> list[LayerResult]:
        """What is still deferred after the last iteration, run without buffering."""
        from fsedp.sim.fsedp import fsedp_layer

        if self.iteration is not None:
            self.iter_end[self.iteration] = self.now
        out = []
        for layer in sorted(set(self.carry) | set(self.next_carry)):
            recs = self.carry.get(layer, []) + self.next_carry.get(layer, [])
            if not recs:
                continue
            slots = {r: k % self.depth for k, r in enumerate(sorted({x[0] for x in recs}))}
            res = fsedp_layer(self.setup, [(slots[r], c, e) for r, c, e in recs], "A3")
            out.append(dataclasses.replace(res, strategy="FSE-DP A5 (flush)"))
            self._advance(res, recs)
            for r in {x[0] for x in recs}:
                self.done_at[r] = self.now
        self.carry, self.next_carry = {}, {}
        return out

    # -- the report -----------------------------------------------------------------------
    def qos(self) -> dict:
        """Per request: the delay buffering added and its slack (``slack x L_r``), in us;
        ``violations`` counts requests delayed beyond their slack (the host keeps it 0)."""
        ns = self.setup.ns_per_cycle
        delays, slacks, ratios = [], [], []
        for r, b in self.last.items():
            end = self.iter_end[b]
            latency = end - self.iter_start[self.first[r]]
            delay = max(0, self.done_at.get(r, end) - end)
            delays.append(delay)
            slacks.append(self.slack * latency)
            ratios.append(delay / (self.slack * latency) if latency else 0.0)

        def stats(xs):
            a = np.asarray(xs, dtype=float) * ns / 1000
            return {
                "mean": round(float(a.mean()), 2),
                "p99": round(float(np.percentile(a, 99)), 2),
                "max": round(float(a.max()), 2),
            }

        return {
            "requests": len(delays),
            "deferrals": self.deferrals,
            "delayed": sum(d > 0 for d in delays),
            "delay_us": stats(delays),
            "slack_us": stats(slacks),
            "delay_over_slack_max": round(max(ratios), 3),
            "violations": sum(x > 1 + 1e-9 for x in ratios),
        }
