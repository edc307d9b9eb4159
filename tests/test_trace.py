"""Tests of fsedp.trace: synthetic generator, FLAME loader, windows, sharding, gate records."""

from pathlib import Path

import numpy as np
import pytest

from fsedp.errors import InputError
from fsedp.sw.eit import GateRecord
from fsedp.trace import (
    RoutingTrace,
    dense_request_slots,
    expert_counts,
    gate_records,
    iteration_windows,
    load_flame,
    shard,
    subset,
    synthetic,
)

FLAME = Path(__file__).resolve().parents[1].parent / "shared/data/routing/flame-moe-290m.npz"


@pytest.fixture(scope="module")
def flame():
    if not FLAME.exists():
        pytest.skip(f"{FLAME} not found: the shared data folder is absent")
    return load_flame(FLAME)


# -- synthetic ----------------------------------------------------------------------------


def test_synthetic_is_deterministic():
    a = synthetic(128, 8, 200, layers=3, seed=7)
    b = synthetic(128, 8, 200, layers=3, seed=7)
    c = synthetic(128, 8, 200, layers=3, seed=8)
    assert np.array_equal(a.experts, b.experts)
    assert np.array_equal(a.request, b.request) and np.array_equal(a.position, b.position)
    assert not np.array_equal(a.experts, c.experts)


def test_synthetic_shape_and_distinct_topk():
    t = synthetic(64, 6, 300, layers=4, seed=3)
    assert (t.tokens, t.layers, t.top_k, t.num_experts) == (300, 4, 6, 64)
    assert t.experts.dtype == np.int16 and t.request.dtype == np.int32
    assert t.scores is None and t.token_ids is None
    assert t.experts.min() >= 0 and t.experts.max() < 64
    s = np.sort(t.experts, axis=-1)
    assert (np.diff(s, axis=-1) > 0).all()
    full = synthetic(8, 8, 20, seed=1)  # top_k == experts: a permutation
    assert (np.sort(full.experts, axis=-1) == np.arange(8)).all()


def test_synthetic_requests_are_contiguous_blocks():
    t = synthetic(16, 2, 64, seed=0)
    assert t.request.max() + 1 == 4  # default: tokens // 16
    assert (np.diff(t.request) >= 0).all()
    assert np.array_equal(np.bincount(t.request), [16] * 4)
    assert np.array_equal(t.position, np.tile(np.arange(16), 4))
    t = synthetic(16, 2, 37, requests=4, seed=0)
    sizes = np.bincount(t.request)
    assert sizes.sum() == 37 and sizes.max() - sizes.min() <= 1
    for r in range(4):
        assert np.array_equal(t.position[t.request == r], np.arange(sizes[r]))
    assert synthetic(16, 2, 5).request.tolist() == [0] * 5
    assert synthetic(16, 2, 0).tokens == 0


def test_synthetic_popularity_is_skewed():
    t = synthetic(64, 4, 4000, layers=2, seed=0, skew=1.1)
    c = np.sort(expert_counts(t, 0))[::-1]
    assert c[0] > 10 * c[-1]  # hot head, cold tail
    u = np.sort(expert_counts(synthetic(64, 4, 4000, seed=0, skew=0.0), 0))
    assert u[-1] < 2 * u[0]  # skew 0: uniform
    # each layer has its own popularity order
    assert not np.array_equal(np.argsort(expert_counts(t, 0)), np.argsort(expert_counts(t, 1)))


def test_long_tail_grows_as_tokens_shrink():
    """Figure 2: with fewer tokens per iteration, more experts get fewer than 2 tokens."""
    frac = []
    for tokens in (16, 64, 256, 1024):
        t = synthetic(128, 8, tokens, layers=8, seed=1, skew=1.1)
        frac.append(float((expert_counts(t) < 2).mean()))
    assert all(a > b for a, b in zip(frac, frac[1:])), frac
    assert frac[0] > 0.5 and frac[-1] < 0.05


def test_synthetic_rejects_bad_arguments():
    for kwargs, field in [
        (dict(num_experts=8, top_k=9, tokens=4), "top_k"),
        (dict(num_experts=0, top_k=1, tokens=4), "num_experts"),
        (dict(num_experts=8, top_k=2, tokens=-1), "tokens"),
        (dict(num_experts=8, top_k=2, tokens=4, requests=5), "requests"),
        (dict(num_experts=8, top_k=2, tokens=4, skew=-1), "skew"),
        (dict(num_experts=8, top_k=2, tokens=4, layers=0), "layers"),
    ]:
        with pytest.raises(InputError) as ei:
            synthetic(**kwargs)
        assert ei.value.field == field and "\n" not in str(ei.value)


# -- RoutingTrace validation --------------------------------------------------------------


def make(**over):
    base = dict(
        experts=np.array([[[0, 1]], [[2, 3]]]),
        scores=None,
        token_ids=None,
        request=np.array([0, 0]),
        position=np.array([0, 1]),
        num_experts=4,
        name="t",
    )
    base.update(over)
    return RoutingTrace(**base)


def test_routing_trace_validation():
    t = make()
    assert (t.tokens, t.layers, t.top_k, len(t)) == (2, 1, 2, 2)
    assert t.experts.dtype == np.int16 and t.position.dtype == np.int32
    bad = [
        (dict(experts=np.zeros((2, 2))), "experts"),
        (dict(experts=np.array([[[0, 4]], [[2, 3]]])), "experts"),
        (dict(experts=np.array([[[1, 1]], [[2, 3]]])), "experts"),
        (dict(experts=np.array([[[0.0, 1.0]], [[2.0, 3.0]]])), "experts"),
        (dict(scores=np.zeros((2, 1, 3))), "scores"),
        (dict(scores=np.full((2, 1, 2), np.nan)), "scores"),
        (dict(token_ids=np.zeros(3, int)), "token_ids"),
        (dict(request=np.array([0, -1])), "request"),
        (dict(position=np.array([0])), "position"),
        (dict(num_experts=True), "num_experts"),
    ]
    for over, field in bad:
        with pytest.raises(InputError) as ei:
            make(**over)
        assert (ei.value.file, ei.value.field) == ("t", field), over
        assert str(ei.value).startswith(f"t: {field}: ")


# -- windows, shard, gate records ---------------------------------------------------------


def test_iteration_windows_and_subset():
    t = synthetic(32, 4, 100, layers=2, seed=5)
    w = list(iteration_windows(t, 32))
    assert [x.tokens for x in w] == [32, 32, 32, 4]
    assert [x.tokens for x in iteration_windows(t, 32, drop_last=True)] == [32, 32, 32]
    assert np.array_equal(np.concatenate([x.experts for x in w]), t.experts)
    assert np.array_equal(w[1].request, t.request[32:64])
    assert w[1].name == "synthetic[32:64]"
    with pytest.raises(InputError):
        list(iteration_windows(t, 0))
    r = subset(t, np.arange(99, -1, -1))
    assert np.array_equal(r.experts[0], t.experts[99])


def test_shard_modes():
    t = synthetic(32, 4, 64, seed=5, requests=8)
    by_req = shard(t, 4)
    assert by_req.shape == (64,) and by_req.dtype == np.int64
    assert np.array_equal(by_req, t.request % 4)
    assert all(len(set(by_req[t.request == r])) == 1 for r in range(8))
    by_tok = shard(t, 4, mode="token")
    assert np.array_equal(by_tok, np.arange(64) % 4)
    assert np.array_equal(np.bincount(by_tok), [16] * 4)
    with pytest.raises(InputError):
        shard(t, 4, mode="random")
    with pytest.raises(InputError):
        shard(t, 0)


def test_gate_records_shape_and_order():
    t = synthetic(64, 6, 40, layers=3, seed=2, requests=10)
    chip = shard(t, 4)
    recs = gate_records(t, 1, chip, table_depth=8)
    assert len(recs) == t.tokens * t.top_k
    assert all(type(x) is int for rec in recs for x in rec)
    for i in (0, 17, 39):
        for j in range(t.top_k):
            assert recs[i * t.top_k + j] == (
                int(t.request[i]) % 8,
                int(chip[i]),
                int(t.experts[i, 1, j]),
            )
    GateRecord(*recs[0])  # same field order as the EIT's record
    # identity slots without a table depth; explicit mapping; array mapping
    assert [r[0] for r in gate_records(t, 0, chip)][:: t.top_k] == t.request.tolist()
    slots = dense_request_slots(subset(t, slice(12, 40)), 8)
    assert list(slots.items())[0] == (int(t.request[12]), 0) and max(slots.values()) < 8
    recs = gate_records(subset(t, slice(12, 40)), 0, chip[12:40], slots, table_depth=8)
    assert {r[0] for r in recs} == set(range(len(slots)))
    arr = np.arange(10)[::-1]
    assert gate_records(t, 0, chip, arr)[0][0] == 9 - int(t.request[0])


def test_gate_records_errors():
    t = synthetic(16, 2, 8, seed=0, requests=4)
    chip = shard(t, 4)
    with pytest.raises(InputError) as ei:
        gate_records(t, 1, chip)
    assert ei.value.field == "layer"
    with pytest.raises(InputError):
        gate_records(t, 0, chip[:3])
    with pytest.raises(InputError) as ei:
        gate_records(t, 0, chip, {0: 0})
    assert ei.value.field == "request_slot"
    with pytest.raises(InputError):
        gate_records(t, 0, chip, np.arange(4) + 5, table_depth=8)
    with pytest.raises(InputError):
        dense_request_slots(t, 3)


# -- FLAME --------------------------------------------------------------------------------


def test_load_flame_prefill(flame):
    t = flame
    assert (t.tokens, t.layers, t.top_k, t.num_experts) == (2048, 8, 6, 64)
    assert t.scores is not None and t.scores.dtype == np.float32
    assert t.token_ids is not None and t.token_ids.shape == (2048,)
    assert np.array_equal(t.request, np.arange(2048) // 64)
    assert np.array_equal(t.position, np.arange(2048) % 64)
    assert t.name == "flame-moe-290m:prefill"
    # real routing shows the same long tail as the synthetic generator
    frac = [float((expert_counts(next(iteration_windows(t, n))) < 2).mean()) for n in (16, 64, 256)]
    assert frac[0] > frac[1] > frac[2]
    recs = gate_records(next(iteration_windows(t, 64)), 0, shard(t, 4)[:64], table_depth=8)
    assert len(recs) == 64 * 6


def test_load_flame_decode(flame):
    d = load_flame(FLAME, part="decode")
    assert (d.tokens, d.layers, d.top_k) == (640, 8, 6)
    assert np.array_equal(d.request, np.repeat(np.arange(64), 10))
    assert np.array_equal(d.position, np.tile(np.arange(10), 64))
    with np.load(FLAME) as z:
        assert np.array_equal(d.experts[10 * 3 + 4], z["decode_topk_experts"][3, 4])


def test_load_flame_errors(tmp_path):
    e = pytest.raises(InputError, load_flame, tmp_path / "absent.npz").value
    assert e.field == "<file>" and "\n" not in str(e)

    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file")
    assert pytest.raises(InputError, load_flame, junk).value.field == "<file>"

    good = dict(
        prefill_token_ids=np.zeros(8, np.int32),
        prefill_topk_experts=np.tile(np.arange(2, dtype=np.int16), (8, 2, 1)),
        prefill_topk_scores=np.full((8, 2, 2), 0.5, np.float32),
        prefill_sequence_length=np.int32(4),
        num_experts=np.int32(4),
        top_k=np.int32(2),
    )
    p = tmp_path / "ok.npz"
    np.savez(p, **good)
    t = load_flame(p)
    assert t.tokens == 8 and t.request.tolist() == [0] * 4 + [1] * 4

    cases = [
        ({"prefill_topk_experts": None}, "prefill_topk_experts"),
        ({"prefill_topk_experts": np.zeros((8, 2), np.int16)}, "prefill_topk_experts"),
        ({"prefill_topk_experts": np.full((8, 2, 2), 9, np.int16)}, "prefill_topk_experts"),
        ({"prefill_topk_scores": np.zeros((8, 2, 3), np.float32)}, "prefill_topk_scores"),
        ({"prefill_token_ids": np.zeros(7, np.int32)}, "prefill_token_ids"),
        ({"prefill_sequence_length": np.int32(3)}, "prefill_sequence_length"),
        ({"num_experts": np.float32(4)}, "num_experts"),
        ({"top_k": np.int32(3)}, "top_k"),
    ]
    for i, (over, field) in enumerate(cases):
        arrays = dict(good, **over)
        arrays = {k: v for k, v in arrays.items() if v is not None}
        p = tmp_path / f"bad{i}.npz"
        np.savez(p, **arrays)
        with pytest.raises(InputError) as ei:
            load_flame(p)
        assert (ei.value.file, ei.value.field) == (str(p), field), field
        assert str(ei.value).startswith(f"{p}: {field}: ")
    e = pytest.raises(InputError, load_flame, tmp_path / "ok.npz", part="decode").value
    assert e.field == "decode_topk_experts"


def test_jsonl_positions_without_a_position_count_per_request(tmp_path):
    """A JSON-lines trace whose records name requests but no positions: each token's
    position is its order within its own request (requests interleaved 0 1 0 1 1 give
    positions 0 0 1 1 2), not its order in the file."""
    import json

    from fsedp.trace.io import load_jsonl

    path = tmp_path / "t.jsonl"
    lines = [
        {"token": t, "layer": 0, "experts": [t % 4], "request": r}
        for t, r in enumerate([0, 1, 0, 1, 1])
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    t = load_jsonl(path, num_experts=4)
    assert t.request.tolist() == [0, 1, 0, 1, 1]
    assert t.position.tolist() == [0, 0, 1, 1, 2]
