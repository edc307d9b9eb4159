"""Exact expectations of the simulator's bounds and baselines (``fsedp.sim.baselines``) on
cases worked out by hand: the DDR and compute bounds, the link bound and FSE-DP's stream
bound (tokens left where they are) on a two-chiplet mesh, the two-stage flow shop of a
chiplet's buffer, the idle causes, the occupancy timeline and the placements."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from tiny import hand_setup

from fsedp.sim.baselines import (
    _flow_shop,
    _idle,
    _idle_arrays,
    _timeline,
    _timeline_arrays,
    bounds,
    ep_home,
    ep_layer,
    flow_shop_arrays,
    held_tokens,
    hydra_home,
    link_bound,
)


def setup(rows=1, cols=2, micro_slices=1, microslice_bytes=100, bpc=1, act_bytes=1):
    return hand_setup(
        rows, cols, act_bytes, bpc, microslice_bytes=microslice_bytes,
        micro_slices=micro_slices, ddr_interval=10, cycles_per_token=1,
    )  # fmt: skip


def test_ddr_and_compute_bounds_by_hand():
    """2 chiplets, micro-slices of 10 DDR cycles: experts with 3, 0 and 2 tokens, 2 slices
    each: 4 slices over 2 channels = 20 cycles; (3 + 2) x 2 token-slices over 2 = 5."""
    s = setup(micro_slices=2)
    counts = np.array([3, 0, 2])
    assert bounds(s, counts) == (20, 5)
    # the slice table: 1, 4 (idle: not loaded), 3 slices; 1 of them loaded ahead
    assert bounds(s, counts, np.array([1, 4, 3])) == (20, 5 + 0)  # 4 x 10 / 2; (3 + 6) / 2
    assert bounds(s, counts, np.array([1, 4, 3]), ahead=1) == (15, 5)
    # odd totals round up: 3 slices x 10 / 2 = 15; 1 token-slice / 2 -> 1
    assert bounds(s, np.array([1, 0, 0]), np.array([3, 1, 1])) == (15, 2)
    assert bounds(s, np.array([0, 0, 0])) == (0, 0)


def test_link_bound_and_stream_bound_by_hand():
    """1 x 2 mesh (2 directed links of 1 byte/cycle), one expert of one 100-byte micro-slice
    (10 DDR cycles), one token on each chiplet (1-byte activations).  DDR bound 5, compute 1.

    Tokens may move: one chiplet computes both tokens (the other's token crosses a link and
    its result comes back: 2 bytes over 2 bytes/cycle, 1 cycle) -- never above DDR: 5.
    Tokens stay (FSE-DP's stream bound): both chiplets need the micro-slice, loaded twice
    (lam x 10) or loaded once and sent over a link ((1 - lam) x 50 + lam x 5); the bound is
    the best lam's min of the two: 50 - 45 lam = 10 lam at lam = 10/11, 9.09..: 10 cycles."""
    s = setup()
    held = np.array([[1], [1]])
    assert bounds(s, held.sum(0)) == (5, 1)
    assert link_bound(s, held) == 5
    assert link_bound(s, held, tokens_move=False) == 10
    # both tokens on one chiplet: nothing needs a link
    assert link_bound(s, np.array([[2], [0]]), tokens_move=False) == 5
    # no active expert: the DDR and compute bounds (0)
    assert link_bound(s, np.array([[0], [0]])) == 0


def test_stream_bound_with_micro_slices_loaded_ahead():
    """As above, one load made before the layer: the DDR bound 0 (ceil(0 x 10 / 2)), and
    every lam gives back lam x 5: min(50 - 45 lam, 10 lam) - 5 lam, at most 50 - 50 lam and
    5 lam: 50/11 = 4.55 at lam = 10/11: 5 cycles."""
    s = setup()
    held = np.array([[1], [1]])
    assert bounds(s, held.sum(0), ahead=1) == (0, 1)
    assert link_bound(s, held, ahead=1, tokens_move=False) == 5


def test_flow_shop_by_hand():
    """Two slots; chunks (load, compute) = (4, 1), (4, 6), (2, 1); latency 1, tokens there
    at 3.  Chunk 0: load 0-4, arrives 5, computes 5-6.  Chunk 1: load 4-8, arrives 9,
    computes 9-15.  Chunk 2: its slot frees when chunk 0 is computed (6): load 8-10,
    arrives 11, computes 15-16."""
    makespan, comp, loads = _flow_shop([(4, 1), (4, 6), (2, 1)], 2, 0, 1, 3)
    assert makespan == 16
    assert comp == [(5, 6), (9, 15), (15, 16)]
    assert loads == [(0, 4), (4, 8), (8, 10)]
    # one slot: every load waits for the compute before it
    makespan, comp, loads = _flow_shop([(4, 1), (4, 6), (2, 1)], 1, 0, 1, 0)
    assert loads == [(0, 4), (6, 10), (17, 19)] and comp == [(5, 6), (11, 17), (20, 21)]
    assert makespan == 21
    # tokens late: compute waits for them
    assert _flow_shop([(1, 1)], 2, 0, 0, 7) == (8, [(7, 8)], [(0, 1)])
    assert _flow_shop([], 2, 0, 0, 7) == (7, [], [])


@pytest.mark.parametrize("compiled", [True, False])
def test_flow_shop_arrays_equal_the_loop(compiled, monkeypatch):
    """The same schedule from the compiled loop and, without numba, from the Python one."""
    from fsedp.sim import fast

    if compiled and not fast.available():
        pytest.skip("numba is not installed")
    if not compiled:
        monkeypatch.setattr(fast, "available", lambda: False)
    load, comp = np.array([4, 4, 2]), np.array([1, 6, 1])
    makespan, b, e, i, ie = flow_shop_arrays(load, comp, 2, 1, 3)
    assert makespan == 16 and list(b) == [5, 9, 15] and list(e) == [6, 15, 16]
    assert list(i) == [0, 4, 8] and list(ie) == [4, 8, 10]
    assert flow_shop_arrays(np.zeros(0, np.int64), np.zeros(0, np.int64), 2, 1, 3)[0] == 3


@pytest.mark.parametrize("arrays", [False, True])
def test_idle_causes_by_hand(arrays):
    """A unit busy 2-4 and 6-9 in a layer of 12 cycles whose work spans 1..10: fill 1,
    a gap of 2 (starved compute / full DDR), drain 1, and 12 - 10 + 1 = 3 of all-to-all."""
    acc_c, acc_d = {}, {}
    if arrays:
        starts, ends = np.array([2, 6]), np.array([4, 9])
        _idle_arrays(starts, ends, 1, 10, 12, "compute", acc_c)
        _idle_arrays(starts, ends, 1, 10, 12, "ddr", acc_d)
    else:
        _idle([(2, 4), (6, 9)], 1, 10, 12, "compute", acc_c)
        _idle([(2, 4), (6, 9)], 1, 10, 12, "ddr", acc_d)
    assert acc_c == {"all-to-all": 3, "fill": 1, "starved": 2, "drain": 1}
    assert acc_d == {"all-to-all": 3, "fill": 1, "full": 2, "drain": 1}
    empty = {"drain": 5}
    if arrays:
        _idle_arrays(np.zeros(0, np.int64), np.zeros(0, np.int64), 0, 5, 5, "compute", empty)
    else:
        _idle([], 0, 5, 5, "compute", empty)
    assert empty == {"drain": 10}  # added to what was there; no all-to-all (0)


def test_occupancy_timeline_by_hand():
    """Chiplet 0 computes 0-3 and 5-6, chiplet 1 computes 2-5: the number computing
    steps 1, 2 at 2, 1 at 3, back to 1 at 5 (one ends, one begins), 0 at 6."""
    want = [(0, 1), (2, 2), (3, 1), (5, 1), (6, 0)]
    assert _timeline([[(0, 3), (5, 6)], [(2, 5)]]) == want
    begins = [np.array([0, 5]), np.array([2])]
    ends = [np.array([3, 6]), np.array([5])]
    assert _timeline_arrays(begins, ends) == want
    assert _timeline_arrays([], []) == [(0, 0)]
    late = _timeline_arrays([np.array([4])], [np.array([7])])
    assert late == [(0, 0), (4, 1), (7, 0)] == _timeline([[(4, 7)]])


def test_placements_by_hand():
    assert ep_home(6, 4) == [0, 1, 2, 3, 0, 1]
    held = held_tokens(2, 3, [(0, 2, 4), (1, 0, 1), (0, 2, 1)])
    assert held.tolist() == [[0, 0, 5], [1, 0, 0]]
    # Hydra: load 10, compute 3 per token; predicted 4, 0, 2, 1 tokens on 2 chiplets
    s = SimpleNamespace(
        chiplets=2,
        expert_load_cycles=lambda: 10,
        expert_compute_cycles=lambda t: 3 * t,
    )
    # order by predicted tokens: e0 (4), e2 (2), e3 (1), e1 (0: half a load, no compute)
    # e0 -> 0: (10, 12); e2 -> 1: (10, 6); e3: chiplet 0 max(20, 15) = 20, chiplet 1
    # max(20, 9) = 20: the lower id, 0 -> (20, 15); e1 (5, 0): chiplet 1 max(15, 6) = 15
    assert hydra_home(s, np.array([4, 0, 2, 1])) == [0, 1, 1, 0]


def ep_setup():
    """1 x 2 mesh, 2 experts of 2 micro-slices (100 bytes, 10 DDR cycles each; an expert
    200 bytes, 20 cycles to load, 2 cycles a token to compute), a 300-byte buffer, 5
    cycles of DDR latency, 10-byte activations over 10-byte-a-cycle links of 1 cycle."""
    s = hand_setup(1, 2, act_bytes=10, bpc=10, latency=1, microslice_bytes=100,
                   micro_slices=2, ddr_interval=10, cycles_per_token=1, slots=2)  # fmt: skip
    s.sp = SimpleNamespace(experts=2)
    s.buffer_bytes, s.expert_bytes, s.ddr_access_cycles = 300, 200, 5
    s.expert_load_cycles = lambda: 20
    s.expert_compute_cycles = lambda t: 2 * t
    return s


def test_ep_layer_by_hand():
    """Expert 0 (home: chiplet 0) has 2 tokens on chiplet 1, expert 1 (home 1) one token
    there.  The all-to-all: 20 bytes over chiplet 1's one link, 2 cycles, and a hop: 3.
    Chiplet 0 streams e0's 2 micro-slices (loads 0-10, 10-20; arriving 15, 25) and computes
    each for its 2 tokens: 15-17, 25-27.  Chiplet 1 likewise for e1's 1 token: 15-16,
    25-26.  The layer: 27 + the results' way back, 3: 30 cycles."""
    r = ep_layer(ep_setup(), [(0, 1, 0), (0, 1, 0), (0, 1, 1)], ep_home(2, 2))
    assert (r.strategy, r.cycles, r.bound, r.ddr_cycles, r.compute_cycles) == ("EP", 30, 20, 20, 3)
    assert r.busy == [4, 2] and r.decisions == 2 and r.ddr_per_chiplet == [200, 200]
    assert (r.ddr_bytes, r.d2d_bytes, r.peak_weight_bytes, r.peak_token_bytes) == (
        400, 40, 200, 40,
    )  # fmt: skip
    assert (r.link_bound, r.stream_bound) == (20, 0)
    assert r.timeline == [(0, 0), (15, 2), (16, 1), (17, 0), (25, 2), (26, 1), (27, 0)]
    assert r.idle == {
        "ddr": {"all-to-all": 6, "drain": 14},
        "compute": {"all-to-all": 12, "fill": 24, "starved": 17, "drain": 1},
    }


def test_ep_paper_loads_a_whole_expert_first():
    """The paper's EP: one whole expert in the buffer (300 bytes hold one of 200): chiplet 0
    loads e0 (0-20, arriving 25) and computes its 2 tokens on both micro-slices, 4 cycles:
    25-29; the layer 29 + 3 = 32."""
    r = ep_layer(ep_setup(), [(0, 1, 0), (0, 1, 0), (0, 1, 1)], ep_home(2, 2), "EP-paper", True)
    assert (r.strategy, r.cycles, r.busy, r.peak_weight_bytes) == ("EP-paper", 32, [4, 2], 200)


def test_johnsons_order_on_a_chiplet():
    """Chiplet 0 holds e0 (20 tokens: compute 40 > load 20) and e2 (2 tokens: 4 < 20):
    Johnson's rule runs the compute-heavy one first when its load is shorter -- e0 first,
    so e2's load overlaps e0's long compute."""
    s = ep_setup()
    s.sp = SimpleNamespace(experts=3)
    recs = [(0, 0, 0)] * 20 + [(0, 0, 2)] * 2
    r = ep_layer(s, recs, [0, 1, 0])
    # e0: loads 0-10, 10-20 (arrive 15, 25), computes 15-35, 35-55 (20 cycles each);
    # e2: loads 20-30, then a slot frees at 35: 35-45 (arrive 35, 50): computes 55-57, 57-59
    assert r.cycles == 59 and r.busy == [44, 0]


def test_link_bound_with_two_micro_slices_and_heavy_tokens_by_hand():
    """As above with 2 micro-slices for the expert (DDR 2 x 10 / 2 = 10) and 50-byte
    activations (a token and its result over a link: 100 bytes over 2 bytes a cycle, 50).

    Tokens may move: one chiplet computes both, loading the expert once (lam x 10) or the
    other chiplet's token crosses ((1 - lam) x 50): at best 50 - 40 lam, or both chiplets
    load it (20 lam); the larger of the minima is at lam = 5/6: 16.7 -> 17 cycles, above
    DDR.  Tokens stay: load once and send both slices over the link (2 x 50 = 100 per
    lam's other side: 100 - 90 lam) or load twice (20 lam): lam = 10/11, 18.2 -> 19."""
    s = setup(act_bytes=50)
    held = np.array([[1], [1]])
    slices = np.array([2])
    assert bounds(s, held.sum(0), slices) == (10, 2)
    assert link_bound(s, held, slices) == 17
    assert link_bound(s, held, slices, tokens_move=False) == 19


def test_compute_bound_counts_the_cycles_of_a_token():
    """2 chiplets, one micro-slice per expert, 3 cycles a token-slice: experts with 3, 0 and
    2 tokens: (3 + 2) x 3 = 15 cycles over 2 chiplets, 7.5: 8; DDR 2 x 10 / 2 = 10."""
    s = hand_setup(1, 2, micro_slices=1, ddr_interval=10, cycles_per_token=3)
    assert bounds(s, np.array([3, 0, 2])) == (10, 8)


def test_link_bound_passes_the_slice_table_and_loads_ahead_to_the_ddr_bound():
    """Both tokens of an expert of 2 micro-slices on chiplet 0: no link is needed, the bound
    is the DDR bound, 2 x 10 / 2 = 10 (compute 2 x 2 / 2 = 2); with one slice loaded ahead,
    1 x 10 / 2 = 5."""
    s = setup()
    held, slices = np.array([[2], [0]]), np.array([2])
    assert link_bound(s, held, slices) == 10
    assert link_bound(s, held, slices, ahead=1) == 5


def test_link_bound_sums_each_active_experts_best_choice():
    """1 x 2 mesh as above, tokens stay.  Expert 0 has a token on each chiplet: both need its
    slice, min(50 - 45 lam, 10 lam); expert 1 has one token, on chiplet 0: one load there,
    5 lam; expert 2 is idle and counts nothing.  DDR 2 x 10 / 2 = 10, compute 2.  The sum
    min(50 - 45 lam, 10 lam) + 5 lam is largest where 50 - 45 lam = 10 lam, lam = 10/11:
    150/11 = 13.6: 14 cycles."""
    s = setup()
    assert link_bound(s, np.array([[1, 1, 0], [1, 0, 0]]), tokens_move=False) == 14


def test_link_bound_moves_the_tokens_off_the_lighter_chiplet():
    """1 x 2 mesh, one expert of one micro-slice (DDR 5, compute 2), 1 token on chiplet 0
    and 3 on chiplet 1, 20-byte activations: a token and its result cost 40 bytes over 2
    bytes a cycle, 20.  Compute on chiplet 1 only: one load and the one token of chiplet 0
    moved (5 lam + 20 (1 - lam)); or both chiplets compute, loading twice (10 lam) or once
    and the slice over a link (5 lam + 50 (1 - lam)).  max over lam of min(20 - 15 lam,
    10 lam): lam = 4/5, 8 cycles."""
    s = setup(act_bytes=20)
    assert link_bound(s, np.array([[1], [3]])) == 8
    assert link_bound(s, np.array([[3], [1]])) == 8  # the same by symmetry


def test_link_bound_is_at_least_the_compute_bound():
    """As the stream bound above (10 cycles for one token on each chiplet), with 12 tokens
    on each chiplet: compute 24 / 2 = 12 cycles exceeds what DDR and links give."""
    s = setup()
    assert link_bound(s, np.array([[12], [12]]), tokens_move=False) == 12


def test_link_bound_searches_when_the_ring_of_every_slice_exceeds_the_bound():
    """1 x 2 mesh, tokens stay, one token on each chiplet, an expert of 2 micro-slices of
    20 bytes (10 cycles over the 2 links each): DDR 2 x 10 / 2 = 10; the ring of both
    slices 2 x 10 = 20 > 10, so the search runs: load once (10 lam + 20 (1 - lam)) or on
    both chiplets (20 lam): lam = 2/3, 40/3 = 13.3: 14 cycles."""
    s = setup(microslice_bytes=20)
    held = np.array([[1], [1]])
    assert link_bound(s, held, np.array([2]), tokens_move=False) == 14


def test_link_bound_with_slow_links_by_hand():
    """1 x 2 mesh, a quarter of a byte a link cycle (half a byte a cycle over both links),
    tokens stay, one token on each chiplet, one micro-slice of 5 bytes: 10 cycles over the
    links, above DDR's 5.  min(5 lam + 10 (1 - lam), 10 lam) is largest at lam = 2/3:
    6.7: 7 cycles."""
    s = setup(microslice_bytes=5, bpc=0.25)
    assert link_bound(s, np.array([[1], [1]]), tokens_move=False) == 7


def test_link_bound_rounding_margin_by_hand():
    """The bound is rounded up to whole cycles after taking a millionth of it (at least a
    millionth of a cycle) off, and is never below the DDR and compute bounds.

    1 x 2 mesh, tokens stay, one token on each chiplet, DDR 10 000 000 cycles a micro-slice
    (D = 5 000 000 over both channels) and a micro-slice of 10 000 004 bytes (L =
    5 000 002 cycles over both links): the best lam gives 2 D L / (D + L) = D + 1 -
    1 / (D + 1), just under 5 000 001; less its millionth (5 cycles) that is below DDR's
    5 000 000, which is the bound."""
    big = setup(microslice_bytes=10_000_004)
    big.dp = big.dp.__class__(rows=1, cols=2, micro_slices=1, ddr_interval=10_000_000)
    assert link_bound(big, np.array([[1], [1]]), tokens_move=False) == 5_000_000
    # DDR 2 cycles a slice (D = 1) and L = 2 000 006 / 2 000 000 = 1.000003 cycles: the best
    # lam gives 2 L / (1 + L) = 1.0000015, less a millionth of a cycle still above 1: 2
    small = setup(microslice_bytes=2_000_006, bpc=1_000_000)
    small.dp = small.dp.__class__(rows=1, cols=2, micro_slices=1, ddr_interval=2)
    assert link_bound(small, np.array([[1], [1]]), tokens_move=False) == 2


def test_flow_shop_arrays_are_integer_arrays():
    """The schedule of ``test_flow_shop_by_hand`` comes back as integer arrays, compiled or
    not: whole cycles, written as such."""
    from fsedp.sim import fast

    load, comp = np.array([4, 4, 2]), np.array([1, 6, 1])
    runs = [flow_shop_arrays(load, comp, 2, 1, 3)]
    real = fast.available
    try:
        fast.available = lambda: False
        runs.append(flow_shop_arrays(load, comp, 2, 1, 3))
    finally:
        fast.available = real
    for _, b, e, i, ie in runs:
        assert json.dumps([b.tolist(), e.tolist(), i.tolist(), ie.tolist()]) == (
            "[[5, 9, 15], [6, 15, 16], [0, 4, 8], [4, 8, 10]]"
        )


@pytest.mark.parametrize("arrays", [False, True])
def test_idle_causes_of_three_intervals_by_hand(arrays):
    """Busy 2-4, 5-7 and 9-10 in a layer of 14 cycles whose work spans 1..12: fill 1, gaps
    of 1 and 2 (3), drain 12 - 10 = 2, all-to-all 1 + 14 - 12 = 3.  With no interval, a
    span of 2..5 in 6 cycles: drain 5 - 2 = 3, all-to-all 2 + 6 - 5 = 3."""
    acc, empty = {}, {}
    if arrays:
        _idle_arrays(np.array([2, 5, 9]), np.array([4, 7, 10]), 1, 12, 14, "compute", acc)
        _idle_arrays(np.zeros(0, np.int64), np.zeros(0, np.int64), 2, 5, 6, "ddr", empty)
    else:
        _idle([(2, 4), (5, 7), (9, 10)], 1, 12, 14, "compute", acc)
        _idle([], 2, 5, 6, "ddr", empty)
    assert acc == {"all-to-all": 3, "fill": 1, "starved": 3, "drain": 2}
    assert empty == {"all-to-all": 3, "drain": 3}


def test_occupancy_timeline_is_whole_numbers():
    """The timeline of ``test_occupancy_timeline_by_hand`` written as JSON: whole cycles and
    whole numbers of chiplets."""
    begins = [np.array([0, 5]), np.array([2])]
    ends = [np.array([3, 6]), np.array([5])]
    assert json.dumps(_timeline_arrays(begins, ends)) == "[[0, 1], [2, 2], [3, 1], [5, 1], [6, 0]]"


def _lpt(load, compute_per_token):
    return SimpleNamespace(
        chiplets=2,
        expert_load_cycles=lambda: load,
        expert_compute_cycles=lambda t: compute_per_token * max(1, t),
    )


def test_hydra_places_the_busiest_first_and_unseen_experts_as_half_a_load():
    """Load 9, compute 5 a token (at least one token's worth, as the setup's); predicted 0,
    0, 0, 4, 4 tokens on 2 chiplets.  By tokens: e3, e4, then e0, e1, e2 (unseen: half a
    load, 9 // 2 = 4, no compute).  e3 (9, 20) -> 0; e4: chiplet 0 max(18, 40), chiplet 1
    max(9, 20): 1; e0: both 20 -> 0 (13, 20); e1: chiplet 0 max(17, 20) = 20 = chiplet 1's
    -> 0 (17, 20); e2: chiplet 0 max(21, 20) = 21 > 20: 1."""
    assert hydra_home(_lpt(9, 5), np.array([0, 0, 0, 4, 4])) == [0, 0, 1, 0, 1]


def test_hydra_balances_the_larger_of_load_and_compute():
    """Load 9, compute 5 a token; predicted 3, 1, 1.  e0 (9, 15) -> 0; e1 (9, 5): chiplet
    0 max(18, 20) = 20, chiplet 1 9: 1; e2: chiplet 0 20, chiplet 1 max(18, 10) = 18: 1."""
    assert hydra_home(_lpt(9, 5), np.array([3, 1, 1])) == [0, 1, 1]
    # predicted 3 each (9, 15): e0 -> 0, e1 -> 1, e2: 30 both -> 0 (18, 30); e3: chiplet 0
    # max(27, 45), chiplet 1 max(18, 30) = 30: 1
    assert hydra_home(_lpt(9, 5), np.array([3, 3, 3, 3])) == [0, 1, 0, 1]
    # load 9, compute 4 a token, predicted 3, 2, 2, 2, 2: e0 (9, 12) -> 0; e1 (9, 8) -> 1;
    # e2: chiplet 0 max(18, 20), chiplet 1 max(18, 16) = 18: 1 (18, 16); e3: chiplet 0 20,
    # chiplet 1 max(27, 24) = 27: 0 (18, 20); e4: chiplet 0 max(27, 28) = 28, chiplet 1
    # max(27, 24) = 27: 1
    assert hydra_home(_lpt(9, 4), np.array([3, 2, 2, 2, 2])) == [0, 1, 1, 0, 1]


def test_hydra_halves_an_odd_load_to_whole_cycles():
    """Load 9, compute 1 a token; predicted 1, 0, 0, 0: e0 (9, 1) -> 0; the unseen ones
    (4, 0): e1: chiplet 0 13, chiplet 1 4: 1; e2: 13 against 8: 1; e3: 13 against 12: 1.
    (Half of 9 as 4.5 would tie e3 at 13.5 against 13: chiplet 0.)"""
    assert hydra_home(_lpt(9, 1), np.array([1, 0, 0, 0])) == [0, 1, 1, 1]


def _ep(buffer_bytes=200, experts=3, cycles_per_token=1):
    s = ep_setup()
    if cycles_per_token != 1:
        s.dp = s.dp.__class__(
            rows=1, cols=2, micro_slices=2, ddr_interval=10, cycles_per_token=cycles_per_token
        )
        s.expert_compute_cycles = lambda t: 2 * cycles_per_token * t
    s.sp = SimpleNamespace(experts=experts)
    s.buffer_bytes = buffer_bytes
    return s


def test_johnsons_order_keeps_compute_heavy_experts_of_equal_load_in_id_order():
    """Two slots (200 bytes of 100-byte micro-slices).  Chiplet 0 holds e0 (15 tokens:
    compute 30 > load 20) and e2 (11 tokens: 22 > 20); equal loads keep e0 first.  Chunks
    (10 to load, 5 latency) computing 15, 15, 11, 11: loads 0-10, 10-20 (arrive 15, 25),
    computes 15-30, 30-45; chunk 2's slot frees at 30: load 30-40, arrive 45, compute 45-56;
    chunk 3's at 45: load 45-55, arrive 60: compute 60-71, starved 56-60.  No token moves:
    71 cycles.  Compute 26 x 2 / 2 = 26 above DDR 2 x 2 x 10 / 2 = 20: every bound 26."""
    recs = [(0, 0, 0)] * 15 + [(0, 0, 2)] * 11
    r = ep_layer(_ep(), recs, [0, 1, 0])
    assert r.cycles == 71 and r.busy == [52, 0]
    # one chunk ends where the next begins (30, 45): the level stays 1 there
    assert r.timeline == [(0, 0), (15, 1), (30, 1), (45, 1), (56, 0), (60, 1), (71, 0)]
    assert (r.bound, r.compute_cycles, r.link_bound) == (26, 26, 26)


def test_johnsons_order_runs_load_heavy_experts_by_falling_compute():
    """Two slots; chiplet 0 holds e0 (8 tokens: compute 16 < load 20) and e2 (3 tokens: 6):
    the longer compute first.  Chunks computing 8, 8, 3, 3: 15-23, 25-33; chunk 2's slot
    frees at 23: load 23-33, arrive 38, compute 38-41; chunk 3's at 33: load 33-43, arrive
    48, compute 48-51: 51 cycles (e2 first would take 53).  Two slots of 100 bytes held."""
    recs = [(0, 0, 0)] * 8 + [(0, 0, 2)] * 3
    r = ep_layer(_ep(), recs, [0, 1, 0])
    assert r.cycles == 51 and r.busy == [22, 0] and r.peak_weight_bytes == 200
    assert r.timeline == [(0, 0), (15, 1), (23, 0), (25, 1), (33, 0), (38, 1), (41, 0),
                          (48, 1), (51, 0)]  # fmt: skip


def test_an_expert_whose_compute_equals_its_load_runs_once():
    """e0 with 10 tokens on chiplet 0: compute 20 = load 20.  Three slots: loads 0-10,
    10-20 (arrive 15, 25), computes 15-25, 25-35: 35 cycles, 20 busy."""
    r = ep_layer(_ep(300, 2), [(0, 0, 0)] * 10, [0, 1])
    assert r.cycles == 35 and r.busy == [20, 0]


def test_ep_paper_with_room_for_one_expert_waits_for_its_compute():
    """The paper's EP, 300 bytes of buffer: one expert of 200 bytes at a time.  Chiplet 0
    holds e0 (2 tokens, compute 4) and e2 (1 token, 2), both load-heavy: e0 first, loaded
    0-20, arriving 25, computed 25-29; e2's load waits for that: 29-49, arriving 54,
    computed 54-56.  One expert held: 200 bytes."""
    recs = [(0, 0, 0), (0, 0, 0), (0, 0, 2)]
    r = ep_layer(_ep(300), recs, [0, 1, 0], "EP-paper", True)
    assert r.cycles == 56 and r.busy == [6, 0] and r.peak_weight_bytes == 200


def test_ep_computes_a_chunk_for_the_cycles_of_its_tokens():
    """2 cycles a token-slice: e0's 3 tokens on chiplet 0 take 6 cycles a micro-slice.
    Loads 0-10, 10-20 (arrive 15, 25): computes 15-21, 25-31: 31 cycles, 12 busy; the
    compute bound 3 x 2 x 2 / 2 = 6."""
    r = ep_layer(_ep(300, 2, cycles_per_token=2), [(0, 0, 0)] * 3, [0, 1])
    assert r.cycles == 31 and r.busy == [12, 0] and r.compute_cycles == 6
