"""Co-design (``fsedp/experiments/codesign.py``, ``fsedp codesign``): buddy substitution on
the chip's DDR path, measured on the simulated chip and on the project's MoE LM."""

import json

import numpy as np
import pytest

from fsedp.experiments.codesign import ChipBuddyHook, buddy_on_chip
from fsedp.experiments.offload import lm_data


@pytest.fixture(scope="module")
def lm():
    return lm_data(1024)  # 7 context windows: 14 iterations of 64 tokens


@pytest.fixture(scope="module")
def doc(lm):
    model, test, prof = lm
    return buddy_on_chip(model, test, prof, thetas=(1, 2))


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
    rows = doc["rows"]
    assert rows[1]["saved"] > 0 and rows[2]["saved"] >= rows[1]["saved"]
    assert rows[2]["ddr_gb"] < rows[1]["ddr_gb"] < rows[0]["ddr_gb"]
    assert rows[1]["tokens_per_s"] > rows[0]["tokens_per_s"]


def test_substituted_routing_keeps_every_token(doc):
    """At layer 0 (same inputs with and without substitution) every token keeps its top-k,
    each slot its own expert or a buddy of a cold one that the iteration streams anyway."""
    base, sub = doc["traces"][0], doc["traces"][1]
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
    hook = ChipBuddyHook(model.cfg.layers, 64, None, 0)
    model.perplexity(test, hook)
    n = sum(len(x) for x in hook.ids[0])
    assert n == (len(test) - 1) // model.cfg.context * model.cfg.context


def test_cli_codesign(tmp_path, capsys):
    from fsedp.cli import main

    out = tmp_path / "t.md"
    rc = main(["codesign", "--theta", "1", "--max-tokens", "1024", "--json", "--out", str(out)])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(doc["rows"]) == 2 and "traces" not in doc
    assert "| + buddy (theta 1) |" in out.read_text()
    for bad in (["--theta", "0"], ["--theta", "x"], ["--scale-to", "nope"], ["--tokens", "0"]):
        assert main(["codesign", *bad]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("fsedp: <")]
    assert len(err) == 4
