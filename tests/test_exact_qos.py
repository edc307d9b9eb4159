"""Exact expectations of the serving QoS policy (``fsedp.sw.policies.qos``) on cases worked
out by hand.

The performance model is checked on its own with small sizes.  The schedulers run on a
stand-in model (:data:`PM`) whose times are exact binary fractions, so that every start,
first-token and done time can be checked on paper and compared with ``==``:

* prefill of ``T`` prompt tokens at ``K``: ``K T / 16`` s;
* one decode step of ``B`` requests at ``K``: ``K / 4 + B / 16`` s;
* a mixed step (continuous QoS): ``max(Ks) / 4 + len(Ks) / 16`` s.

Operating points (:data:`QUAL`): ``K`` 1, 2, 4 with perplexities 3, 2, 1, so a floor of 3
accepts every ``K`` (smallest 1), a floor of 2 accepts 2 and 4, a floor of 1 only 4.
"""

from dataclasses import FrozenInstanceError
from types import SimpleNamespace

import numpy as np
import pytest

from fsedp.sw.policies.qos import (
    CONTINUOUS_POLICIES,
    POLICIES,
    PerfModel,
    Request,
    metrics,
    serve,
    serve_continuous,
    workload,
)

PM = SimpleNamespace(
    prefill_s=lambda K, tokens: K * tokens / 16,
    step_s=lambda K, B: K / 4 + B / 16,
    step_mixed_s=lambda Ks: max(Ks) / 4 + len(Ks) / 16,
)
QUAL = {4: 1.0, 1: 3.0, 2: 2.0}  # deliberately unsorted: the code sorts the K


def R(rid, arrival, output, floor, prompt=1):
    return Request(rid, arrival, prompt, output, floor)


def times(reqs):
    return [(r.rid, r.start, r.first, r.done, r.K) for r in reqs]


# ---------------------------------------------------------------- the performance model


def pm(**kw):
    """2 layers, d_model 2, d_ffn 8, 2 experts of 4 sub-experts (N = 8): a sub-expert has
    3 x 2 x 8 / 4 = 12 parameters, the dense part 4 x 2 x 2 = 16."""
    base = dict(layers=2, d_model=2, d_ffn=8, experts=2, top_k=2, S=4)
    base.update(kw)
    base.setdefault("flops", 4.0)
    base.setdefault("bandwidth", 1.0)
    base.setdefault("launch_s", 0.5)
    return PerfModel(**base)


def test_perf_model_sizes():
    m = pm(bytes_per_param=1.0)
    assert (m.sub_params, m.dense_params) == (12.0, 16.0)
    assert pm(S=2).sub_params == 24.0 and pm(d_model=3).dense_params == 36.0
    assert m.S == 4 and pm().bytes_per_param == 2.0
    no_s = PerfModel(2, 2, 8, 2, 2, flops=4.0, bandwidth=1.0, launch_s=0.5)
    assert no_s == pm()


def test_step_memory_bound():
    """K 4, B 2: touched U = 8 (1 - (1 - 4/8)^2) = 6; memory = 2 layers x (16 + 6 x 12)
    x 1 byte / 1 B/s = 176 s; compute = 2 x 2 x (2 x 16 + 8 x 12) / 4 = 128 s:
    0.5 + 176."""
    assert pm(bytes_per_param=1.0).step_s(4, 2) == 176.5
    # 2 bytes per parameter (the default): memory 352
    assert pm().step_s(4, 2) == 352.5


def test_step_memory_over_the_bandwidth():
    """bandwidth 2 B/s halves the memory time: 176 / 2 = 88 (compute 512 / 1000)."""
    assert pm(bytes_per_param=1.0, bandwidth=2.0, flops=1000.0).step_s(4, 2) == 88.5


def test_perf_model_is_frozen():
    with pytest.raises(FrozenInstanceError):
        pm().flops = 1.0


def test_step_compute_bound():
    """flops 2: compute = 512 / 2 = 256 s > memory 176 s: 0.5 + 256."""
    assert pm(bytes_per_param=1.0, flops=2.0).step_s(4, 2) == 256.5


def test_step_touched_sub_experts_by_b():
    """K 2, B 3: U = 8 (1 - (3/4)^3) = 8 x 37/64 = 4.625; memory 2 (16 + 55.5) = 143;
    compute 4 (3 x 16 + 6 x 12) / 1000 = 0.48: 143.5 with flops 1000."""
    m = pm(bytes_per_param=1.0, flops=1000.0)
    assert m.step_s(2, 3) == pytest.approx(143.5)
    # B 1: U = K = 2: memory 2 (16 + 24) = 80
    assert m.step_s(2, 1) == pytest.approx(80.5)


def test_step_mixed_by_hand():
    """Ks [4, 2]: U = 8 (1 - (1/2)(3/4)) = 5, 6 sub-experts in all; memory 2 (16 + 60) =
    152, compute 2 x 2 x (32 + 72) / 4 = 104: 152.5.  flops 1: compute 416: 416.5.
    [4, 4] is step_s(4, 2)."""
    m = pm(bytes_per_param=1.0)
    assert m.step_mixed_s([4, 2]) == 152.5
    assert pm(bytes_per_param=1.0, flops=1.0).step_mixed_s([4, 2]) == 416.5
    assert m.step_mixed_s([4, 4]) == m.step_s(4, 2)
    assert m.step_mixed_s(np.array([2])) == m.step_s(2, 1)


def test_prefill_by_hand():
    """K 4, 3 tokens: 2 layers x 3 x 2 x (16 + 4 x 12) / 4 = 768 / 4 = 192 s (no launch)."""
    assert pm().prefill_s(4, 3) == 192.0
    assert pm().prefill_s(1, 1) == 2 * 2 * (16 + 12) / 4


def test_perf_model_on_a_device():
    dev = SimpleNamespace(tflops=2.0, memory_gbs=3.0, step_launch_us=5.0)
    m = PerfModel.on(dev, layers=1, d_model=2, d_ffn=8, experts=2, top_k=2)
    assert (m.flops, m.bandwidth) == (2e12, 3e9)
    assert m.launch_s == pytest.approx(5e-6, rel=1e-12)
    assert (m.layers, m.S, m.bytes_per_param) == (1, 4, 2.0)


# ---------------------------------------------------------------- requests and workload


def test_request_defaults():
    r = Request(0, 1.0, 2, 3, 4.0)
    assert (r.start, r.first, r.done, r.K) == (None, None, None, None)


def test_workload_draws_in_order():
    """Each request draws, from one generator seeded ``seed``: the exponential gap
    (mean 1 / rate), the prompt and the output length (both ends included), the floor."""
    floors, p = [1.0, 2.0], [0.25, 0.75]
    got = workload(2.0, 5.0, floors, p, seed=7, prompt=(5, 6), output=(7, 9))
    rng, t, want = np.random.default_rng(7), 0.0, []
    while True:
        t += rng.exponential(0.5)
        if t >= 5.0:
            break
        pr, out = int(rng.integers(5, 7)), int(rng.integers(7, 10))
        want.append((len(want), t, pr, out, float(rng.choice(floors, p=p))))
    assert [(r.rid, r.arrival, r.prompt, r.output, r.floor) for r in got] == want
    assert {r.prompt for r in got} == {5, 6} and {r.output for r in got} == {7, 8, 9}
    assert all(r.start is None for r in got)


def test_workload_duration_is_exclusive():
    """The first arrival of seed 0 at rate 1 is default_rng(0).exponential(1) =
    0.679932: a duration equal to it gives no request, a little more gives one."""
    t1 = np.random.default_rng(0).exponential(1.0)
    assert t1 == pytest.approx(0.6799319)
    assert workload(1.0, t1, [1.0], [1.0]) == []
    got = workload(1.0, t1 + 1e-9, [1.0], [1.0])
    assert len(got) == 1 and got[0].arrival == t1 and got[0].floor == 1.0


def test_workload_defaults():
    """seed 0, prompts 64..512, outputs 32..256."""
    a = workload(5.0, 20.0, [1.0], [1.0])
    b = workload(5.0, 20.0, [1.0], [1.0], 0, (64, 512), (32, 256))
    assert [(r.arrival, r.prompt, r.output) for r in a] == [
        (r.arrival, r.prompt, r.output) for r in b
    ]
    assert min(r.prompt for r in a) >= 64 and max(r.prompt for r in a) <= 512
    assert min(r.output for r in a) >= 32 and max(r.output for r in a) <= 256
    assert len(a) > 50


# ---------------------------------------------------------------- refusals


def test_policies():
    assert POLICIES == ("qos", "fifo", "fullbatch")
    assert CONTINUOUS_POLICIES == ("qos", "fifo")


def test_serve_refuses_an_unknown_policy():
    with pytest.raises(ValueError) as e:
        serve([], "lifo", PM, QUAL)
    assert str(e.value) == "policy must be one of ('qos', 'fifo', 'fullbatch'), not 'lifo'"


def test_continuous_refuses_fullbatch():
    with pytest.raises(ValueError) as e:
        serve_continuous([], "fullbatch", PM, QUAL)
    assert str(e.value) == "policy must be one of ('qos', 'fifo'), not 'fullbatch'"


@pytest.mark.parametrize("run", [serve, serve_continuous])
@pytest.mark.parametrize("max_batch", [0, -1])
def test_an_empty_batch_is_refused(run, max_batch):
    """A batch of no request would never drain the queue: refused before the loop (1
    is accepted, see the FIFO cases)."""
    with pytest.raises(ValueError) as e:
        run([], "qos", PM, QUAL, max_batch=max_batch)
    assert str(e.value) == f"max_batch must be at least 1, not {max_batch}"
    assert run([], "qos", PM, QUAL, max_batch=1) == []


@pytest.mark.parametrize("run", [serve, serve_continuous])
@pytest.mark.parametrize("k", [0, -2, 1.5, "4"])
def test_an_operating_point_of_no_whole_sub_expert_is_refused(run, k):
    with pytest.raises(ValueError) as e:
        run([], "qos", PM, {**QUAL, k: 1.0})
    assert str(e.value) == (
        f"every K of quality must be a whole number of sub-experts >= 1, not {k!r}"
    )


@pytest.mark.parametrize("run", [serve, serve_continuous])
def test_a_floor_no_point_meets_is_refused(run):
    """Floor 0.5 is below every perplexity (the best is 1)."""
    with pytest.raises(ValueError) as e:
        run([R(0, 0.0, 1, 3.0), R(3, 1.0, 1, 0.5)], "fifo", PM, QUAL)
    assert str(e.value) == "request 3: no operating point meets its floor 0.5"


@pytest.mark.parametrize("run", [serve, serve_continuous])
def test_a_floor_equal_to_a_perplexity_is_met(run):
    """Floor 1.0 = the perplexity of K 4: served at K 4 (the floor is inclusive).  Alone:
    prefill 4/16 = 0.25, one step 4/4 + 1/16 = 1.0625."""
    (r,) = run([R(0, 0.0, 1, 1.0)], "qos", PM, QUAL)
    assert (r.K, r.start, r.first, r.done) == (4, 0.0, 1.3125, 1.3125)


# ---------------------------------------------------------------- static batching: FIFO


def test_fifo_batch_at_the_largest_smallest_k():
    """r0 (floor 3: K 1, 2 tokens out) and r1 (floor 2: K 2, 3 out) at 0, batch 2: one
    batch at K 2.  Prefill 2 x 2 / 16 = 0.25, step 2/4 + 2/16 = 0.625: first tokens at
    0.875, r0 done 0.25 + 2 x 0.625 = 1.5, r1 0.25 + 3 x 0.625 = 2.125."""
    out = serve([R(0, 0.0, 2, 3.0), R(1, 0.0, 3, 2.0)], "fifo", PM, QUAL, max_batch=2)
    assert times(out) == [(0, 0.0, 0.875, 1.5, 2), (1, 0.0, 0.875, 2.125, 2)]


def test_fifo_max_batch_and_arrival_order():
    """Three at 0 given out of order, batch 2: r0, r1 first (K 2 as above, until 2.125),
    then r2 (floor 3, K 1, 1 out) at 2.125: prefill 1/16, step 1/4 + 1/16: done 2.5.
    The result is sorted by arrival."""
    reqs = [R(2, 0.5, 1, 3.0), R(0, 0.0, 2, 3.0), R(1, 0.0, 3, 2.0)]
    out = serve(reqs, "fifo", PM, QUAL, max_batch=2)
    assert times(out) == [
        (0, 0.0, 0.875, 1.5, 2),
        (1, 0.0, 0.875, 2.125, 2),
        (2, 2.125, 2.5, 2.5, 1),
    ]


def test_fifo_idle_instance_waits_for_the_next_arrival():
    """r0 alone (K 1, 2 out): prefill 1/16, step 5/16: done 0.6875.  r1 arrives at 3:
    the instance idles and starts it at 3."""
    out = serve([R(0, 0.0, 2, 3.0), R(1, 3.0, 1, 3.0)], "fifo", PM, QUAL)
    assert times(out) == [(0, 0.0, 0.375, 0.6875, 1), (1, 3.0, 3.375, 3.375, 1)]


def test_fifo_arrival_at_the_end_of_a_batch_joins_the_next():
    """r0 ends at 0.6875; r1 arriving exactly then and r2 at 0.6875 + 1/16 (later):
    only r1 starts at 0.6875 (alone, K 1, done 1.0625 with prefill 1/16 and step 5/16)."""
    reqs = [R(0, 0.0, 2, 3.0), R(1, 0.6875, 2, 3.0), R(2, 0.75, 1, 3.0)]
    out = serve(reqs, "fifo", PM, QUAL)
    assert times(out)[1] == (1, 0.6875, 1.0625, 1.375, 1)
    assert out[2].start == 1.375


def test_default_max_batch_is_32():
    """33 requests at 0 (floor 3, 1 token out): FIFO takes 32 first; the 33rd starts after:
    K 1, prefill 32/16 = 2, step 1/4 + 32/16 = 2.25: at 4.25."""
    reqs = [R(i, 0.0, 1, 3.0) for i in range(33)]
    out = serve(reqs, "fifo", PM, QUAL)
    assert {r.start for r in out[:32]} == {0.0} and out[32].start == 4.25
    reqs = [R(i, 0.0, 1, 3.0) for i in range(33)]
    assert times(serve(reqs, "fifo", PM, QUAL, 32, 2.0)) == times(out)


# ---------------------------------------------------------------- static batching: FullBatch


def test_fullbatch_waits_for_a_full_batch():
    """Batch 2: r0 at 0 waits for r1 at 0.5; both (K 1) start at 0.5: prefill 2/16,
    step 1/4 + 2/16 = 0.375: first 1.0, done 1.0 (1 out) and 1.375 (2 out)."""
    out = serve([R(0, 0.0, 1, 3.0), R(1, 0.5, 2, 3.0)], "fullbatch", PM, QUAL, max_batch=2)
    assert times(out) == [(0, 0.5, 1.0, 1.0, 1), (1, 0.5, 1.0, 1.375, 1)]


def test_fullbatch_launches_at_the_timeout():
    """Batch 2, timeout 1: r0 (at 0) waits alone until 0 + 1, runs until 1.375 (prefill
    1/16, step 5/16); r1 (at 3) waits alone until 4.  Default timeout 2: at 2 and 5."""
    reqs = lambda: [R(0, 0.0, 1, 3.0), R(1, 3.0, 1, 3.0)]  # noqa: E731
    out = serve(reqs(), "fullbatch", PM, QUAL, max_batch=2, timeout=1.0)
    assert times(out) == [(0, 1.0, 1.375, 1.375, 1), (1, 4.0, 4.375, 4.375, 1)]
    assert [r.start for r in serve(reqs(), "fullbatch", PM, QUAL, max_batch=2)] == [2.0, 5.0]
    assert [r.start for r in serve(reqs(), "fullbatch", PM, QUAL, 2, 2.0)] == [2.0, 5.0]


def test_fullbatch_timeout_tolerance():
    """Batch 2, timeout 0.25.  r0 and ra (at 0, K 1, 1 out) fill a batch: prefill 2/16,
    step 1/4 + 2/16: it ends at 0.5.  r1, arrived at 0.25 + 0.5e-9, has then waited
    0.25 - 0.5e-9, within 1e-9 of the timeout: launched at 0.5.  Arrived at 0.25 + 2e-9 it
    waits for its full timeout, until 0.5 + 2e-9."""
    for d, start in ((0.5e-9, 0.5), (2e-9, 0.25 + 2e-9 + 0.25)):
        reqs = [R(0, 0.0, 1, 3.0), R(9, 0.0, 1, 3.0), R(1, 0.25 + d, 1, 3.0)]
        out = serve(reqs, "fullbatch", PM, QUAL, max_batch=2, timeout=0.25)
        assert [r.start for r in out[:2]] == [0.0, 0.0]
        assert out[2].start == start


def test_fullbatch_timeout_tolerance_edge():
    """The same batch ending at 0.5, r1 at 0.25, timeout 0.25 + 1e-9: it has waited 0.25,
    exactly timeout - 1e-9 (0.25 + 1e-9 - 1e-9 is 0.25 in floating point): launched at
    0.5, no further wait."""
    reqs = [R(0, 0.0, 1, 3.0), R(9, 0.0, 1, 3.0), R(1, 0.25, 1, 3.0)]
    out = serve(reqs, "fullbatch", PM, QUAL, max_batch=2, timeout=0.25 + 1e-9)
    assert out[2].start == 0.5


# ---------------------------------------------------------------- static batching: QoS


def test_qos_highest_utility_queue():
    """r0 (floor 3, 2 out) and r1 (floor 2, 2 out) at 0, batch 4, timeout 10.  Queues:
    K1 [r0], K2 [r0, r1], K4 [r0, r1].  Utility = tokens / (prefill + 2 steps):
    K1: 2 / (1/16 + 2 x 5/16) = 2 / 0.6875 = 2.91; K2: 4 / (4/16 + 2 x 10/16) = 2.67;
    K4: 4 / (8/16 + 2 x 18/16) = 1.45.  K1 with r0 (done 0.6875); then r1 alone: K2:
    2 / (2/16 + 2 x 9/16) = 1.6, K4: 2 / (4/16 + 2 x 17/16) = 0.84: K2, from 0.6875,
    prefill 0.125, step 0.5625: first 1.375, done 1.9375."""
    out = serve([R(0, 0.0, 2, 3.0), R(1, 0.0, 2, 2.0)], "qos", PM, QUAL, 4, 10.0)
    assert times(out) == [(0, 0.0, 0.375, 0.6875, 1), (1, 0.6875, 1.375, 1.9375, 2)]


def test_qos_batch_full_trigger_beats_utility():
    """The same with batch 2: K2 and K4 hold 2 requests (full, len >= max_batch), K1 not:
    the best full one, K2, runs both (as FIFO's batch at K 2: done 0.875 + 0.625 = 1.5 and
    1.5)."""
    out = serve([R(0, 0.0, 2, 3.0), R(1, 0.0, 2, 2.0)], "qos", PM, QUAL, 2, 10.0)
    assert times(out) == [(0, 0.0, 0.875, 1.5, 2), (1, 0.0, 0.875, 1.5, 2)]


def test_qos_timeout_trigger_serves_the_oldest():
    """r0 (floor 1: K 4 only, 2 out) and r1 (floor 3, 2 out) at 0, batch 1.  Every queue is
    full (K1 [r1], K2 [r1], K4 [r0]).  Timeout 10: the best full queue, K1 [r1] (2.91 against
    K2 1.6 and K4 2 / (4/16 + 2 x 17/16) = 0.84).  Timeout 0: r0 has waited 0 >= 0: the
    queues that serve r0, only K4."""
    reqs = lambda: [R(0, 0.0, 2, 1.0), R(1, 0.0, 2, 3.0)]  # noqa: E731
    out = serve(reqs(), "qos", PM, QUAL, 1, 10.0)
    assert (out[0].K, out[1].K, out[1].start, out[0].start) == (4, 1, 0.0, 0.6875)
    out = serve(reqs(), "qos", PM, QUAL, 1, 0.0)
    assert (out[0].K, out[1].K, out[0].start, out[1].start) == (4, 1, 0.0, 2.375)


def test_qos_timeout_trigger_edge():
    """Batch 3: r0, ra, rb (floor 3, 1 out) at 0 fill K1: prefill 3/16, step 1/4 + 3/16:
    they end at 0.625.  r1 (floor 1) and r2 (floor 3) arrived at 0.375.  Timeout
    0.25 + 1e-9: r1 has waited 0.25 = timeout - 1e-9 exactly: the timeout trigger, K4
    [r1, r2].  Timeout 0.25 + 3e-9: no trigger, no full queue: the best utility, K1 [r2]
    (1 / (1/16 + 5/16) = 2.67 against K4's 2 / (8/16 + 18/16) = 1.23)."""

    def run(timeout):
        reqs = [R(0, 0.0, 1, 3.0), R(7, 0.0, 1, 3.0), R(8, 0.0, 1, 3.0)]
        reqs += [R(1, 0.375, 1, 1.0), R(2, 0.375, 1, 3.0)]
        out = serve(reqs, "qos", PM, QUAL, 3, timeout)
        assert [(r.start, r.K) for r in out[:3]] == [(0.0, 1)] * 3
        return {r.rid: (r.start, r.K) for r in out[3:]}

    assert run(0.25 + 1e-9) == {1: (0.625, 4), 2: (0.625, 4)}
    assert run(0.25 + 3e-9)[2] == (0.625, 1)


def test_fifo_does_not_split_by_utility():
    """r0 (floor 3) and r1 (floor 2) at 0, batch 4: FIFO runs both at K 2 at once, where
    QoS would run r0 alone at K 1 first (its best utility)."""
    out = serve([R(0, 0.0, 2, 3.0), R(1, 0.0, 2, 2.0)], "fifo", PM, QUAL, 4, 10.0)
    assert times(out) == [(0, 0.0, 0.875, 1.5, 2), (1, 0.0, 0.875, 1.5, 2)]


def test_qos_timeout_trigger_with_batch_room():
    """Batch 4, timeout 0: r0 (floor 1) is oldest: K4 [r0, r1] runs both (prefill 8/16,
    step 1 + 2/16: done 0.5 + 2 x 1.125 = 2.75); timeout 10: r1 first at K1 (2.91)."""
    reqs = lambda: [R(0, 0.0, 2, 1.0), R(1, 0.0, 2, 3.0)]  # noqa: E731
    out = serve(reqs(), "qos", PM, QUAL, 4, 0.0)
    assert times(out) == [(0, 0.0, 1.625, 2.75, 4), (1, 0.0, 1.625, 2.75, 4)]
    out = serve(reqs(), "qos", PM, QUAL, 4, 10.0)
    assert (out[1].K, out[1].start, out[0].K, out[0].start) == (1, 0.0, 4, 0.6875)


def test_qos_utility_ties_go_to_the_lower_k():
    """A model whose times do not depend on K: every queue holding the same requests has
    the same utility; r0 (floor 2) is in K2 and K4 only: K 2."""
    flat = SimpleNamespace(prefill_s=lambda K, t: 0.25, step_s=lambda K, B: 0.5)
    (r,) = serve([R(0, 0.0, 2, 2.0)], "qos", flat, QUAL, 4, 10.0)
    assert (r.K, r.first, r.done) == (2, 0.75, 1.25)


def test_qos_utility_can_prefer_a_higher_k():
    """A model with free prefill and 1 s steps whatever K and B: utility = the queue's
    tokens / its longest output.  r0, r1 (floor 1) and r2 (floor 3), 1 token each, at 0:
    K1 [r2]: 1, K2 [r2]: 1, K4 [r0, r1, r2]: 3: K4 runs all three (done at 1)."""
    flat = SimpleNamespace(prefill_s=lambda K, t: 0.0, step_s=lambda K, B: 1.0)
    reqs = [R(0, 0.0, 1, 1.0), R(1, 0.0, 1, 1.0), R(2, 0.0, 1, 3.0)]
    out = serve(reqs, "qos", flat, QUAL, 4, 10.0)
    assert times(out) == [(i, 0.0, 1.0, 1.0, 4) for i in range(3)]


def test_launched_requests_leave_every_queue():
    """Batch 1, timeout 10: r0, r1 (both floor 3, 1 out) at 0: K1 [r0] first (queues hold
    the oldest first), then r1 alone, once: each served exactly once, at K 1; the second
    starts at 1/16 + 5/16 = 0.375."""
    out = serve([R(0, 0.0, 1, 3.0), R(1, 0.0, 1, 3.0)], "qos", PM, QUAL, 1, 10.0)
    assert times(out) == [(0, 0.0, 0.375, 0.375, 1), (1, 0.375, 0.75, 0.75, 1)]


# ---------------------------------------------------------------- continuous batching


def cont3():
    """r0 (floor 3: K 1, 2 out), r1 (floor 2: K 2, 1 out) at 0; r2 (floor 1: K 4, 1 out)
    at 0.1."""
    return [R(0, 0.0, 2, 3.0), R(1, 0.0, 1, 2.0), R(2, 0.1, 1, 1.0)]


def test_continuous_qos_by_hand():
    """Batch 2.  Step 1 at 0: r0, r1 admitted; prefill 1/16 + 2/16 = 3/16, mixed step of
    [1, 2]: 2/4 + 2/16 = 0.625: ends 0.8125 (r1 done, r0 its first token).  Step 2: r2
    (arrived) takes r1's slot at 0.8125; prefill 4/16, step of [1, 4]: 1 + 2/16: ends
    2.1875 (r0 and r2 done).  Each request at its own K."""
    out = serve_continuous(cont3(), "qos", PM, QUAL, max_batch=2)
    assert times(out) == [
        (0, 0.0, 0.8125, 2.1875, 1),
        (1, 0.0, 0.8125, 0.8125, 2),
        (2, 0.8125, 2.1875, 2.1875, 4),
    ]


def test_continuous_admits_only_into_free_slots():
    """Batch 2, all K 1, 1 token of prompt.  r0 (3 out), r1 (1 out) at 0; r2, r3 (1 out) at
    0.1.  Step 1: r0, r1: prefill 2/16, step 1/4 + 2/16: ends 0.5 (r1 done).  Step 2: one
    slot free: r2 only: prefill 1/16 + 0.375: ends 0.9375.  Step 3: r3 takes r2's slot:
    ends 1.375, with r0's last token."""
    reqs = [R(0, 0.0, 3, 3.0), R(1, 0.0, 1, 3.0), R(2, 0.1, 1, 3.0), R(3, 0.1, 1, 3.0)]
    out = serve_continuous(reqs, "qos", PM, QUAL, max_batch=2)
    assert times(out) == [
        (0, 0.0, 0.5, 1.375, 1),
        (1, 0.0, 0.5, 0.5, 1),
        (2, 0.5, 0.9375, 0.9375, 1),
        (3, 0.9375, 1.375, 1.375, 1),
    ]


def test_continuous_fifo_by_hand():
    """Batch 2.  Step 1: K = max(1, 2) = 2: prefill 2 x 2 / 16 = 0.25, step 2/4 + 2/16:
    ends 0.875.  Step 2: r0 and r2: K 4: prefill 4/16, step 1 + 2/16: ends 2.25; r0 ran at
    2 then 4: it records 4."""
    out = serve_continuous(cont3(), "fifo", PM, QUAL, max_batch=2)
    assert times(out) == [
        (0, 0.0, 0.875, 2.25, 4),
        (1, 0.0, 0.875, 0.875, 2),
        (2, 0.875, 2.25, 2.25, 4),
    ]


def test_continuous_fifo_records_the_largest_k():
    """r0 (floor 3, 2 out) and r1 (floor 1, 1 out): step 1 at K 4 (both), step 2 at K 1
    (r0 alone): r0 keeps K 4.  Step 1: prefill 4 x 2 / 16 = 0.5, step 1 + 2/16: 1.625;
    step 2: 1/4 + 1/16: 1.9375."""
    out = serve_continuous([R(0, 0.0, 2, 3.0), R(1, 0.0, 1, 1.0)], "fifo", PM, QUAL)
    assert times(out) == [(0, 0.0, 1.625, 1.9375, 4), (1, 0.0, 1.625, 1.625, 4)]


def test_continuous_default_batch_and_idle_jump():
    """Default max_batch 32: 33 requests at 0 (floor 3, 1 out): 32 in the first step
    (prefill 32/16 = 2, step 1/4 + 32/16: ends 4.25), the 33rd from 4.25.  A request at 9
    (the instance idle) starts at 9."""
    reqs = [R(i, 0.0, 1, 3.0) for i in range(33)] + [R(33, 9.0, 1, 3.0)]
    out = serve_continuous(reqs, "qos", PM, QUAL)
    assert {r.start for r in out[:32]} == {0.0} and {r.done for r in out[:32]} == {4.25}
    assert out[32].start == 4.25 and out[32].done == 4.25 + 1 / 16 + 5 / 16
    assert out[33].start == 9.0 and out[33].done == 9.375
    reqs = [R(i, 0.0, 1, 3.0) for i in range(33)] + [R(33, 9.0, 1, 3.0)]
    assert times(serve_continuous(reqs, "qos", PM, QUAL, 32)) == times(out)


def test_continuous_arrival_during_a_step_waits_for_the_next():
    """Batch 2, r0 (K 1, 3 out) alone at 0: steps of 1/16 + 5/16 then 5/16 each; r1 at
    0.1 (during step 1) is admitted at 0.375, the start of step 2."""
    out = serve_continuous([R(0, 0.0, 3, 3.0), R(1, 0.1, 1, 3.0)], "qos", PM, QUAL, 2)
    # step 2: prefill 1/16, mixed [1, 1]: 1/4 + 2/16 = 0.375: ends 0.8125 (r1 done);
    # step 3: r0 alone, mixed [1]: 1/4 + 1/16: ends 1.125
    assert times(out) == [(0, 0.0, 0.375, 1.125, 1), (1, 0.375, 0.8125, 0.8125, 1)]


# ---------------------------------------------------------------- metrics


def done_reqs():
    """r0: arrival 0, first 1, done 3, 3 out, K 4; r1: arrival 1, first 2, done 5, 1 out,
    K 2; r2 never finished."""
    r0 = Request(0, 0.0, 1, 3, 1.0, start=0.0, first=1.0, done=3.0, K=4)
    r1 = Request(1, 1.0, 1, 1, 1.0, start=1.0, first=2.0, done=5.0, K=2)
    r2 = Request(2, 2.0, 1, 4, 1.0)
    return [r0, r1, r2]


def test_metrics_by_hand():
    """Done: r0, r1; end = 5 (the last done, not the duration 100).  TTFT [1, 1],
    E2E [3, 4], TPOT [(3 - 1) / 2, (5 - 2) / max(1, 0)] = [1, 3].  SLO 3: r0 meets it
    (3 <= 3), r1 not: attainment 0.5, goodput 3 / 5.  Percentiles (linear): p90 of [3, 4]
    = 3.9, p99 = 3.99; of [1, 3]: 2.8, 2.98."""
    m = metrics(done_reqs(), 3.0, 100.0)
    assert m == {
        "requests": 2,
        "throughput_req_s": 0.4,
        "throughput_tok_s": 0.8,
        "slo_attainment": 0.5,
        "goodput_tok_s": 0.6,
        "mean_K": 3.0,
        "ttft": {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0},
        "tpot": {"mean": 2.0, "p50": 2.0, "p90": 2.8, "p99": 2.98},
        "e2e": {"mean": 3.5, "p50": 3.5, "p90": 3.9, "p99": 3.99},
    }


def test_metrics_slo_just_missed():
    m = metrics(done_reqs(), 3.0 - 1e-9, 100.0)
    assert (m["slo_attainment"], m["goodput_tok_s"]) == (0.0, 0.0)
    m = metrics(done_reqs(), 4.0, 100.0)
    assert (m["slo_attainment"], m["goodput_tok_s"]) == (1.0, 0.8)


def test_metrics_rounding():
    """end = 3: 2 / 3 requests/s to 3 digits 0.667, 4 / 3 tokens/s to 1 digit 1.3,
    TTFT [1/3, 1/3] to 4 digits, mean K (4 + 2 + ...) to 3 digits; SLO: 1 of 3 = 0.3333."""
    r0 = Request(0, 0.0, 1, 3, 1.0, first=1 / 3, done=3.0, K=4)
    r1 = Request(1, 1.0, 1, 1, 1.0, first=4 / 3, done=2.0, K=2)
    r2 = Request(2, 1.0, 1, 0, 1.0, first=4 / 3, done=3.0, K=1)
    m = metrics([r0, r1, r2], 1.0, 100.0)
    assert (m["throughput_req_s"], m["throughput_tok_s"]) == (1.0, 1.3)
    assert m["mean_K"] == 2.333 and m["slo_attainment"] == 0.3333
    assert m["ttft"] == {"mean": 0.3333, "p50": 0.3333, "p90": 0.3333, "p99": 0.3333}
    m = metrics([r0, r1], 1.0, 100.0)
    assert (m["throughput_req_s"], m["mean_K"]) == (0.667, 3.0)


def test_metrics_of_one_request():
    """One request done within the SLO: attainment 1 / 1; TPOT (3 - 1) / (2 - 1) = 2."""
    r = Request(0, 0.0, 1, 2, 1.0, first=1.0, done=3.0, K=4)
    m = metrics([r], 3.0, 100.0)
    assert (m["requests"], m["slo_attainment"], m["goodput_tok_s"]) == (1, 1.0, 0.7)
    assert m["tpot"]["mean"] == 2.0 and m["throughput_req_s"] == 0.333


def test_metrics_of_nothing_done():
    """No request done: the duration is the end, rates 0, no means or percentiles."""
    m = metrics([Request(0, 0.0, 1, 1, 1.0)], 3.0, 10.0)
    none = {"mean": None, "p50": None, "p90": None, "p99": None}
    assert m == {
        "requests": 0,
        "throughput_req_s": 0.0,
        "throughput_tok_s": 0.0,
        "slo_attainment": 0.0,
        "goodput_tok_s": 0.0,
        "mean_K": None,
        "ttft": none,
        "tpot": none,
        "e2e": none,
    }
