"""Power from the switching activity of a gate-level cosimulation (``fsedp rtl synth
--activity``, :mod:`fsedp.experiments.activity`): Liberty functions as Verilog, the VCD
sampler, the cycle-based evaluation and its check, the OpenSTA commands, and the whole flow
on SKY130 HD (skipped, saying why, without the library, Yosys, OpenSTA, Icarus or
Verilator)."""

import contextlib
import io
import itertools
import json
import subprocess

import numpy as np
import pytest
from test_synth import LIBERTY, MINI_LIB, needs_liberty, needs_tools

from fsedp.cli import main
from fsedp.experiments import activity as act
from fsedp.experiments import synth
from fsedp.tb.runner import simulator_missing

needs_icarus = pytest.mark.skipif(
    simulator_missing("icarus") is not None, reason=str(simulator_missing("icarus"))
)
needs_verilator = pytest.mark.skipif(
    simulator_missing("verilator") is not None, reason=str(simulator_missing("verilator"))
)


def _eval(expr: str, env: dict) -> int:
    """A Verilog expression of :func:`liberty_expr` evaluated in Python (one bit)."""
    py = expr.replace("1'b0", "0").replace("1'b1", "1")  # ~ on ints: per bit, two's complement
    return eval(py, {}, dict(env)) & 1  # noqa: S307 (our own generated expression)


@pytest.mark.parametrize(
    "func, truth",
    [
        ("!A", lambda a, b, c: 1 - a),
        ("A'", lambda a, b, c: 1 - a),
        ("(A&B)|!C", lambda a, b, c: (a & b) | (1 - c)),
        ("A B + C", lambda a, b, c: (a & b) | c),
        ("A*B+C'", lambda a, b, c: (a & b) | (1 - c)),
        ("A^B&C", lambda a, b, c: a ^ (b & c)),
        ("!(A|B)&C", lambda a, b, c: (1 - (a | b)) & c),
        ("(!A&!B&!C) | (A&B&!C) | (A&!B&C) | (!A&B&C)", lambda a, b, c: 1 - (a ^ b ^ c)),
        ("1", lambda a, b, c: 1),
    ],
)
def test_liberty_function_as_verilog(func, truth):
    expr = act.liberty_expr(func)
    for a, b, c in itertools.product((0, 1), repeat=3):
        assert _eval(expr, {"A": a, "B": b, "C": c}) == truth(a, b, c), (func, expr, a, b, c)


@pytest.mark.parametrize("func", ["A &", "(A|B", "A $ B", "A)"])
def test_unreadable_function_is_refused(func):
    with pytest.raises(ValueError, match="function"):
        act.liberty_expr(func)  # the message names the function


VCD = """\
$timescale 1ps $end
$scope module top $end
$var wire 1 ! clk $end
$var wire 2 " bus [1:0] $end
$var wire 1 # \\odd.name $end
$upscope $end
$scope module other $end
$var wire 1 $ ignored $end
$upscope $end
$enddefinitions $end
#0
0!
b00 "
x#
#5
1!
b01 "
0#
#10
0!
1#
#15
1!
b10 "
#20
0!
"""


def test_vcd_samples_before_each_rising_edge(tmp_path):
    """Every signal of the scope, bit by bit, sampled just before each rising edge of the
    clock but the first; toggles per cycle and duty from the samples."""
    path = tmp_path / "a.vcd"
    path.write_text(VCD)
    cycles, bits = act.vcd_samples(path, "top", "clk")
    assert cycles == 1  # rising edges at 5 and 15; the first starts the recording
    assert bits["bus[0]"].tolist() == [True]  # b01 from 5 until 15
    assert bits["bus[1]"].tolist() == [False]  # b10 only from 15
    assert bits["odd.name"].tolist() == [True]  # 1 from 10
    assert "ignored" not in bits
    values = {"a": np.array([0, 1, 1, 0, 1], bool), "p": np.array([1, 1, 1, 1, 0], bool)}
    tcl, cover = act.activity_tcl([("_1_", "Y", "a"), ("_2_", "Y", "gone")], ["p"], values, 5)
    assert cover["cell_outputs_recorded"] == 1 and cover["input_ports_recorded"] == 1
    assert "sta::set_power_pin_activity $p 0.75 0.6" in tcl  # 3 changes over 4 steps
    assert "-input_ports [get_ports {p}] -activity 0.25 -duty 0.8" in tcl


NETLIST = """module t (clk, a, y);
  input clk; input [1:0] a; output y; wire _1_; wire _2_;
  nand2_x1 _5_ (
    .A(a[0]),
    .B(\\r.x [1]),
    .Y(_1_)
  );
  inv_x1 _6_ (.A(_1_), .Y(_2_));
  dff_x1 \\q$reg  (.CLK(clk), .D(_2_), .Q(y));
endmodule
"""


def test_vcd_code_shared_by_two_nets(tmp_path):
    """A simulator may give two nets of one value one identifier code (a port and the net
    assigned to it): each gets the value at its own width."""
    path = tmp_path / "s.vcd"
    path.write_text(
        "$scope module top $end\n$var wire 1 ! clk $end\n$var wire 1 # a $end\n"
        "$var wire 1 # a_alias $end\n$var wire 3 $ v [3:1] $end\n$upscope $end\n"
        "$enddefinitions $end\n#0\n0!\n0#\nb0 $\n#5\n1!\n#10\n0!\n1#\nb101 $\n"
        "#15\n1!\n#20\n0!\n#25\n1!\n"
    )
    cycles, bits = act.vcd_samples(path, "top", "clk")
    assert cycles == 2
    assert bits["a"].tolist() == bits["a_alias"].tolist() == [True, True]
    assert [bits[f"v[{i}]"].tolist() for i in (3, 2, 1)] == [[True] * 2, [False] * 2, [True] * 2]


def test_input_cone_stops_at_flip_flops(tmp_path):
    path = tmp_path / "mini.lib"
    path.write_text(MINI_LIB)
    lib = synth.read_liberty(path)
    inst = act.netlist_instances(NETLIST, lib)
    assert {inst[k].name for k in act.input_cone(inst, lib, ["a[0]"])} == {"_5_", "_6_"}
    assert act.input_cone(inst, lib, ["y"]) == set()


def test_evaluation_follows_the_cells_and_checks_the_recording(tmp_path):
    """The combinational nets are the cells' functions of the recorded ones, cycle by cycle;
    a recording the netlist does not explain (a flip-flop whose output is not its next
    state, a recorded net the functions contradict) is counted, not hidden."""
    path = tmp_path / "mini.lib"
    path.write_text(MINI_LIB)
    lib = synth.read_liberty(path)
    inst = act.netlist_instances(NETLIST, lib)
    a0 = np.array([0, 1, 1, 0, 1], bool)
    x1 = np.array([1, 1, 0, 0, 1], bool)
    q = np.concatenate([[False], a0[:-1] & x1[:-1]])  # D = !(!(a0 & x1)) one cycle later
    values, check = act.evaluate(inst, lib, {"a[0]": a0, "r.x[1]": x1, "y": q}, 5)
    assert values["_1_"].tolist() == (~(a0 & x1)).tolist()
    assert values["_2_"].tolist() == (a0 & x1).tolist()
    assert not any(check.values()), check
    _, check = act.evaluate(inst, lib, {"a[0]": a0, "r.x[1]": x1, "y": ~q}, 5)
    assert check["flip_flops_next_state_wrong"] == 1
    _, check = act.evaluate(inst, lib, {"a[0]": a0, "r.x[1]": x1, "y": q, "_2_": ~a0}, 5)
    assert check["recorded_nets_disagreeing"] == 1
    _, check = act.evaluate(inst, lib, {"a[0]": a0, "y": q}, 5)  # r.x[1] unknown
    assert check["cells_unevaluated"] == 2


def test_netlist_drivers_are_the_output_pins(tmp_path):
    path = tmp_path / "mini.lib"
    path.write_text(MINI_LIB)
    lib = synth.read_liberty(path)
    text = """module t (clk, a, y);
  input clk; input [1:0] a; output y; wire _1_;
  nand2_x1 _5_ (
    .A(a[0]),
    .B(\\r.x [1]),
    .Y(_1_)
  );
  dff_x1 \\q$reg  (.CLK(clk), .D(_1_), .Q(y));
endmodule
"""
    assert act.drivers(act.netlist_instances(text, lib)) == [
        ("_5_", "Y", "_1_"),
        ("q$reg", "Q", "y"),
    ]
    (i, _) = act.netlist_instances(text, lib)
    assert i.inputs == {"A": "a[0]", "B": "r.x[1]"} and i.outputs == {"Y": "_1_"}
    assert act.input_bits(text, "clk") == ["a[0]", "a[1]"]
    assert lib.cells["dff_x1"].state == {
        "kind": "ff",
        "vars": ["IQ", "IQN"],
        "next_state": "D",
        "clocked_on": "CLK",
    }


@needs_icarus
def test_cell_models_simulate_their_functions(tmp_path):
    """The mini library's cells, modelled from their Liberty text, behave as their
    functions say under Icarus: the NAND's truth table, the flip-flop's edge."""
    path = tmp_path / "mini.lib"
    path.write_text(MINI_LIB)
    lib = synth.read_liberty(path)
    (tmp_path / "cells.v").write_text(act.cell_models(lib, ["nand2_x1", "dff_x1", "inv_x1"]))
    (tmp_path / "t.v").write_text(
        """module t;
  reg a, b, clk = 0; wire y, q, n;
  nand2_x1 g (.A(a), .B(b), .Y(y));
  dff_x1 f (.CLK(clk), .D(y), .Q(q));
  inv_x1 i (.A(q), .Y(n));
  integer k;
  initial begin
    for (k = 0; k < 4; k = k + 1) begin
      {a, b} = k; #1 clk = 1; #1 clk = 0; $display("%0d %0d %0d %0d", k, y, q, n);
    end
  end
endmodule
"""
    )
    subprocess.run(
        ["iverilog", "-o", "t.vvp", "cells.v", "t.v"], cwd=tmp_path, check=True, timeout=60
    )
    out = subprocess.run(
        ["vvp", "t.vvp"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    ).stdout
    rows = [tuple(map(int, x.split())) for x in out.splitlines() if x.strip()]
    assert rows == [(k, 1 - (k == 3), 1 - (k == 3), int(k == 3)) for k in range(4)]


def _synth(tmp_path, *argv) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(
            ["rtl", "synth", "--liberty", str(LIBERTY), "--experts", "16", *argv, "--json"]
            + ["--out", str(tmp_path / "out")]
        )
    doc = json.loads(buf.getvalue())
    return rc, doc


@needs_liberty
@needs_tools
@needs_verilator
def test_recorded_activity_power_on_the_mapped_netlist(tmp_path):
    """The matcher's and the token buffer's benches pass on their mapped netlists; the
    recording checks; every cell output gets an activity; the power with it differs from
    the vectorless one and adds up; the report says where the activity comes from."""
    rc, doc = _synth(tmp_path, "--top", "matcher", "--top", "token_buffer", "--activity")
    assert rc == 0
    for t in doc["tops"]:
        a = t["activity"]
        assert a["failed"] == 0 and a["tests"] == 1, a
        assert not any(a["check"].values()), a["check"]
        assert a["cell_outputs_recorded"] == a["cell_outputs"] > 0
        assert a["input_ports_recorded"] == a["input_ports"] > 0
        assert a["cycles"] >= 400
        p, v = t["activity_power_mw"], t["power_mw"]
        assert p["total"] == pytest.approx(p["internal"] + p["switching"] + p["leakage"], 1e-4)
        assert p["total"] > 0 and p["total"] != v["total"]
        assert p["leakage"] == pytest.approx(v["leakage"], rel=1e-3)  # not an activity's
        assert (tmp_path / "out" / t["files"]["activity"]).exists()
    report = (tmp_path / "out" / "synth.md").read_text()
    assert "Recorded activity" in report and "the netlist passed its bench" in report


@needs_liberty
@needs_tools
@needs_verilator
def test_a_wrong_netlist_fails_its_bench(tmp_path, monkeypatch):
    """The gate-level run is a check: a netlist with one gate changed (a NAND made an AND
    in the cell models) fails the matcher's bench, and the run's status says so."""
    real = act.cell_models

    def broken(lib, names):
        text = real(lib, names)
        return text.replace(
            "assign Y = ((~A) | (~B));", "assign Y = (A & B);", 1
        )  # sky130 nand2: "(!A) | (!B)"

    monkeypatch.setattr(act, "cell_models", broken)
    rc, doc = _synth(tmp_path, "--top", "matcher", "--activity")
    (t,) = doc["tops"]
    assert t["activity"]["failed"] == 1 and rc == 1
    assert "FAILED its bench" in (tmp_path / "out" / "synth.md").read_text()
    assert any(t["activity"]["check"].values())  # the library's NAND contradicts the run


@needs_liberty
@needs_tools
def test_sta_repropagates_input_cones(tmp_path):
    """What this OpenSTA does with a pin activity inside an input port's cone: its
    ``report_power`` propagates the port's activity over it, so the value set is lost (the
    report counts those cells, ``input_cone``)."""
    (tmp_path / "lib.lib").symlink_to(LIBERTY)
    (tmp_path / "n.v").write_text(
        """module t (clk, a, y);
  input clk; input a; output y; wire n1; wire n2;
  sky130_fd_sc_hd__inv_1 _1_ (.A(a), .Y(n1));
  sky130_fd_sc_hd__inv_1 _2_ (.A(n1), .Y(n2));
  sky130_fd_sc_hd__dfxtp_1 _3_ (.CLK(clk), .D(n2), .Q(y));
endmodule
"""
    )
    power = {}
    for rate in (0.0, 1.0):
        tcl, _ = act.activity_tcl(
            [("_1_", "Y", "n1"), ("_2_", "Y", "n2")],
            [],
            {
                "n1": np.arange(10) % 2 == 1 if rate else np.zeros(10, bool),
                "n2": np.zeros(10, bool),
            },
            10,
        )
        (tmp_path / "a.tcl").write_text(tcl)
        (tmp_path / "s.tcl").write_text(
            "\n".join(
                [
                    "read_liberty lib.lib",
                    "read_verilog n.v",
                    "link_design t",
                    "create_clock -name clk -period 1.25 [get_ports clk]",
                    "set_input_delay 0 -clock clk [get_ports a]",
                    "set_power_activity -input_ports [get_ports a] -activity 0.5 -duty 0.5",
                    "report_power",
                    "source a.tcl",
                    'puts "@@ power"',
                    "report_power -digits 6",
                    'puts "@@ end"',
                ]
            )
        )
        out = synth._sta(tmp_path, "s.tcl", "sta.log")
        assert "@@ pins_set 2" in out
        power[rate] = synth._power(synth._sections(out)["power"])["total"]
    assert power[0.0] == power[1.0]


@needs_liberty
@needs_tools
def test_sta_takes_the_pin_activity(tmp_path):
    """OpenSTA's ``sta::set_power_pin_activity`` (its ``set_power_activity -pins`` fails in
    its own Tcl here) changes the power: a flip-flop output toggling every cycle costs more
    than one that never toggles -- once a first ``report_power`` has run (before it, this
    OpenSTA drops the activity: the flow's script reports the vectorless power first)."""
    lib = synth.read_liberty(LIBERTY)
    (tmp_path / "lib.lib").symlink_to(LIBERTY)
    (tmp_path / "n.v").write_text(
        """module t (clk, a, y);
  input clk; input a; output y; wire q;
  sky130_fd_sc_hd__dfxtp_1 _1_ (.CLK(clk), .D(a), .Q(q));
  sky130_fd_sc_hd__inv_1 _2_ (.A(q), .Y(y));
endmodule
"""
    )
    power = {}
    for rate in (0.0, 1.0):
        q = np.arange(10) % 2 == 1 if rate else np.arange(10) >= 5  # 9 changes, or 1
        tcl, _ = act.activity_tcl([("_1_", "Q", "q")], ["a"], {"q": q}, 10)
        (tmp_path / "a.tcl").write_text(tcl)
        script = "\n".join(
            [
                "read_liberty lib.lib",
                "read_verilog n.v",
                "link_design t",
                "create_clock -name clk -period 1.25 [get_ports clk]",
                "report_power",
                "source a.tcl",
                'puts "@@ power"',
                "report_power -digits 6",
                'puts "@@ end"',
            ]
        )
        (tmp_path / "s.tcl").write_text(script)
        out = synth._sta(tmp_path, "s.tcl", "sta.log")
        power[rate] = synth._power(synth._sections(out)["power"])["total"]
    assert lib.cells["sky130_fd_sc_hd__dfxtp_1"].state["clocked_on"] == "CLK"
    assert power[1.0] > power[0.0] > 0
