"""Exact expectations of the mesh geometry every model shares (``fsedp.params``) on meshes
drawn by hand: chiplet numbering, XY directions, neighbours, the ``cycle`` ring path on
even, odd and odd x odd meshes, the eight ring embeddings of a 2 x 2, the hops bound ``H``
and the widths derived from the generics, each at its edges."""

import pytest

from fsedp.errors import InputError
from fsedp.params import (
    DatapathParams,
    SchedulerParams,
    _geometry,
    _number,
    bits_for,
    check_ring_orders,
    cycle_cells,
    max_hops,
    max_hops_by_trajectories,
    mesh_position,
    next_pow2,
    ring_after,
    ring_tables,
    xy_direction,
)


@pytest.mark.parametrize(
    "n, bits, pow2", [(1, 1, 1), (2, 1, 2), (3, 2, 4), (4, 2, 4), (5, 3, 8), (8, 3, 8), (9, 4, 16)]
)
def test_bits_and_powers_of_two(n, bits, pow2):
    assert bits_for(n) == bits and next_pow2(n) == pow2


def test_snake_numbering_of_a_3x3_mesh():
    """0 1 2 / 5 4 3 / 6 7 8."""
    cells = [mesh_position(c, 3) for c in range(9)]
    assert cells == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0), (2, 0), (2, 1), (2, 2)]
    assert [_number(r, k, 3) for r, k in cells] == list(range(9))


@pytest.mark.parametrize(
    "src, dst, port",
    [((1, 1), (1, 2), 1), ((1, 1), (0, 2), 1), ((1, 1), (2, 0), 3), ((1, 1), (2, 1), 2)]
    + [((1, 1), (0, 1), 0), ((1, 1), (1, 1), 0)],
)
def test_xy_routing_goes_along_the_row_first(src, dst, port):
    assert xy_direction(src, dst) == port


def test_neighbours_of_a_2x2_mesh():
    """0 1 / 3 2: ports N, E, S, W."""
    nb, dirs = _geometry(2, 2)
    assert nb == [[None, 1, 3, None], [None, None, 2, 0], [1, None, None, 3], [0, 2, None, None]]
    assert dirs[0] == [0, 1, 1, 2] and dirs[2] == [3, 0, 0, 3]
    p = DatapathParams(rows=2, cols=2)
    assert [p.neighbour(0, d) for d in range(4)] == [None, 1, 3, None]
    assert p.distance(0, 2) == 2 and p.distance(1, 3) == 2 and p.distance(3, 0) == 1


@pytest.mark.parametrize(
    "rows, cols, cells",
    [
        (2, 2, [(0, 0), (0, 1), (1, 1), (1, 0)]),
        (2, 3, [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]),
        # 3 x 2: the transposed ring of 2 x 3
        (3, 2, [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)]),
        (1, 3, [(0, 0), (0, 1), (0, 2)]),
        (3, 1, [(0, 0), (1, 0), (2, 0)]),
        # 4 x 3: row 0, back and forth over columns 1.., up column 0
        (
            4,
            3,
            [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (2, 1), (2, 2), (3, 2), (3, 1)]
            + [(3, 0), (2, 0), (1, 0)],
        ),
        # 3 x 3: the last two rows column by column; (2, 0) -> (0, 0) takes two hops
        (3, 3, [(0, 0), (0, 1), (0, 2), (1, 2), (2, 2), (2, 1), (1, 1), (1, 0), (2, 0)]),
    ],
)
def test_cycle_ring_paths(rows, cols, cells):
    assert cycle_cells(rows, cols) == cells


def test_the_eight_ring_embeddings_of_a_2x2_mesh():
    seqs = [seq for seq, _ in ring_tables(2, 2)]
    assert seqs == [
        (0, 1, 2, 3),
        (3, 2, 1, 0),
        (0, 3, 2, 1),  # the column snake
        (1, 2, 3, 0),
        (2, 3, 0, 1),  # the row snake turned by 180 degrees
        (1, 0, 3, 2),
        (2, 1, 0, 3),  # the column snake turned
        (3, 0, 1, 2),
    ]
    for seq, pos in ring_tables(2, 2):
        assert [pos[c] for c in seq] == [0, 1, 2, 3]
    cyc = [seq for seq, _ in ring_tables(2, 3, "cycle")]
    assert cyc[0] == (0, 1, 2, 3, 4, 5)  # 0 1 2 / 5 4 3: the snake is a cycle here
    assert cyc[2] == (3, 4, 5, 0, 1, 2)  # turned by 180 degrees
    assert cyc[4] == (2, 1, 0, 5, 4, 3)  # mirrored left to right (the mesh is not square)
    with pytest.raises(ValueError, match="^unknown ring path 'spiral'"):
        ring_tables(2, 2, "spiral")


def test_ring_after_follows_the_embedding():
    seq, pos = ring_tables(2, 2)[2]  # 0 3 2 1
    assert ring_after(0b1111, 0, 4, seq, pos) == 3
    assert ring_after(0b0111, 0, 4, seq, pos) == 2  # 3 is off the trajectory
    assert ring_after(0b0011, 1, 4, seq, pos) == 0  # wraps
    assert ring_after(0b0100, 2, 4, seq, pos) == 2  # alone: itself
    with pytest.raises(ValueError, match="^empty trajectory$"):
        ring_after(0, 2, 4, seq, pos)


@pytest.mark.parametrize(
    "rows, cols, hops", [(1, 2, 1), (2, 1, 1), (1, 3, 3), (2, 2, 3), (2, 3, 5), (3, 3, 11)]
)
def test_hops_bound(rows, cols, hops):
    """A row of 3 (0 1 2), all three loaded on 1: 1 -> 2 (1 hop), 2 -> 0 (2 hops), the leg
    0 -> 1 left out: 3.  2 x 2 snake: 0 -> 1 -> 2 -> 3, the closing leg left out: 3.  The
    larger meshes by the definition's enumeration of every trajectory as well."""
    assert max_hops(rows, cols) == hops
    assert max_hops_by_trajectories(rows, cols) == hops


def test_ring_orders_are_one_two_four_or_eight():
    for k in (1, 2, 4, 8):
        check_ring_orders(k)
    for k in (0, 3, 5, 16):
        with pytest.raises(InputError, match=f"ring_orders: must be 1, 2, 4 or 8, not {k}$"):
            check_ring_orders(k)


def test_widths_derived_from_the_scheduler_generics():
    p = SchedulerParams(experts=9, chiplets=5, requests=3, count_width=3, qos_width=2,
                        n_threshold=4, theta_min=1)  # fmt: skip
    assert (p.chiplet_bits, p.expert_bits, p.request_bits) == (3, 4, 2)
    assert (p.sorter_lanes, p.lane_id_bits, p.position_bits) == (16, 4, 4)
    assert (p.count_max, p.qos_max, p.cfw_width, p.cfw_max) == (7, 3, 3, 7)


def dp(**kw):
    base = dict(rows=2, cols=2, experts=16, count_width=6, slots=6, micro_slices=8,
                cycles_per_token=1, ddr_interval=10, ddr_latency=8)  # fmt: skip
    base.update(kw)
    return DatapathParams(**base)


def test_datapath_widths_by_hand():
    p = dp()
    assert (p.chiplets, p.chiplet_bits, p.expert_bits, p.index_bits) == (4, 2, 4, 3)
    assert (p.slot_bits, p.slice_count_bits, p.free_bits) == (3, 4, 3)
    assert (p.max_hops, p.held_claim, p.held_room) == (3, 4, 2)
    assert p.ddr_age_bits == 4 + 8  # latency 8: 0..8 in 4 bits, 8 bits of margin
    assert p.ddr_fifo_depth == 1 + 2  # ceil(8 / 10) in flight, plus 2
    assert dp(ddr_latency=20).ddr_fifo_depth == 2 + 2 and dp(ddr_latency=21).ddr_fifo_depth == 5
    assert p.hop_bits == 3  # 0 .. H + 1 = 4
    assert p.compute_bits == 6  # 63 tokens x 1 cycle, 0..63
    assert dp(cycles_per_token=2).compute_bits == 7  # 0..126


def test_datapath_slots_at_deadlock_freedoms_bound():
    assert dp(slots=4).held_room == 0  # H + 1 = 4: the least, nothing left for held ones
    with pytest.raises(InputError) as e:
        dp(slots=3)
    assert e.value.field == "slots"
    assert e.value.reason == (
        "must be at least max_hops + 1 = 4 on a 2x2 mesh (deadlock freedom), not 3"
    )


def test_datapath_refusals():
    with pytest.raises(InputError, match=r"ddr_channels: must be 1 or rows x cols = 4, not 2$"):
        dp(ddr_channels=2)
    assert dp(ddr_channels=4).ddr_channels == 4 and dp(ddr_channels=1).ddr_channels == 1
    with pytest.raises(InputError, match=r"rows x cols must be 2..64 chiplets, not 1 x 1 = 1$"):
        dp(rows=1, cols=1)
    assert dp(rows=1, cols=2, slots=2).chiplets == 2
    sp = SchedulerParams(chiplets=4, experts=8, theta_min=0)
    with pytest.raises(InputError, match=r"rows x cols = 6 must equal the scheduler's chiplets"):
        DatapathParams.for_scheduler(sp, 2, 3)
    q = DatapathParams.for_scheduler(sp, 2, 2, slots=5)
    assert (q.experts, q.count_width, q.slots, q.ring_path) == (8, sp.count_width, 5, "snake")


def test_paths_on_a_2x2_mesh_by_hand():
    """0 1 / 3 2.  A whole ring loaded on 0: 0 -> 1 -> 2 -> 3, 3 hops; on 1 likewise.  Chiplets
    0 and 2 (diagonal): 2 hops.  One chiplet: 0."""
    p = dp()
    assert p.path_hops(0b1111, 0) == 3 and p.path_hops(0b1111, 1) == 3
    assert p.path_hops(0b0101, 0) == 2 and p.path_hops(0b0100, 2) == 0
    # a remote load on 0 of the ring over 1 and 2: entering at 1 (1 hop + 1) beats 2 (2 + 1)
    assert p.remote_entry(0b0110, 0) == (1, 2)
    # over 1 and 3: both cost 3 (1 + 2): the lower chiplet
    assert p.remote_entry(0b1010, 0) == (1, 3)


@pytest.mark.parametrize(
    "kw, field, reason",
    [
        ({"eit_lanes": 3}, "eit_lanes", "must be a power of two, not 3"),
        ({"eit_lanes": 6}, "eit_lanes", "must be a power of two, not 6"),
        ({"mesh_cols": 3}, "mesh_cols", "must divide chiplets = 4, not 3"),
        ({"ring_orders": 4}, "mesh_cols",
         "ring_orders 4 (other embeddings) needs the mesh columns"),
        ({"ring_path": "cycle"}, "mesh_cols", "ring_path cycle needs the mesh columns"),
        ({"count_width": 2, "theta_min": 4}, "theta_min",
         "must be in 0..2**count_width - 1 = 3, not 4"),
    ],
)  # fmt: skip
def test_scheduler_generics_refused(kw, field, reason):
    base = dict(chiplets=4, experts=8, theta_min=0)
    base.update(kw)
    with pytest.raises(InputError) as e:
        SchedulerParams(**base)
    assert (e.value.field, e.value.reason) == (field, reason)


@pytest.mark.parametrize(
    "kw",
    [
        {"eit_lanes": 1},
        {"eit_lanes": 8},
        {"mesh_cols": 2},
        {"mesh_cols": 4},
        {"ring_orders": 2},  # the first embedding both ways needs no columns
        {"ring_orders": 4, "mesh_cols": 2},
        {"ring_path": "cycle", "mesh_cols": 2},
        {"count_width": 2, "theta_min": 3},  # theta_min at the count's top
    ],
)
def test_scheduler_generics_accepted_at_the_edges(kw):
    base = dict(chiplets=4, experts=8, theta_min=0)
    base.update(kw)
    p = SchedulerParams(**base)
    assert all(getattr(p, k) == v for k, v in kw.items())
    cols = p.mesh_cols or p.chiplets
    assert p.ring_table(0) == ring_tables(4 // cols, cols, p.ring_path)[0]


def test_cycle_ring_path_of_a_5x5_mesh():
    """Row 0; rows 1 and 2 back and forth over columns 4..1; the last two rows column by
    column from column 4 (down, up, down, up); then (3, 0), (4, 0) and up column 0 to 1."""
    assert cycle_cells(5, 5) == (
        [(0, c) for c in range(5)]
        + [(1, 4), (1, 3), (1, 2), (1, 1), (2, 1), (2, 2), (2, 3), (2, 4)]
        + [(3, 4), (4, 4), (4, 3), (3, 3), (3, 2), (4, 2), (4, 1), (3, 1)]
        + [(3, 0), (4, 0), (2, 0), (1, 0)]
    )


def test_neighbours_and_directions_of_meshes_of_three_rows():
    """3 x 3 snake: 0 1 2 / 5 4 3 / 6 7 8; 3 x 2: 0 1 / 3 2 / 4 5.  Ports N E S W."""
    p = dp(rows=3, cols=3, slots=12)
    assert [[p.neighbour(c, d) for d in range(4)] for c in (4, 7, 6, 3)] == [
        [1, 3, 7, 5],
        [4, 8, None, 6],
        [5, 7, None, None],
        [2, None, 8, 4],
    ]
    q = dp(rows=3, cols=2, slots=8)
    assert [[q.neighbour(c, d) for d in range(4)] for c in (2, 4)] == [
        [1, None, 5, 3],
        [3, 5, None, None],
    ]
    # XY: along the row first (E 1 / W 3), then the column (S 2 / N 0)
    assert [p.direction(0, 8), p.direction(8, 0), p.direction(0, 6), p.direction(6, 0)] == [
        1, 3, 2, 0,
    ]  # fmt: skip
    assert [p.direction(4, 1), p.direction(4, 7), q.direction(5, 0)] == [0, 2, 3]


def test_hops_bound_over_the_embeddings():
    """2 x 3: the row snake 0 1 2 3 4 5 has one-hop legs only (6 legs, the closing one left
    out: 5); the column snake (0, 0) (1, 0) (1, 1) (0, 1) (0, 2) (1, 2) closes with a 3-hop
    leg: 1 + 1 + 1 + 1 + 1 + 3 - 1 = 7.  One or two embeddings use the row snake only; four
    or eight the column snake too.  3 x 3: the snake closes with a 4-hop leg (8 + 4 - 1 =
    11), the cycle with a 2-hop one (8 + 2 - 1 = 9)."""
    assert [max_hops(2, 3, o) for o in (1, 2, 4, 8)] == [5, 5, 7, 7]
    assert max_hops(3, 3, 1, "cycle") == 9 and max_hops(3, 3, 1, "snake") == 11
    assert max_hops_by_trajectories(3, 3, "cycle") == 9
    assert dp(rows=3, cols=3, slots=10, ring_path="cycle").max_hops == 9


def test_paths_in_the_backward_embedding():
    """2 x 2, the ring over 0, 1 and 2 loaded on 0: forward 0 -> 1 -> 2 (2 hops); backward
    (embedding 1: 3 2 1 0) 0 -> 2 -> 1 (2 + 1 = 3 hops).  A remote load on 3 of that ring:
    forward, entering at 0 costs 1 + 2 (at 2: 1 + 3, at 1: 2 + 3); backward, entering at 2
    costs 1 + 2 (2 -> 1 -> 0; at 0: 1 + 3, at 1: 2 + 3)."""
    p = dp()
    assert p.path_hops(0b0111, 0) == 2 and p.path_hops(0b0111, 0, 1) == 3
    assert p.path_hops(0b0111, 0, 0) == 2
    assert p.remote_entry(0b0111, 3) == (0, 3) and p.remote_entry(0b0111, 3, 1) == (2, 3)


def test_ring_tables_of_the_generics_follow_their_path():
    p = dp(rows=3, cols=3, slots=10, ring_path="cycle")
    assert p.ring_table(0) == ring_tables(3, 3, "cycle")[0]
    assert p.ring_table(0)[0] == (0, 1, 2, 3, 8, 7, 4, 5, 6)
    sp = SchedulerParams(chiplets=9, experts=8, theta_min=0, mesh_cols=3, ring_path="cycle")
    assert sp.ring_table(0)[0] == (0, 1, 2, 3, 8, 7, 4, 5, 6)
    q = DatapathParams.for_scheduler(sp, 3, 3, slots=10)
    assert (q.rows, q.cols, q.ring_path) == (3, 3, "cycle")


@pytest.mark.parametrize(
    "make, field, reason",
    [
        (lambda: dp(rows=1, cols=1), "rows", "rows x cols must be 2..64 chiplets, not 1 x 1 = 1"),
        (lambda: dp(ddr_channels=2), "ddr_channels", "must be 1 or rows x cols = 4, not 2"),
        (lambda: dp(slots=3), "slots",
         "must be at least max_hops + 1 = 4 on a 2x2 mesh (deadlock freedom), not 3"),
        (lambda: dp(ring_orders=3), "ring_orders", "must be 1, 2, 4 or 8, not 3"),
        (lambda: dp(experts=0), "experts", None),
        (lambda: SchedulerParams(chiplets=4, experts=8, theta_min=0, eit_lanes=3),
         "eit_lanes", "must be a power of two, not 3"),
        (lambda: SchedulerParams(chiplets=4, experts=8, theta_min=0, mesh_cols=3),
         "mesh_cols", "must divide chiplets = 4, not 3"),
        (lambda: SchedulerParams(chiplets=4, experts=8, theta_min=0, ring_orders=8),
         "mesh_cols", "ring_orders 8 (other embeddings) needs the mesh columns"),
        (lambda: SchedulerParams(chiplets=4, experts=8, theta_min=0, ring_path="cycle"),
         "mesh_cols", "ring_path cycle needs the mesh columns"),
        (lambda: SchedulerParams(chiplets=4, experts=8, count_width=2, theta_min=4),
         "theta_min", "must be in 0..2**count_width - 1 = 3, not 4"),
        (lambda: DatapathParams.for_scheduler(
            SchedulerParams(chiplets=4, experts=8, theta_min=0), 2, 3),
         "rows", "rows x cols = 6 must equal the scheduler's chiplets = 4"),
    ],
)  # fmt: skip
def test_refusals_name_the_generics(make, field, reason):
    """Every refusal names the generics (file ``<params>``) and the field."""
    with pytest.raises(InputError) as e:
        make()
    assert (e.value.file, e.value.field) == ("<params>", field)
    if reason is not None:
        assert e.value.reason == reason


def test_the_largest_mesh():
    """64 chiplets is the most: 8 x 8 (H + 1 slots of its snake) is taken, 65 is not."""
    h = max_hops(8, 8)
    assert dp(rows=8, cols=8, slots=h + 1).chiplets == 64
    with pytest.raises(InputError) as e:
        dp(rows=5, cols=13, slots=200)
    assert e.value.reason == "rows x cols must be 2..64 chiplets, not 5 x 13 = 65"
