"""The offload experiment's trace driver (``fsedp/experiments/offload.py``) pinned by hand:
which prefetcher is fitted on what, how a trace is split into the fitted head and the
measured steps, and what the runtime is built with and fed."""

from types import SimpleNamespace

import numpy as np
import pytest

import fsedp.experiments.offload as offload
from fsedp.errors import InputError
from fsedp.experiments.offload import OffloadConfig, prefetcher, trace_runtime
from fsedp.sw.policies.offload import (
    FrequencyPrefetcher,
    OraclePrefetcher,
    Prefetcher,
    TransitionPrefetcher,
)

#: 3 tokens, 3 layers, top-1 over 3 units: layer 0 [0, 0, 1], layer 1 [2, 2, 1], layer 2 [1, 0, 1]
PROF = np.array([[[0], [2], [1]], [[0], [2], [0]], [[1], [1], [1]]])


def test_prefetchers_by_name():
    """Each layer's units by popularity, ties to the lower id: [0, 1, 2], [2, 1, 0],
    [1, 0, 2]; each name its prefetcher, anything else none (the base class)."""
    pf, orders = prefetcher("frequency", PROF, 3)
    assert [o.tolist() for o in orders] == [[0, 1, 2], [2, 1, 0], [1, 0, 2]]
    assert type(pf) is FrequencyPrefetcher and pf.orders is orders
    assert type(prefetcher("oracle", PROF, 3)[0]) is OraclePrefetcher
    assert type(prefetcher("none", PROF, 3)[0]) is Prefetcher


def test_the_transition_prefetcher_counts_consecutive_layers():
    """Layer 0 -> 1: tokens 0 -> 2 twice, 1 -> 1 once; layer 1 -> 2: 2 -> 1, 2 -> 0, 1 -> 1;
    layer 0 has no table."""
    pf, _ = prefetcher("transition", PROF, 3)
    assert type(pf) is TransitionPrefetcher and len(pf.trans) == 3 and pf.trans[0] is None
    assert pf.trans[1].tolist() == [[0, 0, 2], [0, 1, 0], [0, 0, 0]]
    assert pf.trans[2].tolist() == [[0, 0, 0], [0, 1, 0], [1, 1, 0]]


class _Runtime:
    """OffloadRuntime replaced: records how it is built and what it is fed."""

    def __init__(self, *args, **kw):
        self.args, self.kw, self.steps = args, kw, []

    def layer_step(self, s, l, u, c, n):
        self.steps.append((s, l, u.tolist(), c.tolist(), n))


def trace(experts, name="t.npz"):
    e = np.asarray(experts)
    return SimpleNamespace(experts=e, num_experts=3, layers=e.shape[1], name=name)


#: 6 tokens, 2 layers, top-1
SIX = [[[0], [1]], [[1], [1]], [[2], [0]], [[2], [2]], [[0], [2]], [[1], [0]]]


def test_trace_runtime_fits_on_the_head_and_feeds_the_rest_by_batch(monkeypatch):
    """fit 0.2 of 6 tokens: int(1.2) = 1 token fitted (the frequency prefetcher on token
    0), tokens 1-5 measured in batches of 2: steps 0 (tokens 1, 2), 1 (3, 4), 2 (5).
    Capacity round(0.5 x 3) = 2; the initial caches are the fitted orders."""
    monkeypatch.setattr(offload, "OffloadRuntime", _Runtime)
    cfg = OffloadConfig(batch=2, cache_rate=0.5, prefetch="frequency", prefetch_count=1)
    rt = trace_runtime(trace(SIX), cfg)
    layers, units, capacity, link, cost, pf = rt.args
    assert (layers, units, capacity) == (2, 3, 2)
    assert link == offload.link_of(cfg) and cost == offload.deployment_cost(cfg)
    assert type(pf) is FrequencyPrefetcher
    assert [o.tolist() for o in rt.kw["initial"]] == [[0, 1, 2], [1, 0, 2]]
    assert rt.kw["prefetch_count"] == 1
    assert rt.steps == [
        (0, 0, [1, 2], [1, 1], 2), (0, 1, [0, 1], [1, 1], 2),
        (1, 0, [0, 2], [1, 1], 2), (1, 1, [2], [2], 2),
        (2, 0, [1], [1], 1), (2, 1, [0], [1], 1),
    ]  # fmt: skip
    # only the first 2 steps; another cost model
    other = offload.deployment_cost(cfg, sizes=(8, 16))
    rt = trace_runtime(trace(SIX), cfg, cost=other, steps=2)
    assert rt.args[4] == other and [s[0] for s in rt.steps] == [0, 0, 1, 1]
    # fit 0.5: tokens 0-2 fitted, steps over 3-5
    rt = trace_runtime(trace(SIX), cfg, fit=0.5)
    assert rt.steps[0] == (0, 0, [0, 2], [1, 1], 2)


def test_trace_runtime_fits_at_least_one_token(monkeypatch):
    """3 tokens, fit 0.2: int(0.6) = 0, so 1 token is fitted and 2 measured."""
    monkeypatch.setattr(offload, "OffloadRuntime", _Runtime)
    rt = trace_runtime(trace(SIX[:3]), OffloadConfig(batch=4, prefetch="none"))
    assert rt.steps == [(0, 0, [1, 2], [1, 1], 2), (0, 1, [0, 1], [1, 1], 2)]


@pytest.mark.parametrize("n, fit, ok", [(2, 0.5, True), (2, 1.0, False), (1, 0.2, False)])
def test_a_trace_with_no_token_left_to_measure_is_refused(monkeypatch, n, fit, ok):
    monkeypatch.setattr(offload, "OffloadRuntime", _Runtime)
    t = trace(SIX[:n])
    if ok:
        assert len(trace_runtime(t, OffloadConfig(), fit=fit).steps) == 2
        return
    with pytest.raises(InputError) as e:
        trace_runtime(t, OffloadConfig(), fit=fit)
    assert (e.value.file, e.value.field, e.value.reason) == (
        "t.npz", "experts",
        f"{n} token: the cache and prefetchers are fitted on the first {fit * 100:g} % of "
        "the tokens (at least one) and measured on the rest, so a trace needs at least 2 "
        "tokens",
    )  # fmt: skip


@pytest.mark.parametrize(
    "kw, field, reason",
    [
        (dict(policy="lru"), "--policy",
         "must be one of demand, drop, random, buddy, prism, not 'lru'"),
        (dict(prefetch="x"), "--prefetch",
         "must be one of none, transition, frequency, oracle, not 'x'"),
        (dict(cache_rate=-0.01), "--cache-rate", "must be in [0, 1], not -0.01"),
        (dict(cache_rate=1.01), "--cache-rate", "must be in [0, 1], not 1.01"),
        (dict(link="usb"), "--link", "must be one of pcie4, ddr-chip, not 'usb'"),
        (dict(batch=0), "--batch", "must be >= 1, not 0"),
        (dict(sub_experts=0, active=0), "--active", "must be in 1..sub_experts = 0, not 0"),
        (dict(active=0), "--active", "must be in 1..sub_experts = 4, not 0"),
        (dict(active=5), "--active", "must be in 1..sub_experts = 4, not 5"),
        (dict(bandwidth_gbs=0.0), "--bandwidth-gbs", "must be > 0, not 0.0"),
        (dict(latency_us=0.0), "--latency-us", "must be > 0, not 0.0"),
        (dict(flops=-1.0), "--flops", "must be > 0, not -1.0"),
        (dict(overhead_us=-0.5), "--overhead-us", "must be >= 0, not -0.5"),
    ],
)  # fmt: skip
def test_offload_options_refused_by_hand(kw, field, reason):
    with pytest.raises(InputError) as e:
        OffloadConfig(**kw)
    assert (e.value.file, e.value.field, e.value.reason) == ("<command line>", field, reason)


@pytest.mark.parametrize(
    "kw",
    [
        dict(cache_rate=0.0), dict(cache_rate=1.0), dict(batch=1), dict(active=1),
        dict(active=4), dict(sub_experts=1, active=1), dict(bandwidth_gbs=1e-9),
        dict(latency_us=1e-9), dict(flops=1e-9), dict(overhead_us=0.0), dict(link="pcie4"),
    ],
)  # fmt: skip
def test_offload_options_at_the_ends_of_their_ranges(kw):
    assert OffloadConfig(**kw)


def test_deployment_cost_by_hand():
    """d_model 8, d_ffn 16: an expert is 3 matrices of 8 x 16 weights, 2 bytes each (768
    bytes) and 2 x 3 x 8 x 16 = 768 FLOPs per token; dense 2 x 4 x 8 x 8 = 512 FLOPs.
    In 4 units (sub-experts): a quarter each.  4-byte weights: twice the bytes."""
    cfg = OffloadConfig()
    c = offload.deployment_cost(cfg, sizes=(8, 16))
    assert (c.unit_bytes, c.unit_flops, c.dense_flops) == (768, 768, 512)
    dev = offload.device_of(cfg)
    assert c.flops == dev.expert_tflops * 1e12 and c.table == dev.table()
    q = offload.deployment_cost(cfg, units_per_expert=4, sizes=(8, 16), weight_bytes=4)
    assert (q.unit_bytes, q.unit_flops, q.dense_flops) == (384, 192, 512)
    # the default scale: deepseek-v2-lite's sizes
    d, f = offload.expert_sizes("deepseek-v2-lite")
    assert offload.deployment_cost(cfg).unit_bytes == 3 * d * f * 2


def test_an_unknown_scale_is_named_as_the_option():
    with pytest.raises(InputError) as e:
        offload.expert_sizes("no-such-model")
    assert (e.value.file, e.value.field) == ("<command line>", "--scale-to")


def test_trace_runtime_steps_one_batch_at_a_time(monkeypatch):
    """batch 1 over 6 tokens (fit 0.5: 3 fitted): three steps of one token."""
    monkeypatch.setattr(offload, "OffloadRuntime", _Runtime)
    rt = trace_runtime(trace(SIX), OffloadConfig(batch=1), fit=0.5)
    assert [s[0] for s in rt.steps] == [0, 0, 1, 1, 2, 2]


# ----------------------------------------------------------------------- the forward-pass hook


def hook(policy="demand", res=(True, False, True), units=3, batch=2, prof=None, **kw):
    """An OffloadHook on a runtime that records what it is fed (no model needed)."""
    steps = []
    rt = SimpleNamespace(
        resident=lambda layer: np.array(res),
        stats=SimpleNamespace(dropped=0, substituted=0),
        cost=SimpleNamespace(unit_bytes=1.0),
        units=units,
        layer_step=lambda s, l, u, c, n: steps.append((s, l, u.tolist(), c.tolist(), n)),
    )
    cfg = OffloadConfig(policy=policy, batch=batch, **kw)
    return offload.OffloadHook(None, cfg, rt, prof), rt, steps


def test_hook_steps_are_batches_of_the_tokens():
    h, _, _ = hook(batch=2)
    assert h.steps(5) == [(0, slice(0, 2)), (1, slice(2, 4)), (2, slice(4, 5))]
    assert all(type(s) is int for s, _ in h.steps(5))
    assert h.steps(4) == [(0, slice(0, 2)), (1, slice(2, 4))]
    assert h.sub == 1 and hook("prism")[0].sub == 4


IDS3 = np.array([[0, 1], [1, 2], [2, 0]])
W3 = np.full((3, 2), 0.5)


def test_hook_drop_zeroes_the_weights_of_missing_experts():
    """Expert 1 is not resident: tokens 0 and 1 lose its weight (2 dropped); the ids and
    the caller's arrays stay."""
    h, rt, _ = hook("drop")
    ids, w = h.route(0, None, IDS3, W3, None)
    assert ids.tolist() == IDS3.tolist() and ids is not IDS3
    assert w.tolist() == [[0.5, 0.0], [0.0, 0.5], [0.5, 0.5]] and W3.min() == 0.5
    assert rt.stats.dropped == 2


@pytest.mark.parametrize("policy", ["demand", "prism"])
def test_hook_demand_and_prism_route_as_the_model_does(policy):
    h, rt, _ = hook(policy)
    ids, w = h.route(0, None, IDS3, W3, None)
    assert ids.tolist() == IDS3.tolist() and w.tolist() == W3.tolist()
    assert (rt.stats.dropped, rt.stats.substituted) == (0, 0)


def test_hook_random_substitutes_a_resident_expert_per_step():
    """Only expert 0 resident (of 3): token {1, 2} -> 1 becomes 0, 2 finds no other
    resident; token {2, 1} likewise, in its own step (batch 1)."""
    h, rt, _ = hook("random", res=(True, False, False), batch=1)
    ids, _ = h.route(0, None, np.array([[1, 2], [2, 1]]), np.full((2, 2), 0.5), None)
    assert ids.tolist() == [[0, 2], [0, 1]] and rt.stats.substituted == 2


def buddy_profile(**kw):
    """The hand profile of the BuddyMoE tests (4 experts, every layer alike, tau 0)."""
    from fsedp.sw.policies.buddy import BuddyConfig

    q = np.array(
        [[0.0, 0.5, 0.3, 0.2], [0.5, 0.0, 0.3, 0.2], [0.3, 0.5, 0.0, 0.2], [0.1, 0.6, 0.3, 0.0]]
    )
    table = np.array([[1, 2, 3], [0, 2, 3], [1, 0, 3], [1, 2, 0]])
    return SimpleNamespace(cfg=BuddyConfig(**kw), E=4, q=[q], table=[table], tau=[0.0])


def test_hook_buddy_substitutes_and_counts_its_gates():
    """The hand profile of the BuddyMoE tests (experts 0, 1 resident): token {2, 3},
    weights [.6, .4]: 3 -> 1, then 2 -> 0; both substitutions and both misses counted."""
    h, rt, _ = hook("buddy", res=(True, True, False, False), units=4, prof=buddy_profile())
    ids, _ = h.route(0, np.ones((1, 4)), np.array([[2, 3]]), np.array([[0.6, 0.4]]), None)
    assert ids.tolist() == [[0, 1]] and rt.stats.substituted == 2
    assert h.gates == {
        "tae_blocked": 0, "margin_blocked": 0, "residency_bypass": 0, "substituted": 2,
        "no_buddy": 0, "missing": 2,
    }  # fmt: skip


def test_hook_feeds_the_runtime_step_by_step_across_passes():
    """Pass 1 (5 tokens, batch 2: steps 0-2): layer 0 uses experts by token; after the layer
    each step's units and token counts go to the runtime.  Pass 2 continues at step 3."""
    h, _, steps = hook(batch=2)
    ids = np.array([[0, 1], [1, 2], [2, 0], [0, 1], [2, 1]])
    h.route(0, None, ids, np.ones((5, 2)), None)
    for e in range(3):
        rows = np.nonzero((ids == e).any(1))[0]
        assert h.neurons(0, e, rows, None) is None
    h.after_layer(0)
    assert steps == [(0, 0, [0, 1, 2], [1, 2, 1], 2), (1, 0, [0, 1, 2], [2, 1, 1], 2),
                     (2, 0, [1, 2], [1, 1], 1)]  # fmt: skip
    assert all(type(x) is int for st in steps for x in st[2] + st[3])
    steps.clear()
    h.route(0, None, ids[:1], np.ones((1, 2)), None)
    h.neurons(0, 0, np.array([0]), None)
    h.after_layer(0)
    assert steps == [(3, 0, [0], [1], 1)]
    # pass 3 starts after pass 2's one step
    steps.clear()
    h.route(0, None, ids[:1], np.ones((1, 2)), None)
    h.neurons(0, 0, np.array([0]), None)
    h.after_layer(0)
    assert steps == [(4, 0, [0], [1], 1)]


def test_hook_prism_keeps_the_active_sub_experts_of_largest_activation():
    """4 sub-experts of 2 neurons each (8 neurons), 2 active: row 0's |act| per group
    [3, 1, 5, 0] keeps groups 2 and 0; row 1's [2, 2, 2, 2] keeps 0 and 1 (ties to the
    lower).  The mask covers the kept groups' neurons; the runtime sees units 4 + kept."""
    h, _, steps = hook("prism", units=8, active=2)
    h.route(0, None, np.array([[1], [1]]), np.ones((2, 1)), None)
    act = np.array([[1.0, 2, 0, -1, 5, 0, 0, 0], [1, 1, 1, 1, -1, 1, 1, 1]])
    mask = h.neurons(0, 1, np.array([0, 1]), act)
    assert mask.dtype == bool
    assert mask.astype(int).tolist() == [[1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]]
    h.after_layer(0)
    assert steps == [(0, 0, [4, 5, 6], [2, 1, 1], 2)]


def test_the_link_of_a_config_by_hand():
    """The device's link, or a named one, with the bandwidth and latency overrides."""
    base = offload.links()["pcie4"]
    got = offload.link_of(OffloadConfig(link="pcie4"))
    assert (got.name, got.bandwidth_gbs, got.latency_us) == (
        base.name, base.bandwidth_gbs, base.latency_us,
    )  # fmt: skip
    got = offload.link_of(OffloadConfig(link="pcie4", bandwidth_gbs=3.0, latency_us=7.0))
    assert (got.name, got.bandwidth_gbs, got.latency_us) == (base.name, 3.0, 7.0)
    dev = offload.device_of(OffloadConfig()).link()
    got = offload.link_of(OffloadConfig(latency_us=2.5))
    assert (got.name, got.bandwidth_gbs, got.latency_us) == (dev.name, dev.bandwidth_gbs, 2.5)


def test_hook_prism_ties_among_many_sub_experts_keep_the_lower():
    """20 sub-experts of one neuron each, |act| 1 on every other: the 3 active are the
    lowest of the tied ones, 0, 2, 4 (ties among more than 16 are where an unstable sort
    reorders)."""
    h, _, steps = hook("prism", units=20, sub_experts=20, active=3)
    h.route(0, None, np.array([[0]]), np.ones((1, 1)), None)
    mask = h.neurons(0, 0, np.array([0]), np.array([[1.0, 0.0] * 10]))
    assert np.nonzero(mask[0])[0].tolist() == [0, 2, 4]


def test_hook_random_uses_the_configs_seed_and_budget():
    """The random policy draws from default_rng(seed); with rho 1 a token loses at most one
    expert."""
    from fsedp.sw.policies.buddy import BuddyConfig, random_substitute

    ids = np.tile(np.array([[1, 2]]), (40, 1))
    res = (True, False, False, True, True, True)
    h, rt, _ = hook("random", res=res, units=6, batch=40, seed=3)
    got, _ = h.route(0, None, ids, np.ones((40, 2)), None)
    want, n = random_substitute(ids, np.array(res), np.random.default_rng(3), None)
    assert got.tolist() == want.tolist() and rt.stats.substituted == n == 80
    h, rt, _ = hook("random", res=res, units=6, batch=40, buddy=BuddyConfig(rho=1))
    got, _ = h.route(0, None, ids, np.ones((40, 2)), None)
    assert rt.stats.substituted == 40 and (got[:, 1] == 2).all()


def test_hook_reads_the_residency_of_the_layer_it_routes():
    """Layer 1 has expert 1 resident, layer 0 not: drop keeps its weight only at layer 1."""
    h, rt, _ = hook("drop")
    rt.resident = lambda layer: np.array([True, layer == 1, True])
    _, w = h.route(1, None, IDS3, W3, None)
    assert w.tolist() == W3.tolist() and rt.stats.dropped == 0


def test_hook_buddy_gates_and_counts_add_up_over_steps_with_probabilities():
    """Two tokens {2, 3} in steps of one: each substitutes both (as above), so the counts
    add up to 4; with eta 1 and log probabilities [0, -2, 0, -2] the BuddyMoE test's
    [1, 0] comes out (the probabilities reach the policy)."""
    h, rt, _ = hook("buddy", res=(True, True, False, False), units=4, batch=1, prof=buddy_profile())
    ids = np.array([[2, 3], [2, 3]])
    out, _ = h.route(0, np.ones((2, 4)), ids, np.array([[0.6, 0.4]] * 2), None)
    assert out.tolist() == [[0, 1], [0, 1]] and rt.stats.substituted == 4
    assert h.gates["substituted"] == 4 and h.gates["missing"] == 4
    probs = np.exp(np.array([[0.0, -2.0, 0.0, -2.0]]))
    h, _, _ = hook("buddy", res=(True, True, False, False), units=4, prof=buddy_profile(eta=1.0))
    out, _ = h.route(0, probs, ids[:1], np.array([[0.6, 0.4]]), None)
    assert out.tolist() == [[1, 0]]
    # a transfer budget of 2 units' bytes (the runtime's unit: 1 byte here): the step's two
    # misses fit it, so the originals are fetched, nothing substituted
    h, rt, _ = hook(
        "buddy", res=(True, True, False, False), units=4, prof=buddy_profile(budget_bytes=2)
    )
    out, _ = h.route(0, np.ones((1, 4)), ids[:1], np.array([[0.6, 0.4]]), None)
    assert out.tolist() == [[2, 3]] and h.gates["residency_bypass"] == 1


def test_deployment_cost_overrides_replace_the_devices_rate_or_launch_and_its_table():
    """A device with a table of an expert's time by its tokens (h100-pcie5): either
    override drops the table, which holds both."""

    def cost(**kw):
        return offload.deployment_cost(OffloadConfig(device="h100-pcie5", **kw), sizes=(8, 16))

    dev = cost()
    assert dev.table is not None
    c = cost(flops=2e12)
    assert (c.flops, c.overhead_s, c.table) == (2e12, dev.overhead_s, None)
    c = cost(overhead_us=3.0)
    assert (c.flops, c.overhead_s, c.table) == (dev.flops, 3e-6, None)
    c = cost(flops=1e12, overhead_us=0.0)
    assert (c.flops, c.overhead_s, c.table) == (1e12, 0.0, None)
