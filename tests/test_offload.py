"""Offload policies: the runtime model (cache, link, prefetchers), BuddyMoE's offline profile
and every online gate and knob, Algorithm 1 vectorised against the paper's loop, and the
LM-level runs of ``fsedp offload``."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsedp.errors import InputError
from fsedp.sw.policies.buddy import (
    BuddyConfig,
    BuddyProfile,
    algorithm1_compiled,
    algorithm1_loop,
    algorithm1_vectorized,
    buddy_lists,
    coactivation,
    conditional,
    random_substitute,
    substitute,
    tae,
)
from fsedp.sw.policies.offload import (
    Cost,
    FrequencyPrefetcher,
    Link,
    LRUCache,
    OffloadRuntime,
    OraclePrefetcher,
    TransitionPrefetcher,
    popularity_order,
)

LINK = Link("test", 1.0, 0.0)  # 1 GB/s, no latency: 1e9 bytes = 1 s
COST = Cost(unit_bytes=1e9, unit_flops=0.0, dense_flops=0.0, flops=1.0, overhead_s=0.0)


# -- runtime -------------------------------------------------------------------------------
def test_lru_cache():
    c = LRUCache(2, [5, 6, 7])
    assert 5 in c and 6 in c and 7 not in c
    c.touch(5)
    assert c.insert(8) and 6 not in c and 5 in c  # 6 was least recently used
    assert not c.insert(9, keep={5, 8}) and 9 not in c
    assert not LRUCache(0).insert(1)


def run(rt, steps, layer_major=False):
    order = (
        [(s, l) for l in range(rt.layers) for s in range(len(steps))]
        if layer_major
        else [(s, l) for s in range(len(steps)) for l in range(rt.layers)]
    )
    for s, l in order:
        u = np.asarray(sorted(steps[s][l]))
        rt.layer_step(s, l, u, np.ones(len(u), int), 1)
    return rt.timing()


def test_everything_resident_never_waits_and_nothing_resident_waits_per_fetch():
    steps = [[{0, 1}, {2, 3}], [{1}, {3}]]
    full = run(OffloadRuntime(2, 4, 4, LINK, COST, initial=[[0, 1, 2, 3]] * 2), steps)
    assert full.hits == full.requested == 6 and full.wait_s == 0 and full.bytes == 0
    empty = run(OffloadRuntime(2, 4, 0, LINK, COST), steps)
    assert empty.hits == 0 and empty.demand == 6 and empty.wait_s == pytest.approx(6.0)


def test_lru_keeps_what_was_just_used():
    rt = OffloadRuntime(1, 8, 2, LINK, COST)
    st = run(rt, [[{0}], [{1}], [{0}], [{2}], [{0}]])
    assert st.demand == 3 and st.hits == 2  # 0 stays resident once loaded


def test_oracle_prefetch_hides_fetches_behind_the_previous_layer():
    steps = [[{0}, {5}], [{1}, {6}]]
    cost = Cost(unit_bytes=1e9, unit_flops=0.0, dense_flops=2.0, flops=1.0, overhead_s=0.0)
    plain = run(OffloadRuntime(2, 8, 2, LINK, cost), steps)
    oracle = run(OffloadRuntime(2, 8, 2, LINK, cost, OraclePrefetcher(), prefetch_count=2), steps)
    assert oracle.prefetch_useful == oracle.prefetched == 2 and oracle.demand == 2
    assert oracle.wait_s < plain.wait_s  # layer 1's fetch overlaps layer 0


def test_transition_prefetcher_learns_a_deterministic_map():
    prof = np.array([[[e], [(e + 3) % 8]] for e in range(8)] * 4)  # layer 1 = layer 0 + 3
    orders = [popularity_order(prof[:, l], 8) for l in range(2)]
    trans = [None, np.zeros((8, 8))]
    np.add.at(trans[1], (prof[:, 0, 0], prof[:, 1, 0]), 1)
    pf = TransitionPrefetcher(trans, orders)
    assert pf.predict(1, np.array([2]), None, 1) == [5]
    assert FrequencyPrefetcher(orders).predict(1, np.array([2]), None, 1) == [orders[1][0]]
    rt = OffloadRuntime(2, 8, 1, LINK, COST, pf, prefetch_count=1)
    st = run(rt, [[{e}, {(e + 3) % 8}] for e in (1, 4, 6, 2)])
    assert st.prefetch_useful == st.prefetched == 4


def test_timing_does_not_depend_on_the_call_order():
    rng = np.random.default_rng(1)
    steps = [[set(rng.choice(16, 3, replace=False).tolist()) for _ in range(3)] for _ in range(12)]
    a = run(OffloadRuntime(3, 16, 6, LINK, COST, OraclePrefetcher(), prefetch_count=2), steps)
    b = run(
        OffloadRuntime(3, 16, 6, LINK, COST, OraclePrefetcher(), prefetch_count=2),
        steps,
        layer_major=True,
    )
    assert a.as_dict() == b.as_dict()


# -- BuddyMoE offline ------------------------------------------------------------------------
def test_coactivation_counts_weights_and_warmup():
    ids = np.array([[0, 1], [0, 1], [0, 2]])
    w = np.array([[0.9, 0.1], [0.5, 0.5], [0.6, 0.4]])
    m = coactivation(ids, 3)
    assert m[0, 1] == m[1, 0] == 2 and m[0, 2] == 1 and m[1, 2] == 0
    mw = coactivation(ids, 3, w)
    assert mw[0, 1] == pytest.approx(0.6) and mw[0, 2] == pytest.approx(0.4)
    warm = coactivation(ids, 3, warmup=2, warmup_weight=0.25)
    assert warm[0, 1] == pytest.approx(0.5) and warm[0, 2] == 1


def test_laplace_smoothing_and_conditional():
    q = conditional(np.array([[0, 4, 0], [4, 0, 0], [0, 0, 0]]), eps=0.5)
    assert np.allclose(q.sum(1), 1) and (np.diag(q) == 0).all()
    assert q[0, 2] > 0 and q[2, 0] == q[2, 1] == 0.5  # unseen expert: uniform peers
    assert (conditional(np.zeros((3, 3)), eps=0) == 0).all()
    assert conditional(np.array([[0, 4, 0], [4, 0, 0], [0, 0, 0]]), eps=0)[0, 2] == 0


def test_cft_alpha_and_k_max():
    q = conditional(np.array([[0, 6, 3, 1], [6, 0, 1, 1], [3, 1, 0, 1], [1, 1, 1, 0]]), eps=0)
    assert buddy_lists(q, 0.5, 8)[0].tolist() == [1]
    assert buddy_lists(q, 0.9, 8)[0].tolist() == [1, 2]
    assert buddy_lists(q, 1.0, 8)[0].tolist() == [1, 2, 3]
    assert buddy_lists(q, 1.0, 2)[0].tolist() == [1, 2]
    assert all(len(b) >= 1 for b in buddy_lists(q, 0.01, 8))
    with pytest.raises(ValueError):
        buddy_lists(q, 0.0, 8)


# -- BuddyMoE online gates -------------------------------------------------------------------
def test_tae_and_temperature():
    assert tae(np.array([[0.5, 0.5]]))[0] == pytest.approx(1.0)
    assert tae(np.array([[0.999, 0.001]]))[0] < 0.02
    peaky = np.array([[0.8, 0.2]])
    assert tae(peaky, 2.0)[0] > tae(peaky)[0] > tae(peaky, 0.5)[0]


def profile(cfg, n=400, E=8, seed=0):
    """Experts 2e and 2e+1 co-activate; returns a profile of a 2-layer trace."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, E // 2, n) * 2
    ids = np.stack([np.stack([a, a + 1], 1)] * 2, 1)
    w = np.full(ids.shape, 0.5)
    return BuddyProfile(ids, w, E, cfg)


def step(n=4):
    ids = np.tile(np.array([[0, 2]]), (n, 1))
    probs = np.full((n, 8), 0.01)
    probs[:, 0] = probs[:, 2] = 0.45
    return ids, np.full((n, 2), 0.5), probs


RES = np.array([False, True, True, True, True, True, True, True])  # expert 0 is off chip


def test_buddy_substitutes_the_co_activated_peer():
    out, info = substitute(profile(BuddyConfig(tau=0.0)), 0, *step(), RES)
    assert (out[:, 0] == 1).all() and info["substituted"] == 4 and info["missing"] == 4


def test_tau_gate_and_percentile_calibration():
    ids, w, p = step()
    w = np.array([[0.5, 0.5], [0.9, 0.1], [0.5, 0.5], [0.99, 0.01]])
    out, info = substitute(profile(BuddyConfig(tau=0.5)), 0, ids, w, p, RES)
    assert out[:, 0].tolist() == [1, 0, 1, 0] and info["tae_blocked"] == 2
    assert profile(BuddyConfig(tau=None, tau_pct=50)).tau[0] == pytest.approx(1.0)
    out, _ = substitute(profile(BuddyConfig(tau=1.0)), 0, ids, w, p, RES)
    assert (out == ids).all()  # TAE <= 1 always: nothing allowed


def test_margin_gate():
    ids, _, p = step()
    w = np.array([[0.55, 0.45], [0.7, 0.3], [0.55, 0.45], [0.7, 0.3]])
    out, info = substitute(profile(BuddyConfig(tau=0.0, gamma=0.2)), 0, ids, w, p, RES)
    assert out[:, 0].tolist() == [1, 0, 1, 0] and info["margin_blocked"] == 2


def test_residency_gate_and_budget():
    ids, w, p = step()
    # requested {0, 2}; with 0 missing, delta = 0.5
    _, info = substitute(profile(BuddyConfig(tau=0.0, beta=0.5)), 0, ids, w, p, RES)
    assert info["residency_bypass"] == 1 and info["substituted"] == 0
    _, info = substitute(profile(BuddyConfig(tau=0.0, beta=0.6)), 0, ids, w, p, RES)
    assert info["substituted"] == 4
    # a budget that carries one of the two requested experts: beta = 0.5 -> bypass
    _, info = substitute(
        profile(BuddyConfig(tau=0.0, budget_bytes=100.0)), 0, ids, w, p, RES, unit_bytes=100.0
    )
    assert info["residency_bypass"] == 1
    _, info = substitute(
        profile(BuddyConfig(tau=0.0, budget_bytes=50.0)), 0, ids, w, p, RES, unit_bytes=100.0
    )
    assert info["substituted"] == 4


def flat_profile(cfg):
    """Expert 0 co-activates equally with 1, 3 and 5 (q = 1/3 each), 3 slightly more."""
    ids = np.array([[0, 1]] * 10 + [[0, 3]] * 11 + [[0, 5]] * 10)
    ids = np.stack([ids, ids], 1)
    return BuddyProfile(ids, np.full(ids.shape, 0.5), 8, cfg)


def test_eta_prefers_the_router_s_choice():
    ids, w, p = step(1)
    p[0, 5] = 0.3  # the router likes 5 for this token
    out, _ = substitute(flat_profile(BuddyConfig(tau=0.0)), 0, ids, w, p, RES)
    assert out[0, 0] == 3  # global similarity alone
    out, _ = substitute(flat_profile(BuddyConfig(tau=0.0, eta=1.0)), 0, ids, w, p, RES)
    assert out[0, 0] == 5


def test_kappa_penalises_cross_link_buddies():
    ids, w, p = step(1)
    hop = np.zeros(8)
    hop[3] = 1
    out, _ = substitute(flat_profile(BuddyConfig(tau=0.0, kappa=0.5)), 0, ids, w, p, RES, hop=hop)
    assert out[0, 0] == 1


def test_diversity_and_uniqueness():
    ids = np.array([[0, 3]])
    w = np.full((1, 2), 0.5)
    p = np.full((1, 8), 0.1)
    cfg = dict(tau=0.0, unique=False)
    out, _ = substitute(flat_profile(BuddyConfig(**cfg, diversity=1.0)), 0, ids, w, p, RES)
    assert out[0, 0] == 3  # reuse allowed, not discouraged
    out, _ = substitute(flat_profile(BuddyConfig(**cfg, diversity=0.5)), 0, ids, w, p, RES)
    assert out[0, 0] == 1
    out, _ = substitute(flat_profile(BuddyConfig(tau=0.0)), 0, ids, w, p, RES)
    assert out[0, 0] == 1  # Algorithm 1: never a used expert


def test_search_limit_h_and_budget_rho():
    res = RES.copy()
    res[1] = False  # the best buddy is off chip too
    ids, w, p = step(2)
    out, info = substitute(profile(BuddyConfig(tau=0.0, alpha=1.0, search=1)), 0, ids, w, p, res)
    assert (out[:, 0] == 0).all() and info["no_buddy"] == 2
    out, _ = substitute(profile(BuddyConfig(tau=0.0, alpha=1.0, search=8)), 0, ids, w, p, res)
    assert res[out[:, 0]].all()
    both = np.array([[0, 1]])
    res2 = RES.copy()
    res2[1] = False
    wt = np.array([[0.7, 0.3]])
    out, info = substitute(
        profile(BuddyConfig(tau=0.0, alpha=1.0, rho=1)), 0, both, wt, np.full((1, 8), 0.1), res2
    )
    assert info["substituted"] == 1 and out[0, 0] == 0 and out[0, 1] != 1  # the lighter one
    out, info = substitute(
        profile(BuddyConfig(tau=0.0, alpha=1.0, rho=0)), 0, both, wt, np.full((1, 8), 0.1), res2
    )
    assert info["substituted"] == 0


def test_random_substitution_uses_only_resident_unused_experts():
    rng = np.random.default_rng(0)
    ids = np.array([[0, 2], [0, 3], [4, 0]])
    out, c = random_substitute(ids, RES, rng)
    assert c == 3 and RES[out].all() and all(len(set(r)) == 2 for r in out.tolist())
    out, c = random_substitute(ids, RES, rng, rho=0)
    assert c == 0 and (out == ids).all()


def test_bad_buddy_config():
    with pytest.raises(InputError) as e:
        BuddyConfig(alpha=0)
    assert (e.value.file, e.value.field) == ("<params>", "alpha")
    with pytest.raises(InputError) as e:
        BuddyConfig(beta=1.5)
    assert e.value.field == "beta" and "1.5" in e.value.reason


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    E=st.integers(4, 24),
    K=st.integers(1, 4),
    H=st.integers(1, 6),
    res=st.floats(0.1, 0.9),
)
def test_algorithm1_vectorized_equals_the_loop(seed, E, K, H, res):
    rng = np.random.default_rng(seed)
    K = min(K, E)
    S = np.stack([rng.choice(E, K, replace=False) for _ in range(50)])
    M = rng.random(E) < res
    B = np.stack(
        [
            rng.permutation(np.delete(np.arange(E), i))[:6]
            if E > 6
            else np.concatenate([rng.permutation(np.delete(np.arange(E), i)), np.full(7 - E, -1)])[
                :6
            ]
            for i in range(E)
        ]
    )
    out = algorithm1_vectorized(S, M, B, H)
    assert np.array_equal(out, algorithm1_loop(S, M, B, H))
    assert np.array_equal(algorithm1_compiled(S, M, B, H), out)
    # and what Algorithm 1 promises, independent of both: resident experts stay, a
    # substitute is resident and among the first H buddies of the expert it replaces, and a
    # token never gets one expert twice
    for t in range(len(S)):
        assert len(set(out[t].tolist())) == K
        for k in range(K):
            e, b = S[t, k], out[t, k]
            if M[e]:
                assert b == e
            elif b != e:
                assert M[b] and b in B[e, :H].tolist()


def test_algorithm1_compiled_checks_its_inputs():
    S, M, B = np.array([[0, 1]]), np.array([False, True]), np.array([[1], [0]])
    assert algorithm1_compiled(S, M, B, 1).tolist() == [[0, 1]]  # 1 is taken: 0 stays
    with pytest.raises(ValueError, match="expert ids"):
        algorithm1_compiled(np.array([[0, 2]]), M, B, 1)
    with pytest.raises(ValueError, match="buddy ids"):
        algorithm1_compiled(S, M, np.array([[5], [0]]), 1)
    with pytest.raises(ValueError, match="shapes"):
        algorithm1_compiled(S, M, B[:1], 1)


def test_algorithm1_worked_example():
    """By hand: experts 0 and 2 are not resident; 0's buddies are 2 (not resident), 1
    (already chosen by the token), 3; so 0 -> 3.  2's buddies are 3 (now taken) and 4."""
    S = np.array([[0, 1, 2]])
    M = np.array([False, True, False, True, True])
    B = np.array([[2, 1, 3], [0, 2, 3], [3, 4, 1], [0, 1, 2], [0, 1, 2]])
    for f in (algorithm1_loop, algorithm1_vectorized, algorithm1_compiled):
        assert f(S, M, B, 3).tolist() == [[3, 1, 4]]
        # H = 2: 3 is 0's third buddy, out of reach, so 0 stays; 2 then takes 3 (still free)
        assert f(S, M, B, 2).tolist() == [[0, 1, 3]]


# -- fsedp offload -------------------------------------------------------------------------
import subprocess  # noqa: E402
import sys  # noqa: E402

from conftest import SHARED_DATA  # noqa: E402

needs_text = pytest.mark.skipif(
    not (SHARED_DATA / "text" / "wikitext-2-test.tokens").exists(),
    reason="shared text corpora absent",
)


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "fsedp", "offload", *map(str, args)], capture_output=True, text=True
    )


def test_the_cross_link_penalty_is_refused_not_ignored():
    """The offload model has one device: no buddy is hops away, so --kappa would do nothing."""
    r = cli("--trace", "model", "--kappa", "0.5")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (
        "fsedp: <command line>: --kappa: 0.5 weighs a buddy's cross-link hops, and the offload "
        "model has one device (no hop): leave it at 0 (substitute() takes hops from Python)"
    )


def test_routing_only_on_the_embedded_trace():
    import json

    r = cli(
        "--trace", "model", "--cache-rates", "0.25,1.0", "--prefetches", "none,oracle", "--json"
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    full = [x for x in rows if x["cache_rate"] == 1.0]
    assert all(x["hit_rate"] == 1.0 and x["demand_fetches"] == 0 for x in full)
    quarter = {x["prefetch"]: x for x in rows if x["cache_rate"] == 0.25}
    assert quarter["oracle"]["hit_rate"] > quarter["none"]["hit_rate"]
    assert quarter["oracle"]["prefetch_accuracy"] == 1.0


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--cache-rate", "1.5"], "--cache-rate"),
        (["--policy", "magic"], "invalid choice"),
        (["--alpha", "0"], "--alpha"),
        (["--tau", "2"], "--tau"),
        (["--scale-to", "nope", "--trace", "model"], "--scale-to"),
        (["--trace", "/nonexistent.npz"], "no such file"),
    ],
)
def test_bad_offload_arguments(args, msg):
    r = cli(*args)
    assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1


@needs_text
def test_lm_policies_trade_accuracy_for_throughput():
    """On the committed model: on-demand fetching keeps the model's perplexity; BuddyMoE
    loses less than random substitution and runs faster than fetching on demand; dropping
    is fastest and worst."""
    from fsedp.experiments.offload import OffloadConfig, lm_data, run_lm

    model, test, prof = lm_data(2048)
    full = model.perplexity(test)
    res = {
        p: run_lm(
            model, test, prof, OffloadConfig(policy=p, cache_rate=0.5, buddy=BuddyConfig(rho=1))
        )
        for p in ("demand", "random", "buddy", "drop")
    }
    assert res["demand"]["perplexity"] == pytest.approx(full, rel=1e-6)
    assert res["buddy"]["perplexity"] < res["random"]["perplexity"]
    assert res["buddy"]["tokens_per_s"] > res["demand"]["tokens_per_s"]
    assert res["drop"]["tokens_per_s"] > res["demand"]["tokens_per_s"]
    prism = run_lm(model, test, prof, OffloadConfig(policy="prism", cache_rate=0.5, active=4))
    assert prism["perplexity"] == pytest.approx(full, rel=1e-5)  # all sub-experts: exact
    fewer = run_lm(model, test, prof, OffloadConfig(policy="prism", cache_rate=0.5, active=2))
    assert fewer["bytes_moved_mb"] < prism["bytes_moved_mb"]


def _cold_case(tau, theta, seed, cap=None) -> dict:
    """One iteration of :func:`substitute_cold`, checked; returns its ``info``."""
    from fsedp.sw.policies.buddy import BuddyConfig, BuddyProfile, substitute_cold

    rng = np.random.default_rng(seed)
    E, k, n = 16, 2, 64
    prof_ids = np.stack([rng.choice(E, k, replace=False) for _ in range(4000)])[:, None, :]
    w = np.full(prof_ids.shape, 0.5)
    cfg = BuddyConfig(tau=tau, search=8)  # tau 0.9: the TAE gate blocks most tokens
    prof = BuddyProfile(prof_ids, w, E, cfg)
    pop = rng.dirichlet(np.full(E, 0.3))
    ids = np.stack([rng.choice(E, k, replace=False, p=pop) for _ in range(n)])
    weights = rng.dirichlet([1.0] * k, size=n)
    probs = rng.dirichlet([1.0] * E, size=n)
    new, info = substitute_cold(prof, 0, ids, weights, probs, theta, cap)
    if cap is not None:
        assert info["saved"] <= cap
        free, free_info = substitute_cold(prof, 0, ids, weights, probs, theta)
        assert info["saved"] == min(cap, free_info["saved"])
        # the ones saved under the cap are the cheapest of those saved without it
        cost = {e: weights[ids == e].sum() for e in np.unique(ids)}
        saved = [e for e in np.unique(ids) if not (new == e).any()]
        lost = [e for e in np.unique(ids) if not (free == e).any() and e not in saved]
        assert not saved or not lost or max(cost[e] for e in saved) <= min(cost[e] for e in lost)
    before = np.bincount(ids.ravel(), minlength=E)
    after = np.bincount(new.ravel(), minlength=E)
    cold = (before > 0) & (before <= theta)
    for t in range(n):
        assert len(set(new[t].tolist())) == k
        for j in range(k):
            e, b = ids[t, j], new[t, j]
            if b != e:
                assert cold[e] and before[b] > theta and b in prof.table[0][e, :8].tolist()
    assert (after[cold] == 0).sum() == info["saved"]
    assert ((after[cold] == before[cold]) | (after[cold] == 0)).all()  # all or nothing
    assert info["saved"] + info["kept"] == int(cold.sum())
    assert int((new != ids).sum()) == info["substituted"]
    # the experts streamed: the hot ones and the cold ones kept
    assert int((after > 0).sum()) == int((before > 0).sum()) - info["saved"]
    return info


@pytest.mark.parametrize("tau", [0.0, 0.9])
@pytest.mark.parametrize("theta", [1, 2, 4])
@pytest.mark.parametrize("seed", range(4))
def test_substitute_cold_conserves_every_token(tau, theta, seed):
    """BuddyMoE on the DDR path: every token keeps k distinct experts, each its own or a
    named buddy (within the first H of its list) of a cold expert, the buddy streamed
    anyway; an expert with more than theta tokens is never moved; a cold expert is either
    saved (none of its tokens left) or kept whole (all of them on it)."""
    info = _cold_case(tau, theta, seed)
    if tau == 0.0:  # no gate: cold experts with a resident buddy are saved
        assert info["saved"] > 0


@pytest.mark.parametrize("cap", [0, 1, 3])
@pytest.mark.parametrize("seed", range(3))
def test_substitute_cold_iteration_cap(cap, seed):
    """The iteration-level cap: at most ``cap`` cold experts saved, the cheapest (least
    routing weight moved) of those the uncapped rule saves; every token still accounted."""
    info = _cold_case(0.0, 2, seed, cap)
    assert info["saved"] <= cap


def test_substitute_cold_keeps_the_experts_the_gate_protects():
    """With a strict TAE gate some tokens of cold experts may not move: those experts are
    kept whole (loaded, every token on its own expert), the others still saved."""
    infos = [_cold_case(0.9, theta, seed) for theta in (1, 2, 4) for seed in range(4)]
    assert sum(i["kept"] for i in infos) > 0 and sum(i["saved"] for i in infos) > 0


def test_bench_substitution_cli():
    """``fsedp offload --bench-substitution``: the three versions agree (checked inside),
    the rates follow from the substitution count, and the decode step is the deployment
    model's layers x the offload model's compute with every expert resident."""
    import json

    r = cli("--bench-substitution", "--batch", "8", "--json")
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)
    assert b["substitutions"] > 0 and b["tokens"] == 4096 and b["top_k"] == 6
    assert min(b["loop_per_s"], b["vectorized_per_s"], b["compiled_per_s"]) > 0
    st = b["step"]
    assert st["batch"] == 8 and st["model"] == "deepseek-v2-lite" and st["layers"] == 27
    assert st["share"] == pytest.approx(st["substitution_us"] / 1e3 / st["compute_ms"], rel=0.01)


def _two_layer_runtime(**cost):
    """Two layers, one step, an empty cache: 2 demand copies, then 1; each copy 1 ms."""
    from fsedp.sw.policies.offload import Cost, Link, OffloadRuntime

    link = Link("test", 1.0, 0.0)  # 1 GB/s: 1e6 bytes in 1 ms
    c = Cost(unit_bytes=1e6, unit_flops=0.0, dense_flops=0.0, flops=1.0, **cost)
    rt = OffloadRuntime(2, 4, 0, link, c)
    rt.layer_step(0, 0, np.array([0, 1]), np.array([1, 1]), 2)
    rt.layer_step(0, 1, np.array([2]), np.array([2]), 2)
    return rt.timing()


@pytest.mark.parametrize(
    "cost, ms",
    [
        # synchronous: each layer waits for its copies, then runs 0.5 ms per expert
        (dict(overhead_s=0.5e-3), 2 + 1 + 1 + 0.5),
        # asynchronous: the host's 0.5 ms per expert overlaps the copies; the device runs
        # 0.1 ms per expert once they are in (2 + 0.2, then 2.2 + 1 + 0.1)
        (dict(overhead_s=0.5e-3, issue="async", device_unit_s=0.1e-3), 3.3),
        # host-bound: 5 ms per expert of host time; layer 1's copy waits for layer 0's end
        (dict(overhead_s=5e-3, issue="async", device_unit_s=0.1e-3), 15),
        # 1 ms to issue each copy: the copies start 1 and 2 ms in, the host issues layer 1's
        # copy at 3 + 1 ms; the device ends at 5 + 0.1
        (dict(overhead_s=0.5e-3, issue="async", device_unit_s=0.1e-3, issue_s=1e-3), 5.1),
        # issue cost is host time: a synchronous runtime waits anyway
        (dict(overhead_s=0.5e-3, issue_s=1e-3), 4.5),
    ],
)
def test_offload_clock_sync_and_async_by_hand(cost, ms):
    st = _two_layer_runtime(**cost)
    assert st.time_s == pytest.approx(ms * 1e-3)
    assert st.wait_s + st.compute_s == pytest.approx(st.time_s)
