"""Exact expectations of BuddyMoE (``fsedp.sw.policies.buddy``) on cases worked out by hand:
two to five experts and a few tokens, so that every count, every conditional ``q``, every
buddy list and every gate's decision can be checked on paper.

The online cases share one hand-made profile (:func:`hand`): four experts, ``q`` rows

* expert 0: ``[0, .5, .3, .2]``  -> buddies ``[1, 2, 3]``
* expert 1: ``[.5, 0, .3, .2]``  -> buddies ``[0, 2, 3]``
* expert 2: ``[.3, .5, 0, .2]``  -> buddies ``[1, 0, 3]``
* expert 3: ``[.1, .6, .3, 0]``  -> buddies ``[1, 2, 0]``

and, unless a case says otherwise, experts 0 and 1 resident, 2 and 3 not.
"""

import re
import warnings
from dataclasses import FrozenInstanceError, fields
from types import SimpleNamespace

import numpy as np
import pytest

from fsedp.errors import InputError
from fsedp.sw.policies.buddy import (
    BuddyConfig,
    BuddyProfile,
    _bypass,
    algorithm1_compiled,
    algorithm1_loop,
    algorithm1_vectorized,
    buddy_lists,
    coactivation,
    conditional,
    random_substitute,
    substitute,
    substitute_cold,
    tae,
)

Q = np.array(
    [
        [0.0, 0.5, 0.3, 0.2],
        [0.5, 0.0, 0.3, 0.2],
        [0.3, 0.5, 0.0, 0.2],
        [0.1, 0.6, 0.3, 0.0],
    ]
)
TABLE = np.array([[1, 2, 3], [0, 2, 3], [1, 0, 3], [1, 2, 0]])
RES = np.array([True, True, False, False])
#: log probabilities [0, -2, 0, -2]: mean -1, std 1, so z^ = [1, -1, 1, -1] (to 1e-9)
PROBS_Z = np.exp(np.array([[0.0, -2.0, 0.0, -2.0]]))


def hand(tau=0.0, table=TABLE, layers=1, **kw):
    """The hand profile of the module docstring (``tau`` fixed, every layer the same)."""
    return SimpleNamespace(
        cfg=BuddyConfig(**kw), E=4, q=[Q] * layers, table=[table] * layers, tau=[tau] * layers
    )


def sub(ids, weights, res=RES, probs=None, hop=None, unit_bytes=None, prof=None, **kw):
    prof = prof or hand(**kw)
    ids = np.array(ids)
    probs = np.ones((len(ids), 4)) if probs is None else probs
    return substitute(
        prof, 0, ids, np.array(weights, dtype=float), probs, np.array(res), hop, unit_bytes
    )


def counts(info):
    keys = ("tae_blocked", "margin_blocked", "residency_bypass", "substituted", "no_buddy")
    return tuple(info[k] for k in keys)


# ---------------------------------------------------------------- co-activation counts


IDS = np.array([[0, 1], [0, 1], [0, 2]])
W = np.array([[0.7, 0.3], [0.6, 0.4], [0.9, 0.1]])


def test_coactivation_binary_counts_both_orders_of_each_pair():
    """Tokens {0,1}, {0,1}, {0,2}: M[0,1] = M[1,0] = 2, M[0,2] = M[2,0] = 1; expert 3 is
    never used (a row and a column of zeros); no diagonal."""
    m = coactivation(IDS, 4)
    assert m.shape == (4, 4) and m.dtype == np.float64
    assert m.tolist() == [[0, 2, 1, 0], [2, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]


def test_coactivation_three_slots_count_every_other_slot():
    """One token {0, 1, 2}: every off-diagonal pair of the three counts once."""
    m = coactivation(np.array([[0, 1, 2]]), 3)
    assert m.tolist() == [[0, 1, 1], [1, 0, 1], [1, 1, 0]]


def test_coactivation_defaults_weigh_nothing_down():
    """``warmup`` defaults to 0 (a warm-up weight alone changes nothing) and
    ``warmup_weight`` to 1 (a warm-up length alone changes nothing)."""
    base = coactivation(IDS, 4)
    assert np.array_equal(coactivation(IDS, 4, warmup_weight=0.5), base)
    assert np.array_equal(coactivation(IDS, 4, warmup=2), base)
    assert np.array_equal(coactivation(IDS, 4, None, 0, 1.0), base)


def test_coactivation_warmup_tokens_count_their_weight():
    """warmup 1 at 0.5: the first token's pair counts 0.5, so M[0,1] = 0.5 + 1 = 1.5;
    warmup 2 at 0.25: M[0,1] = 0.25 + 0.25 = 0.5, M[0,2] (third token) stays 1."""
    m = coactivation(IDS, 4, warmup=1, warmup_weight=0.5)
    assert (m[0, 1], m[1, 0], m[0, 2], m[2, 0]) == (1.5, 1.5, 1.0, 1.0)
    m = coactivation(IDS, 4, warmup=2, warmup_weight=0.25)
    assert (m[0, 1], m[0, 2]) == (0.5, 1.0)


def test_coactivation_weighted_by_the_smaller_probability():
    """Probability-weighted: M[0,1] = min(.7,.3) + min(.6,.4) = .3 + .4 = .7,
    M[0,2] = min(.9,.1) = .1; with warm-up 1 at 0.5: M[0,1] = .15 + .4 = .55."""
    m = coactivation(IDS, 4, W)
    assert m[0, 1] == pytest.approx(0.7) and m[1, 0] == pytest.approx(0.7)
    assert m[0, 2] == pytest.approx(0.1) and m[2, 0] == pytest.approx(0.1)
    assert m[1, 2] == 0 and m.sum() == pytest.approx(1.6)
    m = coactivation(IDS, 4, W, warmup=1, warmup_weight=0.5)
    assert m[0, 1] == pytest.approx(0.55) and m[0, 2] == pytest.approx(0.1)


# ---------------------------------------------------------------- conditional q


M3 = np.array([[5, 2, 1, 0], [2, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_conditional_without_smoothing():
    """eps 0: row 0 = [0, 2, 1, 0] / 3 (its diagonal 5 ignored), rows 1 and 2 all on 0,
    row 3 (never co-activated, total 0) all zeros, not NaN."""
    q = conditional(M3, eps=0.0)
    assert q.dtype == np.float64 and q.shape == (4, 4)
    assert q[0].tolist() == pytest.approx([0, 2 / 3, 1 / 3, 0])
    assert q[1].tolist() == [1.0, 0, 0, 0] and q[2].tolist() == [1.0, 0, 0, 0]
    assert q[3].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_conditional_laplace_smoothing_default_eps():
    """eps = 1e-3 (the default) is added to every off-diagonal entry: row 0 =
    [0, 2.001, 1.001, 0.001] / 3.003, row 3 = [1, 1, 1, 0] / 3."""
    q = conditional(M3)
    assert np.array_equal(q, conditional(M3, 1e-3))
    assert q[0].tolist() == pytest.approx([0, 2.001 / 3.003, 1.001 / 3.003, 0.001 / 3.003])
    assert q[1].tolist() == pytest.approx([2.001 / 2.003, 0, 0.001 / 2.003, 0.001 / 2.003])
    assert q[3].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0])
    assert np.diag(q).tolist() == [0.0] * 4


def test_conditional_of_integer_counts_is_float():
    """Integer counts with an integer eps 0 still give float q: row 0 = [0, 2, 1, 0] / 3."""
    q = conditional(M3, 0)
    assert q.dtype == np.float64
    assert q[0].tolist() == pytest.approx([0, 2 / 3, 1 / 3, 0])


def test_conditional_rows_without_counts_are_zeros_not_leftover_memory():
    """A row with total 0 is written as zeros even where the allocator hands out memory that
    held other numbers (freed arrays of 7s just before), and no warning is raised."""
    m = np.zeros((4, 4))
    m[0, 1] = m[1, 0] = 1.0
    junk = [np.full((4, 4), 7.0) for _ in range(8)]
    del junk
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = conditional(m, 0.0)
    assert q.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0], [0] * 4, [0] * 4]


# ---------------------------------------------------------------- CFT buddy lists


def lists(row, alpha, k_max=16):
    """The buddy list of expert 0 whose q row is ``row``."""
    q = np.zeros((len(row), len(row)))
    q[0] = row
    return buddy_lists(q, alpha, k_max)[0].tolist()


def test_buddy_list_is_the_shortest_prefix_reaching_alpha():
    """q row [0, .5, .25, .25]: order 1, 2, 3 (the tie 2, 3 kept in index order), cumulative
    .5, .75, 1.  alpha .5 -> [1]; just above .5 -> [1, 2]; .75 -> [1, 2]; just above
    .75 -> all three; 1 -> all three."""
    row = [0, 0.5, 0.25, 0.25]
    assert lists(row, 0.5) == [1]
    assert lists(row, 0.5 + 1e-9) == [1, 2]
    assert lists(row, 0.75) == [1, 2]
    assert lists(row, 0.75 + 1e-9) == [1, 2, 3]
    assert lists(row, 1.0) == [1, 2, 3]
    assert lists([0, 0.25, 0.5, 0.25], 1.0) == [2, 1, 3]  # the tie: 1 before 3


def test_buddy_list_ties_in_index_order_among_many():
    """21 experts, row 0 = [0] + [1/15, 1/30] x 10: ten peers at 1/15 (odd ids), ten at
    1/30 (even ids); all twenty are needed for alpha 1, ties kept in index order: 1, 3, ...,
    19, then 2, 4, ..., 20 (an unstable sort mixes them at this size)."""
    row = [0.0] + [1 / 15, 1 / 30] * 10
    assert lists(row, 1.0, 20) == list(range(1, 20, 2)) + list(range(2, 21, 2))


def test_buddy_list_alpha_reached_up_to_rounding():
    """q row [0, .1, .2, .7]: cumulative .7, .7 + .2 = 0.8999999999999999 in floating point,
    1.  alpha .9 is reached by the first two (within 1e-12), not three."""
    assert lists([0, 0.1, 0.2, 0.7], 0.9) == [3, 2]


def test_buddy_list_capped_at_k_max_and_never_empty():
    """alpha 1 wants all three, k_max 2 keeps the best two, k_max 1 the best one; a tiny
    alpha still gives one buddy."""
    row = [0, 0.5, 0.25, 0.25]
    assert lists(row, 1.0, 2) == [1, 2]
    assert lists(row, 1.0, 1) == [1]
    assert lists(row, 1e-6) == [1]
    assert lists(row, 1e-6, 1) == [1]


def test_buddy_lists_of_every_expert_exclude_itself():
    """The hand q gives the module docstring's lists (alpha 1, k_max 16); a row of zeros
    (no co-activation) lists every other expert in index order."""
    out = buddy_lists(Q, 1.0, 16)
    assert [b.tolist() for b in out] == TABLE.tolist()
    assert all(b.dtype == np.int64 for b in out)
    z = buddy_lists(np.zeros((3, 3)), 0.5, 16)
    assert [b.tolist() for b in z] == [[1, 2], [0, 2], [0, 1]]


@pytest.mark.parametrize(
    "alpha, k_max, msg",
    [
        (0, 4, "alpha must be in (0, 1], not 0"),
        (-0.5, 4, "alpha must be in (0, 1], not -0.5"),
        (1.0000001, 4, "alpha must be in (0, 1], not 1.0000001"),
        (0.5, 0, "k_max must be >= 1, not 0"),
    ],
)
def test_buddy_lists_refusals(alpha, k_max, msg):
    with pytest.raises(ValueError) as e:
        buddy_lists(Q, alpha, k_max)
    assert str(e.value) == msg


# ---------------------------------------------------------------- TAE


def test_tae_by_hand():
    """[.5, .5] -> ln 2 / ln 2 = 1; [1, 0] -> 0 exactly; [.25] x 4 -> 1;
    [.5, .25, .25] -> (.5 ln 2 + .5 ln 4) / ln 3 = 1.5 ln 2 / ln 3;
    [.75, .25] -> (.75 ln(4/3) + .25 ln 4) / ln 2 = 2 - .75 log2 3."""
    assert tae(np.array([[0.5, 0.5], [1.0, 0.0]])).tolist() == [1.0, 0.0]
    assert tae(np.full((1, 4), 0.25))[0] == pytest.approx(1.0, abs=1e-15)
    assert tae(np.array([[0.5, 0.25, 0.25]]))[0] == pytest.approx(1.5 * np.log(2) / np.log(3))
    assert tae(np.array([[0.75, 0.25]]))[0] == pytest.approx(2 - 0.75 * np.log2(3))


def test_tae_renormalises_the_top_k():
    """[.2, .2] is [.5, .5] after renormalisation: 1; [.3, .1] is [.75, .25]."""
    t = tae(np.array([[0.2, 0.2], [0.3, 0.1]]))
    assert t[0] == pytest.approx(1.0, abs=1e-15)
    assert t[1] == pytest.approx(2 - 0.75 * np.log2(3))


def test_tae_of_top1_is_zero():
    """k = 1: no choice, entropy 0 for every token (not 0 / ln 1)."""
    t = tae(np.array([[1.0], [0.3]]))
    assert t.tolist() == [0.0, 0.0] and t.dtype == np.float64


def test_tae_temperature():
    """T = 2: [.8, .2] -> sqrt -> ratio 2 : 1 -> [2/3, 1/3]: H = ln 3 - (2/3) ln 2, over ln 2;
    T = 0.5: squares -> [.64, .04] -> [16/17, 1/17]: H = ln 17 - (16/17) ln 16, over ln 2.
    The default T is 1 (no power: [1, 0] keeps its exact 0)."""
    w = np.array([[0.8, 0.2]])
    assert tae(w, 2.0)[0] == pytest.approx((np.log(3) - 2 / 3 * np.log(2)) / np.log(2))
    assert tae(w, 0.5)[0] == pytest.approx((np.log(17) - 16 / 17 * np.log(16)) / np.log(2))
    assert tae(w)[0] == tae(w, 1.0)[0] == pytest.approx(-(0.8 * np.log2(0.8) + 0.2 * np.log2(0.2)))
    assert tae(np.array([[1.0, 0.0]]), 1.0)[0] == 0.0


# ---------------------------------------------------------------- the configuration


def test_config_defaults_are_the_papers():
    cfg = BuddyConfig()
    assert {f.name: getattr(cfg, f.name) for f in fields(cfg)} == dict(
        alpha=0.95,
        k_max=16,
        weighted=False,
        eps=1e-3,
        warmup=0,
        warmup_weight=0.5,
        tau=None,
        tau_pct=15.0,
        temperature=1.0,
        gamma=None,
        beta=None,
        budget_bytes=None,
        eta=0.0,
        kappa=0.0,
        diversity=0.5,
        unique=True,
        search=16,
        rho=None,
        random_choice=False,
        seed=0,
    )


#: every knob at each end of its range: accepted
EDGES_OK = [
    dict(alpha=1.0),
    dict(alpha=1e-9),
    dict(k_max=1),
    dict(eps=0.0),
    dict(warmup=0),
    dict(warmup_weight=0.0),
    dict(warmup_weight=1.0),
    dict(tau=0.0),
    dict(tau=1.0),
    dict(tau_pct=0.0),
    dict(tau_pct=100.0),
    dict(temperature=1e-9),
    dict(gamma=0.0),
    dict(gamma=1.0),
    dict(beta=0.0),
    dict(beta=1.0),
    dict(budget_bytes=0.0),
    dict(eta=0.0),
    dict(kappa=0.0),
    dict(kappa=1.0),
    dict(diversity=0.0),
    dict(diversity=1.0),
    dict(search=1),
    dict(rho=0),
]


@pytest.mark.parametrize("kw", EDGES_OK)
def test_config_accepts_the_ends_of_every_range(kw):
    cfg = BuddyConfig(**kw)
    ((name, value),) = kw.items()
    assert getattr(cfg, name) == value


@pytest.mark.parametrize(
    "name, value",
    [
        ("alpha", 0.0),
        ("alpha", 1.5),
        ("k_max", 0),
        ("eps", -1e-9),
        ("warmup", -1),
        ("warmup_weight", -0.1),
        ("warmup_weight", 1.1),
        ("tau", -0.1),
        ("tau", 1.1),
        ("tau_pct", -1.0),
        ("tau_pct", 100.5),
        ("temperature", 0.0),
        ("gamma", -0.1),
        ("gamma", 1.1),
        ("beta", -0.1),
        ("beta", 1.1),
        ("budget_bytes", -1.0),
        ("eta", -0.5),
        ("kappa", -0.1),
        ("kappa", 1.1),
        ("diversity", -0.1),
        ("diversity", 1.1),
        ("search", 0),
        ("rho", -1),
    ],
)
def test_config_refuses_every_value_out_of_range(name, value):
    with pytest.raises(InputError) as e:
        BuddyConfig(**{name: value})
    assert e.value.file == "<params>" and e.value.field == name
    assert str(e.value) == f"<params>: {name}: out of range: {value!r}"


# ---------------------------------------------------------------- the offline profile


#: layer 0: tokens {0,1}, {0,1}, {0,2}; layer 1: {1,2}, {1,2}, {0,1}
P_IDS = np.array([[[0, 1], [1, 2]], [[0, 1], [1, 2]], [[0, 2], [0, 1]]])
P_W = np.array([[[0.5, 0.5], [0.5, 0.5]], [[0.75, 0.25], [0.5, 0.5]], [[0.5, 0.5], [0.9, 0.1]]])


def test_profile_binary_per_layer():
    """eps 0, alpha 1, k_max 3, tau 0.3 fixed.  Layer 0: M[0,1] = 2, M[0,2] = 1, so
    q0 = [0, 2/3, 1/3], q1 = q2 = [1, 0, 0]; lists [1, 2], [0], [0] (table padded with -1);
    mean list size 4/3.  Layer 1: M[1,2] = 2, M[0,1] = 1: q1 = [1/3, 0, 2/3] -> [2, 0],
    q0 = q2 = all on 1 -> [1]; mean 4/3."""
    prof = BuddyProfile(P_IDS, P_W, 3, BuddyConfig(eps=0.0, alpha=1.0, k_max=3, tau=0.3))
    assert prof.E == 3 and prof.layers == 2
    assert prof.q[0].ravel().tolist() == pytest.approx([0, 2 / 3, 1 / 3, 1, 0, 0, 1, 0, 0])
    assert [b.tolist() for b in prof.lists[0]] == [[1, 2], [0], [0]]
    assert prof.table[0].tolist() == [[1, 2, -1], [0, -1, -1], [0, -1, -1]]
    assert prof.table[0].dtype == np.int64
    assert prof.table[1].tolist() == [[1, -1, -1], [2, 0, -1], [1, -1, -1]]
    assert prof.list_sizes() == pytest.approx([4 / 3, 4 / 3])
    assert prof.tau == [0.3, 0.3]


def test_profile_of_one_layer():
    """Layers are the second axis of ids [N, L, k]: one layer of top-2 gives one table."""
    prof = BuddyProfile(P_IDS[:, :1], P_W[:, :1], 3, BuddyConfig(tau=0.0))
    assert prof.layers == 1 and len(prof.table) == len(prof.tau) == 1


def test_config_is_frozen():
    with pytest.raises(FrozenInstanceError):
        BuddyConfig().alpha = 0.5


def test_profile_weighted_and_warmup():
    """weighted: layer 0 M[0,1] = min(.5,.5) + min(.75,.25) = .75, M[0,2] = .5:
    q0 = [0, .6, .4]; warm-up 1 at 0.5 (binary): M[0,1] = .5 + 1 = 1.5, M[0,2] = 1:
    q0 = [0, .6, .4] again; binary without warm-up: [0, 2/3, 1/3].  alpha .65 tells them
    apart: .6 < .65 needs both buddies, 2/3 >= .65 one."""
    kw = dict(eps=0.0, alpha=0.65, k_max=3, tau=0.0)
    for cfg in (
        BuddyConfig(weighted=True, **kw),
        BuddyConfig(warmup=1, warmup_weight=0.5, **kw),
    ):
        prof = BuddyProfile(P_IDS, P_W, 3, cfg)
        assert prof.q[0][0].tolist() == pytest.approx([0, 0.6, 0.4])
        assert prof.lists[0][0].tolist() == [1, 2]
    prof = BuddyProfile(P_IDS, P_W, 3, BuddyConfig(**kw))
    assert prof.lists[0][0].tolist() == [1]


def test_profile_default_eps_smooths():
    """Default eps 1e-3: layer 0 row 1 = [2.001, 0, 0.001] / 2.002."""
    prof = BuddyProfile(P_IDS, P_W, 3, BuddyConfig(tau=0.0))
    assert prof.q[0][1].tolist() == pytest.approx([2.001 / 2.002, 0, 0.001 / 2.002])


def test_profile_tau_percentile_of_the_layers_tae():
    """Layer 0's TAE: [1, 2 - .75 log2 3 = 0.811278, 1].  The 15th percentile (default)
    interpolates at rank .15 x 2 = 0.3: 0.811278 + 0.3 (1 - 0.811278); the 50th is 1.
    Layer 1: [1, 1, TAE(.9, .1) = 0.468996]; its 0th percentile is 0.468996.  A fixed
    tau 0 is used as it is (not the percentile)."""
    t = 2 - 0.75 * np.log2(3)
    prof = BuddyProfile(P_IDS, P_W, 3, BuddyConfig())
    assert prof.tau[0] == pytest.approx(t + 0.3 * (1 - t))
    assert prof.tau == BuddyProfile(P_IDS, P_W, 3, BuddyConfig(tau_pct=15.0)).tau
    prof = BuddyProfile(P_IDS, P_W, 3, BuddyConfig(tau_pct=50.0))
    assert prof.tau[0] == pytest.approx(1.0)
    prof = BuddyProfile(P_IDS, P_W, 3, BuddyConfig(tau_pct=0.0))
    h = -(0.9 * np.log2(0.9) + 0.1 * np.log2(0.1))
    assert prof.tau == pytest.approx([t, h])
    assert BuddyProfile(P_IDS, P_W, 3, BuddyConfig(tau=0.0)).tau == [0.0, 0.0]


def test_profile_tau_at_temperature():
    """T = 2, 0th percentile of layer 0: [.75, .25] -> sqrt -> [sqrt 3, 1] / (1 + sqrt 3)."""
    p = np.sqrt(3) / (1 + np.sqrt(3))
    h = -(p * np.log2(p) + (1 - p) * np.log2(1 - p))
    prof = BuddyProfile(P_IDS, P_W, 3, BuddyConfig(tau_pct=0.0, temperature=2.0))
    assert prof.tau[0] == pytest.approx(h)


# ---------------------------------------------------------------- the residency gate


def test_bypass_fixed_beta_at_the_threshold():
    """1 of 4 requested experts missing: share .25; beta .25 bypasses (>=), .26 does not;
    no beta: never; nothing requested: never (no division)."""
    assert _bypass(BuddyConfig(beta=0.25), 4, 1, None) is True
    assert _bypass(BuddyConfig(beta=0.26), 4, 1, None) is False
    assert _bypass(BuddyConfig(), 4, 4, None) is False
    assert _bypass(BuddyConfig(beta=0.0), 0, 0, None) is False
    assert _bypass(BuddyConfig(beta=1.0), 1, 1, None) is True


def test_bypass_transfer_budget_at_the_threshold():
    """2 misses of 1 byte: a budget of 2 bytes fits them (<=): bypass; 1.5 does not; the
    budget rules over beta; without a unit size (None or 0) beta decides."""
    assert _bypass(BuddyConfig(budget_bytes=2.0), 4, 2, 1.0) is True
    assert _bypass(BuddyConfig(budget_bytes=1.5), 4, 2, 1.0) is False
    assert _bypass(BuddyConfig(budget_bytes=1.5, beta=0.5), 4, 2, 1.0) is False
    assert _bypass(BuddyConfig(budget_bytes=2.0, beta=0.5), 4, 2, None) is True
    assert _bypass(BuddyConfig(budget_bytes=2.0, beta=0.6), 4, 2, 0.0) is False
    assert _bypass(BuddyConfig(budget_bytes=2.0), 4, 2, None) is False


def test_substitute_residency_gate_counts_unique_experts():
    """Tokens {0, 2} and {2, 1}: requested experts {0, 1, 2}, one missing (2): share 1/3 of
    the step's distinct experts (not 2 of 4 slots).  beta 1/3 bypasses: ids unchanged,
    bypass 1, nothing else counted; beta .34 lets both tokens substitute."""
    ids, w = [[0, 2], [2, 1]], [[0.6, 0.4], [0.6, 0.4]]
    out, info = sub(ids, w, beta=1 / 3)
    assert out.tolist() == ids and info["missing"] == 2 and counts(info) == (0, 0, 1, 0, 0)
    out, info = sub(ids, w, beta=0.34)
    assert out.tolist() == [[0, 1], [0, 1]] and counts(info) == (0, 0, 0, 2, 0)


def test_substitute_transfer_budget_gate():
    """Missing experts 2 and 3 (2 distinct) of 1 byte each: budget 2 bytes fits them: the
    originals are fetched (bypass); 1 byte does not: substitution."""
    out, info = sub([[2, 3]], [[0.6, 0.4]], unit_bytes=1.0, budget_bytes=2.0)
    assert out.tolist() == [[2, 3]] and info["residency_bypass"] == 1
    out, info = sub([[2, 3]], [[0.6, 0.4]], unit_bytes=1.0, budget_bytes=1.0)
    assert out.tolist() == [[0, 1]] and info["residency_bypass"] == 0


# ---------------------------------------------------------------- substitution


def test_substitute_nothing_missing_returns_a_copy():
    """Every expert resident: the ids come back (int64, a copy), all counts 0."""
    ids = np.array([[0, 1]], dtype=np.int32)
    out, info = substitute(hand(), 0, ids, np.array([[0.5, 0.5]]), None, RES)
    assert out.tolist() == [[0, 1]] and out.dtype == np.int64
    assert info == dict(
        tokens=1,
        missing=0,
        tae_blocked=0,
        margin_blocked=0,
        residency_bypass=0,
        substituted=0,
        no_buddy=0,
    )


def test_substitute_by_hand_smallest_weight_first():
    """Token {2 (w .6), 3 (w .4)}: 3 first (smaller weight): buddies 1 (q .6), 2 (off
    chip), 0 (q .1): 1.  Then 2: buddies 1 (now used), 0 (q .3): 0.  Result [0, 1]; the
    caller's array is not modified."""
    ids = np.array([[2, 3]])
    out, info = substitute(hand(), 0, ids, np.array([[0.6, 0.4]]), None, RES)
    assert out.tolist() == [[0, 1]] and out.dtype == np.int64 and ids.tolist() == [[2, 3]]
    assert info["tokens"] == 1 and info["missing"] == 2 and counts(info) == (0, 0, 0, 2, 0)


def test_substitute_budget_rho_replaces_the_lightest_first():
    """rho 1: only 3 (weight .4) is replaced (by 1), 2 (weight .6) stays to be fetched;
    with the weights the other way round 2 goes (to its first buddy 1) and 3 stays;
    rho 0: nothing; rho None (default) and rho 2 both replace both."""
    assert sub([[2, 3]], [[0.6, 0.4]], rho=1)[0].tolist() == [[2, 1]]
    assert sub([[2, 3]], [[0.4, 0.6]], rho=1)[0].tolist() == [[1, 3]]
    out, info = sub([[2, 3]], [[0.6, 0.4]], rho=0)
    assert out.tolist() == [[2, 3]] and counts(info) == (0, 0, 0, 0, 0)
    assert sub([[2, 3]], [[0.6, 0.4]], rho=2)[0].tolist() == [[0, 1]]
    assert sub([[2, 3]], [[0.6, 0.4]], rho=None)[0].tolist() == [[0, 1]]


def test_substitute_equal_weights_visit_in_slot_order():
    """Weights [.5, .5]: the stable order visits slot 0 (expert 2) first: 2 -> 1 (q .5);
    then 3: 1 used, 0 (q .1): [1, 0]."""
    assert sub([[2, 3]], [[0.5, 0.5]])[0].tolist() == [[1, 0]]


def test_substitute_each_token_on_its_own():
    """Two tokens: {2, 3} -> [0, 1] as above; {0, 3} -> 3's buddies 1 (free): [0, 1];
    {1, 2}: 2's buddies 1 (the token's), 0: [1, 0]."""
    out, info = sub([[2, 3], [0, 3], [1, 2]], [[0.6, 0.4], [0.6, 0.4], [0.6, 0.4]])
    assert out.tolist() == [[0, 1], [0, 1], [1, 0]]
    assert info["missing"] == 4 and counts(info) == (0, 0, 0, 4, 0)


def test_substitute_no_buddy():
    """Only 0 resident.  {0, 2}: 2's buddies 1 (off chip), 0 (the token's), 3 (off chip):
    none, counted; {1, 3} would take 0 (3's third buddy)."""
    res = [True, False, False, False]
    out, info = sub([[0, 2], [1, 3]], [[0.6, 0.4], [0.6, 0.4]], res=res)
    assert out.tolist() == [[0, 2], [1, 0]]
    assert info["missing"] == 3 and counts(info) == (0, 0, 0, 1, 2)


def test_substitute_search_limit_h():
    """Only 0 resident; token {1, 3}: 3's buddies 1, 2, 0: H = 2 does not reach 0,
    H = 3 does; 1's buddies 0, 2, 3: H = 1 reaches 0 (first) if 3 has not taken it."""
    res = [True, False, False, False]
    out, info = sub([[1, 3]], [[0.6, 0.4]], res=res, search=2)
    assert out.tolist() == [[0, 3]] and counts(info) == (0, 0, 0, 1, 1)
    out, info = sub([[1, 3]], [[0.6, 0.4]], res=res, search=3)
    assert out.tolist() == [[1, 0]] and counts(info) == (0, 0, 0, 1, 1)
    out, info = sub([[1, 3]], [[0.6, 0.4]], res=res, search=1)
    assert out.tolist() == [[0, 3]]


def test_substitute_padding_is_never_a_buddy():
    """3's list is [1, -1, -1] (padded): with only 0 resident the -1 slots (read as
    expert 0) are skipped: no buddy for 3.  With rho 1, a failed search spends no budget:
    token {2, 3} (3 first, none) still replaces 2 by 0."""
    table = TABLE.copy()
    table[3] = [1, -1, -1]
    res = [True, False, False, False]
    out, info = sub([[3]], [[1.0]], res=res, prof=hand(table=table, tau=-1.0))
    assert out.tolist() == [[3]] and counts(info) == (0, 0, 0, 0, 1)
    out, info = sub([[2, 3]], [[0.6, 0.4]], res=res, prof=hand(table=table, rho=1))
    assert out.tolist() == [[0, 3]] and counts(info) == (0, 0, 0, 1, 1)


def test_substitute_reuse_allowed_with_diversity():
    """unique=False.  Token {1, 2}: 2's candidates 1 (q .5, used once: x diversity) and
    0 (q .3).  diversity .5 (default): .25 < .3 -> 0; diversity 1: .5 -> 1 (reused);
    diversity .7: .35 -> 1.  unique (default): 1 is forbidden -> 0."""
    w = [[0.6, 0.4]]
    assert sub([[1, 2]], w, unique=False)[0].tolist() == [[1, 0]]
    assert sub([[1, 2]], w, unique=False, diversity=0.5)[0].tolist() == [[1, 0]]
    assert sub([[1, 2]], w, unique=False, diversity=1.0)[0].tolist() == [[1, 1]]
    assert sub([[1, 2]], w, unique=False, diversity=0.7)[0].tolist() == [[1, 1]]
    assert sub([[1, 2]], w, unique=True, diversity=1.0)[0].tolist() == [[1, 0]]


def test_substitute_diversity_counts_earlier_substitutions():
    """unique=False, token {2, 3} (3 first): 3 -> 1 (q .6 vs .1).  Then 2: 1 was picked
    once (q .5 x .5 = .25), 0 never (q .3): 0.  With diversity .7: .35 > .3 -> 1 again."""
    assert sub([[2, 3]], [[0.6, 0.4]], unique=False)[0].tolist() == [[0, 1]]
    assert sub([[2, 3]], [[0.6, 0.4]], unique=False, diversity=0.7)[0].tolist() == [[1, 1]]


def test_substitute_tae_gate_at_tau():
    """TAE [.5, .5] = 1: tau 1 blocks (TAE <= tau), tau just below 1 allows.  TAE of
    [.75, .25] (0.811278) as tau blocks it too; the blocked count only covers tokens with a
    missing expert: the resident token {0, 1} is not counted."""
    ids, w = [[2, 3], [0, 1]], [[0.5, 0.5], [0.5, 0.5]]
    out, info = sub(ids, w, tau=1.0)
    assert out.tolist() == ids and counts(info) == (1, 0, 0, 0, 0)
    out, info = sub(ids, w, tau=1.0 - 1e-9)
    assert out.tolist() == [[1, 0], [0, 1]] and counts(info) == (0, 0, 0, 2, 0)
    t = float(tae(np.array([[0.75, 0.25]]))[0])
    out, info = sub([[2, 3]], [[0.75, 0.25]], tau=t)
    assert out.tolist() == [[2, 3]] and info["tae_blocked"] == 1
    out, info = sub([[2, 3]], [[0.75, 0.25]], tau=t - 1e-9)
    assert out.tolist() == [[0, 1]] and info["tae_blocked"] == 0


def test_substitute_tae_gate_at_temperature():
    """T = 2: [.8, .2] becomes [2/3, 1/3], TAE 0.918296; at T = 1 it is 0.721928.
    tau 0.8 blocks at T = 1 and allows at T = 2."""
    out, info = sub([[2, 3]], [[0.8, 0.2]], tau=0.8)
    assert out.tolist() == [[2, 3]] and info["tae_blocked"] == 1
    out, info = sub([[2, 3]], [[0.8, 0.2]], tau=0.8, temperature=2.0)
    assert out.tolist() == [[0, 1]] and info["tae_blocked"] == 0


def test_substitute_margin_gate_at_gamma():
    """Weights [.25, .75] (unsorted): margin .75 - .25 = .5.  gamma .5 blocks (margin >=
    gamma), counted as margin-blocked; gamma just above .5 allows.  A token blocked by TAE
    is not counted again by the margin."""
    out, info = sub([[2, 3]], [[0.25, 0.75]], gamma=0.5)
    assert out.tolist() == [[2, 3]] and counts(info) == (0, 1, 0, 0, 0)
    out, info = sub([[2, 3]], [[0.25, 0.75]], gamma=0.5 + 1e-9)
    assert out.tolist() == [[1, 0]] and counts(info) == (0, 0, 0, 2, 0)
    out, info = sub([[2, 3]], [[0.25, 0.75]], gamma=0.5, tau=1.0)
    assert counts(info) == (1, 0, 0, 0, 0)
    out, info = sub([[2, 3], [0, 1]], [[0.25, 0.75], [0.9, 0.1]], gamma=0.5)
    assert counts(info) == (0, 1, 0, 0, 0)


def test_substitute_margin_gate_off_for_top1():
    """k = 1 (TAE 0, tau -1 lets it through): no second weight, so no margin, even with
    gamma 0; 2 -> its first buddy 1."""
    out, info = sub([[2]], [[1.0]], tau=-1.0, gamma=0.0)
    assert out.tolist() == [[1]] and counts(info) == (0, 0, 0, 1, 0)


def test_substitute_local_compatibility_eta():
    """z^ = [1, -1, 1, -1] (log probs [0, -2, 0, -2]).  Token {2, 3}, 3 first: eta 1:
    1 scores .6 (1 - 1) = ~0, 0 scores .1 (1 + 1) = .2: 0; then 2: 1 (score ~0, still
    finite) beats nothing else (0 used, 3 off chip): [1, 0].  eta 0: [0, 1]."""
    out, info = sub([[2, 3]], [[0.6, 0.4]], probs=PROBS_Z, eta=1.0)
    assert out.tolist() == [[1, 0]] and counts(info) == (0, 0, 0, 2, 0)
    assert sub([[2, 3]], [[0.6, 0.4]], probs=PROBS_Z, eta=0.0)[0].tolist() == [[0, 1]]


def test_substitute_eta_normalises_each_token_by_its_own_log_probabilities():
    """Two tokens {2, 3}, weights [.4, .6] (2 first), eta .27.  Token A log probs [0, -2,
    0, -2] (mean -1, std 1), token B [0, -4, 0, -4] (mean -2, std 2): both z^ = [1, -1, 1,
    -1].  2's buddies 1 (q .5 x (1 - .27) = .365) and 0 (q .3 x 1.27 = .381): 0; then 3:
    0 used, 2 off chip, 1: [0, 1] for both.  Normalised over both tokens (mean -1.5, std
    1.66), A would pick 1 for 2."""
    probs = np.exp(np.array([[0.0, -2.0, 0.0, -2.0], [0.0, -4.0, 0.0, -4.0]]))
    out, info = sub([[2, 3], [2, 3]], [[0.4, 0.6]] * 2, probs=probs, eta=0.27)
    assert out.tolist() == [[0, 1], [0, 1]] and counts(info) == (0, 0, 0, 4, 0)


def test_substitute_eta_divides_by_the_spread():
    """Token B alone (log probs [0, -4, 0, -4], z^ = [1, -1, 1, -1]), eta .2: 2's buddies
    1 (.5 x .8 = .4) and 0 (.3 x 1.2 = .36): 1; then 3: 0 (.1 x 1.2): [1, 0].  z^ scaled
    by the spread instead (x 4) would give 0 for 2."""
    probs = np.exp(np.array([[0.0, -4.0, 0.0, -4.0]]))
    assert sub([[2, 3]], [[0.4, 0.6]], probs=probs, eta=0.2)[0].tolist() == [[1, 0]]


def test_substitute_eta_factor_clipped_at_zero():
    """z^ = [-1, -1, 1, 1] (log probs [-2, -2, 0, 0]), eta 2: 1 + 2 z^ would be -1 for
    both 1 and 0, clipped to 0: a tie (0 and 0), the first in 3's list (1) wins; without
    the clip .1 x -1 > .6 x -1 would pick 0."""
    probs = np.exp(np.array([[-2.0, -2.0, 0.0, 0.0]]))
    out, _ = sub([[2, 3]], [[0.6, 0.4]], probs=probs, eta=2.0, rho=1)
    assert out.tolist() == [[2, 1]]


def test_substitute_cross_link_penalty_kappa():
    """hop = [0, 1, 0, 0]: 3's buddy 1 costs one hop.  kappa .9: .6 x .1 = .06 < .1 (0):
    0; kappa .8: .6 x .2 = .12 > .1: 1.  Without hop or with kappa 0: 1."""
    hop = np.array([0.0, 1.0, 0.0, 0.0])
    assert sub([[2, 3]], [[0.6, 0.4]], hop=hop, kappa=0.9, rho=1)[0].tolist() == [[2, 0]]
    assert sub([[2, 3]], [[0.6, 0.4]], hop=hop, kappa=0.8, rho=1)[0].tolist() == [[2, 1]]
    assert sub([[2, 3]], [[0.6, 0.4]], hop=hop, kappa=0.0, rho=1)[0].tolist() == [[2, 1]]
    assert sub([[2, 3]], [[0.6, 0.4]], kappa=0.9, rho=1)[0].tolist() == [[2, 1]]


def test_substitute_random_choice_seeded_by_layer_and_ids():
    """random_choice: every resident expert the token does not use is a candidate, scored
    by default_rng(seed + 7919 layer + sum of ids).  Token {3} (k = 1, tau -1), 0..2
    resident.  Layer 0: default_rng(3).random(4) = [.086, .237, .801, .582]: 2.
    Layer 1: default_rng(7922).random(4) = [.233, .413, .310, .716]: 1.
    seed 1, layer 0: default_rng(4).random(4), whose best of the first three is taken."""
    res = np.array([True, True, True, False])
    prof = hand(tau=-1.0, layers=2, random_choice=True)
    w, p = np.array([[1.0]]), np.ones((1, 4))
    assert substitute(prof, 0, np.array([[3]]), w, p, res)[0].tolist() == [[2]]
    assert substitute(prof, 1, np.array([[3]]), w, p, res)[0].tolist() == [[1]]
    r = np.random.default_rng(4).random(4)
    prof = hand(tau=-1.0, random_choice=True, seed=1)
    assert substitute(prof, 0, np.array([[3]]), w, p, res)[0].tolist() == [[int(r[:3].argmax())]]


def test_substitute_random_choice_ignores_h():
    """The random control searches every expert: with search 1 (3's first buddy 1 is off
    chip) and only 0 resident it still finds 0."""
    prof = hand(tau=-1.0, random_choice=True, search=1)
    res = np.array([True, False, False, False])
    out, info = substitute(prof, 0, np.array([[3]]), np.array([[1.0]]), None, res)
    assert out.tolist() == [[0]] and info["substituted"] == 1


def test_substitute_with_a_real_profile():
    """BuddyProfile of the layer-0 tokens (eps 0, alpha 1): 2's list is [0]; with 0
    resident and tau 0, token {1, 2} (TAE 1) -> [1, 0]."""
    prof = BuddyProfile(P_IDS, P_W, 3, BuddyConfig(eps=0.0, alpha=1.0, k_max=3, tau=0.0))
    out, info = substitute(
        prof, 0, np.array([[1, 2]]), np.array([[0.5, 0.5]]), None, np.array([True, True, False])
    )
    assert out.tolist() == [[1, 0]] and info["substituted"] == 1


# ---------------------------------------------------------------- the DDR path (cold experts)


C_IDS = np.array([[0, 2], [1, 3], [0, 1]])
C_W = np.array([[0.6, 0.4], [0.7, 0.3], [0.5, 0.5]])


def cold(ids=C_IDS, w=C_W, theta=1, cap=None, **kw):
    ids = np.array(ids)
    return substitute_cold(hand(**kw), 0, ids, np.array(w), None, theta, cap)


def test_cold_all_tokens_move_saves_both():
    """theta 1: 0 and 1 have 2 tokens (resident), 2 and 3 one each (cold).  Token 0's 2 ->
    1; token 1's 3 -> (1 used) 2 off chip -> 0.  Every token of 2 and 3 moved: both saved."""
    new, info = cold()
    assert new.tolist() == [[0, 1], [1, 0], [0, 1]]
    assert (info["substituted"], info["saved"], info["kept"], info["cold"]) == (2, 2, 0, 2)
    assert info["missing"] == 2 and info["tokens"] == 3


def test_cold_theta_is_strict():
    """theta 2: an expert with 2 tokens is cold too (resident needs more than theta):
    0 (3 tokens) alone is resident... here 0 and 1 have 2: every expert is cold and none
    has a resident buddy: nothing moves, all four kept."""
    new, info = cold(theta=2)
    assert new.tolist() == C_IDS.tolist()
    assert (info["substituted"], info["saved"], info["kept"], info["cold"]) == (0, 0, 4, 4)
    new, info = cold(theta=0)
    assert new.tolist() == C_IDS.tolist() and info["cold"] == 0 and info["missing"] == 0


def test_cold_cap_saves_the_cheapest():
    """cap 1: 2 carries weight .4 on its token, 3 carries .3: 3 (cheaper) is saved, 2 is
    kept and token 0's move undone.  cap 2 (= the saved count) and cap None: both saved;
    cap 0: none."""
    new, info = cold(cap=1)
    assert new.tolist() == [[0, 2], [1, 0], [0, 1]]
    assert (info["substituted"], info["saved"], info["kept"], info["cold"]) == (1, 1, 1, 2)
    assert cold(cap=2)[0].tolist() == [[0, 1], [1, 0], [0, 1]]
    new, info = cold(cap=0)
    assert new.tolist() == C_IDS.tolist() and (info["saved"], info["kept"]) == (0, 2)


def test_cold_cap_tie_keeps_the_later():
    """Weights [.6, .4] on both tokens: 2 and 3 both cost .4; the stable order saves the
    first (2) and keeps 3."""
    new, info = cold(w=[[0.6, 0.4], [0.6, 0.4], [0.5, 0.5]], cap=1)
    assert new.tolist() == [[0, 1], [1, 3], [0, 1]]
    assert (info["saved"], info["kept"]) == (1, 1)


def test_cold_expert_with_a_token_left_is_kept_whole():
    """ids {0,2}, {1,2}, {0,1}, {0,1}; theta 2: 0, 1 resident (3 tokens), 2 cold (2
    tokens).  tau .5 blocks token 0 (TAE(.9, .1) = .469) but not token 1 (TAE 1): token 1
    would move 2 -> 0, but token 0 keeps 2 loaded: undone.  3 (no token) is not cold."""
    ids = [[0, 2], [1, 2], [0, 1], [0, 1]]
    w = [[0.9, 0.1], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]
    new, info = cold(ids, w, theta=2, tau=0.5)
    assert new.tolist() == ids
    assert (info["substituted"], info["saved"], info["kept"], info["cold"]) == (0, 0, 1, 1)
    assert info["tae_blocked"] == 1
    new, info = cold(ids, w, theta=2, tau=0.0)
    assert new.tolist() == [[0, 1], [1, 0], [0, 1], [0, 1]]
    assert (info["substituted"], info["saved"], info["kept"], info["cold"]) == (2, 1, 0, 1)


# ---------------------------------------------------------------- the random baseline


def test_random_substitute_forced_choices():
    """Only 0 resident: token {2, 3}: slot 0 -> 0, slot 1 finds nothing (0 now used); the
    input is not modified, int64 out."""
    ids = np.array([[2, 3]], dtype=np.int32)
    out, n = random_substitute(ids, np.array(RES & [True, False, False, False]), rng())
    assert out.tolist() == [[0, 3]] and n == 1 and out.dtype == np.int64
    assert ids.tolist() == [[2, 3]]


def rng(seed=0):
    return np.random.default_rng(seed)


def test_random_substitute_budget_and_slot_order():
    """0, 1 resident, token {2, 3}: both replaced by {0, 1} (default rho None); rho 1: only
    slot 0 (slot order, not weight); rho 0: none.  Token {0, 1}: nothing to do."""
    out, n = random_substitute(np.array([[2, 3]]), RES, rng())
    assert sorted(out[0].tolist()) == [0, 1] and n == 2
    out, n = random_substitute(np.array([[2, 3]]), RES, rng(), rho=1)
    assert out[0, 0] in (0, 1) and out[0, 1] == 3 and n == 1
    out, n = random_substitute(np.array([[2, 3]]), RES, rng(), rho=0)
    assert out.tolist() == [[2, 3]] and n == 0
    out, n = random_substitute(np.array([[0, 1]]), RES, rng())
    assert out.tolist() == [[0, 1]] and n == 0


def test_random_substitute_never_picks_an_expert_the_token_uses():
    """Token {0, 2}, only 0 resident: 2's one candidate is 0, which the token already
    uses, so nothing is replaced; an int64 input is not modified either."""
    ids = np.array([[0, 2]], dtype=np.int64)
    out, n = random_substitute(ids, np.array([True, False, False]), rng())
    assert out.tolist() == [[0, 2]] and n == 0
    out[0, 1] = 1
    assert ids.tolist() == [[0, 2]]


def test_random_substitute_goes_past_a_slot_with_nothing_missing():
    """Token {0, 2}, 0 and 1 resident: slot 0 has nothing to do, slot 1 takes 1."""
    out, n = random_substitute(np.array([[0, 2]]), np.array([True, True, False]), rng())
    assert out.tolist() == [[0, 1]] and n == 1


def test_random_substitute_draws_each_token_anew():
    """200 tokens each missing expert 0, experts 1-4 resident: every token draws its own
    scores, so all four residents are picked (one shared draw would pick 1 each time)."""
    out, n = random_substitute(np.zeros((200, 1), dtype=np.int64), np.arange(5) > 0, rng())
    assert n == 200 and set(out[:, 0].tolist()) == {1, 2, 3, 4}


def test_random_substitute_draws():
    """0, 1, 2 resident, token {3}: rng(0).random((1, 4)) = r; the pick is the best of
    r[:3] (3 is off chip)."""
    r = rng().random(4)
    out, n = random_substitute(np.array([[3]]), np.array([True, True, True, False]), rng())
    assert out.tolist() == [[int(r[:3].argmax())]] and n == 1


# ---------------------------------------------------------------- Algorithm 1


S1 = np.array([[2, 3], [0, 2], [3, 1]])
B1 = TABLE


def compiled():
    pytest.importorskip("numba")
    return algorithm1_compiled


def test_algorithm1_by_hand():
    """0, 1 resident.  Token {2, 3}: 2 -> its first buddy 1; 3: 1 taken, 2 off chip, 0:
    [1, 0].  Token {0, 2}: 2 -> 1: [0, 1].  Token {3, 1}: 3: 1 taken, 2 off, 0: [0, 1].
    H = 2: 3 reaches only 1 and 2: [1, 3], [0, 1], [3, 1]; H = 1: the same; H = 5 (more
    than the table): as H = 3."""
    want = {
        3: [[1, 0], [0, 1], [0, 1]],
        2: [[1, 3], [0, 1], [3, 1]],
        1: [[1, 3], [0, 1], [3, 1]],
        5: [[1, 0], [0, 1], [0, 1]],
    }
    for H, out in want.items():
        loop = algorithm1_loop(S1, RES, B1, H)
        vec = algorithm1_vectorized(S1, RES, B1, H)
        assert loop.tolist() == out and vec.tolist() == out, H
        assert vec.dtype == np.int64
    assert S1.tolist() == [[2, 3], [0, 2], [3, 1]]


def test_algorithm1_of_int32_inputs_is_int64():
    """The ids of S, B and M in narrower types (int32, 0/1 residency for the compiled
    form): the same replacements as the hand case, returned as int64."""
    S, B = S1.astype(np.int32), B1.astype(np.int32)
    vec = algorithm1_vectorized(S, RES, B, 3)
    assert vec.tolist() == [[1, 0], [0, 1], [0, 1]] and vec.dtype == np.int64
    got = compiled()(S, RES.astype(np.int32), B, 3)
    assert got.tolist() == [[1, 0], [0, 1], [0, 1]] and got.dtype == np.int64


def test_algorithm1_vectorized_one_expert_without_buddies():
    """One expert, not resident, its list all padding: nothing to substitute, the padding
    never read as an expert (there is no expert 1)."""
    out = algorithm1_vectorized(np.array([[0]]), np.array([False]), np.array([[-1, -1]]), 2)
    assert out.tolist() == [[0]]


def test_algorithm1_first_resident_buddy_not_the_best():
    """Algorithm 1 takes the first resident buddy in list order, not the highest q: 3's
    list [2, 1, 0] with 1 and 0 resident and unused: 1."""
    B = B1.copy()
    B[3] = [2, 1, 0]
    S = np.array([[3, 2]])
    assert algorithm1_loop(S, RES, B, 3).tolist() == [[1, 0]]
    assert algorithm1_vectorized(S, RES, B, 3).tolist() == [[1, 0]]


def test_algorithm1_skips_padding():
    """M = [T, T, F, T]: the -1 padding would read as the last expert (3, resident) in the
    loop or as 0 in the vectorised form; 2's list [-1, 3, 0]: 3."""
    M = np.array([True, True, False, True])
    B = np.array([[1, -1, -1], [0, -1, -1], [-1, 3, 0], [0, -1, -1]])
    S = np.array([[2, 1]])
    assert algorithm1_loop(S, M, B, 3).tolist() == [[3, 1]]
    assert algorithm1_vectorized(S, M, B, 3).tolist() == [[3, 1]]
    B[2] = [-1, -1, -1]
    assert algorithm1_loop(S, M, B, 3).tolist() == [[2, 1]]
    assert algorithm1_vectorized(S, M, B, 3).tolist() == [[2, 1]]


def test_algorithm1_compiled_by_hand():
    f = compiled()
    for H, out in {3: [[1, 0], [0, 1], [0, 1]], 2: [[1, 3], [0, 1], [3, 1]]}.items():
        got = f(S1, RES, B1, H)
        assert got.tolist() == out and got.dtype == np.int64
    M = np.array([True, True, False, True])
    B = np.array([[1, -1, -1], [0, -1, -1], [-1, 3, 0], [0, -1, -1]])
    assert f(np.array([[2, 1]]), M, B, 3).tolist() == [[3, 1]]
    # the ends of the valid ranges are accepted: expert id 3 = E - 1, buddy ids -1 and 3
    assert f(np.array([[3, 1]]), RES, B1, 3).tolist() == [[0, 1]]


@pytest.mark.parametrize(
    "S, B, msg",
    [
        ([[0, 4]], B1, "expert ids must be in 0..3"),
        ([[-1, 0]], B1, "expert ids must be in 0..3"),
        ([[0, 2]], [[1, 2, 4], [0, 2, 3], [1, 0, 3], [1, 2, 0]], "buddy ids must be in -1..3"),
        ([[0, 2]], [[1, 2, 3], [0, 2, 3], [1, 0, -2], [1, 2, 0]], "buddy ids must be in -1..3"),
        ([0, 2], B1, "shapes S (2,), M (4,), B (4, 3) do not fit"),
        ([[0, 2]], B1[:3], "shapes S (1, 2), M (4,), B (3, 3) do not fit"),
        ([[0, 2]], B1[0], "shapes S (1, 2), M (4,), B (3,) do not fit"),
        # a one-dimensional B as long as M is refused too
        ([[0, 2]], [1, 0, 1, 0], "shapes S (1, 2), M (4,), B (4,) do not fit"),
    ],
)
def test_algorithm1_compiled_refusals(S, B, msg):
    f = compiled()
    with pytest.raises(ValueError, match=re.escape(msg)) as e:
        f(np.array(S), RES, np.array(B), 3)
    assert str(e.value) == msg


def test_algorithm1_compiled_refuses_a_2d_residency():
    f = compiled()
    with pytest.raises(ValueError) as e:
        f(S1, RES[None, :], B1, 3)
    assert str(e.value) == "shapes S (3, 2), M (1, 4), B (4, 3) do not fit"


def test_the_random_control_ignores_every_score_factor():
    """Expert 2 missing, 0 and 1 resident (equal q), z^ = [1.22, -1.22, 0]: the control
    draws uniformly, so eta, kappa with hops and the diversity factor change no pick; seed
    by seed, the picks with and without them are the same."""
    from types import SimpleNamespace

    from fsedp.sw.policies.buddy import BuddyConfig, substitute

    q = np.full((3, 3), 0.5)
    np.fill_diagonal(q, 0)
    tab = np.array([[1, 2], [0, 2], [0, 1]])
    res = np.array([True, True, False])
    probs = np.exp(np.array([[0.0, -3.0, -1.5]]))

    def pick(seed, **kw):
        cfg = BuddyConfig(random_choice=True, seed=seed, **kw)
        prof = SimpleNamespace(cfg=cfg, E=3, q=[q], table=[tab], tau=[-1.0])
        hop = np.array([0.0, 3.0, 0.0])
        return int(
            substitute(prof, 0, np.array([[2]]), np.array([[1.0]]), probs, res, hop)[0][0, 0]
        )

    plain = [pick(s) for s in range(64)]
    assert set(plain) == {0, 1}
    assert [pick(s, eta=1.0, kappa=0.9, diversity=0.1, unique=False) for s in range(64)] == plain


def test_a_cross_link_penalty_beyond_one_scores_zero_not_below():
    """Buddies 0 (q .9) and 1 (q .1), both 2 hops away, kappa .9: 1 - 1.8 < 0 is clipped to
    0, so neither outranks the other by distance and the first of the list (0, the better q)
    is taken; unclipped, -.72 < -.08 would pick the worse buddy."""
    from types import SimpleNamespace

    from fsedp.sw.policies.buddy import BuddyConfig, substitute

    q = np.array([[0, 0.5, 0.5], [0.5, 0, 0.5], [0.9, 0.1, 0]])
    tab = np.array([[1, 2], [0, 2], [0, 1]])
    prof = SimpleNamespace(cfg=BuddyConfig(kappa=0.9), E=3, q=[q], table=[tab], tau=[-1.0])
    out, info = substitute(
        prof, 0, np.array([[2]]), np.array([[1.0]]), None, np.array([True, True, False]),
        hop=np.array([2.0, 2.0, 0.0]),
    )  # fmt: skip
    assert out.tolist() == [[0]] and info["substituted"] == 1
