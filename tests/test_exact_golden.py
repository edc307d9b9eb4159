"""Exact expectations of the scheduler's golden models on cases worked out by hand: each rule
at its bounds (the value, one below, one above), the flags it must set and leave, and the
result it must give, so that a slip shared by the golden model and the RTL cannot hide
behind their agreement.  The mutation run (``scripts/mutation.py``) names the gaps these
close."""

import pytest

from fsedp.params import SchedulerParams
from fsedp.sw.eit import EIT, GateRecord
from fsedp.sw.matcher import entry_chiplet, lowest_bit, next_hops, release_mask
from fsedp.sw.pairing import balanced_order, is_cold, paired_index, paired_order, partner
from fsedp.sw.scheduler import DISPATCH, PRELOAD, Dispatch, Scheduler, layer_tokens, run_round
from fsedp.sw.scheduler_timing import SchedulerTiming, front_latency, replay_round
from fsedp.sw.sorter import (
    apply_network,
    bitonic_schedule,
    bitonic_sort,
    network,
    shuffle_lane,
    sort_keys,
    sorter_keys,
    stage_count,
    winner_first,
)
from fsedp.sw.token_buffer import TokenBuffer

# a small table: 2 requests, 4 chiplets, 8 experts, counts of 2 bits (saturate at 3)
P = SchedulerParams(experts=8, chiplets=4, requests=2, count_width=2, theta_min=1)


def fresh() -> EIT:
    return EIT(P)


# ----------------------------------------------------------------------------- EIT


@pytest.mark.parametrize(
    "rec, ok",
    [
        ((1, 3, 7), True),  # every id at its top value
        ((0, 0, 0), True),
        ((2, 0, 0), False),  # request one above its top
        ((0, 4, 0), False),  # chiplet one above
        ((0, 0, 8), False),  # expert one above
        ((-1, 0, 0), False),
        ((0, -1, 0), False),
        ((0, 0, -1), False),
    ],
)
@pytest.mark.parametrize("bulk", [False, True])
def test_eit_record_ids_at_their_bounds(rec, ok, bulk):
    eit = fresh()
    if bulk:
        eit.write_many([GateRecord(*rec)])
    else:
        eit.write(GateRecord(*rec))
    assert eit.bad_record is (not ok)
    assert eit.overflow is False
    r, c, e = rec
    counts = [[0] * 8 for _ in range(2)]
    masks = [[0] * 8 for _ in range(2)]
    if ok:
        counts[r][e], masks[r][e] = 1, 1 << c
    assert eit.count == counts and eit.mask == masks


def test_eit_bulk_write_skips_a_bad_record_and_goes_on():
    """A bad record is dropped, the records after it are written (GateRecords and tuples)."""
    eit = fresh()
    eit.write_many([GateRecord(0, 1, 2), (0, 9, 2), GateRecord(1, 3, 2), (1, 2, 2)])
    assert eit.bad_record is True
    assert eit.count[0][2] == 1 and eit.mask[0][2] == 0b0010
    assert eit.count[1][2] == 2 and eit.mask[1][2] == 0b1100


@pytest.mark.parametrize("bulk", [False, True])
def test_eit_entry_saturates_at_its_width(bulk):
    """Three writes fill a 2-bit count (no flag); the fourth saturates and flags "entry"."""
    eit = fresh()
    write = (lambda rec: eit.write_many([rec])) if bulk else eit.write
    for _ in range(3):
        write(GateRecord(1, 2, 5))
    assert eit.count[1][5] == 3 and eit.overflow is False and eit.saturated == set()
    write(GateRecord(1, 0, 5))
    assert eit.count[1][5] == 3 and eit.mask[1][5] == 0b0101
    assert eit.overflow is True and eit.saturated == {"entry"} and eit.bad_record is False


@pytest.mark.parametrize("how", ["scan", "merged"])
def test_eit_merged_sum_saturates_at_its_width(how):
    """2 + 1 tokens fill the 2-bit sum exactly (no flag); 2 + 2 saturate it and flag "sum"."""
    eit = fresh()

    def sum_of(e):
        if how == "scan":
            return eit.scan(e, 0b11).count
        return eit.merged(0b11)[0][e]

    eit.write_many([(0, 0, 4), (0, 1, 4), (1, 2, 4)])
    assert sum_of(4) == 3 and eit.overflow is False and eit.saturated == set()
    eit.write_many([(0, 0, 6), (0, 1, 6), (1, 2, 6), (1, 3, 6)])
    assert sum_of(6) == 3 and eit.overflow is True and eit.saturated == {"sum"}
    eit.clear_flags()
    assert (eit.overflow, eit.bad_record, eit.saturated) == (False, False, set())


def test_eit_clear_flags_clears_both_flags():
    eit = fresh()
    eit.write(GateRecord(5, 0, 0))
    for _ in range(4):
        eit.write(GateRecord(0, 0, 0))
    assert eit.overflow is True and eit.bad_record is True
    eit.clear_flags()
    assert eit.overflow is False and eit.bad_record is False and eit.saturated == set()
    assert eit.count[0][0] == 3  # the table is the round's, not the flags'


# ----------------------------------------------------------------------------- E-C matcher


@pytest.mark.parametrize("x, bit", [(1, 0), (2, 1), (6, 1), (0b1000, 3), (0b1011000, 3)])
def test_lowest_bit(x, bit):
    assert lowest_bit(x) == bit


@pytest.mark.parametrize("x", [0, -1])
def test_lowest_bit_of_an_empty_mask_is_an_error(x):
    with pytest.raises(ValueError, match="^lowest_bit of an empty mask$"):
        lowest_bit(x)


def test_entry_chiplet_is_the_lowest_idle_chiplet_of_the_trajectory():
    assert entry_chiplet(0b1010, 0b1111) == 1
    assert entry_chiplet(0b1010, 0b1000) == 3
    with pytest.raises(ValueError):
        entry_chiplet(0b1010, 0b0101)  # no idle chiplet on the trajectory


def test_next_hops_of_a_ring_embedding():
    # ascending numbers: 0 -> 2 -> 3 -> 0; chiplet 1 is off the trajectory
    assert next_hops(0b1101, 4) == (2, 0, 3, 0)
    # the 2x2 snake embedding: sequence 0, 1, 3, 2 (positions of chiplets 0..3: 0, 1, 3, 2)
    table = ((0, 1, 3, 2), (0, 1, 3, 2))
    assert next_hops(0b1111, 4, table) == (1, 3, 0, 2)
    assert next_hops(0b0001, 4, table) == (0, 0, 0, 0)  # one chiplet: itself


def test_release_mask_keeps_chiplets_of_running_experts():
    running = [0b0011, 0b0110, 0b1000, 0]
    assert release_mask(running, 0b0000) == 0
    assert release_mask(running, 0b0100) == 0b1000
    assert release_mask(running, 0b0010) == 0b0100
    assert release_mask(running, 0b0111) == 0b1111


# ----------------------------------------------------------------------------- pairing


@pytest.mark.parametrize(
    "n, indices", [(1, [0]), (2, [0, 1]), (4, [0, 3, 1, 2]), (5, [0, 4, 1, 3, 2])]
)
def test_paired_index_takes_both_ends(n, indices):
    assert [paired_index(k, n) for k in range(n)] == indices
    assert paired_order("abcde"[:n], n) == ["abcde"[i] for i in indices]


@pytest.mark.parametrize("position", [-1, 5, 6])
def test_paired_index_outside_the_list(position):
    with pytest.raises(ValueError, match=f"^position {position} outside 0..4$"):
        paired_index(position, 5)


def test_partner_of_each_position():
    assert [partner(k, 5) for k in range(5)] == [1, 0, 3, 2, None]
    assert [partner(k, 4) for k in range(4)] == [1, 0, 3, 2]


def test_balanced_order_by_hand():
    # balance 4: 0 (surplus 6), coldest 4 (3), coldest 3 (0), at 0 the hottest 1 (2), then 2
    counts = {0: 10, 1: 6, 2: 3, 3: 1, 4: 1}
    assert balanced_order([0, 1, 2, 3, 4], counts, 4) == [0, 4, 3, 1, 2]


def test_balanced_order_at_its_ties():
    # a surplus of exactly 0 takes the hottest: 0 (surplus 2), 3 (0), then 1, not 2
    assert balanced_order([0, 1, 2, 3], {0: 6, 1: 5, 2: 3, 3: 2}, 4) == [0, 3, 1, 2]
    # a surplus of 1 takes the coldest: 0 (surplus 1), then 2, not 1
    assert balanced_order([0, 1, 2], {0: 5, 1: 5, 2: 1}, 4) == [0, 2, 1]
    # the coldest left at exactly the balance point counts as hot: 0, then 1, not 2
    assert balanced_order([0, 1, 2], {0: 10, 1: 5, 2: 4}, 4) == [0, 1, 2]
    # one below: the coldest is taken
    assert balanced_order([0, 1, 2], {0: 10, 1: 5, 2: 3}, 4) == [0, 2, 1]
    assert balanced_order([], {}, 4) == []
    assert balanced_order([7], {7: 1}, 4) == [7]


@pytest.mark.parametrize("count, cold", [(0, False), (1, True), (2, True), (3, False), (4, False)])
def test_is_cold_below_theta_min(count, cold):
    assert is_cold(count, 3) is cold


# ----------------------------------------------------------------------------- token buffer


def test_token_buffer_init_request_bounds_and_saturation():
    p = SchedulerParams(experts=8, chiplets=4, requests=2, n_threshold=2, qos_width=2)
    tb = TokenBuffer(p)
    assert tb.t_qos == [0, 0] and tb.c_fw == [0, 0] and tb.paths == set()
    tb.init_request(1, 3)
    tb.init_request(0, 4)  # saturates at 2**2 - 1
    assert tb.t_qos == [3, 3] and tb.c_fw == [0, 0]
    tb.c_fw = [2, 2]
    tb.init_request(2, 1)  # outside the table: ignored
    tb.init_request(-1, 1)
    assert tb.t_qos == [3, 3] and tb.c_fw == [2, 2]
    tb.init_request(0, 1)  # re-admission restarts C_fw
    assert tb.t_qos == [1, 3] and tb.c_fw == [0, 2]


def test_token_buffer_rounds_by_hand():
    """Request 0 of a table with N_threshold 2 and 2-bit T_QoS, admitted with T_QoS 1, round
    by round (present, cold hit) -> (defer, T_QoS, C_fw, paths)."""
    p = SchedulerParams(experts=8, chiplets=4, requests=2, n_threshold=2, qos_width=2)
    tb = TokenBuffer(p)
    tb.init_request(0, 1)
    rounds = [
        # present, cold, defer, t_qos, c_fw, paths
        (1, 0, 0, 1, 1, set()),
        (1, 1, 1, 0, 0, {"defer with C_fw > 0"}),
        (1, 1, 0, 0, 1, {"cold hit, T_QoS 0"}),
        (0, 1, 0, 0, 1, set()),  # absent: kept
        (1, 0, 0, 0, 2, set()),
        (1, 1, 1, 0, 0, {"refill", "defer"}),  # C_fw 2 refills T_QoS to 1, spent at once
        (1, 0, 0, 0, 1, set()),
        (1, 0, 0, 0, 2, set()),
        (1, 0, 0, 1, 1, {"refill"}),
    ]
    for k, (present, cold, defer, t, c, paths) in enumerate(rounds):
        assert tb.decide(present, cold) == defer, k
        assert (tb.t_qos[0], tb.c_fw[0], tb.paths) == (t, c, paths), k
    assert (tb.t_qos[1], tb.c_fw[1]) == (0, 0)


def test_token_buffer_refill_saturates_and_requests_are_independent():
    p = SchedulerParams(experts=8, chiplets=4, requests=2, n_threshold=1, qos_width=1)
    tb = TokenBuffer(p)
    tb.init_request(0, 1)
    tb.init_request(1, 0)
    assert tb.decide(0b11, 0b00) == 0 and tb.c_fw == [1, 1]
    # both refill (request 0 at T_QoS's top), both defer on a cold hit
    assert tb.decide(0b11, 0b11) == 0b11
    assert tb.paths == {"refill saturates", "refill", "defer"}
    assert tb.t_qos == [0, 0] and tb.c_fw == [0, 0]
    assert tb.decide(0b10, 0b10) == 0 and tb.t_qos == [0, 0] and tb.c_fw == [0, 1]
    assert tb.paths == {"cold hit, T_QoS 0"}  # request 1's cold hit, seen at its own bit


# ----------------------------------------------------------------------------- scheduler


def sched(**kw) -> Scheduler:
    base = dict(experts=8, chiplets=4, requests=2, count_width=4, theta_min=0, mesh_cols=2)
    base.update(kw)
    order = base.pop("order", "paired")
    return Scheduler(SchedulerParams(**base), order)


def test_ring_choice_takes_the_embedding_with_fewer_chiplets_streaming():
    """Decision 29 by hand: the embedding whose running experts' trajectories hold fewer
    chiplets, a tie to the next in turn; chosen once, at the expert's first beat."""
    s = sched(ring_orders=2)
    s.orders = [None] * 4
    s.running = [0b0111, 0, 0b0011, 0]  # 3 chiplets in order 0, 2 in order 1
    s.running_order = [0, 0, 1, 0]
    assert s.ring_order(0) == 1 and s.next_order == 0
    s.running_order = [1, 0, 0, 0]  # now 3 in order 1, 2 in order 0
    assert s.ring_order(1) == 0 and s.next_order == 1
    assert s.ring_order(0) == 1  # kept, whatever the loads are now
    s.running = [0b0011, 0, 0b1100, 0]  # 2 and 2: a tie goes to the next in turn
    assert s.ring_order(2) == 1 and s.next_order == 0
    assert s.ring_order(3) == 0 and s.next_order == 1
    assert s.orders == [1, 0, 1, 0]


def test_ring_choice_of_four_embeddings_and_of_one():
    s = sched(ring_orders=4)
    s.orders = [None] * 3
    s.running = [0b0001, 0b0110, 0b1111, 0]
    s.running_order = [2, 0, 1, 0]  # loads: order 0: 2, 1: 4, 2: 1, 3: 0
    assert s.ring_order(0) == 3 and s.next_order == 0
    s.running_order = [3, 0, 1, 0]  # loads 2, 4, 0, 1: order 2
    assert s.ring_order(1) == 2 and s.next_order == 3
    s.running = [0, 0, 0, 0]  # all 0: the next in turn, 3
    assert s.ring_order(2) == 3 and s.next_order == 0
    one = sched()
    one.orders = [None]
    one.running = [0b0011, 0, 0, 0]
    assert one.ring_order(0) == 0 and one.next_order == 0


def test_a_round_by_hand():
    """Four experts on a 4-chiplet table (paired order, whole-trajectory dispatch):
    e5: 4 tokens on chiplets 0, 1; e2: 3 on 2, 3; e7: 2 on 1, 2; e0: 1 on 3.
    Sorted: e5, e2, e7, e0; paired: e5, e0, e2, e7 (pairs (e5, e0), (e2, e7))."""
    s = sched()
    recs = [(0, 0, 5), (0, 1, 5), (1, 0, 5), (1, 1, 5), (0, 2, 2), (0, 3, 2), (1, 3, 2)]
    recs += [(0, 1, 7), (1, 2, 7), (1, 3, 0)]
    plan = s.start_round(recs)
    assert plan.n == 4 and plan.defer == 0 and plan.present == 0b11
    assert plan.counts == [1, 0, 3, 0, 0, 4, 0, 2]
    assert plan.trajs == [0b1000, 0, 0b1100, 0, 0, 0b0011, 0, 0b0110]
    assert [k for k in plan.sorted_keys[:4]] == [(4, 5), (3, 2), (2, 7), (1, 0)]
    assert plan.order == [5, 0, 2, 7]
    # eligible: a trajectory with an idle chiplet.  e5 enters at 0 (0, 1 busy), e0 at 3, e2
    # at 2 (its chiplet 3 is e0's, 2 is idle); e2's partner e7 (1, 2) has no idle chiplet
    # left: pre-loaded at its lowest chiplet, 1
    beats = s.decide()
    assert [(b.kind, b.expert, b.entry) for b in beats] == [
        (DISPATCH, 5, 0),
        (DISPATCH, 0, 3),
        (DISPATCH, 2, 2),
        (PRELOAD, 7, 1),
    ]
    assert beats[3].traj == 0b0110 and beats[3].count == 2 and beats[3].next_hop == (0, 2, 1, 0)
    assert s.running == [0b0011, 0, 0b1100, 0b1000] and s.icv.value == 0
    s.complete(0b1000)  # e0 done: chiplet 3 is still e2's
    assert s.icv.value == 0 and s.decide() == []
    s.complete(0b0001)  # e5 done: 0, 1 idle; e7 enters at 1
    assert s.icv.value == 0b0011
    assert [(b.kind, b.expert, b.entry) for b in s.decide()] == [(DISPATCH, 7, 1)]
    assert s.icv.value == 0b0001 and s.running == [0, 0b0110, 0b1100, 0]
    s.complete(0b0100)  # e2 done: 3 idle, 2 is still e7's
    assert s.icv.value == 0b1001 and s.in_round and not s.round_done
    s.complete(0b0010)
    assert s.plan is None and s.icv.value == 0b1111
    assert s.flags == {"overflow": False, "bad_record": False, "spurious_done": False}


def test_a_done_of_a_free_slot_is_flagged_and_ignored():
    s = sched()
    s.start_round([(0, 0, 1), (0, 1, 1)])
    assert [(b.expert, b.entry) for b in s.decide()] == [(1, 0)]
    s.complete(0b0010)  # slot 1 runs nothing
    assert s.flags["spurious_done"] is True and s.running == [0b0011, 0, 0, 0]
    assert s.icv.value == 0b1100
    s.complete(0b0011)  # slot 0's done, with slot 1's spurious again
    assert s.plan is None and s.icv.value == 0b1111


def test_entry_dispatch_makes_only_the_entry_busy():
    s = sched(entry_dispatch=True)
    s.start_round([(0, 0, 1), (0, 1, 1), (0, 0, 2), (0, 1, 2), (0, 1, 2)])
    beats = s.decide()  # e2 (3 tokens) enters at 0, e1 then enters at 1 of the same ring
    assert [(b.kind, b.expert, b.entry) for b in beats] == [(DISPATCH, 2, 0), (DISPATCH, 1, 1)]
    assert s.icv.value == 0b1100
    s.complete(0b0001)  # releases its entry only
    assert s.icv.value == 0b1101


def test_cold_requests_are_deferred_by_the_round():
    """theta_min 2: expert 3 has one token (cold) of request 1, admitted with T_QoS 1: request
    1 is deferred and its tokens leave the round; request 0's hot expert stays."""
    s = sched(theta_min=2)
    s.init_request(1, 1)
    plan = s.start_round([(0, 0, 4), (0, 1, 4), (1, 2, 3), (1, 3, 4)])
    assert plan.cold_hit == 0b10 and plan.defer == 0b10 and plan.present == 0b11
    assert plan.counts[4] == 2 and plan.counts[3] == 0 and plan.trajs[4] == 0b0011
    assert plan.n == 1 and plan.order == [4]


# ----------------------------------------------------------------------------- sorter


def test_bitonic_schedule_of_four_lanes():
    assert bitonic_schedule(2) == (((0, 1),),)
    assert bitonic_schedule(4) == (((0, 1), (3, 2)), ((0, 2), (1, 3)), ((0, 1), (2, 3)))
    assert [stage_count(n) for n in (1, 2, 4, 8, 16)] == [0, 1, 3, 6, 10]
    assert [len(bitonic_schedule(n)) for n in (1, 2, 4, 8, 16)] == [0, 1, 3, 6, 10]


@pytest.mark.parametrize(
    "i, bits, lane", [(0b011, 3, 0b110), (0b100, 3, 0b001), (0b101, 3, 0b011), (5, 0, 5), (1, 1, 1)]
)
def test_shuffle_lane_rotates_left(i, bits, lane):
    assert shuffle_lane(i, bits) == lane


@pytest.mark.parametrize(
    "lanes, kind, steps, cycles",
    [
        (8, "parallel", 6, 6),
        (8, "stage", 6, 6),
        (8, "shuffle", 7, 7),  # log2(N)^2 - log2(N) + 1
        (8, "shuffle2", 8, 4),  # one shuffle-only step in front: a multiple of 2
        (4, "shuffle", 3, 3),
        (4, "shuffle2", 4, 2),
        (16, "shuffle2", 14, 7),
        (1, "shuffle", 0, 0),
        (2, "parallel", 1, 1),
    ],
)
def test_network_sizes(lanes, kind, steps, cycles):
    net = network(lanes, kind)
    assert (net.kind, net.lanes, len(net.steps), net.cycles) == (kind, lanes, steps, cycles)
    assert net.per_cycle == {"parallel": 1, "stage": 1, "shuffle": 1, "shuffle2": 2}[kind]
    if kind.startswith("shuffle"):
        # every step shuffles; exchanges are between lanes 2q and 2q + 1 only
        assert all(s.shuffle for s in net.steps)
        assert all(abs(a - b) == 1 and min(a, b) % 2 == 0 for s in net.steps for a, b in s.pairs)
        assert len(net.steps) % net.per_cycle == 0
    else:
        assert not any(s.shuffle for s in net.steps)


def test_the_four_lane_shuffle_networks():
    asc, desc = (0, 1), (3, 2)
    assert [s.pairs for s in network(4, "shuffle").steps] == [
        (asc, desc),
        (asc, (2, 3)),
        (asc, (2, 3)),
    ]
    # shuffle2: one shuffle-only step first, so that the 3 steps fill 2 cycles
    assert [s.pairs for s in network(4, "shuffle2").steps] == [
        (),
        (asc, desc),
        (asc, (2, 3)),
        (asc, (2, 3)),
    ]


def test_sorter_checks_its_arguments():
    for lanes in (0, 3, 6, -4):
        with pytest.raises(ValueError, match=f"^sorter lanes must be a power of two, not {lanes}$"):
            network(lanes)
    with pytest.raises(ValueError, match="^sorter must be one of parallel, stage, shuffle, "):
        network(4, "bogus")
    with pytest.raises(ValueError, match="^3 keys for a 4-lane sorter$"):
        apply_network([(1, 0), (2, 1), (3, 2)], network(4))
    with pytest.raises(ValueError, match="not 3$"):
        sort_keys([(1, 0), (2, 1), (3, 2)])


def test_winner_first_and_sorter_keys():
    assert winner_first((3, 1), (3, 2)) and not winner_first((3, 2), (3, 1))
    assert winner_first((4, 9), (3, 0)) and not winner_first((3, 0), (4, 9))
    assert not winner_first((3, 1), (3, 1))
    assert sorter_keys([5, 0, 7], 4) == [(5, 0), (0, 1), (7, 2), (0, 3)]
    assert sorter_keys([1, 2], 2) == [(1, 0), (2, 1)]


@pytest.mark.parametrize("kind", ["parallel", "stage", "shuffle", "shuffle2"])
def test_every_network_sorts_every_four_lane_input(kind):
    """All 81 vectors of counts 0..2 on 4 lanes (ties everywhere), with a payload riding
    along: descending count, ties by the lower id."""
    import itertools

    net = network(4, kind)
    for counts in itertools.product(range(3), repeat=4):
        keys = [(c, i, f"p{i}") for i, c in enumerate(counts)]
        want = sorted(keys, key=lambda k: (-k[0], k[1]))
        assert apply_network(keys, net) == want, counts
        assert sort_keys(keys, kind) == want
    assert bitonic_sort([(1, 0), (3, 1), (3, 2), (2, 3)]) == [(3, 1), (3, 2), (2, 3), (1, 0)]


def test_layer_tokens_of_the_requests_not_deferred():
    """Counts per (chiplet, expert) in the order first seen; request 1 deferred; records
    with an id out of range dropped; counts saturate at the width (2 bits: 3)."""
    p = SchedulerParams(experts=8, chiplets=4, requests=2, count_width=2, theta_min=0)
    recs = [(0, 2, 5), (1, 0, 5), (0, 2, 5), (0, 1, 7), (0, 4, 1), (2, 0, 1), (0, 0, 8)]
    recs += [(0, 3, 0)] * 5 + [(-1, 0, 0), (0, -1, 0), (0, 0, -1)]
    got = layer_tokens(p, recs, defer=0b10)
    assert got == {(2, 5): 2, (1, 7): 1, (3, 0): 3}
    assert list(got) == [(2, 5), (1, 7), (3, 0)]
    assert layer_tokens(p, recs, defer=0) == {(2, 5): 2, (0, 5): 1, (1, 7): 1, (3, 0): 3}
    assert layer_tokens(p, recs, defer=0b11) == {}


def test_a_dispatch_beat_as_a_dict():
    d = Dispatch(PRELOAD, 7, 3, 0b0110, 1, (0, 2, 1, 0), 1)
    assert d.as_dict() == {
        "kind": "preload",
        "expert": 7,
        "count": 3,
        "traj": 0b0110,
        "entry": 1,
        "next_hop": [0, 2, 1, 0],
        "order": 1,
    }
    assert Dispatch(DISPATCH, 1, 2, 1, 0, (0,)).as_dict()["kind"] == "dispatch"
    assert Dispatch(DISPATCH, 1, 2, 1, 0, (0,)).order == 0


def test_run_round_by_hand():
    """The round of test_a_round_by_hand driven by run_round: the lowest running slot
    completes each time the scheduler waits; then with a chooser of the highest."""
    recs = [(0, 0, 5), (0, 1, 5), (1, 0, 5), (1, 1, 5), (0, 2, 2), (0, 3, 2), (1, 3, 2)]
    recs += [(0, 1, 7), (1, 2, 7), (1, 3, 0)]
    plan, events = run_round(sched(), recs)
    assert plan.order == [5, 0, 2, 7]
    assert [(k, d.expert, d.entry) if k != "done" else (k, d) for k, d in events] == [
        ("dispatch", 5, 0),
        ("dispatch", 0, 3),
        ("dispatch", 2, 2),
        ("preload", 7, 1),
        ("done", 0b0001),  # e5 (slot 0): chiplets 0, 1 idle: e7 enters at 1
        ("dispatch", 7, 1),
        ("done", 0b0010),  # e7 (slot 1)
        ("done", 0b0100),  # e2 (slot 2): chiplet 3 still e0's
        ("done", 0b1000),
    ]

    def highest(running):
        return 1 << max(s for s, t in enumerate(running) if t)

    # the highest slot first: e0 (3), then e2 (2), which frees chiplet 2 for e7, entering
    # there (slot 2 again)
    _, events = run_round(sched(), recs, highest)
    assert [(k, d.expert, d.entry) if k != "done" else (k, d) for k, d in events][4:] == [
        ("done", 0b1000),
        ("done", 0b0100),
        ("dispatch", 7, 2),
        ("done", 0b0100),
        ("done", 0b0001),
    ]
    # an empty layer: no round, no events
    s = sched()
    plan, events = run_round(s, [])
    assert plan.n == 0 and events == [] and s.plan is None


def test_scheduler_orders_and_its_refusals():
    assert sched().order == "paired" and sched(order="sorted").order == "sorted"
    assert sched(balance=3).order == "balanced" and sched(balance=3, order="sorted").order == (
        "sorted"
    )
    with pytest.raises(ValueError, match=r"^order must be one of \('paired', 'sorted'\), not 'x'$"):
        sched(order="x")
    s = sched()
    assert s.flags == {"overflow": False, "bad_record": False, "spurious_done": False}
    s.start_round([(0, 0, 1)])
    with pytest.raises(RuntimeError, match="^start_round while a round is in progress$"):
        s.start_round([(0, 0, 1)])


def test_balanced_and_sorted_rounds_by_hand():
    """Counts e5: 4, e2: 3, e7: 2, e0: 1 (as in test_a_round_by_hand).  Balanced at 2:
    e5 (surplus 2), the coldest e0 (surplus 1), then the coldest left, e7, is at the
    balance point: the hottest, e2, then e7.  Balanced at 5: the surplus never rises above
    0, hottest first.  Sorted: no pre-loads."""
    recs = [(0, 0, 5), (0, 1, 5), (1, 0, 5), (1, 1, 5), (0, 2, 2), (0, 3, 2), (1, 3, 2)]
    recs += [(0, 1, 7), (1, 2, 7), (1, 3, 0)]
    assert sched(balance=2).start_round(recs).order == [5, 0, 2, 7]
    assert sched(balance=5).start_round(recs).order == [5, 2, 7, 0]
    s = sched(order="sorted")
    assert s.start_round(recs).order == [5, 2, 7, 0]
    beats = s.decide()
    assert [(b.kind, b.expert, b.entry) for b in beats] == [(DISPATCH, 5, 0), (DISPATCH, 2, 2)]
    # e5 done: e7 enters at 1; in the paired order its partner e0 (chiplet 3, busy) would be
    # pre-loaded here -- not in the sorted order
    s.complete(0b0001)
    assert [(b.kind, b.expert, b.entry) for b in s.decide()] == [(DISPATCH, 7, 1)]


def test_cold_hits_at_theta_min_and_of_several_requests():
    """theta_min 2: an expert with exactly 2 tokens is not cold; experts with 1 token of
    requests 0 and 1 make both cold hits (neither is deferred: T_QoS 0)."""
    s = sched(theta_min=2)
    plan = s.start_round([(0, 0, 1), (0, 1, 1), (0, 2, 3), (1, 3, 4)])
    assert plan.cold_hit == 0b11 and plan.defer == 0 and plan.n == 3
    s = sched(theta_min=2)
    assert s.start_round([(0, 0, 1), (1, 1, 1)]).cold_hit == 0


def test_beats_carry_their_ring_embedding_and_its_next_hops():
    """ring_orders 2 on 2 x 2 (forward 0 1 2 3, backward 3 2 1 0), entry dispatch.  Paired
    order e3 (all four chiplets), e1 (0, 1), e2 (1, 2, 3).  e3 takes embedding 0 (nothing
    runs: the first in turn); e1 embedding 1 (0 holds e3's 4 chiplets); e2 embedding 1 (4
    against e1's 2): its ring backwards, 1 -> 3 -> 2 -> 1."""
    s = sched(ring_orders=2, entry_dispatch=True)
    recs = [(0, 0, 3), (0, 1, 3), (0, 2, 3), (0, 3, 3), (0, 1, 2), (0, 2, 2), (0, 3, 2)]
    recs += [(0, 0, 1), (0, 1, 1)]
    assert s.start_round(recs).order == [3, 1, 2]
    got = [(b.kind, b.expert, b.entry, b.order, b.next_hop) for b in s.decide()]
    assert got == [
        (DISPATCH, 3, 0, 0, (1, 2, 3, 0)),
        (DISPATCH, 1, 1, 1, (1, 0, 0, 0)),
        (DISPATCH, 2, 2, 1, (0, 3, 1, 2)),
    ]
    assert s.running_order == [0, 1, 1, 0] and s.next_order == 0


def test_ring_choice_sums_the_chiplets_of_every_expert_in_an_embedding():
    s = sched(ring_orders=2)
    s.orders = [None]
    s.running = [0b0011, 0b1100, 0b0111, 0]  # embedding 0: 2 + 2 = 4 chiplets, 1: 3
    s.running_order = [0, 0, 1, 0]
    assert s.ring_order(0) == 1


# ----------------------------------------------------------------------------- timing

ROUND = [(0, 0, 5), (0, 1, 5), (1, 0, 5), (1, 1, 5), (0, 2, 2), (0, 3, 2), (1, 3, 2)]
ROUND += [(0, 1, 7), (1, 2, 7), (1, 3, 0)]


def test_the_rounds_beats_in_cycles_by_hand():
    """The round of test_a_round_by_hand (shuffle2 sorter on 8 lanes: 4 cycles; front half
    4 + 8 = 12 cycles).  The last gate record in cycle 10: first beat in 22.  e5 at 22;
    PCHECK for its partner e0 (no pre-load: e0 is dispatched next); e0 at 22 + 4; e2 at
    26 + 3; PCHECK of e7, pre-loaded 2 cycles after e2's dispatch (31); WAIT from 33."""
    s = sched()
    t = SchedulerTiming(s)
    assert t.front == 12 and front_latency(s.p) == 12 and t.words == 2
    assert t.state == "IDLE" and t.idle  # before any round
    t.start_round(ROUND)
    assert t.state == "FILL"
    t.last_record(10)
    got = [(c, b.kind, b.expert) for c, b in t.queue]
    assert got == [(22, DISPATCH, 5), (26, DISPATCH, 0), (29, DISPATCH, 2), (31, PRELOAD, 7)]
    assert t.wait_at == 33
    first = t.queue[0][1]
    assert [t.cycle(c) for c in (21, 22)] == [(None, False), (first, False)]
    for c in range(23, 33):
        t.cycle(c)
    assert t.cycle(33) == (None, True) and t.ready(33) and not t.ready(32)
    # e5 completes in 40: PICK in 41, e7's dispatch in 43 (its partner e2 is dispatched:
    # no PCHECK), WAIT from 45
    t.queue.clear()
    t.completed(40, 0b0001)
    assert [(c, b.expert) for c, b in t.queue] == [(43, 7)] and t.wait_at == 45
    # the rest complete: no PICK; WAIT with the round over: DRAIN, IDLE 2 cycles later
    t.queue.clear()
    t.completed(50, 0b1110)
    assert list(t.queue) == [] and s.plan is None
    assert t.cycle(51) == (None, False) and t.state == "DRAIN"
    assert t.cycle(52) == (None, False) and t.state == "DRAIN"
    assert t.cycle(53) == (None, False) and t.state == "IDLE" and t.idle


def test_the_front_half_waits_for_a_deferral_and_the_balanced_order():
    """A deferral re-merges ceil(8 / 4) = 2 words plus 1; the balanced order takes n + 2."""
    s = sched(theta_min=2)
    s.init_request(1, 1)
    t = SchedulerTiming(s)
    plan = t.start_round([(0, 0, 4), (0, 1, 4), (1, 2, 3)])
    assert plan.defer == 0b10
    t.last_record(0)
    assert t.queue[0][0] == 12 + 2 + 1
    b = SchedulerTiming(sched(balance=2))
    plan = b.start_round(ROUND)
    b.last_record(0)
    assert b.queue[0][0] == 12 + plan.n + 2
    t.reset()
    assert t.state == "IDLE" and not t.queue and s.plan is None


def test_replay_of_a_round_from_its_completions():
    """First beat in 0: e5 0, e0 4, e2 7, e7's pre-load 9; WAIT from 11.  e0 shows its
    completion from 5 and e5 from 8: both are taken together when WAIT begins (11); e7's
    dispatch follows in 14."""
    s = sched()
    s.start_round(ROUND)
    beats, taken = replay_round(s, [(5, 0b1000), (8, 0b0001), (30, 0b0100), (31, 0b0010)])
    assert [(c, b.kind, b.expert) for c, b in beats] == [
        (0, DISPATCH, 5),
        (4, DISPATCH, 0),
        (7, DISPATCH, 2),
        (9, PRELOAD, 7),
        (14, DISPATCH, 7),
    ]
    assert taken == [(11, 0b1001), (30, 0b0100), (31, 0b0010)]


def test_sorter_details_at_their_edges():
    assert all(type(stage_count(n)) is int for n in (1, 2, 4, 8))
    # two lanes on the shuffle-exchange network: one compare-exchange, one step
    assert [s.pairs for s in network(2, "shuffle").steps] == [((0, 1),)]
    assert network(2, "shuffle2").steps == network(2, "shuffle").steps  # one step, 1 cycle
    # the default variant, and a variant checked even though Python's sort does the work
    assert sort_keys([(1, 0), (2, 1)]) == [(2, 1), (1, 0)]
    with pytest.raises(ValueError, match="^sorter must be one of"):
        sort_keys([(1, 0), (2, 1)], "bogus")


def test_a_fresh_timing_has_nothing_placed_and_a_round_without_records_waits():
    """Before any round: no first beat, no WAIT or IDLE cycle.  A round begun with no plan
    (no records) goes to WAIT at once: its PICK in first - 2 finds nothing, WAIT the cycle
    after.  E = 9 experts on 4 EIT lanes: 3 bank words."""
    s = sched()
    t = SchedulerTiming(s)
    assert (t.wait_at, t.idle_at, t.first_beat, t.plan) == (None, None, None, None)
    t.begin(10)
    assert (t.state, t.wait_at, t.first_beat, list(t.queue)) == ("BURST", 9, 10, [])
    assert SchedulerTiming(sched(experts=9)).words == 3


def test_the_rounds_beats_in_the_sorted_order():
    """A2's sorted order has no PCHECK: e5 in 22, e2 in 25, WAIT from 27; the round's first
    beat and plan kept."""
    s = sched(order="sorted")
    t = SchedulerTiming(s)
    t.start_round(ROUND)
    t.last_record(10)
    assert [(c, b.kind, b.expert) for c, b in t.queue] == [(22, DISPATCH, 5), (25, DISPATCH, 2)]
    assert t.wait_at == 27 and t.first_beat == 22 and t.plan is s.plan


def test_beats_the_rtl_would_not_make_take_a_dispatchs_cycles():
    """A scheduler that contradicts the golden one (the watchdog's tests): a dispatch of
    expert 9 (not in the round) and a lone pre-load of e4 are presented like dispatches, 3
    cycles apart; e3's dispatch then has its PCHECK (its partner e4 is neither dispatched nor
    pre-loaded) and no pre-load follows: PICK in 0, beats in 2, 5, 8, WAIT from 0 + 9 + 1 +
    1 = 11."""
    from types import SimpleNamespace

    from fsedp.sw.scheduler import PRELOAD, Dispatch

    def beat(kind, e):
        return Dispatch(kind, e, 1, 0b1, 0, (0, 0, 0, 0))

    out = [beat(DISPATCH, 9), beat(PRELOAD, 4), beat(DISPATCH, 3)]
    fake = SimpleNamespace(
        p=sched().p, plan=SimpleNamespace(order=[3, 4], n=2), scheduled=[False, False],
        preloaded=[False, False], order="paired", decide=lambda: out,
    )  # fmt: skip
    t = SchedulerTiming(fake)
    t._pick(0)
    assert [(c, b.kind, b.expert) for c, b in t.queue] == [
        (2, DISPATCH, 9), (5, PRELOAD, 4), (8, DISPATCH, 3),
    ]  # fmt: skip
    assert t.wait_at == 11
