"""Exact expectations of the offload model's clock (``fsedp.sw.policies.offload``) on cases
worked out by hand: whole seconds of link and compute, so that every figure of the
synchronous and the asynchronous issue can be checked on paper -- what the device waits
for, what the host's clock is charged for, and when a prefetched unit arrives."""

from types import SimpleNamespace

import numpy as np
import pytest

from fsedp.sw.policies.offload import (
    CHIP_LINK,
    Cost,
    FrequencyPrefetcher,
    Link,
    LRUCache,
    OffloadRuntime,
    OffloadStats,
    OraclePrefetcher,
    Prefetcher,
    TransitionPrefetcher,
    links,
    popularity_order,
)

#: 1 GB units over a 1 GB/s link without latency: one transfer, 1 s
LINK = Link("test", 1.0, 0.0)


def cost(**kw) -> Cost:
    """1 s per token of a unit, 0.5 s launch overhead per unit, no dense part."""
    base = dict(unit_bytes=1e9, unit_flops=1.0, dense_flops=0.0, flops=1.0, overhead_s=0.5)
    base.update(kw)
    return Cost(**base)


def two_layers(c: Cost, prefetcher=None) -> OffloadRuntime:
    """Capacity 1 per layer, unit 0 resident in both; one step: layer 0 runs units 0 and 1
    (one token each), layer 1 runs unit 2 (two tokens)."""
    rt = OffloadRuntime(2, 4, 1, LINK, c, prefetcher, initial=[[0], [0]], prefetch_count=1)
    rt.layer_step(0, 0, np.array([0, 1]), np.array([1, 1]), 2)
    rt.layer_step(0, 1, np.array([2]), np.array([2]), 2)
    return rt


def test_synchronous_issue_by_hand():
    """Layer 0: unit 1 fetched (0 -> 1 s), compute 2 x 1 + 2 x 0.5 = 3 s: ends at 4.
    Layer 1: unit 2 fetched (4 -> 5 s), compute 2 + 0.5: ends at 7.5."""
    st = two_layers(cost()).timing()
    assert (st.wait_s, st.compute_s, st.time_s) == (2.0, 5.5, 7.5)
    assert st.per_layer[0]["wait"] == 1.0 and st.per_layer[1]["wait"] == 1.0
    assert (st.hits, st.demand, st.requested, st.prefetched) == (1, 2, 3, 0)
    assert st.bytes == 2e9 and st.steps == 1 and st.tokens == 2


def test_asynchronous_issue_by_hand():
    """The host issues a copy in 0.25 s and is charged each layer's compute (3 s, 2.5 s);
    the device runs 1 s per token-unit and never waits for the host's launches.
    Layer 0: the copy starts at 0.25 (issued), arrives 1.25; the host is at 0.25 + 3 = 3.25;
    the device computes 2 s, from 1.25: it ends at max(3.25, 3.25) = 3.25, idle 1.25 s.
    Layer 1: the copy is issued at 3.5, arrives 4.5; host 3.5 + 2.5 = 6; the device's 2 s
    end at max(6.5, 6) = 6.5, idle 1.25 s."""
    st = two_layers(cost(issue="async", issue_s=0.25)).timing()
    assert (st.wait_s, st.compute_s, st.time_s) == (2.5, 4.0, 6.5)
    assert st.per_layer[0]["wait"] == 1.25 and st.per_layer[1]["wait"] == 1.25


def test_asynchronous_issue_bound_by_the_host():
    """A slow host (2 s per copy): layer 0's copy starts at 2, arrives 3; the host is at
    2 + 3 = 5, so the device (2 s from 3, done at 5) ends at 5 and idles 3 s; layer 1's copy
    is issued at 7, arrives 8, host 7 + 2.5 = 9.5: the device ends at max(10, 9.5) = 10."""
    st = two_layers(cost(issue="async", issue_s=2.0)).timing()
    assert (st.wait_s, st.compute_s, st.time_s) == (6.0, 4.0, 10.0)


def test_asynchronous_device_unit_time_is_a_floor_per_unit():
    """device_unit_s 1.5: layer 0's two units take 1.5 s each (more than their 1 s),
    layer 1's unit its 2 s; the device's time is 3 + 2 = 5 s."""
    st = two_layers(cost(issue="async", issue_s=0.25, device_unit_s=1.5)).timing()
    assert st.compute_s == 5.0
    # layer 0: ready 1.25 + 3 = 4.25 > host 3.25; layer 1: copy issued max(4.25, 3.5) = 4.25,
    # arrives 5.25, device ends 7.25 > host 6
    assert st.time_s == 7.25 and st.wait_s == 2.25


def test_a_prefetch_is_issued_behind_the_demand_and_waited_for_only_if_late():
    """Frequency prefetcher: layer 0 predicts unit 2 for layer 1.  Synchronous: the demand
    fetch of unit 1 (0 -> 1), then the prefetch (1 -> 2); layer 1 starts at 4 with unit 2
    there: no wait."""
    pf = FrequencyPrefetcher([[0, 1, 2, 3], [2, 3, 0, 1]])
    rt = two_layers(cost(), pf)
    st = rt.timing()
    assert (st.wait_s, st.compute_s, st.time_s) == (1.0, 5.5, 6.5)
    assert (st.prefetched, st.prefetch_hits, st.prefetch_useful, st.demand) == (1, 1, 1, 1)
    assert st.bytes == 2e9
    ops = [(d["op"], d.get("kind"), d["layer"], d.get("unit")) for d in rt.decisions()]
    assert ops == [
        ("fetch", "demand", 0, 1),
        ("fetch", "prefetch", 1, 2),
        ("run", None, 0, None),
        ("run", None, 1, None),
    ]
    # a slow link (4 s a copy): the demand fetch ends at 4 (layer 0 ends at 7), the prefetch
    # arrives at 8: layer 1 waits 1 s
    slow = two_layers(cost(), pf)
    slow.link = Link("slow", 0.25, 0.0)
    st = slow.timing()
    assert st.per_layer[1]["wait"] == 1.0 and st.per_layer[0]["wait"] == 4.0


def test_link_seconds_and_costs():
    assert Link("l", 2.0, 3.0).seconds(4e9) == pytest.approx(2.000003)
    c = cost(dense_flops=2.0)
    assert c.unit_s(3) == 3.5
    assert c.compute_s(np.array([1, 2]), 4) == 8 + 3 + 1.0
    assert c.device_s(np.array([1, 2]), 4) == 8 + 3


def test_lru_cache_by_hand():
    c = LRUCache(2, [5, 7, 9])
    assert list(c.d.items()) == [(5, 0), (7, 1)] and c.free == []
    # the first `capacity` entries of the initial order, a repeat taking no slot
    assert list(LRUCache(2, [5, 5, 7]).d.items()) == [(5, 0)]
    c.touch(5)
    assert c.insert(3) and c.slot == 1 and list(c.d) == [5, 3]  # 7 evicted, its slot
    assert not c.insert(8, keep={5, 3}) and c.slot is None
    assert c.insert(3) and c.slot == 1 and list(c.d) == [5, 3]
    e = LRUCache(3, [4])
    assert e.free == [1, 2] and e.insert(6) and e.slot == 1 and e.free == [2]
    assert list(e.resident(8)) == [False, False, False, False, True, False, True, False]
    assert not LRUCache(0).insert(1)
    with pytest.raises(ValueError, match="capacity must be >= 0, not -1"):
        LRUCache(-1)


def test_popularity_order_ties_to_the_lower_id():
    assert list(popularity_order(np.array([[3, 1], [1, 3], [2, 0]]), 5)) == [1, 3, 0, 2, 4]


#: the decisions of :func:`two_layers` with the frequency prefetcher (step 0 of
#: :func:`two_steps` too)
STEP0 = [
    {"op": "fetch", "kind": "demand", "step": 0, "layer": 0, "unit": 1, "slot": -1,
     "bytes": 1e9},
    {"op": "fetch", "kind": "prefetch", "step": 0, "layer": 1, "unit": 2, "slot": 0,
     "bytes": 1e9},
    {"op": "run", "step": 0, "layer": 0, "tokens": 2, "units": [0, 1], "counts": [1, 1],
     "slots": [0, -1], "waits": [1]},
    {"op": "run", "step": 0, "layer": 1, "tokens": 2, "units": [2], "counts": [2],
     "slots": [0], "waits": [2]},
]  # fmt: skip


def test_the_decisions_replayed_on_hardware_by_hand():
    """The frequency prefetcher's run above, as the replay reads it: layer 0 fetches unit 1
    on demand (no room: its own buffer, slot -1) and prefetches unit 2 for layer 1 (into
    slot 0, where unit 0 was); layer 1 waits for the prefetch."""
    rt = two_layers(cost(), FrequencyPrefetcher([[0, 1, 2, 3], [2, 3, 0, 1]]))
    assert rt.decisions() == STEP0
    assert list(rt.resident(0)) == [True, False, False, False] and rt.resident(0).dtype == bool
    assert list(rt.resident(1)) == [False, False, True, False]


def test_the_transition_prefetcher_by_hand():
    """From units 0 and 1 at layer 0, the transition counts to layer 1 sum to 0, 5, 2, 2:
    unit 1 first, then 2 and 3 tied, the more popular first (popularity 3, 2, 1, 0)."""
    trans = [None, np.array([[0, 5, 1, 0], [0, 0, 1, 2], [9, 9, 9, 9], [9, 9, 9, 9]])]
    orders = [np.array([0, 1, 2, 3]), np.array([3, 2, 1, 0])]
    pf = TransitionPrefetcher(trans, orders)
    assert pf.predict(1, np.array([0, 1]), None, 3) == [1, 3, 2]
    assert pf.predict(1, np.array([[0], [1]]), None, 1) == [1]
    assert pf.predict(0, np.array([0, 1]), None, 2) == [0, 1]  # layer 0: popularity
    assert pf.predict(1, None, None, 2) == [3, 2]
    assert Prefetcher().predict(1, np.array([0]), None, 4) == []


def test_a_units_time_from_a_measured_table():
    """(tokens, seconds): 1 -> 2 s, 3 -> 4 s: flat below the first entry, linear between,
    the last plus the rate beyond (1 s a token here)."""
    c = cost(table=((1, 2.0), (3, 4.0)))
    assert [c.unit_s(t) for t in (0, 1, 2, 3, 5)] == [2.0, 2.0, 3.0, 4.0, 6.0]
    # the table replaces rate and overhead for the units, not for the dense part
    c = cost(table=((1, 2.0), (3, 4.0)), dense_flops=1.0)
    assert c.compute_s(np.array([1, 3]), 2) == 2.0 + 2.0 + 4.0


def test_the_oracle_prefetches_what_the_next_layer_misses():
    """Layer 1 runs units 2 and 3, neither resident: the oracle (one transfer a layer)
    prefetched 2 when layer 0 started; 3 is fetched on demand.  Synchronous: layer 0 waits
    for unit 1 (0 -> 1), the prefetch follows (1 -> 2), compute 3 s: ends at 4; layer 1's
    demand fetch of 3 (4 -> 5), compute 2 x 1 + 2 x 0.5: ends at 8."""
    rt = OffloadRuntime(2, 4, 1, LINK, cost(), OraclePrefetcher(), [[0], [0]], 1)
    rt.layer_step(0, 0, np.array([0, 1]), np.array([1, 1]), 2)
    rt.layer_step(0, 1, np.array([2, 3]), np.array([1, 1]), 2)
    st = rt.timing()
    assert (st.wait_s, st.compute_s, st.time_s) == (2.0, 6.0, 8.0)
    assert (st.prefetched, st.prefetch_useful, st.demand, st.hits) == (1, 1, 2, 1)
    assert st.bytes == 3e9 and rt.log[0][5] == [2] and rt.log[1][4] == [2]


def test_prefetch_count_and_initial_residency():
    assert OffloadRuntime(1, 8, 3, LINK, cost()).prefetch_count == 1
    assert OffloadRuntime(1, 8, 8, LINK, cost()).prefetch_count == 2
    assert OffloadRuntime(1, 8, 8, LINK, cost(), prefetch_count=5).prefetch_count == 5
    rt = OffloadRuntime(2, 8, 2, LINK, cost(), initial=[[4, 1, 7], [2]])
    assert rt.initial == [[4, 1], [2]] and rt.capacity == 2
    assert list(np.flatnonzero(rt.resident(0))) == [1, 4]
    assert rt.prefetcher.name == "none" and rt.log == [] and rt.stats.steps == 0


def test_a_cost_from_a_device_profile():
    dev = SimpleNamespace(
        expert_tflops=2.0,
        expert_launch_us=5.0,
        table=lambda: ((1, 2e-6),),
        issue="async",
        link_issue_us=3.0,
        expert_device_us=None,
    )
    c = Cost.of(dev, 10.0, 20.0, 30.0)
    assert (c.unit_bytes, c.unit_flops, c.dense_flops) == (10.0, 20.0, 30.0)
    assert c.flops == 2e12 and c.overhead_s == pytest.approx(5e-6) and c.table == ((1, 2e-6),)
    assert c.issue == "async" and c.issue_s == pytest.approx(3e-6) and c.device_unit_s == 0.0
    dev.expert_device_us = 7.0
    assert Cost.of(dev, 1, 1, 1).device_unit_s == pytest.approx(7e-6)


def test_the_stats_report_by_hand():
    st = OffloadStats(
        steps=2, tokens=10, requested=6, hits=2, prefetch_hits=1, demand=3, prefetched=4,
        prefetch_useful=3, substituted=1, dropped=5, bytes=1234567.0, wait_s=0.1234567,
        compute_s=1.8765433,
        per_layer={1: {"hit": 1, "req": 3, "wait": 0.25}, 0: {"hit": 0, "req": 0, "wait": 0.0}},
    )  # fmt: skip
    assert st.time_s == pytest.approx(2.0)
    assert st.as_dict() == {
        "steps": 2,
        "tokens": 10,
        "hit_rate": 0.5,
        "resident_hit_rate": 0.3333,
        "prefetch_accuracy": 0.75,
        "demand_fetches": 3,
        "prefetches": 4,
        "substituted": 1,
        "dropped": 5,
        "bytes_moved_mb": 1.235,
        "stall_s": 0.123457,
        "compute_s": 1.876543,
        "tokens_per_s": 5.0,
        "per_layer": {
            0: {"hit_rate": 0.0, "stall_s": 0.0},
            1: {"hit_rate": 0.3333, "stall_s": 0.25},
        },
    }
    assert list(st.as_dict()["per_layer"]) == [0, 1]
    empty = OffloadStats().as_dict()
    assert empty["hit_rate"] == 0.0 and empty["prefetch_accuracy"] is None
    assert empty["tokens_per_s"] is None


def two_steps(c: Cost) -> OffloadRuntime:
    """Two steps over two layers, called layer by layer as the hooks do (step 0 and step 1
    at layer 0, then both at layer 1); capacity 1, unit 0 resident; the frequency
    prefetcher predicts unit 2 for layer 1.  Step 0: layer 0 runs 0 and 1 (one token each),
    layer 1 runs 2 (two).  Step 1: layer 0 runs 1 (three tokens), layer 1 runs 2 and 3 (two
    and one).

    Residency: step 0's fetch of 1 finds no room (0 is in use): it runs from a buffer of its
    own; step 1's takes 0's slot.  Layer 1: the prefetched 2 replaces 0; in step 1, 2 is a
    hit and 3 finds no room (2 is in use)."""
    pf = FrequencyPrefetcher([[0, 1, 2, 3], [2, 3, 0, 1]])
    rt = OffloadRuntime(2, 4, 1, LINK, c, pf, [[0], [0]], 1)
    rt.layer_step(0, 0, np.array([0, 1]), np.array([1, 1]), 2)
    rt.layer_step(1, 0, np.array([1]), np.array([3]), 3)
    rt.layer_step(0, 1, np.array([2]), np.array([2]), 1)  # a step's tokens: its layer 0's
    rt.layer_step(1, 1, np.array([2, 3]), np.array([2, 1]), 3)
    return rt


def test_two_steps_counts_by_hand():
    st = two_steps(cost()).stats
    assert (st.steps, st.tokens, st.requested, st.hits) == (2, 5, 6, 2)  # 0 in s0, 2 in s1
    assert (st.prefetch_hits, st.prefetch_useful, st.prefetched, st.demand) == (1, 1, 2, 3)
    assert st.bytes == 5e9
    assert {k: (v["hit"], v["req"]) for k, v in st.per_layer.items()} == {0: (1, 3), 1: (1, 3)}


def test_two_steps_synchronous_clock_by_hand():
    """In (step, layer) order: s0 l0: fetch 1 (0 -> 1), prefetch 2 (1 -> 2), compute 3: ends
    at 4.  s0 l1: 2 arrived at 2, compute 2.5: ends at 6.5.  s1 l0: fetch 1 (6.5 -> 7.5),
    prefetch 2 (7.5 -> 8.5), compute 3.5: ends at 11.  s1 l1: 2 resident; fetch 3
    (11 -> 12), compute 3 + 1: ends at 16."""
    rt = two_steps(cost())
    for _ in range(2):  # the replay starts over each time
        st = rt.timing()
        assert (st.wait_s, st.compute_s, st.time_s) == (3.0, 13.0, 16.0)
        assert st.per_layer[0]["wait"] == 2.0 and st.per_layer[1]["wait"] == 1.0


def test_two_steps_asynchronous_clock_by_hand():
    """Copies issued 0.25 s each by the host, which is charged each layer's compute.
    s0 l0: copies issued at 0.25 and 0.5: 1 arrives 1.25, 2 at 2.25; host 0.5 + 3 = 3.5;
    the device's 2 s end at max(3.25, 3.5) = 3.5 (idle 1.5).  s0 l1: host 6; device
    3.5 -> 5.5, ends at 6 (idle 0.5).  s1 l0: 1 issued 6.25, arrives 7.25; 2 issued 6.5,
    arrives 8.25; host 6.5 + 3.5 = 10; device 7.25 + 3 = 10.25 (idle 1.25).  s1 l1: 3
    issued at 10.25, arrives 11.25; host 10.25 + 4 = 14.25; device 11.25 + 3 = 14.25
    (idle 1)."""
    st = two_steps(cost(issue="async", issue_s=0.25)).timing()
    assert (st.wait_s, st.compute_s, st.time_s) == (4.25, 10.0, 14.25)
    assert st.per_layer[0]["wait"] == 2.75 and st.per_layer[1]["wait"] == 1.5


def test_two_steps_decisions_by_hand():
    b = 1e9
    ops = two_steps(cost()).decisions()
    assert ops[:4] == [*STEP0[:3], {**STEP0[3], "tokens": 1}]
    assert ops[4:] == [
        {"op": "fetch", "kind": "demand", "step": 1, "layer": 0, "unit": 1, "slot": 0,
         "bytes": b},
        {"op": "fetch", "kind": "prefetch", "step": 1, "layer": 1, "unit": 2, "slot": 0,
         "bytes": b},
        {"op": "run", "step": 1, "layer": 0, "tokens": 3, "units": [1], "counts": [3],
         "slots": [0], "waits": [1]},
        {"op": "fetch", "kind": "demand", "step": 1, "layer": 1, "unit": 3, "slot": -1,
         "bytes": b},
        {"op": "run", "step": 1, "layer": 1, "tokens": 3, "units": [2, 3], "counts": [2, 1],
         "slots": [0, -1], "waits": [3]},
    ]  # fmt: skip


def test_popularity_ties_go_to_the_lower_id_however_many():
    """200 units, every third used once: the used ones first, each group by id."""
    ids = np.arange(0, 200, 3)
    order = list(popularity_order(ids, 200))
    assert order == list(range(0, 200, 3)) + [u for u in range(200) if u % 3]


def test_the_links_offered():
    got = links()
    assert set(got) == {"pcie4", "ddr-chip"} and got["pcie4"].name == "pcie4"
    assert got["ddr-chip"] is CHIP_LINK and CHIP_LINK == Link("ddr-chip", 102.4, 0.1)


def test_the_stats_report_rounds_as_it_says():
    st = OffloadStats(
        steps=1, tokens=10, requested=3, hits=1, prefetched=3, prefetch_useful=1,
        bytes=1e9, wait_s=1.0, compute_s=2.0,
        per_layer={0: {"hit": 1, "req": 1, "wait": 0.12345678}},
    )  # fmt: skip
    d = st.as_dict()
    assert (d["hit_rate"], d["resident_hit_rate"], d["prefetch_accuracy"]) == (
        0.3333, 0.3333, 0.3333,
    )  # fmt: skip
    assert d["bytes_moved_mb"] == 1000.0 and d["tokens_per_s"] == 3.33
    assert d["per_layer"] == {0: {"hit_rate": 1.0, "stall_s": 0.123457}}
    one = OffloadStats(requested=1, hits=1).as_dict()
    assert one["hit_rate"] == 1.0


def test_stats_before_the_clock_is_replayed():
    st = two_steps(cost()).stats  # no timing() yet: no wait counted
    assert st.as_dict()["per_layer"][1] == {"hit_rate": 0.3333, "stall_s": 0.0}


def test_a_prediction_already_resident_is_not_fetched():
    """The frequency prefetcher predicts unit 0 for layer 1, where it is resident: no
    transfer is issued."""
    pf = FrequencyPrefetcher([[0, 1, 2, 3], [0, 2, 3, 1]])
    rt = two_layers(cost(), pf)
    assert rt.stats.prefetched == 0 and rt.log[0][5] == []


def test_costs_scale_with_the_rate():
    c = cost(unit_flops=2.0, flops=4.0, dense_flops=8.0)
    assert c.unit_s(3) == 3 * 2 / 4 + 0.5
    assert c.device_s(np.array([1, 3]), 2) == 2 * 8 / 4 + (1 + 3) * 2 / 4


def test_three_layers_each_prefetch_is_for_the_next_layer():
    """Three layers of capacity 1: unit 2 resident at layer 0, unit 0 at layers 1 and 2;
    one step runs unit 2, then 1, then 2 (one token each).  The frequency prefetcher's
    first choice per layer: 0, 1, 2.  Layer 0 prefetches layer 1's choice (1, not resident
    there), layer 1 prefetches layer 2's (2: resident at layer 0, not at layer 2, so it is
    fetched): both prefetches are used, nothing is fetched on demand.
    Clock (1 s a copy, 1.5 s a layer): l0 sends for unit 1 (0 -> 1), runs 0 -> 1.5; l1 has
    unit 1, sends for unit 2 (1.5 -> 2.5), runs 1.5 -> 3; l2 has unit 2 (at 2.5): runs 3 ->
    4.5, no wait."""
    pf = FrequencyPrefetcher([[0, 1, 2, 3], [1, 0, 2, 3], [2, 0, 1, 3]])
    rt = OffloadRuntime(3, 4, 1, LINK, cost(), pf, initial=[[2], [0], [0]], prefetch_count=1)
    for layer, u in enumerate([2, 1, 2]):
        rt.layer_step(0, layer, np.array([u]), np.array([1]), 1)
    assert [r[5] for r in rt.log] == [[1], [2], []]  # issued, per layer
    assert [r[4] for r in rt.log] == [[], [1], [2]]  # prefetches used
    assert [r[3] for r in rt.log] == [[], [], []]  # demand fetches
    st = rt.timing()
    assert (st.hits, st.prefetch_hits, st.prefetched, st.demand) == (1, 2, 2, 0)
    assert (st.wait_s, st.compute_s, st.time_s) == (0.0, 4.5, 4.5)


def test_two_steps_replayed_step_by_step_on_a_slow_link():
    """:func:`two_steps` (logged layer by layer) on a link of 4 s a copy: the clock runs in
    (step, layer) order, s0 l0, s0 l1, s1 l0, s1 l1.
    s0 l0: fetch 1 (0 -> 4), prefetch 2 (4 -> 8), compute 3: ends at 7, waited 4.
    s0 l1: waits for the prefetch (8), compute 2.5: ends at 10.5, waited 1.
    s1 l0: fetch 1 (10.5 -> 14.5), prefetch 2 (14.5 -> 18.5), compute 3.5: ends 18, waited 4.
    s1 l1: 2 resident; fetch 3 behind the prefetch (18.5 -> 22.5), compute 4: ends at 26.5,
    waited 4.5.  (Layer by layer, s1 l0 before s0 l1, the prefetch would have had time to
    arrive: 26 s.)"""
    rt = two_steps(cost())
    rt.link = Link("slow", 0.25, 0.0)
    st = rt.timing()
    assert (st.wait_s, st.compute_s, st.time_s) == (13.5, 13.0, 26.5)
    assert st.per_layer[0]["wait"] == 8.0 and st.per_layer[1]["wait"] == 5.5


def test_a_stall_is_the_copy_time_to_the_last_bit():
    """One layer waits for one copy of 0.1 s (1 GB at 10 GB/s, no latency): its stall is
    exactly 0.1 s, the clock starting at 0 (0.1 - 0 is 0.1, where 1.1 - 1 would not be);
    compute 1 token x 1 s + 0.5 s launch."""
    rt = OffloadRuntime(1, 2, 1, Link("l", 10.0, 0.0), cost(), initial=[[0]])
    rt.layer_step(0, 0, np.array([1]), np.array([1]), 1)
    st = rt.timing()
    assert (st.wait_s, st.compute_s, st.per_layer[0]["wait"]) == (0.1, 1.5, 0.1)
