"""MoE-Prism refactoring: the partition objective, greedy and annealing solver, gate neurons,
the refactored model's equivalence, proxy gating, and the ``fsedp prism`` commands."""

import json
import subprocess
import sys

import numpy as np
import pytest
from test_lm import random_model

from fsedp.lm.config import LMConfig
from fsedp.lm.model import MoELM
from fsedp.sw.policies.prism import (
    Partition,
    SubExpertHook,
    anneal,
    gate_neurons,
    greedy_partition,
    group_norms,
    partition_cost,
    profile_activations,
    refactor,
)


def planted(n=600, F=16, S=4, seed=0):
    """Activations whose neurons form S clusters that fire together, neurons shuffled."""
    rng = np.random.default_rng(seed)
    cluster = rng.permutation(np.repeat(np.arange(S), F // S))
    which = rng.integers(0, S, n)
    act = rng.normal(0, 0.05, (n, F))
    act += (cluster[None, :] == which[:, None]) * rng.normal(2.0, 0.3, (n, F))
    return act, cluster


def test_group_norms_and_cost():
    act = np.array([[3.0, 4.0, 1.0, 0.0], [0.0, 0.0, 2.0, 0.0]])
    assign = np.array([0, 0, 1, 1])
    assert np.allclose(group_norms(act, assign, 2), [[5, 1], [0, 2]])
    assert partition_cost(act, assign, 2, 1) == pytest.approx(1 + 0)
    assert partition_cost(act, assign, 2, 2) == 0


def test_greedy_is_balanced():
    act, _ = planted()
    a = greedy_partition(act, 4)
    assert np.bincount(a).tolist() == [4, 4, 4, 4]
    with pytest.raises(ValueError, match="equal"):
        greedy_partition(act[:, :15], 4)


def test_annealing_finds_the_planted_clusters():
    act, cluster = planted()
    init = greedy_partition(act, 4)
    best, (start, end) = anneal(act, init, 4, 1, iters=4000, seed=1)
    assert end < 0.5 * start and np.bincount(best).tolist() == [4, 4, 4, 4]
    # every found group is one planted cluster
    for g in range(4):
        assert len(set(cluster[best == g])) == 1
    assert end == pytest.approx(partition_cost(act, best, 4, 1))
    # temperature and iterations matter: no proposals, no change
    same, (s0, e0) = anneal(act, init, 4, 1, iters=0)
    assert (same == init).all() and s0 == e0


def test_gate_neurons_are_central_members():
    act, cluster = planted()
    gates = gate_neurons(act, cluster, 4, 2, top_p=0.25)
    for s in range(4):
        assert (cluster[gates[s]] == s).all() and len(set(gates[s])) == 2


TINY = LMConfig(vocab=97, d_model=16, layers=2, heads=2, context=12, experts=4, top_k=2, d_ffn=8)


def test_refactored_model_is_the_same_function_and_proxy_gating_is_exact_at_full_k(tmp_path):
    m = random_model(TINY, seed=2)
    ids = (np.arange(240) * 7) % TINY.vocab
    acts = profile_activations(m, ids)
    ref, part, report = refactor(m, acts, S=2, K=1, g=2, iters=200)
    x = ids[:12][None]
    assert np.allclose(ref.forward(x), m.forward(x), atol=1e-5)  # a permutation only
    full = SubExpertHook(ref, part, K=TINY.top_k * 2)
    assert np.allclose(ref.forward(x, full.hooks), m.forward(x), atol=1e-5)
    one = SubExpertHook(ref, part, K=1)
    assert not np.allclose(ref.forward(x, one.hooks), m.forward(x))
    assert all(r["cost"][2] <= r["cost"][1] + 1e-9 for r in report)  # annealing never worsens
    ref.save(tmp_path / "r.npz", dtype=np.float32)
    back = Partition.of(MoELM.load(tmp_path / "r.npz"))
    assert back.S == 2 and np.array_equal(back.gates, part.gates)
    assert Partition.of(m) is None


def test_oracle_selection_keeps_the_largest_groups():
    m = random_model(TINY, seed=4)
    ids = (np.arange(120) * 5) % TINY.vocab
    _, part, _ = refactor(m, profile_activations(m, ids), S=2, contiguous=True)
    h = SubExpertHook(m, part, K=2, selector="oracle")
    m.forward(ids[:12][None], h.hooks)
    assert h._keep.sum(axis=(1, 2)).tolist() == [2] * 12


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "fsedp", "prism", *map(str, args)], capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "args,msg",
    [
        (["refactor", "--out", "x.txt"], ".npz"),
        (["refactor", "--out", "x.npz", "--objective-k", "4"], "--objective-k"),
        (["refactor", "--out", "x.npz", "--top-p", "2"], "--top-p"),
        (["curve", "--refactored", "/nonexistent.npz"], ""),
    ],
)
def test_bad_prism_arguments(args, msg, tmp_path):
    r = cli(*args)
    assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "x.npz").exists()


def test_prism_and_offload_run_on_the_embedded_trace_without_shared_data(tmp_path):
    import os

    env = {**os.environ, "FSEDP_DATA": str(tmp_path / "absent")}
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "fsedp", *map(str, a)], capture_output=True, text=True, env=env
    )
    r = run(
        "prism", "refactor", "--iters", 20, "--profile-tokens", 1024, "--out", tmp_path / "r.npz"
    )
    assert r.returncode == 0 and "embedded trace" in r.stderr, r.stderr
    r = run("prism", "curve", "--refactored", tmp_path / "r.npz", "--max-tokens", 256, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    curve, full = doc["curve"], doc["curve"]["full"]
    top = str(2 * curve["S"])  # top-2 experts of S sub-experts each: every sub-expert kept
    for name in ("original", "refactored", "refactored_oracle", "contiguous"):
        assert curve[name][top] == pytest.approx(full)  # keeping every sub-expert is exact
    assert all(v >= full - 1e-6 for v in curve["refactored"].values())
    for op in doc["operating_points"]:  # each point derived from the curve it reports
        assert op["limit"] == pytest.approx(op["stable"] * full, abs=1e-3)
        for name in ("original", "refactored"):
            want = [int(k) for k, v in curve[name].items() if v <= op["limit"]]
            assert op[name] == sorted(want)
        assert op["ratio"] == pytest.approx(len(op["refactored"]) / len(op["original"]))
    r = run("offload", "--policy", "buddy", "--rho", 1, "--max-tokens", 256)
    assert r.returncode == 0 and "perplexity" in r.stdout, r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["prism", "curve", "--refactored", "/nonexistent.npz"],
        ["prism", "refactor", "--model", "/nonexistent.npz", "--out", "x.npz"],
        ["offload", "--model", "/nonexistent.npz"],
    ],
)
def test_bad_model_files_are_one_line_without_shared_data(args, tmp_path):
    import os

    env = {**os.environ, "FSEDP_DATA": str(tmp_path / "absent")}
    r = subprocess.run(
        [sys.executable, "-m", "fsedp", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such file" in r.stderr, r.stderr
    assert not (tmp_path / "x.npz").exists()
