"""Functional coverage of the scheduler, per block, sampled from a checked regression.

The bins are sampled where the scoreboard (:class:`fsedp.tb.scoreboard.RoundChecker`) books
a transfer of the RTL: the golden model it drives is equal to the RTL at every beat, so its
state at a transfer is the RTL's (an RTL that differed would be a mismatch, and a run with
mismatches is not a coverage result).  The one bin that needs an RTL register is the FSM
state a reset interrupts, which the native driver reads from the model.

A bin is *reachable* under the given parameters unless :meth:`Coverage.unreachable` gives the
reason it is not (for example padding lanes when the expert count is a power of two, or a
release meeting an allocation in one cycle, which the scheduler's FSM never issues: those
are covered by the ICV block tests and its formal property instead).  ``fsedp rtl coverage``
steers the stimulus (:data:`STEERING`) until every reachable bin is hit.
"""

from collections import Counter

from fsedp.params import BeatKind, SchedulerParams

__all__ = ["Coverage", "STEERING", "fsm_states"]

#: knobs added to the base stimulus to reach a bin that a run missed; a bin not named here is
#: steered by ``"base"`` (more random rounds, another seed)
STEERING = {
    "base": {"stall": 0.25, "reset_every": 10},
    "bad": {"bad_records": 0.05, "spurious": 0.05, "reset_every": 0},
    "resets": {"reset_every": 1, "stall": 0.1},
    "wide": {"tokens": None, "top_k": None, "stall": 0.0, "max_delay": 40, "hammer": True},
    "warm": {"warm": True, "reset_every": 0},
    "busy": {"gather": 0.7, "max_delay": 30, "stall": 0.0, "spread": True},
}


def fsm_states(p: SchedulerParams) -> tuple[str, ...]:
    """Names of the scheduler FSM's states by encoding (Amaranth numbers them in the order
    the description first mentions them)."""
    from amaranth.hdl import Fragment

    from fsedp.hw.scheduler import Scheduler

    top = Scheduler(p)
    Fragment.get(top, None)
    return top.fsm_states


class Coverage:
    """Bins per block, each a hit count; :meth:`report` splits hit, missed and unreachable."""

    def __init__(self, p: SchedulerParams, states: tuple[str, ...] | None = None):
        self.p = p
        self.states = states if states is not None else fsm_states(p)
        self.hits: dict[str, Counter] = {b: Counter() for b in self.bins()}
        self._preloaded: set = set()

    # -- the bins --------------------------------------------------------------------------
    def bins(self) -> dict[str, list[str]]:
        C = self.p.chiplets
        return {
            "eit": [
                "entry saturates at count_max",
                "merged sum saturates",
                "overflow flag",
                "bad record flag",
                "round with deferred requests re-merged",
            ],
            "sorter": [
                "tie on count (order by id)",
                "padding lanes",
                "one active expert",
                "every expert active (full table)",
                "no active expert after buffering",
            ],
            "token_buffer": [
                "deferral",
                "deferral with C_fw > 0",
                "C_fw reaches N_threshold (T_QoS refilled)",
                "T_QoS refill saturates",
                "cold hit with T_QoS = 0 (not deferred)",
                "every present request deferred",
                "request init",
            ],
            "icv": [f"{k} of {C} chiplets idle at a dispatch" for k in range(1, C + 1)]
            + [
                "every chiplet busy after a dispatch",
                "allocation and release in one cycle",
            ],
            "matcher": [f"ring of {k} chiplets" for k in range(1, C + 1)]
            + [f"entry chiplet {c}" for c in range(C)]
            + [
                "entry past a busy trajectory chiplet",
                *[f"{k} completions in one beat" for k in range(1, C + 1)],
                "spurious completion flagged",
            ],
            "pairing": [
                "pre-load beat (Rule 4)",
                "pre-loaded expert dispatched later",
                "lone middle expert (odd n)",
            ],
            "fsm": [f"reset in {s}" for s in self.states],
        }

    def unreachable(self) -> dict[str, str]:
        """``"block: bin" -> reason`` for the bins these parameters cannot reach."""
        p = self.p
        out = {}
        if all(n & (n - 1) == 0 for n in (p.requests, p.chiplets, p.experts)):
            out["eit: bad record flag"] = (
                f"{p.requests} requests, {p.chiplets} chiplets and {p.experts} experts are "
                "powers of two: every id a gate record can encode is in range"
            )
        if p.sorter_lanes == p.experts:
            out["sorter: padding lanes"] = (
                f"{p.experts} experts fill the {p.sorter_lanes} sorter lanes (a power of two)"
            )
        out["icv: allocation and release in one cycle"] = (
            "the scheduler allocates in EMIT_D and releases in WAIT, never in one cycle; "
            "the ICV block test and `fsedp rtl formal --check icv` cover it"
        )
        if p.theta_min == 0:
            for b in (
                "deferral",
                "deferral with C_fw > 0",
                "every present request deferred",
                "cold hit with T_QoS = 0 (not deferred)",
            ):
                out[f"token_buffer: {b}"] = "theta_min = 0 never defers"
            out["eit: round with deferred requests re-merged"] = "theta_min = 0 never defers"
        return out

    # -- sampling (called by fsedp.tb.native.run_native) -----------------------------------
    def hit(self, block: str, name: str):
        self.hits[block][name] += 1

    def before_start(self, golden):
        self._preloaded = set()  # experts pre-loaded in this round

    #: Algorithm 2 paths the golden token buffer reports (``TokenBuffer.paths``) -> bins
    PATHS = {
        "refill": ["C_fw reaches N_threshold (T_QoS refilled)"],
        "refill saturates": ["C_fw reaches N_threshold (T_QoS refilled)", "T_QoS refill saturates"],
        "defer with C_fw > 0": ["deferral with C_fw > 0"],
        "cold hit, T_QoS 0": ["cold hit with T_QoS = 0 (not deferred)"],
    }

    def after_start(self, golden, plan):
        p = self.p
        if plan.defer:
            self.hit("token_buffer", "deferral")
            self.hit("eit", "round with deferred requests re-merged")
            if plan.defer == plan.present:
                self.hit("token_buffer", "every present request deferred")
        for path in golden.tb.paths:
            for name in self.PATHS.get(path, ()):
                self.hit("token_buffer", name)
        if "entry" in golden.eit.saturated:
            self.hit("eit", "entry saturates at count_max")
        if "sum" in golden.eit.saturated:
            self.hit("eit", "merged sum saturates")
        active = plan.sorted_keys[: plan.n]
        if plan.n == 0:
            self.hit("sorter", "no active expert after buffering")
        elif plan.n == 1:
            self.hit("sorter", "one active expert")
        if plan.n == p.experts:
            self.hit("sorter", "every expert active (full table)")
        if any(a[0] == b[0] for a, b in zip(active, active[1:])):
            self.hit("sorter", "tie on count (order by id)")
        if p.sorter_lanes > p.experts and plan.n:
            self.hit("sorter", "padding lanes")
        if plan.n % 2 == 1 and plan.n > 1:
            self.hit("pairing", "lone middle expert (odd n)")

    def decided(self, golden, icv: int, beats):
        """The beats ``golden`` decided from ICV value ``icv`` (the RTL emits the same ones,
        compared one by one)."""
        C = self.p.chiplets
        for beat in beats:
            if beat.kind == BeatKind.PRELOAD:
                self.hit("pairing", "pre-load beat (Rule 4)")
                self._preloaded.add(beat.expert)
                continue
            if beat.expert in self._preloaded:
                self.hit("pairing", "pre-loaded expert dispatched later")
            self.hit("icv", f"{bin(icv).count('1')} of {C} chiplets idle at a dispatch")
            icv &= ~golden.alloc_mask(beat.traj, beat.entry)
            if icv == 0:
                self.hit("icv", "every chiplet busy after a dispatch")
            self.hit("matcher", f"ring of {bin(beat.traj).count('1')} chiplets")
            self.hit("matcher", f"entry chiplet {beat.entry}")
            if beat.traj & ((1 << beat.entry) - 1):
                self.hit("matcher", "entry past a busy trajectory chiplet")

    def init(self):
        self.hit("token_buffer", "request init")

    def done(self, mask: int):
        k = bin(mask).count("1")
        if 1 <= k <= self.p.chiplets:
            self.hit("matcher", f"{k} completions in one beat")

    def end_round(self, flags: dict):
        if flags["overflow"]:
            self.hit("eit", "overflow flag")
        if flags["bad_record"]:
            self.hit("eit", "bad record flag")
        if flags["spurious_done"]:
            self.hit("matcher", "spurious completion flagged")

    def reset(self, state: int):
        name = self.states[state] if 0 <= state < len(self.states) else f"state {state}"
        self.hit("fsm", f"reset in {name}")

    # -- results ---------------------------------------------------------------------------
    def merge(self, other: "Coverage"):
        for block, c in other.hits.items():
            self.hits[block].update(c)

    def report(self) -> dict:
        """``{block: {"hit": {bin: n}, "missed": [bin], "unreachable": {bin: reason}}}``."""
        unreachable = self.unreachable()
        out = {}
        for block, names in self.bins().items():
            hit, missed, unr = {}, [], {}
            for name in names:
                key = f"{block}: {name}"
                if key in unreachable:
                    unr[name] = unreachable[key]
                    if self.hits[block][name]:
                        hit[name] = self.hits[block][name]  # reachable after all: a bug here
                elif self.hits[block][name]:
                    hit[name] = self.hits[block][name]
                else:
                    missed.append(name)
            out[block] = {"hit": hit, "missed": missed, "unreachable": unr}
        return out

    def missed(self) -> list[str]:
        return [f"{b}: {n}" for b, r in self.report().items() for n in r["missed"]]


#: which steering profile reaches a bin that random rounds missed (first match of the bin's
#: name; the rest are steered by "base")
STEER_BY_BIN = (
    ("refill", "warm"),
    ("N_threshold", "warm"),
    ("bad record", "bad"),
    ("spurious", "bad"),
    ("reset in", "resets"),
    ("completions in one beat", "busy"),
    ("chiplets idle", "busy"),
    ("every chiplet busy", "busy"),
    ("ring of", "wide"),
    ("saturat", "wide"),
    ("overflow", "wide"),
    ("full table", "wide"),
)


def steer(missed: list[str], used: Counter) -> str:
    """The steering profile that targets the most of the ``missed`` bins; ties go to the
    profile ``used`` least so far."""
    votes = Counter()
    for name in missed:
        votes[next((prof for key, prof in STEER_BY_BIN if key in name), "base")] += 1
    if not votes:
        return "base"
    return max(votes, key=lambda prof: (votes[prof], -used[prof]))


def close_coverage(
    p: SchedulerParams,
    build_root,
    rounds: int = 2000,
    batches: int = 8,
    seed: int = 1,
    opt: str = "-O2",
    log=None,
) -> tuple["Coverage", list[dict], int]:
    """Run checked native regressions of ``rounds`` rounds, steering each batch at the bins
    still missed, until every reachable bin is hit or ``batches`` ran.  Returns the merged
    coverage, one summary per batch and the mismatches found (coverage of a run with
    mismatches is not a result: the loop stops)."""
    from fsedp.tb.native import run_native

    states = fsm_states(p)
    total = Coverage(p, states)
    history, mismatches, used = [], 0, Counter()
    for i in range(batches):
        profile = "base" if i == 0 else steer(total.missed(), used)
        used[profile] += 1
        knobs = {"rounds": rounds, "seed": seed + i, **STEERING["base"], **STEERING[profile]}
        if profile == "wide":
            knobs["tokens"] = min(8 * p.chiplets, p.count_max)
            knobs["top_k"] = min(4, p.experts)
        knobs = {k: v for k, v in knobs.items() if v is not None}
        cov = Coverage(p, states)
        before = len(total.missed())
        run = run_native(p, knobs, build_root, opt, coverage=cov, log=log)
        total.merge(cov)
        history.append(
            {
                "batch": i,
                "profile": profile,
                "knobs": knobs,
                "rounds": run.rounds,
                "resets": run.resets,
                "mismatches": run.mismatches,
                "newly_hit": before - len(total.missed()),
                "wall_s": run.wall_s,
            }
        )
        if log:
            log(
                f"batch {i} ({profile}): {run.rounds} rounds, {run.mismatches} mismatches, "
                f"{history[-1]['newly_hit']} bins newly hit, {len(total.missed())} missed"
            )
        mismatches += run.mismatches
        if run.mismatches or not total.missed():
            break
    return total, history, mismatches
