"""Exact expectations of the report readers of the synthesis and FPGA flows on reports
written out by hand in the tools' formats (nextpnr's log and JSON report, Yosys' ``stat``,
OpenSTA's path, slack and power reports, Verilog port lists): what each figure read must be,
at the edges of each format (a missing field, a second clock, a path across clocks, an
escaped name), so that a slip in a reader shows without the tools installed."""

import pytest

from fsedp.errors import InputError
from fsedp.experiments import fpga, synth

# ----------------------------------------------------------------------------- nextpnr


def _step(kind, delay, a, b):
    return {"type": kind, "delay": delay, "from": {"cell": a}, "to": {"cell": b}}


REPORT = {
    "critical_paths": [
        # asynchronous and cross-clock paths do not set Fmax
        {"from": "<async>", "to": "<async>", "path": [_step("logic", 9.0, "p", "q")]},
        {"from": "clk", "to": "<async>", "path": [_step("logic", 9.0, "p", "q")]},
        {"from": "<async>", "to": "clk", "path": [_step("logic", 9.0, "p", "q")]},
        {"from": "clk", "to": "other", "path": [_step("logic", 9.0, "p", "q")]},
        {"path": [_step("logic", 9.0, "p", "q")]},  # no clock named: not a register path
        {
            "from": "other",
            "to": "other",
            "path": [_step("clk-to-q", 0.5, "r", "s"), _step("routing", 1.0, "s", "t")],
        },
        {
            "from": "clk",
            "to": "clk",
            "path": [
                _step("clk-to-q", 0.523, "a", "b"),
                _step("routing", 1.254, "b", "c"),
                _step("logic", 0.401, "c", "d"),
                _step("routing", 0.752, "d", "e"),
                _step("logic", 0.353, "e", "f"),
                {"type": "setup", "from": {"cell": "f"}, "to": {"cell": "z"}},  # no delay
            ],
        },
        # shorter (3.0 ns): its steps without a delay count 0, not 1
        {
            "from": "clk",
            "to": "clk",
            "path": [
                _step("logic", 3.0, "m", "n"),
                {"type": "setup", "from": {"cell": "n"}, "to": {"cell": "o"}},
                {"type": "setup", "from": {"cell": "o"}, "to": {"cell": "p"}},
            ],
        },
    ]
}


def test_critical_path_is_the_longest_register_path_of_one_clock():
    assert fpga.critical_path(REPORT) == {
        "from": "a",
        "to": "z",
        "ns": 3.28,  # 3.283, to the 10 ps nextpnr prints
        "logic_ns": 0.75,  # 0.754
        "routing_ns": 2.01,  # 2.006
        "logic_steps": 2,
    }


def test_no_register_path_no_critical_path():
    assert fpga.critical_path({}) is None
    assert fpga.critical_path({"critical_paths": REPORT["critical_paths"][:5]}) is None


def test_fmax_lines_of_a_log():
    log = (
        "Info: Max frequency for clock '$glbnet$clk$TRELLIS_IO_IN': 99.99 MHz "
        "(FAIL at 100.00 MHz)\n"
        "Info: Max frequency for clock 'clk$TRELLIS_IO_IN': 100.00 MHz (PASS at 100.00 MHz)\n"
        "Info: Max frequency for clock '$glbnet$a$glbnet$b': 7.5 MHz (PASS at 5.00 MHz)\n"
    )
    assert fpga.parse_fmax(log) == {
        "clk": {"fmax_mhz": 100.0, "target_mhz": 100.0, "pass": True},
        "a$glbnet$b": {"fmax_mhz": 7.5, "target_mhz": 5.0, "pass": True},
    }


@pytest.mark.parametrize(
    "net, name",
    [
        ("$glbnet$clk$TRELLIS_IO_IN", "clk"),
        ("clk$TRELLIS_IO_IN", "clk"),
        ("$glbnet$clk", "clk"),
        ("x$glbnet$clk", "x$glbnet$clk"),
        ("clk$TRELLIS_IO_IN$x", "clk$TRELLIS_IO_IN$x"),
    ],
)
def test_clock_names(net, name):
    assert fpga._clock_name(net) == name


def test_device_totals_round_down_and_skip_what_is_not_reported():
    util = {"TRELLIS_COMB": {"used": 5, "available": 25}, "DP16KD": {"used": 0, "available": 3}}
    assert fpga.device_totals(util) == {"LUT4": 25, "CCU2C": 12, "DP16KD": 3}


@pytest.mark.parametrize(
    "text, message",
    [
        ("Info: a\nERROR: first\nInfo: b\nERROR: second\n", "nextpnr-ecp5: ERROR: first"),
        ("Info: a\n\n  Warning: last  \n\n", "nextpnr-ecp5: Warning: last"),
        ("Info: a\nInfo: b\nInfo: c\n", "nextpnr-ecp5: Info: c"),
        ("\n \n", "nextpnr-ecp5: exit 3"),
        ("ERROR: " + "x" * 400, "nextpnr-ecp5: ERROR: " + "x" * 293),
    ],
)
def test_last_error_of_a_tool(text, message):
    assert fpga._last_error(text, "nextpnr-ecp5", 3) == message


VERILOG = """\
module fsedp_x2(clk, z);
  input clk;
  output [7:0] z;
endmodule
module fsedp_x(clk, a, b, \\done$1 , y);
  input clk;
  input signed [0:3] a;
  input [15:15] b;
  input \\done$1 ;
  output [2:0] y;
  reg [3:0] r;
endmodule
module fsedp_y(p);
  inout p;
endmodule
"""


def test_verilog_ports_of_one_module():
    assert fpga.verilog_ports(VERILOG, "fsedp_x") == [
        ("input", "clk", 1),
        ("input", "a", 4),
        ("input", "b", 1),
        ("input", "\\done$1", 1),
        ("output", "y", 3),
    ]
    assert fpga.verilog_ports(VERILOG, "fsedp_x2") == [("input", "clk", 1), ("output", "z", 8)]
    with pytest.raises(RuntimeError, match="^no module fsedp_z in its Verilog$"):
        fpga.verilog_ports(VERILOG, "fsedp_z")
    with pytest.raises(RuntimeError, match="^fsedp_y has an inout port; the harness takes"):
        fpga.verilog_ports(VERILOG, "fsedp_y")


# ----------------------------------------------------------------------------- Yosys, OpenSTA

STAT = """\
=== fsedp_x ===

   Number of wires:                 10
   Number of wire bits:             12
   Number of cells:                  9
     sky130_fd_sc_hd__inv_1          3
     sky130_fd_sc_hd__dfxtp_1        4
      $scopeinfo                     2
   Number of memory bits:           64

   Chip area for module '\\fsedp_x': 52.550400
"""


def test_yosys_stat():
    assert synth._stat(STAT) == {
        "cells": {"sky130_fd_sc_hd__inv_1": 3, "sky130_fd_sc_hd__dfxtp_1": 4},
        "cell_count": 9,
        "area_um2": 52.5504,
        "memory_bits": 64,
    }
    # no totals: the cells are counted, no area, no memory
    only = "     inv_1    3\n     nand2_1  2\n     Number_x 5\n"
    assert synth._stat(only) == {
        "cells": {"inv_1": 3, "nand2_1": 2},
        "cell_count": 5,
        "area_um2": None,
        "memory_bits": 0,
    }
    top = "   Chip area for top module '\\t': 7\n"
    assert synth._stat(top)["area_um2"] == 7.0


STA = """\
@@ checks
Startpoint: a (rising edge-triggered flip-flop clocked by clk)
Endpoint: b (rising edge-triggered flip-flop clocked by clk)
Path Group: clk
Path Type: max

  Delay    Time   Description
---------------------------------------------------------
   0.0000    0.0000   clock clk (rise edge)
   0.0000    0.0000   clock network delay (ideal)
   0.0000    0.0000 ^ a/CLK (dfxtp_1)
   0.3000    0.3000 ^ a/Q (dfxtp_1)
   0.1000    0.4000 v u1/Y (inv_1)
   0.0500    0.4500 ^ out (out)
   0.2000    0.6500   output external delay
             0.4500   data arrival time

  10.0000   10.0000   clock clk (rise edge)
   0.0000   10.0000   clock network delay (ideal)
   0.0000   10.0000 ^ b/CLK (dfxtp_1)
  -0.1200    9.8800   library setup time
             9.8800   data required time
---------------------------------------------------------
             9.8800   data required time
            -0.4500   data arrival time
---------------------------------------------------------
             9.4300   slack (MET)

@@ slack
worst slack -1.5000
tns -3.2500
@@ transition
u1/Y 0.1 0.2 -0.1 (VIOLATED)
u2/Y 0.1 0.2 -0.1 (VIOLATED)
@@ power
Group                  Internal  Switching    Leakage      Total
                          Power      Power      Power      Power (Watts)
----------------------------------------------------------------
Sequential             1.000000e-06   2.000000e-07   3.000000e-11   1.200030e-06  50.0%
----------------------------------------------------------------
Total                  2.000000e-06   4.000000e-07   6.000000e-11   2.400060e-06 100.0%
@@ end
"""


@pytest.mark.parametrize("unit_ps, k", [(1000.0, 1.0), (100.0, 0.1), (1.23456789, 0.00123456789)])
def test_opensta_reports(unit_ps, k):
    def t(x):
        return round(x * k, 6)

    got = synth._parse_sta(STA, 10.0, unit_ps)
    assert got == {
        "period_ns": t(10.0),
        "arrival_ns": t(0.45),
        "required_ns": t(9.88),
        "setup_ns": t(0.12),
        "output_delay_ns": t(0.2),
        "slack_ns": t(9.43),
        "worst_slack_ns": t(-1.5),
        "tns_ns": t(-3.25),
        "startpoint": "a (rising edge-triggered flip-flop clocked by clk)",
        "endpoint": "b (rising edge-triggered flip-flop clocked by clk)",
        "path_cells": 4,
        "max_transition_violations": 2,
        "power_mw": {
            "internal": 0.002,
            "switching": 0.0004,
            "leakage": 6e-08,
            "total": 0.00240006,
        },
    }


def test_opensta_sections_missing_and_activity_power():
    got = synth._parse_sta("@@ checks\nnothing\n@@ end\n", 5.0, 1000.0)
    assert got["period_ns"] == 5.0 and got["path_cells"] == 0
    assert got["max_transition_violations"] == 0 and got["power_mw"] is None
    for k in ("arrival_ns", "required_ns", "setup_ns", "slack_ns", "worst_slack_ns", "tns_ns"):
        assert got[k] is None, k
    assert got["startpoint"] is None and got["endpoint"] is None
    assert "activity_power_mw" not in got
    act = "@@ activity_power\nTotal 1e-3 2e-3 3e-3 6e-3 100%\n@@ end\n"
    assert synth._parse_sta(act, 5.0, 1000.0)["activity_power_mw"] == {
        "internal": 1.0,
        "switching": 2.0,
        "leakage": 3.0,
        "total": 6.0,
    }


def test_sections_of_a_script_output():
    assert synth._sections("head\n@@ a\none\n@@ b \ntwo\nthree\n@@ end\n") == {
        "a": "\none\n",
        "b": "\ntwo\nthree\n",
        "end": "\n",
    }
    assert synth._sections("no markers") == {}


def test_clock_port_of_a_top():
    assert synth._clock_port("module t(a, clk, y);\nendmodule\n", "t") == "clk"
    assert synth._clock_port("module t(a, clk2, y);\n", "t") is None
    assert synth._clock_port("module t2(clk);\nmodule t(a);\n", "t") is None
    assert synth._clock_port("module u(clk);\n", "t") is None


# ----------------------------------------------------------------------------- Liberty


@pytest.mark.parametrize(
    "text, ps", [("1ns", 1000.0), (" 1 NS ", 1000.0), ("10ps", 10.0), ("100ns", 1e5)]
)
def test_liberty_time_units(text, ps):
    assert synth._unit("x.lib", text, synth._TIME, "time_unit") == ps


def test_an_unknown_time_unit_is_refused_naming_the_choices():
    with pytest.raises(InputError) as e:
        synth._unit("x.lib", "2ns", synth._TIME, "time_unit")
    assert e.value.file == "x.lib" and e.value.field == "<liberty>"
    assert e.value.reason == "time_unit '2ns' is not one of 1ps, 10ps, 100ps, 1ns, 10ns, 100ns"


@pytest.mark.parametrize(
    "text, ff",
    [
        ("library (x) { }", 1000.0),  # none given: 1 pF
        ("capacitive_load_unit (1, pf);", 1000.0),
        ('capacitive_load_unit(1,"ff");', 1.0),
        ("capacitive_load_unit ( 0.5 , pf ) ;", 500.0),
        ("capacitive_load_unit (2e1, ff);", 20.0),
    ],
)
def test_liberty_capacitance_units(text, ff):
    assert synth._cap_unit("x.lib", text) == ff


@pytest.mark.parametrize(
    "text, reason",
    [
        ("capacitive_load_unit (1, nf);", "capacitive_load_unit 'nf' is not one of ff, pf"),
        (
            "capacitive_load_unit (1e, pf);",
            "capacitive_load_unit 'capacitive_load_unit (1e, pf)' is not a number",
        ),
    ],
)
def test_bad_capacitance_units_are_refused(text, reason):
    with pytest.raises(InputError) as e:
        synth._cap_unit("x.lib", text)
    assert e.value.reason == reason


def _cell(name, area, pins, seq=False, special=None):
    return synth.LibertyCell(name, area, seq, special, {p.name: p for p in pins}, None)


def _pin(name, direction, function=None, cap=None):
    return synth.LibertyPin(name, direction, function, cap)


@pytest.mark.parametrize(
    "function, inverter",
    [("!A", True), ('"(!A)"', True), ("A'", True), ("( ! A )", True), ("(A')", True)]
    + [("!B", False), ("A", False), ("!(A&B)", False), ("!AB", False), (None, False)],
)
def test_what_an_inverter_is(function, inverter):
    cell = _cell("c", 1.0, [_pin("A", "input"), _pin("Y", "output", function)])
    assert cell.is_inverter() is inverter
    assert [p.name for p in cell.inputs()] == ["A"] and [p.name for p in cell.outputs()] == ["Y"]


def test_an_inverter_has_one_input_one_output_and_no_state():
    inv = [_pin("A", "input"), _pin("Y", "output", "!A")]
    assert not _cell("c", 1.0, inv, seq=True).is_inverter()
    assert not _cell("c", 1.0, [*inv, _pin("B", "input")]).is_inverter()
    assert not _cell("c", 1.0, [*inv, _pin("Z", "output", "!A")]).is_inverter()


def test_the_smallest_ordinary_inverter_by_area_then_capacitance_then_name():
    def inv(name, area, cap, special=None):
        pins = [_pin("A", "input", cap=cap), _pin("Y", "output", "!A")]
        return _cell(name, area, pins, special=special)

    cells = [
        inv("inv_b", 1.0, 0.002),
        inv("inv_a", 1.0, 0.002),  # a tie on area and capacitance: the name
        inv("inv_c", 1.0, 0.001),  # less capacitance
        inv("iso", 0.5, 0.001, special="isolation cell"),
        inv("inv_big", 2.0, 0.0005),
    ]
    lib = synth.Liberty(
        path="x.lib", name="x", time_unit_ps=1000.0, cap_unit_ff=1000.0,
        cells={c.name: c for c in cells}, text="", cell_open={},
    )  # fmt: skip
    assert lib.inverter().name == "inv_c"
    del lib.cells["inv_c"]
    assert lib.inverter().name == "inv_a"
    assert lib.special() == {"iso": "isolation cell"}


def test_the_mapping_library_marks_the_special_cells_dont_use():
    text = "library (x) {\n  cell (a) {\n  }\n  cell (iso) {\n  }\n  cell (ls) {\n  }\n}\n"
    cells = {
        "a": _cell("a", 1.0, []),
        "iso": _cell("iso", 1.0, [], special="isolation cell"),
        "ls": _cell("ls", 1.0, [], special="level shifter"),
    }
    opens = {n: text.index(f"cell ({n}) {{") + len(f"cell ({n}) {{") for n in cells}
    lib = synth.Liberty("x.lib", "x", 1000.0, 1000.0, cells, text, opens)
    assert lib.mapping_text() == (
        "library (x) {\n  cell (a) {\n  }\n"
        "  cell (iso) {\n    dont_use : true;\n  }\n"
        "  cell (ls) {\n    dont_use : true;\n  }\n}\n"
    )


def test_the_largest_fanout_of_a_mapped_netlist():
    """Net n1 drives three inputs, n2 two, the clock four (left out: ideal), a constant
    (1'b0) and an output pin count nothing, a cell the library does not know is skipped."""
    cells = {
        "inv": _cell("inv", 1.0, [_pin("A", "input"), _pin("Y", "output", "!A")]),
        "dff": _cell(
            "dff", 2.0, [_pin("CLK", "input"), _pin("D", "input"), _pin("Q", "output")], True
        ),
    }
    lib = synth.Liberty("x.lib", "x", 1000.0, 1000.0, cells, "", {})
    netlist = """
  inv u1 (.A(n1), .Y(n2));
  inv u2 (.A(n1), .Y(n3));
  dff r1 (.CLK(clk), .D(n1), .Q(q1));
  dff r2 (.CLK(clk), .D(n2), .Q(q2));
  dff r3 (.CLK(clk),
          .D(n2), .Q(n1));
  dff r4 (.CLK(clk), .D(1'b0), .Q(q4));
  mystery m1 (.A(n3), .B(n3), .C(n3), .D(n3));
"""
    assert synth._max_fanout(netlist, lib, "clk") == (3, "n1")
    assert synth._max_fanout(netlist, lib, None) == (4, "clk")
    assert synth._max_fanout("", lib, "clk") == (0, None)


LIB = """\
/* head */
library (tiny) {
  operating_conditions (typ) { power_rail (vdd) { voltage : 1.8; } }
  pin (stray) { direction : input; }
  capacitive_load_unit (2E1, ff);
  cell ("inv_x") {
    area : 1.0;
    pin (X) { direction : input; capacitance : 0.002; }
    pin (Y) { direction : output; function : "!X"; }
  }
  cell (inv_nocap) {
    area : 1.0;
    pin (A) { direction : input; }
    pin (Y) { direction : output; function : "!A"; }
  }
  cell (dff) {
    area : 4.0;
    ff (IQ, IQN) { next_state : "D"; clocked_on : "CLK"; }
    pin (D) { direction : input; }
    pin (CLK) { direction : input; }
    pin (Q) { direction : output; function : "IQ"; }
  }
}
"""


def test_a_library_with_groups_outside_its_cells(tmp_path):
    """Groups nested outside any cell (operating conditions, a stray pin) are skipped; a
    quoted cell name is unquoted; an input named X inverts with !X; a capacitance unit
    written 2E1 ff; the smallest inverter is the one without a capacitance (taken as 0)."""
    f = tmp_path / "tiny.lib"
    f.write_text(LIB)
    lib = synth.read_liberty(f)
    assert lib.name == "tiny" and lib.cap_unit_ff == 20.0
    assert set(lib.cells) == {"inv_x", "inv_nocap", "dff"}
    assert lib.cells["inv_x"].is_inverter() and lib.cells["inv_x"].inputs()[0].capacitance == 0.002
    assert lib.inverter().name == "inv_nocap"
    assert lib.cells["dff"].state == {
        "kind": "ff", "vars": ["IQ", "IQN"], "next_state": "D", "clocked_on": "CLK",
    }  # fmt: skip


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"library (x) {\0", "a binary file, not a Liberty library (text)"),
        (b"cell (x) { }", "not a Liberty library: it does not begin with 'library (NAME) {'"),
    ],
)
def test_liberty_refusals_name_the_file(tmp_path, content, reason):
    f = tmp_path / "x.lib"
    f.write_bytes(content)
    with pytest.raises(InputError) as e:
        synth.read_liberty(f)
    assert (e.value.file, e.value.field, e.value.reason) == (str(f), "<liberty>", reason)
    with pytest.raises(InputError) as e:
        synth.read_liberty(tmp_path / "none.lib")
    assert (e.value.field, e.value.reason) == ("<liberty>", "no such file")


@pytest.mark.parametrize("extra, ok", [(-1, True), (0, True), (1, False)])
def test_liberty_size_limit_at_its_value(tmp_path, monkeypatch, extra, ok):
    f = tmp_path / "tiny.lib"
    f.write_text(LIB)
    size = len(LIB.encode())
    monkeypatch.setattr(synth, "MAX_LIBERTY_BYTES", size - extra)
    if ok:
        assert synth.read_liberty(f).name == "tiny"
    else:
        with pytest.raises(InputError) as e:
            synth.read_liberty(f)
        assert e.value.file == str(f) and e.value.reason == f"larger than {size - 1} bytes"


def test_units_refused_name_the_file():
    with pytest.raises(InputError) as e:
        synth._cap_unit("x.lib", "capacitive_load_unit (1e, pf);")
    assert e.value.file == "x.lib"
    with pytest.raises(InputError) as e:
        synth._cap_unit("y.lib", "capacitive_load_unit (1, nf);")
    assert e.value.file == "y.lib"


def test_the_clock_port_of_a_module_after_others():
    netlist = "// made by yosys\nmodule other(a);\nendmodule\nmodule t(clk, a);\nendmodule\n"
    assert synth._clock_port(netlist, "t") == "clk"


def test_constants_and_unknown_cells_carry_no_load():
    cells = {"inv": _cell("inv", 1.0, [_pin("A", "input"), _pin("Y", "output", "!A")])}
    lib = synth.Liberty("x.lib", "x", 1000.0, 1000.0, cells, "", {})
    netlist = """
  mystery m0 (.A(z), .B(z), .C(z), .D(z), .E(z));
  inv u1 (.A(1'b0), .Y(n1));
  inv u2 (.A(1'b0), .Y(n2));
  inv u3 (.A(1'b0), .Y(n3));
  inv u4 (.A(n1), .Y(n4));
  inv u5 (.A(n1), .Y(n5));
"""
    assert synth._max_fanout(netlist, lib, None) == (2, "n1")


SEQ_LIB = """\
library (seq) {
  cell (inv) {
    area : 1.0;
    pin (A) { direction : input; }
    pin (Y) { direction : output; function : "!A"; }
  }
  cell (dff) {
    area : 4.0;
    pg_pin (VPWR) { pg_type : primary_power; }
    ff ("IQ", "IQN") { next_state : "D"; clocked_on : "CLK"; }
    pin (Q) { direction : output; function : "IQ"; }
  }
  cell (lat) {
    area : 3.0;
    latch (IQ,IQN) { enable : "G"; data_in : "D"; }
  }
  cell (st) { area : 2.0; statetable ("A B", "Z") { table : "L H : - : H"; } }
  cell (fb) { area : 2.0; ff_bank (IQ, IQN, 4) { next_state : "D"; } }
  cell (lb) { area : 2.0; latch_bank (IQ, IQN, 4) { enable : "G"; } }
  cell (bus) { area : 2.0; bus (q) { ff (X, Y) { next_state : "D"; } } }
  cell (bp) { area : 1.0; pg_pin (VPB) { pg_type : backup_power; } }
  cell (iso) { area : 1.0; is_isolation_cell : true; dont_use : true; }
  cell (ao) { area : 1.0; always_on : TRUE; }
}
"""


def test_sequential_cells_and_special_ones(tmp_path):
    """ff, latch, statetable, ff_bank and latch_bank groups make a cell sequential; only an
    ff or latch group directly in the cell gives its state; a backup-power pin, an
    isolation cell (the first special attribute wins) and an always-on one are special."""
    f = tmp_path / "seq.lib"
    f.write_text(SEQ_LIB)
    lib = synth.read_liberty(f)
    seq = {n for n, c in lib.cells.items() if c.sequential}
    assert seq == {"dff", "lat", "st", "fb", "lb", "bus"}
    assert lib.cells["dff"].state == {
        "kind": "ff", "vars": ["IQ", "IQN"], "next_state": "D", "clocked_on": "CLK",
    }  # fmt: skip
    assert lib.cells["lat"].state == {
        "kind": "latch", "vars": ["IQ", "IQN"], "enable": "G", "data_in": "D",
    }  # fmt: skip
    assert [lib.cells[n].state for n in ("st", "fb", "lb", "bus")] == [None] * 4
    assert lib.special() == {
        "bp": "has a backup-power pin",
        "iso": "isolation cell",
        "ao": "always-on cell",
    }
    assert list(lib.cells["dff"].pins) == ["Q"]  # a pg_pin is not a signal pin


EDGE_LIB = """\
library (edges) {
  scaled_cell (dff, slow) { area : 8.0; pin (Q) { direction : output; } ff (IQ, IQN) { } }
  cell (inv) {
    area : 1.0;
    pin (A) { direction : input; capacitance : x; }
    pin (Y) { direction : output; function : "!A"; }
  }
  cell (dff) {
    area : 4.0;
    ff (XQ, "XQN") { next_state : "D"; clocked_on : "CLK"; }
    cell_leakage_power : 1.5;
    pin (Q) {
      function : "XQ";
      timing () { related_pin : "CLK"; function : "D"; }
      direction : output;
    }
    pin (NC) { capacitance : 0.25; }
  }
  cell (outer) { area : 2.0; cell (inner) { area : 3.0; } }
  cell (noarea) { pin (A) { direction : input; } }
  cell (nest) {
    area : 1.0;
    pin (A) { direction : input; pin (B) { capacitance : 0.001; } capacitance : 0.5; }
  }
  scaled_cell (inv, slow) {
    area : 9.0;
    dont_use : true;
    pin (A) { direction : input; capacitance : 5.0; }
    ff (IQ, IQN) { next_state : "D"; }
  }
}
"""


def test_a_library_at_the_edges_of_its_groups(tmp_path):
    """What each group's attributes belong to, worked out from EDGE_LIB line by line:

    * inv: a capacitance that is not a number reads as none (None, not an empty string);
    * dff: the ff group's names XQ and XQN, quoted or not, keep their X; the attribute after
      the ff group (cell_leakage_power) and those of a timing group are not the state's; a
      timing group's attributes are not its pin's, even one named function, and the pin's
      attributes after the group are still its own (Q: function XQ, direction output); a pin
      without a direction has the direction "" (NC);
    * outer: a group named cell inside a cell is not a cell, and its area is not outer's;
    * noarea: a cell without an area is left out;
    * nest: a pin group nested in a pin keeps its own capacitance (0.001), the one after it
      in the outer pin (0.5) does not land on it;
    * scaled_cell: a library-level group with an area, dont_use, a pin and an ff group,
      before the cells or after them, is no cell, and no cell takes its attributes."""
    f = tmp_path / "edges.lib"
    f.write_text(EDGE_LIB)
    lib = synth.read_liberty(f)
    assert set(lib.cells) == {"inv", "dff", "outer", "nest"}
    assert lib.cells["inv"].pins["A"] == synth.LibertyPin("A", "input", None, None)
    assert lib.cells["inv"].area == 1.0 and lib.cells["inv"].special is None
    dff = lib.cells["dff"]
    assert dff.sequential and dff.special is None and dff.area == 4.0
    assert dff.state == {
        "kind": "ff",
        "vars": ["XQ", "XQN"],
        "next_state": "D",
        "clocked_on": "CLK",
    }
    assert dff.pins == {
        "Q": synth.LibertyPin("Q", "output", "XQ", None),
        "NC": synth.LibertyPin("NC", "", None, 0.25),
    }
    assert lib.cells["outer"].area == 2.0 and not lib.cells["outer"].sequential
    nest = lib.cells["nest"].pins
    assert nest["B"].capacitance == 0.001 and nest["A"].direction == "input"
    assert lib.special() == {} and lib.inverter().name == "inv"


def _refused(tmp_path, text) -> str:
    f = tmp_path / "bad.lib"
    f.write_text(text)
    with pytest.raises(InputError) as e:
        synth.read_liberty(f)
    assert (e.value.file, e.value.field) == (str(f), "<liberty>")
    return e.value.reason


#: the smallest usable library (an inverter and a flip-flop), ``{}`` where more goes
CELLS = """\
library (x) {{
  {}
  cell (inv) {{ area : 1; pin (A) {{ direction : input; }}
    pin (Y) {{ direction : output; function : "!A"; }} }}
  cell (dff) {{ area : 2; ff (IQ, IQN) {{ next_state : "D"; }} }}
}}
"""


@pytest.mark.parametrize(
    "text, reason",
    [
        (
            "library (x) {\n  cell (a) {\n    pin (A) {\n",
            "unbalanced braces: the pin group is never closed",
        ),
        (
            CELLS.format('time_unit : "2ns";'),
            f"time_unit '2ns' is not one of {', '.join(synth._TIME)}",
        ),
        (
            CELLS.format("capacitive_load_unit (1, nf);"),
            "capacitive_load_unit 'nf' is not one of ff, pf",
        ),
        (CELLS.format("cell (big) { area : abc; }"), "cell big: area 'abc' is not a number"),
        (
            "library (x) {\n  cell (a) { }\n}\n",
            "not a Liberty library: it has no cell with an area",
        ),
        (
            CELLS.format("").replace('"!A"', '"A"'),
            "has no inverter (a cell with one input A and the function !A)",
        ),
        (
            CELLS.format("").replace("ff (IQ", "stat (IQ"),
            "has no flip-flop (a cell with an ff group)",
        ),
    ],
    ids=["unclosed", "time-unit", "cap-unit", "area", "no-cells", "no-inverter", "no-flop"],
)
def test_liberty_refusals_word_for_word(tmp_path, text, reason):
    """Each refusal of a whole file names that file and says exactly why; an unclosed group
    is the innermost one still open (pin, inside cell a inside the library)."""
    assert _refused(tmp_path, text) == reason


def test_cells_is_a_usable_library(tmp_path):
    f = tmp_path / "ok.lib"
    f.write_text(CELLS.format(""))
    assert set(synth.read_liberty(f).cells) == {"inv", "dff"}


class _Unreadable:
    """A file that opens but fails to read (an I/O error of the disk)."""

    def __init__(self, error):
        self.error = error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read(self, n=-1):
        raise self.error


@pytest.mark.parametrize(
    "error, reason",
    [
        (OSError(5, "Input/output error"), "cannot read: Input/output error"),
        (OSError("no strerror"), "cannot read: no strerror"),  # the error itself
    ],
)
def test_a_liberty_that_cannot_be_read(tmp_path, monkeypatch, error, reason):
    """An error while reading is a refusal naming the file: the system's message of the
    error where it has one, else the error as written."""
    monkeypatch.setattr(synth, "open_input", lambda *a: _Unreadable(error))
    with pytest.raises(InputError) as e:
        synth.read_liberty(tmp_path / "x.lib")
    assert (e.value.file, e.value.field, e.value.reason) == (
        str(tmp_path / "x.lib"), "<liberty>", reason,
    )  # fmt: skip


def test_opensta_slack_to_6_digits():
    """A slack of 1.2345678 library units of 1 ns: 1.234568 ns (rounded at the 6th digit,
    not 1.2345678)."""
    out = "@@ checks\n             1.2345678   slack (MET)\n@@ end\n"
    assert synth._parse_sta(out, 10.0, 1000.0)["slack_ns"] == 1.234568


def test_without_a_clock_no_net_is_left_out_whatever_its_name():
    """A top without a clock port leaves out no net: XXXX drives two inverter inputs, n1
    one, so the largest fanout is XXXX's, 2."""
    cells = {"inv": _cell("inv", 1.0, [_pin("A", "input"), _pin("Y", "output", "!A")])}
    lib = synth.Liberty("x.lib", "x", 1000.0, 1000.0, cells, "", {})
    netlist = (
        "  inv u1 (.A(XXXX), .Y(n1));\n  inv u2 (.A(XXXX), .Y(n2));\n  inv u3 (.A(n1), .Y(n3));\n"
    )
    assert synth._max_fanout(netlist, lib, None) == (2, "XXXX")


@pytest.mark.parametrize(
    "before, ok",
    [
        ("/* " + "x" * 70_000 + " */\n", True),  # a long licence comment before the header
        (" " * 70_000, True),
        ("\n" * 65_530, True),  # the header cut by the end of the first 64 KiB
        ("// " + "y" * 70_000 + "\n", True),
        ("cell (x) { }\n" + " " * 70_000, False),
        ("x" * 70_000 + "\n", False),
    ],
)
def test_the_header_may_come_after_the_first_64_kib(tmp_path, before, ok):
    """The head (64 KiB) read first refuses at once only what it shows is not a Liberty
    library; blanks, a comment and a header the head cuts are read on."""
    f = tmp_path / "long.lib"
    f.write_text(before + LIB)
    if ok:
        assert synth.read_liberty(f).name == "tiny"
    else:
        with pytest.raises(InputError) as e:
            synth.read_liberty(f)
        assert (e.value.file, e.value.reason) == (
            str(f),
            "not a Liberty library: it does not begin with 'library (NAME) {'",
        )


def test_a_test_cells_pins_are_not_the_cells(tmp_path):
    """A scan flip-flop's ``test_cell`` repeats pins D and Q without their capacitance or
    function: the cell keeps its own (D 0.003 pF, Q = IQ)."""
    scan = """\
  cell (sdff) {
    area : 6.0;
    ff (IQ, IQN) { next_state : "(D&!SE) | (SI&SE)"; clocked_on : "CLK"; }
    pin (D) { direction : input; capacitance : 0.003; }
    pin (SI) { direction : input; capacitance : 0.004; }
    pin (SE) { direction : input; capacitance : 0.005; }
    pin (CLK) { direction : input; }
    pin (Q) { direction : output; function : "IQ"; }
    test_cell () {
      ff (IQ, IQN) { next_state : "D"; clocked_on : "CLK"; }
      pin (D) { direction : input; }
      pin (CLK) { direction : input; }
      pin (Q) { direction : output; signal_type : test_scan_out; }
    }
  }
}
"""
    f = tmp_path / "scan.lib"
    f.write_text(LIB[: LIB.rindex("}")] + scan)
    cell = synth.read_liberty(f).cells["sdff"]
    # the test_cell before any pin of the file, and before the cell's own pins
    test_cell = scan[scan.index("    test_cell") : scan.index("  }\n}")]
    first = scan.replace(test_cell, "").replace(
        "    area : 6.0;\n", "    area : 6.0;\n" + test_cell
    )
    f.write_text("library (scan) {\n" + first[: first.rindex("}")] + LIB[LIB.index("  cell (") :])
    assert synth.read_liberty(f).cells["sdff"] == cell
    assert cell.sequential and cell.state["next_state"] == "(D&!SE) | (SI&SE)"
    assert {p: (q.direction, q.capacitance) for p, q in cell.pins.items()} == {
        "D": ("input", 0.003),
        "SI": ("input", 0.004),
        "SE": ("input", 0.005),
        "CLK": ("input", None),
        "Q": ("output", None),
    }
    assert cell.pins["Q"].function == "IQ"
