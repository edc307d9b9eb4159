"""The fsedp command line: bad input gets one line and exit status 2; Verilog lints clean."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fsedp.cli import main

ROOT = Path(__file__).resolve().parents[1]
BAD = sorted((ROOT / "configs" / "bad").glob("*.yaml"))


def fsedp(*args):
    return subprocess.run([sys.executable, "-m", "fsedp.cli", *args], capture_output=True,
                          text=True, cwd=ROOT)


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


@pytest.mark.parametrize("args", [
    ["rtl", "cosim", "--experts", "300"],
    ["rtl", "cosim", "--chiplets", "2"],
    ["rtl", "verilog"],                                    # --out missing
    ["rtl", "report", "--experts", "16,x"],
    ["bogus"],
    ["run", "--config", "/nonexistent/run.yaml"],
])
def test_bad_arguments_one_line_exit_2(args):
    proc = fsedp(*args)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_verilog_written_and_lint_clean(tmp_path, capsys):
    rc = main(["rtl", "verilog", "--out", str(tmp_path), "--experts", "12", "--chiplets", "5",
               "--lint", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc["lint"]
    assert len(doc["files"]) == 7 and all(v == "clean" for v in doc["lint"].values())
    assert "module fsedp_scheduler" in (tmp_path / "fsedp_scheduler.v").read_text()
