"""Second tier: cocotb testbenches on the generated Verilog, on Verilator and Icarus.

One build folder per (block, simulator, parameters) under ``build/cocotb``.
"""

from pathlib import Path

import pytest

from runner import SIMULATORS, run_tb, simulator_missing  # noqa: E402
from fsedp.sw.params import SchedulerParams

BUILD = Path(__file__).resolve().parents[1] / "build" / "cocotb"


def run(block, p, sim, knobs=None, seed=1):
    why = simulator_missing(sim)
    if why:
        pytest.skip(why)
    res = run_tb(block, p, sim, BUILD, knobs=knobs, seed=seed)
    assert res["tests"] > 0 and res["failed"] == 0, f"{block} on {sim} failed; see {res['log']}"
    return res


SMALL = SchedulerParams(chiplets=4, experts=8, count_width=6, requests=4, theta_min=3,
                        n_threshold=2, qos_width=2)
ODD = SchedulerParams(chiplets=5, experts=12, count_width=3, requests=3, theta_min=2,
                      n_threshold=3, qos_width=3)


@pytest.mark.parametrize("sim", SIMULATORS)
@pytest.mark.parametrize("p", [SMALL, ODD], ids=["4c8e", "5c12e-w3"])
def test_scheduler(sim, p):
    res = run("scheduler", p, sim, knobs={"rounds": 20, "seed": 7, "reset_every": 6,
                                          "bad_records": 0.02 if p is ODD else 0})
    assert res["mismatches"] == 0 and res["beats"] > 0 and res["resets"] >= 2
