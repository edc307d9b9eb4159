"""MoE-Prism's linear gate and its router fine-tuning (``fsedp prism finetune``): the NumPy
gate against the torch module that trains it, the untrained gate against the original
top-j, the weights' rule, the curricula, training that lowers the loss reproducibly with
everything but the gate frozen, and the command end to end."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from test_lm import random_model

from fsedp.experiments.prism import TopK
from fsedp.lm.config import LMConfig
from fsedp.lm.finetune import FinetuneConfig, budget_at
from fsedp.lm.model import MoELM
from fsedp.sw.policies.prism import (
    LinearGate,
    LinearGateHook,
    Partition,
    linear_gate_init,
    linear_gate_select,
    profile_activations,
    refactor,
)

CFG = LMConfig(vocab=97, d_model=16, layers=2, heads=2, context=12, experts=4, top_k=2, d_ffn=8)
S = 2


def refactored(seed=2):
    m = random_model(CFG, seed=seed)
    ids = (np.arange(240) * 7) % CFG.vocab
    ref, part, _ = refactor(m, profile_activations(m, ids), S=S, K=1, g=2, iters=100)
    return m, ref, part


def perturbed(ref, seed=0, std=0.5):
    G, b = linear_gate_init(ref, S)
    rng = np.random.default_rng(seed)
    return LinearGate(G + rng.normal(0, std, G.shape).astype(np.float32), b, S)


@pytest.mark.parametrize("K", [1, 2, 3, 4, 7])
def test_select_keeps_the_k_largest_and_weighs_them_to_min_k_s(K):
    rng = np.random.default_rng(K)
    logits = rng.normal(0, 2, (50, 8))
    w = linear_gate_select(logits, K, S=4)
    assert ((w != 0).sum(1) == K).all()
    assert np.allclose(w.sum(1), min(K, 4))
    # the kept are the largest logits, weighted in proportion to their softmax
    kept_min = np.where(w != 0, logits, np.inf).min(1)
    dropped_max = np.where(w == 0, logits, -np.inf).max(1)
    assert (kept_min >= dropped_max).all()
    p = np.exp(logits - logits.max(1, keepdims=True))
    ratio = np.where(w != 0, w / p, np.nan)
    assert np.allclose(np.nanmax(ratio, 1), np.nanmin(ratio, 1))


def test_untrained_gate_at_whole_experts_is_the_original_top_j():
    m, ref, _ = refactored()
    gate = LinearGate(*linear_gate_init(ref, S), S)
    x = ((np.arange(36) * 5) % CFG.vocab).reshape(3, 12)
    for j in (1, 2):
        got = ref.forward(x, LinearGateHook(ref, gate, j * S).hooks)
        assert np.allclose(got, m.forward(x, TopK(j)), atol=2e-3)
    # below a whole expert it is not: the last sub-expert is dropped
    assert not np.allclose(
        ref.forward(x, LinearGateHook(ref, gate, 1).hooks), m.forward(x, TopK(1))
    )


def test_gate_is_saved_with_the_model_and_checked(tmp_path):
    _, ref, _ = refactored()
    gate = perturbed(ref)
    gate.store(ref)
    ref.save(tmp_path / "g.npz", dtype=np.float32)
    back = LinearGate.of(MoELM.load(tmp_path / "g.npz"))
    assert back.S == S and np.array_equal(back.G, gate.G) and np.array_equal(back.b, gate.b)
    from fsedp.errors import InputError

    def refused(field, **arrays):
        m = MoELM.load(tmp_path / "g.npz")
        for k, v in arrays.items():
            if v is None:
                del m.extra[k]
            else:
                m.extra[k] = v
        with pytest.raises(InputError, match=field):
            LinearGate.of(m)

    refused("prism.router", **{"prism.router": gate.G[:, :, :-1]})
    refused("prism.router", **{"prism.router": np.float32(1.0)})
    refused("prism.router", **{"prism.router": np.where(gate.G > 0, np.nan, gate.G)})
    refused("prism.router_bias", **{"prism.router_bias": None})
    refused("prism.router_bias", **{"prism.router_bias": gate.b[:1]})
    refused("prism.router_bias", **{"prism.router_bias": gate.b + np.inf})
    refused("prism.router", **{"prism.gates": None})  # a gate without a partition
    refused("prism.gates", **{"prism.gates": np.zeros((2, 4, 3, 2), np.int64)})  # 3 !| 8
    refused("prism.gates", **{"prism.gates": np.zeros((2, 4), np.int64)})
    refused("prism.gates", **{"prism.gates": np.full((2, 4, 2, 2), 99, np.int64)})


@pytest.mark.parametrize("schedule", ["increasing", "random", "mixed"])
def test_curricula(schedule):
    rng = np.random.default_rng(0)
    ks = [budget_at(t, 80, 8, schedule, rng) for t in range(80)]
    assert min(ks) >= 1 and max(ks) <= 8
    if schedule == "increasing":
        assert ks == sorted(ks) and ks[0] == 1 and ks[-1] == 8 and len(set(ks)) == 8
    if schedule == "mixed":  # never beyond the increasing schedule's budget, all reached
        assert all(k <= 1 + t * 8 // 80 for t, k in enumerate(ks)) and len(set(ks)) == 8
    if schedule == "random":
        assert len(set(ks)) == 8 and ks != sorted(ks)
    with pytest.raises(ValueError, match="schedule"):
        FinetuneConfig(schedule="decreasing")


@pytest.mark.parametrize("tied", [False, True])
def test_numpy_gate_equals_the_torch_module_at_every_budget(tied):
    """``tied``: duplicated gate columns and no bias, so every sub-expert of an expert ties;
    both sides keep the lower index first (a stable order)."""
    torch = pytest.importorskip("torch", reason="torch is the optional 'model' extra")
    from fsedp.lm.finetune import gated_module

    _, ref, _ = refactored(seed=6 if tied else 5)
    if tied:
        G, b = linear_gate_init(ref, S)
        gate = LinearGate(G, np.zeros_like(b), S)
    else:
        gate = perturbed(ref, seed=1)
    module, state = gated_module(ref, gate)
    x = ((np.arange(36) * 11) % CFG.vocab).reshape(3, 12)
    for K in range(1, CFG.top_k * S + 1):
        state["K"] = K
        with torch.no_grad():
            want, _ = module(torch.from_numpy(x))
        got = ref.forward(x, LinearGateHook(ref, gate, K).hooks)
        assert np.allclose(got, want.numpy(), atol=1e-4), K


def test_only_the_gate_has_gradients():
    torch = pytest.importorskip("torch", reason="torch is the optional 'model' extra")
    from fsedp.lm.finetune import gated_module

    _, ref, _ = refactored(seed=7)
    module, state = gated_module(ref, perturbed(ref))
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable == ["gate_G", "gate_b"]
    state["K"], state["distill"] = 3, True
    logits, kl = module(torch.from_numpy(((np.arange(24) * 5) % CFG.vocab).reshape(2, 12)))
    (logits.square().mean() + kl).backward()
    assert all(p.grad is None for p in module.params.values())
    assert module.gate_G.grad.abs().sum() > 0 and module.gate_b.grad.abs().sum() > 0


def test_finetuning_trains_only_the_gate_lowers_the_loss_and_is_reproducible():
    pytest.importorskip("torch", reason="torch is the optional 'model' extra")
    from fsedp.lm.finetune import finetune_router

    _, ref, _ = refactored(seed=3)
    rng = np.random.default_rng(0)
    # a text the tiny model can learn something about: a repeated random phrase
    ids = np.tile(rng.integers(0, CFG.vocab, 40), 30)
    before = {k: v.copy() for k, v in ref.w.items()}
    init = LinearGate(*linear_gate_init(ref, S), S)
    # the paper's objective alone (the oracle scores of a random model mean little)
    fc = FinetuneConfig(steps=60, batch=4, lr=3e-2, schedule="mixed", distill=0.0, log_every=20)
    gate, hist = finetune_router(ref, init, ids, fc, log=lambda s: None)
    again, _ = finetune_router(ref, init, ids, fc, log=lambda s: None)
    assert np.array_equal(gate.G, again.G) and np.array_equal(gate.b, again.b)
    assert all(np.array_equal(before[k], ref.w[k]) for k in before)  # frozen
    assert not np.allclose(gate.G, init.G)
    assert [h["step"] for h in hist] == [20, 40, 60]
    assert "kl" not in hist[0]
    for K in (1, 2, 3):
        tuned = ref.perplexity(ids[:600], LinearGateHook(ref, gate, K).hooks)
        untrained = ref.perplexity(ids[:600], LinearGateHook(ref, init, K).hooks)
        assert tuned < untrained, K
    with pytest.raises(ValueError, match="window"):
        finetune_router(ref, init, ids[:10], fc)


def test_distillation_moves_the_gate_to_the_oracle_scores():
    pytest.importorskip("torch", reason="torch is the optional 'model' extra")
    from fsedp.lm.finetune import finetune_router

    _, ref, _ = refactored(seed=4)
    ids = (np.arange(2000) * 13) % CFG.vocab
    init = LinearGate(*linear_gate_init(ref, S), S)
    fc = FinetuneConfig(steps=40, batch=4, lr=1e-2, distill=100.0, log_every=10)
    _, hist = finetune_router(ref, init, ids, fc, log=lambda s: None)
    kl = [h["kl"] for h in hist]
    assert kl == sorted(kl, reverse=True) and kl[-1] < 0.8 * kl[0], kl


def cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "fsedp", "prism", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
    )


def test_finetune_command_end_to_end(tmp_path):
    pytest.importorskip("torch", reason="torch is the optional 'model' extra")
    data = tmp_path / "data" / "text"
    data.mkdir(parents=True)
    words = " ".join(["the chip streams experts over rings of chiplets ."] * 200)
    (data / "wikitext-2-valid.tokens").write_text(words + "\n")
    (data / "c4-sample.txt").write_text(words[::-1] + "\n")
    env = {**os.environ, "FSEDP_DATA": str(tmp_path / "absent")}
    r = cli("refactor", "--iters", 0, "--profile-tokens", 512, "--out", tmp_path / "r.npz", env=env)
    assert r.returncode == 0, r.stderr
    r = cli(
        "finetune", "--refactored", tmp_path / "r.npz", "--out", tmp_path / "f.npz",
        "--data", tmp_path / "data", "--steps", 3, "--batch", 2, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    tuned = MoELM.load(tmp_path / "f.npz")
    assert LinearGate.of(tuned) is not None and Partition.of(tuned).S == 4
    log = json.loads(str(tuned.extra["prism.finetune"]))
    assert log["config"]["steps"] == 3 and len(log["history"]) == 1
    r = cli("curve", "--refactored", tmp_path / "f.npz", "--max-tokens", 128, "--json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    curve = doc["curve"]
    for key in ("linear", "finetuned"):
        assert len(curve[key]) == 8
    for op in doc["operating_points"]:
        want = [int(k) for k, v in curve["finetuned"].items() if v <= op["limit"]]
        assert op["finetuned"] == sorted(want)


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--out", "x.txt"], ".npz"),
        (["--out", "{tmp}/x.npz", "--refactored", "/nonexistent.npz"], "no such file"),
        (["--out", "{tmp}/x.npz", "--steps", "0"], "--steps"),
        (["--out", "{tmp}/x.npz", "--schedule", "down"], "--schedule"),
        (["--out", "{tmp}/x.npz", "--refactored", "{model}"], "prism.gates"),
        (["--out", "{tmp}/x.npz"], "--data"),
        (["--out", "{tmp}/x.npz", "--data", "{tmp}/data"], "vocabulary of 97"),
        (["--out", "{tmp}/x.npz", "--data", "{tmp}/data", "--refactored", "{lm}"], "window"),
    ],
)
def test_finetune_bad_input_is_one_line(tmp_path, args, msg):
    from fsedp.lm.model import MoELM
    from fsedp.lm.text import ASSETS

    _, ref, part = refactored()
    part.store(ref)
    ref.save(tmp_path / "r.npz")
    lm = MoELM.load()  # the committed model with a (contiguous) partition
    Partition(lm.cfg.layers, lm.cfg.experts, lm.cfg.d_ffn, 4, 2).store(lm)
    lm.save(tmp_path / "lm.npz")
    text = tmp_path / "data" / "text"
    text.mkdir(parents=True)
    for name in ("wikitext-2-valid.tokens", "c4-sample.txt"):
        (text / name).write_text("a few words\n")  # far fewer than one window
    args = [
        a.format(tmp=tmp_path, model=ASSETS / "moe_lm.npz", lm=tmp_path / "lm.npz") for a in args
    ]
    if "--refactored" not in args:
        args += ["--refactored", str(tmp_path / "r.npz")]
    env = {k: v for k, v in os.environ.items() if k != "FSEDP_DATA"}
    r = cli("finetune", *args, env=env)
    assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "x.npz").exists()
