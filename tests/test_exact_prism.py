"""MoE-Prism (``sw/policies/prism.py``) pinned by hand: the objective, the greedy start, the
annealing's Metropolis steps (the random draws shown), the gate neurons' centrality, the
stored partition's every refusal word for word, the proxy and oracle selection, and the
linear gate; each case 2-6 neurons, 1-3 experts, a few tokens, worked out in the comments."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from test_lm import random_model

from fsedp.errors import InputError
from fsedp.lm.config import LMConfig
from fsedp.sw.policies.prism import (
    GATE_TIE,
    LinearGate,
    LinearGateHook,
    Partition,
    SubExpertHook,
    _cost_from_sq,
    _short,
    anneal,
    contiguous_groups,
    gate_neurons,
    greedy_partition,
    group_norms,
    linear_gate_init,
    linear_gate_select,
    partition_cost,
    profile_activations,
    refactor,
)

SILU1 = 1 / (1 + math.exp(-1))  # silu(1) = 0.7310585786
SILU2 = 2 / (1 + math.exp(-2))  # silu(2) = 1.7615941560

# ---------------------------------------------------------------- groups, norms, cost


def test_contiguous_groups():
    """neuron j -> j S // F: F 6, S 3 -> [0, 0, 1, 1, 2, 2]; F 5, S 2 -> 0, 2, 4, 6, 8 // 5."""
    assert contiguous_groups(6, 3).tolist() == [0, 0, 1, 1, 2, 2]
    assert contiguous_groups(4, 2).tolist() == [0, 0, 1, 1]
    assert contiguous_groups(5, 2).tolist() == [0, 0, 0, 1, 1]
    assert contiguous_groups(4, 1).tolist() == [0, 0, 0, 0]


ACT = np.array([[3.0, 4.0, 1.0, 0.0], [0.0, 0.0, 2.0, 0.0]])


def test_group_norms_by_hand():
    """groups [0, 0, 1, 1]: token 0 sqrt(9 + 16) = 5 and 1; token 1: 0 and 2.
    groups [0, 1, 0, 1]: token 0 sqrt(9 + 1) and 4; token 1: 2 and 0.  A third, empty group
    has norm 0."""
    assert group_norms(ACT, np.array([0, 0, 1, 1]), 2).tolist() == [[5, 1], [0, 2]]
    n = group_norms(ACT, np.array([0, 1, 0, 1]), 2)
    assert n.tolist() == [[math.sqrt(10), 4], [2, 0]]
    n = group_norms(ACT, np.array([0, 0, 1, 1]), 3)
    assert n.shape == (2, 3) and n[:, 2].tolist() == [0, 0]


def test_partition_cost_sums_the_s_minus_k_smallest_norms():
    """norms [[5, 1], [0, 2]]: K 1 drops the smaller of each: 1 + 0 = 1; K 0 drops all:
    5 + 1 + 0 + 2 = 8; K 2 (= S) and K 3 (> S) drop nothing: 0."""
    a = np.array([0, 0, 1, 1])
    assert partition_cost(ACT, a, 2, 1) == 1.0
    assert partition_cost(ACT, a, 2, 0) == 8.0
    assert partition_cost(ACT, a, 2, 2) == 0.0
    assert partition_cost(ACT, a, 2, 3) == 0.0
    assert type(partition_cost(ACT, a, 2, 1)) is float
    # three groups [0, 1, 2, 2], K 1: token 0 norms 3, 4, 1 -> 3 + 1 = 4; token 1: 0, 0, 2 -> 0
    assert partition_cost(ACT, np.array([0, 1, 2, 2]), 3, 1) == 4.0


def test_cost_from_squares():
    """squared norms [[25, 1]]: sqrt -> [5, 1]; K 1 -> 1.0; K >= S -> 0.0 exactly."""
    sq = np.array([[25.0, 1.0]])
    assert _cost_from_sq(sq, 1) == 1.0
    assert _cost_from_sq(sq, 2) == 0.0 and type(_cost_from_sq(sq, 2)) is float


# ---------------------------------------------------------------- greedy start


def test_greedy_fills_the_lightest_group_with_room():
    """impact = sum of |act| over tokens: [[4, -3, 2, 1]] + [[0, 0, 0, 0]] -> [4, 3, 2, 1];
    S 2, room 2 each.  neuron 0 -> group 0 (loads [4, 0]); 1 -> group 1 ([4, 3]); 2 ->
    group 1 (3 < 4: [4, 5]); 3: group 0 is heavier but group 1 is full -> group 0."""
    a = greedy_partition(np.array([[4.0, -3, 2, 1], [0, 0, 0, 0]]), 2)
    assert a.tolist() == [0, 1, 1, 0]
    assert a.dtype == np.int64


def test_greedy_order_by_descending_impact_and_ties():
    """impact [1, 3, 2, 4] (neuron 3 first): 3 -> 0, 1 -> 1, 2 -> 1 (3 < 4), 0 -> 0 (group
    1 full).  All impacts equal: neurons in index order, load ties to the lower group:
    0 -> 0, 1 -> 1, 2 -> 0, 3 -> 1."""
    assert greedy_partition(np.array([[1.0, 3, 2, 4]]), 2).tolist() == [0, 1, 1, 0]
    assert greedy_partition(np.array([[1.0, 1, 1, 1]]), 2).tolist() == [0, 1, 0, 1]
    # S 1: everything in group 0; S = F: one neuron each, heaviest first to the lowest group
    assert greedy_partition(np.array([[1.0, 3, 2]]), 1).tolist() == [0, 0, 0]
    assert greedy_partition(np.array([[1.0, 3, 2]]), 3).tolist() == [2, 0, 1]


def test_greedy_refuses_unequal_groups():
    with pytest.raises(ValueError) as e:
        greedy_partition(np.ones((2, 5)), 2)
    assert str(e.value) == "5 neurons do not split into 2 equal sub-experts"


# ---------------------------------------------------------------- annealing

# squares of the rows: [9, 1, 0, 4], [0, 4, 1, 0], [1, 0, 4, 1].  K 1 of S 2:
#   {0 1 | 2 3}: token norms (sqrt 10, 2), (2, 1), (1, sqrt 5) -> 2 + 1 + 1 = 4
#   {0 2 | 1 3}: (3, sqrt 5), (1, 2), (sqrt 5, 1) -> sqrt 5 + 1 + 1 = 4.2361
#   {0 3 | 1 2}: (sqrt 13, 1), (0, sqrt 5), (sqrt 2, 2) -> 1 + 0 + sqrt 2 = 2.4142
SA = np.array([[3.0, 1, 0, 2], [0, 2, 1, 0], [1, 0, 2, 1]])
START = np.array([0, 0, 1, 1])
WORSE = math.sqrt(5) + 2 - 4  # 0.2361, the step {0 1 | 2 3} -> {0 2 | 1 3}


def test_anneal_no_proposals_keeps_the_start():
    best, (start, end) = anneal(SA, START, 2, 1, iters=0)
    assert best.tolist() == [0, 0, 1, 1] and (start, end) == (4.0, 4.0)
    assert best is not START


def test_anneal_takes_a_better_swap():
    """seed 6, default t0 0.01 (temperature 0.01 x 4 = 0.04): draws (1, 2) -> [0, 1, 0, 1]
    = {0 2 | 1 3}, worse by 0.2361: p = exp(-0.2361 / 0.04) = 0.0027 < u 0.3433: refused.
    (3, 1) -> [0, 1, 1, 0] = {0 3 | 1 2}: 2.4142, accepted, the best.  (2, 1) are then one
    group: skipped."""
    r = np.random.default_rng(6)
    assert r.integers(0, 4, 2).tolist() == [1, 2]
    u = float(r.random())
    assert round(u, 4) == 0.3433 and math.exp(-WORSE / 0.04) < u
    assert r.integers(0, 4, 2).tolist() == [3, 1]
    assert r.integers(0, 4, 2).tolist() == [2, 1]
    best, costs = anneal(SA, START, 2, 1, iters=3, seed=6)
    assert best.tolist() == [0, 1, 1, 0]
    assert costs == (4.0, pytest.approx(1 + math.sqrt(2), abs=1e-12))


def test_anneal_metropolis_accepts_a_worse_step_when_hot():
    """seed 8: draws (2, 1), then u = 0.98728 (a worse step consumes a uniform), then
    (0, 1), (2, 3).  Start cost 4, temperature t0 x 4.
    Hot (t0 5, T = 20): (2, 1) -> {0 2 | 1 3}, 4.2361 worse by 0.2361: p = exp(-0.2361/20)
    = 0.98827 > u: accepted.  (0, 1) now in groups 0, 1 -> [1, 0, 0, 1] = {1 2 | 0 3}:
    2.4142 < 4.2361 accepted, the best.  (2, 3) -> {1 3 | 0 2}, worse, accepted or not the
    best stays.  Cold (t0 4, T = 16): p = exp(-0.2361/16) = 0.98535 < u: refused; (0, 1)
    and (2, 3) are then within one group: skipped; the start is returned.  (The threshold
    is T = 0.2361 / -ln(0.98728) = 18.4, so the temperature is t0 times the start cost:
    t0 alone would refuse at 5 too.)  The default t0 0.01 refuses as the cold one."""
    r = np.random.default_rng(8)
    assert r.integers(0, 4, 2).tolist() == [2, 1]
    u = float(r.random())
    assert round(u, 5) == 0.98728
    assert math.exp(-WORSE / 20) > u > math.exp(-WORSE / 16)
    best, costs = anneal(SA, START, 2, 1, t0=5.0, iters=3, seed=8)
    assert best.tolist() == [1, 0, 0, 1]
    assert costs == (4.0, pytest.approx(1 + math.sqrt(2), abs=1e-12))
    best, costs = anneal(SA, START, 2, 1, t0=4.0, iters=3, seed=8)
    assert best.tolist() == [0, 0, 1, 1] and costs == (4.0, 4.0)
    d = anneal(SA, START, 2, 1, iters=3, seed=8)
    e = anneal(SA, START, 2, 1, t0=0.01, cooling=0.999, iters=3, seed=8)
    assert d[0].tolist() == e[0].tolist() == [0, 0, 1, 1] and d[1] == e[1] == (4.0, 4.0)


def test_anneal_cooling_and_strict_best():
    """seed 190, t0 5 (T = 20 at the start, times cooling per proposal that is not skipped):
    1. (1, 2) -> {0 2 | 1 3} worse by 0.2361, u 0.0831 < exp(-0.2361/20): accepted.
    2. (0, 3) -> [1, 1, 0, 0]: {2 3 | 0 1}, cost 4 again (<= 4.2361: accepted), not below
       the best 4: the best stays the start [0, 0, 1, 1] (a relabelled equal partition is
       not kept).
    3. (1, 2) -> [1, 0, 1, 0], worse by 0.2361, u 0.5887.  cooling 0.999: T = 20 x 0.999^2
       = 19.96, p = 0.98824: accepted; cooling 0.1: T = 20 x 0.01 = 0.2, p = exp(-1.18)
       = 0.3072: refused.
    4. (1, 3): after 0.999 in one group (skipped); after 0.1 the state [1, 1, 0, 0] swaps to
       [1, 0, 0, 1] = {1 2 | 0 3}, 2.4142: the new best."""
    r = np.random.default_rng(190)
    assert r.integers(0, 4, 2).tolist() == [1, 2]
    assert round(float(r.random()), 4) == 0.0831
    assert r.integers(0, 4, 2).tolist() == [0, 3]
    assert r.integers(0, 4, 2).tolist() == [1, 2]
    u = float(r.random())
    assert round(u, 4) == 0.5887
    assert math.exp(-WORSE / (20 * 0.999**2)) > u > math.exp(-WORSE / 0.2)
    assert r.integers(0, 4, 2).tolist() == [1, 3]
    best, costs = anneal(SA, START, 2, 1, t0=5.0, cooling=0.999, iters=4, seed=190)
    assert best.tolist() == [0, 0, 1, 1] and costs == (4.0, 4.0)
    best, costs = anneal(SA, START, 2, 1, t0=5.0, cooling=0.1, iters=4, seed=190)
    assert best.tolist() == [1, 0, 0, 1]
    assert costs[1] == pytest.approx(1 + math.sqrt(2), abs=1e-12)


def test_anneal_cools_only_on_swaps_proposed():
    """seed 61, t0 5, cooling 0.1: the draws (1, 1), (3, 3) pick two neurons of one group:
    no swap is proposed and the temperature stays 20 (t0 x the initial cost 4).  Then (1, 2)
    is worse by 0.2361 with u 0.7092: p = exp(-0.2361 / 20) = 0.988 > u, accepted (cooled
    on every draw, T would be 0.2 and p 0.307 < u: refused); (0, 1) then reaches
    {1 2 | 0 3}, of cost 1 + sqrt 2."""
    best, costs = anneal(SA, START, 2, 1, t0=5.0, cooling=0.1, iters=4, seed=61)
    assert best.tolist() == [1, 0, 0, 1] and costs == (4.0, pytest.approx(1 + 2**0.5))


def test_anneal_does_not_change_its_input():
    start = START.copy()
    anneal(SA, start, 2, 1, t0=5.0, iters=3, seed=8)
    assert start.tolist() == [0, 0, 1, 1]


# ---------------------------------------------------------------- gate neurons

# 5 tokens, 6 neurons, top_p 1/3 -> m = round(2) = 2 active neurons per token:
#   t0 {1, 2}, t1 {1, 4}, t2 {4, 5}, t3 {0, 1}, t4 {3, 4}
# co-activations (off the diagonal): C01 = C12 = C14 = C45 = C34 = 1.
GA = np.array(
    [
        [0.1, 5, 4, 0.2, 0.3, 0.4],
        [0.1, 5, 0.2, 0.3, 4, 0.4],
        [0.1, 0.2, 0.3, 0.4, 5, 4],
        [5, 4, 0.1, 0.2, 0.3, 0.4],
        [0.1, 0.2, 0.3, 5, -4, 0.4],
    ]
)


def test_gate_neurons_by_centrality_within_the_group():
    """Groups {0, 1, 2} and {3, 4, 5}.  Within group 0: n0 C01 + C02 = 1, n1 C01 + C12 = 2,
    n2 1 -> [1, 0, 2] (tie 0/2 by index); group 1: n3 C34 + C35 = 1, n4 C34 + C45 = 2,
    n5 1 -> [4, 3, 5] (|-4| counts as 4)."""
    g = gate_neurons(GA, np.array([0, 0, 0, 1, 1, 1]), 2, 2, 1 / 3)
    assert g.tolist() == [[1, 0], [4, 3]]
    assert g.dtype == np.int64 and g.shape == (2, 2)
    assert gate_neurons(GA, np.array([0, 0, 0, 1, 1, 1]), 2, 1, 1 / 3).tolist() == [[1], [4]]


def test_gate_neurons_ignore_other_groups_and_the_diagonal():
    """Groups {0, 2, 3} and {1, 4, 5}.  Group 0: n0 C02 + C03 = 0, n2 C20 + C23 = 0, n3 0
    -> [0, 2] (in all C, n2 has 1 (C12), n3 1 (C34), n0 1 (C01); with the diagonal,
    activity counts n0 1, n2 1, n3 1 would be added).  Group 1: n1 C14 + C15 = 1,
    n4 C14 + C45 = 2, n5 C45 = 1 -> [4, 1]."""
    g = gate_neurons(GA, np.array([0, 1, 0, 0, 1, 1]), 2, 2, 1 / 3)
    assert g.tolist() == [[0, 2], [4, 1]]


def test_gate_neurons_active_share_rounds_and_floors_at_one():
    """top_p 0.1 of 6 -> round(0.6) = 1 neuron per token: no co-activation at all, every
    centrality 0: the first g members.  top_p 0.25 -> round(1.5) = 2: as 1/3.  top_p 0.45
    -> round(2.7) = 3: t0 adds n5 (0.4): C15 = C25 = 1 ... group 1 {3, 4, 5}: t0 {1, 2, 5},
    t1 {1, 4, 5}, t2 {4, 5, 3}, t3 {0, 1, 5}, t4 {3, 4, 5}: n3 C34 + C35 = 2 + 2 = 4,
    n4 C43 + C45 = 2 + 3 = 5, n5 C53 + C54 = 2 + 3 = 5 -> [4, 5]."""
    groups = np.array([0, 0, 0, 1, 1, 1])
    assert gate_neurons(GA, groups, 2, 2, 0.1).tolist() == [[0, 1], [3, 4]]
    assert gate_neurons(GA, groups, 2, 2, 0.25).tolist() == [[1, 0], [4, 3]]
    assert gate_neurons(GA, groups, 2, 2, 0.45)[1].tolist() == [4, 5]


# ---------------------------------------------------------------- the partition


def test_partition_starts_contiguous():
    """F 8, S 2, g 2: identity permutation; gates s x 4 + [0, 1] -> [[0, 1], [4, 5]]."""
    p = Partition(1, 2, 8, 2, 2)
    assert (p.S, p.g, p.F) == (2, 2, 8)
    assert p.perm.shape == (1, 2, 8) and p.perm[0, 1].tolist() == list(range(8))
    assert p.gates.shape == (1, 2, 2, 2) and p.gates.dtype == np.int64
    assert p.gates[0, 1].tolist() == [[0, 1], [4, 5]]


def test_partition_set_permutes_and_moves_the_gates():
    """assign [1, 0, 1, 0] -> order (stable) [1, 3, 0, 2]; positions of neurons 0..3 after
    the permutation [2, 0, 3, 1]; gates (original neurons) [[1], [0]] -> [[0], [2]]."""
    p = Partition(1, 2, 4, 2, 1)
    p.set(0, 1, np.array([1, 0, 1, 0]), np.array([[1], [0]]))
    assert p.perm[0, 1].tolist() == [1, 3, 0, 2]
    assert p.gates[0, 1].tolist() == [[0], [2]]
    assert p.perm[0, 0].tolist() == [0, 1, 2, 3]  # the other expert untouched


def fake(extra, layers=1, experts=2, d_ffn=8, d_model=2):
    cfg = SimpleNamespace(layers=layers, experts=experts, d_ffn=d_ffn, d_model=d_model)
    return SimpleNamespace(name="m.npz", cfg=cfg, extra=dict(extra))


GOOD = np.array([[[[0, 3], [4, 7]], [[1, 2], [5, 6]]]])  # [1, 2, S 2, g 2] of F 8


def test_partition_store_and_of_round_trip():
    p = Partition(1, 2, 8, 2, 2)
    p.gates = GOOD.copy()
    m = fake({})
    p.store(m)
    assert m.extra["prism.gates"] is p.gates
    assert m.extra["prism.S"].shape == () and int(m.extra["prism.S"]) == 2
    back = Partition.of(m)
    assert (back.S, back.g, back.F) == (2, 2, 8)
    assert back.gates.tolist() == GOOD.tolist() and back.gates.dtype == np.int64
    assert back.perm[0, 0].tolist() == list(range(8))
    # int32 indices and S of shape (1,) are taken
    back = Partition.of(fake({"prism.gates": GOOD.astype(np.int32), "prism.S": np.array([2])}))
    assert back.gates.dtype == np.int64 and back.S == 2


def test_partition_of_a_model_without_one():
    assert Partition.of(fake({})) is None
    assert Partition.of(fake({"prism.S": np.array(2)})) is None


def refusal(extra, **cfg) -> tuple:
    with pytest.raises(InputError) as e:
        Partition.of(fake(extra, **cfg))
    return e.value.file, e.value.field, e.value.reason


@pytest.mark.parametrize(
    "gates,reason",
    [
        (np.zeros((1, 2, 2), int), "shape (1, 2, 2) does not fit the model"),
        (np.zeros((1, 2, 2, 2, 1), int), "shape (1, 2, 2, 2, 1) does not fit the model"),
        (np.zeros((2, 2, 2, 2), int), "shape (2, 2, 2, 2) does not fit the model"),
        (np.zeros((1, 3, 2, 2), int), "shape (1, 3, 2, 2) does not fit the model"),
        (np.zeros((1, 2, 0, 2), int), "shape (1, 2, 0, 2) does not fit the model"),
        (np.zeros((1, 2, 3, 1), int), "3 sub-experts of integer neuron indices do not split 8 "
         "neurons"),
        (GOOD.astype(float), "2 sub-experts of integer neuron indices do not split 8 neurons"),
        (GOOD.astype(bool), "2 sub-experts of integer neuron indices do not split 8 neurons"),
        (np.zeros((1, 2, 2, 5), int), "5 gate neurons per sub-expert: a sub-expert of 4 "
         "neurons has 1..4"),
        (np.zeros((1, 2, 2, 0), int), "0 gate neurons per sub-expert: a sub-expert of 4 "
         "neurons has 1..4"),
    ],
)  # fmt: skip
def test_partition_of_refuses_gates_of_the_wrong_shape(gates, reason):
    assert refusal({"prism.gates": gates, "prism.S": np.array(2)}) == (
        "m.npz",
        "prism.gates",
        reason,
    )


def test_partition_of_takes_the_bounds_of_g_and_of_the_indices():
    """g = F / S = 4 (all of a sub-expert) and g 1; indices 0 and 7 (F - 1)."""
    full = np.array([[[[0, 1, 2, 3], [4, 5, 6, 7]]] * 2])
    assert Partition.of(fake({"prism.gates": full, "prism.S": np.array(2)})).g == 4
    one = np.array([[[[0], [7]]] * 2])
    assert Partition.of(fake({"prism.gates": one, "prism.S": np.array(2)})).g == 1


@pytest.mark.parametrize(
    "bad,reason",
    [
        (-1, "a neuron index outside 0..7"),
        (8, "a neuron index outside 0..7"),
        (4, "a gate neuron outside its sub-expert (sub-expert s holds neurons s x 4 .. s x 4 + 3)"),
    ],
)
def test_partition_of_refuses_indices_outside_their_group(bad, reason):
    gates = GOOD.copy()
    gates[0, 1, 0, 1] = bad  # sub-expert 0 holds neurons 0..3
    assert refusal({"prism.gates": gates, "prism.S": np.array(2)})[1:] == ("prism.gates", reason)
    gates = GOOD.copy()
    gates[0, 0, 1, 0] = 3  # sub-expert 1 holds 4..7: 3 is sub-expert 0's
    assert refusal({"prism.gates": gates, "prism.S": np.array(2)})[2].startswith("a gate neuron")


def test_partition_of_four_sub_experts_group_rule():
    """F 8, S 4: sub-expert s holds 2s, 2s + 1; gate 5 for sub-expert 2 is refused."""
    ok = np.array([[[[0], [3], [4], [7]]] * 2])
    assert Partition.of(fake({"prism.gates": ok, "prism.S": np.array(4)})).S == 4
    bad = ok.copy()
    bad[0, 0, 2, 0] = 6
    assert refusal({"prism.gates": bad, "prism.S": np.array(4)})[2] == (
        "a gate neuron outside its sub-expert (sub-expert s holds neurons s x 2 .. s x 2 + 1)"
    )


@pytest.mark.parametrize(
    "stored,shown",
    [
        (np.array(3), "3 (int64)"),
        (np.array([3]), "[3] (int64)"),
        (np.array(2.0), "2.0 (float64)"),
        (np.array(True), "True (bool)"),
        (np.array([2, 2]), "[2, 2] (int64)"),
        (np.array([[2]]), "[[2]] (int64)"),
        (np.array([1, 2, 3, 4]), "[1, 2, 3, 4] (int64)"),
        (np.arange(5), "an array of int64 (5,)"),
        (np.array("2"), "an array of <U1 ()"),
    ],
)
def test_partition_of_refuses_a_wrong_s(stored, shown):
    assert refusal({"prism.gates": GOOD, "prism.S": stored}) == (
        "m.npz",
        "prism.S",
        f"must be the integer 2 of prism.gates' 2 sub-experts per expert, not {shown}",
    )


def test_partition_of_refuses_a_missing_s():
    assert refusal({"prism.gates": GOOD}) == (
        "m.npz",
        "prism.S",
        "missing array (the sub-experts per expert)",
    )


def test_short():
    """Values up to 4 numbers, else dtype and shape."""
    assert _short(np.array([1.5, 2.5, 3.5, 4.5], np.float32)) == "[1.5, 2.5, 3.5, 4.5] (float32)"
    assert _short(np.zeros(5, np.uint8)) == "an array of uint8 (5,)"
    assert _short(np.array([], np.int64)) == "[] (int64)"
    assert _short(np.array([1 + 1j])) == "an array of complex128 (1,)"
    assert _short(np.array([7], np.uint16)) == "[7] (uint16)"
    assert _short(np.array([True, False])) == "[True, False] (bool)"


# ---------------------------------------------------------------- proxy and oracle selection


def proxy_model():
    """d 1, F 4, 2 experts; w1 [1, 2, 1, 2] so silu(x w1) at x = 1 is [s1, s2, s1, s2]."""
    w1 = np.array([[[1.0, 2, 1, 2]], [[1.0, 2, 1, 2]]])
    w3 = np.array([[[1.0, 9, 3, 9]], [[5.0, 9, 0, 9]]])
    return SimpleNamespace(w={"l0.w1": w1, "l0.w3": w3})


def test_proxy_scores_by_hand():
    """Partition gates (default) [[0], [2]]: sub-expert 0 gated by neuron 0, 1 by neuron 2.
    One token h = [1], experts (0, 1) weights (0.6, 0.4).
    expert 0: |a0| = s1 x 1, |a2| = s1 x 3 -> x 0.6: [0.6 s1, 1.8 s1]
    expert 1: |a0| = s1 x 5, |a2| = 0 -> x 0.4: [2.0 s1, 0]
    flat [0.439, 1.316, 1.462, 0]: K 2 keeps (1, 0) and (0, 1); K 1 keeps (1, 0)."""
    part = Partition(1, 2, 4, 2, 1)
    hook = SubExpertHook(proxy_model(), part, K=2)
    assert (hook.K, hook.S, hook.selector) == (2, 2, "proxy")
    hook.hooks.moe_input(0, np.array([[1.0]]))
    ids, w = np.array([[0, 1]]), np.array([[0.6, 0.4]])
    out = hook.hooks.route(0, None, ids, w, None)
    assert out[0] is ids and out[1] is w
    want = [0.6 * SILU1, 1.8 * SILU1, 2.0 * SILU1, 0]
    assert hook._score.shape == (1, 2, 2)
    assert hook._score.ravel().tolist() == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert hook._keep.tolist() == [[[False, True], [True, False]]]
    assert hook._keep.dtype == bool
    one = SubExpertHook(proxy_model(), part, K=1, selector="proxy")
    one.hooks.moe_input(0, np.array([[1.0]]))
    one.hooks.route(0, None, ids, w, None)
    assert one._keep.tolist() == [[[False, False], [True, False]]]


def test_proxy_mean_of_several_gate_neurons():
    """g 2, gates [[0, 1], [2, 3]]: expert 0 sub-expert 0 mean(|s1 x 1|, |s2 x 9|),
    sub-expert 1 mean(s1 x 3, s2 x 9); weight 1 (one expert)."""
    part = Partition(1, 2, 4, 2, 2)
    hook = SubExpertHook(proxy_model(), part, K=1)
    hook.hooks.moe_input(0, np.array([[1.0]]))
    hook.hooks.route(0, None, np.array([[0]]), np.array([[1.0]]), None)
    want = [(SILU1 + 9 * SILU2) / 2, (3 * SILU1 + 9 * SILU2) / 2]
    assert hook._score[0, 0] == pytest.approx(want, rel=1e-12)
    assert hook._keep.tolist() == [[[False, True]]]


def test_mask_expands_a_slot_to_its_neurons():
    """After the K 2 selection above: expert 1 (slot 1) keeps sub-expert 0 -> neurons
    [T, T, F, F]; expert 0 (slot 0) keeps sub-expert 1 -> [F, F, T, T]."""
    part = Partition(1, 2, 4, 2, 1)
    hook = SubExpertHook(proxy_model(), part, K=2)
    hook.hooks.moe_input(0, np.array([[1.0]]))
    hook.hooks.route(0, None, np.array([[0, 1]]), np.array([[0.6, 0.4]]), None)
    assert hook.hooks.neurons(0, 1, np.array([0]), None).tolist() == [[True, True, False, False]]
    assert hook.hooks.neurons(0, 0, np.array([0]), None).tolist() == [[False, False, True, True]]


def test_oracle_scores_are_group_norms_times_weight():
    """Two tokens, both on experts (1, 0) with weights (0.5, 0.5) and (1, 0):
    activations of expert e on token i: [3, 4, 0, 1] (e 0) and [0, 1, 2, 2] (e 1), for both
    tokens.  Group norms: e 0 [5, 1], e 1 [1, sqrt 8].  token 0 scores: slot 0 (e 1)
    [0.5, 1.414], slot 1 (e 0) [2.5, 0.5]; K 2 keeps (1, 0) 2.5 and (0, 1) 1.414.
    token 1: slot 0 [1, 2.828], slot 1 weight 0 -> [0, 0]: keeps (0, 1), (0, 0)."""
    table = {0: np.array([3.0, 4, 0, 1]), 1: np.array([0.0, 1, 2, 2])}
    m = SimpleNamespace(w={}, activations=lambda layer, e, h: np.tile(table[e], (len(h), 1)))
    hook = SubExpertHook(m, Partition(1, 2, 4, 2, 1), K=2, selector="oracle")
    hook.hooks.moe_input(0, np.zeros((2, 1)))
    hook.hooks.route(0, None, np.array([[1, 0], [1, 0]]), np.array([[0.5, 0.5], [1.0, 0]]), None)
    s8 = math.sqrt(8)
    want = [0.5, 0.5 * s8, 2.5, 0.5, 1, s8, 0, 0]
    assert hook._score.ravel().tolist() == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert hook._keep.tolist() == [[[False, True], [True, False]], [[True, True], [False, False]]]


# ---------------------------------------------------------------- linear gate


def test_linear_gate_select_by_hand():
    """logits log [1, 2, 3, 4] -> p [0.1, 0.2, 0.3, 0.4].
    K 2, S 2: keep 0.4, 0.3 -> 2 x [0.3, 0.4] / 0.7 = [6/7, 8/7].
    K 3, S 2: keep 0.4, 0.3, 0.2 -> min(3, 2) = 2: 2 x [0.2, 0.3, 0.4] / 0.9.
    K 1, S 2: 1 x 0.4 / 0.4 = 1.  K 2, S 4: min 2."""
    lg = np.log([[1.0, 2, 3, 4]])
    assert linear_gate_select(lg, 2, 2)[0] == pytest.approx([0, 0, 6 / 7, 8 / 7], abs=1e-12)
    assert linear_gate_select(lg, 3, 2)[0] == pytest.approx([0, 4 / 9, 6 / 9, 8 / 9], abs=1e-12)
    assert linear_gate_select(lg, 1, 2)[0] == pytest.approx([0, 0, 0, 1], abs=1e-12)
    assert linear_gate_select(lg, 2, 4)[0] == pytest.approx([0, 0, 6 / 7, 8 / 7], abs=1e-12)
    assert linear_gate_select(lg, 4, 4)[0] == pytest.approx([0.4, 0.8, 1.2, 1.6], abs=1e-12)


def test_linear_gate_select_ties_large_logits_and_dtype():
    """Equal logits: the stable order keeps the first K: K 2, S 4 -> [1, 1, 0, 0].  Logits
    near 1000 are shifted by their maximum first (no overflow).  float32 in, float32 out."""
    assert linear_gate_select(np.zeros((1, 4)), 2, 4).tolist() == [[1, 1, 0, 0]]
    big = 1000 + np.log([[1.0, 3]])
    assert linear_gate_select(big, 1, 2)[0] == pytest.approx([0, 1])
    assert linear_gate_select(big, 2, 2)[0] == pytest.approx([0.5, 1.5])
    assert linear_gate_select(np.zeros((2, 2), np.float32), 1, 2).dtype == np.float32
    assert linear_gate_select(np.zeros((2, 2)), 1, 2).shape == (2, 2)


def test_linear_gate_init_copies_the_router_with_tie_steps():
    """router columns (e0, e1) repeated S 3 times: e0 e0 e0 e1 e1 e1; bias -1e-4 x s."""
    assert GATE_TIE == 1e-4
    r0 = np.array([[1.0, 2], [3, 4]])
    m = SimpleNamespace(
        cfg=SimpleNamespace(layers=2, experts=2), w={"l0.router": r0, "l1.router": -r0}
    )
    G, b = linear_gate_init(m, 3)
    assert G.shape == (2, 2, 6) and G.dtype == np.float32
    assert G[0].tolist() == [[1, 1, 1, 2, 2, 2], [3, 3, 3, 4, 4, 4]]
    assert G[1].tolist() == [[-1, -1, -1, -2, -2, -2], [-3, -3, -3, -4, -4, -4]]
    assert b.shape == (2, 6) and b.dtype == np.float32
    t = np.float32(1e-4)
    assert b[1].tolist() == pytest.approx([0, -t, -2 * t, 0, -t, -2 * t], abs=1e-12)


def gate_model(extra=None, name="g.npz"):
    gates = np.array([[[[0], [2]], [[1], [3]]]])  # 1 layer, 2 experts, S 2, g 1, F 4
    m = fake({"prism.gates": gates, "prism.S": np.array(2), **(extra or {})}, d_ffn=4)
    m.name = name
    return m


def test_linear_gate_store_and_of():
    G, b = np.ones((1, 2, 4)), np.zeros((1, 4))
    gate = LinearGate(G, b, 2)
    assert gate.G.dtype == np.float32 and gate.b.dtype == np.float32 and gate.S == 2
    m = gate_model()
    gate.store(m)
    assert m.extra["prism.router"] is gate.G and m.extra["prism.router_bias"] is gate.b
    back = LinearGate.of(m)
    assert back.S == 2 and back.G.tolist() == G.tolist() and back.b.tolist() == b.tolist()
    assert LinearGate.of(gate_model()) is None


@pytest.mark.parametrize(
    "extra,field,reason",
    [
        ({"prism.router": np.ones((1, 2, 3))}, "prism.router",
         "shape (1, 2, 3), expected (1, 2, 4)"),
        ({"prism.router": np.ones((1, 2, 4))}, "prism.router_bias", "missing array"),
        ({"prism.router": np.ones((1, 2, 4)), "prism.router_bias": np.ones((1, 2, 4))},
         "prism.router_bias", "shape (1, 2, 4), expected (1, 4)"),
        ({"prism.router": np.ones((1, 2, 4), int), "prism.router_bias": np.ones((1, 4))},
         "prism.router", "holds a non-finite or non-float value"),
        ({"prism.router": np.full((1, 2, 4), np.inf), "prism.router_bias": np.ones((1, 4))},
         "prism.router", "holds a non-finite or non-float value"),
        ({"prism.router": np.ones((1, 2, 4)), "prism.router_bias": np.full((1, 4), np.nan)},
         "prism.router_bias", "holds a non-finite or non-float value"),
        ({"prism.router_bias": np.ones((1, 4), bool), "prism.router": np.ones((1, 2, 4))},
         "prism.router_bias", "holds a non-finite or non-float value"),
    ],
)  # fmt: skip
def test_linear_gate_of_refusals(extra, field, reason):
    with pytest.raises(InputError) as e:
        LinearGate.of(gate_model(extra))
    assert (e.value.file, e.value.field, e.value.reason) == ("g.npz", field, reason)


def test_linear_gate_without_a_partition():
    m = fake({"prism.router": np.ones((1, 2, 4))})
    with pytest.raises(InputError) as e:
        LinearGate.of(m)
    assert (e.value.field, e.value.reason) == (
        "prism.router",
        "a gate without a partition (prism.gates)",
    )


def test_linear_gate_weights_and_hook():
    """d 2, E 2, S 2.  h = [1, 0] picks G's first row [0, log 2, log 3, log 4] (bias 0):
    p [0.1, 0.2, 0.3, 0.4]; K 2 -> [[0, 0], [6/7, 8/7]] per expert.  The hook routes every
    token to all experts, a weight 1 where any of its sub-experts runs, and scales neurons
    [0, 1 | 2, 3] of expert 1 by [6/7, 6/7, 8/7, 8/7]."""
    G = np.zeros((1, 2, 4))
    G[0, 0] = np.log([1, 2, 3, 4])
    gate = LinearGate(G, np.zeros((1, 4)), 2)
    w = gate.weights(0, np.array([[1.0, 0]]), 2)
    assert w.shape == (1, 2, 2)
    assert w.ravel().tolist() == pytest.approx([0, 0, 6 / 7, 8 / 7], rel=1e-6, abs=1e-7)
    m = SimpleNamespace(cfg=SimpleNamespace(d_ffn=4))
    hook = LinearGateHook(m, gate, 2)
    assert hook.K == 2 and hook.gate is gate
    hook.hooks.moe_input(0, np.array([[1.0, 0], [0, 1]]))
    ids, used = hook.hooks.route(0, None, None, None, None)
    assert ids.tolist() == [[0, 1], [0, 1]]
    # token 1: h = [0, 1] -> logits 0: equal, K 2 keeps sub-experts 0, 1 of expert 0
    assert used.tolist() == [[0, 1], [1, 0]] and used.dtype == np.float32
    n = hook.hooks.neurons(0, 1, np.array([0]), None)
    assert n[0] == pytest.approx([6 / 7, 6 / 7, 8 / 7, 8 / 7], rel=1e-6)
    assert hook.hooks.neurons(0, 0, np.array([1]), None).tolist() == [[1, 1, 1, 1]]


# ---------------------------------------------------------------- profiling and refactoring

SMALL = LMConfig(vocab=31, d_model=8, layers=2, heads=2, context=8, experts=3, top_k=2, d_ffn=6)


def test_profile_activations_counts_and_caps():
    """19 ids with context 8: two windows (16 tokens, the last 3 dropped); each layer routes
    16 x top-2 = 32 rows over its experts.  A cap of 3 rows keeps at most 3 per expert."""
    m = random_model(SMALL, seed=1)
    ids = (np.arange(19) * 7) % 31
    acts = profile_activations(m, ids)
    for layer in (0, 1):
        rows = [len(a) for (lay, _), a in acts.items() if lay == layer]
        assert sum(rows) == 32
    assert all(a.dtype == np.float32 and a.shape[1] == 6 for a in acts.values())
    capped = profile_activations(m, ids, max_rows=3)
    assert capped.keys() == acts.keys()
    for k, a in capped.items():
        assert len(a) == min(3, len(acts[k]))
        assert np.array_equal(a, acts[k][: len(a)])


def test_profile_activations_takes_more_than_sixteen_windows():
    """17 windows: a second batch of windows runs (16 per batch): 17 x 8 x 2 rows a layer."""
    m = random_model(SMALL, seed=1)
    acts = profile_activations(m, (np.arange(17 * 8) * 5) % 31, max_rows=10**6)
    assert sum(len(a) for (lay, _), a in acts.items() if lay == 0) == 17 * 8 * 2


def test_refactor_contiguous_by_hand():
    """contiguous: groups {0, 1, 2 | 3, 4, 5}, no permutation; gate neurons of GA with
    top_p 1/3, g 1: [[1], [4]] (see above).  K 1 cost: token 0 sqrt(0.29), token 1
    sqrt(16.25), token 2 sqrt(0.14), token 3 sqrt(0.29), token 4 sqrt(0.14) (the smaller
    group of each) = 5.8565 -> reported 5.856 twice."""
    m = random_model(SMALL, seed=3)
    seen = []
    out, part, report = refactor(
        m, {(1, 2): GA}, S=2, K=1, g=1, top_p=1 / 3, contiguous=True, log=seen.append
    )
    cost = 2 * math.sqrt(0.29) + math.sqrt(16.25) + 2 * math.sqrt(0.14)
    assert round(cost, 3) == 5.856
    assert report == [{"layer": 1, "expert": 2, "tokens": 5, "cost": [5.856, 5.856]}]
    assert seen == report
    assert part.perm[1, 2].tolist() == list(range(6))
    assert part.gates[1, 2].tolist() == [[1], [4]]
    assert part.gates[0, 0].tolist() == [[0], [3]]  # an expert without activations
    for k in m.w:
        assert np.array_equal(out.w[k], m.w[k])
    assert out.extra["prism.gates"] is part.gates and int(out.extra["prism.S"]) == 2
    assert out.cfg is m.cfg


def test_refactor_anneals_each_expert_with_its_own_seed():
    """Expert (2, 2) of a 3-layer model: greedy start, then anneal(seed 0 + 31 x 2 + 2 = 64)
    over 8 proposals, whose best [1, 1, 0, 0, 0, 1] no nearby seed (0, 2, 60, 62, 63, 65,
    66) gives; the report's costs are the contiguous split's, the greedy start's and the
    annealed best, to 3 digits; the weights are permuted by the partition (w1, w3 columns,
    w2 rows); the input model's weights are not changed."""
    cfg = LMConfig(vocab=31, d_model=8, layers=3, heads=2, context=8, experts=3, top_k=2, d_ffn=6)
    m = random_model(cfg, seed=3)
    before = {k: v.copy() for k, v in m.w.items()}
    act = GA * np.array([1, -1, 1, 1, -1, 1])
    out, part, report = refactor(m, {(2, 2): act}, S=2, K=1, g=1, top_p=1 / 3, iters=8)
    init = greedy_partition(act, 2)
    best, (_, end) = anneal(act, init, 2, 1, 0.01, 0.999, 8, 64)
    assert best.tolist() == [1, 1, 0, 0, 0, 1]
    for other in (0, 2, 60, 62, 63, 65, 66):
        assert anneal(act, init, 2, 1, 0.01, 0.999, 8, other)[0].tolist() != best.tolist()
    assert report[0]["layer"] == 2 and report[0]["expert"] == 2 and report[0]["tokens"] == 5
    assert report[0]["cost"] == [
        round(partition_cost(act, contiguous_groups(6, 2), 2, 1), 3),
        round(partition_cost(act, init, 2, 1), 3),
        round(end, 3),
    ]
    order = np.argsort(best, kind="stable")
    assert order.tolist() == [2, 3, 4, 0, 1, 5]
    assert part.perm[2, 2].tolist() == order.tolist()
    assert np.array_equal(out.w["l2.w1"][2], m.w["l2.w1"][2][:, order])
    assert np.array_equal(out.w["l2.w3"][2], m.w["l2.w3"][2][:, order])
    assert np.array_equal(out.w["l2.w2"][2], m.w["l2.w2"][2][order, :])
    assert np.array_equal(out.w["l2.w1"][1], m.w["l2.w1"][1])
    assert all(np.array_equal(before[k], m.w[k]) for k in m.w)


def test_refactor_defaults():
    """S 4, K 2, g 4, top_p 0.1, t0 0.01, cooling 0.999, iters 3000, seed 0 (F 8: groups
    of 2, so g 4 cannot fit: F 16 here)."""
    cfg = LMConfig(vocab=31, d_model=8, layers=1, heads=2, context=8, experts=2, top_k=1, d_ffn=16)
    m = random_model(cfg, seed=5)
    act = np.random.default_rng(0).normal(size=(6, 16))
    a = refactor(m, {(0, 1): act})
    b = refactor(m, {(0, 1): act}, S=4, K=2, g=4, top_p=0.1, t0=0.01, cooling=0.999,
                 iters=3000, seed=0, contiguous=False)  # fmt: skip
    assert a[2] == b[2] and a[1].S == 4 and a[1].g == 4
    assert np.array_equal(a[1].perm, b[1].perm) and np.array_equal(a[1].gates, b[1].gates)
