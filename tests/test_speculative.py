"""Speculative MoE: token tables with embedding fallback, the device 2-gram, co-clustering
(CEM, METIS, balanced k-means), local activation rate, the all-to-all volume model and
``fsedp shuffle``."""

import subprocess
import sys

import numpy as np
import pytest

from fsedp.sw.policies.speculative import (
    DeviceBigram,
    TokenTable,
    _balanced,
    cem_placement,
    comm_volume,
    kmeans_placement,
    lar,
    metis_placement,
    place_tokens,
    precision_f1,
    predicted_devices,
)


def planted(n=2000, V=40, E=16, D=4, k=2, seed=0):
    """Token ids in D groups; group g routes only to experts 4g..4g+3 (shuffled labels)."""
    rng = np.random.default_rng(seed)
    label = rng.permutation(E)
    ids = rng.integers(0, V, n)
    group = ids % D
    experts = np.stack(
        [label[group * (E // D) + rng.choice(E // D, k, replace=False)] for group in group]
    )
    return ids, experts[:, None, :], label


def test_precision_f1():
    p, f1 = precision_f1(np.array([[1, 2], [3, 4]]), np.array([[2, 1], [5, 6]]))
    assert p == 0.5 and f1 == 0.5


def test_token_table_and_fallbacks():
    ids = np.array([1, 1, 2, 2, 3])
    ex = np.array([[[0, 1]], [[0, 1]], [[2, 3]], [[2, 3]], [[0, 3]]])
    t = TokenTable(ids, ex, 4)
    assert sorted(t.predict(0, np.array([1]), 2)[0]) == [0, 1]
    assert sorted(t.predict(0, np.array([2]), 2)[0]) == [2, 3]
    # unseen id 9, no embeddings: popularity (0 and 3 are the most used)
    assert sorted(t.predict(0, np.array([9]), 2)[0]) == [0, 3]
    emb = np.zeros((10, 2))
    emb[[1, 2, 3, 9]] = [[1, 0], [0, 1], [1, 1], [0.1, 1]]  # 9 looks like 2
    te = TokenTable(ids, ex, 4, embeddings=emb)
    assert sorted(te.predict(0, np.array([9]), 2)[0]) == [2, 3]
    idx, seen = te.rows(np.array([2, 9]))
    assert seen.tolist() == [True, False] and idx[0] == idx[1]


def test_device_bigram_learns_a_deterministic_sequence():
    rng = np.random.default_rng(0)
    d0, d1 = rng.integers(0, 4, 500), rng.integers(0, 4, 500)
    seq = np.stack([d0, d1, (d0 + d1) % 4], 1)
    assert DeviceBigram(seq[:250], 4).accuracy(seq[250:]) == [1.0]


def test_lar_place_tokens_and_balance():
    assert lar(np.array([0, 1]), np.array([0, 0, 1, 1]), np.array([[0, 2], [2, 3]])) == 0.75
    dev = _balanced(np.random.default_rng(1).random((16, 4)), 4)
    assert np.bincount(dev).tolist() == [4, 4, 4, 4]
    aff = np.zeros((8, 4))
    aff[:, 0] = 10  # everyone wants device 0
    tok = place_tokens(aff, np.array([0, 1, 2, 3]), 4, slack=0.0)
    assert np.bincount(tok, minlength=4).max() <= 2  # capacity respected


def test_co_clustering_recovers_planted_groups():
    ids, ex, _ = planted()
    t = TokenTable(ids, ex, 16)
    rows, _ = t.rows(ids)
    aff = np.zeros((len(t.vocab), 16))
    np.add.at(aff, (np.repeat(rows, 2), ex[:, 0].reshape(-1)), 1)
    dev, tok, val, hist = cem_placement(aff, 4, iters=15, samples=32, seed=1)
    assert val > 0.95 and np.bincount(dev).tolist() == [4, 4, 4, 4]
    assert hist[-1] >= hist[0]
    mdev, _, mval = metis_placement(aff, 4)
    assert np.bincount(mdev).tolist() == [4, 4, 4, 4] and 0.5 < mval <= val
    kdev, _, kval = kmeans_placement(aff, 4)
    assert np.bincount(kdev).tolist() == [4, 4, 4, 4] and 0.5 < kval <= val
    pred = predicted_devices(t, tok, ids, 4)
    assert lar(pred, dev, ex[:, 0]) > 0.95


def test_comm_volume():
    experts = np.array([[0, 1], [2, 3]])
    local = comm_volume(experts, np.array([0, 0, 1, 1]), np.array([0, 1]), 2, 1.0)
    assert local["ep"] == 0 and local["smoe"] == 0 and local["shuffle"] == 0
    v = comm_volume(experts, np.array([1, 1, 0, 0]), np.array([1, 0]), 2, 1.0)
    assert v["ep"] == 4.0 and v["ep_dedup"] == 2.0  # 2 remote experts each way, 1 device
    assert v["smoe"] == 1.0 and v["smoe_dedup"] == 1.0  # only the shuffles, 1 per token


def shuffle(*args):
    return subprocess.run(
        [sys.executable, "-m", "fsedp", "shuffle", *map(str, args)], capture_output=True, text=True
    )


def test_shuffle_on_the_embedded_trace():
    import json

    r = shuffle("--cem-iters", 4, "--cem-samples", 8, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert all(p["precision"] > 2 * p["popularity_precision"] for p in d["prediction"][:3])
    assert all(m["lar"] > d["ep"]["lar"] for m in d["methods"].values())


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--devices", "3"], "do not split evenly"),
        (["--methods", "x"], "--methods"),
        (["--elite", "0"], "--elite"),
        (["/nonexistent.npz"], "no such file"),
    ],
)
def test_bad_shuffle_arguments(args, msg):
    r = shuffle(*args)
    assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1


def test_ci95():
    from fsedp.experiments.shuffle import ci95

    mean, half = ci95([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 / np.sqrt(3))
    assert ci95([0.5]) == (0.5, None)
    assert ci95([1.0] * 40)[1] == 0.0  # beyond the table: 1.96, and no spread


def planted_trace(layers=3, n=3000, seed=0):
    from fsedp.trace import RoutingTrace

    ids, _, _ = planted(n=n, seed=seed)
    ex = np.concatenate([planted(n=n, seed=seed)[1] for _ in range(layers)], axis=1)
    return RoutingTrace(
        experts=ex,
        scores=None,
        token_ids=ids.astype(np.int32),
        request=np.zeros(n, np.int32),
        position=np.arange(n, dtype=np.int32),
        num_experts=16,
        name="<planted>",
    )


def test_evaluate_over_seeds_means_intervals_and_margin():
    """Per method, the mean over seeds of :func:`evaluate`'s figures with a 95 % interval;
    METIS does not depend on the seed (interval 0); the margin is CEM's LAR over the best
    other method, seed by seed."""
    from fsedp.experiments.shuffle import evaluate, format_report

    tr = planted_trace()
    kw = dict(cem_iters=3, cem_samples=8)
    r = evaluate(tr, seeds=[0, 1, 2], **kw)
    runs = [evaluate(tr, seed=s, **kw) for s in (0, 1, 2)]
    for m in ("cem", "metis", "kmeans"):
        lars = [x["methods"][m]["lar"] for x in runs]
        assert r["methods"][m]["lar"] == pytest.approx(np.mean(lars), abs=1e-4)
    assert r["methods"]["metis"]["lar_ci"] == 0.0
    per = [
        x["methods"]["cem"]["lar"] / max(x["methods"][m]["lar"] for m in ("metis", "kmeans")) - 1
        for x in runs
    ]
    assert r["margin"]["lar"] == pytest.approx(np.mean(per), abs=1e-4)
    assert r["seeds"] == [0, 1, 2] and "±" in format_report(r) and "+14.2 %" in format_report(r)
    one = evaluate(tr, seeds=[0], methods=("metis",), **kw)
    assert one["margin"] is None and one["methods"]["metis"]["lar_ci"] is None


def test_shuffle_seeds_and_lm_embeddings_cli(tmp_path):
    import json

    from fsedp.trace.io import save_trace

    r = shuffle("--cem-iters", 2, "--cem-samples", 4, "--seeds", 2, "--methods", "cem,metis")
    assert r.returncode == 0, r.stderr
    assert "CEM's LAR over the best other placement (metis)" in r.stdout
    # a trace whose ids the LM's vocabulary does not hold is refused for --lm-embeddings
    tr = planted_trace(n=500)
    tr.token_ids[0] = 10**6
    path = tmp_path / "big-ids.npz"
    save_trace(tr, path)
    r = shuffle(path, "--lm-embeddings")
    assert r.returncode == 2 and "--lm-embeddings" in r.stderr and r.stderr.count("\n") == 1
    ok = planted_trace(n=500)
    save_trace(ok, tmp_path / "ok.npz")
    r = shuffle(tmp_path / "ok.npz", "--lm-embeddings", "--cem-iters", 2, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["seeds"] == [0]
