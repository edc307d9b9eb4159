"""Exact expectations of A8's token placement and its cost model (``fsedp.sim.regions``) on
meshes small enough to work out by hand: the tilings, the regions, the links into a
region, where each moved token goes, how an expert's tokens are evened out, the
all-to-all's price, and the cost model's tie rule at exactly 1 %.

Numbering of a ``rows x cols`` mesh (``fsedp.params.mesh_position``, boustrophedon): on
2 x 4, chiplets 0 1 2 3 on row 0 from the left and 4 5 6 7 on row 1 from the right::

    0 1 2 3
    7 6 5 4
"""

from types import SimpleNamespace

import numpy as np
import pytest
from tiny import hand_setup

from fsedp.sim.regions import (
    _better,
    _min_in_degree,
    _place,
    all_to_all_cycles,
    assign,
    gather,
    plan,
    regions_of,
    spread,
    tilings,
)


@pytest.mark.parametrize(
    "rows, cols, shapes",
    [
        (2, 4, [(2, 4), (1, 4), (2, 2), (1, 2), (2, 1)]),
        (3, 3, [(3, 3), (1, 3), (3, 1)]),
        (2, 2, [(2, 2), (1, 2), (2, 1)]),
        (1, 2, [(1, 2)]),
        (1, 1, []),
    ],
)
def test_tilings_largest_first(rows, cols, shapes):
    assert tilings(rows, cols) == shapes


def test_regions_of_a_2x4_mesh():
    assert regions_of(2, 4, (2, 2)) == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert regions_of(2, 4, (1, 4)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert regions_of(2, 4, (2, 1)) == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert regions_of(2, 4, (2, 4)) == [list(range(8))]
    with pytest.raises(ValueError, match="^regions of 2x3 do not tile a 2x4 mesh$"):
        regions_of(2, 4, (2, 3))
    with pytest.raises(ValueError, match="^regions of 3x2 do not tile a 2x4 mesh$"):
        regions_of(2, 4, (3, 2))


def test_links_into_a_region():
    assert _min_in_degree([0, 1, 6, 7], 4) == 2  # a 2x2 square: two neighbours each
    assert _min_in_degree([0, 1, 2, 3], 4) == 1  # a row: its ends have one
    assert _min_in_degree([5], 4) == 0
    assert _min_in_degree(list(range(8)), 4) == 2  # the corners of the whole 2x4


def test_placing_tokens_stays_then_goes_to_the_nearest_with_room():
    """2 x 4 mesh; one expert's five tokens on 0, 0, 3, 4, 4; room: 1 on 0, 2 on 1, 2 on 6.
    The first token of 0 stays; the second goes to 1 (1 hop; 6 is 2 away).  3 -> 1 (2 hops:
    (0, 3) to (0, 1); 6 is (1, 1): 3 hops).  Both of 4 ((1, 3)) -> 6 (2 hops; 1 has none
    left)."""
    pos = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 3), (1, 2), (1, 1), (1, 0)]
    records = [(0, 0, 9), (1, 0, 9), (2, 3, 9), (3, 4, 9), (4, 4, 9), (5, 2, 8)]
    out, moves = list(records), []
    room = {0: 1, 1: 2, 6: 2}
    _place(records, [0, 1, 2, 3, 4], room, pos, out, moves)
    assert out == [(0, 0, 9), (1, 1, 9), (2, 1, 9), (3, 6, 9), (4, 6, 9), (5, 2, 8)]
    assert moves == [(0, 1), (3, 1), (4, 6), (4, 6)]
    assert room == {0: 0, 1: 0, 6: 0}


def test_placing_ties_go_to_the_lower_numbered_chiplet():
    pos = [(0, 0), (0, 1), (1, 1), (1, 0)]  # 2 x 2: 0 1 / 3 2
    records = [(0, 0, 1), (1, 0, 1)]
    out, moves = list(records), []
    _place(records, [0, 1], {0: 0, 1: 1, 3: 1}, pos, out, moves)  # 1 and 3: both 1 hop
    assert out == [(0, 1, 1), (1, 3, 1)] and moves == [(0, 1), (0, 3)]


def test_spreading_an_expert_over_its_own_chiplets():
    """2 x 2 mesh.  Expert 0: 3 tokens on 0, 1 on 1: two each, one token 0 -> 1.
    Expert 1: 2 tokens on 2, 1 on 3: 3 = 1 + 1 + a remainder; chiplet 2 keeps its total
    (it holds 2 of expert 1 only), so 2 keeps two: nothing moves."""
    records = [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 1, 0), (4, 2, 1), (5, 2, 1), (6, 3, 1)]
    out, moves = spread(records, 4, 2)
    assert moves == [(0, 1)]
    assert out == [(0, 0, 0), (1, 0, 0), (2, 1, 0), (3, 1, 0), (4, 2, 1), (5, 2, 1), (6, 3, 1)]


def test_spreading_remainders_keep_the_chiplets_totals():
    """2 x 2 mesh.  Expert 5 has 3 tokens on 0 and 1 on 1 (4: two each); expert 6 has 1 token
    on 0 and 2 on 1 (3: one each, one remainder).  Totals before: 0 holds 4, 1 holds 3.
    After the even shares, 0 holds 2 + 1 = 3 and 1 holds 2 + 1 = 3: chiplet 0 is short of
    its total by one, so expert 6's remainder goes to 0: expert 6 moves one token 1 -> 0,
    expert 5 one token 0 -> 1, and each chiplet keeps its total."""
    records = [(0, 0, 5), (1, 0, 5), (2, 0, 5), (3, 1, 5), (4, 0, 6), (5, 1, 6), (6, 1, 6)]
    out, moves = spread(records, 4, 2)
    held = [sum(1 for _, c, _ in out if c == k) for k in range(4)]
    assert held == [4, 3, 0, 0]
    assert out == [(0, 0, 5), (1, 0, 5), (2, 1, 5), (3, 1, 5), (4, 0, 6), (5, 1, 6), (6, 0, 6)]
    # the expert with fewer chiplets first (both have 2), then the larger (5: 4 tokens)
    assert moves == [(0, 1), (1, 0)]


def test_an_expert_on_one_chiplet_does_not_move():
    records = [(0, 3, 2), (1, 3, 2), (2, 3, 2)]
    assert spread(records, 4, 2) == (records, [])


def _setup(rows=2, cols=2, act_bytes=10, bpc=4, latency=3):
    return hand_setup(rows, cols, act_bytes, bpc, latency)


def test_all_to_all_by_hand():
    """2 x 2 (0 1 / 3 2), every chiplet with two links.  Moves 0->1 twice and 0->3 once:
    chiplet 0 sends 30 bytes over its 2 links, 15 each: ceil(15 / 4) = 4 cycles, plus the
    longest move's hop (1) x 3 cycles = 7; 30 bytes.  A move to itself costs nothing."""
    s = _setup()
    assert all_to_all_cycles(s, [(0, 1), (0, 1), (0, 3), (2, 2)]) == (7, 30)
    assert all_to_all_cycles(s, [(0, 2)]) == (2 + 2 * 3, 10)  # 5 per link, 2 hops
    assert all_to_all_cycles(s, [(1, 0), (2, 0), (3, 0)]) == (4 + 2 * 3, 30)  # 0 receives
    assert all_to_all_cycles(s, [(1, 1)]) == (0, 0)
    assert all_to_all_cycles(s, []) == (0, 0)
    # 16 bytes per link exactly fill 4 cycles; one more byte takes a fifth
    assert all_to_all_cycles(_setup(act_bytes=16), [(0, 1), (0, 3)])[0] == 4 + 3
    assert all_to_all_cycles(_setup(act_bytes=17), [(0, 1), (0, 3)])[0] == 5 + 3


def test_all_to_all_on_a_row_counts_the_end_chiplets_one_link():
    s = _setup(rows=1, cols=4)  # 0 1 2 3: chiplet 0 has one link
    assert all_to_all_cycles(s, [(0, 3)]) == (3 + 3 * 3, 10)
    assert all_to_all_cycles(s, [(1, 2)]) == (2 + 3, 10)  # 5 bytes over each of 2 links


def test_cost_model_tie_rule_at_exactly_one_percent():
    # within 1 % (2 of 200): the less loaded busiest link wins, then the lower score
    assert _better((198.0, 3.0), (200.0, 5.0)) is True
    assert _better((198.0, 5.0), (200.0, 3.0)) is False
    assert _better((200.0, 3.0), (198.0, 5.0)) is True
    # just beyond (2 of 199): the lower score
    assert _better((197.0, 5.0), (199.01, 3.0)) is True
    assert _better((199.01, 3.0), (197.0, 5.0)) is False
    # equal links: the lower score
    assert _better((199.0, 3.0), (200.0, 3.0)) is True
    assert _better((200.0, 3.0), (199.0, 3.0)) is False


def test_assign_by_hand():
    """2 regions of 2 chiplets (2 x 2 mesh, 1 x 2 regions: [0, 1] and [3, 2]); DDR 10
    cycles a micro-slice, 1 cycle a token-slice.  Expert 0: 4 slices, 6 tokens on chiplet 2
    (load 40, work 24); expert 1: 2 slices, 2 tokens on chiplet 0 (load 20, work 4);
    expert 2: 2 slices, 1 token on chiplet 3 (20, 2).  Largest first: e0 to either region
    (cost 20 each): the one holding its tokens, region 1; e1: region 0 (10 < 30); e2:
    region 0 (10 + 10 = 20 < 30) -- no move lowers the largest (20 both)."""
    dp = SimpleNamespace(ddr_interval=10, cycles_per_token=1)
    held = np.zeros((4, 3), np.int64)
    held[2, 0], held[0, 1], held[3, 2] = 6, 2, 1
    per = np.array([4, 2, 2])
    regions = regions_of(2, 2, (1, 2))
    assert regions == [[0, 1], [2, 3]]
    assert list(assign(held, per, dp, regions)) == [1, 0, 0]
    # an idle expert has no region
    held[:, 2] = 0
    assert list(assign(held, per, dp, regions)) == [1, 0, -1]


def test_gather_into_regions_by_hand():
    """2 x 2, regions [0, 1] and [2, 3].  Expert 4 (region 0) has 3 tokens: one on 0, two
    on 3 -> shares 2 + 1, the larger to chiplet 0 (it holds one already): the token of 0
    stays, 3's two go to 0 (1 hop) and 1 (2 hops from (1, 0); 0 is full)."""
    dp = SimpleNamespace(ddr_interval=10, cycles_per_token=1)
    regions = [[0, 1], [2, 3]]
    home = np.array([-1, -1, -1, -1, 0])
    records = [(0, 0, 4), (1, 3, 4), (2, 3, 4)]
    out, moves = gather(records, home, regions, 2, np.array([0, 0, 0, 0, 2]), dp)
    assert out == [(0, 0, 4), (1, 0, 4), (2, 1, 4)]
    assert moves == [(3, 0), (3, 1)]


def test_gather_shares_go_first_to_the_chiplets_holding_most():
    """Region [0, 1] (2 x 2 mesh).  Expert 2 has 5 tokens: 2 on chiplet 0, 3 on chiplet 1:
    shares 3 + 2, the larger to chiplet 1 (it holds more): nothing moves.  Expert 3 has one
    token, on chiplet 1, and the region's other chiplet holds none: its one share goes to 1,
    where the token is."""
    dp = SimpleNamespace(ddr_interval=10, cycles_per_token=1)
    home = np.array([-1, -1, 0, 0])
    records = [(0, 0, 2), (1, 0, 2), (2, 1, 2), (3, 1, 2), (4, 1, 2), (5, 1, 3)]
    out, moves = gather(records, home, [[0, 1], [2, 3]], 2, np.array([1, 1, 1, 1]), dp)
    assert out == records and moves == []
    # chiplet 0 holding 1 of 5 and chiplet 1 holding 4: shares 3 to chiplet 1, 2 to 0
    records = [(0, 0, 2), (1, 1, 2), (2, 1, 2), (3, 1, 2), (4, 1, 2)]
    out, moves = gather(records, home, [[0, 1], [2, 3]], 2, np.array([1, 1, 1, 1]), dp)
    assert moves == [(1, 0)] and out[4] == (4, 0, 2)


def test_spread_ties_on_what_chiplets_are_short_go_to_the_one_holding_more():
    """2 x 2 mesh.  Expert 0: 1 token on chiplet 0, 2 on 1; expert 1: 2 on 0, 1 on 1.  Both
    chiplets hold 3 and get 1 + 1 as even shares: each is short of 1, a tie.  Expert 0 (the
    lower id; same chiplets and tokens) gives its remainder to chiplet 1, holding 2 of its
    tokens; chiplet 0 is then the one short, and takes expert 1's: nothing moves."""
    records = [(0, 0, 0), (1, 1, 0), (2, 1, 0), (3, 0, 1), (4, 0, 1), (5, 1, 1)]
    assert spread(records, 4, 2) == (records, [])
    # mirrored: expert 0 with 2 on chiplet 0 and 1 on chiplet 1
    records = [(0, 0, 0), (1, 0, 0), (2, 1, 0), (3, 0, 1), (4, 1, 1), (5, 1, 1)]
    assert spread(records, 4, 2) == (records, [])


def test_all_to_all_counts_each_chiplets_bytes_in_and_out():
    """1 x 2 mesh (one link each way), 1-byte activations, 1 byte a cycle: one move costs
    one cycle and one hop's latency; a move to itself before it does not end the count."""
    s = _setup(rows=1, cols=2, act_bytes=1, bpc=1)
    assert all_to_all_cycles(s, [(0, 1)]) == (1 + 3, 1)
    assert all_to_all_cycles(s, [(1, 1), (0, 1)]) == (1 + 3, 1)
    assert all_to_all_cycles(s, [(0, 1), (1, 0), (1, 0)]) == (2 + 3, 3)


def _mesh_setup(rows, cols, ddr_interval=8):
    return hand_setup(
        rows, cols, slots=12, micro_slices=4, ddr_interval=ddr_interval, cycles_per_token=1
    )


def test_plan_of_a_ddr_bound_layer_on_2x2():
    """2 x 2, one expert of 4 micro-slices (8 DDR cycles each), 5 tokens: 3 on chiplet 0,
    2 on 1.  The whole mesh only (no tiling of 4-chiplet regions but itself): DDR 4 x 8 / 4
    = 8, compute 5 x 4 / 4 = 5, busiest link 4 x 3/4 / 2 x 2 = 3 (link_cycles 2).  Compute
    is below 3/4 of DDR (6): nothing moves; the score is 8."""
    s = _mesh_setup(2, 2)
    assert s.dp.link_cycles == 2
    records = [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 1, 0), (4, 1, 0)]
    p = plan(s, records, np.array([4]))
    assert p.shape == (2, 2) and p.regions == [[0, 1, 2, 3]] and list(p.home) == [0]
    assert p.records == records and p.moves == [] and p.a2a == 0
    assert p.scores == {(2, 2): (8, 3)}


def test_plan_of_a_balanced_layer_spreads_the_tokens():
    """As above with 6 tokens, 4 on chiplet 0 and 2 on 1: compute 6 = 3/4 of DDR exactly,
    a balanced layer: the expert's tokens are evened out, one moves 0 -> 1 (10 bytes over
    chiplet 0's 2 links: 5, 2 cycles at 4 bytes a cycle, plus one hop, 3): the score is
    8 + 2 x 5 = 18."""
    s = _mesh_setup(2, 2)
    records = [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0), (4, 1, 0), (5, 1, 0)]
    p = plan(s, records, np.array([4]))
    assert p.moves == [(0, 1)] and p.a2a == 5
    assert p.records == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 1, 0), (4, 1, 0), (5, 1, 0)]
    assert p.scores == {(2, 2): (18, 3)}
    # one token fewer on chiplet 0: compute 5 < 6, not balanced: nothing moves
    q = plan(s, records[1:], np.array([4]))
    assert q.moves == [] and q.scores == {(2, 2): (8, 3)}


def test_plan_tries_regions_of_at_least_four_chiplets():
    """2 x 4: the whole mesh, 1 x 4 rows and 2 x 2 squares are scored; 1 x 2 and 2 x 1 are
    too small.  Two experts far apart, DDR-bound: each alone in a region of its own."""
    s = _mesh_setup(2, 4)
    records = [(0, 0, 0), (1, 1, 0), (2, 3, 1), (3, 4, 1)]
    p = plan(s, records, np.array([4, 4]))
    assert set(p.scores) == {(2, 4), (1, 4), (2, 2)}
    # whole: DDR 8 x 8 / 8 = 8, compute 2 x 4 x 2 / 8 = 2, link 8 x 7/8 / 2 x 2 = 7: 8
    assert p.scores[(2, 4)] == (8, 7)
    # a given shape is the only one scored
    one = plan(s, records, np.array([4, 4]), shape=(1, 2))
    assert set(one.scores) == {(1, 2)} and one.shape == (1, 2)
    # 1 x 2 regions: each expert's 4 slices over a region's 2 channels: DDR 16; its ring
    # crosses the region's one link: 4 x 1/2 / 1 x 2 = 4
    assert one.scores[(1, 2)][1] == 4


def test_cost_model_ties_exactly():
    assert _better((100.0, 3.0), (100.0, 3.0)) is False
    assert _better((100.0, 3.0), (300.0, 3.0)) is True
    assert _better((300.0, 3.0), (300.0, 3.0)) is False


@pytest.mark.parametrize("ddr, cpt", [(10, 1), (1, 10)])
def test_assign_improves_the_greedy_placement_by_a_trade(ddr, cpt):
    """2 x 2 mesh in 1 x 2 regions ([0, 1], [2, 3]), DDR-bound experts of 3, 3, 2, 2, 2
    micro-slices (10 DDR cycles each: over a region's 2 channels 15, 15, 10, 10, 10), one
    token each, all on chiplet 0 (so ties go to region 0).  Greedy, largest first: e0 -> 0,
    e1 -> 1, e2 -> 0 (25 = 25: the tie), e3 -> 1, e4 -> 0: DDR 35 and 25.  No expert moving
    out of region 0 lowers its 35, but e0 trading places with e3 gives 30 and 30; then
    nothing lowers 30 by half a cycle: e0 and e1 in region 1, the rest in region 0.  The
    same with the roles of DDR and compute swapped (1 DDR cycle a micro-slice, 10 compute
    cycles a token): compute-bound experts, the same trade."""
    dp = SimpleNamespace(ddr_interval=ddr, cycles_per_token=cpt)
    held = np.zeros((4, 5), np.int64)
    held[0, :] = 1
    per = np.array([3, 3, 2, 2, 2])
    assert list(assign(held, per, dp, [[0, 1], [2, 3]])) == [1, 1, 0, 0, 0]


def test_assign_moves_an_expert_out_of_the_busiest_region():
    """The same regions; experts of 4, 2 and 2 micro-slices, tokens on chiplet 0 so that
    ties go to region 0, but e2's token on chiplet 2 (region 1).  Greedy: e0 -> 0 (20),
    e1 -> 1 (10 < 30), e2 -> 1 (20 = 20, its token there).  Balanced at 20 and 20: no move."""
    dp = SimpleNamespace(ddr_interval=10, cycles_per_token=1)
    held = np.zeros((4, 3), np.int64)
    held[0, 0] = held[0, 1] = held[2, 2] = 1
    assert list(assign(held, np.array([4, 2, 2]), dp, [[0, 1], [2, 3]])) == [0, 1, 1]
    # compute-bound: e0's 8 tokens x 4 slices = 32 cycles over 2 chiplets, 16, against its
    # DDR 20: the larger of the two decides; e1 and e2 (2 slices, 1 token: DDR 10) share
    # region 1 (20), e0 is alone in region 0 (20)
    held[0, 0] = 8
    assert list(assign(held, np.array([4, 2, 2]), dp, [[0, 1], [2, 3]])) == [0, 1, 1]


def test_a_moved_token_goes_to_the_nearest_chiplet_with_room_not_the_lowest():
    """2 x 4 (0 1 2 3 / 7 6 5 4).  A token on 7 ((1, 0)) with room on 6 ((1, 1), 1 hop)
    and 1 ((0, 1), 2 hops) goes to 6; a token on 1 ((0, 1)) with room on 2 ((0, 2), 1 hop)
    and 7 ((1, 0), 2 hops) goes to 2; a token on 4 ((1, 3)) with room on 0 (4 hops) and 5
    (1 hop) goes to 5."""
    pos = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 3), (1, 2), (1, 1), (1, 0)]
    for src, room, dest in [(7, {6: 1, 1: 1}, 6), (1, {2: 1, 7: 1}, 2), (4, {0: 1, 5: 1}, 5)]:
        out, moves = [(0, src, 0)], []
        _place([(0, src, 0)], [0], {c: 0 for c in range(8)} | room, pos, out, moves)
        assert out == [(0, dest, 0)] and moves == [(src, dest)], (src, room)


def test_gather_orders_an_experts_chiplets_by_the_load_placed_before_it():
    """Region [0, 1], DDR 10, one micro-slice per expert.  Expert 5 (first) has 3 tokens,
    all on chiplet 0: shares 2 (chiplet 0) + 1; its loads: chiplet 0 10 / 2 + 2 = 7,
    chiplet 1 5 + 1 = 6.  Expert 6 has one token, on chiplet 2 (outside): neither chiplet
    holds any of it, so the less loaded, chiplet 1, takes it."""
    dp = SimpleNamespace(ddr_interval=10, cycles_per_token=1)
    records = [(0, 0, 5), (1, 0, 5), (2, 0, 5), (3, 2, 6)]
    home = np.array([-1, -1, -1, -1, -1, 0, 0])
    out, moves = gather(records, home, [[0, 1], [2, 3]], 2, np.ones(7, np.int64), dp)
    assert moves == [(0, 1), (2, 1)]
    assert out == [(0, 0, 5), (1, 0, 5), (2, 1, 5), (3, 1, 6)]


def test_plan_of_an_empty_layer():
    """No token: nothing to load, compute or move; every figure 0."""
    p = plan(_mesh_setup(2, 2), [], np.array([4, 4]))
    assert p.shape == (2, 2) and p.moves == [] and p.a2a == 0 and p.records == []
    assert p.scores == {(2, 2): (0, 0)} and list(p.home) == [-1, -1]


def test_plan_of_a_given_shape_of_single_chiplets():
    """2 x 2 in 1 x 1 regions ([0], [1], [3], [2]): the expert (4 slices of 8 DDR cycles,
    3 tokens on chiplet 1, 2 on chiplet 0) goes to the region holding most of its tokens,
    chiplet 1 (the empty region before it counts nothing): DDR 32, compute 5 x 4 = 20, no
    link inside a region; its 2 tokens on chiplet 0 move over (20 bytes over 2 links:
    3 cycles, and a hop): 32 + 2 x 6 = 44."""
    s = _mesh_setup(2, 2)
    records = [(0, 1, 0), (1, 1, 0), (2, 1, 0), (3, 0, 0), (4, 0, 0)]
    p = plan(s, records, np.array([4]), shape=(1, 1))
    assert p.regions == [[0], [1], [3], [2]] and list(p.home) == [1]
    assert p.moves == [(0, 1), (0, 1)] and p.a2a == 6
    assert p.scores == {(1, 1): (44, 0)}


def test_plan_score_counts_compute():
    """A compute-bound whole mesh: 20 tokens of a 4-slice expert, all on chiplet 0: compute
    20 x 4 / 4 = 20 against DDR 8 and the busiest link 3: the score is 20.  Balanced, but
    its tokens stay: spreading evens an expert out only over the chiplets that hold it."""
    s = _mesh_setup(2, 2)
    p = plan(s, [(k, 0, 0) for k in range(20)], np.array([4]))
    assert p.moves == [] and p.a2a == 0
    assert p.scores == {(2, 2): (20, 3)}


def _held(chiplets, experts, tokens):
    """``held[c, e]`` from ``{e: (c, tokens)}``: every expert's tokens on one chiplet."""
    held = np.zeros((chiplets, experts), np.int64)
    for e, (c, t) in tokens.items():
        held[c, e] = t
    return held


def test_assign_moves_an_expert_alone_only_for_half_a_cycle():
    """Three regions of one chiplet, DDR 10 a micro-slice: two experts of 3 slices (load 30,
    work 3), one token each on chiplet 0.  e0 -> region 0 (its token), e1 -> region 1 (30 <
    60, the lower of the two empty ones).  Moving e0 alone to region 2 leaves 30 there: no
    gain of half a cycle; trading it with e1 neither: no move."""
    dp = SimpleNamespace(ddr_interval=10, cycles_per_token=1)
    held = _held(3, 2, {0: (0, 1), 1: (0, 1)})
    assert list(assign(held, np.array([3, 3]), dp, [[0], [1], [2]])) == [0, 1]


def test_assign_moves_an_expert_alone_to_a_smaller_region():
    """Regions of 4 and 2 chiplets, DDR 2 a micro-slice, 3 cycles a token-slice.  e0: 1
    slice, 1 token on chiplet 3 (load 2, work 3); e1: 2 slices, 1 token on chiplet 1 (4, 6).
    e1 first: region 0 max(1, 1.5) = 1.5 (rounded 2) < region 1 max(2, 3) = 3; e0: region 0
    max(1.5, 2.25) = 2.25 (2), region 1 max(1, 1.5) = 1.5 (2): a tie, region 0 holds its
    token.  Region 0 at 2.25; e0 alone to region 1: max(1, 1.5, 1, 1.5) = 1.5 < 2.25 - 0.5:
    it moves; then both regions at 1.5 and nothing lowers that."""
    dp = SimpleNamespace(ddr_interval=2, cycles_per_token=3)
    held = _held(6, 2, {0: (3, 1), 1: (1, 1)})
    assert list(assign(held, np.array([1, 2]), dp, [[0, 1, 2, 3], [4, 5]])) == [1, 0]


def test_assign_trades_with_expert_zero_by_hand():
    """Regions of 4 and 2 chiplets, DDR 2, 3 cycles a token-slice.  Slices 1, 3, 2, 3; e0 1
    token on chiplet 5, e1 1 on 3, e2 1 on 2, e3 3 on 0: loads 2, 6, 4, 6, work 3, 9, 6, 27.
    Greedy by the larger: e3 -> 0 (6.75 < 13.5); e1 -> 1 (4.5 < 9); e2: region 0 max(2.5,
    8.25), region 1 max(5, 7.5): both 8 rounded, its token in region 0; e0 -> 1 (6 < 9).
    DDR and compute: region 0 (2.5, 8.25), region 1 (4, 6).  Of region 0's experts, only e2
    trading with e0 gains half a cycle: region 0 (2, 7.5), region 1 (5, 7.5); then nothing
    lowers 7.5."""
    dp = SimpleNamespace(ddr_interval=2, cycles_per_token=3)
    held = _held(6, 4, {0: (5, 1), 1: (3, 1), 2: (2, 1), 3: (0, 3)})
    home = assign(held, np.array([1, 3, 2, 3]), dp, [[0, 1, 2, 3], [4, 5]])
    assert list(home) == [0, 1, 1, 0]


def test_assign_trades_for_the_ddr_time_by_hand():
    """Regions of 4 and 2 chiplets, DDR 10, 1 cycle a token-slice.  Slices 3, 3, 2, 4; e0 1
    token on chiplet 4, e1 1 on 5, e2 2 on 0, e3 2 on 1: loads 30, 30, 20, 40, work 3, 3,
    4, 8.  Greedy: e3 -> 0 (10 < 20); e0 -> 1 (15 < 17.5); e1 -> 0 (17.5 < 30); e2 -> 0
    (22.5, rounded 22, < 25).  DDR 22.5 and 15: e3 trading with e0 gives 20 and 20 (DDR
    22.5 - 2.5, 15 + 5), the one gain of half a cycle; then nothing lowers 20."""
    dp = SimpleNamespace(ddr_interval=10, cycles_per_token=1)
    held = _held(6, 4, {0: (4, 1), 1: (5, 1), 2: (0, 2), 3: (1, 2)})
    home = assign(held, np.array([3, 3, 2, 4]), dp, [[0, 1, 2, 3], [4, 5]])
    assert list(home) == [0, 0, 0, 1]


def test_assign_greedy_weighs_load_and_work_over_the_region_size():
    """Regions of 4 and 2 chiplets, DDR 3, 2 cycles a token-slice.  Slices 1, 3, 3, 2; e0 4
    tokens on chiplet 5, e1 1 on 2, e2 2 on 2, e3 1 on 0: loads 3, 9, 9, 6, work 8, 6, 12,
    4.  Largest first: e2 -> 0 (max(2.25, 3) = 3 < 6); e1: region 0 max(4.5, 4.5), region 1
    max(4.5, 3): both 4 rounded, its token in region 0; e0 -> 1 (4 < 6.5); e3: region 0
    max(6, 5.5) = 6, region 1 max(4.5, 6) = 6, its token in region 0.  Region 0 at 6,
    region 1 at 4: every move or trade leaves 6 or more."""
    dp = SimpleNamespace(ddr_interval=3, cycles_per_token=2)
    held = _held(6, 4, {0: (5, 4), 1: (2, 1), 2: (2, 2), 3: (0, 1)})
    home = assign(held, np.array([1, 3, 3, 2]), dp, [[0, 1, 2, 3], [4, 5]])
    assert list(home) == [1, 0, 0, 0]


def test_assign_takes_the_first_of_equal_trades_by_hand():
    """Regions of 4 and 2 chiplets, DDR 10, 1 cycle a token-slice, every token in region 0.
    Slices 2, 4, 3, 4; tokens 4 (chiplet 1), 2 (0), 4 (3), 4 (2): loads 20, 40, 30, 40,
    work 8, 8, 12, 16.  Greedy: e1 -> 0 (10); e3: 20 both, its tokens in region 0; e2 -> 1
    (15 < 27.5); e0: 25 both, region 0.  DDR 25 and 15: e1 or e3 trading with e2 gives
    22.5 (25 - 10 / 4, 15 + 10 / 2), the first found (e1) is taken: region 0 (22.5, 9),
    region 1 (20, 4); nothing lowers 22.5 by half a cycle."""
    dp = SimpleNamespace(ddr_interval=10, cycles_per_token=1)
    held = _held(6, 4, {0: (1, 4), 1: (0, 2), 2: (3, 4), 3: (2, 4)})
    home = assign(held, np.array([2, 4, 3, 4]), dp, [[0, 1, 2, 3], [4, 5]])
    assert list(home) == [0, 1, 0, 0]


def test_assign_improves_the_busiest_region_each_time_by_hand():
    """Regions of 4 and 2 chiplets, DDR 2, 3 cycles a token-slice.  Slices 2, 1, 4, 3; e0 2
    tokens and e1 3 on chiplet 4, e2 1 on 0, e3 2 on 2: loads 4, 2, 8, 6, work 12, 9, 12,
    18.  Greedy: e3 -> 0 (4.5); e0 -> 1 (6 < 7.5); e2 -> 0 (7.5 < 12); e1: region 0 9.75,
    region 1 10.5, both 10 rounded, its tokens in region 1.  Compute 7.5 and 10.5: region
    1 is the busiest; e1 moving to region 0 gives 9.75 (7.5 + 9 / 4).  Now region 0 is:
    e3 trading with e0 gives max(9.75 - 6 / 4, 6 + 6 / 2) = 9.  Then region 1 at 9: nothing
    lowers it by half a cycle."""
    dp = SimpleNamespace(ddr_interval=2, cycles_per_token=3)
    held = _held(6, 4, {0: (4, 2), 1: (4, 3), 2: (0, 1), 3: (2, 2)})
    home = assign(held, np.array([2, 1, 4, 3]), dp, [[0, 1, 2, 3], [4, 5]])
    assert list(home) == [0, 0, 0, 1]


def test_assign_needs_more_than_half_a_cycle_of_gain():
    """Regions of 4 and 2 chiplets, DDR 3, 2 cycles a token-slice; one slice each, e0 3
    tokens and e1 1 token on chiplet 3: loads 3, 3, work 6, 2.  e0 -> 0 (1.5 < 3); e1:
    region 0 max(1.5, 2) = 2, region 1 max(1.5, 1) = 1.5, both 2 rounded, its token in
    region 0.  Moving e1 to region 1 gives max(0.75, 1.5, 1.5, 1) = 1.5: exactly half a
    cycle below 2, not more: it stays."""
    dp = SimpleNamespace(ddr_interval=3, cycles_per_token=2)
    held = _held(6, 2, {0: (3, 3), 1: (3, 1)})
    assert list(assign(held, np.array([1, 1]), dp, [[0, 1, 2, 3], [4, 5]])) == [0, 0]


def test_assign_takes_the_best_trade_and_keeps_count_by_hand():
    """Regions [0, 1] and [2, 3], DDR 3, 2 cycles a token-slice, every token in region 1.
    Slices 2, 4, 1, 3, 2; tokens 4 (chiplet 2), 1 (3), 1 (2), 4 (3), 3 (3): loads 6, 12,
    3, 9, 6, work 16, 8, 2, 24, 12.  Greedy: e3 -> 1 (12 both, its tokens there); e0 -> 0
    (8 < 20); e1 -> 0 (12 < 16); e4 -> 1 (18 both); e2 -> 0 (13 < 19).  DDR 10.5 and 7.5,
    compute 13 and 18: region 1 is the busiest.  e3 trading with e0 gives 17, e4 with e1
    16 (max(7.5 + 3, 18 - 2, 10.5 - 3, 13 + 2)): the lower is taken.  Then compute 15 and
    16, and nothing gains half a cycle."""
    dp = SimpleNamespace(ddr_interval=3, cycles_per_token=2)
    held = _held(4, 5, {0: (2, 4), 1: (3, 1), 2: (2, 1), 3: (3, 4), 4: (3, 3)})
    home = assign(held, np.array([2, 4, 1, 3, 2]), dp, [[0, 1], [2, 3]])
    assert list(home) == [0, 1, 0, 1, 0]


def test_gather_caps_what_a_chiplet_holds_at_the_larger_share():
    """A 1 x 3 mesh, one region [0, 1, 2]; expert 0's 7 tokens: 3 on chiplet 0, 4 on
    chiplet 1: shares 3 + 2 + 2.  Chiplets 0 and 1 both hold at least the larger share (3):
    a tie, the lower-numbered gets it.  Chiplet 0 keeps its 3, chiplet 1 keeps 2 and sends
    2 to chiplet 2."""
    dp = SimpleNamespace(ddr_interval=10, cycles_per_token=1)
    records = [(k, 0, 0) for k in range(3)] + [(k, 1, 0) for k in range(3, 7)]
    out, moves = gather(records, np.array([0]), [[0, 1, 2]], 3, np.array([1]), dp)
    assert moves == [(1, 2), (1, 2)]
    assert [c for _, c, _ in out] == [0, 0, 0, 1, 1, 2, 2]


def test_gather_spreads_an_experts_loads_over_the_chiplets_it_is_on():
    """A 2 x 2 mesh as one region (0 1 / 3 2), DDR 10, 1 cycle a token-slice, one slice
    each.  Expert 0's 2 tokens on chiplet 0: shares 1 + 1, to 0 (it holds them) and 1 (the
    lowest of the rest): each loads half, 10 / 2 + 1 = 6; one token 0 -> 1.  Expert 1's
    token on chiplet 2 stays: 10 + 1 = 11.  Expert 2's 2 tokens on chiplet 3: one stays,
    the other share to the least loaded of 0 (6), 1 (6) and 2 (11): chiplet 0."""
    dp = SimpleNamespace(ddr_interval=10, cycles_per_token=1)
    records = [(0, 0, 0), (1, 0, 0), (2, 2, 1), (3, 3, 2), (4, 3, 2)]
    out, moves = gather(records, np.array([0, 0, 0]), [[0, 1, 2, 3]], 2, np.ones(3), dp)
    assert moves == [(0, 1), (3, 0)]
    assert out == [(0, 0, 0), (1, 1, 0), (2, 2, 1), (3, 3, 2), (4, 0, 2)]


def test_gather_adds_up_the_loads_of_the_experts_placed_before():
    """Region [0, 1] of a 2 x 2 mesh, DDR 2, 5 cycles a token-slice.  Expert 0 (1 slice):
    its token on chiplet 2 goes to 0 (both empty: the lower): 1 x (2 + 5) = 7 there.
    Expert 1 (2 slices): 2 tokens on chiplet 0, one each: 2 x (2 / 2 + 5) = 12 on both;
    one token 0 -> 1.  Loads 19 and 12: expert 2's token on chiplet 2 goes to chiplet 1."""
    dp = SimpleNamespace(ddr_interval=2, cycles_per_token=5)
    records = [(0, 2, 0), (1, 0, 1), (2, 0, 1), (3, 2, 2)]
    home, per = np.array([0, 0, 0]), np.array([1, 2, 2])
    out, moves = gather(records, home, [[0, 1], [2, 3]], 2, per, dp)
    assert moves == [(2, 0), (0, 1), (2, 1)]
    assert out == [(0, 0, 0), (1, 0, 1), (2, 1, 1), (3, 1, 2)]


def test_gather_counts_the_compute_of_a_share_in_cycles():
    """Region [0, 1] of a 2 x 2 mesh, DDR 2, 5 cycles a token-slice.  Expert 0 (1 slice):
    its token stays on 0: 2 + 5 = 7.  Expert 1 (2 slices): tokens on 1, 2, 1: shares 2 (to
    chiplet 1, holding 2) + 1: chiplet 1 2 x (2 / 2 + 2 x 5) = 22, chiplet 0 2 x (1 + 5) =
    12, 19 in all; the token of chiplet 2 goes to 0.  Expert 2's token on chiplet 2 goes to
    the less loaded: chiplet 0 (19 < 22)."""
    dp = SimpleNamespace(ddr_interval=2, cycles_per_token=5)
    records = [(0, 0, 0), (1, 1, 1), (2, 2, 1), (3, 1, 1), (4, 2, 2)]
    home, per = np.array([0, 0, 0]), np.array([1, 2, 2])
    out, moves = gather(records, home, [[0, 1], [2, 3]], 2, per, dp)
    assert moves == [(2, 0), (2, 0)]
    assert out == [(0, 0, 0), (1, 1, 1), (2, 0, 1), (3, 1, 1), (4, 0, 2)]


def test_spread_remainder_goes_to_the_chiplet_short_of_its_total():
    """2 x 2 mesh.  Expert 1 has 5 tokens, all on chiplet 0 (they stay); expert 0 has 1 on
    chiplet 0 and 2 on chiplet 1: 1 each and one remainder.  After the even shares chiplet 0
    holds 5 + 1 = 6 of its 6, chiplet 1 holds 1 of its 2: the remainder goes to chiplet 1,
    and nothing moves."""
    records = [(0, 0, 0), (1, 1, 0), (2, 1, 0)] + [(k, 0, 1) for k in range(3, 8)]
    assert spread(records, 4, 2) == (records, [])


def test_plan_score_counts_the_busiest_link():
    """2 x 2, DDR 1 cycle a micro-slice: one expert of 4 slices, one token on chiplet 0.
    DDR 4 x 1 / 4 = 1, compute 1 x 4 / 4 = 1, the busiest link 4 x 3/4 / 2 x 2 = 3: the
    score is 3 (balanced: compute 1 >= 3/4 of DDR; one chiplet, nothing moves)."""
    p = plan(_mesh_setup(2, 2, ddr_interval=1), [(0, 0, 0)], np.array([4]))
    assert p.moves == [] and p.scores == {(2, 2): (3, 3)}


def test_plan_stops_at_the_whole_mesh_of_an_exactly_balanced_layer():
    """2 x 4, DDR 8: one expert of 4 slices with 6 tokens on chiplet 0: DDR 4 x 8 / 8 = 4,
    compute 6 x 4 / 8 = 3 = 3/4 of DDR exactly: balanced; the busiest link 4 x 7/8 / 2 x 2
    = 3.5 is within max(DDR, compute) = 4: the whole mesh is taken, no tiling scored.  With
    DDR 7 (3.5, the link exactly as long), the same."""
    records = [(k, 0, 0) for k in range(6)]
    p = plan(_mesh_setup(2, 4), records, np.array([4]))
    assert p.shape == (2, 4) and p.scores == {(2, 4): (4, 4)}
    p = plan(_mesh_setup(2, 4, ddr_interval=7), records, np.array([4]))
    assert p.shape == (2, 4) and p.scores == {(2, 4): (4, 4)}


def test_assign_moving_an_expert_alone_moves_only_its_own_load():
    """Regions of 4 and 2 chiplets, DDR 3, 2 cycles a token-slice; e0 (1 slice) has a token
    on chiplet 3, e1 (2 slices) on chiplet 0, e2 (3 slices) is idle: loads 3 and 6, work 2
    and 4.  e1 -> 0 (1.5 < 3); e0: region 0 2.25, region 1 1.5, both 2 rounded, its token
    in region 0.  e0 alone to region 1 gives 1.5 < 2.25 - 0.5: DDR 1.5 and compute 1 in
    both regions, and nothing lowers 1.5 by half a cycle."""
    dp = SimpleNamespace(ddr_interval=3, cycles_per_token=2)
    held = _held(6, 3, {0: (3, 1), 1: (0, 1)})
    home = assign(held, np.array([1, 2, 3]), dp, [[0, 1, 2, 3], [4, 5]])
    assert list(home) == [1, 0, -1]


def test_assign_trade_lowers_the_busiest_regions_ddr_by_hand():
    """Regions of 4 and 2 chiplets, DDR 3, 2 cycles a token-slice.  Slices 1, 2, 4, 1; e0 4
    tokens on chiplet 5, e1 1 on 4, e2 1 on 2, e3 1 on 1: loads 3, 6, 12, 3, work 8, 4, 8,
    2.  Greedy: e2 -> 0 (3 < 6); e0: 4 both, its tokens in region 1; e1 -> 0 (4.5 < 6); e3:
    5 both rounded, its token in region 0.  Region 0 (5.25, 3.5), region 1 (1.5, 4): e1
    trading with e0 gives region 0 (4.5, 4.5), region 1 (3, 2); then no move or trade
    gets below 4.5 - 0.5 (e3 alone to region 1: 4.5)."""
    dp = SimpleNamespace(ddr_interval=3, cycles_per_token=2)
    held = _held(6, 4, {0: (5, 4), 1: (4, 1), 2: (2, 1), 3: (1, 1)})
    home = assign(held, np.array([1, 2, 4, 1]), dp, [[0, 1, 2, 3], [4, 5]])
    assert list(home) == [0, 1, 0, 0]
