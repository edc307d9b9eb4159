"""Fast tier: each scheduler block's RTL in Amaranth's own simulator against its golden model.

The same stimulus, protocol and golden calls as the cocotb testbenches ``tb/tb_eit.py``,
``tb/tb_icv.py``, ``tb/tb_matcher.py``, ``tb/tb_token_buffer.py`` and ``tb/tb_pairing.py``,
without Verilator or Icarus: a few hundred random cases per block, at small widths (where
counts and timers saturate) and at the generics' limits.  Every testbench counts its cycles
through :class:`Bench`, which fails with the cycle and the watched ports instead of hanging,
and asserts that the corner cases it is there for (saturation, bad records, deferrals of
requests with a non-zero ``C_fw``, ...) were actually exercised.
"""

import random
from collections import Counter

import pytest
from amaranth import ResetInserter, Signal, Value
from amaranth.lib import data
from amaranth.sim import Simulator

from fsedp.hw.eit import EIT
from fsedp.hw.icv import ICV
from fsedp.hw.layouts import key_layout, record_layout, req_init_bits
from fsedp.hw.matcher import ECMatcher
from fsedp.hw.pairing import PairingUnit
from fsedp.hw.token_buffer import TokenBufferUnit
from fsedp.params import SchedulerParams
from fsedp.sw import eit as sw_eit
from fsedp.sw import icv as sw_icv
from fsedp.sw.matcher import entry_chiplet, lowest_bit, next_hops, release_mask
from fsedp.sw.pairing import balanced_order, paired_index, partner
from fsedp.sw.sorter import sort_keys, sorter_keys
from fsedp.sw.token_buffer import TokenBuffer
from fsedp.tb.stimulus import eit_include, eit_records, pause


class Bench:
    """Cycle budget of one testbench: :meth:`tick` fails past ``limit`` cycles, and every
    failure (:meth:`check`, :meth:`until`) names the cycle, the case and the watched ports
    (inputs and outputs), so a wrong or stuck block is reported instead of hanging."""

    def __init__(self, ctx, limit: int, watch: dict):
        self.ctx, self.limit, self.cycle, self.case = ctx, limit, 0, ""
        self.watch = {name: Value.cast(sig) for name, sig in watch.items()}

    def state(self) -> str:
        ports = ", ".join(f"{k}={self.ctx.get(v):#x}" for k, v in self.watch.items())
        return f"cycle {self.cycle} {self.case}: {ports}"

    def fail(self, what: str):
        pytest.fail(f"{what}\n  at {self.state()}", pytrace=False)

    async def tick(self, cycles: int = 1):
        for _ in range(cycles):
            if self.cycle >= self.limit:
                self.fail(f"cycle limit {self.limit} reached")
            await self.ctx.tick()
            self.cycle += 1

    async def until(self, cond, what: str, budget: int):
        """Tick until ``cond()``, at most ``budget`` cycles; returns the cycles taken."""
        start = self.cycle
        while not cond():
            if self.cycle - start >= budget:
                self.fail(f"{what}: not within {budget} cycles")
            await self.tick()
        return self.cycle - start

    def check(self, got, want, what: str):
        if got != want:
            self.fail(f"{what}: RTL {got!r} != golden {want!r}")


def simulate(top, bench, clock: bool = True):
    sim = Simulator(top)
    if clock:
        sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def unpack(value: int, width: int, n: int) -> list[int]:
    """The ``n`` fields of ``width`` bits of a packed array port, lowest first."""
    return [value >> (i * width) & ((1 << width) - 1) for i in range(n)]


# -- EIT -----------------------------------------------------------------------------------
EIT_PARAMS = [
    # counts saturate after 3 (7) records; out-of-range ids fit in the fields of the second
    SchedulerParams(chiplets=4, experts=8, requests=2, count_width=2, theta_min=2, eit_lanes=4),
    SchedulerParams(chiplets=5, experts=12, requests=3, count_width=3, theta_min=5, eit_lanes=2),
    # limits: 1-bit counts, 16 chiplets, 16 lanes per word, one lane per word
    SchedulerParams(chiplets=16, experts=32, requests=5, count_width=1, theta_min=1, eit_lanes=16),
    SchedulerParams(chiplets=16, experts=9, requests=1, count_width=2, theta_min=3, eit_lanes=1),
    # 128 experts (256 overflows the recursion of Amaranth's simulator compiler)
    SchedulerParams(chiplets=4, experts=128, requests=2, count_width=3, theta_min=4, eit_lanes=8),
]


@pytest.mark.parametrize(
    "p",
    EIT_PARAMS,
    ids=["4c8e-w2", "5c12e-w3", "16c32e-w1-16lanes", "16c9e-1req-1lane", "4c128e-w3"],
)
def test_eit_matches_golden(p):
    """RTL EIT == golden EIT each round, re-merge and clear, with saturating counts and bad ids."""
    rng = random.Random(p.chiplets * 1000 + p.experts)
    dut = EIT(p)
    gold = sw_eit.EIT(p)
    lay = record_layout(p)
    lim = (1 << p.request_bits, 1 << p.chiplet_bits, 1 << p.expert_bits)
    words = dut.words
    everyone = (1 << p.requests) - 1
    seen = Counter()

    async def bench(ctx):
        b = Bench(
            ctx,
            60_000,
            {
                "rec.valid": dut.rec.valid,
                "rec.payload": dut.rec.payload,
                "clear": dut.clear,
                "merge_en": dut.merge_en,
                "merge_addr": dut.merge_addr,
                "merge_include": dut.merge_include,
                "count": dut.count,
                "mask": dut.mask,
                "present": dut.present,
                "cold_hit": dut.cold_hit,
                "overflow": dut.overflow,
                "bad_record": dut.bad_record,
            },
        )

        def merged():
            return (
                unpack(ctx.get(dut.count.as_value()), p.count_width, p.experts),
                unpack(ctx.get(dut.mask.as_value()), p.chiplets, p.experts),
            )

        await b.tick()
        for rnd in range(40):
            recs = eit_records(p, rng, rnd)
            raw = Counter((r, e) for r, c, e in recs if gold.valid(sw_eit.GateRecord(r, c, e)))
            gold.reset()
            for i, rec in enumerate(recs):
                for _ in range(pause(rng)):
                    ctx.set(dut.rec.valid, 0)
                    ctx.set(dut.flags_clear, 0)  # a one-cycle pulse with the first record
                    await b.tick()
                ctx.set(dut.rec.valid, 1)
                ctx.set(dut.flags_clear, i == 0)
                ctx.set(
                    dut.rec.payload.as_value(),
                    lay.const(dict(zip(("request", "chiplet", "expert"), rec))).as_bits(),
                )
                gold.write(sw_eit.GateRecord(*rec))
                await b.tick()
            ctx.set(dut.rec.valid, 0)
            ctx.set(dut.flags_clear, 0)
            await b.tick(3)  # merged registers after 2 edges, cold_hit after 3
            b.case = f"round {rnd} ({len(recs)} records)"
            scans = [gold.scan(e, everyone) for e in range(p.experts)]
            counts, masks = merged()
            b.check(counts, [s.count for s in scans], "merged counts")
            b.check(masks, [s.mask for s in scans], "merged masks")
            present = cold_hit = 0
            for s in scans:
                present |= s.present
                if 0 < s.count < p.theta_min:
                    cold_hit |= s.present
            b.check((ctx.get(dut.present), ctx.get(dut.cold_hit)), (present, cold_hit), "present")
            b.check(
                (ctx.get(dut.overflow), ctx.get(dut.bad_record)),
                (int(gold.overflow), int(gold.bad_record)),
                "overflow, bad_record",
            )
            seen["count_max"] += p.count_max in counts
            seen["overflow"] += gold.overflow
            seen["bad_record"] += gold.bad_record
            seen["cold_hit"] += cold_hit != 0
            await b.tick()
            include = eit_include(p, rng, rnd)
            if include is not None:  # a deferral round: merge the included requests again
                for a in range(words):
                    ctx.set(dut.merge_en, 1)
                    ctx.set(dut.merge_addr, a)
                    ctx.set(dut.merge_include, include)
                    await b.tick()
                ctx.set(dut.merge_en, 0)
                await b.tick(2)
                b.case = f"round {rnd}, re-merge over {include:#x}"
                scans = [gold.scan(e, include) for e in range(p.experts)]
                counts, masks = merged()
                b.check(counts, [s.count for s in scans], "re-merged counts")
                b.check(masks, [s.mask for s in scans], "re-merged masks")
                seen["merges"] += 1
                # a request's own count saturated (more records than count_max) and is re-read
                seen["saturated_merge"] += any(
                    n > p.count_max and include >> r & 1 for (r, _), n in raw.items()
                )
                await b.tick()
            ctx.set(dut.clear, 1)
            await b.tick()
            ctx.set(dut.clear, 0)
            await b.tick(2)
            b.case = f"round {rnd}, cleared"
            b.check((ctx.get(dut.present), merged()), (0, ([0] * p.experts,) * 2), "clear")
            await b.tick()

    simulate(dut, bench)
    # the saturation and bad-record paths were taken, not just the happy path
    assert seen["count_max"] and seen["overflow"] and seen["saturated_merge"] >= 3, seen
    assert seen["merges"] >= 10, seen
    if lim != (p.requests, p.chiplets, p.experts):  # an out-of-range id fits in the fields
        assert seen["bad_record"], seen
    if p.theta_min > 1:
        assert seen["cold_hit"], seen


# -- ICV -----------------------------------------------------------------------------------
@pytest.mark.parametrize("chiplets", [4, 16])
def test_icv_matches_golden(chiplets):
    """RTL ICV == golden ICV after every edge and reset; an allocation wins over a release."""
    p = SchedulerParams(chiplets=chiplets)
    rng = random.Random(chiplets)
    rst = Signal()
    dut = ICV(p)
    gold = sw_icv.ICV(p)
    full = (1 << chiplets) - 1
    seen = Counter()

    def masks():
        kind = rng.randrange(8)
        if kind == 0:  # released and allocated at once: the allocation wins
            alloc = rng.getrandbits(chiplets) | 1 << rng.randrange(chiplets)
            return alloc, alloc | rng.getrandbits(chiplets)
        if kind == 1:
            return rng.choice([(full, 0), (0, full), (full, full), (0, 0)])
        alloc = rng.getrandbits(chiplets) if rng.random() < 0.4 else 0
        release = rng.getrandbits(chiplets) & rng.getrandbits(chiplets) if rng.random() < 0.5 else 0
        return alloc, release

    async def bench(ctx):
        b = Bench(
            ctx,
            2_000,
            {"rst": rst, "alloc": dut.alloc, "release": dut.release, "value": dut.value},
        )
        b.check(ctx.get(dut.value), gold.value, "value after reset")
        last = "reset"
        for cycle in range(1000):
            if cycle % 250 == 249:  # reset, with allocations and releases pending
                ctx.set(rst, 1)
                ctx.set(dut.alloc, rng.getrandbits(chiplets))
                ctx.set(dut.release, rng.getrandbits(chiplets))
                await b.tick()
                ctx.set(rst, 0)
                gold.reset()
                seen["reset"] += 1
                last = "reset"
            alloc, release = masks()
            ctx.set(dut.alloc, alloc)
            ctx.set(dut.release, release)
            b.case = f"(last edge: {last}; now alloc {alloc:#x} release {release:#x})"
            b.check(ctx.get(dut.value), gold.value, "value")
            await b.tick()
            last = f"from {gold.value:#x} with alloc {alloc:#x} release {release:#x}"
            gold.update(alloc=alloc, release=release)
            seen["overlap"] += (alloc & release) != 0
            seen["all_ones"] += alloc == full or release == full
        b.check(ctx.get(dut.value), gold.value, "value at the end")

    simulate(ResetInserter(rst)(dut), bench)
    assert seen["overlap"] >= 50 and seen["all_ones"] and seen["reset"] == 4, seen


# -- E-C matcher ---------------------------------------------------------------------------
@pytest.mark.parametrize("chiplets", [4, 9, 16])
def test_matcher_matches_golden(chiplets):
    """Matcher c*, next_hop, slots and releases == golden for random, 1-chiplet and full trajs."""
    p = SchedulerParams(chiplets=chiplets)
    C, Cb = chiplets, p.chiplet_bits
    full = (1 << C) - 1
    rng = random.Random(chiplets)
    dut = ECMatcher(p)
    running = [0] * C
    seen = Counter()

    def trajectory():
        kind = rng.randrange(5)
        if kind == 0:
            return 1 << rng.randrange(C)
        if kind == 1:
            return full
        return rng.getrandbits(C) or 1 << rng.randrange(C)

    def idle_vector():
        kind = rng.randrange(6)
        if kind == 0:
            return 0
        if kind == 1:
            return full
        if kind == 2:
            return 1 << rng.randrange(C)
        return rng.getrandbits(C)

    async def bench(ctx):
        b = Bench(
            ctx,
            2_000,
            {
                "traj": dut.traj,
                "icv": dut.icv,
                "commit": dut.commit,
                "done": dut.done,
                "eligible": dut.eligible,
                "entry": dut.entry,
                "first": dut.first,
                "next_hop": dut.next_hop,
                "release": dut.release,
                "spurious": dut.spurious,
                "running": dut.running,
            },
        )
        for _ in range(1000):
            traj, icv = trajectory(), idle_vector()
            eligible = bool(traj & icv)
            commit = int(rng.random() < 0.3 and eligible and not running[entry_chiplet(traj, icv)])
            done = 0
            if not commit and rng.random() < 0.4:
                done = rng.getrandbits(C)
                if rng.random() < 0.3:  # exactly the running slots (no spurious bit)
                    done &= sum(1 << s for s in range(C) if running[s])
            ctx.set(dut.traj, traj)
            ctx.set(dut.icv, icv)
            ctx.set(dut.commit, commit)
            ctx.set(dut.done, done)
            b.case = f"traj {traj:#x} icv {icv:#x} running {running}"
            b.check(ctx.get(dut.eligible), int(eligible), "eligible")
            if eligible:
                b.check(ctx.get(dut.entry), entry_chiplet(traj, icv), "entry c*")
            b.check(ctx.get(dut.first), lowest_bit(traj), "first (pre-load chiplet)")
            got = tuple(unpack(ctx.get(dut.next_hop.as_value()), Cb, C))
            b.check(got, next_hops(traj, C), "next_hop")
            valid = sum(1 << s for s in range(C) if running[s])
            b.check(ctx.get(dut.running), valid, "running")
            b.check(ctx.get(dut.release), release_mask(running, done), "release")
            b.check(ctx.get(dut.spurious), int(bool(done & ~valid)), "spurious")
            seen["single"] += traj.bit_count() == 1
            seen["full"] += traj == full
            seen["choice"] += (traj & icv).bit_count() >= 2
            seen["release"] += release_mask(running, done) != 0
            seen["commit"] += commit
            await b.tick()
            if commit:
                running[entry_chiplet(traj, icv)] = traj
            for s in range(C):
                if done >> s & 1 and not (commit and s == entry_chiplet(traj, icv)):
                    running[s] = 0

    simulate(dut, bench)
    assert seen["single"] and seen["full"] and seen["choice"] >= 50, seen
    assert seen["release"] >= 10 and seen["commit"] >= 20, seen


# -- token buffer (Algorithm 2) ------------------------------------------------------------
TB_PARAMS = [
    # 1-bit timers: 0 and saturated all the time; C_fw of 2 bits
    SchedulerParams(requests=1, qos_width=1, n_threshold=3),
    SchedulerParams(requests=5, qos_width=2, n_threshold=2),
    # limits: 64 requests, 16-bit timers (admitted near 0 and near the top)
    SchedulerParams(requests=64, qos_width=16, n_threshold=5),
]


@pytest.mark.parametrize("p", TB_PARAMS, ids=["1r-q1-n3", "5r-q2-n2", "64r-q16-n5"])
def test_token_buffer_matches_golden(p):
    """Algorithm 2 RTL == golden (defer, T_QoS, C_fw); a deferral resets a non-zero C_fw."""
    rng = random.Random(p.requests * 100 + p.qos_width)
    dut = TokenBufferUnit(p)
    gold = TokenBuffer(p)
    R = p.requests
    seen = Counter()

    def t_qos():
        return rng.choice([0, 1, p.qos_max, p.qos_max - 1, rng.randrange(p.qos_max + 1)])

    async def bench(ctx):
        b = Bench(
            ctx,
            2_100,
            {
                "decide": dut.decide,
                "present": dut.present,
                "cold_hit": dut.cold_hit,
                "init.valid": dut.init.valid,
                "init.payload": dut.init.payload,
                "defer": dut.defer,
                "t_qos": dut.t_qos,
                "c_fw": dut.c_fw,
            },
        )
        for _ in range(1000):
            decide = int(rng.random() < 0.5)
            init = int(rng.random() < 0.4)
            # cold hits dense, sparse or none, so C_fw both restarts and climbs
            present = rng.getrandbits(R) | rng.getrandbits(R)
            cold = rng.choice([rng.getrandbits(R), rng.getrandbits(R) & rng.getrandbits(R), 0])
            # an id past the table (when the field has room) is ignored by both
            r, t = rng.randrange(1 << p.request_bits), t_qos()
            ctx.set(dut.decide, decide)
            ctx.set(dut.present, present)
            ctx.set(dut.cold_hit, cold)
            ctx.set(dut.init.valid, init)
            ctx.set(dut.init.payload.as_value(), req_init_bits(p, r, t))
            b.case = f"decide {decide} init {init} (request {r}, t_qos {t})"
            b.check(ctx.get(dut.init.ready), int(not decide), "init.ready")
            await b.tick()
            expected = None
            if decide:
                for q in range(R):
                    if present >> q & 1:
                        tq, cq = gold.t_qos[q], gold.c_fw[q]
                        refill = cq >= p.n_threshold
                        seen["saturated"] += refill and tq == p.qos_max
                        tq = min(tq + refill, p.qos_max)
                        cq = 0 if refill else cq
                        if cold >> q & 1:
                            seen["defer_cfw_nonzero"] += tq > 0 and cq != 0
                            seen["timer_zero"] += tq == 0
                expected = gold.decide(present, cold)
                seen["defers"] += expected.bit_count()
            elif init:
                gold.init_request(r, t)
            ctx.set(dut.decide, 0)
            ctx.set(dut.init.valid, 0)
            if expected is not None:
                b.check(ctx.get(dut.defer), expected, "defer")
            b.check(unpack(ctx.get(dut.t_qos.as_value()), p.qos_width, R), gold.t_qos, "T_QoS")
            b.check(unpack(ctx.get(dut.c_fw.as_value()), p.cfw_width, R), gold.c_fw, "C_fw")
            seen["cfw_at_max"] += p.cfw_max in gold.c_fw
            await b.tick()

    simulate(dut, bench)
    if p.n_threshold == p.cfw_max:  # C_fw climbs to its saturation value
        assert seen["cfw_at_max"], seen
    assert seen["defer_cfw_nonzero"] >= 5 and seen["timer_zero"] and seen["saturated"], seen
    assert seen["defers"] >= 20, seen


# -- pairing unit --------------------------------------------------------------------------
PAIRING_PARAMS = [
    SchedulerParams(experts=8, count_width=3, theta_min=2),
    SchedulerParams(experts=12, count_width=3, theta_min=2, balance=2),
    SchedulerParams(experts=9, count_width=3, theta_min=2, balance=3),
    # limits: 256 experts and 16-bit counts (the surplus register's width)
    SchedulerParams(experts=256, count_width=16, theta_min=2),
    SchedulerParams(experts=256, count_width=16, theta_min=2, balance=40_000),
]


def _balanced_split(order: list[int], counts: list[int], balance: int) -> int:
    """Hot picks of :func:`balanced_order` over sorted indices ``0 .. n-1``: every index
    below the last pick is one, and the last pick (where both ends meet) is one when the
    golden rule takes the hot end there (surplus not positive or the count at least
    ``balance``)."""
    if not order:
        return 0
    last = order[-1]
    surplus = sum(counts[i] - balance for i in order[:-1])
    return last + (surplus <= 0 or counts[last] >= balance)


def _pairing_counts(p, rng, v: int) -> list[int]:
    """Counts of the experts of vector ``v``: none, one, all, all but one, then a random
    number non-zero; around ``balance`` (or small), sometimes at ``count_max``."""
    active = [0, 1, p.experts, p.experts - 1][v] if v < 4 else rng.randint(0, p.experts)
    top = 2 * p.balance if p.balance else 2 * max(1, p.theta_min)
    counts = [0] * p.experts
    for e in rng.sample(range(p.experts), active):
        c = p.count_max if rng.random() < 0.1 else rng.randint(1, top)
        counts[e] = min(c, p.count_max)
    return counts


@pytest.mark.parametrize(
    "p",
    PAIRING_PARAMS,
    ids=["8e-paired", "12e-balanced2", "9e-balanced3", "256e-w16-paired", "256e-w16-balanced"],
)
def test_pairing_matches_golden(p):
    """Split, positions and partners == golden paired and balanced orders over random n."""
    rng = random.Random(p.experts * 10 + p.balance)
    dut = PairingUnit(p)
    vec = data.ArrayLayout(key_layout(p), p.sorter_lanes)
    vectors = 12 if p.experts > 64 else 60
    seen = Counter()

    async def bench(ctx):
        b = Bench(
            ctx,
            vectors * (p.experts + 3) + 10,
            {
                "n": dut.n,
                "index": dut.index,
                "start": dut.start,
                "built": dut.built,
                "split": dut.split,
                "hot_position": dut.hot_position,
                "cold_position": dut.cold_position,
                "partner": dut.partner,
                "partner_valid": dut.partner_valid,
            },
        )
        for v in range(vectors):
            counts = _pairing_counts(p, rng, v)
            keys = sort_keys(sorter_keys(counts, p.sorter_lanes), p.sorter)
            n = sum(1 for c in counts if c)
            sorted_counts = [c for c, _ in keys[:n]]
            if p.balance:
                order = balanced_order(list(range(n)), sorted_counts, p.balance)
                split = _balanced_split(order, sorted_counts, p.balance)
            else:
                order = [paired_index(k, n) for k in range(n)]
                split = (n + 1) // 2
            position = {i: k for k, i in enumerate(order)}
            ctx.set(
                dut.keys.as_value(),
                vec.const([{"count": c, "id": e, "traj": 0} for c, e in keys]).as_bits(),
            )
            ctx.set(dut.n, n)
            b.case = f"vector {v}, n {n}, counts {sorted_counts[:16]}..."
            if p.balance:
                ctx.set(dut.start, 1)
                await b.tick()
                ctx.set(dut.start, 0)
                took = await b.until(lambda: ctx.get(dut.built), "built", p.experts + 2)
                b.check(took, n, "cycles to build the order")
            b.check(ctx.get(dut.split), split, "split")
            for i in range(n + 1 if n < p.sorter_lanes else n):
                ctx.set(dut.index, i)
                ctx.set(dut.hot_index, i)
                ctx.set(dut.cold_index, i)
                b.case = f"vector {v}, n {n}, index {i}, order {order[:16]}..."
                if i == n:  # past the list: no partner
                    b.check(ctx.get(dut.partner_valid), 0, "partner_valid past n")
                    continue
                port = dut.hot_position if i < split or p.balance else dut.cold_position
                b.check(ctx.get(port), position[i], "position")
                if p.balance:
                    b.check(ctx.get(dut.cold_position), position[i], "cold_position")
                q = partner(position[i], n)
                b.check(ctx.get(dut.partner_valid), int(q is not None), "partner_valid")
                if q is not None:
                    b.check(ctx.get(dut.partner), order[q], "partner")
                seen["checks"] += 1
                seen["hot" if i < split else "cold"] += 1
            seen["odd"] += n % 2
            seen["full"] += n == p.experts
        if p.balance:
            await b.tick()

    simulate(dut, bench, clock=bool(p.balance))
    assert seen["hot"] and seen["cold"] and seen["odd"] and seen["full"], seen


# -- latencies -------------------------------------------------------------------------------
@pytest.mark.parametrize("p", EIT_PARAMS[:3], ids=["8e-w4", "12e-w2", "32e-w16"])
def test_eit_latency_is_measured(p):
    """``EIT.latency``: a record transferred in cycle 0 first counts in ``count``/``mask``
    in cycle ``latency`` (measured on every lane of a word, and for a merge)."""
    dut = EIT(p)
    lay = record_layout(p)
    seen = []

    async def bench(ctx):
        b = Bench(ctx, 200, {"rec.valid": dut.rec.valid, "count": dut.count})
        for expert in (0, p.experts - 1, p.experts // 2):
            ctx.set(dut.rec.valid, 1)
            ctx.set(dut.rec.payload, lay.const({"request": 0, "chiplet": 1, "expert": expert}))
            assert ctx.get(dut.rec.ready)  # always ready: the constant 1
            before = ctx.get(dut.count[expert])
            await b.tick()  # the transfer (cycle 0) ends here
            ctx.set(dut.rec.valid, 0)
            cycles = 1 + await b.until(
                lambda e=expert, v=before: ctx.get(dut.count[e]) != v, "record", 10
            )
            b.check(ctx.get(dut.mask[expert]) >> 1 & 1, 1, "mask bit of chiplet 1")
            seen.append(cycles)
            await b.tick(3)
        # a re-merge of word 0 issued in cycle 0 (request 0 excluded: the count drops)
        ctx.set(dut.merge_en, 1)
        ctx.set(dut.merge_addr, 0)
        ctx.set(dut.merge_include, 0)
        await b.tick()
        ctx.set(dut.merge_en, 0)
        seen.append(1 + await b.until(lambda: ctx.get(dut.count[0]) == 0, "merge", 10))

    simulate(dut, bench)
    assert seen == [dut.latency] * 4


@pytest.mark.parametrize("chiplets", [4, 16])
def test_icv_latency_is_measured(chiplets):
    """``ICV.latency``: an allocation, then a release, of cycle 0 shows on ``value`` in
    cycle ``latency`` and not before."""
    p = SchedulerParams(chiplets=chiplets, experts=8)
    dut = ICV(p)
    full = (1 << chiplets) - 1
    seen = []

    async def bench(ctx):
        b = Bench(ctx, 50, {"value": dut.value})
        for port, want in ((dut.alloc, full & ~0b101), (dut.release, full)):
            ctx.set(port, 0b101)
            await b.tick()
            ctx.set(port, 0)
            seen.append(1 + await b.until(lambda w=want: ctx.get(dut.value) == w, "update", 5))

    simulate(dut, bench)
    assert seen == [dut.latency] * 2


def test_token_buffer_latency_is_measured():
    """``TokenBufferUnit.latency``: a ``decide`` strobe of cycle 0 shows its defer mask in
    cycle ``latency``."""
    p = TB_PARAMS[1]
    dut = TokenBufferUnit(p)
    seen = []

    async def bench(ctx):
        b = Bench(ctx, 50, {"defer": dut.defer})
        ctx.set(dut.init.valid, 1)
        ctx.set(dut.init.payload.as_value(), req_init_bits(p, 1, p.qos_max))
        await b.tick()
        ctx.set(dut.init.valid, 0)
        ctx.set(dut.present, 0b11)
        ctx.set(dut.cold_hit, 0b10)  # request 1 has slack: deferred
        ctx.set(dut.decide, 1)
        await b.tick()
        ctx.set(dut.decide, 0)
        seen.append(1 + await b.until(lambda: ctx.get(dut.defer) == 0b10, "defer", 5))

    simulate(dut, bench)
    assert seen == [dut.latency]
