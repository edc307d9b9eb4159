"""cocotb testbenches of the scheduler blocks on Verilator and Icarus."""

import dataclasses

import pytest
from test_cocotb import ODD, SMALL, run

from fsedp.sw.sorter import SORTERS, network
from fsedp.tb.runner import SIMULATORS


@pytest.mark.parametrize("sim", SIMULATORS)
@pytest.mark.parametrize(
    "p,kind",
    [(SMALL, kind) for kind in SORTERS] + [(ODD, "shuffle2"), (ODD, "stage")],
    ids=[f"8e-{kind}" for kind in SORTERS] + ["12e-w3-shuffle2", "12e-w3-stage"],
)
def test_sorter(sim, p, kind):
    p = dataclasses.replace(p, sorter=kind)
    res = run("sorter", p, sim, knobs={"vectors": 40, "seed": 3})
    assert res["vectors"] == 40
    assert res["latency"] == network(p.sorter_lanes, kind).cycles


@pytest.mark.parametrize("sim", SIMULATORS)
@pytest.mark.parametrize("p", [SMALL, ODD], ids=["8e", "12e-w3"])
@pytest.mark.parametrize("block", ["eit", "icv", "matcher", "pairing", "token_buffer"])
def test_block(block, sim, p):
    res = run(block, p, sim, knobs={"seed": 5})
    if block == "eit" and p is ODD:
        assert res["overflow"] and res["bad_record"]  # the width limit and bad ids were hit
