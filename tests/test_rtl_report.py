"""``fsedp rtl report``'s area figures: the NAND2-equivalent sum and a real Yosys run."""

import shutil

import pytest

from fsedp.experiments.rtl_report import NAND2_AREA, format_report, nand2_area, yosys_cells
from fsedp.params import SchedulerParams

STAT = """
   Number of cells:                  7
     $_AND_                          2
     $_MUX_                          1
     $_NOT_                          3
     $_SDFFE_PP0P_                   1
"""


def test_nand2_area_weights_each_gate_type():
    want = 2 * NAND2_AREA["$_AND_"] + NAND2_AREA["$_MUX_"] + 3 * NAND2_AREA["$_NOT_"]
    want += NAND2_AREA["$_SDFFE_"]  # polarity suffixes fold onto the gate's entry
    assert nand2_area(STAT) == round(want)
    assert nand2_area(STAT + "     $_MYSTERY_   4\n") is None  # an unknown gate: no guess


@pytest.mark.skipif(shutil.which("yosys") is None, reason="yosys not installed")
def test_yosys_figures_of_two_sorters():
    """The shuffle-exchange sorter needs fewer cells than the fully parallel one, and each
    figure comes out of the run (cells, NAND2 equivalents, gate levels)."""
    p = SchedulerParams(experts=16, chiplets=4)
    small = yosys_cells("sorter", p)
    big = yosys_cells("sorter", SchedulerParams(experts=16, chiplets=4, sorter="parallel"))
    for r in (small, big):
        assert r["cells"] > 0 and r["nand2"] > r["cells"] / 2 and r["gate_levels"] > 2
    assert small["cells"] < big["cells"]
    row = {"experts": 16, "chiplets": 4, "sorter": "shuffle2", "sorter_cycles": 7}
    row["sorter_variants"] = {"shuffle2": {"cycles": 7, **small}}
    assert f"| 16 | 4 | shuffle2 | 7 | {small['cells']} |" in format_report([row])
