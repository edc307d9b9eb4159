"""Exact expectations of the simulator's bounds and baselines (``fsedp.sim.baselines``) on
cases worked out by hand: the DDR and compute bounds, the link bound and FSE-DP's stream
bound (tokens left where they are) on a two-chiplet mesh, the two-stage flow shop of a
chiplet's buffer, the idle causes, the occupancy timeline and the placements."""

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
