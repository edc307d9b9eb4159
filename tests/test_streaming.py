"""Golden model of micro-slice streaming: parameters, placement, the rules, conservation,
deadlock freedom (and the deadlock the naive rule runs into), streaming time."""

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsedp.errors import InputError
from fsedp.experiments.datapath_report import one_expert_cycles, one_expert_ideal
from fsedp.params import (
    ADMISSION_RULES,
    OPPOSITE,
    RING_PATHS,
    DatapathParams,
    SchedulerParams,
    max_hops,
    ring_after,
    ring_tables,
)
from fsedp.sim.fsedp import a7_ring_orders
from fsedp.sw.scheduler import DISPATCH, PRELOAD, Dispatch, Scheduler
from fsedp.sw.streaming import Header, StepIn, StreamingArray, arrive
from fsedp.sw.streaming.ddr import AHEAD, load_ahead, take_dispatch
from fsedp.sw.streaming.ring_buffer import Room, store
from fsedp.tb.datapath_scoreboard import Conservation, LayerDriver, Violation
from fsedp.tb.scoreboard import random_round


def sched(rows, cols, experts=16, theta_min=2):
    return SchedulerParams(
        chiplets=rows * cols,
        experts=experts,
        count_width=6,
        requests=4,
        theta_min=theta_min,
        n_threshold=2,
        qos_width=2,
    )


def run_layers(sp, p, rounds, rng, stall=0.0, admission=True, bound=20000, **generics):
    """Run rounds through scheduler + golden array (``generics`` replace scheduler generics);
    returns (driver, array, cycles per layer); raises Violation on a conservation error and
    TimeoutError on no progress."""
    sp = dataclasses.replace(sp, **generics)
    arr = StreamingArray(p, admission=admission)
    drv = LayerDriver(
        sp,
        p,
        rng,
        stall=stall,
        gap=0.2 if stall else 0.0,
        done_stall=0.2 if stall else 0.0,
    )
    per_layer = []
    cycle = 0
    for records, inits in rounds:
        drv.start_layer(records, inits)
        start = cycle
        while not (drv.layer_done and arr.idle):
            out = arr.step(drv.inputs())
            drv.outputs(cycle, out.dispatch_ready, out.done, out.events, out.occupancy)
            cycle += 1
            if cycle - start > bound:
                raise TimeoutError(
                    f"no progress after {bound} cycles: occupancy "
                    f"{[p.slots - arr.free(c) for c in range(p.chiplets)]}"
                )
        drv.check.end_layer([p.slots - arr.free(c) for c in range(p.chiplets)])
        per_layer.append(cycle - start)
    return drv, arr, per_layer


# -- parameters and placement ------------------------------------------------------------
@pytest.mark.parametrize(
    "rows,cols,hops", [(1, 3, 3), (2, 2, 3), (3, 3, 11), (4, 4, 17), (5, 5, 31), (8, 8, 69)]
)
def test_max_hops(rows, cols, hops):
    assert DatapathParams(rows=rows, cols=cols, slots=hops + 1).max_hops == hops
    with pytest.raises(InputError, match=f"slots: must be at least max_hops \\+ 1 = {hops + 1}"):
        DatapathParams(rows=rows, cols=cols, slots=hops)


@pytest.mark.parametrize(
    "rows,cols", [(r, c) for r in range(1, 5) for c in range(1, 5) if r * c > 1]
)
@pytest.mark.parametrize("path", RING_PATHS)
def test_max_hops_equals_its_definition(rows, cols, path):
    """The longest-ascending-path computation of ``H`` equals enumerating every trajectory
    (all meshes up to 16 chiplets, where the enumeration is still possible), for every ring
    path."""
    from fsedp.params import _max_hops, max_hops_by_trajectories

    seq = ring_tables(rows, cols, path)[0][0]
    assert _max_hops(rows, cols, seq) == max_hops_by_trajectories(rows, cols, path)


@pytest.mark.parametrize(
    "field,value",
    [
        ("rows", 0),
        ("micro_slices", 0),
        ("link_cycles", 0),
        ("rule5", 1),
        ("preload_entries", 17),
        ("slots", "6"),
    ],
)
def test_bad_params_name_the_field(field, value):
    with pytest.raises(InputError) as e:
        DatapathParams(**{field: value})
    msg = str(e.value)
    assert e.value.field == field and (repr(value) in msg or str(value) in msg)


@pytest.mark.parametrize("rows,cols", [(2, 2), (3, 3), (2, 4), (4, 4), (1, 5)])
def test_snake_placement_is_a_mesh(rows, cols):
    p = DatapathParams(rows=rows, cols=cols, slots=64)
    assert sorted(p.position(c) for c in range(p.chiplets)) == [
        (r, k) for r in range(rows) for k in range(cols)
    ]
    for c in range(p.chiplets - 1):
        assert p.distance(c, c + 1) == 1  # consecutive numbers are neighbours
    for c in range(p.chiplets):
        for d in range(4):
            nb = p.neighbour(c, d)
            if nb is not None:
                assert p.neighbour(nb, OPPOSITE[d]) == c and p.distance(c, nb) == 1
                assert p.direction(c, nb) == d


def test_path_hops_counts_xy_legs():
    p = DatapathParams(rows=2, cols=2)  # snake: 0 (0,0) 1 (0,1) 2 (1,1) 3 (1,0)
    assert p.path_hops(0b0001, 0) == 0
    assert p.path_hops(0b1111, 0) == 3  # 0-1-2-3
    assert p.path_hops(0b0101, 0) == 2  # 0 -> 2 diagonal: two XY hops
    assert p.path_hops(0b1011, 3) == 2  # 3 -> 0 -> 1


def test_arrive_station_and_transit():
    p = DatapathParams(rows=2, cols=2)
    h = Header(expert=3, index=1, traj=0b0101, dest=2, legs=0, r=1)
    assert arrive(p, 1, h) == dict(
        comp=False, send=True, final=False, dest=2, legs=0, dir=p.direction(1, 2), r=1
    )  # transit on 1
    last = arrive(p, 2, Header(3, 1, 0b0101, 2, 0, 0))
    assert last["comp"] and last["final"] and not last["send"]
    mid = arrive(p, 0, Header(3, 1, 0b0111, 0, 2, 2))
    assert mid["comp"] and mid["send"] and mid["dest"] == 1 and mid["legs"] == 1


# -- conservation, progress --------------------------------------------------------------
CASES = [
    (2, 2, dict()),
    (2, 2, dict(slots=4, link_cycles=1, ddr_interval=1, ddr_latency=1, preload_entries=0)),
    (2, 2, dict(slots=6, link_cycles=4, ddr_interval=6, ddr_latency=30, rule5=True)),
    (3, 3, dict(slots=12, micro_slices=5, preload_entries=3)),
    (2, 4, dict(slots=9, rule5=True, preload_entries=2, cycles_per_token=3)),
    (2, 2, dict(slots=5, ddr_channels=4, ddr_interval=6, ddr_latency=9, preload_entries=2)),
    (3, 3, dict(slots=12, micro_slices=5, ddr_channels=9, ddr_interval=9, preload_entries=3)),
]


@pytest.mark.parametrize("rows,cols,kw", CASES)
@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_random_layers_conserve_and_finish(rows, cols, kw, stall):
    sp = sched(rows, cols)
    p = DatapathParams.for_scheduler(sp, rows, cols, **kw)
    rng = random.Random(rows * 31 + cols + int(stall * 10))
    rounds = [(r.records, r.req_inits) for r in (random_round(sp, rng) for _ in range(25))]
    drv, arr, per_layer = run_layers(sp, p, rounds, rng, stall=stall)
    assert drv.check.computed > 0 and max(drv.check.peak) <= p.slots
    assert not arr.bad_dispatch and not arr.orphan


A6_DP = dict(preempt=True, hot_window=2)
#: A6's scheduler rules: experts at once (one per entry) and the balanced order.
A6 = dict(balance=3, entry_dispatch=True)
A6_CASES = [
    (2, 2, dict(preempt=True, hot_window=1, cycles_per_token=2)),
    (2, 2, dict(slots=4, preempt=True, hot_window=2, ddr_channels=4, ddr_interval=3)),
    (3, 3, dict(slots=12, micro_slices=5, preempt=True, hot_window=1, preload_entries=3)),
    (2, 4, dict(slots=8, preempt=True, hot_window=3, rule5=True, cycles_per_token=3)),
]


@pytest.mark.parametrize("orders", [1, 2, 4], ids=["A6", "A7-rows", "A7"])
@pytest.mark.parametrize("rows,cols,kw", A6_CASES)
@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_a6_rules_conserve_and_finish(rows, cols, kw, stall, orders):
    """Experts with overlapping trajectories streaming at once, preempted computations and
    held-back loads of hot experts, and (A7) rings along the row or column snake in either
    direction under forward-state admission: nothing lost, nothing computed twice, no
    deadlock."""
    sp = sched(rows, cols)
    rule = "forward-state" if orders > 1 else "forward-count"
    if orders == 4:
        orders = a7_ring_orders(rows, cols)  # 2 on 2x4: its column snake is longer
    p = DatapathParams.for_scheduler(sp, rows, cols, admission=rule, ring_orders=orders, **kw)
    rng = random.Random(rows * 17 + cols + int(stall * 10))
    rounds = [(r.records, r.req_inits) for r in (random_round(sp, rng) for _ in range(25))]
    drv, arr, _ = run_layers(
        sp, p, rounds, rng, stall=stall, **A6, ring_orders=orders, mesh_cols=cols
    )
    assert drv.check.computed > 0 and max(drv.check.peak) <= p.slots
    assert not arr.bad_dispatch and not arr.orphan


def ring_next(traj, c, n, order=0, cols=0, path="snake"):
    """``ring_after`` in embedding ``order`` of ``path`` on a mesh of ``cols`` columns."""
    cols = cols or n
    return ring_after(traj, c, n, *ring_tables(n // cols, cols, path)[order])


def test_ring_orders_follow_the_links_load():
    """``ring_orders`` 2: an expert's first beat fixes its ring's direction -- the one whose
    running experts' trajectories hold fewer chiplets, ties in turn -- and its routing table
    runs the other way round; the array's stations follow it."""
    sp = dataclasses.replace(sched(2, 2, experts=8), entry_dispatch=True, ring_orders=2)
    gold = Scheduler(sp)
    # three experts over all four chiplets with distinct entry chiplets free
    records = [(0, c, e) for e in (0, 1, 2) for c in range(4) for _ in range(3 - e)]
    gold.start_round(records)
    beats = [b for b in gold.decide() if b.kind == DISPATCH]
    assert [b.order for b in beats][:2] == [0, 1]  # a tie, then the emptier direction
    for b in beats:
        assert b.next_hop == tuple(ring_next(b.traj, c, 4, b.order) for c in range(4))
    asc, desc = (next(b for b in beats if b.order == o) for o in (0, 1))
    assert asc.next_hop == (1, 2, 3, 0) and desc.next_hop == (3, 0, 1, 2)
    # a station of a descending ring sends its micro-slice to the next lower chiplet
    p = DatapathParams(rows=2, cols=2)
    h = Header(expert=0, index=0, traj=0b1111, dest=2, legs=2, r=2)
    assert arrive(p, 2, h, order=1)["dest"] == 1 and arrive(p, 2, h)["dest"] == 3
    # the descending ring's paths are the ascending ones walked back: the same H
    for rows, cols in ((2, 2), (2, 3), (3, 3)):
        q = DatapathParams(rows=rows, cols=cols, slots=max_hops(rows, cols) + 1)
        n = q.chiplets
        for traj in range(1, 1 << n):
            for a in range(n):
                if traj >> a & 1:
                    assert q.path_hops(traj, a, 1) <= q.max_hops


def test_column_embeddings():
    """``ring_orders`` 4: the column snake of the mesh both ways, pinned on 4x4 (chiplets in
    row-snake numbers: down column 0 is 0, 7, 8, 15, up column 1 is 14, 9, 6, 1, ...) and
    2x3; ``H`` with column embeddings is the larger of the mesh's and its transpose's (on
    2x3 7, not 5, so A7 keeps the row snake there); every path within it; four experts over
    all chiplets take the four embeddings in turn; the datapath refuses a beat of an
    embedding it does not follow."""
    col = [0, 7, 8, 15, 14, 9, 6, 1, 2, 5, 10, 13, 12, 11, 4, 3]
    for q, c in enumerate(col):
        assert ring_next(0xFFFF, c, 16, 2, 4) == col[(q + 1) % 16]
        assert ring_next(0xFFFF, c, 16, 3, 4) == col[(q - 1) % 16]
    assert ring_next(0b100000000000001, 0, 16, 2, 4) == 14  # skips 7, 8, 15
    assert [ring_next(0b111111, c, 6, 2, 3) for c in range(6)] == [5, 2, 3, 0, 1, 4]
    with pytest.raises(ValueError, match="unknown ring path 'spiral'"):
        ring_tables(2, 2, "spiral")
    assert (max_hops(2, 3), max_hops(2, 3, 2), max_hops(2, 3, 4), max_hops(4, 4, 4)) == (
        5,
        5,
        7,
        17,
    )
    assert (a7_ring_orders(2, 3), a7_ring_orders(3, 2), a7_ring_orders(4, 4)) == (2, 4, 4)
    assert [a7_ring_orders(r, c, "cycle") for r, c in ((2, 3), (4, 4), (4, 6), (8, 8))] == [8] * 4
    for rows, cols in ((2, 3), (3, 3)):
        q = DatapathParams(rows=rows, cols=cols, slots=16, ring_orders=4)
        for traj in range(1, 1 << q.chiplets):
            for a in range(q.chiplets):
                if traj >> a & 1:
                    assert max(q.path_hops(traj, a, o) for o in range(4)) <= q.max_hops
    with pytest.raises(InputError, match="ring_orders: must be 1, 2, 4 or 8, not 3"):
        DatapathParams(ring_orders=3)
    with pytest.raises(InputError, match="mesh_cols: ring_orders 4"):
        SchedulerParams(ring_orders=4)
    sp = dataclasses.replace(
        sched(2, 2, experts=8), entry_dispatch=True, ring_orders=4, mesh_cols=2
    )
    gold = Scheduler(sp)
    records = [(0, c, e) for e in range(4) for c in range(4) for _ in range(4 - e)]
    gold.start_round(records)
    beats = [b for b in gold.decide() if b.kind == DISPATCH]
    assert [b.order for b in beats] == [0, 1, 2, 3]
    for b in beats:
        assert b.next_hop == tuple(ring_next(b.traj, c, 4, b.order, 2) for c in range(4))
    arr = StreamingArray(DatapathParams(rows=2, cols=2, ring_orders=2))
    arr.step(StepIn(dispatch=beats[2]))
    assert arr.bad_dispatch


def owed_computations(sp, p, rounds, **generics) -> int:
    """Micro-slice computations a run of ``rounds`` owes: M per chiplet of the trajectory of
    every expert a separate golden scheduler plans (token buffering included)."""
    gold = Scheduler(dataclasses.replace(sp, **generics))
    owed = 0
    for records, inits in rounds:
        for r, t in inits:
            gold.init_request(r, t)
        plan = gold.start_round(records)
        gold.plan = None  # the round's plan is all this needs
        owed += sum(
            p.micro_slices * bin(plan.trajs[e]).count("1")
            for e in range(sp.experts)
            if plan.counts[e]
        )
    return owed


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    slots_extra=st.integers(0, 3),
    link=st.integers(1, 4),
    interval=st.integers(1, 4),
    latency=st.integers(1, 12),
    rule5=st.booleans(),
    preload=st.integers(0, 3),
    stall=st.sampled_from([0.0, 0.4]),
    channels=st.sampled_from([1, 4]),
    a6=st.booleans(),
    window=st.integers(0, 3),
    orders=st.sampled_from([1, 2, 4]),
    rule=st.sampled_from(ADMISSION_RULES),
)
def test_property_no_loss_no_deadlock(
    seed,
    slots_extra,
    link,
    interval,
    latency,
    rule5,
    preload,
    stall,
    channels,
    a6,
    window,
    orders,
    rule,
):
    """No micro-slice lost, none computed twice, every layer finishes and leaves the array
    empty: random generics, stalls, DDR channels, the A6 rules, (``orders`` 2, A7) rings
    in either direction and either admission rule."""
    sp = sched(2, 2, experts=8)
    p = DatapathParams.for_scheduler(
        sp,
        2,
        2,
        slots=4 + slots_extra,
        micro_slices=3,
        link_cycles=link,
        ddr_interval=interval,
        ddr_latency=latency,
        rule5=rule5,
        preload_entries=preload,
        ddr_channels=channels,
        preempt=a6,
        hot_window=window if a6 else 0,
        admission=rule,
        ring_orders=orders,
    )
    rng = random.Random(seed)
    rounds = [(r.records, r.req_inits) for r in (random_round(sp, rng) for _ in range(4))]
    generics = dict(A6 if a6 else {}, ring_orders=orders, mesh_cols=2)
    drv, arr, per_layer = run_layers(sp, p, rounds, rng, stall=stall, **generics)
    # every micro-slice of every scheduled expert was computed once on every chiplet of its
    # trajectory (the plans of a separate golden scheduler fed the same rounds), and the
    # array is empty again
    assert drv.check.computed == owed_computations(sp, p, rounds, **generics)
    assert arr.idle and all(arr.free(c) == p.slots for c in range(p.chiplets))
    assert len(per_layer) == len(rounds)


# -- deadlock ----------------------------------------------------------------------------
#: Seven experts with overlapping trajectories and skewed token counts on a 2x2 array with
#: the minimum 4 slots, Rule 5 and DDR faster than compute: found by a random search in which
#: the naive rule ("accept whenever a slot is free") deadlocked 27 of 200 layers.
WORST = [
    (14, [1, 1, 20, 1]),
    (4, [1, 20, 8, 1]),
    (2, [2, 20, 8, 1]),
    (5, [20, 2, 40, 1]),
    (9, [2, 20, 1, 20]),
    (9, [20, 2, 8, 1]),
    (10, [8, 2, 20, 1]),
]


def worst_records(spec):
    return [
        (0, c, e)
        for e, (traj, tok) in enumerate(spec)
        for c in range(4)
        if traj >> c & 1
        for _ in range(tok[c])
    ]


@pytest.mark.parametrize("rule", ADMISSION_RULES)
def test_naive_admission_deadlocks_and_the_admission_rules_do_not(rule):
    sp = sched(2, 2, experts=8, theta_min=0)
    p = DatapathParams.for_scheduler(
        sp,
        2,
        2,
        slots=4,
        micro_slices=16,
        link_cycles=1,
        ddr_interval=1,
        ddr_latency=1,
        preload_entries=0,
        rule5=True,
        admission=rule,
    )
    rounds = [(worst_records(WORST), [])]
    with pytest.raises(TimeoutError):
        run_layers(sp, p, rounds, random.Random(1), admission=False, bound=6000)
    drv, _, per_layer = run_layers(sp, p, rounds, random.Random(1))
    assert drv.check.computed == 16 * sum(bin(t).count("1") for t, _ in WORST)


def _room(rule, claims, slots=8, hops=3):
    """A :class:`Room` of one chiplet whose busy slots claim ``claims`` (hops to go, or
    ``hops + 1`` for a held one) on a 1 x 4 line (``H`` = 5: hops is how far ``r`` goes)."""
    p = DatapathParams(rows=1, cols=4, slots=slots, admission=rule)
    arr = StreamingArray(p)
    for k, r in enumerate(claims):
        s = arr.chips[0].slots[k]
        s.busy, s.r, s.claim = True, r, r
    return Room(arr)


def test_forward_state_admits_what_forward_count_refuses_and_no_more():
    """Pinned at the edges, ``K`` = 8, ``H`` = 5: forward-count admits ``r`` only while more
    than ``r`` slots are free; forward-state while, for every ``i <= r``, the slots claiming
    at least ``i`` hops, the new one included, leave ``i`` free."""
    assert DatapathParams(rows=1, cols=4, slots=8).max_hops == 5
    # four near the end of their paths (r = 0, 1): forward-count leaves 4 free, so r <= 3
    near = [0, 0, 1, 1]
    assert [_room("forward-count", near).admits(0, r) for r in range(7)] == [True] * 4 + [False] * 3
    # forward-state: N(>= i) = 4, 2, 0 ... for i = 0, 1, 2: every r up to H + 1 = 6 fits
    # (i = 0: 4 + 1 + 0 <= 8; i = 1: 2 + 1 + 1 <= 8; i >= 2: 0 + 1 + i <= 8 for i <= 7)
    assert [_room("forward-state", near).admits(0, r) for r in range(7)] == [True] * 7
    # four far from the end (r = 5): both rules agree -- N(>= i) = 4 up to i = 5, so
    # i = 3 is the last that fits (4 + 1 + 3 = 8)
    far = [5, 5, 5, 5]
    for rule in ADMISSION_RULES:
        assert [_room(rule, far).admits(0, r) for r in range(7)] == [True] * 4 + [False] * 3
    # a held slot claims H + 1 = 6: with six of them N(>= i) = 6 for every i <= 6, so only
    # r = 0 and 1 (6 + 1 + 1 = 8) enter, and a seventh held one (i = 6: 6 + 1 + 6) does not
    held = [6] * 6
    assert [_room("forward-state", held).admits(0, r) for r in range(7)] == [True] * 2 + [False] * 5
    # take() counts what it admitted
    room = _room("forward-state", [])
    for _ in range(3):
        room.take(0, 5)
    assert room.free[0] == 5 and room.admits(0, 4) and not room.admits(0, 5)


def test_a_ddr_load_leaves_the_rung_below_it():
    """[D20], pinned with ``K`` = 8, ``H`` = 5: under forward-state a DDR load claiming ``r``
    is admitted only if, with it taken, an arrival claiming ``min(r, H - 1)`` still would be;
    forward-count loads are admitted as arrivals are."""
    far = [5, 5, 5]  # N(>= i) = 3 for i <= 5
    room = _room("forward-state", far)
    # an arrival: 3 + 1 + i <= 8 for every i <= r, so r <= 4
    assert [room.admits(0, r) for r in range(7)] == [True] * 5 + [False] * 2
    # a load: with it taken an arrival claiming min(r, 4) needs 3 + 2 + i <= 8, so r <= 3
    assert [room.admits_load(0, r) for r in range(7)] == [True] * 4 + [False] * 3
    # near the end of their paths nothing changes: every claim up to H + 1 still loads
    near = _room("forward-state", [0, 0, 1, 1])
    assert [near.admits_load(0, r) for r in range(7)] == [True] * 7
    # five held slots (claim H + 1 = 6): an arrival up to r = 2, a load (a pre-load too,
    # claiming 6) up to r = 1
    held = _room("forward-state", [6] * 5)
    assert [held.admits(0, r) for r in range(7)] == [True] * 3 + [False] * 4
    assert [held.admits_load(0, r) for r in range(7)] == [True] * 2 + [False] * 5
    count = _room("forward-count", far)
    assert [count.admits_load(0, r) for r in range(7)] == [count.admits(0, r) for r in range(7)]
    # admits_load only asks: it takes nothing
    assert room.free[0] == 5 and room.claims[0][5] == 3


def test_conservation_checker_catches_loss_and_duplicates():
    p = DatapathParams(rows=2, cols=2, micro_slices=2)
    chk = Conservation(p)
    chk.on_dispatch(Dispatch(DISPATCH, 5, 3, 0b0011, 0, (1, 0, 0, 0)))
    chk.on_cycle(0, [(5, 0, False), None, None, None], [1, 0, 0, 0])
    with pytest.raises(Violation, match="not \\(or no longer\\) owed"):
        chk.on_cycle(1, [(5, 0, False), None, None, None], [1, 0, 0, 0])
    with pytest.raises(Violation, match="computations missing"):
        chk.end_layer([0, 0, 0, 0])
    with pytest.raises(Violation, match="holds 7"):
        chk.on_cycle(2, [None] * 4, [7, 0, 0, 0])


def test_reset_empties_the_array():
    sp = sched(2, 2)
    p = DatapathParams.for_scheduler(sp, 2, 2)
    rng = random.Random(4)
    arr = StreamingArray(p)
    drv = LayerDriver(sp, p, rng)
    drv.start_layer(random_round(sp, rng, tokens=12).records)
    for cycle in range(40):
        out = arr.step(drv.inputs())
        drv.outputs(cycle, out.dispatch_ready, out.done, out.events, out.occupancy)
    assert not arr.idle
    arr.reset()
    assert arr.idle and arr.tokens != [[0] * p.experts] * p.chiplets  # tables are memories


# -- Rule 4 pre-load and Rule 5 --------------------------------------------------------------
def test_preloads_are_held_until_dispatch():
    sp = sched(2, 2, experts=8, theta_min=0)
    p = DatapathParams.for_scheduler(
        sp, 2, 2, slots=8, micro_slices=4, preload_entries=2, ddr_interval=1, ddr_latency=2
    )
    arr = StreamingArray(p)
    traj = 0b0011
    arr.step(StepIn(tokens=(0, 1, 2)))
    arr.step(StepIn(dispatch=Dispatch(1, 1, 4, traj, 0, (1, 0, 0, 0))))  # PRELOAD expert 1
    held_events = []
    for _ in range(20):
        out = arr.step(StepIn())
        assert all(ev is None for ev in out.events)  # held: nothing computes
        held_events += [d[3] for d in out.ddr_deliveries]
    assert held_events and all(held_events)
    arr.step(StepIn(dispatch=Dispatch(DISPATCH, 1, 4, traj, 1, (1, 0, 0, 0))))
    computed = 0
    for _ in range(200):
        out = arr.step(StepIn())
        computed += sum(ev is not None for ev in out.events)
    assert computed == 4 * 2 and arr.idle


# -- micro-slices pre-loaded ahead of their layer (predicted pre-loads across layers) -----
def _small_array(micro_slices: int, channels: int):
    """A 2x2 array of 8 slots with fast DDR and two pre-load entries."""
    sp = sched(2, 2, experts=8, theta_min=0)
    p = DatapathParams.for_scheduler(
        sp, 2, 2, slots=8, micro_slices=micro_slices, preload_entries=2, ddr_interval=1,
        ddr_latency=2, ddr_channels=channels,
    )  # fmt: skip
    return p, StreamingArray(p)


def _ahead_array(channels=1):
    p, arr = _small_array(4, channels)
    arr.step(StepIn(tokens=(0, 1, 2)))
    arr.step(StepIn(tokens=(1, 1, 3)))
    # micro-slices 0 and 1 of expert 1 wait on chiplet 1 (on its trajectory 0b0011) and on
    # chiplet 3 (off it: it must travel to the trajectory, as a remote load does)
    load_ahead(arr, [(1, 1, 0), (3, 1, 1)])
    return p, arr


def _drain(arr, cycles=300):
    loads, moved, computed = [], [], []
    for _ in range(cycles):
        out = arr.step(StepIn())
        loads += [h.index for _, _, h, _ in out.ddr_issues]
        moved += [(src, h.index) for src, _, h in out.transfers]
        computed += [(c, ev[1]) for c, ev in enumerate(out.events) if ev is not None]
    return loads, moved, computed


@pytest.mark.parametrize("channels", [1, 4])
def test_ahead_micro_slices_bind_at_dispatch(channels):
    """Held until the expert's dispatch, then bound to its trajectory: the job starts with
    them loaded (the DDR loads only indices 2 and 3), the one off the trajectory travels
    to it, and every micro-slice is computed once on each trajectory chiplet."""
    p, arr = _ahead_array(channels)
    for _ in range(10):
        out = arr.step(StepIn())
        assert all(ev is None for ev in out.events) and not out.ddr_issues
    held = [s.held for c in (1, 3) for s in arr.chips[c].slots if s.busy]
    assert held == [AHEAD, AHEAD]
    arr.step(StepIn(dispatch=Dispatch(DISPATCH, 1, 4, 0b0011, 0, (1, 1, 0, 0))))
    assert arr.jobs[0].loaded == 2 and arr.jobs[0].count == 4
    loads, moved, computed = _drain(arr)
    assert sorted(loads) == [2, 3]
    assert (3, 1) in moved  # chiplet 3 sends index 1 towards the trajectory
    assert sorted(computed) == [(c, i) for c in (0, 1) for i in range(4)]
    assert arr.idle and not arr.orphan and not arr.bad_dispatch


def test_ahead_micro_slices_under_a_preload_beat():
    """A PRELOAD beat binds them too, still held (its entry takes them as loaded); the
    dispatch releases them wherever they are."""
    p, arr = _ahead_array()
    arr.step(StepIn(dispatch=Dispatch(1, 1, 4, 0b0011, 0, (1, 1, 0, 0))))  # PRELOAD
    assert arr.pre[0].valid and arr.pre[0].loaded == 2
    loads, _, computed = _drain(arr, 30)
    assert computed == [] and sorted(loads) == [2, 3]
    assert all(s.held is True for c in (1, 3) for s in arr.chips[c].slots if s.busy and s.index < 2)
    arr.step(StepIn(dispatch=Dispatch(DISPATCH, 1, 4, 0b0011, 0, (1, 1, 0, 0))))
    assert arr.jobs[0].loaded == 4
    _, _, computed = _drain(arr)
    assert sorted(computed) == [(c, i) for c in (0, 1) for i in range(4)]
    assert arr.idle


def test_check_ahead_refuses_what_cannot_bind():
    from fsedp.sim.fsedp import check_ahead

    sp = sched(2, 2, experts=8, theta_min=0)
    dp = DatapathParams.for_scheduler(sp, 2, 2, slots=7, micro_slices=4)
    tokens = {(0, 1): 2, (1, 2): 1}
    table = [4, 4, 2, 4, 4, 4, 4, 4]
    ok = [(0, 1, 0), (1, 1, 1), (2, 2, 0), (2, 2, 1)]
    assert check_ahead(dp, tokens, table, ok) == ok
    for bad, why in [
        ([(0, 3, 0)], "does not stream"),
        ([(0, 2, 2)], "streams 2"),
        ([(0, 1, 1)], "0 .. m - 1"),
        ([(0, 1, 0), (1, 1, 0)], "0 .. m - 1"),
        ([(4, 1, 0)], "chiplet 4"),
        ([(0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 1, 3)], "more than 3"),
    ]:
        with pytest.raises(ValueError, match=why):
            check_ahead(dp, tokens, table, bad)


@pytest.mark.parametrize("channels", [1, 4])
@pytest.mark.parametrize("traj,entry", [(0b0011, 0), (0b0110, 2), (0b1101, 3), (0b1000, 3)])
def test_preload_target_chiplets(channels, traj, entry):
    """Where every pre-load micro-slice goes.  One package channel: to the chiplet the
    PRELOAD beat names (``entry``, the matcher's first chiplet of the trajectory), held
    there.  A channel per chiplet (Algorithm 1: "to any idle buffer"): each trajectory
    chiplet loads into its own buffer, and a chiplet off the trajectory sends its load to
    ``remote_entry`` -- the trajectory chiplet it reaches within H hops."""
    p, arr = _small_array(6, channels)
    arr.step(StepIn(dispatch=Dispatch(1, 5, 4, traj, entry, (0, 0, 0, 0))))  # PRELOAD
    issues = []
    for _ in range(30):
        issues += [i for i in arr.step(StepIn()).ddr_issues if i[3]]
    # a pre-load leaves H + 1 slots of its chiplet free for transit (deadlock freedom), so
    # one chiplet holds at most slots - H - 1 of them; with a channel per chiplet the
    # trajectory's (and remote) buffers together hold them all
    room = p.slots - p.max_hops - 1
    want = min(p.micro_slices, room) if channels == 1 else p.micro_slices
    assert len(issues) == want
    assert sorted(h.index for _, _, h, _ in issues) == list(range(want))  # each once
    for target, _, h, held in issues:
        assert held and h.expert == 5
        if channels == 1:
            assert target == entry and h.dest == entry
        elif traj >> target & 1:
            assert h.dest == target
        else:
            assert h.dest == p.remote_entry(traj, target)[0]
    if channels > 1:  # every trajectory chiplet took a share
        assert {t for t, _, _, _ in issues} >= {c for c in range(4) if traj >> c & 1}


def test_rule4_stripes_loads_and_rule5_follows_free_space():
    """Rule 4: every trajectory chiplet loads its share, in ring order from the entry (as
    chiplet 1 loads slice 1 in Figure 6); Rule 5: the chiplet with the most free slots."""
    sp = sched(2, 2, experts=8, theta_min=0)
    base = dict(
        slots=6, micro_slices=12, ddr_interval=1, ddr_latency=2, link_cycles=2, preload_entries=0
    )
    targets = {}
    for rule5 in (False, True):
        p = DatapathParams.for_scheduler(sp, 2, 2, rule5=rule5, **base)
        arr = StreamingArray(p)
        for c in range(4):
            arr.step(StepIn(tokens=(c, 0, 6 if c != 2 else 1)))
        arr.step(StepIn(dispatch=Dispatch(DISPATCH, 0, 19, 0b1101, 2, (2, 0, 3, 0))))
        seq = []
        while not arr.idle:
            seq += [i[0] for i in arr.step(StepIn()).ddr_issues]
        targets[rule5] = seq
    assert targets[False] == [2, 3, 0] * 4  # entry 2, ring 2 -> 3 -> 0
    assert sorted(set(targets[True])) == [0, 2, 3] and targets[True] != targets[False]


# -- streaming time ---------------------------------------------------------------------------
@pytest.mark.parametrize("rows,cols", [(2, 2), (3, 3), (4, 4)])
@pytest.mark.parametrize("tokens,link", [(1, 4), (4, 2), (8, 8)])
def test_stream_one_expert_near_ideal(rows, cols, tokens, link):
    """A ring through every chiplet takes its busiest resource's time plus at most twice the fill
    (first DDR load, the longest path, one compute), with 2 slots more than the
    deadlock-freedom minimum."""
    hops = max_hops(rows, cols)
    p = DatapathParams(
        rows=rows,
        cols=cols,
        slots=hops + 3,
        micro_slices=16,
        link_cycles=link,
        ddr_interval=1,
        ddr_latency=4,
        cycles_per_token=1,
    )
    got = one_expert_cycles(p, tokens)
    ideal, fill = one_expert_ideal(p, tokens)
    assert ideal <= got <= ideal + 2 * fill, (got, ideal, fill)


#: (ddr_interval I, ddr_latency L, tokens, cycles_per_token): DDR-bound (I > T), compute-bound
#: (T > I), balanced, and T from two cycles per token
EXACT = [(5, 3, 1, 1), (7, 9, 3, 2), (1, 3, 4, 1), (1, 2, 2, 2), (2, 6, 2, 1), (3, 1, 2, 1)]


@pytest.mark.parametrize("interval,latency,tokens,cpt", EXACT)
@pytest.mark.parametrize("micro_slices", [1, 2, 5, 9])
@pytest.mark.parametrize("chiplet", [0, 3])
def test_stream_time_exact_on_one_chiplet(interval, latency, tokens, cpt, micro_slices, chiplet):
    """Exact streaming time on a ring of one chiplet, derived stage by stage: the dispatch beat
    is registered in cycle 0; the first load issues in cycle 1; it is delivered L cycles
    later (cycle 1 + L) and is in its slot the next cycle, when the compute unit starts it;
    the computation takes T = tokens x cycles_per_token cycles, its end is an event in cycle
    2 + L + T and the retirement reaches ``done`` in cycle 3 + L + T: L + T + 4 cycles
    counted.  Every further micro-slice adds the slower of the DDR issue interval I and the
    computation T (6 slots keep the DDR ahead: 6 max(I, T) > L + I).  A rate off by one
    (issue interval, compute time) is off by M - 1 cycles here, not hidden by a tolerance."""
    p = DatapathParams(
        rows=2, cols=2, slots=6, micro_slices=micro_slices, link_cycles=2,
        ddr_interval=interval, ddr_latency=latency, cycles_per_token=cpt,
    )  # fmt: skip
    t = tokens * cpt
    assert 6 * max(interval, t) > latency + interval
    want = latency + t + 4 + (micro_slices - 1) * max(interval, t)
    assert one_expert_cycles(p, tokens, [chiplet]) == want


@pytest.mark.parametrize("interval,latency,tokens,link", [(8, 4, 1, 2), (8, 4, 2, 3), (9, 2, 3, 1)])
@pytest.mark.parametrize("micro_slices", [1, 3, 6])
def test_stream_time_exact_ring_of_two_ddr_bound(interval, latency, tokens, link, micro_slices):
    """A ring of two neighbours, DDR-bound (I > link + 2T): a micro-slice computes on its
    load chiplet while the router forwards it (one hop, ``link_cycles``), so the last station
    finishes ``link`` cycles after the one-chiplet case; each further micro-slice adds I."""
    p = DatapathParams(
        rows=2, cols=2, slots=6, micro_slices=micro_slices, link_cycles=link,
        ddr_interval=interval, ddr_latency=latency, cycles_per_token=1,
    )  # fmt: skip
    assert p.distance(0, 1) == 1 and interval > link + 2 * tokens
    want = latency + tokens + link + 4 + (micro_slices - 1) * interval
    assert one_expert_cycles(p, tokens, [0, 1]) == want


# -- event skipping and DDR channels -------------------------------------------------------
def layer_steps(arr, drv, rounds):
    """Drive ``arr`` through ``rounds`` of ``(records, inits)``: yields ``(cycle, out)`` of
    every step once the driver has seen its outputs (the caller may then skip time), and
    checks the driver's books at the end of each layer."""
    p = arr.p
    for records, inits in rounds:
        drv.start_layer(records, inits)
        while not (drv.layer_done and arr.idle):
            cycle = arr.cycle
            out = arr.step(drv.inputs())
            drv.outputs(cycle, out.dispatch_ready, out.done, out.events, out.occupancy)
            yield cycle, out
        drv.check.end_layer([p.slots - arr.free(c) for c in range(p.chiplets)])


def trace_run(p, sp, rounds, skip: bool, **generics):
    """(cycle, chiplet, event) of every compute completion, the final cycle and the number of
    steps taken."""
    arr = StreamingArray(p)
    drv = LayerDriver(dataclasses.replace(sp, **generics), p, random.Random(5))
    log, steps = [], 0
    for cycle, out in layer_steps(arr, drv, rounds):
        steps += 1
        log += [(cycle, c, ev) for c, ev in enumerate(out.events) if ev is not None]
        if skip and not drv.token_writes and not drv.beats:
            arr.fast_forward()
    return log, arr.cycle, steps


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(ddr_channels=4, rule5=True, preload_entries=2),
        dict(link_cycles=37, ddr_interval=91, ddr_latency=120, cycles_per_token=13, ddr_channels=4),
        dict(ddr_interval=40, ddr_latency=50, cycles_per_token=11, ddr_channels=4, **A6_DP),
    ],
)
def test_fast_forward_is_exact(kw):
    sp = sched(2, 2)
    p = DatapathParams.for_scheduler(sp, 2, 2, slots=7, **kw)
    rng = random.Random(8)
    rounds = [(r.records, r.req_inits) for r in (random_round(sp, rng) for _ in range(6))]
    policy = A6 if p.preempt else {}
    slow, end_slow, steps_slow = trace_run(p, sp, rounds, skip=False, **policy)
    fast, end_fast, steps_fast = trace_run(p, sp, rounds, skip=True, **policy)
    assert fast == slow and end_fast == end_slow
    assert steps_slow == end_slow and steps_fast < end_fast  # cycles were skipped
    assert len(slow) == owed_computations(sp, p, rounds, **policy)  # and nothing was lost


def test_ddr_channels_param():
    assert DatapathParams(ddr_channels=4).ddr_channels == 4
    with pytest.raises(InputError, match="ddr_channels: must be 1 or rows x cols = 4, not 2"):
        DatapathParams(ddr_channels=2)
    from fsedp.hw.ddr_ctrl import DDRController

    # the RTL has a channel per chiplet too: one delivery port per channel
    for channels in (4, 1):
        ctrl = DDRController(DatapathParams(ddr_channels=channels))
        ctrl._MustUse__silence = True  # only its ports are inspected, never elaborated
        assert len(ctrl.deliver) == channels


def test_per_chiplet_channels_load_in_parallel():
    """Four experts entering on four chiplets: with one channel per chiplet the loads of a
    cycle go out in parallel, so the layer takes about a quarter of the DDR time."""
    sp = sched(2, 2, experts=8, theta_min=0)
    records = [(0, c, c) for c in range(4) for _ in range(2)]
    cycles = {}
    for ch in (1, 4):
        p = DatapathParams.for_scheduler(
            sp,
            2,
            2,
            slots=6,
            micro_slices=8,
            ddr_interval=20,
            ddr_latency=4,
            link_cycles=1,
            ddr_channels=ch,
        )
        _, _, per_layer = run_layers(sp, p, [(records, [])], random.Random(1))
        cycles[ch] = per_layer[0]
    assert cycles[4] < 0.35 * cycles[1], cycles


@pytest.mark.parametrize("rows,cols", [(2, 2), (3, 3), (2, 4)])
def test_remote_entry_stays_within_h(rows, cols):
    p = DatapathParams(rows=rows, cols=cols, slots=max_hops(rows, cols) + 1)
    n = p.chiplets
    for traj in range(1, 1 << n):
        for c in range(n):
            if traj >> c & 1:
                continue
            dest, r = p.remote_entry(traj, c)
            assert traj >> dest & 1 and r <= p.max_hops
            assert r == p.distance(c, dest) + p.path_hops(traj, dest)
            assert r == min(
                p.distance(c, j) + p.path_hops(traj, j) for j in range(n) if traj >> j & 1
            )


def test_remote_loads_share_the_channels():
    """One expert whose tokens all sit on chiplet 3: with a channel per chiplet the other
    three chiplets load its micro-slices too and send them to chiplet 3 (remote loads), so
    the four channels share the loads; every micro-slice is computed once, on chiplet 3."""
    sp = sched(2, 2, experts=8, theta_min=0)
    m, interval = 16, 40
    p = DatapathParams.for_scheduler(
        sp,
        2,
        2,
        slots=6,
        micro_slices=m,
        ddr_interval=interval,
        ddr_latency=interval + 4,
        link_cycles=2,
        cycles_per_token=1,
        ddr_channels=4,
    )
    records = [(0, 3, 5)] * 3
    drv, arr, per_layer = run_layers(sp, p, [(records, [])], random.Random(1))
    assert drv.check.computed == m
    assert per_layer[0] < 0.4 * m * interval, per_layer
    # the same layer with remote loads impossible (one channel per chiplet, only chiplet 3's
    # serves the trajectory) is the single-channel time
    single = DatapathParams.for_scheduler(
        sp,
        2,
        2,
        slots=6,
        micro_slices=m,
        ddr_interval=interval,
        ddr_latency=interval + 4,
        link_cycles=2,
        cycles_per_token=1,
    )
    _, _, one = run_layers(sp, single, [(records, [])], random.Random(1))
    assert one[0] > m * interval


def test_remote_loads_come_from_every_channel_and_compute_only_on_the_trajectory():
    sp = sched(2, 2, experts=8, theta_min=0)
    p = DatapathParams.for_scheduler(
        sp,
        2,
        2,
        slots=6,
        micro_slices=12,
        ddr_interval=30,
        ddr_latency=34,
        link_cycles=2,
        cycles_per_token=1,
        ddr_channels=4,
    )
    arr = StreamingArray(p)
    arr.tokens[3][5] = 3
    arr.step(StepIn(dispatch=Dispatch(DISPATCH, 5, 3, 0b1000, 3, (0, 0, 0, 0))))
    loaders, computers = set(), set()
    for _ in range(2000):
        out = arr.step(StepIn())
        loaders |= {t for t, *_ in out.ddr_issues}
        computers |= {c for c, ev in enumerate(out.events) if ev is not None}
        for t, _, h, _ in out.ddr_issues:
            assert h.dest == 3 and h.r == p.distance(t, 3) <= p.max_hops
        if out.done:
            break
    assert out.done and loaders == {0, 1, 2, 3} and computers == {3}


def _hot_and_cold(preempt: bool, hot_window: int = 0):
    """Expert 1 hot (30 tokens on chiplet 0), expert 2 cold (1 token on chiplets 0 and 1):
    returns chiplet 0's completions, its busy cycles and expert 1's loads ahead."""
    sp = sched(2, 2, experts=8, theta_min=0)
    p = DatapathParams.for_scheduler(
        sp,
        2,
        2,
        slots=8,
        micro_slices=4,
        ddr_interval=4,
        ddr_latency=6,
        ddr_channels=4,
        preempt=preempt,
        hot_window=hot_window,
        preload_entries=0,
    )
    arr = StreamingArray(p)
    arr.step(StepIn(tokens=(0, 1, 30)))
    arr.step(StepIn(tokens=(0, 2, 1)))
    arr.step(StepIn(tokens=(1, 2, 1)))
    arr.step(StepIn(dispatch=Dispatch(DISPATCH, 1, 30, 0b0001, 0, (0, 0, 0, 0))))
    for _ in range(20):  # the hot expert's first micro-slice is computing
        arr.step(StepIn())
    arr.step(StepIn(dispatch=Dispatch(DISPATCH, 2, 2, 0b0011, 1, (1, 0, 0, 0))))
    done, busy, loaded_ahead = [], 0, []
    for _ in range(400):
        out = arr.step(StepIn())
        done += [out.events[0][0]] if out.events[0] is not None else []
        busy += arr.chips[0].cnt > 0
        job = next((j for j in arr.jobs if j.valid and j.expert == 1), None)
        if job is not None:
            loaded_ahead.append(job.loaded - job.retired)
        if arr.idle:
            break
    return done, busy, loaded_ahead, arr


def test_preemption_lets_a_short_computation_pass_and_loses_no_work():
    """[D11] The cold expert's micro-slices (1 cycle each) do not wait behind the hot one's
    (30 cycles): they preempt it, and the preempted one resumes with what is left -- the
    compute unit is busy exactly as long as without preemption."""
    plain, busy_plain, _, _ = _hot_and_cold(False)
    pre, busy_pre, _, arr = _hot_and_cold(True)
    assert sorted(plain) == sorted(pre) == [1] * 4 + [2] * 4 and arr.idle
    assert plain[:5] == [1, 1, 1, 1, 2]  # without: the cold expert waits for all of them
    assert pre.index(2) < 3  # with: the cold expert passes the hot one
    assert busy_pre == busy_plain


def test_hot_window_holds_back_the_loads_of_a_compute_heavy_expert():
    """[D12] A compute-heavy expert never has more than hot_window micro-slices loaded and
    not retired; without the window it loads all of them at once."""
    _, _, ahead, _ = _hot_and_cold(True, hot_window=2)
    _, _, unlimited, _ = _hot_and_cold(True, hot_window=0)
    assert max(ahead) == 2 and max(unlimited) == 4


def test_probes_do_not_change_the_run():
    """The idle-cause probes only read the state: with them a run takes the same decisions,
    cycle for cycle (and A6's rules are probed too)."""
    sp = sched(2, 2)
    for kw in (dict(), dict(ddr_channels=4, cycles_per_token=11, ddr_interval=40, **A6_DP)):
        p = DatapathParams.for_scheduler(sp, 2, 2, slots=7, **kw)
        rng = random.Random(3)
        rounds = [(r.records, r.req_inits) for r in (random_round(sp, rng) for _ in range(4))]
        runs = []
        for probes in (False, True):
            arr = StreamingArray(p, probes=probes)
            drv = LayerDriver(sp, p, random.Random(5))
            log = []
            for _, out in layer_steps(arr, drv, rounds):
                log.append((out.events, out.transfers, out.ddr_issues, out.done))
                assert (out.ddr_idle is not None) == probes
            runs.append((log, arr.cycle))
        assert runs[0] == runs[1] and len(runs[0][0]) > 50


def test_an_unheld_micro_slice_claims_its_hops():
    """Forward-state admission [D16]: a pre-loaded micro-slice claims ``H + 1`` while held;
    the dispatch that un-holds it lowers its claim to the hops it has to go, so that it no
    longer counts against arrivals with fewer."""
    p = DatapathParams(rows=2, cols=2, slots=8, admission="forward-state")
    arr = StreamingArray(p)
    top = p.max_hops + 1
    take_dispatch(arr, Dispatch(PRELOAD, 3, 5, 0b0111, 0, (1, 2, 0, 0)))
    assert arr.pre[0].valid
    s = arr.chips[0].slots[2]
    h = Header(expert=3, index=0, traj=0b0111, dest=0, legs=2, r=2)
    store(arr, 0, 2, h, wait=0, ddr=True, held=True)
    assert (s.held, s.claim) == (True, top)
    take_dispatch(arr, Dispatch(DISPATCH, 3, 5, 0b0111, 0, (1, 2, 0, 0)))
    assert (s.held, s.claim, s.r) == (False, 2, 2)


@pytest.mark.parametrize(
    "rows,cols", [(2, 2), (2, 3), (3, 3), (3, 4), (4, 4), (5, 5), (4, 6), (8, 8)]
)
def test_cycle_ring_path(rows, cols):
    """The ``cycle`` ring path visits every chiplet once; every leg, the closing one too, is
    one hop where a side is even (one leg of two on an odd x odd mesh, where a one-hop ring
    cannot exist: the mesh is bipartite with an odd count); its other embeddings are the first
    turned by 180 degrees, mirrored (transposed on a square mesh) and both; backward orders
    walk forward ones back; ``H`` bounds every path of all eight, and it is never above the
    snake's."""
    from fsedp.params import mesh_position

    p = DatapathParams(
        rows=rows, cols=cols, slots=max_hops(rows, cols, 4) + 1, ring_path="cycle",
        ring_orders=8,
    )  # fmt: skip
    n = p.chiplets
    tables = ring_tables(rows, cols, "cycle")
    for seq, pos in tables:
        assert sorted(seq) == list(range(n)) and all(seq[pos[c]] == c for c in range(n))
    seq = tables[0][0]
    legs = sorted(p.distance(seq[i], seq[(i + 1) % n]) for i in range(n))
    assert legs == ([1] * n if rows % 2 == 0 or cols % 2 == 0 else [1] * (n - 1) + [2])
    turned = [(rows - 1 - r, cols - 1 - k) for r, k in (mesh_position(c, cols) for c in seq)]
    assert [mesh_position(c, cols) for c in tables[2][0]] == turned
    cells = [mesh_position(c, cols) for c in seq]
    mirrored = [(k, r) if rows == cols else (r, cols - 1 - k) for r, k in cells]
    assert [mesh_position(c, cols) for c in tables[4][0]] == mirrored
    assert [mesh_position(c, cols) for c in tables[6][0]] == [
        (rows - 1 - r, cols - 1 - k) for r, k in mirrored
    ]
    assert len(tables) == 8
    assert all(tables[o + 1][0] == tables[o][0][::-1] for o in range(0, 8, 2))
    assert p.max_hops <= max_hops(rows, cols, 4, "snake")
    rng = random.Random(rows * 10 + cols)
    for traj in [(1 << n) - 1] + [rng.getrandbits(n) | 1 << rng.randrange(n) for _ in range(40)]:
        for a in range(n):
            if traj >> a & 1:
                assert max(p.path_hops(traj, a, o) for o in range(8)) <= p.max_hops


def test_cycle_path_beats_and_stations_agree():
    """With the cycle path the scheduler's next-hop tables and the array's stations follow
    the same ring: a 4x4 dispatch over every chiplet hops to a mesh neighbour each leg."""
    sp = dataclasses.replace(
        sched(4, 4, experts=16), entry_dispatch=True, ring_orders=4, mesh_cols=4,
        ring_path="cycle",
    )  # fmt: skip
    gold = Scheduler(sp)
    gold.start_round([(0, c, e) for e in range(4) for c in range(16) for _ in range(4 - e)])
    beats = [b for b in gold.decide() if b.kind == DISPATCH]
    p = DatapathParams(rows=4, cols=4, slots=16, ring_path="cycle", ring_orders=4)
    assert beats and {b.order for b in beats} >= {0, 1}
    for b in beats:
        assert b.next_hop == tuple(ring_next(b.traj, c, 16, b.order, 4, "cycle") for c in range(16))
        if b.traj == 0xFFFF:
            assert all(p.distance(c, b.next_hop[c]) == 1 for c in range(16))
        h = Header(expert=b.expert, index=0, traj=b.traj, dest=b.entry, legs=1, r=1)
        assert arrive(p, b.entry, h, order=b.order)["dest"] == b.next_hop[b.entry]
