"""Formal properties of the scheduler blocks, checked by bounded model checking.

Each checker wraps one block (built by a factory, so a test can hand it a deliberately
broken copy) and states its properties as Amaranth ``Assert``/``Assume`` statements.  The
flow: Amaranth writes Verilog with immediate assertions; Debian's Yosys reads it with
``-formal`` and writes SMT-LIB 2; ``yosys-smtbmc`` with an SMT solver (``z3`` by default,
``boolector`` too) checks every assertion in every cycle up to the checker's depth, from the
power-on state and under a reset input that may rise in any cycle.  A failure names the
property (its message) and leaves a VCD counterexample.

Checkers, their generics and depths: :data:`CHECKS`; doc page ``docs/verification.md``
(section *Formal properties*).  ``fsedp rtl formal`` runs them.
"""

import dataclasses
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from amaranth import (
    Cat,
    ClockDomain,
    ClockSignal,
    Const,
    Elaboratable,
    Module,
    Mux,
    Signal,
    Value,
)
from amaranth.hdl import Assert, Assume, Fragment, ResetSignal

from fsedp.hw.generate import BLOCKS, convert
from fsedp.hw.sorter import Sorter
from fsedp.params import SchedulerParams
from fsedp.sw.sorter import SORTERS, network

__all__ = ["CHECKS", "Check", "FormalResult", "missing_tools", "prove"]


def _history(m: Module) -> str:
    """A clock domain for the checker's view of the past that reset does not clear (so a
    property can look at the cycle in which reset was high)."""
    m.domains.past = cd = ClockDomain("past", reset_less=True)
    m.d.comb += cd.clk.eq(ClockSignal("sync"))
    return "past"


def _prev(m: Module, value, name: str, init=0) -> Signal:
    """``value`` one cycle ago (``init`` in the first cycle)."""
    s = Signal(len(value), name=name, init=init)
    m.d.past += s.eq(value)
    return s


class _Checker(Elaboratable):
    """A block and its properties; ``ports`` are the free inputs the solver drives.  A
    property is named by its message up to the first colon; with ``only`` the checker keeps
    the assertions of that property alone (one solver run per property scales better than
    one over all of them)."""

    def __init__(self, dut, only: str | None = None):
        self.dut = dut
        self.only = only
        self.ports = []
        self.names: list[str] = []

    def free(self, *signals):
        self.ports += [Value.cast(s) for s in signals]

    def prop(self, m: Module, cond, msg: str):
        name = msg.split(":")[0]
        if name not in self.names:
            self.names.append(name)
        if self.only is None or name == self.only:
            m.d.comb += Assert(cond, msg)


class ICVChecker(_Checker):
    """ICV: a chiplet allocated in a cycle is busy in the next one, a released and not
    allocated one is idle (a release is never lost, also when allocation and release meet in
    one cycle), any other keeps its state; all idle after reset and at power-on."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = d = self.dut
        self.free(d.alloc, d.release)
        _history(m)
        C = len(d.value)
        was_rst = _prev(m, ResetSignal(), "was_rst", init=1)
        v, a, r = (_prev(m, x, n) for x, n in ((d.value, "pv"), (d.alloc, "pa"), (d.release, "pr")))
        with m.If(was_rst):
            self.prop(m, d.value == (1 << C) - 1, "icv.reset: all chiplets idle")
        with m.Else():
            for c in range(C):
                self.prop(m, ~a[c] | ~d.value[c], f"icv.alloc: allocated chiplet {c} is busy")
                self.prop(m, ~r[c] | a[c] | d.value[c], f"icv.release: release of {c} kept")
                self.prop(m, a[c] | r[c] | (d.value[c] == v[c]), f"icv.hold: chiplet {c} holds")
        return m


class MatcherChecker(_Checker):
    """E-C matcher: ``c*`` is the lowest idle chiplet of ``T_e``; ``next_hop`` forms one
    ring over ``T_e`` in ascending order (every chiplet of ``T_e`` once, back to the start);
    ``first`` is the lowest chiplet of ``T_e``.  Combinational: one step covers every
    input."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = d = self.dut
        self.free(d.traj, d.icv, d.commit, d.done)
        C = len(d.traj)
        free = d.traj & d.icv
        self.prop(m, d.eligible == free.any(), "matcher.eligible: T_e & ICV != 0")
        with m.If(free.any()):
            below = Cat(*[(d.entry > c) & free[c] for c in range(C)]).any()
            self.prop(m, d.entry < C, "matcher.entry: in range")
            self.prop(m, free.bit_select(d.entry, 1), "matcher.entry: idle and in T_e")
            self.prop(m, ~below, "matcher.entry: lowest idle chiplet of T_e")
        with m.If(d.traj.any()):
            below = Cat(*[(d.first > c) & d.traj[c] for c in range(C)]).any()
            self.prop(m, d.traj.bit_select(d.first, 1) & ~below, "matcher.first")
            # one ring over T_e in ascending order, stated per chiplet: the successor of a
            # chiplet of T_e is in T_e and is the next one of T_e after it, cyclically (no
            # chiplet of T_e in between; itself only when T_e has one chiplet).  A successor
            # function with this property is the single ascending cycle through T_e.
            single = Signal()
            m.d.comb += single.eq(sum(d.traj[c] for c in range(C)) == 1)
            for c in range(C):
                for j in range(C):
                    between = [(c + s) % C for s in range(1, (j - c) % C or C)]
                    gap = Cat(*[d.traj[b] for b in between]).any() if between else Const(0)
                    ok = d.traj[j] & ~gap & ((j != c) | single)
                    self.prop(
                        m,
                        ~d.traj[c] | (d.next_hop[c] != j) | ok,
                        f"matcher.ring: successor {j} of chiplet {c}",
                    )
                self.prop(m, ~d.traj[c] | (d.next_hop[c] < C), f"matcher.ring: {c} in range")
        return m


class SorterChecker(_Checker):
    """Sorter: every vector leaves as a sorted permutation of the one that entered (count
    descending, ties to the lower id; every lane's trajectory with its id), exactly
    ``latency`` cycles after it was accepted; no output without an input.  Assumed: as the
    scheduler feeds it, lane ``k`` enters with id ``k``, one vector in flight at a time."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = d = self.dut
        self.free(d.i.valid, d.i.payload, d.o.ready)
        N, lat = d.lanes, d.latency
        x, y = d.i.payload, d.o.payload
        inflight = Signal()
        held = Signal.like(d.i.payload)
        age = Signal(range(lat + 2))
        for a in range(N):
            m.d.comb += Assume(~d.i.valid | (x[a].id == a))
        m.d.comb += Assume(~d.i.valid | ~inflight)
        with m.If(d.i.valid & d.i.ready):
            m.d.sync += [inflight.eq(1), held.eq(d.i.payload), age.eq(1)]
        with m.Elif(inflight & (age <= lat)):
            m.d.sync += age.eq(age + 1)
        with m.If(d.o.valid & d.o.ready):
            m.d.sync += inflight.eq(0)
        self.prop(m, ~d.o.valid | inflight, "sorter.no_spurious_output")
        with m.If(inflight):
            self.prop(m, d.o.valid == (age >= lat), "sorter.latency")
        with m.If(d.o.valid):
            for k in range(N - 1):
                before = Cat(~y[k].id, y[k].count) > Cat(~y[k + 1].id, y[k + 1].count)
                self.prop(m, before, f"sorter.sorted: lanes {k}, {k + 1}")
            # a permutation: every output lane is the input lane of its id (ids are the
            # input lanes), and no id leaves twice
            for k in range(N):
                same = Const(0)
                for a in range(N):
                    same = same | ((y[k].id == a) & (y[k].as_value() == held[a].as_value()))
                self.prop(m, same, f"sorter.permutation: output lane {k} is an input lane")
                for j in range(k + 1, N):
                    self.prop(m, y[k].id != y[j].id, f"sorter.permutation: lanes {k}, {j} differ")
        return m


class EITChecker(_Checker):
    """EIT: the merged count of every expert is the saturating sum over requests of the
    saturating per-request counts of the records since the last ``clear`` (never wraps), two
    cycles after each record; ``overflow`` rises with a saturation and only then;
    an out-of-range record sets ``bad_record``.  Assumed: no re-merge (``merge_en`` low; the
    re-merge is checked against the golden model by simulation), no record in a clearing
    cycle."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = d = self.dut
        p = d.p
        E, R, MAX = p.experts, p.requests, 2**p.count_width - 1
        rec = d.rec.payload
        self.free(d.rec.valid, d.rec.payload, d.flags_clear, d.clear)
        m.d.comb += [Assume(~d.merge_en), Assume(~(d.rec.valid & d.clear))]
        ok = (rec.request < R) & (rec.expert < E) & (rec.chiplet < p.chiplets)
        # exact per-(request, expert) counts, capped one above MAX (enough to see saturation)
        n = [[Signal(range(MAX + 2), name=f"n{r}_{e}") for e in range(E)] for r in range(R)]
        sat_now = Const(0)
        for r in range(R):
            for e in range(E):
                hit = d.rec.valid & ok & (rec.request == r) & (rec.expert == e)
                with m.If(d.clear):
                    m.d.sync += n[r][e].eq(0)
                with m.Elif(hit & (n[r][e] <= MAX)):
                    m.d.sync += n[r][e].eq(n[r][e] + 1)
                sat_now = sat_now | (hit & (n[r][e] >= MAX))
        merged = []
        for e in range(E):
            total = sum(Mux(n[r][e] > MAX, MAX, n[r][e]) for r in range(R))
            merged.append(Mux(total > MAX, MAX, total))
        # a record in cycle t is in the exact counts from t + 1 and in the merged count
        # from t + 2: the merged count equals the exact counts' saturating sum one cycle
        # late, except in the cycle after a clear (which also drops a record in flight)
        late = [Signal(p.count_width, name=f"late{e}") for e in range(E)]
        for e in range(E):
            m.d.sync += late[e].eq(merged[e])
        cleared = Signal()
        m.d.sync += cleared.eq(d.clear)
        warm = Signal()  # a cycle since reset
        m.d.sync += warm.eq(1)
        with m.If(warm & ~cleared):
            for e in range(E):
                self.prop(m, d.count[e] == late[e], f"eit.count: expert {e} saturating sum")
        # overflow: a record that saturates its request's count or the merged count, one
        # cycle later in the flag (sticky; flags_clear restarts it with that cycle's event)
        ev = Const(0)
        for r in range(R):
            for e in range(E):
                hit = d.rec.valid & ok & (rec.request == r) & (rec.expert == e)
                ev = ev | (hit & ((n[r][e] >= MAX) | (merged[e] == MAX)))
        ev_late, flag = Signal(), Signal()
        m.d.sync += ev_late.eq(ev & ~d.clear)
        with m.If(d.flags_clear):
            m.d.sync += flag.eq(ev_late)
        with m.Else():
            m.d.sync += flag.eq(flag | ev_late)
        self.prop(m, d.overflow == flag, "eit.overflow: raised by the first saturation only")
        bad = Signal()
        m.d.sync += bad.eq(d.rec.valid & ~ok)
        with m.If(bad):
            self.prop(m, d.bad_record, "eit.bad_record: flagged")
        return m


class TokenBufferChecker(_Checker):
    """Token buffer (Algorithm 2): only a present request that touches a cold expert is
    deferred; a deferral resets ``C_fw``; a request absent from a decision keeps its timers;
    a request is deferred at most ``T_QoS(init) + refills`` times (the QoS bound: refills
    come only after ``N_threshold`` forward passes); ``init`` sets ``T_QoS`` and clears
    ``C_fw``."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = d = self.dut
        p = d.p
        R = p.requests
        self.free(d.init.valid, d.init.payload, d.decide, d.present, d.cold_hit)
        _history(m)
        was_rst = _prev(m, ResetSignal(), "was_rst", init=1)
        dec = _prev(m, d.decide, "was_decide")
        pres = _prev(m, d.present, "was_present")
        cold = _prev(m, d.cold_hit, "was_cold")
        init = _prev(m, d.init.valid & d.init.ready, "was_init")
        ireq = _prev(m, d.init.payload.request, "init_request")
        iqos = _prev(m, d.init.payload.t_qos, "init_t_qos")
        qos_prev = [_prev(m, d.t_qos[r], f"was_t_qos{r}") for r in range(R)]
        cfw_prev = [_prev(m, d.c_fw[r], f"was_c_fw{r}") for r in range(R)]
        with m.If(~was_rst):
            for r in range(R):
                deferred = dec & pres[r] & d.defer[r]
                held = (d.t_qos[r] == qos_prev[r]) & (d.c_fw[r] == cfw_prev[r])
                refill = cfw_prev[r] >= p.n_threshold
                name = "token_buffer.{}: request " + str(r)
                self.prop(m, ~dec | ~d.defer[r] | (pres[r] & cold[r]), name.format("defer_cold"))
                self.prop(m, ~deferred | (d.c_fw[r] == 0), name.format("defer_resets_cfw"))
                self.prop(m, ~dec | pres[r] | (held & ~d.defer[r]), name.format("absent_holds"))
                self.prop(
                    m,
                    ~init | (ireq != r) | ((d.t_qos[r] == iqos) & (d.c_fw[r] == 0)),
                    f"token_buffer.init: request {r}",
                )
                # the QoS bound: each deferral spends one unit of T_QoS, which only the
                # refill after N_threshold forward passes gives back
                gain = refill & (qos_prev[r] != p.qos_max)
                spent = d.t_qos[r] + 1 == qos_prev[r] + gain
                self.prop(m, ~deferred | spent, f"token_buffer.qos_bound: request {r}")
        return m


@dataclasses.dataclass(frozen=True)
class Check:
    """One checker: the block it wraps, its generics, the BMC depth and whether k-induction
    proves it for every depth."""

    name: str
    block: str
    checker: type
    params: SchedulerParams
    depth: int
    kind: str | None = None  # sorter variant
    induction: bool = False

    def dut(self):
        if self.block == "sorter":
            return Sorter(self.params, self.kind)
        return BLOCKS[self.block](self.params)

    def build(self, dut_factory: Callable | None = None, only: str | None = None) -> _Checker:
        dut = dut_factory(self.params) if dut_factory else self.dut()
        return self.checker(dut, only)


_SMALL = dict(count_width=2, requests=2, theta_min=2, n_threshold=2, qos_width=2)


def _sorter_check(kind: str) -> Check:
    # 8 lanes (the fewest experts), 2-bit counts (many ties); deep enough for a vector
    # accepted in any of the first three cycles to leave
    p = SchedulerParams(chiplets=4, experts=8, **_SMALL)
    return Check(f"sorter-{kind}", "sorter", SorterChecker, p, network(8, kind).cycles + 3, kind)


CHECKS = {
    c.name: c
    for c in [
        Check("icv", "icv", ICVChecker, SchedulerParams(chiplets=5, experts=8), 6, induction=True),
        Check("matcher", "matcher", MatcherChecker, SchedulerParams(chiplets=5, experts=8), 1),
        *(_sorter_check(kind) for kind in SORTERS),
        Check(
            "eit",
            "eit",
            EITChecker,
            SchedulerParams(chiplets=4, experts=8, eit_lanes=4, **_SMALL),
            8,
        ),
        Check(
            "token_buffer",
            "token_buffer",
            TokenBufferChecker,
            SchedulerParams(chiplets=4, experts=8, **_SMALL),
            10,
        ),
    ]
}


@dataclasses.dataclass
class FormalResult:
    """Outcome of one check: per property its status (``pass``, ``fail``, ``error``: the
    tools failed or timed out), seconds and, when asked for, the k-induction status."""

    name: str
    depth: int
    properties: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def status(self) -> str:
        got = {p["status"] for p in self.properties}
        return "error" if "error" in got else "fail" if "fail" in got else "pass"

    @property
    def failed(self) -> list[str]:
        return [m for p in self.properties for m in p.get("failed", [])]

    @property
    def vcd(self) -> str | None:
        return next((p["vcd"] for p in self.properties if p.get("vcd")), None)


def missing_tools(solver: str = "z3") -> list[str]:
    """The programs the flow needs that are not on ``PATH``."""
    return [t for t in ("yosys", "yosys-smtbmc", solver) if shutil.which(t) is None]


def _messages(vtext: str) -> dict[int, str]:
    """Line of every ``assert`` in Amaranth's Verilog -> the message printed before it."""
    out, last = {}, None
    for i, line in enumerate(vtext.splitlines(), 1):
        w = re.search(r'\$write\("(.*)"\);', line)
        if w:
            last = w.group(1)
        if re.search(r"\bassert\s*\(", line):
            out[i] = last or f"line {i}"
            last = None
    return out


def properties(check: "Check") -> list[str]:
    """Names of the properties of ``check``, in the order they are stated."""
    return top_names(check.build())


def prove(
    check: "Check",
    workdir,
    depth: int | None = None,
    solver: str = "z3",
    dut_factory: Callable | None = None,
    induction: bool | None = None,
    only: list[str] | None = None,
    timeout: float = 1800,
    progress: Callable | None = None,
) -> FormalResult:
    """Bounded model check of every property of ``check`` (or those in ``only``), one solver
    run each, to ``depth`` (default: the check's) in ``workdir``; with ``induction``
    (default: the check's) also a k-induction proof at that depth, which holds for every
    depth.  ``progress(name, record)`` is called after each property."""
    depth = check.depth if depth is None else depth
    induction = check.induction if induction is None else induction
    t0 = time.time()
    result = FormalResult(check.name, depth)
    names = properties(check) if only is None else only
    for name in names:
        rec = _prove_one(
            check, name, Path(workdir) / name, depth, solver, dut_factory, induction, timeout
        )
        result.properties.append(rec)
        if progress:
            progress(name, rec)
    result.seconds = round(time.time() - t0, 2)
    return result


def _prove_one(check, name, work: Path, depth, solver, dut_factory, induction, timeout) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    top = check.build(dut_factory, only=name)
    vtext = convert(top, name="formal_top", ports=top_ports(top))
    (work / "formal_top.v").write_text(vtext)
    (work / "formal.ys").write_text(
        "read_verilog -formal formal_top.v\n"
        "prep -top formal_top\n"
        "memory_map\nopt -fast\n"
        "async2sync\ndffunmap\n"
        "write_smt2 -wires formal_top.smt2\n"
    )
    rec = {"name": name, "status": "pass", "depth": depth}
    y = subprocess.run(["yosys", "-q", "-s", "formal.ys"], cwd=work, capture_output=True, text=True)
    if y.returncode:
        rec.update(status="error", log=y.stderr[-2000:], seconds=round(time.time() - t0, 2))
        return rec
    res = _smtbmc(work, ["-t", str(depth)], solver, timeout)
    if "Status: PASSED" not in res.stdout:
        rec["status"] = "fail" if "Status: FAILED" in res.stdout else "error"
        rec["failed"] = _failed(res.stdout, _messages(vtext))
        rec["log"] = res.stdout[-2000:]
        if (work / "trace.vcd").exists():
            rec["vcd"] = str(work / "trace.vcd")
    elif induction:
        ind = _smtbmc(work, ["-i", "-t", str(depth)], solver, timeout, vcd="induction.vcd")
        rec["induction"] = "pass" if "Status: PASSED" in ind.stdout else "fail"
    rec["seconds"] = round(time.time() - t0, 2)
    return rec


def top_ports(top: _Checker) -> list:
    """The checker's free inputs (elaborating it once registers them)."""
    if not top.ports:
        Fragment.get(top, None)
    return list(top.ports)


def top_names(top: _Checker) -> list[str]:
    top_ports(top)
    return list(top.names)


def _smtbmc(work: Path, args: list, solver: str, timeout: float, vcd: str = "trace.vcd"):
    cmd = [
        "yosys-smtbmc",
        "-s",
        solver,
        "--unroll",
        "--presat",
        "--noprogress",
        *args,
        "--dump-vcd",
        vcd,
        "formal_top.smt2",
    ]
    try:
        return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, -1, (e.stdout or b"").decode() + "\ntimeout", "")


def _failed(out: str, messages: dict) -> list[str]:
    names = []
    # the location is a span (``482.54-483.20``) that ends on the assert's line
    for m in re.finditer(r"Assert failed in \S+: \S*?formal_top\.v:(\d+)(?:\.\d+-(\d+))?", out):
        line = int(m.group(2) or m.group(1))
        names.append(messages.get(line, f"formal_top.v:{line}"))
    return sorted(set(names)) or ["(see the log)"]
