"""The replay of the offload model's decisions with torch (issue 34), on the CPU with a tiny
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


def test_profile_device_writes_a_valid_profile(tmp_path):
    out = tmp_path / "fit.yaml"
    prof = profile_device(SIZES, 4, torch_device(), out, name="tiny")
    loaded = load_device(str(out))
    assert loaded == prof and loaded.name == "tiny" and not loaded.pinned
    assert sorted(loaded.expert_table_us) == [1, 2, 4]
    # the CPU runs what the host issues; the loop's own cost per run is in the table
    assert loaded.issue == "sync" and loaded.link_issue_us >= 0
    assert loaded.expert_device_us is not None and "inside the replay's loop" in loaded.source
    # a fitted profile drives the model: the replay predicted with it
    cfg = dataclasses.replace(OffloadConfig(cache_rate=0.5, batch=8), device=str(out))
    r = replay_trace(tiny_trace(), cfg, SIZES, torch_device(), steps=2)
    assert r["predicted_tokens_per_s"] > 0


def test_replay_cli(tmp_path, capsys, monkeypatch):
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
