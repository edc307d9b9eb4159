"""MoE-Prism QoS serving: the performance model, the workload, the three schedulers' rules
and the ``fsedp serve`` command."""

import subprocess
import sys

import numpy as np
import pytest

from fsedp.sw.policies.device import load_device
from fsedp.sw.policies.qos import (
    PerfModel,
    Request,
    metrics,
    serve,
    serve_continuous,
    workload,
)

PM = PerfModel.on(load_device(), layers=4, d_model=1024, d_ffn=4096, experts=8, top_k=2, S=4)
Q = {k: 100.0 / k for k in range(1, 9)}  # perplexity falls with K
ORIG = {4: Q[4], 8: Q[8]}


def test_perf_model():
    assert PM.step_s(8, 1) < PM.step_s(8, 16) < PM.step_s(8, 64)
    assert PM.step_s(2, 4) < PM.step_s(8, 4)  # fewer sub-experts touched
    # at large batches every sub-expert is read whatever K is: K = 2 at 512 requests and
    # K = 8 at 64 both touch all 32 sub-experts (1 - (1 - K/32)^B > 1 - 1e-8) and are
    # memory-bound, so they take the same time; K = 8 at 512 requests is compute-bound
    assert PM.step_s(2, 512) == pytest.approx(PM.step_s(8, 64), rel=1e-6)
    assert PM.step_s(8, 512) > PM.step_s(2, 512) * 1.1
    assert PM.prefill_s(8, 100) == pytest.approx(2 * PM.prefill_s(8, 50))


def test_workload_is_poisson_and_seeded():
    a = workload(5.0, 200.0, [20, 30], [0.5, 0.5], seed=3)
    b = workload(5.0, 200.0, [20, 30], [0.5, 0.5], seed=3)
    assert [r.arrival for r in a] == [r.arrival for r in b]
    assert 850 < len(a) < 1150 and all(64 <= r.prompt <= 512 for r in a)
    gaps = np.diff([r.arrival for r in a])
    assert abs(gaps.mean() - 0.2) < 0.02 and abs(gaps.std() - 0.2) < 0.03  # exponential


@pytest.mark.parametrize("policy,quality", [("qos", Q), ("fifo", ORIG), ("fullbatch", ORIG)])
def test_every_request_served_once_at_or_above_its_floor(policy, quality):
    reqs = workload(3.0, 60.0, [14.0, 20.0, 30.0], [0.3, 0.4, 0.3], seed=1)
    done = serve(reqs, policy, PM, quality, max_batch=8, timeout=1.0)
    assert all(r.done is not None and r.arrival <= r.start < r.first <= r.done for r in done)
    assert all(quality[r.K] <= r.floor for r in done)
    starts = {}
    for r in done:
        starts.setdefault(r.start, []).append(r)
    assert all(len(b) <= 8 and len({r.K for r in b}) == 1 for b in starts.values())
    # batches do not overlap on the one instance
    spans = sorted(
        (s, max(r.start + (r.done - r.first) + (r.first - r.start) for r in b))
        for s, b in starts.items()
    )
    assert all(spans[i][1] <= spans[i + 1][0] + 1e-9 for i in range(len(spans) - 1))


def test_fifo_starts_at_once_fullbatch_waits_for_the_timeout():
    one = [Request(0, 1.0, 100, 10, 50.0)]
    assert serve([Request(0, 1.0, 100, 10, 50.0)], "fifo", PM, ORIG)[0].start == 1.0
    assert serve(one, "fullbatch", PM, ORIG, timeout=2.5)[0].start == pytest.approx(3.5)


def test_fifo_runs_the_batch_at_its_highest_floor_qos_may_split():
    reqs = [Request(0, 0.0, 100, 50, 100.0 / 8 + 0.1), Request(1, 0.0, 100, 50, 30.0)]
    fifo = serve([Request(**vars(r)) for r in reqs], "fifo", PM, ORIG)
    assert {r.K for r in fifo} == {8}
    qos = serve([Request(**vars(r)) for r in reqs], "qos", PM, Q)
    assert qos[1].K >= 4 and qos[0].K == 8


def test_timeout_trigger_serves_a_starving_high_floor_request():
    # many low-floor requests keep a low-K queue full; the lone high-floor one must not wait
    # much beyond the timeout
    reqs = [Request(0, 0.0, 64, 32, 100.0 / 8 + 0.1)]
    reqs += [Request(i, 0.01 * i, 64, 32, 60.0) for i in range(1, 200)]
    done = serve(reqs, "qos", PM, Q, max_batch=4, timeout=0.5)
    batch = PM.prefill_s(8, 4 * 64) + 32 * PM.step_s(8, 4)
    assert done[0].start <= 0.5 + 2 * batch


def test_qos_beats_fifo_under_high_load():
    from fsedp.experiments.serve import run

    rows = {r["policy"]: r for r in run(["qos", "fifo"], ["high"], duration=120.0, max_batch=8)}
    assert rows["qos"]["throughput_tok_s"] > rows["fifo"]["throughput_tok_s"]
    assert rows["qos"]["goodput_tok_s"] > rows["fifo"]["goodput_tok_s"]
    assert rows["qos"]["mean_K"] < rows["fifo"]["mean_K"]


def test_metrics():
    r = Request(0, 0.0, 10, 11, 50.0, start=1.0, first=2.0, done=12.0, K=8)
    m = metrics([r], slo_e2e=15.0, duration=10.0)
    assert m["ttft"]["mean"] == 2.0 and m["tpot"]["mean"] == 1.0 and m["slo_attainment"] == 1.0
    assert metrics([r], slo_e2e=5.0, duration=10.0)["goodput_tok_s"] == 0


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--max-batch", "0"], "--max-batch"),
        (["--load", "extreme"], "invalid choice"),
        (["--curve", "/nonexistent.json"], "no such file"),
        (["--scale-to", "nope"], "--scale-to"),
        (["--batching", "continuous", "--policy", "fullbatch"], "no continuous form"),
        (["--batching", "dynamic"], "invalid choice"),
    ],
)
def test_bad_serve_arguments(args, msg):
    r = subprocess.run(
        [sys.executable, "-m", "fsedp", "serve", *args], capture_output=True, text=True
    )
    assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_qos_serves_with_the_chosen_gates_curve(tmp_path, batching):
    """``--gate finetuned`` reads the fine-tuned gate's column: the same column as proxy
    gating gives the same rows; a column one sub-expert better at every K lowers the K that
    meets each floor, so QoS runs lower K and serves no fewer tokens."""
    import json

    from fsedp.experiments.serve import CURVE, load_curve, run

    doc = json.loads(CURVE.read_text())
    proxy = doc["curve"]["refactored"]
    kmax = max(int(k) for k in proxy)

    def rows(column):
        doc["curve"]["finetuned"] = column
        path = tmp_path / "c.json"
        path.write_text(json.dumps(doc))
        assert load_curve(path, "finetuned")["refactored"] == {int(k): v for k, v in column.items()}
        kw = dict(duration=60.0, max_batch=8, curve_path=path, batching=batching)
        return run(["qos"], ["high"], gate="proxy", **kw), run(
            ["qos"], ["high"], gate="finetuned", **kw
        )

    a, b = rows(dict(proxy))
    assert a == b
    better = {k: proxy[str(min(kmax, int(k) + 1))] for k in proxy}
    a, b = rows(better)
    assert b[0]["mean_K"] < a[0]["mean_K"] - 0.5
    assert b[0]["throughput_tok_s"] >= a[0]["throughput_tok_s"]


@pytest.mark.parametrize(
    "change,msg",
    [
        ({"finetuned": "above"}, "misses the strictest quality floor"),
        ({"finetuned": "nan"}, "curve.finetuned: needs positive, finite"),
        ({"full": -1.0}, "curve.full"),
    ],
)
def test_a_curve_a_floor_cannot_use_is_one_line(tmp_path, change, msg):
    import json

    from fsedp.experiments.serve import CURVE

    doc = json.loads(CURVE.read_text())
    c = doc["curve"]
    c["finetuned"] = {k: 1.1 * c["full"] for k in c["refactored"]}  # above 1.05x everywhere
    if change.get("finetuned") == "nan":
        c["finetuned"]["1"] = float("nan")
    if "full" in change:
        c["full"] = change["full"]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    r = subprocess.run(
        [sys.executable, "-m", "fsedp", "serve", "--curve", path, "--gate", "finetuned"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and msg in r.stderr, r.stderr


def test_a_curve_without_the_gates_column_is_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "fsedp", "serve", "--gate", "finetuned"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "curve.finetuned" in r.stderr and "fsedp prism finetune" in r.stderr


# -- continuous batching -----------------------------------------------------------------
def test_step_mixed_is_step_when_every_k_is_the_same():
    for K, B in ((1, 1), (3, 7), (8, 64), (2, 512)):
        assert PM.step_mixed_s([K] * B) == pytest.approx(PM.step_s(K, B), rel=1e-12)
    # a request at a lower K makes the step no longer, and touches fewer sub-experts
    assert PM.step_mixed_s([8, 8, 2]) <= PM.step_mixed_s([8, 8, 8])
    assert PM.step_mixed_s([2, 2]) < PM.step_mixed_s([8, 8])


def test_continuous_by_hand():
    """Two requests, the second arriving while the first decodes: it joins at the next step
    boundary (a static batch would make it wait for the first to finish), both steps are
    priced with both requests, and each leaves after its own last token."""
    a = Request(0, 0.0, 100, 3, 100.0)  # floor 100: any K
    b = Request(1, 0.001, 50, 2, 100.0)
    done = serve_continuous([a, b], "qos", PM, Q, max_batch=4)
    p1, s1 = PM.prefill_s(1, 100), PM.step_mixed_s([1])
    t1 = p1 + s1  # a's first token; b arrived during it
    p2, s2 = PM.prefill_s(1, 50), PM.step_mixed_s([1, 1])
    assert a.first == pytest.approx(t1) and b.start == pytest.approx(t1)
    assert b.first == pytest.approx(t1 + p2 + s2)
    assert a.done == pytest.approx(t1 + p2 + 2 * s2)  # tokens 2 and 3 with b running
    assert b.done == pytest.approx(t1 + p2 + 2 * s2) and a.K == b.K == 1
    assert [r.rid for r in done] == [0, 1]
    # max_batch 1: b waits for a's slot
    a2, b2 = Request(0, 0.0, 100, 3, 100.0), Request(1, 0.001, 50, 2, 100.0)
    serve_continuous([a2, b2], "qos", PM, Q, max_batch=1)
    assert b2.start == pytest.approx(a2.done)


@pytest.mark.parametrize("policy,quality", [("qos", Q), ("fifo", ORIG)])
def test_continuous_serves_everyone_within_the_batch_and_floors(policy, quality):
    reqs = workload(6.0, 60.0, [14.0, 20.0, 30.0], [0.3, 0.4, 0.3], seed=2)
    done = serve_continuous(reqs, policy, PM, quality, max_batch=8)
    assert all(r.done is not None and r.arrival <= r.start < r.first <= r.done for r in done)
    assert all(quality[r.K] <= r.floor for r in done)
    if policy == "qos":  # each request at the smallest point that meets its floor
        assert all(r.K == min(k for k in quality if quality[k] <= r.floor) for r in done)
    # never more than max_batch running: count the requests holding a slot at each start
    for r in done:
        assert sum(1 for x in done if x.start <= r.start < x.done) <= 8
    # requests are admitted in arrival order
    order = sorted(done, key=lambda r: r.arrival)
    assert all(order[i].start <= order[i + 1].start for i in range(len(order) - 1))
    with pytest.raises(ValueError, match="policy"):
        serve_continuous(reqs, "fullbatch", PM, quality)


def test_continuous_qos_beats_fifo_under_high_load():
    from fsedp.experiments.serve import run

    rows = run(["qos", "fifo"], ["high"], duration=60.0, max_batch=8, batching="continuous")
    by = {r["policy"]: r for r in rows}
    assert by["qos"]["mean_K"] < by["fifo"]["mean_K"]
    assert by["qos"]["throughput_tok_s"] > by["fifo"]["throughput_tok_s"]
    assert all(r["batching"] == "continuous" for r in rows)
