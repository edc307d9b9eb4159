"""Speculative MoE (``sw/policies/speculative.py``) pinned by hand: every rule on a case of
2-4 experts, 2-3 devices and a few tokens, the expected numbers worked out in the comments."""

import numpy as np
import pytest

from fsedp.sw.policies.speculative import (
    DeviceBigram,
    TokenTable,
    _affinity,
    _balanced,
    _cem_step,
    _objective,
    cem_placement,
    comm_volume,
    kmeans_placement,
    lar,
    metis_placement,
    place_tokens,
    precision_f1,
    predicted_devices,
)

# ---------------------------------------------------------------- precision and F1


def test_precision_f1_by_hand():
    """pred [N=2, kp=1] against true [N, k=2].
    row 0: pred {0}, true {0, 1}: 1 hit, p = 1/1, r = 1/2, F1 = 2 * 1 * 0.5 / 1.5 = 2/3.
    row 1: pred {3}, true {0, 1}: 0 hits, p = r = 0, F1 = 0 (the p + r = 0 branch).
    means: p = 0.5, F1 = 1/3."""
    p, f1 = precision_f1(np.array([[0], [3]]), np.array([[0, 1], [0, 1]]))
    assert type(p) is float and type(f1) is float
    assert p == 0.5
    assert f1 == pytest.approx(1 / 3, abs=1e-15)


def test_precision_f1_recall_side():
    """pred [1, 2] = {0, 2} against true [1, 1] = {2}: 1 hit; p = 1/2, r = 1/1,
    F1 = 2 * 0.5 * 1 / 1.5 = 2/3 (precision divides by kp, recall by k)."""
    p, f1 = precision_f1(np.array([[0, 2]]), np.array([[2]]))
    assert p == 0.5
    assert f1 == pytest.approx(2 / 3, abs=1e-15)


def test_precision_f1_when_p_plus_r_is_below_one():
    """pred [1, 4] = {0, 1, 2, 3} against true [1, 2] = {3, 9}: 1 hit; p = 1/4, r = 1/2,
    p + r = 0.75: F1 = 2 x 0.125 / 0.75 = 1/3 (the floor 1e-12 of p + r plays no part)."""
    p, f1 = precision_f1(np.array([[0, 1, 2, 3]]), np.array([[3, 9]]))
    assert p == 0.25
    assert f1 == pytest.approx(1 / 3, abs=1e-15)


def test_precision_f1_perfect_and_none():
    """All hit: p = 1, F1 = 1; none: p = 0, F1 = 0 (no division by zero)."""
    assert precision_f1(np.array([[1, 0]]), np.array([[0, 1]])) == (1.0, 1.0)
    assert precision_f1(np.array([[2, 3]]), np.array([[0, 1]])) == (0.0, 0.0)


# ---------------------------------------------------------------- token tables

# 3 fitting tokens (ids 5, 7, 5), 2 layers, top-1 of 3 experts.
#   layer 0 experts: 0, 1, 0    layer 1 experts: 2, 2, 1
IDS = np.array([5, 7, 5])
EXPERTS = np.array([[[0], [2]], [[1], [2]], [[0], [1]]])


def test_token_table_counts_and_popularity():
    """vocab [5, 7]; layer 0: id 5 -> expert 0 twice, id 7 -> expert 1 once;
    layer 1: id 5 -> experts 2 and 1, id 7 -> expert 2.  Popularity = column sums."""
    t = TokenTable(IDS, EXPERTS, 3)
    assert t.E == 3
    assert t.vocab.tolist() == [5, 7]
    assert t.counts.shape == (2, 2, 3)
    assert t.counts[0].tolist() == [[2, 0, 0], [0, 1, 0]]
    assert t.counts[1].tolist() == [[0, 1, 1], [0, 0, 1]]
    assert t.pop.tolist() == [[2, 1, 0], [0, 1, 2]]
    assert t.emb is None


def test_token_table_counts_every_one_of_top_k():
    """top-2: token id 4 with experts (0, 2) at its single layer counts both."""
    t = TokenTable(np.array([4, 4]), np.array([[[0, 2]], [[2, 1]]]), 3)
    assert t.counts[0].tolist() == [[1, 1, 2]]


def test_rows_seen_and_unseen_without_embeddings():
    """ids 5 and 7 are rows 0 and 1; 6 (between), 9 (past the last: searchsorted gives 2,
    clipped to 1, 7 != 9) and 1 (before the first) are unseen: row -1."""
    t = TokenTable(IDS, EXPERTS, 3)
    idx, seen = t.rows(np.array([5, 6, 7, 9, 1]))
    assert idx.tolist() == [0, -1, 1, -1, -1]
    assert seen.tolist() == [True, False, True, False, False]


def test_confidence_seen_id_adds_a_millionth_of_popularity():
    """layer 0, id 5: counts [2, 0, 0] + 1e-6 * pop [2, 1, 0] = [2 + 2e-6, 1e-6, 0],
    over their sum 2 + 3e-6."""
    t = TokenTable(IDS, EXPERTS, 3)
    c = t.confidence(0, np.array([5]))
    s = 2 + 3e-6
    assert c.shape == (1, 3)
    assert c[0] == pytest.approx([(2 + 2e-6) / s, 1e-6 / s, 0.0], rel=1e-12, abs=1e-18)


def test_confidence_of_two_ids_is_normalised_per_row():
    """layer 0, ids 5 and 7: [2 + 2e-6, 1e-6, 0] / (2 + 3e-6) and [2e-6, 1 + 1e-6, 0] /
    (1 + 3e-6): each row over its own sum, not over the batch's."""
    t = TokenTable(IDS, EXPERTS, 3)
    c = t.confidence(0, np.array([5, 7]))
    s5, s7 = 2 + 3e-6, 1 + 3e-6
    assert c[0] == pytest.approx([(2 + 2e-6) / s5, 1e-6 / s5, 0.0], rel=1e-12, abs=1e-18)
    assert c[1] == pytest.approx([2e-6 / s7, (1 + 1e-6) / s7, 0.0], rel=1e-12, abs=1e-18)


def test_confidence_unseen_id_is_the_layer_popularity():
    """No embeddings: an unseen id has no counts, so only 1e-6 * pop remains: layer 0
    pop [2, 1, 0] -> [2/3, 1/3, 0]; layer 1 pop [0, 1, 2] -> [0, 1/3, 2/3]."""
    t = TokenTable(IDS, EXPERTS, 3)
    assert t.confidence(0, np.array([6]))[0] == pytest.approx([2 / 3, 1 / 3, 0], abs=1e-12)
    assert t.confidence(1, np.array([9]))[0] == pytest.approx([0, 1 / 3, 2 / 3], abs=1e-12)


def test_predict_popularity_breaks_a_count_tie():
    """layer 1, id 5: counts [0, 1, 1] tie experts 1 and 2; popularity [0, 1, 2] adds
    1e-6 and 2e-6, so expert 2 comes first: top-2 = [2, 1]."""
    t = TokenTable(IDS, EXPERTS, 3)
    assert t.predict(1, np.array([5]), 2).tolist() == [[2, 1]]
    assert t.predict(1, np.array([5]), 1).tolist() == [[2]]
    # layer 0, id 7: counts [0, 1, 0] + 1e-6 [2, 1, 0]: expert 1, then 0, then 2
    assert t.predict(0, np.array([7]), 3).tolist() == [[1, 0, 2]]


def test_predict_exact_tie_keeps_the_lower_expert():
    """Ids 1 and 2 each route to a different expert once; the unseen id 3 gets the
    popularity [1, 1] /2 = [0.5, 0.5]: an exact tie, the stable sort keeps expert 0 first."""
    t = TokenTable(np.array([1, 2]), np.array([[[1]], [[0]]]), 2)
    assert t.confidence(0, np.array([3])).tolist() == [[0.5, 0.5]]
    assert t.predict(0, np.array([3]), 2).tolist() == [[0, 1]]


def test_predict_ties_among_many_experts_keep_the_lower_expert():
    """20 experts; ids 1..10 each route once to expert 0, 2, ..., 18: popularity [1, 0]
    x 10.  The unseen id 99 gets it as its confidence (0.1 on every even expert): top-5 in
    expert order [0, 2, 4, 6, 8] (a tie among more than 16 entries is where an unstable
    sort reorders)."""
    ids = np.arange(1, 11)
    t = TokenTable(ids, (2 * np.arange(10)).reshape(10, 1, 1), 20)
    assert t.predict(0, np.array([99]), 5).tolist() == [[0, 2, 4, 6, 8]]


def _embedded_table():
    # embeddings of ids 0..9 (2-d); seen ids 5 -> [10, 0], 7 -> [0, 1].
    # Unseen 6 -> [0.5, 1]: raw dot products 5 (with id 5) and 1 (with id 7) would pick 5,
    # cosines 0.5/|6| and 1/|6| pick 7 (the embeddings are normalised first).
    # Unseen 9 -> [1, 0.1]: cosine picks 5.  Unseen 1 -> [0, 0]: every cosine 0 -> row 0.
    emb = np.zeros((10, 2))
    emb[5], emb[7], emb[6], emb[9] = [10, 0], [0, 1], [0.5, 1], [1, 0.1]
    return TokenTable(IDS, EXPERTS, 3, embeddings=emb)


def test_rows_unseen_take_the_nearest_seen_id_by_cosine():
    t = _embedded_table()
    idx, seen = t.rows(np.array([6, 5, 9, 1, 7]))
    assert idx.tolist() == [1, 0, 0, 0, 1]
    assert seen.tolist() == [False, True, False, False, True]
    assert t.emb[5].tolist() == [1.0, 0.0]
    assert t.seen_emb.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert t.emb[1].tolist() == [0.0, 0.0]  # a zero vector stays zero (norm floor 1e-12)


def test_confidence_of_an_unseen_id_uses_its_nearest_row():
    """id 6 -> row of id 7: layer 0 counts [0, 1, 0] + 1e-6 [2, 1, 0] over 1 + 3e-6."""
    t = _embedded_table()
    s = 1 + 3e-6
    c = t.confidence(0, np.array([6]))[0]
    assert c == pytest.approx([2e-6 / s, (1 + 1e-6) / s, 0.0], rel=1e-12, abs=1e-18)
    assert t.predict(0, np.array([6, 9]), 1).tolist() == [[1], [0]]


def test_rows_all_seen_with_embeddings_skip_the_lookup():
    t = _embedded_table()
    idx, seen = t.rows(np.array([7, 5]))
    assert idx.tolist() == [1, 0] and seen.all()


# ---------------------------------------------------------------- 2-gram device model

# 4 tokens, 4 layers, 2 devices.  Layer 2 triples (d0, d1, d2): (0,1,1) (0,1,1) (0,1,0)
# (1,0,0); layer 3 triples (d1, d2, d3): (1,1,0) (1,1,0) (1,0,0) (0,0,1).
DEVS = np.array([[0, 1, 1, 0], [0, 1, 1, 0], [0, 1, 0, 0], [1, 0, 0, 1]])


def test_bigram_counts_from_layer_two_on():
    """Every cell starts at 1e-3; layers 0 and 1 are never counted."""
    m = DeviceBigram(DEVS, 2)
    assert m.D == 2
    assert m.c.shape == (4, 2, 2, 2)
    assert (m.c[:2] == 1e-3).all()
    e = 1e-3
    assert m.c[2].tolist() == [[[e, e], [1 + e, 2 + e]], [[1 + e, e], [e, e]]]
    assert m.c[3].tolist() == [[[e, 1 + e], [e, e]], [[1 + e, e], [2 + e, e]]]


def test_bigram_predict_and_accuracy():
    """Layer 2: context (0, 1) -> counts [1, 2] -> device 1; (1, 0) -> [1, 0] -> 0:
    predictions [1, 1, 1, 0] against [1, 1, 0, 0]: 3/4.
    Layer 3: (1, 1) -> [2, 0] -> 0; (1, 0) -> [1, 0] -> 0; (0, 0) -> [0, 1] -> 1:
    predictions [0, 0, 0, 1] against [0, 0, 0, 1]: 4/4."""
    m = DeviceBigram(DEVS, 2)
    assert m.predict(DEVS, 2).tolist() == [1, 1, 1, 0]
    assert m.predict(DEVS, 3).tolist() == [0, 0, 0, 1]
    acc = m.accuracy(DEVS)
    assert acc == [0.75, 1.0]
    assert all(type(a) is float for a in acc)


def test_bigram_unseen_context_predicts_device_zero():
    """Context (1, 1) at layer 2 was never seen: all cells 1e-3, argmax -> device 0."""
    m = DeviceBigram(DEVS, 2)
    assert m.predict(np.array([[1, 1, 1]]), 2).tolist() == [0]


# ---------------------------------------------------------------- LAR and affinity


def test_lar_by_hand():
    """experts [[0, 2], [1, 2]] on devices [0, 0, 1] -> [[0, 1], [0, 1]]; tokens on [0, 1]:
    local (0 == 0), (1 == 1): 2 of 4 = 0.5."""
    v = lar(np.array([0, 1]), np.array([0, 0, 1]), np.array([[0, 2], [1, 2]]))
    assert v == 0.5 and type(v) is float


def test_affinity_by_hand():
    """rows [0, 1, 0] with experts [[0, 1], [1, 2], [0, 0]]:
    row 0: 0, 1, 0, 0 -> [3, 1, 0]; row 1: 1, 2 -> [0, 1, 1]."""
    a = _affinity(np.array([0, 1, 0]), np.array([[0, 1], [1, 2], [0, 0]]), 2, 3)
    assert a.tolist() == [[3, 1, 0], [0, 1, 1]]
    assert a.dtype == np.float64


# ---------------------------------------------------------------- best response of tokens

EDEV = np.array([0, 0, 1, 1])  # experts 0, 1 on device 0; 2, 3 on device 1


def test_place_tokens_fills_a_device_exactly_to_its_cap():
    """4 rows of load 2 all on expert 0 (device 0); total 8, D 2, slack 0: cap 4.
    rows 0, 1 -> device 0 (2, then 2 + 2 = 4 <= 4); rows 2, 3: 6 > 4 and device 0 is
    not the least used -> device 1 (2, 4 <= 4)."""
    aff = np.array([[2.0, 0, 0, 0]] * 4)
    dev = place_tokens(aff, EDEV, 2, 0.0)
    assert dev.tolist() == [0, 0, 1, 1]
    assert dev.dtype == np.int64


def test_place_tokens_slack_widens_the_cap():
    """Same rows: slack 0.5 -> cap 1.5 * 8 / 2 = 6: three rows fit device 0 (6 <= 6);
    slack 0.25 -> cap 5: two fit (4 <= 5, 6 > 5)."""
    aff = np.array([[2.0, 0, 0, 0]] * 4)
    assert place_tokens(aff, EDEV, 2, 0.5).tolist() == [0, 0, 0, 1]
    assert place_tokens(aff, EDEV, 2, 0.25).tolist() == [0, 0, 1, 1]


def test_place_tokens_heaviest_first_then_least_used_over_cap():
    """loads 4 (device 0), 3 (device 1), 2 (device 0); total 9, cap 4.5.
    row 0 -> 0 (used [4, 0]); row 1 -> 1 (used [4, 3]); row 2: device 0: 6 > 4.5, not the
    least used; device 1: 5 > 4.5 but the least used -> device 1 over the cap."""
    aff = np.array([[4.0, 0, 0, 0], [0, 0, 3, 0], [2, 0, 0, 0]])
    assert place_tokens(aff, EDEV, 2, 0.0).tolist() == [0, 1, 1]


def test_place_tokens_order_is_by_load_not_by_row():
    """row 0 load 1 and row 1 load 4 both prefer device 0; total 5, cap 2.5 (slack 0).
    Heaviest first: row 1 -> device 0 (4 > 2.5 but device 0 is the least used at
    [0, 0]); row 0: 4 + 1 > 2.5, not least used; device 1: 1 <= 2.5 -> device 1."""
    aff = np.array([[1.0, 0, 0, 0], [4, 0, 0, 0]])
    assert place_tokens(aff, EDEV, 2, 0.0).tolist() == [1, 0]


def test_place_tokens_score_tie_takes_the_lower_device():
    """One row with one activation on each device: score [1, 1]; cap 1.1 * 2 / 2 = 1.1,
    2 > 1.1 on device 0 but it is the least used -> device 0."""
    assert place_tokens(np.array([[1.0, 0, 1, 0]]), EDEV, 2, 0.1).tolist() == [0]


def test_place_tokens_load_ties_go_in_row_order():
    """20 rows on expert 0 (device 0): even rows load 2, odd rows load 1; total 30, cap
    15 (slack 0).  Heaviest first, ties in row order: rows 0, 2, ..., 12 fill device 0 to
    14; rows 14, 16, 18 do not fit and go to device 1 (the least used); then row 1 fills
    device 0 to 15 and rows 3, ..., 19 go to device 1."""
    aff = np.zeros((20, 4))
    aff[:, 0] = [2.0, 1.0] * 10
    dev = place_tokens(aff, EDEV, 2, 0.0)
    assert np.nonzero(dev == 0)[0].tolist() == [0, 1, 2, 4, 6, 8, 10, 12]


def test_place_tokens_score_ties_go_in_device_order():
    """20 devices, expert e on device e; 4 rows each with one activation on every even
    expert (load 10, score [1, 0] x 10); total 40, slack 4: cap 5 x 40 / 20 = 10, one row
    per device.  Each row takes the lowest even device with room: 0, 2, 4, 6."""
    aff = np.tile(np.array([1.0, 0.0] * 10), (4, 1))
    assert place_tokens(aff, np.arange(20), 20, 4.0).tolist() == [0, 2, 4, 6]


# ---------------------------------------------------------------- balanced expert placement


def test_balanced_cap_is_the_ceiling_of_experts_per_device():
    """E 3, D 2: cap ceil(3/2) = 2.  Scores all on device 0 (3, 2, 1): experts 0, 1 fill
    device 0, expert 2 takes device 1 at its zero score."""
    dev = _balanced(np.array([[3.0, 0], [2, 0], [1, 0]]), 2)
    assert dev.tolist() == [0, 0, 1]


def test_balanced_highest_score_first():
    """E 2, D 2 (cap 1): the largest score 5 (expert 1, device 0) is placed first, so
    expert 0 (preferring device 0 at 4) gets device 1."""
    assert _balanced(np.array([[4.0, 0], [5, 1]]), 2).tolist() == [1, 0]


def test_balanced_score_ties_go_to_the_lower_expert():
    """10 experts, each scoring [1, 0]; cap 5: the tie among 20 entries goes in flat
    order, so experts 0-4 take device 0 and 5-9 device 1."""
    assert _balanced(np.tile([1.0, 0.0], (10, 1)), 2).tolist() == [0] * 5 + [1] * 5


def test_objective_by_hand():
    """aff [[1, 0]]: one token on expert 0; experts on [0, 1].  The token goes to device 0
    (cap 1.1 * 1 / 2 = 0.55, over it but least used): LAR 1 / max(1, 1) = 1."""
    val, tok = _objective(np.array([[1.0, 0]]), np.array([0, 1]), 2, 0.1)
    assert val == 1.0 and type(val) is float
    assert tok.tolist() == [0]
    # no activations: 0 / max(0, 1) = 0
    val, _ = _objective(np.zeros((1, 2)), np.array([0, 1]), 2, 0.1)
    assert val == 0.0


# ---------------------------------------------------------------- co-clustering

# Two token rows each using only its own pair of experts: any balanced placement that puts
# experts {0, 1} and {2, 3} on different devices is perfect (LAR 1).
BLOCKS = np.array([[3.0, 3, 0, 0], [0, 0, 3, 3]])


def test_cem_one_sample_is_the_gumbel_placement():
    """iters 1, samples 1: the sample is _balanced(log(1/2) + the [4, 2] Gumbel draws of
    default_rng(0)) (log(1/2) shifts all equally):
        e0: [-0.0132, 1.157]   e1: [3.174, 4.0944]   e2: [-0.5177, -0.8916]
        e3: [ 0.0693, -0.2681]
    descending: (e1, d1) 4.09 -> e1 on 1; (e1, d0) taken; (e0, d1) 1.157 -> e0 on 1 (device
    1 full, cap 2); (e3, d0) 0.069 -> e3 on 0; (e0, d0) taken; (e3, d1) taken; (e2, d0)
    -> e2 on 0.  Placement [1, 1, 0, 0]: each token row finds both its experts on one
    device -> tokens [1, 0], LAR 1."""
    g = np.random.default_rng(0).gumbel(size=(4, 2))
    assert g.round(4).tolist() == [
        [-0.0132, 1.157],
        [3.174, 4.0944],
        [-0.5177, -0.8916],
        [0.0693, -0.2681],
    ]
    dev, tok, val, hist = cem_placement(BLOCKS, 2, iters=1, samples=1)
    assert dev.tolist() == [1, 1, 0, 0]
    assert tok.tolist() == [1, 0]
    assert val == 1.0
    assert hist == [1.0]


def test_cem_keeps_the_best_sample_and_smooths_towards_the_elite():
    """iters 2, samples 1 (elite max(1, round(0.1 * 1)) = 1 sample).  After iteration 1
    (placement [1, 1, 0, 0]) P = 0.7 * one-hot + 0.3 * 0.5: 0.85 on the chosen device,
    0.15 on the other; log P = -0.1625 / -1.8971.  The next draws
        e0: [0.2428, -1.0059]   e1: [-0.5259, 5.899]   e2: [-0.6667, 3.3766]
        e3: [-0.2685, 1.6442]
    give scores e0 [-1.654, -1.169], e1 [-2.423, 5.737], e2 [-0.829, 1.480],
    e3 [-0.431, -0.253]; descending: e1 -> 1, e2 -> 1 (device 1 full), e3 -> 0, e0 -> 0:
    [0, 1, 1, 0].  Tokens: row 0 (devices 0, 1: score [3, 3]) -> device 0 (used 6 <= 6.6);
    row 1 (score [3, 3]): device 0 12 > 6.6, device 1 6 <= 6.6 -> device 1: LAR 6/12 = 0.5.
    The history records 0.5, the result keeps iteration 1's 1.0 (only a strictly better
    sample replaces it).
    smoothing 1: P one-hot, log(1e-12) = -27.6 on the other device outweighs the draws, the
    second sample repeats the first: history [1, 1]."""
    dev, tok, val, hist = cem_placement(BLOCKS, 2, iters=2, samples=1)
    assert (dev.tolist(), tok.tolist(), val, hist) == ([1, 1, 0, 0], [1, 0], 1.0, [1.0, 0.5])
    assert cem_placement(BLOCKS, 2, iters=2, samples=1, smoothing=1.0)[3] == [1.0, 1.0]


def test_cem_history_rounds_to_four_places_elite_and_smoothing_recorded():
    """Three rows of 15 activations in all: LARs are multiples of 1/15, the history keeps
    them rounded to 4 places (11/15 -> 0.7333, 10/15 -> 0.6667).  The elite share and the
    smoothing change the later samples (recorded values of seed 0, not worked by hand: they
    follow from the Gumbel draws).  elite 0.5 of 4 samples (2 elite) keeps sampling the
    best placement (12/15 = 0.8); elite 0.75 (3 elite) and 1.0 (4) spread P further."""
    aff = np.array([[3.0, 1, 0, 2], [0, 2, 3, 1], [1, 1, 1, 0]])

    def hist(**kw):
        return cem_placement(aff, 2, iters=3, samples=4, **kw)[3]

    assert hist(elite=0.5, smoothing=1.0) == [0.8, 0.8, 0.8]
    assert hist(elite=0.75, smoothing=1.0) == [0.8, 0.7333, 0.6667]
    assert hist(elite=1.0, smoothing=1.0) == [0.8, 0.6667, 0.6667]
    assert hist(elite=0.0, smoothing=1.0) == [0.8, 0.8, 0.8]  # still one elite sample
    assert hist(smoothing=0.0) == [0.8, 0.7333, 0.8]
    assert hist(smoothing=0.5) == [0.8, 0.6667, 0.8]
    assert hist() == [0.8, 0.8, 0.8]


def test_cem_a_later_equal_sample_does_not_replace_the_best():
    """seed 7, samples 1, smoothing 0 (P stays uniform: every sample is a fresh Gumbel
    placement).  Iterations 1 and 2 give [1, 1, 0, 0] (LAR 1); iteration 3's draws
        e0 [-1.6871, -0.4532]  e1 [0.027, -1.5055]  e2 [1.4169, 1.7452]  e3 [0.0533, 3.1025]
    give e3 -> 1 (3.10), e2 -> 1 (1.75, device 1 full), e1 -> 0 (0.027), e0 -> 0:
    [0, 0, 1, 1], also LAR 1.  Only a strictly better sample replaces the best: the first
    stays."""
    r = np.random.default_rng(7)
    r.gumbel(size=(4, 2)), r.gumbel(size=(4, 2))
    assert r.gumbel(size=(4, 2)).round(4).tolist() == [
        [-1.6871, -0.4532],
        [0.027, -1.5055],
        [1.4169, 1.7452],
        [0.0533, 3.1025],
    ]
    dev, tok, val, hist = cem_placement(BLOCKS, 2, iters=3, samples=1, smoothing=0.0, seed=7)
    assert (dev.tolist(), tok.tolist(), val, hist) == ([1, 1, 0, 0], [1, 0], 1.0, [1.0] * 3)


def test_cem_finds_the_perfect_blocks():
    dev, tok, val, hist = cem_placement(BLOCKS, 2)
    assert val == 1.0
    assert dev[0] == dev[1] != dev[2] == dev[3]
    assert tok.tolist() == [dev[0], dev[2]]
    assert len(hist) == 30 and hist[-1] == 1.0


#: 12 vocabulary rows over 16 experts, 0-2 activations each: large enough (4 devices) that
#: the sampling does not find its best placement at once, so its settings show in the history
AFF16 = np.random.default_rng(3).integers(0, 3, (12, 16)).astype(float)


def test_cem_defaults_are_the_documented_values():
    """iters 30, samples 64, elite 0.1, smoothing 0.7, slack 0.1, seed 0; on AFF16 one
    sample more already gives another history, so the comparison sees the default."""
    a = cem_placement(AFF16, 4)
    b = cem_placement(AFF16, 4, iters=30, samples=64, elite=0.1, smoothing=0.7, slack=0.1, seed=0)
    assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
    assert a[2:] == b[2:]
    assert cem_placement(AFF16, 4, iters=4)[3] != cem_placement(AFF16, 4, iters=4, samples=65)[3]


def test_cem_elite_count_rounds_and_is_at_least_one():
    """10 samples: elite 0.1 and 0.14 both keep round(1.0) = round(1.4) = 1 sample, elite
    0.2 keeps 2, elite 0.01 keeps max(1, round(0.1)) = 1."""

    def hist(elite):
        return cem_placement(AFF16, 4, iters=4, samples=10, elite=elite)[3]

    one = hist(0.1)
    assert hist(0.14) == one and hist(0.01) == one
    assert hist(0.2) != one


def test_cem_step_by_hand():
    """P uniform over 2 devices; elite placements [0, 1] and [0, 0]: expert 0 is on device
    0 in both (frequency 1), expert 1 once on each (1/2).  Smoothing 0.7: e0 0.7 x [1, 0] +
    0.3 x [.5, .5] = [.85, .15]; e1 0.7 x [.5, .5] + 0.3 x [.5, .5] = [.5, .5]."""
    P = np.full((2, 2), 0.5)
    got = _cem_step(P, [np.array([0, 1]), np.array([0, 0])], 0.7)
    assert got == pytest.approx(np.array([[0.85, 0.15], [0.5, 0.5]]), abs=1e-15)
    assert P.tolist() == [[0.5, 0.5]] * 2  # not changed in place
    # one elite, smoothing 1: P becomes its placement
    assert _cem_step(P, [np.array([1, 0])], 1.0).tolist() == [[0.0, 1.0], [1.0, 0.0]]


def test_metis_finds_the_perfect_blocks():
    dev, tok, val = metis_placement(BLOCKS, 2)
    assert val == 1.0
    assert sorted(np.bincount(dev, minlength=2).tolist()) == [2, 2]
    assert dev[0] == dev[1] != dev[2] == dev[3]
    assert tok.tolist() == [dev[0], dev[2]]


class _Metis:
    """``pymetis.part_graph`` replaced: records what it is given, returns ``parts``."""

    def __init__(self, parts):
        self.parts, self.calls = parts, []

    def __call__(self, nparts, adjacency, **kw):
        self.calls.append((nparts, adjacency, kw))
        return 0, list(self.parts)


def test_metis_graph_and_weights_by_hand(monkeypatch):
    """Rows [1, 0, 1, 0], [0, 3, 0, 1], [0, 0, 0, 1] (7 activations, 4 experts): vertices
    0-2 the rows, 3-6 the experts.  Edges in row order: 0-3 (1), 0-5 (1), 1-4 (3), 1-6 (1),
    2-6 (1); each vertex lists its neighbours in that order.  Weights: a row its load at
    least 1 ([2, 4, 1]), an expert the mean load int(max(1, 7 / 4)) = 1.  METIS's parts
    (tokens [0, 1, 1], experts [1, 0, 0, 1]) score 1 on their device, plus 1e-3 x the
    activations from the device's tokens / 7: e0 [1/7e3, 1], e1 [1, 3/7e3], e2 [1 +
    1/7e3, 0], e3 [0, 1 + 2/7e3]: e3 -> 1, e2 -> 0, then the ties at 1 in flat order:
    e0 -> 1, e1 -> 0."""
    import pymetis

    aff = np.array([[1.0, 0, 1, 0], [0, 3, 0, 1], [0, 0, 0, 1]])
    fake = _Metis([0, 1, 1, 1, 0, 0, 1])
    monkeypatch.setattr(pymetis, "part_graph", fake)
    dev, tok, val = metis_placement(aff, 2)
    ((nparts, graph, kw),) = fake.calls
    assert nparts == 2
    assert list(graph.adj_starts) == [0, 2, 4, 5, 6, 7, 8, 10]
    assert list(graph.adjacent) == [3, 5, 4, 6, 6, 0, 1, 0, 1, 2]
    assert kw["eweights"].tolist() == [1, 1, 3, 1, 1, 1, 3, 1, 1, 1]
    assert kw["vweights"] == [2, 4, 1, 1, 1, 1, 1]
    assert dev.tolist() == [1, 0, 0, 1]
    # tokens by best response: loads 2, 4, 1, cap 1.1 x 7 / 2 = 3.85; row 1 (score
    # [3, 1]) -> 0 over the cap as the least used; row 0 ([1, 1]): 6 > 3.85 on 0, 2 on 1;
    # row 2 ([0, 1]) -> 1: local 1 (row 0's e0) + 3 + 1 = 5 of 7
    assert tok.tolist() == [1, 0, 1]
    assert val == pytest.approx(5 / 7, abs=1e-15)


def test_metis_expert_parts_are_rebalanced_by_the_tokens_on_each_device(monkeypatch):
    """METIS puts all 4 experts on device 0 (cap 2), tokens [0, 1]; rows [0, 0, 3, 1] and
    [2, 1, 0, 0] (7 activations).  Device 0's token uses e2 (3) and e3 (1): e2 [1 + 3/7e3,
    0], e3 [1 + 1/7e3, 0] keep device 0; e0 [1, 2/7e3] and e1 [1, 1/7e3] move to device 1."""
    import pymetis

    aff = np.array([[0.0, 0, 3, 1], [2, 1, 0, 0]])
    monkeypatch.setattr(pymetis, "part_graph", _Metis([0, 1, 0, 0, 0, 0]))
    assert metis_placement(aff, 2)[0].tolist() == [1, 1, 0, 0]


def test_metis_part_outweighs_any_token_affinity(monkeypatch):
    """One row of 1000 activations on e1, on device 1; METIS puts e1 on device 0, e0 on 1
    (cap 1).  e1's pull to device 1 is 1e-3 x 1000 / 1000 = 0.001 < 1: METIS's parts stay,
    the tie e0/d1 = e1/d0 = 1 going in flat order."""
    import pymetis

    aff = np.array([[0.0, 1000]])
    monkeypatch.setattr(pymetis, "part_graph", _Metis([1, 1, 0]))
    assert metis_placement(aff, 2)[0].tolist() == [1, 0]


def test_kmeans_finds_the_perfect_blocks():
    dev, tok, val = kmeans_placement(BLOCKS, 2)
    assert val == 1.0
    assert dev[0] == dev[1] != dev[2] == dev[3]
    assert tok.tolist() == [dev[0], dev[2]]
    a = kmeans_placement(BLOCKS, 2)
    b = kmeans_placement(BLOCKS, 2, iters=50, slack=0.1, seed=0)
    assert a[0].tolist() == b[0].tolist() and a[2] == b[2]


# three token rows over 4 experts: [3, 1, 0, 0], [0, 1, 2, 0], [0, 0, 1, 3] (11 activations)
CHAIN = np.array([[3.0, 1, 0, 0], [0, 1, 2, 0], [0, 0, 1, 3]])


def test_kmeans_by_hand():
    """Expert profiles (columns, normalised): e0 [1, 0, 0], e1 [1, 1, 0]/sqrt 2,
    e2 [0, 2, 1]/sqrt 5, e3 [0, 0, 1].  seed 0 picks experts 2, 3 as the centres.
    Similarities to (c0 = e2, c1 = e3): e0 [0, 0], e1 [0.632, 0], e2 [1, 0.447],
    e3 [0.447, 1]; balanced (2 each, highest first, the tie 1 = 1 to the lower flat index
    e2/d0): e2 -> 0, e3 -> 1, e1 -> 0, e0 -> 1: [1, 0, 0, 1].  New centres: c0 =
    mean(e1, e2) = [0.354, 0.801, 0.224], c1 = mean(e0, e3) = [0.5, 0, 0.5]; similarities
    e0 [0.354, 0.5], e1 [0.816, 0.354], e2 [0.816, 0.224], e3 [0.224, 0.5]: the same
    placement, so it stops.  Tokens (loads 4, 3, 4; cap 1.1 x 11 / 2 = 6.05; heaviest
    first, rows 0 then 2 then 1): row 0 (score [1, 3]) -> 1; row 2 ([1, 3]): 8 > 6.05 on 1,
    not the least used -> 0; row 1 ([3, 0]) -> 0 at 7 > 6.05, the least used (tie [4, 4]
    -> device 0).  Local: row 0 e0 3, row 1 e1 + e2 3, row 2 e2 1: LAR 7/11."""
    assert np.random.default_rng(0).choice(4, 2, replace=False).tolist() == [2, 3]
    dev, tok, val = kmeans_placement(CHAIN, 2)
    assert dev.tolist() == [1, 0, 0, 1]
    assert tok.tolist() == [1, 0, 0]
    assert val == pytest.approx(7 / 11, abs=1e-15)
    one = kmeans_placement(CHAIN, 2, iters=1)  # one step already gives this placement
    assert one[0].tolist() == [1, 0, 0, 1] and one[2] == val
    # seed 1 starts from experts 1, 2 and finds the better [0, 0, 1, 1] with tokens
    # [0, 0, 1]: local (3 + 1) + 1 + (1 + 3) = 9 of 11
    dev, tok, val = kmeans_placement(CHAIN, 2, seed=1)
    assert (dev.tolist(), tok.tolist()) == ([0, 0, 1, 1], [0, 0, 1])
    assert val == pytest.approx(9 / 11, abs=1e-15)


def test_metis_recorded_placements_are_balanced():
    """Recorded (METIS's partition is not worked by hand): the expert side always has equal
    counts (2 + 2 for D 2; 2 + 2 + 2 of 6 experts for D 3), tokens by best response."""
    dev, tok, val = metis_placement(CHAIN, 2)
    assert (dev.tolist(), tok.tolist()) == ([0, 0, 1, 1], [0, 0, 1])
    assert val == pytest.approx(9 / 11, abs=1e-15)
    aff = np.array(
        [[3.0, 1, 0, 0, 2, 0], [0, 1, 2, 0, 0, 1], [0, 0, 1, 3, 0, 2], [1, 0, 0, 0, 4, 0]]
    )
    dev, tok, val = metis_placement(aff, 2)
    assert (dev.tolist(), tok.tolist()) == ([0, 0, 1, 1, 0, 1], [0, 1, 1, 0])
    assert val == pytest.approx(20 / 21, abs=1e-15)
    dev, tok, val = metis_placement(aff, 3, slack=0.1)
    assert (dev.tolist(), tok.tolist()) == ([1, 1, 2, 0, 2, 0], [1, 2, 0, 2])
    assert np.bincount(dev).tolist() == [2, 2, 2]
    assert val == pytest.approx(15 / 21, abs=1e-15)


# ---------------------------------------------------------------- speculative shuffling


def test_predicted_devices_seen_rows_and_home_devices():
    """Rows of ids 5, 7 placed on device 2.  ids [6, 5, 9, 7, 6], D 3: positions 0, 2, 4
    are unseen (no embeddings) and stay home at i mod 3 = 0, 2, 1; the others go to 2."""
    t = TokenTable(IDS, EXPERTS, 3)
    d = predicted_devices(t, np.array([2, 2]), np.array([6, 5, 9, 7, 6]), 3)
    assert d.tolist() == [0, 2, 2, 2, 1]
    d = predicted_devices(t, np.array([1, 0]), np.array([7, 5]), 3)
    assert d.tolist() == [0, 1]


# ---------------------------------------------------------------- volume model


def test_comm_volume_by_hand():
    """4 experts on [0, 1, 1, 0]; 2 tokens (home 0, 1) with experts [[1, 2, 3], [0, 3, 1]]
    -> expert devices [[1, 1, 0], [0, 0, 1]]; 10 bytes per vector.
    EP (from home): token 0 at 0: 2 remote experts, 1 remote device; token 1 at 1: 2 remote
    experts, 1 device.  ep = 2 * 4 * 10 / 2 = 40, ep_dedup = 2 * 2 * 10 / 2 = 20.
    s-MoE with tokens on [0, 0]: token 0 as EP (2, 1); token 1 at 0: 1 remote expert
    (on 1), 1 device: 2 * 3 * 10 / 2 = 30, dedup 2 * 2 * 10 / 2 = 20; shuffle: token 1
    moved: 1 * 10 / 2 = 5."""
    v = comm_volume(np.array([[1, 2, 3], [0, 3, 1]]), np.array([0, 1, 1, 0]), np.array([0, 0]),
                    2, 10.0)  # fmt: skip
    assert v == {"ep": 40.0, "ep_dedup": 20.0, "smoe": 35.0, "smoe_dedup": 25.0, "shuffle": 5.0}


def test_comm_volume_home_is_index_mod_devices():
    """3 tokens, D 2 (homes 0, 1, 0), one expert each on devices [1, 0]: experts [[0], [1],
    [1]] -> devices 1, 0, 0.  EP: token 0 remote (1 != 0), token 1 remote (0 != 1), token 2
    local: 2 * 2 * 8 / 3.  Tokens shuffled to [1, 0, 0]: nothing remote; token 0 and 1
    moved: shuffle 2 * 8 / 3."""
    v = comm_volume(np.array([[0], [1], [1]]), np.array([1, 0]), np.array([1, 0, 0]), 2, 8.0)
    assert v["ep"] == pytest.approx(32 / 3) and v["ep_dedup"] == pytest.approx(32 / 3)
    assert v["shuffle"] == pytest.approx(16 / 3)
    assert v["smoe"] == pytest.approx(16 / 3) and v["smoe_dedup"] == pytest.approx(16 / 3)


def test_kmeans_moves_its_centres_until_the_placement_holds():
    """Rows [3, 2, 2, 0, 2, 0], [0, 1, 0, 2, 3, 3]; expert profiles e0 [1, 0], e1 [2, 1]/
    sqrt 5, e2 [1, 0], e3 [0, 1], e4 [2, 3]/sqrt 13, e5 [0, 1]; cap 3.  seed 0 picks
    experts 4, 3 as the centres.  Step 1, similarities e0 [.555, 0], e1 [.868, .447], e2
    [.555, 0], e3 [.832, 1], e4 [1, .832], e5 [.832, 1]: e3 -> 1, e4 -> 0, e5 -> 1 (the
    ones), e1 -> 0, e0 -> 0 (ties in flat order), e2 -> 1: [0, 0, 1, 1, 0, 1].  Step 2,
    centres mean(e0, e1, e4) = [.816, .426] and mean(e2, e3, e5) = [.333, .667]: e1 [.921,
    .596], e0 = e2 [.816, .333], e4 [.808, .740], e3 = e5 [.426, .667]: e1, e0, e2 fill
    device 0, e4, e3, e5 take device 1: [0, 0, 0, 1, 1, 1].  Step 3 places alike: stop.
    Tokens (loads 9, 9, cap 9.9): row 0 (score [7, 2]) -> 0, row 1 ([1, 8]) -> 1: LAR
    15/18.  One step only stops at [0, 0, 1, 1, 0, 1]."""
    aff = np.array([[3.0, 2, 2, 0, 2, 0], [0, 1, 0, 2, 3, 3]])
    assert np.random.default_rng(0).choice(6, 2, replace=False).tolist() == [4, 3]
    dev, tok, val = kmeans_placement(aff, 2)
    assert dev.tolist() == [0, 0, 0, 1, 1, 1] and tok.tolist() == [0, 1]
    assert val == pytest.approx(15 / 18, abs=1e-15)
    assert kmeans_placement(aff, 2, iters=1)[0].tolist() == [0, 0, 1, 1, 0, 1]


def test_kmeans_an_empty_device_keeps_its_centre():
    """Rows [2, 2, 0, 2], [0, 1, 2, 0]; profiles e0 [1, 0], e1 [2, 1]/sqrt 5, e2 [0, 1], e3
    [1, 0]; 3 devices, cap 2.  seed 1 picks experts 1, 0, 3: centres e1, e0, e3 (the last
    two equal).  Step 1, similarities e0 [.894, 1, 1], e1 [1, .894, .894], e2 [.447, 0, 0],
    e3 [.894, 1, 1]: e0 -> 1, e1 -> 0, e3 -> 1, e2 -> 0; device 2 is empty and keeps its
    centre [1, 0].  Step 2, centres mean(e1, e2) = [.447, .724], [1, 0], [1, 0]: e0, e3 ->
    1, e1 (.894 on 1, full) -> 2, e2 -> 0: [1, 2, 0, 1], which step 3 keeps.  Tokens
    (cap 1.1 x 9 / 3 = 3.3): row 0 (load 6, scores [0, 4, 2]) fits nowhere and goes to the
    least used, device 0; row 1 (scores [2, 0, 1]) -> 0 is full and not the least used,
    2 has room: [0, 2], LAR 1/9."""
    aff = np.array([[2.0, 2, 0, 2], [0, 1, 2, 0]])
    assert np.random.default_rng(1).choice(4, 3, replace=False).tolist() == [1, 0, 3]
    dev, tok, val = kmeans_placement(aff, 3, seed=1)
    assert dev.tolist() == [1, 2, 0, 1] and tok.tolist() == [0, 2]
    assert val == pytest.approx(1 / 9, abs=1e-15)


def test_kmeans_normalises_each_profile_by_its_own_norm():
    """Rows [1, 2, 3, 0], [0, 0, 0, 1]: e0, e1, e2 all point along [1, 0] (norms 1, 2, 3),
    e3 along [0, 1]; cap 2.  seed 0: centres e2 = [1, 0], e3 = [0, 1].  Normalised, e0, e1
    and e2 tie at 1 on device 0: the lower experts e0, e1 take it, e2 goes to 1: [0, 0, 1,
    1], which step 2 keeps (centres [1, 0] and [.5, .5]).  Tokens (cap 3.85): row 0 (load
    6, scores [3, 3]) -> 0 as the least used, row 1 -> 1: LAR 4/7."""
    aff = np.array([[1.0, 2, 3, 0], [0, 0, 0, 1]])
    dev, tok, val = kmeans_placement(aff, 2)
    assert dev.tolist() == [0, 0, 1, 1] and tok.tolist() == [0, 1]
    assert val == pytest.approx(4 / 7, abs=1e-15)
