"""``fsedp rtl report``'s figures: generic cells from a real Yosys run, the library tables'
layout, and its options' bad values."""

import shutil

import pytest

from fsedp.experiments.rtl_report import format_report, yosys_cells
from fsedp.params import SchedulerParams


@pytest.mark.skipif(shutil.which("yosys") is None, reason="yosys not installed")
def test_yosys_figures_of_two_sorters():
    """The shuffle-exchange sorter needs fewer cells than the fully parallel one, and each
    figure comes out of the run (cells, gate levels)."""
    p = SchedulerParams(experts=16, chiplets=4)
    small = yosys_cells("sorter", p)
    big = yosys_cells("sorter", SchedulerParams(experts=16, chiplets=4, sorter="parallel"))
    for r in (small, big):
        assert r["cells"] > 0 and r["gate_levels"] > 2 and "nand2" not in r
    assert small["cells"] < big["cells"]
    row = {"experts": 16, "chiplets": 4, "sorter": "shuffle2", "sorter_cycles": 7}
    row["sorter_variants"] = {"shuffle2": {"cycles": 7, **small}}
    assert f"| 16 | 4 | shuffle2 | 7 | {small['cells']} |" in format_report([row])


FIG = {
    "cell_count": 100,
    "flip_flops": 10,
    "area_um2": 1234.5,
    "arrival_ns": 2.5,
    "arrival_fo4": 30.9,
    "slack_ns": -1.25,
    "cycle_fo4": 33.0,
    "budget_fo4_28nm": 82.8,
    "meets_28nm": True,
    "power_mw": 1.5,
    "activity_power_mw": 1.25,
    "activity": {"cycles": 400, "passed": True, "input_cone": 0.25, "bench": "tb_x"},
}


def test_library_tables_have_no_estimate():
    """With a library every block's, variant's, datapath block's and the chip's figures are
    the library's (um^2, slack, FO4, both powers); no NAND2 equivalent or assumed gate
    area is printed anywhere, with or without a library; a bench the netlist failed says so."""
    row = {"experts": 16, "chiplets": 4, "sorter": "shuffle2", "sorter_cycles": 7}
    row["cells"] = {"scheduler": 900, "eit": 500}
    row["library"] = {"eit": FIG, "scheduler": {**FIG, "area_um2": 250000.0}}
    row["library_sorters"] = {"shuffle": {**FIG, "activity": {**FIG["activity"], "passed": False}}}
    lib = {"name": "lib_tt", "clock_mhz": 800.0, "fo4_ps": 80.9, "activity": True}
    lib["datapath"] = "2x2 chiplets, E=16"
    text = format_report([row], lib, {"chip": FIG})
    eit = "| eit | 100 | 10 | 1234 | 2.500 | 30.9 | -1.250 | 33.0 (met) | 1.500 | 1.250 (400 cyc"
    assert eit in text
    assert (
        "| 16 | 4 | shuffle | 100 |" in text and "(400 cycles, 25 % in input cones, FAILED)" in text
    )
    assert "| chip | 100 | 10 |" in text and "2x2 chiplets, E=16" in text
    failed = format_report([row], lib, {"ddr_ctrl": {**FIG, "error": "sta: Error: NaN"}})
    assert "| ddr_ctrl | 100 | 10 | 1234 |" in failed and "(failed: sta: Error: NaN)" in failed
    assert "| 0.250 | 0.43 |" in text  # the scheduler's library area in mm^2 beside the paper's
    assert "lib_tt" in text and "80.9 ps" in text
    bare = format_report([{k: v for k, v in row.items() if not k.startswith("library")}])
    for t in (text, bare):
        assert "NAND2" not in t and "estimate" not in t.replace("vectorless estimate", "")
    assert "no area is given" in bare


def test_report_library_options_are_checked_first(tmp_path, capsys, monkeypatch):
    """``--activity`` needs ``--liberty``; a library that is not one, or a missing tool, is
    one line and exit 2 before anything runs."""
    from test_synth import MINI_LIB

    from fsedp.cli import main
    from fsedp.experiments import synth

    base = ["rtl", "report", "--no-latency", "--no-cells", "--experts", "16", "--chiplets", "4"]
    lib = tmp_path / "mini.lib"
    lib.write_text(MINI_LIB)
    bad = tmp_path / "bad.lib"
    bad.write_text("not a library")
    monkeypatch.setattr(synth, "missing_tools", lambda: ["yosys (Debian package yosys)"])
    for argv, words in (
        ([*base, "--activity"], ["--activity", "needs --liberty"]),
        ([*base, "--liberty", str(bad)], ["--liberty", "not a Liberty library"]),
        ([*base, "--liberty", str(lib)], ["needs yosys"]),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "Traceback" not in err, err
        assert all(w in err for w in words), (words, err)


def test_generated_pages_name_the_command_that_made_them(monkeypatch):
    """Every report page carries the exact command line (figures in ``docs/`` are generated,
    each by a command a reader can run again)."""
    from fsedp.cli.common import invoked
    from fsedp.experiments.rtl_runs import datapath_page, fpga_page

    argv = ["fsedp", "rtl", "datapath", "--mesh", "2x2:3", "--out", "x.md"]
    monkeypatch.setattr("sys.argv", argv)
    assert invoked("rtl datapath") == "fsedp rtl datapath --mesh 2x2:3 --out x.md"
    assert invoked("rtl report") == "fsedp rtl report"  # another command is running
    monkeypatch.setattr("sys.argv", ["python"])  # called from Python: the bare command
    assert invoked("run") == "fsedp run"
    page = datapath_page("fsedp rtl datapath --mesh 2x2:3", "body")
    assert page.startswith("# Chiplet datapath report\n\nProduced by `fsedp rtl datapath --mesh")
    assert page.endswith("body")
    page = fpga_page("fsedp rtl fpga --top matcher", [])
    assert "Produced by `fsedp rtl fpga --top matcher` on " in page and "| top |" in page
