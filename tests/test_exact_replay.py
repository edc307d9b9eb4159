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
