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

from fsedp.params import DatapathParams
from fsedp.sim.regions import (
    _better,
    _min_in_degree,
    _place,
    all_to_all_cycles,
    assign,
    gather,
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
    dp = DatapathParams(rows=rows, cols=cols)
    return SimpleNamespace(
        chiplets=rows * cols,
        dp=dp,
        act_bytes=act_bytes,
        link_bytes_per_cycle=bpc,
        link_latency_cycles=latency,
    )


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
