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
