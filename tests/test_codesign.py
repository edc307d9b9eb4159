"""Co-design (``fsedp/experiments/codesign.py``, ``fsedp codesign``): buddy substitution on
the chip's DDR path and MoE-Prism sub-experts streamed through the slice table, measured on
the simulated chip and on the project's MoE LM."""

import json

import numpy as np
import pytest

from fsedp.experiments.codesign import ChipHook, codesign, techniques
from fsedp.experiments.offload import lm_data


@pytest.fixture(scope="module")
def lm():
    return lm_data(1024)  # 7 context windows: 14 iterations of 64 tokens


@pytest.fixture(scope="module")
def doc(lm):
    model, test, prof = lm
    # FSE-DP alone, buddy at theta 1 and 2, prism K 6 of 8, prism budget 2 of 4, and
    # buddy 1 + prism K 6, buddy 2 + budget 2
    return codesign(model, test, prof, techniques((1, 2), (6,), (2,), 4), prism_iters=300)


def test_fsedp_alone_is_the_plain_model(lm, doc):
    """Without a profile the hook only records: the perplexity is the LM's own and no token
    moves."""
    model, test, _ = lm
    base = doc["rows"][0]
    assert base["perplexity"] == pytest.approx(model.perplexity(test), abs=1e-3)
    assert base["substituted"] == base["saved"] == 0 and base["speedup"] == 1.0


def test_every_row_moves_exactly_the_bytes_of_its_routing(doc):
    """The chip loads each micro-slice an iteration selects once per layer (every
    micro-slice of a whole expert, those of the kept sub-experts under MoE-Prism): the
    simulator's DDR bytes equal that count times the micro-slice size, and no layer beats
    its bound."""
    for r in doc["rows"]:
        assert r["ddr_gb"] == pytest.approx(r["ddr_lower_bound_gb"], abs=1e-3)
        assert r["x_bound"] >= 1.0
    rows = {r["technique"]: r for r in doc["rows"]}
    alone, b1, b2 = rows["FSE-DP alone"], rows["+ buddy (theta 1)"], rows["+ buddy (theta 2)"]
    assert b1["saved"] > 0 and b2["saved"] >= b1["saved"]
    assert b2["ddr_gb"] < b1["ddr_gb"] < alone["ddr_gb"]
    assert b1["tokens_per_s"] > alone["tokens_per_s"]
    # sub-experts: only the selected ones are streamed, fewer bytes than whole experts; the
    # budget streams at most half of every expert
    k6, j2 = rows["+ prism (K 6)"], rows["+ prism (budget 2 of 4)"]
    assert j2["ddr_gb"] <= alone["ddr_gb"] / 2 + 1e-3 and k6["ddr_gb"] < alone["ddr_gb"]
    assert j2["tokens_per_s"] > k6["tokens_per_s"] > alone["tokens_per_s"] * 0.99


def test_substituted_routing_keeps_every_token(doc):
    """At layer 0 (same inputs with and without substitution) every token keeps its top-k,
    each slot its own expert or a buddy of a cold one that the iteration streams anyway."""
    base, sub = doc["traces"]["FSE-DP alone"], doc["traces"]["+ buddy (theta 1)"]
    tokens = doc["tokens"]
    a, b = base.experts[:, 0], sub.experts[:, 0]
    moved = 0
    for i in range(len(a) // tokens):
        rows = slice(i * tokens, (i + 1) * tokens)
        counts = np.bincount(a[rows].ravel(), minlength=base.num_experts)
        streamed = set(np.unique(b[rows]).tolist())
        for t in range(i * tokens, (i + 1) * tokens):
            assert len(set(b[t].tolist())) == len(b[t])
            for e, x in zip(a[t], b[t]):
                if e != x:
                    moved += 1
                    assert counts[e] <= 1 and counts[x] > 1 and x in streamed
    assert moved > 0


def test_hook_records_in_text_order(lm):
    model, test, _ = lm
    hook = ChipHook(model.cfg.layers, 64, None, 0)
    model.perplexity(test, hook)
    n = sum(len(x) for x in hook.ids[0])
    assert n == (len(test) - 1) // model.cfg.context * model.cfg.context


def test_cli_codesign(tmp_path, capsys):
    from fsedp.cli import main

    out = tmp_path / "report"
    rc = main(
        ["codesign", "--theta", "1", "--prism", "", "--budget", "", "--max-tokens", "1024"]
        + ["--tokens", "32,64", "--scale-to", "qwen3-30b-a3b,olmoe-1b-7b", "--json"]
        + ["--out", str(out)]
    )
    doc = json.loads(capsys.readouterr().out)
    runs = doc["runs"]
    assert rc == 0 and [(r["tokens"], r["scale_to"]) for r in runs] == [
        (32, "qwen3-30b-a3b"), (32, "olmoe-1b-7b"), (64, "qwen3-30b-a3b"), (64, "olmoe-1b-7b")
    ]  # fmt: skip
    assert all(len(r["rows"]) == 2 and "traces" not in r for r in runs)
    # the LM's side depends on the tokens per iteration only, the chip's on the sizes too
    assert runs[0]["rows"][1]["perplexity"] == runs[1]["rows"][1]["perplexity"]
    assert runs[0]["rows"][0]["tokens_per_s"] != runs[1]["rows"][0]["tokens_per_s"]
    # a row in each run's table and in its pre-load table
    assert (out / "codesign.md").read_text().count("| + buddy (theta 1) |") == 8
    assert json.loads((out / "codesign.json").read_text())["runs"] == runs
    assert (out / "codesign.png").read_bytes()[:4] == b"\x89PNG"
    bad = (["--theta", "0"], ["--theta", "x"], ["--scale-to", "nope"], ["--tokens", "0"])
    bad += (["--scale-to", "qwen3-30b-a3b,nope"], ["--tokens", ""], ["--tokens", "64,x"])
    bad += (["--selector", "best"], ["--buddy-cap", "-1"], ["--buddy-cap", "x"])
    # 9 > top-2 x 4; 5 > S = 4; 3 does not divide d_ffn 128; 16 divides it but not M = 8
    bad += (["--prism", "9"], ["--budget", "5"], ["--sub-experts", "3"], ["--sub-experts", "16"])
    for b in bad:
        assert main(["codesign", "--max-tokens", "1024", *b]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("fsedp: <")]
    assert len(err) == len(bad)


def test_buddy_cap_saves_at_most_cap_per_iteration_and_layer(lm, doc):
    """The iteration-level cap: at most ``cap`` cold experts saved per iteration and
    layer (the rows name it), fewer saved than without it, and the chip moves the bytes of
    the routing it makes."""
    model, test, prof = lm
    capped = codesign(model, test, prof, techniques((1,), (), (), 4, cap=1), cap=1)
    row = capped["rows"][1]
    free = next(r for r in doc["rows"] if r["technique"] == "+ buddy (theta 1)")
    assert row["technique"] == "+ buddy (theta 1, cap 1)" and capped["buddy_cap"] == 1
    assert 0 < row["saved"] <= row["iterations"] * model.cfg.layers
    assert row["saved"] < free["saved"] and row["ddr_gb"] > free["ddr_gb"]
    assert row["ddr_gb"] == pytest.approx(row["ddr_lower_bound_gb"], abs=1e-3)
    assert capped["rows"][0]["tokens_per_s"] == doc["rows"][0]["tokens_per_s"]


def test_prism_streams_the_union_of_kept_sub_experts(doc, lm):
    """MoE-Prism on the chip: the routing over experts is the plain model's at layer 0;
    each expert streams the micro-slices of the sub-experts its iteration's tokens kept
    (K of top_k x S per token: at least ceil(K / top_k) of S for some expert of every
    token), never more than the budget, and 0 only for an expert none of its tokens kept."""
    model, _, _ = lm
    base, pr = doc["traces"]["FSE-DP alone"], doc["traces"]["+ prism (K 6)"]
    assert pr.num_experts == model.cfg.experts and np.array_equal(
        base.experts[:, 0], pr.experts[:, 0]
    )
    M = doc["config"].datapath_params().micro_slices
    S, tokens = 4, doc["tokens"]
    k6, j2 = doc["slices"]["+ prism (K 6)"], doc["slices"]["+ prism (budget 2 of 4)"]
    assert doc["slices"]["FSE-DP alone"] is None
    for (i, layer), per in k6.items():
        active = set(np.unique(pr.experts[i * tokens : (i + 1) * tokens, layer]).tolist())
        assert set(per) == active
        assert all(v % (M // S) == 0 and 0 <= v <= M for v in per.values())
        # 6 of 8 per token: each token keeps at least 2 sub-experts of one of its experts
        assert max(per.values()) >= 2 * M // S
    assert any(v < M for per in k6.values() for v in per.values())
    assert all(0 < v <= 2 * M // S for per in j2.values() for v in per.values())
    rows = {r["technique"]: r for r in doc["rows"]}
    # with all sub-experts kept the refactored LM is the LM: keeping fewer costs perplexity
    assert rows["+ prism (K 6)"]["perplexity_rise"] > 0
    assert rows["+ prism (budget 2 of 4)"]["perplexity_rise"] > 0


def test_slice_plan_is_the_union_of_masks():
    """``slice_plan`` on a hand-made hook: per iteration and expert, the OR of the tokens'
    sub-expert masks, times M / S micro-slices."""
    from types import SimpleNamespace

    from fsedp.experiments.codesign import slice_plan

    hook = SimpleNamespace(
        sub=SimpleNamespace(S=4),
        ids=[[np.array([[0, 1], [0, 2], [1, 2], [0, 3]])]],
        masks=[[np.array([[0b0001, 0b0011], [0b0100, 0b1000], [0b0000, 0b1000], [0b1111, 0]])]],
    )
    plan = slice_plan(hook, tokens=2, n_iter=2, M=8)
    assert plan[0, 0] == {0: 4, 1: 4, 2: 2}
    assert plan[1, 0] == {1: 0, 2: 2, 0: 8, 3: 0}
    with pytest.raises(ValueError, match="divide"):
        slice_plan(hook, tokens=2, n_iter=2, M=6)


def test_preload_bound_is_a_bound(doc):
    """Predicted pre-loads across layers (an upper bound): the oracle never loads in vain
    when whole experts are needed; the transition predictor's useful bytes never exceed the
    oracle's; what is hidden fits the windows and the buffers; the attention block of these
    64-token iterations is DDR-bound, so only the MoE drain leaves room."""
    for r in doc["rows"]:
        p, o = r["preload"], r["preload_oracle"]
        assert p["attention_window_micro_slices"] == 0
        assert p["buffer_micro_slices"] == 4 * (7 - 3 - 1)
        assert p["useful_mb"] <= o["useful_mb"] + 1e-9
        assert 1.0 <= p["speedup_at_most"] <= o["speedup_at_most"] < 1.05
        if not r["sub_experts"]:
            assert o["vain_mb"] == 0


def test_preloads_across_layers_simulated(doc):
    """Predicted pre-loads across layers, simulated on the streaming engine: no layer
    reports below the bound of the bytes it loaded; the chip's DDR bytes are the row's plus
    exactly the micro-slices loaded in vain; the oracle never loads in vain when whole
    experts are needed; and the gain stays within the upper bound of ``preload_bound``."""
    for r in doc["rows"]:
        for p, b in (
            (r["preload_sim"], r["preload"]),
            (r["preload_sim_oracle"], r["preload_oracle"]),
        ):
            assert p["below_bound"] == 0
            assert p["ddr_gb"] == pytest.approx(r["ddr_gb"] + p["vain_mb"] * 2**20 / 1e9, abs=2e-3)
            assert p["speedup"] <= b["speedup_at_most"] + 1e-4
            assert p["useful_mb"] > 0
        if not r["sub_experts"]:
            assert r["preload_sim_oracle"]["vain_mb"] == 0


def test_attention_ddr_idle_window():
    """The DDR idles during attention only when the block is compute-bound.  Qwen3 sizes on
    the 2x2 chip (d_model 2048, 32 heads, 8 per chiplet, 2048 MACs per cycle): 4 x 2048^2 /
    4 / 2048 = 2048 compute cycles per token; the 16 MiB of weights take 8 micro-slice loads
    per channel of 18 432 cycles = 147 456.  At 64 tokens (131 072 cycles) the block is
    DDR-bound, at 256 (524 288) compute-bound."""
    from fsedp.experiments.codesign import deployment_config
    from fsedp.experiments.offload import lm_data
    from fsedp.sim.setup import make_setup

    model = lm_data(1024)[0]
    s64 = make_setup(deployment_config(model, "qwen3-30b-a3b", 64))
    s256 = make_setup(deployment_config(model, "qwen3-30b-a3b", 256))
    assert s64.dp.ddr_interval == 18_432
    assert s64.attention_ddr_idle_cycles(64) == 0
    assert s64.attention_cycles(64) == 147_456 + s64.ddr_access_cycles
    assert s256.attention_ddr_idle_cycles(256) == 524_288 - 147_456
    assert s256.attention_cycles(256) == 524_288 + s256.ddr_access_cycles


def test_oracle_selector_ranks_by_true_norms(lm):
    """``selector="oracle"`` ranks sub-experts by their true activation norms: at the same
    K it loses less perplexity than the gate neurons' proxy (the bound a trained router
    could reach), and the table says which ranking it used."""
    from fsedp.experiments.codesign import format_table

    model, test, prof = lm
    plan = techniques((), (6,), (), 4)
    proxy = codesign(model, test, prof, plan, prism_iters=300)
    oracle = codesign(model, test, prof, plan, prism_iters=300, selector="oracle")
    assert proxy["rows"][0]["perplexity"] == oracle["rows"][0]["perplexity"]
    assert 0 < oracle["rows"][1]["perplexity_rise"] < proxy["rows"][1]["perplexity_rise"]
    assert "ranked by the oracle" in format_table(oracle)
    assert "ranked by the oracle" not in format_table(proxy)
