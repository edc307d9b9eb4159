"""Stimulus and checking shared by the scheduler's testbenches: the bench body
``tb/tb_scheduler.py`` (Amaranth's simulator, cocotb on Verilator and Icarus, ``fsedp rtl
rounds``/``cosim``) and the native Verilator driver ``tb/native.py``.

* :func:`random_round` makes one round of gate records with a long-tailed expert popularity,
  tokens sharded over chiplets and grouped into requests.
* :class:`DatapathModel` stands in for the chiplet array: every dispatched expert completes
  after a random number of cycles; due completions are merged into one mask per beat.
* :class:`RoundChecker` is the scoreboard: it replays the completions the RTL accepted into
  the golden model and compares every dispatch beat and the end-of-round status.
"""

import itertools
import json
import random
from collections import deque
from dataclasses import dataclass

from fsedp.params import SchedulerParams
from fsedp.sw.scheduler import Dispatch, Scheduler
from fsedp.workload import Round

__all__ = [
    "random_round",
    "make_rounds",
    "reset_span",
    "DatapathModel",
    "ScriptedDatapath",
    "RoundChecker",
    "Mismatch",
]


def zipf_weights(n: int, skew: float, rng: random.Random) -> list[float]:
    order = list(range(n))
    rng.shuffle(order)
    w = [0.0] * n
    for rank, e in enumerate(order):
        w[e] = 1.0 / (rank + 1) ** skew
    return w


def random_round(
    p: SchedulerParams,
    rng: random.Random,
    tokens: int | None = None,
    top_k: int | None = None,
    skew: float = 1.1,
    inits: bool = True,
) -> Round:
    """A random round: ``tokens`` tokens, each activating ``top_k`` distinct experts drawn
    from a Zipf-like popularity, each token on a random chiplet and in a random request."""
    tokens = tokens if tokens is not None else rng.randint(1, 4 * p.chiplets)
    top_k = min(top_k if top_k is not None else rng.randint(1, 4), p.experts)
    cum = list(itertools.accumulate(zipf_weights(p.experts, skew, rng)))
    experts = range(p.experts)
    records = []
    for _ in range(tokens):
        request = rng.randrange(p.requests)
        chiplet = rng.randrange(p.chiplets)
        chosen = set()
        while len(chosen) < top_k:
            chosen.add(rng.choices(experts, cum_weights=cum)[0])
        records += [(request, chiplet, e) for e in sorted(chosen)]
    req_inits = []
    if inits:
        for r in range(p.requests):
            if rng.random() < 0.3:
                req_inits.append((r, rng.randrange(p.qos_max + 1)))
    return Round(records, req_inits)


class DatapathModel:
    """Completes every dispatched expert some cycles after its dispatch beat.

    With ``per_token = 0`` the delay is uniform in ``0..max_delay`` (stress); otherwise it is
    ``ceil(count * per_token / |T_e|)`` plus that jitter: the expert's tokens spread over its
    trajectory's chiplets, ``per_token`` cycles each (a first-order compute model).
    """

    def __init__(self, chiplets: int, rng: random.Random, max_delay: int = 12, per_token: int = 0):
        self.rng = rng
        self.chiplets = chiplets
        self.max_delay = max_delay
        self.per_token = per_token
        self.due: dict[int, int] = {}  # slot -> cycle

    def on_dispatch(self, entry: int, now: int, count: int = 0, traj: int = 1):
        work = -(-count * self.per_token // max(1, bin(traj).count("1")))
        self.due[entry] = now + work + self.rng.randint(0, self.max_delay)

    def ready_mask(self, now: int) -> int:
        """Mask of every slot whose completion is due (several completions in one beat)."""
        return sum(1 << s for s, t in self.due.items() if t <= now)

    def on_done(self, mask: int):
        for s in range(self.chiplets):
            if mask >> s & 1:
                self.due.pop(s, None)


class ScriptedDatapath:
    """Replays a recorded sequence of completion masks (e.g. from the simulator): the next
    mask is presented as soon as every slot in it is running.  Because the scheduler's
    decisions are a function of the sequence of completion masks, the RTL fed this script
    must make the recorded decisions."""

    def __init__(self, chiplets: int, script: list[int]):
        self.chiplets = chiplets
        self.script = list(script)
        self.running = 0

    def on_dispatch(self, entry: int, now: int, count: int = 0, traj: int = 1):
        self.running |= 1 << entry

    def ready_mask(self, now: int) -> int:
        if self.script and self.script[0] & ~self.running == 0:
            return self.script[0]
        return 0

    def on_done(self, mask: int):
        self.running &= ~mask
        if self.script and self.script[0] == mask:
            self.script.pop(0)


@dataclass
class Mismatch:
    round: int
    what: str
    expected: object
    got: object

    def __str__(self):
        return f"round {self.round}: {self.what}: expected {self.expected}, got {self.got}"


class RoundChecker:
    """Scoreboard of the scheduler top against :class:`fsedp.sw.scheduler.Scheduler`."""

    def __init__(self, p: SchedulerParams, monitor=None):
        self.p = p
        self.monitor = monitor  # e.g. fsedp.tb.coverage.Coverage: sampled at every booking
        self.golden = Scheduler(p)
        self.pending: deque[Dispatch] = deque()
        self.mismatches: list[Mismatch] = []
        self.round = 0
        self.beats = 0
        self.plan = None

    def reset(self):
        self.golden.reset()
        self.pending.clear()

    def miss(self, what, expected, got):
        """Record a mismatch of the current round (a bench's own checks too)."""
        self.mismatches.append(Mismatch(self.round, what, expected, got))

    def init_request(self, request: int, t_qos: int):
        self.golden.init_request(request, t_qos)
        if self.monitor:
            self.monitor.init()

    def _decide(self):
        icv = self.golden.icv.value
        beats = self.golden.decide()
        self.pending.extend(beats)
        if self.monitor:
            self.monitor.decided(self.golden, icv, beats)

    def start_round(self, records):
        if self.monitor:
            self.monitor.before_start(self.golden)
        self.plan = self.golden.start_round(records)
        if self.monitor:
            self.monitor.after_start(self.golden, self.plan)
        self._decide()

    def on_dispatch(self, got: Dispatch):
        self.beats += 1
        exp = self.pending.popleft() if self.pending else None
        if exp != got:
            self.miss("dispatch beat", exp, got)

    def on_done(self, mask: int):
        if self.pending:
            self.miss("completion accepted while a decision was possible", list(self.pending), mask)
            self.pending.clear()
        if self.monitor:
            self.monitor.done(mask)
        self.golden.complete(mask)
        self._decide()

    def end_round(self, deferred: int, n_active: int, flags: dict):
        plan = self.plan
        if self.pending:
            self.miss("dispatch beats missing at end of round", list(self.pending), None)
            self.pending.clear()
        if self.golden.plan is not None:
            self.miss("round ended early", "running", "idle")
            self.golden.plan = None
        if plan.defer != deferred:
            self.miss("defer mask", plan.defer, deferred)
        if plan.n != n_active:
            self.miss("active experts", plan.n, n_active)
        gflags = self.golden.flags
        if self.monitor:
            self.monitor.end_round(gflags)
        for name, value in flags.items():
            if gflags[name] != value:
                self.miss(f"flag {name}", gflags[name], value)
        self.round += 1


def reset_span(p: SchedulerParams, items: int, stall: float) -> int:
    """Cycles over which a testbench draws a round's mid-round reset: its ``items`` stream
    beats at the stall rate, plus two passes over the experts and a margin."""
    return int(items * (1 + stall)) + 2 * p.experts + 40


def make_rounds(p: SchedulerParams, k: dict, rng: random.Random) -> list[Round]:
    """The rounds of a scheduler testbench run from its knobs: ``rounds_file`` (JSON list of
    ``{"records", "req_inits"}``, optionally ``done_script`` and ``expected``) or ``rounds``
    random rounds where every tenth is a full table (kind 3), an empty-after-buffering round
    (kind 7) or one expert hammered to its count limit (kind 5; with ``hammer`` in one request,
    so that an EIT entry saturates); with ``spread`` kind 1 is every expert on one chiplet, all
    chiplets used (every slot running at once); with ``warm`` the random rounds have no cold
    expert (T_QoS refills, up to saturation); ``bad_records`` replaces that fraction of
    records with random field values (out of range where the field can encode one)."""
    if k.get("rounds_file"):
        with open(k["rounds_file"]) as f:
            data = json.load(f)
        rounds = [
            Round([tuple(x) for x in d["records"]], [tuple(x) for x in d.get("req_inits", [])])
            for d in data
        ]
        for r, d in zip(rounds, data):  # optional: scripted completions, expected beats
            r.done_script = d.get("done_script")
            r.expected = d.get("expected")
        return rounds
    rounds = []
    for i in range(k.get("rounds", 20)):
        kind = i % 10
        if kind == 3:  # full table: every expert active, every request present
            recs = [(e % p.requests, rng.randrange(p.chiplets), e) for e in range(p.experts)]
            recs += [
                (r, rng.randrange(p.chiplets), rng.randrange(p.experts)) for r in range(p.requests)
            ]
            rounds.append(Round(recs, []))
        elif kind == 7:  # empty after buffering: lone cold tokens, every request has slack
            inits = [(r, p.qos_max) for r in range(p.requests)]
            recs = [(r, rng.randrange(p.chiplets), (r * 7) % p.experts) for r in range(p.requests)]
            rounds.append(Round(recs if p.theta_min >= 2 else recs[:1], inits))
        elif kind == 1 and k.get("spread"):  # every expert on one chiplet, all chiplets used
            recs = [(rng.randrange(p.requests), e % p.chiplets, e) for e in range(p.experts)]
            rng.shuffle(recs)
            rounds.append(Round(recs, []))
        elif k.get("warm") and kind not in (3, 5, 7):
            # no cold expert (each has theta_min tokens or more): nothing is deferred, C_fw
            # climbs to N_threshold and refills T_QoS; some requests start at qos_max
            chosen = rng.sample(range(p.experts), rng.randint(1, min(p.experts, 8)))
            recs = [
                (rng.randrange(p.requests), rng.randrange(p.chiplets), e)
                for e in chosen
                for _ in range(max(1, p.theta_min) + rng.randrange(3))
            ]
            inits = [(r, p.qos_max) for r in range(p.requests) if rng.random() < 0.1]
            rounds.append(Round(recs, inits))
        elif kind == 5:  # counts at their width limit: one expert hammered
            e = rng.randrange(p.experts)
            r0 = rng.randrange(p.requests)  # with ``hammer``: one entry past its width
            recs = [
                (r0 if k.get("hammer") else rng.randrange(p.requests), rng.randrange(p.chiplets), e)
                for _ in range(min(p.count_max + 3, 300))
            ]
            rounds.append(Round(recs, []))
        else:
            rounds.append(random_round(p, rng, tokens=k.get("tokens"), top_k=k.get("top_k")))
        if k.get("bad_records"):
            lim = (1 << p.request_bits, 1 << p.chiplet_bits, 1 << p.expert_bits)
            rnd = rounds[-1]
            for j in range(len(rnd.records)):
                if rng.random() < k["bad_records"]:
                    rnd.records[j] = tuple(rng.randrange(x) for x in lim)
    return rounds
