"""``fsedp rtl synth``: synthesis to a standard-cell library (Yosys, ABC) and static timing
(OpenSTA).  Bad input is one line and exit 2 without any tool; the flow itself runs on the
SkyWater SKY130 HD library of the shared data folder with Debian's yosys and sta, and is
skipped, saying why, where one of them is missing."""

import contextlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsedp.cli import main
from fsedp.errors import InputError
from fsedp.experiments import synth

ROOT = Path(__file__).resolve().parents[1]
LIBERTY = (
    Path(__file__).resolve().parents[1].parent
    / "shared"
    / "data"
    / "liberty"
    / "sky130_fd_sc_hd__tt_025C_1v80.lib"
)

needs_liberty = pytest.mark.skipif(
    not LIBERTY.is_file(), reason=f"the SKY130 HD Liberty is not at {LIBERTY}"
)
needs_tools = pytest.mark.skipif(
    bool(synth.missing_tools()),
    reason="needs yosys and sta (OpenSTA) on PATH: "
    + ", ".join(synth.missing_tools() or ["present"]),
)

#: A minimal library: an inverter, a NAND, a flip-flop and an isolation cell.
MINI_LIB = """\
/* a comment before the library */
library (mini) {
  time_unit : "1ns";
  capacitive_load_unit (1, pf);
  cell (inv_x1) {
    area : 1.5;
    pin (A) { direction : input; capacitance : 0.002; }
    pin (Y) { direction : output; function : "!A"; }
  }
  cell (inv_x2) {
    area : 2.5;
    pin (A) { direction : input; capacitance : 0.004; }
    pin (Y) { direction : output; function : "(!A)"; }
  }
  cell (nand2_x1) {
    area : 2.0;
    pin (A) { direction : input; capacitance : 0.002; }
    pin (B) { direction : input; capacitance : 0.002; }
    pin (Y) { direction : output; function : "!(A&B)"; }
  }
  cell (dff_x1) {
    area : 6.0;
    ff (IQ, IQN) { next_state : "D"; clocked_on : "CLK"; }
    pin (CLK) { direction : input; clock : true; capacitance : 0.002; }
    pin (D) { direction : input; capacitance : 0.002; }
    pin (Q) { direction : output; function : "IQ"; }
  }
  cell (iso_x1) {
    area : 1.0;
    is_isolation_cell : true;
    pin (A) { direction : input; capacitance : 0.001; }
    pin (Y) { direction : output; function : "!A"; }
  }
}
"""


def _one_line(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("fsedp: "), err
    for w in words:
        assert w in err, (w, err)
    return err


@pytest.fixture
def mini(tmp_path):
    path = tmp_path / "mini.lib"
    path.write_text(MINI_LIB)
    return path


# -- the Liberty reader (no tool, no shared data) -----------------------------------------------
def test_reads_a_small_library(mini):
    lib = synth.read_liberty(mini)
    assert lib.name == "mini" and lib.time_unit_ps == 1000 and lib.cap_unit_ff == 1000
    assert set(lib.cells) == {"inv_x1", "inv_x2", "nand2_x1", "dff_x1", "iso_x1"}
    assert lib.cells["dff_x1"].sequential and not lib.cells["nand2_x1"].sequential
    assert lib.cells["nand2_x1"].area == 2.0
    # the smallest ordinary inverter: the isolation cell is smaller but special
    assert lib.inverter().name == "inv_x1"
    assert lib.special() == {"iso_x1": "isolation cell"}
    # the mapping library: the same cells, the special one dont_use
    again = mini.with_name("mapping.lib")
    again.write_text(lib.mapping_text())
    mapped = synth.read_liberty(again)
    assert set(mapped.cells) == set(lib.cells)
    assert mapped.special() == {"iso_x1": "marked dont_use"}
    assert "set_driving_cell inv_x1" in synth.abc_constraints(lib)
    assert "set_load 2.0000" in synth.abc_constraints(lib)  # 0.002 pF in fF


def test_fo4_chain_drives_four_loads(mini):
    lib = synth.read_liberty(mini)
    text = synth.fo4_netlist(lib.inverter())
    assert text.count("inv_x1 ") == 4 * synth.FO4_STAGES
    for tap in ("tap_a", "tap_b"):  # a tap is the input of one stage and three loads
        assert len(re.findall(rf"\.A\({tap}\)", text)) == 4


@pytest.mark.parametrize(
    "text,reason",
    [
        ("hello, world\n", "not a Liberty library"),
        ("library (x) {\n  cell (a) {\n    area : 1;\n", "never closed"),
        ("library (x) {\n}\n}\n", "closes nothing"),
        ("library (x) {\n  time_unit : 1ns;\n}\n", "no cell with an area"),
        (MINI_LIB.replace('"!A"', '"A"').replace('"(!A)"', '"(A)"'), "no inverter"),
        (MINI_LIB.replace("ff (IQ, IQN)", "statistics (IQ, IQN)"), "no flip-flop"),
        (MINI_LIB.replace('"1ns"', '"3ns"'), "time_unit"),
    ],
    ids=["text", "unclosed", "extra-brace", "no-cells", "no-inverter", "no-flop", "unit"],
)
def test_not_a_usable_liberty(tmp_path, text, reason):
    path = tmp_path / "bad.lib"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        synth.read_liberty(path)
    assert reason in e.value.reason and e.value.file == str(path)


# -- bad input: one line, exit 2, no tool needed ------------------------------------------------
@pytest.mark.parametrize(
    "argv,words",
    [
        (["--liberty", "/nonexistent/x.lib"], ["--liberty", "/nonexistent/x.lib", "no such file"]),
        (["--liberty", "{tmp}"], ["--liberty", "not a regular file"]),
        (["--liberty", ""], ["--liberty", "must name a Liberty file"]),
        (["--liberty", "{text}"], ["--liberty", "not a Liberty library"]),
        (["--liberty", "{binary}"], ["--liberty", "binary"]),
        (["--liberty", "{mini}", "--top", "nosuch"], ["--top", "unknown top 'nosuch'"]),
        (["--liberty", "{mini}", "--clock-mhz", "0"], ["--clock-mhz"]),
        (["--liberty", "{mini}", "--clock-mhz", "1e9"], ["--clock-mhz"]),
        (["--liberty", "{mini}", "--clock-mhz", "nan"], ["--clock-mhz", "finite"]),
        (["--liberty", "{mini}", "--clock-mhz", "fast"], ["--clock-mhz", "a number"]),
        (["--liberty", "{mini}", "--experts", "3"], ["--experts"]),
        (["--liberty", "{mini}", "--top", "router", "--chiplets", "9"], ["--chiplets"]),
        (["--clock-mhz", "800"], ["--liberty"]),  # required
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_bad_input_is_one_line(tmp_path, mini, capsys, monkeypatch, argv, words):
    text = tmp_path / "notes.txt"
    text.write_text("not a library\n")
    binary = tmp_path / "blob.lib"
    binary.write_bytes(b"\0\1\2" * 100)
    subs = {"{tmp}": str(tmp_path), "{mini}": str(mini), "{text}": str(text)}
    subs["{binary}"] = str(binary)
    argv = [subs.get(a, a) for a in argv]
    # the answer does not depend on what is installed: the tools are checked last
    monkeypatch.setattr(synth.shutil, "which", lambda tool: None)
    out = tmp_path / "out"
    assert main(["rtl", "synth", *argv, "--out", str(out)]) == 2
    _one_line(capsys, *words)
    assert not out.exists()


def test_unreadable_liberty_is_one_line(tmp_path, mini, capsys):
    mini.chmod(0)
    if os.access(mini, os.R_OK):
        pytest.skip("running as a user who reads any file (root)")
    assert main(["rtl", "synth", "--liberty", str(mini), "--out", str(tmp_path / "o")]) == 2
    _one_line(capsys, "--liberty", "cannot read")


@pytest.mark.parametrize("absent", ["yosys", "sta"])
def test_missing_tool_names_it_and_its_package(tmp_path, mini, capsys, monkeypatch, absent):
    real = shutil.which
    monkeypatch.setattr(synth.shutil, "which", lambda t: None if t == absent else real(t) or t)
    argv = ["rtl", "synth", "--liberty", str(mini), "--top", "icv", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    _one_line(capsys, f"{absent} (Debian package {synth.TOOLS[absent]})")
    assert not (tmp_path / "o").exists()


def test_a_killed_tool_is_one_line_and_exit_3(tmp_path, mini, capsys, monkeypatch):
    """A tool a signal stops (the out-of-memory killer, a limit) is the machine's failure:
    one line naming it and its log, exit 3, no report folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in synth.TOOLS:  # answers the version query, then is killed at work
        fake = bin_dir / tool
        fake.write_text('#!/bin/sh\ncase "$1" in -V|-version) echo fake; exit 0;; esac\n'
                        "kill -KILL $$\n")  # fmt: skip
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    out = tmp_path / "o"
    argv = ["rtl", "synth", "--liberty", str(mini), "--top", "icv", "--out", str(out), "--json"]
    assert main(argv) == 3
    assert _one_line(capsys, "killed by SIGKILL", "dmesg").startswith("fsedp: sta: ")
    assert not out.exists()


def test_bad_input_from_a_shell_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fsedp", "rtl", "synth", "--liberty", str(tmp_path / "no.lib")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_an_interrupted_run_leaves_no_output(tmp_path, mini, monkeypatch):
    """Nothing half-written: the report folder appears whole or not at all."""
    monkeypatch.setattr(synth, "missing_tools", lambda: [])
    monkeypatch.setattr(synth, "_tool_versions", lambda: {})

    def interrupted(lib, work):
        assert (work / synth.WORK_FILES["lib"]).exists()
        assert "dont_use : true" in (work / synth.WORK_FILES["maplib"]).read_text()
        raise KeyboardInterrupt

    monkeypatch.setattr(synth, "measure_fo4", interrupted)
    out = tmp_path / "report"
    assert main(["rtl", "synth", "--liberty", str(mini), "--top", "icv", "--out", str(out)]) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mini.lib"]


# -- the SKY130 library -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sky130():
    if not LIBERTY.is_file():
        pytest.skip(f"the SKY130 HD Liberty is not at {LIBERTY}")
    return synth.read_liberty(LIBERTY)


def _areas() -> dict:
    """Each cell's area, read from the Liberty text directly (not by the reader under
    test)."""
    text = LIBERTY.read_text(encoding="latin-1")
    pairs = re.findall(r"\bcell\s*\(\s*\"?([\w]+)\"?\s*\)\s*\{[^{}]*?\barea\s*:\s*([0-9.]+)", text)
    return {name: float(a) for name, a in pairs}


@needs_liberty
def test_sky130_cells_and_special_ones(sky130):
    assert sky130.name == "sky130_fd_sc_hd__tt_025C_1v80" and len(sky130.cells) > 400
    assert sky130.inverter().name == "sky130_fd_sc_hd__inv_1"
    special = sky130.special()
    assert special and all(n.startswith("sky130_fd_sc_hd__lpflow_") for n in special)
    areas = _areas()
    assert all(areas[n] == c.area for n, c in sky130.cells.items())


def _run(argv) -> dict:
    """``fsedp rtl synth ... --json`` in this process; its JSON document."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["rtl", "synth", "--liberty", str(LIBERTY), *argv, "--json"])
    doc = json.loads(buf.getvalue())
    assert rc == 0, [t.get("error") for t in doc["tops"]]
    return doc


SMALL = ["--experts", "16", "--chiplets", "4"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Four small blocks synthesised once at 800 MHz (a few seconds each)."""
    if not LIBERTY.is_file() or synth.missing_tools():
        pytest.skip("needs the SKY130 HD Liberty, yosys and sta")
    out = tmp_path_factory.mktemp("synth") / "report"
    doc = _run(["--top", "icv", "matcher", "pairing", "token_buffer", *SMALL, "--out", str(out)])
    return doc, out


@needs_liberty
@needs_tools
def test_fo4_of_sky130_hd_is_tens_of_ps(small):
    doc, _ = small
    fo4 = doc["fo4"]
    assert fo4["cell"] == "sky130_fd_sc_hd__inv_1" and 30 <= fo4["fo4_ps"] <= 150, fo4
    for t in doc["tops"]:
        assert t["arrival_fo4"] == pytest.approx(t["arrival_ns"] * 1000 / fo4["fo4_ps"], abs=0.1)


@needs_liberty
@needs_tools
def test_area_is_the_sum_of_the_cells_areas(small):
    doc, out = small
    areas = _areas()
    for t in doc["tops"]:
        assert t["area_um2"] > 0 and t["cell_count"] == sum(t["cells"].values()) > 0
        assert t["area_um2"] == pytest.approx(
            sum(n * areas[c] for c, n in t["cells"].items()), abs=0.01
        ), t["top"]
        # the netlist holds those cells, all of the library, and nothing Yosys-internal
        netlist = (out / t["files"]["netlist"]).read_text()
        kinds = re.findall(r"^\s+(\S+) \S+ \($", netlist, re.M)
        assert len(kinds) == t["cell_count"] and set(kinds) <= set(areas), t["top"]
        assert "$_" not in netlist
        flops = sum(n for c, n in t["cells"].items() if "df" in c.split("__")[-1][:3])
        assert t["flip_flops"] == flops
    by = {t["top"]: t for t in doc["tops"]}
    assert by["pairing"]["flip_flops"] == 0 and by["matcher"]["flip_flops"] > 0


@needs_liberty
@needs_tools
def test_slack_is_period_minus_arrival(small):
    doc, _ = small
    period = 1000 / 800
    assert doc["period_ns"] == pytest.approx(period)
    for t in doc["tops"]:
        for k in ("arrival_ns", "required_ns", "slack_ns", "worst_slack_ns", "tns_ns"):
            assert math.isfinite(t[k]), (t["top"], k)
        assert t["arrival_ns"] > 0 and t["path_cells"] > 0
        assert t["slack_ns"] == pytest.approx(t["required_ns"] - t["arrival_ns"], abs=2e-4)
        # required: the next edge less the flip-flop's setup time or the output delay (0)
        margin = t["setup_ns"] if t["setup_ns"] is not None else t["output_delay_ns"]
        assert margin is not None and 0 <= margin < period / 2, t
        assert t["required_ns"] == pytest.approx(period - margin, abs=2e-4)
        assert t["worst_slack_ns"] == pytest.approx(t["slack_ns"], abs=2e-4)
        assert t["tns_ns"] <= min(0.0, t["slack_ns"]) + 1e-4


@needs_liberty
@needs_tools
def test_high_fanout_nets_are_buffered(small):
    """No net of a mapped netlist drives more inputs than ABC's ``buffer -N`` allows (4)
    and no slew exceeds the library's limits: flip-flop outputs and inputs are buffered by
    ABC."""
    doc, _ = small
    fanout = int(re.search(r"buffer -p -N (\d+);", synth.ABC_SCRIPT).group(1))
    for t in doc["tops"]:
        assert t["max_fanout"] <= fanout and t["max_transition_violations"] == 0, t["top"]


@needs_liberty
@needs_tools
def test_power_is_vectorless_and_adds_up(small):
    doc, out = small
    assert "vectorless" in doc["power"]
    for t in doc["tops"]:
        p = t["power_mw"]
        assert p["total"] > 0 and p["leakage"] >= 0
        assert p["total"] == pytest.approx(p["internal"] + p["switching"] + p["leakage"], rel=1e-4)
    report = (out / "synth.md").read_text()
    assert "vectorless" in report and "FO4" in report
    assert all(f"| {t['top']} |" in report for t in doc["tops"])
    assert json.loads((out / "synth.json").read_text())["tops"] == doc["tops"]
    names = {p.name for p in out.iterdir()}
    assert {"synth.md", "synth.json", "fo4_chain.v", "fo4.sta.txt"} <= names
    for t in doc["tops"]:
        assert set(t["files"].values()) <= names


@needs_liberty
@needs_tools
def test_a_bigger_generic_gives_more_area(small, tmp_path):
    doc, _ = small
    (c4,) = [t for t in doc["tops"] if t["top"] == "matcher"]
    wider = _run(
        ["--top", "matcher", "--experts", "16", "--chiplets", "8"] + ["--out", str(tmp_path)]
    )
    (c8,) = wider["tops"]
    assert c8["params"]["chiplets"] == 8 and c4["params"]["chiplets"] == 4
    assert c8["area_um2"] > c4["area_um2"] and c8["flip_flops"] > c4["flip_flops"]


@needs_liberty
@needs_tools
def test_without_a_driving_cell_abc_leaves_fanout_unbuffered(small, tmp_path, monkeypatch):
    """The choice the flow rests on: ABC buffers its primary inputs (the flip-flop outputs)
    only when told what drives them; without it a register drives dozens of gates
    directly and its delay grows with them."""
    doc, _ = small
    (buffered,) = [t for t in doc["tops"] if t["top"] == "token_buffer"]
    monkeypatch.setattr(synth, "abc_constraints", lambda lib: "")
    bare = _run(["--top", "token_buffer", *SMALL, "--out", str(tmp_path)])["tops"][0]
    assert bare["max_fanout"] > 2 * buffered["max_fanout"]
    assert bare["slack_ns"] < buffered["slack_ns"]
