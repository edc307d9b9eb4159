"""The replay of the offload model's decisions with torch, on the CPU with a tiny
model: it moves the model's bytes, runs the model's experts, in the model's order, from the
slots the model's cache put them in; and the fitted profile is a valid one.  Timings are
reported, never asserted (docs/offload.md holds the measured figures)."""

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

from fsedp.cli import main  # noqa: E402
from fsedp.experiments.offload import OffloadConfig, trace_runtime  # noqa: E402
from fsedp.experiments.replay import (  # noqa: E402
    execute,
    profile_device,
    replay_trace,
    torch_device,
)
from fsedp.sw.policies.device import load_device  # noqa: E402

SIZES = (16, 8)  # d_model, d_ffn: 768 weights per expert


def tiny_trace(tokens=96, layers=3, experts=8, k=2, seed=0):
    rng = np.random.default_rng(seed)
    hot = rng.permutation(experts)
    ids = np.stack(
        [
            np.stack([rng.choice(hot[: 5 + l], k, replace=False) for l in range(layers)])
            for _ in range(tokens)
        ]
    )
    return SimpleNamespace(experts=ids, num_experts=experts, layers=layers, name="<tiny>")


def expected_order(decisions):
    return [
        ("fetch", ev["kind"], ev["step"], ev["layer"], ev["unit"])
        if ev["op"] == "fetch"
        else ("run", ev["step"], ev["layer"], tuple(ev["units"]))
        for ev in decisions
    ]


@pytest.mark.parametrize("prefetch", ["none", "transition", "frequency", "oracle"])
@pytest.mark.parametrize("rate", [0.0, 0.25, 0.5, 1.0])
def test_replay_obeys_the_decisions(prefetch, rate):
    trace = tiny_trace()
    cfg = OffloadConfig(cache_rate=rate, prefetch=prefetch, batch=8)
    rt = trace_runtime(trace, cfg)
    stats = rt.timing()
    dec = rt.decisions()
    run = execute(dec, rt, SIZES, torch_device(), verify=True)
    assert run["order"] == expected_order(dec)
    n_fetch = sum(ev["op"] == "fetch" for ev in dec)
    assert run["fetches"] == n_fetch == stats.demand + stats.prefetched
    assert run["bytes"] == n_fetch * 3 * SIZES[0] * SIZES[1] * 4  # float32 on the CPU
    runs = [ev for ev in dec if ev["op"] == "run"]
    assert run["expert_runs"] == sum(len(ev["units"]) for ev in runs) == stats.requested
    assert run["verified_experts"] == stats.requested  # every expert ran its own weights
    assert len(runs) == stats.steps * trace.layers


def test_decisions_follow_the_model_clock():
    """Per (step, layer): its demand fetches, the prefetches it issues (for the next layer),
    then its run; a run waits for exactly its demand fetches and the prefetches it uses."""
    rt = trace_runtime(tiny_trace(), OffloadConfig(cache_rate=0.5, batch=8))
    rt.timing()
    dec = rt.decisions()
    keys = [(ev["step"], ev["layer"]) for ev in dec if ev["op"] == "run"]
    assert keys == sorted(keys)
    fetched = set()
    for ev in dec:
        if ev["op"] == "fetch":
            fetched.add((ev["step"], ev["layer"], ev["unit"]))
            assert ev["kind"] == "demand" or ev["layer"] >= 1
        else:
            assert all((ev["step"], ev["layer"], u) in fetched for u in ev["waits"])
            assert sum(ev["counts"]) == ev["tokens"] * 2  # top-2


def test_replay_trace_reports_both(tmp_path):
    cfg = OffloadConfig(cache_rate=0.5, batch=8)
    r = replay_trace(tiny_trace(), cfg, SIZES, torch_device(), steps=3)
    assert r["model_bytes"] == r["replay_bytes"] and r["steps"] == 3
    assert r["predicted_tokens_per_s"] > 0 and r["measured_tokens_per_s"] > 0


def test_replay_repeat_reports_every_run_and_the_median():
    cfg = OffloadConfig(cache_rate=0.5, batch=8)
    r = replay_trace(tiny_trace(), cfg, SIZES, torch_device(), steps=2, repeat=3)
    assert len(r["runs_s"]) == 3 and r["measured_s"] == sorted(r["runs_s"])[1]


@pytest.fixture
def resolved_link(monkeypatch):
    """The primitives measured for real, but the copies' times replaced by a line (40 us +
    bytes at 5 GB/s): the tiny experts of these tests move a few KiB, whose copy times are
    the copy thread's noise, and such a fit is refused (tests below)."""
    import fsedp.experiments.replay as replay

    measure = replay.measure_primitives

    def resolved(*a, **k):
        prims = measure(*a, **k)
        prims["copy_s"] = {b: 40e-6 + b / 5e9 for b in prims["copy_s"]}
        return prims

    monkeypatch.setattr(replay, "measure_primitives", resolved)


def test_profile_device_writes_a_valid_profile(tmp_path, resolved_link):
    out = tmp_path / "fit.yaml"
    prof = profile_device(SIZES, 4, torch_device(), out, name="tiny")
    loaded = load_device(str(out))
    assert loaded == prof and loaded.name == "tiny" and not loaded.pinned
    assert loaded.link_gbs == 5.0 and loaded.link_latency_us == 40.0  # the line, fitted
    assert sorted(loaded.expert_table_us) == [1, 2, 4]
    # the CPU runs what the host issues; the loop's own cost per run is in the table
    assert loaded.issue == "sync" and loaded.link_issue_us >= 0
    assert loaded.expert_device_us is not None and "inside the replay's loop" in loaded.source
    # a fitted profile drives the model: the replay predicted with it
    cfg = dataclasses.replace(OffloadConfig(cache_rate=0.5, batch=8), device=str(out))
    r = replay_trace(tiny_trace(), cfg, SIZES, torch_device(), steps=2)
    assert r["predicted_tokens_per_s"] > 0


def test_replay_cli(tmp_path, capsys, monkeypatch, resolved_link):
    import fsedp.experiments.replay as replay

    monkeypatch.setattr(replay, "replay_sizes", lambda scale_to, scale: SIZES)
    out = tmp_path / "fit.yaml"
    argv = ["offload", "--trace", "model", "--replay", "--replay-steps", "2", "--json",
            "--cache-rates", "0.5,0.75", "--prefetches", "none,transition",
            "--profile-device", str(out)]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["profile"] == str(out) and len(doc["rows"]) == 4
    assert all(r["model_bytes"] == r["replay_bytes"] for r in doc["rows"])
    assert load_device(str(out)).name == "fitted"


def test_profile_device_leaves_no_file_on_failure(tmp_path, monkeypatch):
    import fsedp.experiments.replay as replay

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(replay, "fit_profile", boom)
    out = tmp_path / "fit.yaml"
    with pytest.raises(KeyboardInterrupt):
        profile_device(SIZES, 2, torch_device(), out)
    assert list(tmp_path.iterdir()) == []


# -- a fit that is not resolved is refused, never written -----------------------
def synthetic_prims(copy_us, ffn_us=None, dense_s=1e-4, issue_s=5e-6, device_s=8e-5):
    """Primitives as :func:`measure_primitives` returns them, from given timings (us): copies
    of 1/16, 1/4, 1 and 2 experts of ``SIZES`` in float32, FFNs at 1, 2, 4 tokens."""
    n = 3 * SIZES[0] * SIZES[1] * 4
    sizes = [n // 16, n // 4, n, 2 * n]
    ffn_us = ffn_us or [80.0, 84.0, 92.0]
    return {
        "copy_s": {b: us * 1e-6 for b, us in zip(sizes, copy_us)},
        "ffn_s": {k: us * 1e-6 for k, us in zip([1, 2, 4], ffn_us)},
        "dense_s": dense_s,
        "batch": 4,
        "issue_s": issue_s,
        "device_s": device_s,
        "in_loop": {"tokens": 1, "s": 90e-6},
    }


def fit(prims):
    from fsedp.experiments.replay import fit_profile

    return fit_profile(prims, SIZES, SimpleNamespace(type="cpu"), "t", load_device())


def test_fit_profile_takes_a_resolved_line():
    n = 3 * SIZES[0] * SIZES[1] * 4
    noise = [1.0, -1.5, 0.5, 0.2]  # us, against 20..600 us of transfer at 5 MB/s
    copy_us = [40 + b / 5 + e for b, e in zip([n // 16, n // 4, n, 2 * n], noise)]
    prof = fit(synthetic_prims(copy_us))
    assert 0.0049 < prof.link_gbs < 0.0051 and 38 < prof.link_latency_us < 42


@pytest.mark.parametrize(
    "copy_us, ffn_us, extra, field",
    [
        # identical copy times at every size: the link term is not there
        ([45.0, 41.0, 47.0, 43.0], None, {}, "link_gbs"),
        # a slope under its own noise (CPU runs fitted 0.5 GB/s to 1e5)
        ([51.6, 45.0, 39.9, 52.1], None, {}, "link_gbs"),
        # a latency far below zero (the copies grow faster than a line through 0 allows)
        ([0.1, 0.2, 300.0, 610.0], None, {}, "link_latency_us"),
        # an FFN line whose intercept is far below zero
        ([40, 80, 200, 360], [1.0, 1.2, 400.0], {}, "expert_launch_us"),
        # an FFN time less the replay loop's (cheaper) run: a table entry below 0 us
        ([40, 80, 200, 360], [300.0, 80.0, 320.0], {}, "expert_table_us.2"),
        # a figure beyond its field's range: a dense matmul at 1e9 TFLOP/s
        ([40, 80, 200, 360], None, {"dense_s": 1e-20}, "expert_tflops"),
    ],
)
def test_fit_profile_refuses_a_fit_it_would_clamp(copy_us, ffn_us, extra, field):
    from fsedp.errors import EnvironmentFailure

    with pytest.raises(EnvironmentFailure) as e:
        fit(synthetic_prims(copy_us, ffn_us, **extra))
    assert field in e.value.reason and "nothing was written" in e.value.todo


def test_an_unresolved_fit_writes_nothing(tmp_path, capsys, monkeypatch):
    import fsedp.experiments.replay as replay

    flat = synthetic_prims([45.0, 41.0, 47.0, 43.0])
    monkeypatch.setattr(replay, "measure_primitives", lambda *a, **k: flat)
    monkeypatch.setattr(replay, "replay_sizes", lambda scale_to, scale: SIZES)
    out = tmp_path / "fit.yaml"
    assert main(["offload", "--profile-device", str(out)]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("fsedp: fitting a device profile on CPU: link_gbs not resolved")
    assert "\n" not in err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, option",
    [
        (["--profile-device", "{out}", "--profile-name", ""], "--profile-name"),
        (["--profile-device", "{out}", "--profile-name", "  "], "--profile-name"),
        (["--profile-device", "{out}", "--profile-name", "n" * 5000], "--profile-name"),
        (["--profile-name", "mine"], "--profile-name"),
        (["--profile-device", ""], "--profile-device"),
        (["--profile-device", "{txt}"], "--profile-device"),
        (["--profile-device", "{txt}", "--trace", "model", "--replay"], "--profile-device"),
    ],
)
def test_profile_options_are_refused_before_measuring(tmp_path, capsys, monkeypatch, argv, option):
    import fsedp.experiments.replay as replay

    def never(*a, **k):
        raise AssertionError("measured before the options were checked")

    monkeypatch.setattr(replay, "measure_primitives", never)
    names = {"out": str(tmp_path / "fit.yaml"), "txt": str(tmp_path / "p.txt")}
    assert main(["offload", *(a.format(**names) for a in argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"fsedp: <command line>: {option}: ")
    assert list(tmp_path.iterdir()) == []
