"""The fsedp command line: bad input gets one line and exit status 2; Verilog lints clean."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsedp.cli import main

ROOT = Path(__file__).resolve().parents[1]
BAD = sorted((ROOT / "configs" / "bad").glob("*.yaml"))


def fsedp(*args):
    return subprocess.run(
        [sys.executable, "-m", "fsedp", *args], capture_output=True, text=True, cwd=ROOT
    )


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "run" in out and "rtl" in out


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_config_one_line_exit_2(path, capsys):
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert str(path) in err or path.name in err
    expect = path.read_text().splitlines()[0].split("expect:")[-1].strip()
    assert expect.split(".")[-1] in err


@pytest.mark.parametrize(
    "args",
    [
        ["rtl", "cosim", "--experts", "300"],
        ["rtl", "cosim", "--chiplets", "2"],
        ["rtl", "verilog"],  # --out missing
        ["rtl", "report", "--experts", "16,x"],
        ["bogus"],
        ["run", "--config", "/nonexistent/run.yaml"],
        ["run", "--strategies", "EP,XX"],
        ["run", "--iterations", "0"],
        ["run", "--layers", "-1"],
    ],
)
def test_bad_arguments_one_line_exit_2(args):
    proc = fsedp(*args)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_verilog_under_an_address_space_limit_is_one_line_exit_3(tmp_path):
    """Amaranth's built-in Yosys (WebAssembly on wasmtime) reserves 4 GiB of address space:
    under ``ulimit -v 4000000`` it cannot start.  That is the machine's failure: one line
    saying what to do, exit 3, no output folder."""
    import os

    resource = pytest.importorskip("resource")
    limit = 4_000_000 * 1024  # bytes: ulimit -v 4000000
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and hard < limit:
        pytest.skip(f"the hard address-space limit {hard} is below {limit}")

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))

    out = tmp_path / "v"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "fsedp", "rtl", "verilog", "--out", str(out), "--block", "eit"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "AMARANTH_USE_YOSYS": "builtin"},  # not a system Yosys
            preexec_fn=cap,
        )
    except (subprocess.SubprocessError, OSError) as e:
        pytest.skip(f"cannot set RLIMIT_AS here: {e}")
    if proc.returncode == 0:
        pytest.skip("this build of the built-in Yosys runs within 4000000 KiB")
    err = proc.stderr.strip()
    assert proc.returncode == 3, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("fsedp: Yosys (Verilog of fsedp_eit): ") and "ulimit -v" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "raised, reason",
    [
        (MemoryError(), "out of memory or address space"),
        ("", "stopped without a message"),
        ("Traceback ...\nMemoryError", "no memory: MemoryError"),
        ("Could not find an acceptable Yosys binary.", "no Yosys to run"),
    ],
)
def test_yosys_failures_of_the_machine_are_one_line(tmp_path, capsys, monkeypatch, raised, reason):
    from amaranth._toolchain.yosys import YosysError

    import fsedp.hw.generate as generate

    def convert(*a, **k):
        raise raised if isinstance(raised, BaseException) else YosysError(raised)

    monkeypatch.setattr(generate.verilog, "convert", convert)
    out = tmp_path / "v"
    assert main(["rtl", "verilog", "--out", str(out), "--block", "icv"]) == 3
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"fsedp: Yosys (Verilog of fsedp_icv): {reason}")
    assert not out.exists()


def test_a_yosys_error_about_the_design_is_not_the_machines(monkeypatch):
    from amaranth._toolchain.yosys import YosysError

    import fsedp.hw.generate as generate

    def convert(*a, **k):
        raise YosysError("ERROR: something about the design")

    monkeypatch.setattr(generate.verilog, "convert", convert)
    from fsedp.config import default_run

    with pytest.raises(YosysError):
        generate.verilog_text("icv", default_run().scheduler_params())


def test_verilog_written_and_lint_clean(tmp_path, capsys):
    rc = main(
        [
            "rtl",
            "verilog",
            "--out",
            str(tmp_path),
            "--experts",
            "12",
            "--chiplets",
            "5",
            "--lint",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc["lint"]
    assert len(doc["files"]) == 7 and all(v == "clean" for v in doc["lint"].values())
    assert "module fsedp_scheduler" in (tmp_path / "fsedp_scheduler.v").read_text()


def test_rtl_rounds_small_config_agrees(tmp_path, capsys):
    cfg = tmp_path / "small.yaml"
    cfg.write_text("""\
hardware: chip2x2
model: {name: tiny, d_model: 64, d_ffn: 128, experts: 16, top_k: 2, shared_experts: 0,
        layers: 2, heads: 2, params_b: 0.01}
scheduler: {count_width: 6, requests: 4, theta_min: 2, n_threshold: 2, qos_width: 2, t_qos_init: 0}
scenario: {tokens_per_iteration: 16, rounds: 3, seed: 5, trace: synthetic, skew: 1.2,
           prefill_fraction: 0.5}
""")
    rc = main(["rtl", "rounds", "--config", str(cfg), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["mismatches"] == 0 and doc["rounds"] == 3
    assert len(doc["schedule"]) == 3 and doc["latency_first_dispatch_cycles"]["max"] > 0


TINY_HW = (
    "{name: tiny2x2, rows: 2, cols: 2, clock_mhz: 800, macs_per_chiplet: 2048, "
    "onchip_buffer_kib: %d, d2d_bandwidth_gbps: 288, d2d_latency_ns: 4.02, "
    "ddr_channels: 4, ddr_bandwidth_gbps_per_channel: 25.6, microslices_per_expert: 8}"
)
TINY_RUN = """\
hardware: %s
model: {name: tiny, d_model: 64, d_ffn: 128, experts: 16, top_k: 2, shared_experts: 0,
        layers: 3, heads: 2, params_b: 0.01}
scheduler: default
scenario: {tokens_per_iteration: 16, rounds: 2, seed: 5, trace: synthetic, skew: 1.2,
           prefill_fraction: 0.5}
"""


@pytest.mark.parametrize(
    "args",
    [
        ["rtl", "datapath", "--mesh", "2by2"],
        ["rtl", "datapath", "--mesh", "2x2:0"],
        ["rtl", "datapath", "--no-ring", "--no-cells", "--mesh", "9x9"],
        ["rtl", "datapath", "--no-ring", "--no-cells", "--mesh", "2x2", "--slots", "3"],
        ["rtl", "verilog", "--out", "build/never", "--block", "router", "--chiplets", "9"],
        ["rtl", "verilog", "--out", "build/never", "--balance", "70000"],
    ],
)
def test_bad_datapath_arguments_one_line_exit_2(args):
    proc = fsedp(*args)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_datapath_buffer_too_small_names_the_field(tmp_path, capsys):
    cfg = tmp_path / "small-buffer.yaml"
    cfg.write_text(TINY_RUN % (TINY_HW % 4))  # 4 KiB: one 3 KiB micro-slice
    assert main(["rtl", "verilog", "--config", str(cfg), "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "hardware.onchip_buffer_kib" in err and "deadlock" in err
    assert not list(tmp_path.glob("*.v.tmp"))


def test_chip_verilog_lint_clean(tmp_path, capsys):
    """``--block chip``: the scheduler and the chiplet array in one top, on the config's mesh
    with the scheduler's experts, lint clean; a scheduler of another chiplet count refused."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY_RUN % (TINY_HW % 18))
    args = ["rtl", "verilog", "--config", str(cfg), "--out", str(tmp_path / "v"), "--block"]
    rc = main([*args, "chip", "--lint", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc["lint"]
    assert len(doc["files"]) == 1 and all(v == "clean" for v in doc["lint"].values())
    assert "module fsedp_chip" in (tmp_path / "v" / "fsedp_chip.v").read_text()
    assert main([*args, "chip", "--chiplets", "9", "--force"]) == 2
    assert "--chiplets" in capsys.readouterr().err


def test_datapath_verilog_lint_clean(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY_RUN % (TINY_HW % 18))  # 6 slots of 3 KiB
    rc = main(
        [
            "rtl",
            "verilog",
            "--config",
            str(cfg),
            "--out",
            str(tmp_path / "v"),
            "--block",
            "chiplet_array",
            "--lint",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc["lint"]
    assert doc["datapath_params"]["slots"] == 6 and len(doc["files"]) == 1
    assert "module fsedp_chiplet_array" in (tmp_path / "v" / "fsedp_chiplet_array.v").read_text()


def test_run_main_job_writes_report(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY_RUN % (TINY_HW % 24))
    out = tmp_path / "report"
    rc = main(
        [
            "run",
            "--config",
            str(cfg),
            "--layers",
            "3",
            "--out",
            str(out),
            "--json",
            "--strategies",
            "EP,Hydra,A1,A2,A3,A4",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert set(doc["summary"]) == {"EP", "Hydra", "A1", "A2", "A3", "A4"}
    for m in doc["summary"].values():
        assert m["x_bound"] >= 1.0 and 0 < m["utilization"] <= 1 and m["layers"] == 3
        # the gap to the bound by cause: with the bound's share, the whole time
        assert abs(1 / m["x_bound"] + sum(m["lost"].values()) - 1) < 0.01
    assert "Where the time over the bound goes" in (out / "report.md").read_text()
    per_layer = json.loads((out / "summary.json").read_text())["layers"]
    assert all("lost" in x and x["bounding"] in ("ddr", "compute") for x in per_layer["A3"])
    assert sorted(p.name for p in out.iterdir()) == [
        ".fsedp-output.json",
        "activity.png",
        "chiplets.png",
        "report.md",
        "summary.json",
        "utilization.png",
    ]
    assert json.loads((out / "summary.json").read_text())["summary"] == doc["summary"]


def test_run_with_rtl_scheduler_agrees(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY_RUN % (TINY_HW % 24))
    rc = main(
        [
            "run",
            "--config",
            str(cfg),
            "--layers",
            "2",
            "--strategies",
            "A3,A6",
            "--scheduler",
            "rtl",
            "--out",
            str(tmp_path / "r"),
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["rtl_check"]["mismatches"] == 0
    assert doc["rtl_check"]["layers"] == 4 and doc["rtl_check"]["beats"] > 0
    # A6 runs the scheduler RTL with its generics: the balanced order, entry dispatch
    a6 = doc["rtl_check"]["per_strategy"]["A6"]
    assert a6["mismatches"] == 0 and a6["params"]["entry_dispatch"] and a6["params"]["balance"]


EXPERIMENT = """\
experiment: sweep
figure: "test"
table: %s
hardware: chip2x2
models: [deepseek-moe-16b]
tokens: [16]
iterations: 1
layers: 1
strategies: [EP, Hydra, A3]
seed: 1
"""


@pytest.mark.parametrize(
    "change,field",
    [
        ("models: [deepseek-moe-16b]", "models: [nope]"),
        ("layers: 1", "layers: 0"),
        ("strategies: [EP, Hydra, A3]", "strategies: [A3]"),
        ("seed: 1", "seed: 1\nextra: 2"),
    ],
)
def test_bad_experiment_file_one_line_exit_2(tmp_path, capsys, change, field):
    f = tmp_path / "exp.yaml"
    f.write_text((EXPERIMENT % "latency").replace(change, field))
    assert main(["run", "--config", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(f) in err and "Traceback" not in err


@pytest.mark.parametrize("table", ["latency", "memory"])
def test_experiment_file_runs(tmp_path, capsys, table):
    f = tmp_path / "exp.yaml"
    f.write_text(EXPERIMENT % table)
    out = tmp_path / "table.md"
    assert main(["run", "--config", str(f), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["rows"]) == 1 and doc["rows"][0]["micro_slices"] == 15
    assert "deepseek-moe-16b" in out.read_text()


def test_experiment_file_runs_a5_at_each_slack(tmp_path, capsys):
    f = tmp_path / "exp.yaml"
    text = (EXPERIMENT % "throughput").replace("[EP, Hydra, A3]", "[EP, A3, A5]")
    f.write_text(text + "a5_slack: [0.1, 0.3]\n")
    assert main(["run", "--config", str(f), "--no-cache", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["rows"]
    assert "A5 10%" in row and "A5 30%" in row and "A5" not in row
    assert "A5 10% tok/s" in doc["table"] and "A5 30% tok/s" in doc["table"]


def test_verilog_of_a6s_scheduler_is_lint_clean(tmp_path, capsys):
    """The scheduler with A6's generics (balanced order, entry dispatch) as Verilog."""
    args = ["rtl", "verilog", "--out", str(tmp_path), "--block", "scheduler"]
    rc = main([*args, "--balance", "64", "--entry-dispatch", "--lint", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and all(v == "clean" for v in doc["lint"].values()), doc["lint"]
    # the order table of the balanced order is there; the paired order has none
    assert "order" in (tmp_path / "fsedp_scheduler.v").read_text()


GRID = """\
experiment: grid
figure: "test"
hardware: chip2x2
model: qwen3-30b-a3b
tokens: 16
layers: 1
strategies: [EP, A3]
seed: 1
vary:
  ddr_bandwidth_gbps_per_channel: [25.6]
fixed:
  %s
"""


@pytest.mark.parametrize(
    "fixed,field",
    [
        ("nosuch: 1", "fixed.nosuch"),
        ("ddr_bandwidth_gbps_per_channel: 12.8", "fixed.ddr_bandwidth_gbps_per_channel"),
        ("onchip_buffer_kib: -4", "fixed.onchip_buffer_kib"),
    ],
)
def test_bad_grid_fixed_field_one_line_exit_2(tmp_path, capsys, fixed, field):
    f = tmp_path / "grid.yaml"
    f.write_text(GRID % fixed)
    assert main(["run", "--config", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and field in err and str(f) in err


def test_grid_fixed_field_applies_to_every_point(tmp_path, capsys):
    """Fixing 16 micro-slices per expert halves FSE-DP's micro-slice, hence its on-chip
    weights, against the hardware's 8."""
    mb = {}
    for m in (8, 16):
        f = tmp_path / f"grid{m}.yaml"
        f.write_text(GRID % f"microslices_per_expert: {m}")
        assert main(["run", "--config", str(f), "--no-cache", "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)["rows"]
        mb[m] = row["A3"]["weights_mb"]
    assert mb[16] < mb[8]


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="Icarus Verilog missing")
def test_cosim_waves_writes_a_waveform(capsys):
    """``fsedp rtl cosim --waves`` records the run and names the file."""
    rc = main(
        ["rtl", "cosim", "--sim", "icarus", "--experts", "16", "--rounds", "2", "--waves"]
        + ["--json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["mismatches"] == 0
    assert doc["waves"].endswith(".fst") and Path(doc["waves"]).stat().st_size > 1000


def test_failing_cosim_records_its_failing_round(monkeypatch, capsys):
    """A cosimulation with a mismatch runs again, same seed, up to the failing round with
    waves on, and names the waveform."""
    import fsedp.cli.rtl as rtl
    import fsedp.experiments.rtl_runs as rtl_runs

    calls = []

    def fake(p, sim, knobs, tag, opt="-O0", waves=False):
        calls.append((dict(knobs), waves))
        if not waves:
            return {"mismatches": 1, "first_mismatches": ["x"], "first_mismatch_round": 4}
        return {"mismatches": 1, "waves": "/tmp/dump.vcd"}

    monkeypatch.setattr(rtl_runs, "run_tb", fake)
    monkeypatch.setattr(rtl, "require_simulator", lambda sim: None)
    rc = main(["rtl", "cosim", "--experts", "16", "--rounds", "50", "--seed", "7", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["waves"] == "/tmp/dump.vcd" and doc["waves_round"] == 4
    (first, w1), (again, w2) = calls
    assert (first["rounds"], w1) == (50, False) and (again["rounds"], w2) == (5, True)
    assert again["seed"] == first["seed"] == 7


def test_failing_datapath_run_records_its_failing_layer(monkeypatch, capsys):
    """A chiplet-array run with a lockstep mismatch runs again, same seed, up to the failing
    layer with waves on, and the report names the waveform."""
    import fsedp.experiments.datapath_report as dr

    calls = []

    def fake(sp, p, layers, sim="verilator", seed=1, stall=0.25, reset_every=0, opt="-O0",
             waves=False):  # fmt: skip
        calls.append((layers, seed, waves))
        if not waves:
            return {"mismatches": 2, "first_mismatches": ["x"], "first_mismatch_layer": 6,
                    "failed": 1, "violations": [], "layers": layers}  # fmt: skip
        return {"mismatches": 2, "waves": "/tmp/dump.vcd"}

    monkeypatch.setattr(dr, "long_run", fake)
    import fsedp.cli.rtl as rtl

    monkeypatch.setattr(rtl, "require_simulator", lambda sim: None)
    rc = main(["rtl", "datapath", "--no-ring", "--no-cells", "--mesh", "2x2:30", "--seed", "3",
               "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert calls == [(30, 3, False), (7, 3, True)]
    run = doc["runs"][0]
    assert run["waves"] == "/tmp/dump.vcd" and run["waves_layer"] == 6


def test_help_states_the_parsers_own_defaults_and_ranges():
    """``--help`` is generated from the declarations (``fsedp.cli.common.HelpFormatter``):
    every option of every subcommand with a default shows it, and a number a help text
    states as a default or a range is the one the parser holds.  No hand-written text
    restates the parser's default or the converter's range (a copy that can drift), nor
    names in words a default the parser does not hold."""
    import argparse
    import re

    from fsedp.cli import _parsers, build_parser
    from fsedp.cli.common import HelpFormatter, default_text

    checked, progs = 0, set()
    for parser in _parsers(build_parser()):
        prog = parser.prog
        progs.add(prog)
        assert parser.format_help(), prog  # every subcommand's help renders
        fmt = HelpFormatter(prog)
        for a in parser._actions:
            if a.help == argparse.SUPPRESS or isinstance(a, argparse._SubParsersAction):
                continue
            own = a.help or ""  # the hand-written text
            text = fmt.help_text(a) % {"default": a.default}
            where = f"{prog} {(a.option_strings or [a.dest])[0]}: {text!r}"
            concrete = a.default != "" and not any(
                a.default is x for x in (None, False, argparse.SUPPRESS)
            )
            if concrete and a.nargs != 0:
                assert "default" in text, where
                assert "default" not in own, f"restates the parser's default: {where}"
            for said in re.findall(r"default:? (-?[0-9][0-9.e+-]*)(?=[);,]|$)", text):
                assert concrete, where
                if isinstance(a.default, (int, float)):
                    assert float(said) == float(a.default), where
                else:
                    assert default_text(a.default).startswith(said), where
            for said in re.findall(r"default:? '?([\w-]+)", own):
                assert not (a.choices and said in a.choices), f"a default not held: {where}"
            rng = getattr(a.type, "range_text", None)
            if rng:
                assert rng not in own, f"restates the range: {where}"
            for lo, hi in re.findall(r"\((\S+)\.\.(\S+?)[;)]", text):
                assert rng == f"{lo}..{hi}" or rng == f"{lo}..{hi} or none", where
            checked += 1
    assert checked > 150
    commands = {f"fsedp {c}" for c in ("run", "sweep", "bench", "trace", "lm", "offload")}
    commands |= {f"fsedp rtl {c}" for c in ("rounds", "cosim", "coverage", "datapath")}
    assert commands <= progs, commands - progs


def test_help_formatter_refuses_copies():
    """The checks above catch a restated default or range: the formatter does not add a
    second one, so the copy would stand alone and could drift."""
    import argparse

    from fsedp.cli.common import HelpFormatter, Parser, int_at_least

    p = Parser(prog="x")
    p.add_argument("--n", type=int_at_least("--n", 1, 8), default=4, help="n (1..8; default 4)")
    p.add_argument("--m", type=int_at_least("--m", 1, 8), default=4)
    p.add_argument("--k", type=int_at_least("--k", 1, 8), help="k (default: the config's)")
    fmt = HelpFormatter("x")
    n, m, k = (a for a in p._actions if not isinstance(a, argparse._HelpAction))
    assert fmt.help_text(n) == "n (1..8; default 4)"  # nothing generated: the copy stays
    assert fmt.help_text(m) == "(1..8; default 4)"  # an option without text still shows them
    assert fmt.help_text(k) == "k (1..8; default: the config's)"
    assert "(1..8; default 4)" in p.format_help()
