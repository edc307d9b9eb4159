"""Hostile input to the software papers' commands: every refusal is one line
``fsedp: FILE: FIELD: REASON`` and exit status 2 -- no traceback, no library warning, no
result computed over nothing -- and a bad option is refused before any model data, trace or
corpus is read."""

import json
import warnings

import numpy as np
import pytest

from fsedp.cli import main
from fsedp.errors import InputError


def refused(capsys, argv, *expect) -> str:
    """Run ``fsedp argv`` in-process with every warning recorded: exit 2, exactly one line
    on stderr starting ``fsedp: `` and holding each of ``expect``, no warning raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsedp: "), err
    assert "Traceback" not in err and "Warning" not in err, err
    assert not caught, [str(w.message) for w in caught]
    for text in expect:
        assert text in lines[0], err
    return lines[0]


@pytest.fixture
def no_data(monkeypatch):
    """No corpora, and any read of model data, corpus or trace fails the test: a refusal
    must come first."""

    def forbidden(*args, **kwargs):
        raise AssertionError("data was read before the options were checked")

    monkeypatch.delenv("FSEDP_DATA", raising=False)
    monkeypatch.setattr("fsedp.experiments.offload.lm_data", forbidden)
    monkeypatch.setattr("fsedp.lm.build.encode_file", forbidden)
    monkeypatch.setattr("fsedp.lm.build.load_tokenizer", forbidden)
    monkeypatch.setattr("fsedp.cli.shuffle.load_trace", forbidden)
    monkeypatch.setattr("fsedp.cli.offload.load_trace", forbidden)


def corpora(root, test_text: str):
    """A data folder of the layout ``fsedp lm eval`` reads, with ``test_text`` held out."""
    text = root / "text"
    text.mkdir(parents=True)
    (text / "wikitext-2-valid.tokens").write_text("the cat sat on the mat .\n" * 40)
    (text / "c4-sample.txt").write_text("a dog ran in the park .\n" * 40)
    (text / "wikitext-2-test.tokens").write_text(test_text)
    return root


# -- 1. tracebacks --------------------------------------------------------------------------


def curve_file(tmp_path, **changes):
    from fsedp.experiments.serve import CURVE

    doc = json.loads(CURVE.read_text())
    doc["curve"]["finetuned"] = dict(doc["curve"]["refactored"])
    doc["curve"].update(changes)
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "gate,changes,field",
    [
        ("finetuned", {"finetuned": [1, 2]}, "curve.finetuned"),
        ("finetuned", {"finetuned": "flat"}, "curve.finetuned"),
        ("proxy", {"S": 0}, "curve.S"),
        ("proxy", {"S": -4}, "curve.S"),
        ("proxy", {"S": 4.5}, "curve.S"),
        ("proxy", {"S": True}, "curve.S"),
        ("proxy", {"S": "4"}, "curve.S"),
        ("proxy", {"full": "50"}, "curve.full"),
        ("proxy", {"full": 10**400}, "curve.full"),
        ("finetuned", {"finetuned": {"x": 50.0}}, "curve.finetuned"),
        ("finetuned", {"finetuned": {"0": 50.0}}, "curve.finetuned"),
        ("proxy", {"original": {"3": 50.0}}, "curve.original"),  # not whole experts (S = 4)
        ("proxy", {"refactored": {"1000": 50.0}}, "curve.refactored"),  # beyond the layer's
    ],
)
def test_serve_checks_the_curve_field_by_field(tmp_path, capsys, gate, changes, field):
    path = curve_file(tmp_path, **changes)
    argv = ["serve", "--curve", path, "--gate", gate, "--policy", "fifo", "--load", "low"]
    refused(capsys, [*argv, "--duration", "1"], str(path), f": {field}: ")


def test_serve_takes_a_curve_that_passes_the_checks(tmp_path, capsys):
    path = curve_file(tmp_path)
    argv = ["serve", "--curve", path, "--gate", "finetuned", "--policy", "qos", "--json"]
    assert main([str(a) for a in [*argv, "--load", "low", "--duration", "5"]]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["requests"] > 0


def test_serve_refuses_a_workload_without_requests(capsys):
    """At 0.9 requests/s, seed 1 draws no arrival in the first second: no latency to
    report (it was a TypeError in the table)."""
    argv = ["serve", "--policy", "fifo", "--load", "low", "--duration", "1", "--seed", "1"]
    refused(capsys, argv, "--duration", "no request arrives")
    assert main([*argv[:-1], "0"]) == 0  # seed 0 draws two
    assert "| low (" in capsys.readouterr().out


def one_token_trace(path, tokens=1):
    from fsedp.trace import RoutingTrace
    from fsedp.trace.io import save_trace

    rng = np.random.default_rng(0)
    experts = np.stack([[rng.choice(4, 2, replace=False) for _ in range(3)] for _ in range(tokens)])
    trace = RoutingTrace(
        experts=experts,
        scores=np.full(experts.shape, 0.5, np.float32),
        token_ids=np.arange(tokens),
        request=np.zeros(tokens, np.int64),
        position=np.arange(tokens),
        num_experts=4,
        name=str(path),
    )
    save_trace(trace, path)
    return path


def test_a_one_token_trace_is_refused(tmp_path, capsys):
    """Fitted on at least one token and measured on the rest, a one-token trace leaves
    nothing to measure: refused, naming the 2 tokens it needs."""
    path = one_token_trace(tmp_path / "one.npz")
    refused(capsys, ["shuffle", path, "--methods", "kmeans"], str(path), "at least 2 tokens")
    refused(capsys, ["shuffle", path, "--methods", "cem,metis"], "at least 2 tokens")
    # the routing-only offload fits its cache the same way
    refused(capsys, ["offload", "--trace", path], str(path), "at least 2 tokens")


def test_shuffle_two_tokens_and_one_device_run(tmp_path, capsys):
    """The smallest trace that can be measured runs; on one device EP moves nothing, so the
    share saved is '-' (not a division by zero)."""
    path = one_token_trace(tmp_path / "two.npz", tokens=2)
    argv = ["shuffle", path, "--methods", "kmeans,metis", "--devices", "1"]
    assert main([str(a) for a in argv]) == 0
    out = capsys.readouterr().out
    assert "| s-MoE, kmeans |" in out and "| - |" in out


# -- 2. options before data -----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,option",
    [
        (["codesign", "--prism", "99"], "--prism"),
        (["codesign", "--budget", "9"], "--budget"),
        (["codesign", "--sub-experts", "3"], "--sub-experts"),
        (["codesign", "--sub-experts", "16"], "--sub-experts"),  # not 8 micro-slices
        (["codesign", "--max-tokens", "5"], "--max-tokens"),
        (["codesign", "--tokens", "0"], "--tokens"),
        (["prism", "refactor", "--out", "{tmp}/r.npz", "--gates", "999"], "--gates"),
        (["prism", "refactor", "--out", "{tmp}/r.npz", "--sub-experts", "3"], "--sub-experts"),
        (["prism", "refactor", "--out", "{tmp}/r.npz", "--profile-tokens", "64"], "--profile"),
        (["prism", "refactor", "--out", "{tmp}/r.npz", "--objective-k", "4"], "--objective-k"),
        (["prism", "curve", "--max-tokens", "64"], "--max-tokens"),
        (["prism", "curve", "--profile-tokens", "64"], "--profile-tokens"),
        (["prism", "curve", "--sub-experts", "3"], "--sub-experts"),
        (["prism", "curve", "--refactored", "{tmp}/r.npz", "--iters", "9"], "--iters"),
        (["offload", "--max-tokens", "64"], "--max-tokens"),
        (["offload", "--policy", "prism", "--sub-experts", "3", "--active", "1"], "--sub-expe"),
        (["offload", "--trace", "model", "--grid"], "--grid"),
        (["offload", "--cache-rates", "0.5"], "--cache-rates"),
        (["offload", "--trace", "model", "--prefetches", "none,bogus"], "--prefetches"),
        (["offload", "--trace", "model", "--policy", "buddy"], "--policy"),
        (["offload", "--out", "{tmp}/o"], "--out"),
        (["shuffle", "{tmp}/t.npz", "--methods", "kmeans,bogus"], "--methods"),
        (["lm", "eval", "--data", "{tmp}/data", "--max-tokens", "5"], "--max-tokens"),
        (
            ["lm", "trace", "--data", "{tmp}/data", "--out", "{tmp}/t.npz", "--max-tokens", "5"],
            "--max-tokens",
        ),
        (["lm", "eval"], "--data"),
    ],
)
def test_options_are_checked_before_any_data(tmp_path, capsys, no_data, argv, option):
    corpora(tmp_path / "data", "held out .\n" * 50)
    (tmp_path / "t.npz").write_bytes(b"not read")
    line = refused(capsys, [a.format(tmp=tmp_path) for a in argv], "<command line>", option)
    assert "no --data folder" not in line


def test_a_model_file_refused_before_the_corpora(tmp_path, capsys, no_data):
    (tmp_path / "m.npz").write_bytes(b"not a model")
    for argv in (
        ["codesign", "--model", tmp_path / "m.npz"],
        ["offload", "--model", tmp_path / "m.npz"],
        ["prism", "curve", "--refactored", tmp_path / "m.npz"],
        ["prism", "refactor", "--out", tmp_path / "r.npz", "--model", tmp_path / "m.npz"],
    ):
        refused(capsys, argv, str(tmp_path / "m.npz"), "<file>")


def test_a_refused_file_prints_no_library_warning(tmp_path, capsys, monkeypatch):
    """A loader that warns and then refuses: the user sees the refusal alone."""

    def warns_then_refuses(path, *args, **kwargs):
        np.float32(np.float64(1e300))  # NumPy: overflow encountered in cast
        warnings.warn("a library's warning", RuntimeWarning, stacklevel=1)
        raise InputError(path, "scores", "must be finite")

    monkeypatch.setattr("fsedp.cli.shuffle.load_trace", warns_then_refuses)
    monkeypatch.setattr("fsedp.cli.offload.load_trace", warns_then_refuses)
    path = tmp_path / "t.npz"
    refused(capsys, ["shuffle", path], str(path), "scores")
    refused(capsys, ["offload", "--trace", path], str(path), "scores")


def test_an_overflowing_trace_is_one_line(tmp_path, capsys):
    """Scores beyond float32, end to end through the real loader."""
    path = tmp_path / "big.npz"
    np.savez(
        path,
        format=np.asarray("fsedp-trace"),
        version=np.asarray(1),
        num_experts=np.asarray(4),
        experts=np.array([[[0, 1]], [[1, 2]]]),
        request=np.array([0, 0]),
        position=np.array([0, 1]),
        scores=np.array([[[1e300, 0.5]], [[0.5, 0.5]]]),
        token_ids=np.array([3, 4]),
    )
    refused(capsys, ["shuffle", path], str(path), "scores")
    refused(capsys, ["offload", "--trace", path], str(path), "scores")


def test_held_warnings_are_issued_when_the_block_succeeds():
    from fsedp.cli.common import held_warnings

    with pytest.warns(RuntimeWarning, match="kept"):
        with held_warnings():
            warnings.warn("kept", RuntimeWarning, stacklevel=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(InputError), held_warnings():
            warnings.warn("dropped", RuntimeWarning, stacklevel=1)
            raise InputError("f", "x", "refused")
    assert not caught


# -- 3. no silent nonsense ------------------------------------------------------------------


def test_offload_names_the_fewest_tokens_that_evaluate(capsys, monkeypatch):
    """64 tokens hold no window of the LM's 128: refused naming 128; 128 evaluate 128."""
    monkeypatch.delenv("FSEDP_DATA", raising=False)
    refused(capsys, ["offload", "--max-tokens", "64"], "--max-tokens", "at least 128")
    assert main(["offload", "--max-tokens", "128", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["perplexity"] > 1.5


@pytest.mark.parametrize("text,count", [("", "no held-out tokens"), ("a few words\n", "held-out")])
def test_lm_eval_refuses_a_corpus_with_nothing_to_evaluate(tmp_path, capsys, text, count):
    data = corpora(tmp_path / "data", text)
    test_file = data / "text" / "wikitext-2-test.tokens"
    line = refused(capsys, ["lm", "eval", "--data", data], str(test_file), count)
    assert "nothing to evaluate" in line or "nothing would be evaluated" in line
    refused(capsys, ["lm", "trace", "--data", data, "--out", tmp_path / "t.npz"], str(test_file))
    assert not (tmp_path / "t.npz").exists()


def refactored_file(tmp_path, **extra):
    from fsedp.lm.model import MoELM
    from fsedp.sw.policies.prism import Partition

    lm = MoELM.load()
    Partition(lm.cfg.layers, lm.cfg.experts, lm.cfg.d_ffn, 4, 2).store(lm)
    for k, v in extra.items():
        if v is None:
            del lm.extra[k]
        else:
            lm.extra[k] = v
    path = tmp_path / "r.npz"
    lm.save(path)
    return path


def gates_outside():
    from fsedp.sw.policies.prism import Partition

    g = Partition(4, 16, 128, 4, 2).gates.copy()
    g[1, 2, 3, 0] = 5  # sub-expert 3 holds neurons 96..127
    return g


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"prism.S": np.asarray(8)}, "prism.S"),
        ({"prism.S": np.asarray(4.0)}, "prism.S"),
        ({"prism.S": np.asarray("four")}, "prism.S"),
        ({"prism.S": np.arange(4)}, "prism.S"),
        ({"prism.S": None}, "prism.S"),
        ({"prism.gates": np.zeros((4, 16, 4, 0), np.int64)}, "prism.gates"),
        ({"prism.gates": np.zeros((4, 16, 4, 33), np.int64)}, "prism.gates"),
        ({"prism.gates": "outside"}, "prism.gates"),
    ],
)
def test_prism_finetune_checks_every_field_it_reads(tmp_path, capsys, extra, field):
    extra = {
        k: gates_outside() if isinstance(v, str) and v == "outside" else v for k, v in extra.items()
    }
    path = refactored_file(tmp_path, **extra)
    data = corpora(tmp_path / "data", "held out .\n")
    argv = ["prism", "finetune", "--refactored", path, "--out", tmp_path / "t.npz"]
    refused(capsys, [*argv, "--data", data], str(path), f": {field}: ")
    refused(capsys, ["prism", "curve", "--refactored", path], str(path), f": {field}: ")
    assert not (tmp_path / "t.npz").exists()


def test_no_perplexity_over_no_token():
    """A perplexity over no predicted token is refused, not 1.0 (nor NaN)."""
    from fsedp.lm.baselines import bigram_perplexity, unigram_perplexity
    from fsedp.lm.build import perplexity
    from fsedp.lm.model import MoELM

    lm = MoELM.load()
    ids = np.arange(300) % lm.cfg.vocab
    assert perplexity(lm, ids[:129]) > 1.0  # one window: 128 tokens predicted
    for short in (ids[:128], ids[:1], ids[:0]):
        with pytest.raises(InputError, match="evaluate"):
            perplexity(lm, short)
    for f in (unigram_perplexity, bigram_perplexity):
        assert f(ids, ids[:2], lm.cfg.vocab) > 1.0
        with pytest.raises(InputError, match="no token to evaluate"):
            f(ids, ids[:1], lm.cfg.vocab)
