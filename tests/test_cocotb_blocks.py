"""cocotb testbenches of the scheduler blocks on Verilator and Icarus."""

import pytest
from test_cocotb import ODD, SMALL, run

from fsedp.sw.sorter import stage_count
from fsedp.tb.runner import SIMULATORS


@pytest.mark.parametrize("sim", SIMULATORS)
@pytest.mark.parametrize("p", [SMALL, ODD], ids=["8e", "12e-w3"])
def test_sorter(sim, p):
    res = run("sorter", p, sim, knobs={"vectors": 40, "seed": 3})
    assert res["vectors"] == 40
    assert res["latency"] == stage_count(p.sorter_lanes)


@pytest.mark.parametrize("sim", SIMULATORS)
@pytest.mark.parametrize("p", [SMALL, ODD], ids=["8e", "12e-w3"])
@pytest.mark.parametrize("block", ["eit", "icv", "matcher", "pairing", "token_buffer"])
def test_block(block, sim, p):
    res = run(block, p, sim, knobs={"seed": 5})
    if block == "eit" and p is ODD:
        assert res["overflow"] and res["bad_record"]  # the width limit and bad ids were hit
