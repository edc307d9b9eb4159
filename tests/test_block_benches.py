"""Every block's bench ``tb/tb_<block>.py``, one body run in two tiers: Amaranth's Python
simulator (``[amaranth-...]``, marker ``amaranth_tier``: fast, no HDL simulator) and cocotb
on the generated Verilog under Verilator and Icarus (``[verilator-...]``, ``[icarus-...]``,
marker ``cocotb_tier``; skipped where the simulator is missing).  ``pytest -k eit``
finds a block's tests, ``-m amaranth_tier`` a tier's.

Each test also asserts that the corner cases its bench is there for were hit (the bench's
report counts them): saturation, bad records, deferrals of requests with a non-zero
``C_fw``, back-pressure, overflow...  The Amaranth tier runs the wider parameter sets (at
the generics' limits); the cocotb tier the two shapes of ``tests/test_cocotb.py``.  The
scheduler top (``test_scheduler``) runs its Amaranth tier here; its cocotb tier is
``tests/test_cocotb.py::test_scheduler`` (the same body, which ``fsedp rtl rounds`` and
``cosim`` run too).
"""

import dataclasses
import importlib

import pytest
from test_cocotb import ODD, SMALL, run

from fsedp.params import DatapathParams, SchedulerParams
from fsedp.sw.sorter import SORTERS, network
from fsedp.tb.bench import run_amaranth

COCOTB = ("verilator", "icarus")


def bench(block: str, p, tier: str, knobs: dict) -> dict:
    """Run ``tb/tb_<block>.py``'s body on ``tier``; its report."""
    if tier == "amaranth":
        mod = importlib.import_module(f"fsedp.tb.tb_{block}")
        dut = mod.component(p, knobs["chiplet"]) if "chiplet" in knobs else mod.component(p)
        return run_amaranth(dut, mod.bench, p, knobs)
    return run(block, p, tier, knobs=knobs)


def cases(amaranth: dict, cocotb: dict) -> list:
    """``pytest.param(tier, p, knobs)`` per tier: ``amaranth``/``cocotb`` map an id to
    ``(params, knobs)``."""
    out = [
        pytest.param("amaranth", p, k, id=f"amaranth-{name}", marks=pytest.mark.amaranth_tier)
        for name, (p, k) in amaranth.items()
    ]
    for sim in COCOTB:
        out += [
            pytest.param(sim, p, k, id=f"{sim}-{name}", marks=pytest.mark.cocotb_tier)
            for name, (p, k) in cocotb.items()
        ]
    return out


TIER_ARGS = "tier,p,knobs"


# -- EIT -------------------------------------------------------------------------------------
EIT_PARAMS = {
    # counts saturate after 3 (7) records; out-of-range ids fit in the fields of the second
    "4c8e-w2": SchedulerParams(
        chiplets=4, experts=8, requests=2, count_width=2, theta_min=2, eit_lanes=4
    ),
    "5c12e-w3": SchedulerParams(
        chiplets=5, experts=12, requests=3, count_width=3, theta_min=5, eit_lanes=2
    ),
    # limits: 1-bit counts, 16 chiplets, 16 lanes per word, one lane per word
    "16c32e-w1-16lanes": SchedulerParams(
        chiplets=16, experts=32, requests=5, count_width=1, theta_min=1, eit_lanes=16
    ),
    "16c9e-1req-1lane": SchedulerParams(
        chiplets=16, experts=9, requests=1, count_width=2, theta_min=3, eit_lanes=1
    ),
    # 128 experts (256 overflows the recursion of Amaranth's simulator compiler)
    "4c128e-w3": SchedulerParams(
        chiplets=4, experts=128, requests=2, count_width=3, theta_min=4, eit_lanes=8
    ),
}


@pytest.mark.parametrize(
    TIER_ARGS,
    cases(
        {k: (p, {"seed": p.chiplets * 1000 + p.experts}) for k, p in EIT_PARAMS.items()},
        {"8e": (SMALL, {"seed": 5, "rounds": 30}), "12e-w3": (ODD, {"seed": 5, "rounds": 30})},
    ),
)
def test_eit(tier, p, knobs):
    """RTL EIT == golden EIT each round, re-merge and clear, with saturating counts and bad ids."""
    res = bench("eit", p, tier, knobs)
    assert res["rounds"] == knobs.get("rounds", 40)
    # the saturation and bad-record paths were taken, not just the happy path
    assert res["count_max"] and res["overflow"] and res["saturated_merge"] >= 3, res
    assert res["merges"] >= 10, res
    if (1 << p.request_bits, 1 << p.chiplet_bits, 1 << p.expert_bits) != (
        p.requests,
        p.chiplets,
        p.experts,
    ):  # an out-of-range id fits in the fields
        assert res["bad_record"], res
    if p.theta_min > 1:
        assert res["cold_hit"], res


# -- ICV -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    TIER_ARGS,
    cases(
        {f"{c}c": (SchedulerParams(chiplets=c), {"seed": c}) for c in (4, 16)},
        {
            "8e": (SMALL, {"seed": 5, "cycles": 400, "reset_every": 100}),
            "12e-w3": (ODD, {"seed": 5, "cycles": 400, "reset_every": 100}),
        },
    ),
)
def test_icv(tier, p, knobs):
    """RTL ICV == golden ICV after every edge and reset; an allocation wins over a release."""
    res = bench("icv", p, tier, knobs)
    cycles = knobs.get("cycles", 1000)
    assert res["cycles"] == cycles and res["reset"] == cycles // knobs.get("reset_every", 250)
    assert res["overlap"] >= cycles // 20 and res["all_ones"], res


# -- E-C matcher -----------------------------------------------------------------------------
#: the cycle ring path ([D17]): next-hop tables along its sequence, not the chiplet numbers
CYCLE16 = SchedulerParams(chiplets=16, mesh_cols=4, ring_path="cycle")


@pytest.mark.parametrize(
    TIER_ARGS,
    cases(
        {
            **{f"{c}c": (SchedulerParams(chiplets=c), {"seed": c}) for c in (4, 9, 16)},
            "16c-cycle": (CYCLE16, {"seed": 7}),
        },
        {
            "8e": (SMALL, {"seed": 5, "cycles": 400}),
            "12e-w3": (ODD, {"seed": 5, "cycles": 400}),
            "16c-cycle": (CYCLE16, {"seed": 7, "cycles": 400}),
        },
    ),
)
def test_matcher(tier, p, knobs):
    """Matcher c*, next_hop, slots and releases == golden for random, 1-chiplet and full trajs."""
    res = bench("matcher", p, tier, knobs)
    n = knobs.get("cycles", 1000)
    assert res["checks"] == n and res["single"] and res["full"], res
    assert res["choice"] >= n // 20 and res["release"] >= n // 100 and res["commit"] >= n // 50


# -- token buffer (Algorithm 2) --------------------------------------------------------------
TB_PARAMS = {
    # 1-bit timers: 0 and saturated all the time; C_fw of 2 bits
    "1r-q1-n3": SchedulerParams(requests=1, qos_width=1, n_threshold=3),
    "5r-q2-n2": SchedulerParams(requests=5, qos_width=2, n_threshold=2),
    # limits: 64 requests, 16-bit timers (admitted near 0 and near the top)
    "64r-q16-n5": SchedulerParams(requests=64, qos_width=16, n_threshold=5),
}


@pytest.mark.parametrize(
    TIER_ARGS,
    cases(
        {k: (p, {"seed": p.requests * 100 + p.qos_width}) for k, p in TB_PARAMS.items()},
        {"8e": (SMALL, {"seed": 5, "cycles": 300}), "12e-w3": (ODD, {"seed": 5, "cycles": 300})},
    ),
)
def test_token_buffer(tier, p, knobs):
    """Algorithm 2 RTL == golden (defer, T_QoS, C_fw); a deferral resets a non-zero C_fw."""
    res = bench("token_buffer", p, tier, knobs)
    if p.n_threshold == p.cfw_max:  # C_fw climbs to its saturation value
        assert res["cfw_at_max"], res
    assert res["defer_cfw_nonzero"] >= 5 and res["timer_zero"] and res["saturated"], res
    assert res["defers"] >= 20 and res["admissions"] >= 20, res


# -- pairing unit ----------------------------------------------------------------------------
PAIRING_PARAMS = {
    "8e-paired": SchedulerParams(experts=8, count_width=3, theta_min=2),
    "12e-balanced2": SchedulerParams(experts=12, count_width=3, theta_min=2, balance=2),
    "9e-balanced3": SchedulerParams(experts=9, count_width=3, theta_min=2, balance=3),
    # limits: 256 experts and 16-bit counts (the surplus register's width)
    "256e-w16-paired": SchedulerParams(experts=256, count_width=16, theta_min=2),
    "256e-w16-balanced": SchedulerParams(experts=256, count_width=16, theta_min=2, balance=40_000),
}


@pytest.mark.parametrize(
    TIER_ARGS,
    cases(
        {k: (p, {"seed": p.experts * 10 + p.balance}) for k, p in PAIRING_PARAMS.items()},
        {
            "8e": (SMALL, {"seed": 5, "vectors": 12}),
            "12e-w3": (ODD, {"seed": 5, "vectors": 12}),
            "12e-balanced2": (PAIRING_PARAMS["12e-balanced2"], {"seed": 5, "vectors": 12}),
        },
    ),
)
def test_pairing(tier, p, knobs):
    """Split, positions and partners == golden paired and balanced orders over random n."""
    res = bench("pairing", p, tier, knobs)
    assert res["hot"] and res["cold"] and res["odd"] and res["full"], res


# -- sorter ----------------------------------------------------------------------------------
SORTER_COCOTB = {f"8e-{kind}": dataclasses.replace(SMALL, sorter=kind) for kind in SORTERS} | {
    f"12e-w3-{kind}": dataclasses.replace(ODD, sorter=kind) for kind in ("shuffle2", "stage")
}


@pytest.mark.parametrize(
    TIER_ARGS,
    cases(
        {
            f"{e}e-{kind}": (SchedulerParams(experts=e, sorter=kind), {"seed": e, "vectors": 40})
            for e in (8, 12)
            for kind in SORTERS
        },
        {k: (p, {"seed": 3, "vectors": 40}) for k, p in SORTER_COCOTB.items()},
    ),
)
def test_sorter(tier, p, knobs):
    """Sorted vectors == golden in order under pauses and back-pressure; the measured
    latency is the network's."""
    res = bench("sorter", p, tier, knobs)
    assert res["vectors"] == knobs["vectors"] and res["stalled"] > 0, res
    assert res["latency"] == network(p.sorter_lanes, p.sorter).cycles


# -- scheduler top ---------------------------------------------------------------------------
def sched(c, e, r, theta_min=3, **kw) -> SchedulerParams:
    # 5-bit counts: the hammered round saturates one in 34 records
    return SchedulerParams(chiplets=c, experts=e, requests=r, count_width=5, theta_min=theta_min,
                           n_threshold=2, qos_width=2, **kw)  # fmt: skip


#: random rounds (a full table in round 3, one expert hammered to its count limit in round
#: 5) under pauses and back-pressure (30 %), a reset in round 4 of some; every round's first
#: dispatch at exactly ``Scheduler.latency`` (+ the deferral's re-merge, + the balanced build)
SCHED_RANDOM = {
    "4c8e-4r": (sched(4, 8, 4), {"reset_every": 5}),
    "5c12e-3r-bad": (sched(5, 12, 3), {"reset_every": 5, "bad_records": 0.02}),
    "9c16e-8r": (sched(9, 16, 8), {}),
    # A6's scheduler generics: the balanced order and experts at once (decisions 27-28)
    "4c8e-4r-a6": (sched(4, 8, 4, balance=3, entry_dispatch=True), {}),
    "5c12e-3r-balanced2": (sched(5, 12, 3, balance=2), {"reset_every": 5}),
    "9c16e-8r-entry": (sched(9, 16, 8, entry_dispatch=True), {}),
    "4c16e-4r-balanced40-entry": (sched(4, 16, 4, balance=40, entry_dispatch=True), {}),
}
#: the measured latency of every sorter variant (nothing deferred, no pause, no back-pressure)
SCHED_LATENCY = {
    "shuffle2-8": sched(4, 8, 2, theta_min=0),
    "parallel-12": sched(5, 12, 2, theta_min=0, sorter="parallel"),
    "stage-32": sched(4, 32, 2, theta_min=0, sorter="stage"),
    "shuffle-16": sched(9, 16, 2, theta_min=0, sorter="shuffle"),
    "balance-16": sched(4, 16, 2, theta_min=0, balance=3, entry_dispatch=True),
}


@pytest.mark.parametrize(
    TIER_ARGS,
    cases(
        {
            k: (p, {"seed": p.chiplets * 100 + p.experts, "rounds": 6, "stall": 0.3, **kn})
            for k, (p, kn) in SCHED_RANDOM.items()
        }
        | {
            f"latency-{k}": (p, {"seed": p.experts, "rounds": 3, "stall": 0.0, "tokens": 2})
            for k, p in SCHED_LATENCY.items()
        },
        {},  # the cocotb tier: tests/test_cocotb.py::test_scheduler (and fsedp rtl cosim)
    ),
)
def test_scheduler(tier, p, knobs):
    """Scheduler top (``tb/tb_scheduler.py``) == golden model beat by beat, the end of every
    round (defer mask, active experts, flags) and mid-round resets; the first dispatch of
    every round at exactly its documented latency."""
    res = bench("scheduler", p, tier, {**knobs, "exact_latency": True})
    assert res["mismatches"] == 0 and res["beats"] > 0, res["first_mismatches"]
    assert res["rounds"] + res["resets"] == knobs["rounds"], res
    assert res["latency_checked"] == len(res["latency_first_dispatch"]) > 0, res
    if knobs.get("reset_every"):
        assert res["resets"] >= 1, res
    if knobs["stall"]:  # back-pressure held dispatch beats
        assert res["dispatch_stalled"] > 0, res
    if p.theta_min == 0:  # nothing deferred: the plain latency, every round
        assert not res["latency_first_dispatch_deferral"], res
        assert res["rounds"] == len(res["latency_first_dispatch_plain"]), res


# -- datapath: ring buffer, router, DDR controller --------------------------------------------
DP_2X2 = DatapathParams(
    rows=2, cols=2, experts=8, slots=5, micro_slices=3, link_cycles=2, ddr_interval=2,
    ddr_latency=6, preload_entries=2,
)  # fmt: skip
#: a 3 x 3 mesh: chiplet 4 has all four neighbours, 3-cycle links
DP_3X3 = dataclasses.replace(DP_2X2, rows=3, cols=3, slots=12, link_cycles=3)
#: the cases of the per-chiplet blocks (ring buffer, router): a corner chiplet of the 2x2
#: mesh and the middle one of the 3x3 in the fast tier, the corner under cocotb
CHIPLET_CASES = cases(
    {
        "2x2-c0": (DP_2X2, {"seed": 3, "cycles": 300}),
        "3x3-c4": (DP_3X3, {"seed": 4, "cycles": 300, "chiplet": 4}),
    },
    {"2x2": (DP_2X2, {"seed": 3, "cycles": 300})},
)


@pytest.mark.parametrize(TIER_ARGS, CHIPLET_CASES)
def test_ring_buffer(tier, p, knobs):
    """Free slots, reservation slot, offers and compute candidate == golden slot model under
    link arrivals, DDR deliveries (held and un-held), transfers, computes and resets."""
    res = bench("ring_buffer", p, tier, knobs)
    assert res["cycles"] == knobs["cycles"] and res["resets"] >= 1, res
    assert res["arrivals"] >= 20 and res["deliveries"] >= 10 and res["sent"] >= 20, res
    assert res["computed"] >= 20 and res["released"] >= 20, res
    # back-pressure (a full buffer), Rule 1 over Rule 2, pre-loads held and released
    assert res["full"] and res["rule1"] and res["held"] and res["unheld"], res


@pytest.mark.parametrize(TIER_ARGS, CHIPLET_CASES)
def test_router(tier, p, knobs):
    """Link outputs, offer accepts, the granted input and link accepts == golden router."""
    res = bench("router", p, tier, knobs)
    assert res["cycles"] == knobs["cycles"] and res["sent"] >= 20 and res["granted"] >= 20, res
    # busy links, stalls, refused admissions, contention, rx back-pressure
    assert res["busy_blocked"] and res["stalled"] and res["refused"], res
    assert res["contended"] and res["rx_stalled"] and res["resv_refused"], res
    if knobs.get("chiplet", 0) == 0:  # a corner: two directions lead off the mesh
        assert res["edge"], res


@pytest.mark.parametrize(
    TIER_ARGS,
    cases(
        {
            "2x2": (DP_2X2, {"seed": 3, "cycles": 500}),
            "2x2-ddr4": (
                dataclasses.replace(DP_2X2, ddr_channels=4, slots=6),
                {"seed": 3, "cycles": 250},
            ),
        },
        {"2x2": (DP_2X2, {"seed": 3, "cycles": 400})},
    ),
)
def test_ddr_ctrl(tier, p, knobs):
    """Reservations, deliveries, un-holds, done, flags == golden DDR controller."""
    res = bench("ddr_ctrl", p, tier, knobs)
    assert res["cycles"] == knobs["cycles"] and res["resets"] >= 1, res
    assert res["jobs"] >= 10 and res["preloads"] and res["issues"] >= 20, res
    assert res["deliveries"] >= 20 and res["done"] >= 5 and res["retired"] >= 20, res
    # malformed beats, pre-loads delivered held and un-held, back-pressure and stalls
    assert res["bad"] and res["held"] and res["unholds"] and res["done_stalled"], res
    assert res["ddr_stalls"] and res["full"] and res["orphans"], res
