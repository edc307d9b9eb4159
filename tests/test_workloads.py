"""Routing workloads: the project's trace format, importers, statistics, the fitted
generator, and recording a Hugging Face MoE model."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import SHARED_DATA

from fsedp.errors import InputError
from fsedp.trace import RoutingTrace, load_flame, synthetic
from fsedp.trace.io import load_any, load_jsonl, load_npy, load_trace, save_trace
from fsedp.trace.stats import summary, trace_stats, window_loads
from fsedp.trace.synth import MATCHED, RoutingModel, distance, fit

FLAME = SHARED_DATA / "routing" / "flame-moe-290m.npz"
needs_flame = pytest.mark.skipif(not FLAME.exists(), reason=f"shared routing data absent: {FLAME}")


def small(tokens=256, experts=16, k=2, layers=3, seed=0) -> RoutingTrace:
    t = synthetic(experts, k, tokens, layers=layers, seed=seed, skew=1.1, requests=4)
    return RoutingTrace(
        experts=t.experts,
        scores=np.full(t.experts.shape, 0.25),
        token_ids=np.arange(tokens) % 50,
        request=t.request,
        position=t.position,
        num_experts=experts,
        name="small",
    )


def same(a: RoutingTrace, b: RoutingTrace):
    assert np.array_equal(a.experts, b.experts) and a.num_experts == b.num_experts
    assert np.array_equal(a.request, b.request) and np.array_equal(a.position, b.position)
    for x, y in ((a.scores, b.scores), (a.token_ids, b.token_ids)):
        assert (x is None) == (y is None) and (x is None or np.allclose(x, y))


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "fsedp", *map(str, args)], capture_output=True, text=True
    )


# -- formats -----------------------------------------------------------------------------
def test_project_format_round_trip(tmp_path):
    t = small()
    save_trace(t, tmp_path / "t.npz")
    same(t, load_trace(tmp_path / "t.npz"))
    same(t, load_any(tmp_path / "t.npz"))


@needs_flame
def test_flame_converts_and_round_trips(tmp_path):
    r = cli("trace", "convert", FLAME, tmp_path / "f.npz")
    assert r.returncode == 0, r.stderr
    same(load_flame(FLAME), load_trace(tmp_path / "f.npz"))


def test_jsonl_import_equals_the_source(tmp_path):
    t = small(tokens=40)
    with open(tmp_path / "t.jsonl", "w") as f:
        for i in range(t.tokens):
            for l in range(t.layers):
                f.write(
                    json.dumps(
                        {
                            "token": i,
                            "layer": l,
                            "experts": t.experts[i, l].tolist(),
                            "probs": t.scores[i, l].tolist(),
                            "request": int(t.request[i]),
                            "position": int(t.position[i]),
                            "token_id": int(t.token_ids[i]),
                        }
                    )
                    + "\n"
                )
    same(t, load_jsonl(tmp_path / "t.jsonl", num_experts=16))
    r = cli("trace", "convert", tmp_path / "t.jsonl", tmp_path / "out.npz", "--num-experts", 16)
    assert r.returncode == 0, r.stderr
    same(t, load_trace(tmp_path / "out.npz"))


def test_npy_import(tmp_path):
    t = small(tokens=30)
    np.save(tmp_path / "t.npy", t.experts)
    got = load_npy(tmp_path / "t.npy")
    assert np.array_equal(got.experts, t.experts) and got.num_experts == int(t.experts.max()) + 1
    assert got.position.tolist() == list(range(30))


@pytest.mark.parametrize(
    "content,field",
    [
        ('{"token": 0, "layer": 0, "experts": [1, 2]}\nnot json\n', "line 2"),
        ('{"token": 0, "layer": 0}\n', "line 1.experts"),
        ('{"token": 0, "layer": 0, "experts": [1, 1]}\n', "experts"),
        ('{"token": 0, "layer": 0, "experts": [1, 2], "probs": [0.5]}\n', "line 1.probs"),
        (
            '{"token": 0, "layer": 0, "experts": [1, 2]}\n'
            '{"token": 0, "layer": 0, "experts": [1, 2]}\n',
            "line 2",
        ),
        (
            '{"token": 0, "layer": 0, "experts": [1, 2]}\n'
            '{"token": 0, "layer": 1, "experts": [1, 2, 3]}\n',
            "experts",
        ),
        ('{"token": 0, "layer": 1, "experts": [1, 2]}\n', "token"),
    ],
)
def test_bad_jsonl_is_one_line_and_writes_nothing(tmp_path, content, field):
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(InputError) as e:
        load_jsonl(tmp_path / "bad.jsonl")
    assert e.value.field == field
    r = cli("trace", "convert", tmp_path / "bad.jsonl", tmp_path / "out.npz")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert str(tmp_path / "bad.jsonl") in r.stderr and not (tmp_path / "out.npz").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.jsonl"]


@pytest.mark.parametrize(
    "make,msg",
    [
        (lambda p: np.save(p / "x.npy", np.zeros((3, 4, 2))), "must hold integers"),
        (lambda p: np.save(p / "x.npy", np.zeros((3, 4), dtype=int)), "must be 3-D"),
        (lambda p: (p / "x.npy").write_bytes(b"garbage"), "not a readable"),
    ],
)
def test_bad_npy(tmp_path, make, msg):
    make(tmp_path)
    r = cli("trace", "stats", tmp_path / "x.npy")
    assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1


def test_unknown_npz_and_wrong_version(tmp_path):
    np.savez(tmp_path / "a.npz", foo=np.zeros(3))
    with pytest.raises(InputError, match="neither an fsedp trace nor a FLAME"):
        load_any(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", format=np.asarray("fsedp-trace"), version=np.asarray(7))
    with pytest.raises(InputError, match="unsupported version 7"):
        load_trace(tmp_path / "b.npz")


# -- statistics --------------------------------------------------------------------------
def test_window_loads_count_every_activation():
    t = small(tokens=256)
    loads = window_loads(t.experts[:, 1], t.num_experts, 64)
    assert loads.shape == (4, 16) and (loads.sum(1) == 64 * t.top_k).all()
    assert np.array_equal(loads[2], np.bincount(t.experts[128:192, 1].ravel(), minlength=16))


def test_stats_see_structure_that_exists_and_not_what_does_not():
    """A trace in which layer l+1 repeats layer l's experts is perfectly inter-layer
    predictable; one whose experts depend only on the token id is token-predictable;
    uniform random routing is neither."""
    rng = np.random.default_rng(0)
    n, e, k = 2000, 16, 2
    ids = rng.integers(0, 20, n)
    table = np.stack([rng.choice(e, k, replace=False) for _ in range(20)])
    first = table[ids]
    structured = RoutingTrace(
        experts=np.stack([first, first, first], 1),
        scores=None,
        token_ids=ids,
        request=np.zeros(n, int),
        position=np.arange(n),
        num_experts=e,
    )
    s = summary(trace_stats(structured))
    assert s["inter_layer"] == 1.0 and s["token_id"] == 1.0
    rand = np.stack([[rng.choice(e, k, replace=False) for _ in range(3)] for _ in range(n)])
    r = summary(
        trace_stats(
            RoutingTrace(
                experts=rand,
                scores=None,
                token_ids=ids,
                request=np.zeros(n, int),
                position=np.arange(n),
                num_experts=e,
            )
        )
    )
    assert r["inter_layer"] < 0.2 and r["token_id"] < 0.2 and r["coact_top1"] < 0.15


@needs_flame
def test_flame_long_tail_grows_as_windows_shrink(tmp_path):
    stats = trace_stats(load_flame(FLAME))
    for layer in range(8):
        cold = [
            next(r["cold"] for r in stats["skew"] if r["window"] == w and r["layer"] == layer)
            for w in (16, 64, 256, 1024)
        ]
        assert cold == sorted(cold, reverse=True) and cold[0] > 0.5 > cold[-1]
    s = summary(stats)
    assert s["inter_layer"] > 2 * s["popularity"]  # Speculative MoE's Appendix A
    r = cli("trace", "stats", FLAME, "--out", tmp_path / "st")
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (tmp_path / "st").iterdir()} == {
        ".fsedp-output.json",
        "stats.json",
        "stats.md",
        "load_tail.png",
        "stats.png",
    }


# -- synthesis ---------------------------------------------------------------------------
def test_synth_is_seeded_and_valid():
    model = RoutingModel(small(tokens=512))
    a, b, c = model.sample(300, seed=1), model.sample(300, seed=1), model.sample(300, seed=2)
    assert np.array_equal(a.experts, b.experts) and not np.array_equal(a.experts, c.experts)
    assert a.tokens == 300 and a.layers == 3 and a.top_k == 2  # RoutingTrace validated it


def test_synth_inter_layer_weight_moves_predictability():
    rng = np.random.default_rng(3)
    n = 1024
    e = np.stack([[rng.choice(16, 2, replace=False) for _ in range(3)] for _ in range(n)])
    e[:, 2] = e[:, 1]  # layer 2 copies layer 1
    src = RoutingTrace(
        experts=e,
        scores=None,
        token_ids=None,
        request=np.zeros(n, int),
        position=np.arange(n),
        num_experts=16,
    )
    flat = summary(trace_stats(RoutingModel(src, a=0.0).sample(1024, 0)))
    tied = summary(trace_stats(RoutingModel(src, a=3.0).sample(1024, 0)))
    assert tied["inter_layer"] > flat["inter_layer"] + 0.2


@needs_flame
def test_synth_matches_flame_within_tolerances(tmp_path):
    source = load_flame(FLAME)
    model, info = fit(source, seed=0)
    assert info["distance"] <= 1.0, info
    # a fresh, longer sample of the fitted model keeps the match
    got = summary(trace_stats(model.sample(2 * source.tokens, seed=5)))
    assert distance(info["source"], got) <= 1.0, {k: (info["source"][k], got[k]) for k in MATCHED}
    r = cli("trace", "synth", "--like", FLAME, "--tokens", 512, "--out", tmp_path / "s.npz")
    assert r.returncode == 0, r.stderr
    assert load_trace(tmp_path / "s.npz").tokens == 512


# -- Hugging Face ------------------------------------------------------------------------
def test_record_a_tiny_random_transformers_moe(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is the optional 'model' extra")
    transformers = pytest.importorskip(
        "transformers", reason="transformers is the optional 'model' extra"
    )
    from fsedp.lm.text import train_tokenizer
    from fsedp.trace.io import record_hf

    torch.manual_seed(0)
    tok = train_tokenizer(["the tiny model routes these words to its experts " * 40], 300)
    cfg = transformers.MixtralConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=256,
    )
    transformers.MixtralForCausalLM(cfg).save_pretrained(tmp_path / "m")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(tmp_path / "m")
    (tmp_path / "t.txt").write_text("the experts of the tiny model see these words " * 20)
    whole = record_hf(tmp_path / "m", tmp_path / "t.txt", max_tokens=150, seq_len=150)
    cut = record_hf(tmp_path / "m", tmp_path / "t.txt", max_tokens=150, seq_len=50)
    assert whole.experts.shape == (150, 3, 2) and whole.num_experts == 8
    # causal: the first window's routing does not depend on what follows it
    assert np.array_equal(whole.experts[:50], cut.experts[:50])
    assert np.allclose(whole.scores[:50], cut.scores[:50], atol=1e-5)
    assert (np.diff(whole.scores, axis=-1) <= 0).all() and (whole.scores.sum(-1) <= 1 + 1e-6).all()
    assert cut.request.max() == 2 and cut.position[50] == 0
    r = cli(
        "trace",
        "record",
        "--model",
        tmp_path / "m",
        "--text",
        tmp_path / "t.txt",
        "--max-tokens",
        64,
        "--out",
        tmp_path / "r.npz",
    )
    assert r.returncode == 0, r.stderr
    assert load_trace(tmp_path / "r.npz").tokens == 64
    r = cli(
        "trace",
        "record",
        "--model",
        tmp_path / "nothing",
        "--text",
        tmp_path / "t.txt",
        "--out",
        tmp_path / "x.npz",
    )
    assert r.returncode == 2 and "cannot load a transformers model" in r.stderr
    assert not (tmp_path / "x.npz").exists()
