"""The project's MoE LM: configuration, NumPy forward pass against the torch trainer, hooks,
reproducible training, the committed weights and their embedded routing trace."""

import subprocess
import sys

import numpy as np
import pytest
from conftest import SHARED_DATA

from fsedp.config import EMBEDDED_TRACE
from fsedp.errors import InputError
from fsedp.lm.config import LMConfig
from fsedp.lm.model import Hooks, MoELM, Routing
from fsedp.lm.text import ASSETS
from fsedp.trace.io import load_trace
from fsedp.trace.stats import summary, trace_stats

TINY = LMConfig(vocab=97, d_model=16, layers=2, heads=2, context=12, experts=4, top_k=2, d_ffn=8)
TEXT = SHARED_DATA / "text"
needs_text = pytest.mark.skipif(
    not (TEXT / "wikitext-2-test.tokens").exists(), reason=f"shared text corpora absent: {TEXT}"
)


def random_model(cfg=TINY, seed=0) -> MoELM:
    rng = np.random.default_rng(seed)
    d, f, e = cfg.d_model, cfg.d_ffn, cfg.experts
    w = {
        "embed": rng.normal(0, 0.3, (cfg.vocab, d)),
        "pos": rng.normal(0, 0.1, (cfg.context, d)),
        "norm_f": np.ones(d),
    }
    for i in range(cfg.layers):
        w.update(
            {
                f"l{i}.norm1": np.ones(d),
                f"l{i}.norm2": np.ones(d),
                f"l{i}.router": rng.normal(0, 1, (d, e)),
                f"l{i}.w1": rng.normal(0, 0.3, (e, d, f)),
                f"l{i}.w3": rng.normal(0, 0.3, (e, d, f)),
                f"l{i}.w2": rng.normal(0, 0.3, (e, f, d)),
            }
        )
        for n in ("wq", "wk", "wv", "wo"):
            w[f"l{i}.{n}"] = rng.normal(0, 0.3, (d, d))
        if cfg.shared_experts:
            s = cfg.shared_experts
            w.update(
                {
                    f"l{i}.s_w1": rng.normal(0, 0.3, (s, d, f)),
                    f"l{i}.s_w3": rng.normal(0, 0.3, (s, d, f)),
                    f"l{i}.s_w2": rng.normal(0, 0.3, (s, f, d)),
                }
            )
    return MoELM(cfg, w)


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(heads=3), "heads"),
        (dict(top_k=5), "top_k"),
        (dict(layers=0), "layers"),
        (dict(shared_experts=-1), "shared_experts"),
        (dict(d_ffn=2.5), "d_ffn"),
    ],
)
def test_bad_config_names_the_field(kw, field):
    with pytest.raises(InputError) as e:
        LMConfig(**{**TINY.as_dict(), **kw})
    assert e.value.field == field


def test_weights_are_checked(tmp_path):
    m = random_model()
    m.w["l1.w2"] = m.w["l1.w2"][:, :-1]
    with pytest.raises(InputError, match="l1.w2: shape"):
        MoELM(TINY, m.w)
    (tmp_path / "x.npz").write_bytes(b"nope")
    r = subprocess.run(
        [sys.executable, "-m", "fsedp", "lm", "eval", "--weights", str(tmp_path / "x.npz")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_save_load_round_trip(tmp_path):
    m = random_model()
    m.save(tmp_path / "m.npz", dtype=np.float32)
    back = MoELM.load(tmp_path / "m.npz")
    ids = np.arange(10)[None] % TINY.vocab
    assert back.cfg == TINY and np.allclose(back.forward(ids), m.forward(ids))


@pytest.mark.parametrize("shared", [0, 1])
def test_numpy_forward_equals_torch(shared):
    torch = pytest.importorskip("torch", reason="torch is the optional 'model' extra")
    from fsedp.lm.train import build_torch_model, to_numpy

    cfg = LMConfig(**{**TINY.as_dict(), "shared_experts": shared})
    module = build_torch_model(cfg, seed=3)
    with torch.no_grad():
        for p in module.parameters():  # larger weights: routing differences show
            p.mul_(5)
    ids = torch.randint(0, cfg.vocab, (3, cfg.context), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, _ = module(ids)
    got = MoELM(cfg, to_numpy(module)).forward(ids.numpy())
    assert np.allclose(got, ref.numpy(), atol=2e-4, rtol=1e-4)


def test_hooks():
    m = random_model()
    ids = (np.arange(24).reshape(2, 12) * 7) % TINY.vocab
    base = m.forward(ids)
    assert np.allclose(m.forward(ids, Hooks()), base)

    class Ones(Hooks):
        def neurons(self, layer, expert, rows, act):
            assert act.shape == (len(rows), TINY.d_ffn)
            return np.ones(TINY.d_ffn)

    assert np.allclose(m.forward(ids, Ones()), base)

    class DropRoute(Hooks):
        def route(self, layer, probs, ids_, weights, tokens):
            return ids_, np.zeros_like(weights)

    class DropNeurons(Hooks):
        def neurons(self, layer, expert, rows, act):
            return np.zeros((len(rows), TINY.d_ffn))

    a, b = m.forward(ids, DropRoute()), m.forward(ids, DropNeurons())
    assert np.allclose(a, b) and not np.allclose(a, base)

    class Swap(Hooks):  # substitute every first choice by expert 0
        def route(self, layer, probs, ids_, weights, tokens):
            assert tokens.shape == (24,) and probs.shape == (24, TINY.experts)
            out = ids_.copy()
            out[:, 0] = np.where(ids_[:, 1] == 0, ids_[:, 0], 0)
            return out, weights

    rec = Routing()
    m.forward(ids, Swap(), rec)
    assert len(rec.ids) == TINY.layers and (rec.ids[0] == 0).any(axis=1).all()
    assert np.allclose(rec.weights[0].sum(1), 1)


def test_training_is_reproducible():
    pytest.importorskip("torch", reason="torch is the optional 'model' extra")
    from fsedp.lm.train import TrainConfig, train

    stream = (np.arange(3000) * 13 % TINY.vocab).astype(np.int32)
    tc = TrainConfig(steps=4, batch=3, warmup=2, log_every=2, seed=5)
    a, ha = train(TINY, tc, stream, log=lambda s: None)
    b, hb = train(TINY, tc, stream, log=lambda s: None)

    def losses(h):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in h]

    assert losses(ha) == losses(hb) and all(np.array_equal(a[k], b[k]) for k in a)
    c, _ = train(
        TINY,
        TrainConfig(steps=4, batch=3, warmup=2, log_every=2, seed=6),
        stream,
        log=lambda s: None,
    )
    assert not np.array_equal(a["embed"], c["embed"])
    assert ha[-1]["train_ce"] < np.log(TINY.vocab) + 0.5


# -- the committed model ---------------------------------------------------------------------
def test_committed_model_and_embedded_trace():
    m = MoELM.load()
    assert (ASSETS / "tokenizer.json").exists() and (ASSETS / "MODEL_CARD.md").exists()
    t = load_trace(EMBEDDED_TRACE)
    assert (t.num_experts, t.top_k, t.layers) == (m.cfg.experts, m.cfg.top_k, m.cfg.layers)
    assert t.token_ids is not None and t.scores is not None and t.tokens >= 8192
    # experts are not collapsed: every expert of every layer carries load, no expert takes a
    # quarter of the slots, and the effective number of experts (exp of the load entropy) is
    # at least half of them (measured: 15.3, 15.3, 13.1, 10.4 of 16)
    for layer in range(t.layers):
        share = (
            np.bincount(t.experts[:, layer].ravel(), minlength=t.num_experts)
            / t.experts[:, layer].size
        )
        effective = float(np.exp(-(share * np.log(share)).sum()))
        assert share.min() > 0.05 / t.num_experts and share.max() < 0.25, share
        assert effective > t.num_experts / 2, effective
    s = summary(trace_stats(t))
    assert s["coact_top1"] > 1.5 / (t.num_experts - 1)  # co-activation is structured
    assert s["cold@16"] > s["cold@64"] > s["cold@256"]  # the long tail of small windows


def test_embedded_trace_matches_the_committed_model():
    """The first window of the embedded trace is what the committed model routes."""
    from fsedp.lm.text import load_tokenizer

    m = MoELM.load()
    t = load_trace(EMBEDDED_TRACE)
    n = m.cfg.context
    rec = Routing()
    m.forward(t.token_ids[:n][None], routing=rec)
    for layer in range(m.cfg.layers):
        assert np.array_equal(np.sort(rec.ids[layer], 1), np.sort(t.experts[:n, layer], 1))
    assert load_tokenizer().get_vocab_size() == m.cfg.vocab


@needs_text
def test_committed_model_beats_ngram_baselines():
    from fsedp.lm.build import evaluate

    res = evaluate(max_tokens=16384)
    assert res["moe_lm"] < 0.8 * res["bigram"] < 0.8 * res["unigram"], res


def test_a_diverged_training_is_one_line_naming_the_learning_rate():
    """A NaN loss never reaches a log line (strict JSON): it is refused naming ``--lr``."""
    from fsedp.errors import InputError
    from fsedp.lm.train import check_finite

    rec = {"step": 3, "train_ce": 2.5, "seconds": 0.1}
    assert check_finite(rec) is rec
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(InputError, match=r"--lr: training diverged at step 3: train_ce"):
            check_finite({**rec, "train_ce": bad})
