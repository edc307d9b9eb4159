"""Co-design (``fsedp/experiments/codesign.py``, ``fsedp codesign``): buddy substitution on
the chip's DDR path, measured on the simulated chip and on the project's MoE LM."""

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
    # FSE-DP alone, buddy at theta 1 and 2, prism K 6 of 8, buddy 1 + prism 6
    return codesign(model, test, prof, techniques((1, 2), (6,), 4), prism_iters=300)


def test_fsedp_alone_is_the_plain_model(lm, doc):
    """Without a profile the hook only records: the perplexity is the LM's own and no token
    moves."""
    model, test, _ = lm
    base = doc["rows"][0]
    assert base["perplexity"] == pytest.approx(model.perplexity(test), abs=1e-3)
    assert base["substituted"] == base["saved"] == 0 and base["speedup"] == 1.0


def test_every_row_moves_exactly_the_bytes_of_its_routing(doc):
    """The chip loads each expert an iteration selects once per layer: the simulator's DDR
    bytes equal that count times the expert size, and no layer beats its bound."""
    for r in doc["rows"]:
        assert r["ddr_gb"] == pytest.approx(r["ddr_lower_bound_gb"], abs=1e-3)
        assert r["x_bound"] >= 1.0
    rows = {r["technique"]: r for r in doc["rows"]}
    alone, b1, b2 = rows["FSE-DP alone"], rows["+ buddy (theta 1)"], rows["+ buddy (theta 2)"]
    assert b1["saved"] > 0 and b2["saved"] >= b1["saved"]
    assert b2["ddr_gb"] < b1["ddr_gb"] < alone["ddr_gb"]
    assert b1["tokens_per_s"] > alone["tokens_per_s"]
    # sub-experts: only the selected ones are streamed, fewer bytes than whole experts
    assert rows["+ prism, sub-experts as experts (K 6)"]["ddr_gb"] < alone["ddr_gb"]


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
        ["codesign", "--theta", "1", "--prism", "", "--max-tokens", "1024", "--json"]
        + ["--out", str(out)]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(doc["rows"]) == 2 and "traces" not in doc
    assert "| + buddy (theta 1) |" in (out / "codesign.md").read_text()
    assert json.loads((out / "codesign.json").read_text())["rows"] == doc["rows"]
    assert (out / "codesign.png").read_bytes()[:4] == b"\x89PNG"
    bad = (["--theta", "0"], ["--theta", "x"], ["--scale-to", "nope"], ["--tokens", "0"])
    bad += (["--prism", "9"], ["--sub-experts", "3"])  # 9 > top-2 x 4; 3 does not divide 128
    for b in bad:
        assert main(["codesign", "--max-tokens", "1024", *b]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("fsedp: <")]
    assert len(err) == len(bad)


def test_prism_routing_streams_only_selected_sub_experts(doc, lm):
    """MoE-Prism on the chip: every token keeps K distinct sub-experts, each of one of its
    own experts (at layer 0 the inputs are the plain model's), and the chip's experts are
    the E x S sub-experts."""
    model, _, _ = lm
    base = doc["traces"]["FSE-DP alone"]
    pr = doc["traces"]["+ prism, sub-experts as experts (K 6)"]
    S = 4
    assert pr.num_experts == model.cfg.experts * S and pr.top_k == 6
    for t in range(len(base.experts)):
        subs = pr.experts[t, 0].tolist()
        assert len(set(subs)) == 6
        assert {v // S for v in subs} <= set(base.experts[t, 0].tolist())
    rows = {r["technique"]: r for r in doc["rows"]}
    # with all sub-experts kept the refactored LM is the LM: K < 8 costs some perplexity
    assert rows["+ prism, sub-experts as experts (K 6)"]["perplexity_rise"] > 0
