"""Golden-model unit and property tests (fast, no simulator)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsedp.errors import InputError
from fsedp.params import SchedulerParams
from fsedp.sw.eit import EIT, GateRecord
from fsedp.sw.icv import ICV
from fsedp.sw.matcher import entry_chiplet, next_hops, release_mask
from fsedp.sw.pairing import balanced_order, paired_index, partner
from fsedp.sw.scheduler import DISPATCH, Scheduler, run_round
from fsedp.sw.sorter import (
    SORTERS,
    apply_network,
    bitonic_schedule,
    bitonic_sort,
    network,
    shuffle_lane,
    sort_keys,
    sorter_keys,
    stage_count,
)
from fsedp.sw.token_buffer import TokenBuffer
from fsedp.tb.scoreboard import random_round


@pytest.mark.parametrize("lanes", [2, 8, 16, 64, 256])
def test_schedule_shape(lanes):
    sched = bitonic_schedule(lanes)
    assert len(sched) == stage_count(lanes)
    for stage in sched:  # every lane used exactly once per stage
        assert sorted(x for pair in stage for x in pair) == list(range(lanes))


@given(st.lists(st.integers(0, 7), min_size=1, max_size=40))
def test_sorter_is_descending_count_then_id(counts):
    lanes = 1 << max(3, (len(counts) - 1).bit_length())
    out = bitonic_sort(sorter_keys(counts, lanes))
    assert out == sorted(sorter_keys(counts, lanes), key=lambda k: (-k[0], k[1]))


@pytest.mark.parametrize("kind", SORTERS)
@given(counts=st.lists(st.integers(0, 5), min_size=1, max_size=70), seed=st.integers(0, 99))
def test_every_sorter_network_sorts_with_payload(kind, counts, seed):
    """Every variant's network, applied step by step, sorts any input order (ties on count
    by id), and a field after the id rides along with its key."""
    lanes = 1 << max(3, (len(counts) - 1).bit_length())
    keys = [(c, i, (i * 7 + seed) % 16) for c, i in sorter_keys(counts, lanes)]
    random.Random(seed).shuffle(keys)
    out = apply_network(keys, network(lanes, kind))
    assert out == sorted(keys, key=lambda k: (-k[0], k[1]))
    # the golden scheduler's fast interpretation gives the network's result
    assert sort_keys(keys, kind) == out


@pytest.mark.parametrize("lanes", [8, 16, 64, 128, 256])
def test_sorter_network_sizes(lanes):
    """Step and cycle counts of each variant (docs/blocks/sorter.md): the bitonic network has
    m(m+1)/2 stages; the shuffle-exchange one m^2 - m + 1 steps (m = log2 lanes), every
    step a perfect shuffle then compare-exchanges between lanes 2q and 2q+1 only, padded
    in front to whole cycles."""
    m = lanes.bit_length() - 1
    assert len(network(lanes, "parallel").steps) == m * (m + 1) // 2
    assert network(lanes, "stage").cycles == m * (m + 1) // 2
    one, two = network(lanes, "shuffle"), network(lanes, "shuffle2")
    assert len(one.steps) == m * m - m + 1 and one.cycles == len(one.steps)
    assert two.cycles == (m * m - m + 2) // 2
    for step in one.steps + two.steps:
        assert step.shuffle
        assert all(a ^ b == 1 for a, b in step.pairs)
    assert [shuffle_lane(i, 3) for i in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]


def test_sorter_rejects_non_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        bitonic_schedule(12)


@given(st.integers(1, 40))
def test_paired_order_is_a_permutation_from_both_ends(n):
    idx = [paired_index(k, n) for k in range(n)]
    assert sorted(idx) == list(range(n))
    assert idx[:2] == ([0, n - 1] if n > 1 else [0])
    for k in range(n):
        q = partner(k, n)
        assert q is None or partner(q, n) == k


def test_params_reject_bad_values_with_field():
    with pytest.raises(InputError) as e:
        SchedulerParams(chiplets=3)
    assert e.value.field == "chiplets" and "3" in str(e.value)
    with pytest.raises(InputError):
        SchedulerParams(experts=300)
    with pytest.raises(InputError):
        SchedulerParams(count_width=2, theta_min=4)


def test_eit_saturates_and_flags():
    p = SchedulerParams(count_width=2, theta_min=1)
    eit = EIT(p)
    for _ in range(5):
        eit.write(GateRecord(0, 1, 3))
    assert eit.count[0][3] == 3 and eit.overflow
    eit.write(GateRecord(0, 9, 3))
    assert eit.bad_record
    s = eit.scan(3, include=0b1, clear=True)
    assert (s.count, s.mask, s.present) == (3, 0b10, 0b1)
    assert eit.scan(3, include=0b1).count == 0


def test_eit_merge_excludes_requests():
    p = SchedulerParams()
    eit = EIT(p)
    eit.write(GateRecord(0, 0, 5))
    eit.write(GateRecord(1, 2, 5))
    eit.write(GateRecord(1, 3, 5))
    assert eit.scan(5, 0b11).count == 3 and eit.scan(5, 0b11).mask == 0b1101
    assert eit.scan(5, 0b01).count == 1 and eit.scan(5, 0b01).mask == 0b0001
    assert eit.scan(5, 0b01).present == 0b11


@pytest.mark.parametrize("count_width", [2, 3, 8])
@pytest.mark.parametrize("seed", range(6))
def test_eit_merged_equals_per_expert_scans(count_width, seed):
    """The golden scheduler's bulk write and all-experts scan (``EIT.write_many``,
    ``EIT.merged``) equal the RTL-shaped write and scan of one record / expert at a time:
    counts (saturating sums, small widths fill), masks, present bits, the overflow flag, and
    the table after a clearing pass."""
    p = SchedulerParams(experts=16, chiplets=4, requests=4, count_width=count_width, theta_min=1)
    rng = random.Random(seed)
    a, b = EIT(p), EIT(p)
    saturated = False
    for _ in range(3):  # several rounds: clearing passes leave the table empty again
        recs = [
            (rng.randrange(p.requests), rng.randrange(p.chiplets), rng.randrange(6))
            for _ in range(rng.randrange(1, 40))
        ]
        a.write_many(recs)  # the golden scheduler's bulk write ...
        for rec in recs:  # ... equals the RTL-shaped write of one record at a time
            b.write(GateRecord(*rec))
        for include, clear in ((rng.randrange(16), False), (rng.randrange(16), True)):
            a.overflow = b.overflow = False
            counts, masks, present = a.merged(include, clear)
            scans = [b.scan(e, include, clear) for e in range(p.experts)]
            assert counts == [s.count for s in scans]
            assert masks == [s.mask for s in scans]
            assert present == [s.present for s in scans]
            assert a.overflow == b.overflow
            assert a.count == b.count and a.mask == b.mask
            saturated |= a.overflow
    if count_width == 2:  # the saturation path was exercised
        assert saturated


def test_token_buffer_algorithm2():
    p = SchedulerParams(n_threshold=2, qos_width=2)
    tb = TokenBuffer(p)
    tb.init_request(0, 1)
    assert tb.decide(present=0b1, cold_hit=0b1) == 0b1  # slack: defer, T 1 -> 0
    assert tb.t_qos[0] == 0 and tb.c_fw[0] == 0
    assert tb.decide(0b1, 0b1) == 0  # no slack left
    assert tb.decide(0b1, 0b1) == 0 and tb.c_fw[0] == 2
    assert tb.decide(0b1, 0b1) == 0b1  # C_fw reached N: T += 1, defer
    assert tb.decide(0b10, 0b10) == 0  # absent request 0 untouched
    assert tb.c_fw[0] == 0 and tb.c_fw[1] == 1
    tb.init_request(9, 3)  # outside the table: ignored
    tb.init_request(0, 99)
    assert tb.t_qos[0] == p.qos_max  # saturates


def test_icv_alloc_wins_over_release():
    icv = ICV(SchedulerParams())
    icv.update(alloc=0b0110)
    assert icv.value == 0b1001
    icv.update(alloc=0b0010, release=0b0110)
    assert icv.value == 0b1101


def test_matcher_ring_and_release():
    assert next_hops(0b1011, 4) == (1, 3, 0, 0)
    assert next_hops(0b0100, 4) == (0, 0, 2, 0)
    assert entry_chiplet(0b1110, 0b1100) == 2
    # chiplet 1 is shared by two running experts: idle only when both have completed
    running = [0b0011, 0b0110, 0, 0]
    assert release_mask(running, 0b01) == 0b0001
    assert release_mask(running, 0b11) == 0b0111


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    chiplets=st.integers(4, 16),
    experts=st.integers(8, 64),
    policy=st.sampled_from([{}, {"order": "sorted"}, {"balance": 3, "entry_dispatch": True}]),
)
def test_scheduler_round_invariants(seed, chiplets, experts, policy):
    generics = {k: v for k, v in policy.items() if k != "order"}
    p = SchedulerParams(
        chiplets=chiplets,
        experts=experts,
        requests=4,
        theta_min=2,
        n_threshold=2,
        qos_width=2,
        **generics,
    )
    rng = random.Random(seed)
    s = Scheduler(p, order=policy.get("order", "paired"))
    for _ in range(3):
        rnd = random_round(p, rng)
        for r, t in rnd.req_inits:
            s.init_request(r, t)

        def pick(running):  # complete a random non-empty subset of the running slots
            slots = [i for i, t in enumerate(running) if t]
            chosen = [i for i in slots if rng.random() < 0.5] or slots[:1]
            return sum(1 << i for i in chosen)

        plan, events = run_round(s, rnd.records, pick)
        dispatched = [d.expert for k, d in events if k == "dispatch"]
        preloaded = [d.expert for k, d in events if k == "preload"]
        active = [e for e in range(p.experts) if plan.counts[e]]
        assert sorted(dispatched) == active  # each active expert exactly once
        assert len(preloaded) == len(set(preloaded))  # at most one pre-load each
        assert s.icv.value == (1 << chiplets) - 1 and not any(s.running)
        running = 0
        for kind, d in events:
            if kind == "dispatch":
                assert d.traj & (1 << d.entry) and d.count == plan.counts[d.expert]
                assert not running >> d.entry & 1  # entry slots are distinct
                running |= 1 << d.entry
            elif kind == "done":
                running &= ~d
        # deferred requests' tokens are out of the layer
        deferred = [r for r in range(p.requests) if plan.defer >> r & 1]
        kept = [rec for rec in rnd.records if rec[0] not in deferred]
        assert sum(plan.counts) == len(kept) or s.eit.overflow


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(1, 300), min_size=1, max_size=64), balance=st.integers(1, 100))
def test_balanced_order_from_both_ends(counts, balance):
    """Scheduler decision 27: a permutation that takes the hottest expert whenever the running
    surplus over ``balance`` is not positive (or no cold one is left), else the coldest."""
    experts = sorted(range(len(counts)), key=lambda e: (-counts[e], e))
    order = balanced_order(experts, counts, balance)
    assert sorted(order) == sorted(experts) and order[0] == experts[0]
    surplus, hot, cold = 0, 0, len(experts) - 1
    for e in order:
        want_hot = surplus <= 0 or counts[experts[cold]] >= balance
        assert e == (experts[hot] if want_hot else experts[cold])
        hot, cold = (hot + 1, cold) if want_hot else (hot, cold - 1)
        surplus += counts[e] - balance
    # all on one side of the balance: the sorted order itself
    assert balanced_order(experts, [balance] * len(counts), balance) == experts


def test_entry_dispatch_streams_overlapping_experts_at_once():
    """Scheduler decision 28: with ``entry_dispatch`` experts whose trajectories overlap run
    at once, one per entry chiplet; with the ICV of Algorithm 1 only one of them runs."""
    records = [(0, c, e) for e in range(3) for c in range(4)]  # every trajectory is 0b1111
    for entry, running in ((False, 1), (True, 3)):
        p = SchedulerParams(chiplets=4, experts=8, requests=2, theta_min=0, entry_dispatch=entry)
        s = Scheduler(p)
        s.start_round(records)
        beats = [b for b in s.decide() if b.kind == DISPATCH]
        assert len(beats) == running and len({b.entry for b in beats}) == running
