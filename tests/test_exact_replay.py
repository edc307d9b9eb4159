"""The replay experiment's fitting (``fsedp/experiments/replay.py``) pinned by hand: the
replayed sizes, the least-squares line and its errors, and every refusal of a fit."""

import math

import numpy as np
import pytest

from fsedp.errors import EnvironmentFailure
from fsedp.experiments import replay
from fsedp.experiments.offload import expert_sizes


def test_replay_sizes_divide_and_stay_at_least_one():
    d, f = expert_sizes("deepseek-v2-lite")
    assert replay.replay_sizes("deepseek-v2-lite") == (d, f)
    assert replay.replay_sizes("deepseek-v2-lite", 3) == (d // 3, f // 3)
    assert replay.replay_sizes("deepseek-v2-lite", 10**9) == (1, 1)


def test_line_by_hand():
    """y = 2x + 1 through 3 points: no residual.  (0, 0), (1, 2), (2, 1): slope 0.5,
    intercept 0.5, residuals -0.5, 1, -0.5: RSS 1.5 over n - 2 = 1, rse sqrt(1.5); the
    slope's error rse / sqrt(sum (x - 1)^2 = 2).  Two points: no residual to judge by."""
    assert replay._line(np.array([0.0, 1, 2]), np.array([1.0, 3, 5])) == pytest.approx(
        (2.0, 1.0, 0.0, 0.0), abs=1e-12
    )
    got = replay._line(np.array([0.0, 1, 2]), np.array([0.0, 2, 1]))
    assert got == pytest.approx((0.5, 0.5, math.sqrt(1.5), math.sqrt(1.5) / math.sqrt(2)))
    two = replay._line(np.array([0.0, 1]), np.array([1.0, 4]))
    assert two[:2] == pytest.approx((3.0, 1.0)) and two[2:] == (math.inf, math.inf)
    assert all(type(v) is float for v in two)


#: copies of 1000 and 4000 bytes taking 1 and 4 us
COPIES = (np.array([1000.0, 4000.0]), np.array([1e-6, 4e-6]))
SPAN = "copies of 1000..4000 B took 1..4 us"


def problems(slope=1e-9, icpt=0.0, rse=2e-7, slope_se=0.0, launch=(0.0, 0.0), raw=None, table=None):
    """The problems _check_fit names, or [] when it accepts."""
    try:
        replay._check_fit(
            (COPIES, (slope, icpt, rse, slope_se)), launch, raw or {}, table or {}, "x"
        )
    except EnvironmentFailure as e:
        assert e.what == "fitting a device profile on x"
        assert e.todo == (
            "nothing was written; measure again on a quiet machine, with larger copies (a "
            "smaller --replay-scale) where the link is not resolved"
        )
        return e.reason.split(", ")
    return []


def test_a_good_fit_is_accepted_at_every_edge():
    """Slope error exactly 25 % of the slope; intercepts exactly one residual below 0;
    fields and table entries at the ends of their ranges."""
    assert problems(slope_se=0.25e-9) == []
    assert problems(icpt=-2e-7, launch=(-1e-6, 1e-6)) == []
    assert problems(raw={"expert_tflops": 1e-6, "link_gbs": 1e5}, table={"1": 0.0, "8": 1e8}) == []


def test_every_refusal_of_a_fit_by_hand():
    assert problems(slope=0.0) == [f"link_gbs not resolved: {SPAN}", "not growing with the bytes"]
    assert problems(slope=-1e-9)[0] == f"link_gbs not resolved: {SPAN}"
    assert problems(slope_se=0.3e-9) == [
        f"link_gbs not resolved: {SPAN}; the fit gives 1 GB/s +- 30 % (bound 25 %)",
        "residual 0.2 us",
    ]
    assert problems(icpt=-3e-7) == [
        "link_latency_us fitted -0.3 us",
        "below 0 by more than the fit's residual 0.2 us",
    ]
    assert problems(launch=(-2e-6, 1e-6)) == [
        "expert_launch_us fitted -2 us",
        "below 0 by more than the fit's residual 1 us",
    ]
    assert problems(raw={"expert_tflops": 2e5}) == [
        "expert_tflops measured 2e+05 TFLOP/s",
        "outside the field's range 1e-06..100000",
    ]
    assert problems(raw={"link_gbs": math.nan})[0] == "link_gbs measured nan GB/s"
    assert problems(table={"4": -1.0}) == [
        "expert_table_us.4 came out -1 us",
        "outside 0..1e+08 us",
    ]
    assert problems(table={"4": 2e8}) == [
        "expert_table_us.4 came out 2e+08 us",
        "outside 0..1e+08 us",
    ]
    # all at once, in that order
    assert len(problems(slope=0.0, icpt=-1.0, raw={"link_gbs": 0.0}, table={"1": -1.0})) == 8


def prims(ffn_us=None):
    """Copies of 1, 2 and 4 kB taking 10 us + 1 ns per byte (1 GB/s, 10 us latency);
    FFNs of 80, 84, 92 us at 1, 2, 4 tokens (4 us a token over 76 us); the loop's run at 1
    token 90 us (10 us more than the FFN alone); a dense matmul of 4 tokens in 100 us."""
    ffn_us = ffn_us or {1: 80.0, 2: 84.0, 4: 92.0}
    return {
        "copy_s": {b: 10e-6 + b * 1e-9 for b in (1000, 2000, 4000)},
        "ffn_s": {k: us * 1e-6 for k, us in ffn_us.items()},
        "dense_s": 1e-4,
        "batch": 4,
        "issue_s": 5e-6,
        "device_s": 8e-5,
        "in_loop": {"tokens": 1, "s": 90e-6},
    }


def fitted(p):
    from types import SimpleNamespace

    from fsedp.sw.policies.device import load_device

    base = load_device()
    return replay.fit_profile(p, (1000, 4000), SimpleNamespace(type="cpu"), "t", base), base


def test_fit_profile_by_hand():
    """Link 1 GB/s and 10 us; launch 76 us (the FFN line's intercept); host issue time
    5 us, device 80 us; dense 4 x 2 x 4 x 1000^2 FLOPs in 100 us = 0.32 TFLOP/s; the table the FFN
    times plus the loop's 10 us: 90, 94, 102 us.  The serving fields are the base's."""
    prof, base = fitted(prims())
    assert (prof.name, prof.pinned, prof.issue) == ("t", False, "sync")
    assert prof.link_gbs == 1.0 and prof.link_latency_us == 10.0
    assert prof.expert_launch_us == 76.0 and prof.link_issue_us == 5.0
    assert prof.expert_device_us == 80.0 and prof.expert_tflops == 0.32
    assert prof.expert_table_us == {1: 90.0, 2: 94.0, 4: 102.0}
    assert (prof.tflops, prof.memory_gbs, prof.step_launch_us) == (
        base.tflops, base.memory_gbs, base.step_launch_us,
    )  # fmt: skip
    assert "on CPU (d 1000, f 4000, " in prof.source
    assert "per-expert slope 4 us/token" in prof.source
    assert "(1: 80, 2: 84, 4: 92 us) plus 10 us per run" in prof.source


def test_fit_profile_of_two_and_of_one_ffn_point():
    """Two FFN points (1: 80, 3: 88 us) are a line: launch 76 us; one point (2: 84 us) is
    its own launch, slope 0; the table keeps three decimals of a microsecond."""
    prof, _ = fitted(prims({1: 80.0, 3: 88.0}))
    assert prof.expert_launch_us == 76.0
    prof, _ = fitted(prims({2: 84.0}))
    assert prof.expert_launch_us == 84.0 and "per-expert slope 0 us/token" in prof.source
    prof, _ = fitted(prims({1: 80.0001234, 2: 84.0}))
    assert prof.expert_table_us[1] == 90.0 and prof.expert_table_us[2] == 94.0
    prof, _ = fitted({**prims({1: 80.0, 2: 84.0}), "in_loop": {"tokens": 1, "s": 90.0012e-6}})
    assert prof.expert_table_us == {1: 90.001, 2: 94.001}


def test_cold_items_fill_the_cold_bytes_within_their_bounds():
    """ceil(COLD_BYTES / item) items, at least lo (1) and at most hi (256)."""
    n = replay.COLD_BYTES
    assert replay._cold(n) == 1 and replay._cold(n - 1) == 2
    assert replay._cold(n // 256) == 256 and replay._cold(n // 300) == 256
    assert replay._cold(n // 128) == 128 and replay._cold(n // 128 - 1) == 129
    assert replay._cold(0) == min(256, n) and replay._cold(2 * n) == 1
    assert replay._cold(1, lo=1, hi=257) == 257 and replay._cold(2 * n, lo=2) == 2
    assert replay._cold(1, hi=2 * n) == n  # one byte an item: COLD_BYTES items


def test_scratch_buffers_live_from_a_fetch_to_its_layers_run():
    """Fetches into slot -1 (a buffer of its own) live until the run of their step and
    layer; a fetch into a cache slot (0 or more) takes none.  Step 0 layer 0 fetches units
    1, 2 (2 live), layer 1 fetches 3 (3 live); the run of (0, 0) frees 1 and 2, then (0, 1)
    fetches 4 (2 live) and runs: most 3."""

    def fetch(step, layer, unit, slot=-1):
        return {"op": "fetch", "step": step, "layer": layer, "unit": unit, "slot": slot}

    def run(step, layer):
        return {"op": "run", "step": step, "layer": layer}

    evs = [fetch(0, 0, 1), fetch(0, 0, 2), fetch(0, 0, 5, slot=0), fetch(0, 1, 3)]
    evs += [run(0, 0), fetch(0, 1, 4), run(0, 1)]
    assert replay._scratch_needed(evs) == 3
    assert replay._scratch_needed(evs[:2] + [run(0, 0)] + evs[:2]) == 2
    assert replay._scratch_needed([fetch(0, 0, 1, slot=0)]) == 0
    assert replay._scratch_needed([]) == 0
    # a later layer's fetches after a run: only the run's own buffers are freed
    evs = [fetch(0, 0, 1), fetch(0, 0, 2), fetch(0, 1, 3), run(0, 0), fetch(0, 1, 4)]
    assert replay._scratch_needed(evs + [fetch(0, 1, 5)]) == 3


def test_fit_profile_rounds_each_figure_as_written():
    """Unround figures in the thousands of microseconds, where one part per million shows:
    latency 1234.5678 us -> 1234.568; the FFN line 1998.1234, 2002.1234, 2010.1234 us at 1,
    2, 4 tokens -> launch 1994.1234 -> 1994.123; host issue time 2000.1234 -> 2000.123; device
    3000.5678 -> 3000.568; the table the FFN plus the loop's 10.0004 us, to 3 decimals; a
    link of 1.23456789 GB/s -> 1.2346; CPU runs in float32."""
    p = {
        "copy_s": {b: 1.2345678e-3 + b / 1.23456789e9 for b in (1000, 2000, 4000)},
        "ffn_s": {1: 1.9981234e-3, 2: 2.0021234e-3, 4: 2.0101234e-3},
        "dense_s": 1e-4,
        "batch": 4,
        "issue_s": 2.0001234e-3,
        "device_s": 3.0005678e-3,
        "in_loop": {"tokens": 1, "s": 1.9981234e-3 + 10.0004e-6},
    }
    prof, _ = fitted(p)
    assert prof.link_latency_us == 1234.568 and prof.link_gbs == 1.2346
    assert prof.expert_launch_us == 1994.123
    assert (prof.link_issue_us, prof.expert_device_us) == (2000.123, 3000.568)
    assert prof.expert_table_us == {1: 2008.124, 2: 2012.124, 4: 2020.124}
    assert "(d 1000, f 4000, float32)" in prof.source


def test_fit_profile_on_cuda_pins_issues_asynchronously_and_names_the_device(monkeypatch):
    """On a CUDA device (its name from torch.cuda): pinned host memory, asynchronous
    issue, bf16, and the device named in the source."""
    from types import SimpleNamespace

    import torch

    fake = SimpleNamespace(
        cuda=SimpleNamespace(get_device_name=lambda dev: f"GPU {dev.index}"),
        bfloat16=torch.bfloat16, float32=torch.float32,
    )  # fmt: skip
    monkeypatch.setattr(replay, "_torch", lambda: fake)
    from fsedp.sw.policies.device import load_device

    dev = SimpleNamespace(type="cuda", index=3)
    prof = replay.fit_profile(prims(), (1000, 4000), dev, "g", load_device())
    assert (prof.pinned, prof.issue) == (True, "async")
    assert "on GPU 3 (d 1000, f 4000, bfloat16)" in prof.source


def test_check_fit_joins_its_problems_and_spans_every_copy():
    """Three copies (1, 2, 4 kB over 1..4 us): the span names the first and the last; two
    problems are joined by a comma; a table entry one microsecond over 1e8 is refused."""
    three = (np.array([1000.0, 2000.0, 4000.0]), np.array([1e-6, 2e-6, 4e-6]))
    with pytest.raises(EnvironmentFailure) as e:
        replay._check_fit((three, (0.0, 0.0, 0.0, 0.0)), (0.0, 0.0), {}, {"2": 1e8 + 1}, "x")
    assert e.value.reason == (
        "link_gbs not resolved: copies of 1000..4000 B took 1..4 us, not growing with the "
        "bytes, expert_table_us.2 came out 1e+08 us, outside 0..1e+08 us"
    )
