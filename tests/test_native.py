"""The native regression harness (``tb/native.py``, ``tb/native_scheduler.cpp``): the C++
driver on the Verilated scheduler, the golden model checking its transfers as they stream."""

import json

import pytest

from fsedp.params import SchedulerParams
from fsedp.tb.native import native_missing, run_native

pytestmark = pytest.mark.skipif(native_missing() is not None, reason=str(native_missing()))

P = SchedulerParams(experts=16, chiplets=4)
KNOBS = {"rounds": 120, "seed": 3, "stall": 0.3, "reset_every": 15, "bad_records": 0.02}


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("native")


@pytest.fixture
def in_build(build_root, tmp_path, monkeypatch):
    """A working folder whose ``build/cosim`` (where the CLI builds) is ``build_root``, so
    the CLI tests reuse the models the other tests built."""
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "cosim").symlink_to(build_root)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_native_regression_checks_every_beat(build_root, tmp_path):
    report = tmp_path / "report.json"
    run = run_native(P, KNOBS, build_root, opt="-O0", report=report)
    assert run.complete and run.stopped is None
    assert run.mismatches == 0, run.first_mismatches
    assert run.rounds + run.resets == KNOBS["rounds"]
    assert run.resets > 0  # resets mid-round were exercised
    # every non-empty round dispatches, so there are more beats than rounds
    assert run.beats > run.rounds
    assert run.latency_done_to_dispatch and min(run.latency_done_to_dispatch) >= 1
    doc = json.loads(report.read_text())
    assert doc["rounds"] == run.rounds and doc["mismatches"] == 0 and doc["complete"]


def test_native_with_completion_model(build_root):
    """The per-token completion model (``per_token``) decodes count and trajectory from the
    beat in C++; the golden model still agrees beat for beat."""
    run = run_native(P, {**KNOBS, "per_token": 3, "max_delay": 2, "rounds": 60}, build_root, "-O0")
    assert run.complete and run.mismatches == 0 and run.rounds + run.resets == 60


def test_native_mismatch_stops_and_records_the_round(build_root, monkeypatch):
    """A golden model that disagrees (its entry chiplet is the highest free one, not the
    lowest) is caught: the run stops after the first bad round and replays the same stimulus
    and seed up to that round with a VCD of it."""
    import fsedp.sw.scheduler as sched

    def highest_free(traj, icv):
        free = traj & icv
        return free.bit_length() - 1

    monkeypatch.setattr(sched, "entry_chiplet", highest_free)
    run = run_native(P, KNOBS, build_root, opt="-O0")
    assert run.mismatches > 0 and not run.complete
    assert run.stopped == f"mismatch in round {run.first_mismatch_round}"
    assert run.rounds + run.resets < KNOBS["rounds"]
    assert run.waves and run.waves.endswith(".vcd")
    with open(run.waves) as f:
        head = f.read(4000)
    assert "$var" in head and "dispatch" in head


def test_native_interrupted_run_reports_what_it_checked(build_root, tmp_path):
    report = tmp_path / "partial.json"
    calls = []

    def progress(run):
        calls.append(run.rounds)
        if run.rounds >= 50 and not run.stopped:  # Ctrl-C a while into the run
            raise KeyboardInterrupt

    run = run_native(
        P, {**KNOBS, "rounds": 3000}, build_root, "-O0", report=report, progress=progress,
        progress_s=0.0,
    )  # fmt: skip
    assert run.stopped == "interrupted" and not run.complete
    assert 50 <= run.rounds < 3000 and run.mismatches == 0
    doc = json.loads(report.read_text())
    assert doc["stopped"] == "interrupted" and doc["rounds"] == run.rounds


def test_cli_cosim_native(in_build, tmp_path, capsys):
    from fsedp.cli import main

    report = tmp_path / "r.json"
    args = ["rtl", "cosim", "--driver", "native", "--experts", "16", "--chiplets", "4"]
    code = main(args + ["--rounds", "40", "--build-opt", "-O0", "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "native driver" in out and "mismatches: 0" in out
    assert json.loads(report.read_text())["rounds_total"] == 40
    assert main(args + ["--sim", "icarus"]) == 2
    assert main(args + ["--report", "/proc/no/such/r.json"]) == 2
    assert main(args + ["--report", str(tmp_path)]) == 2  # a folder
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "--driver" in err[0] and "Verilator only" in err[0]
    assert all("--report" in line for line in err[1:])


# -- functional coverage (tb/coverage.py, fsedp rtl coverage) -------------------------------
ODD9 = SchedulerParams(experts=12, chiplets=9)


def test_coverage_closes_with_steering(build_root):
    """At 12 experts / 9 chiplets every bin is reachable but the ICV's one-cycle
    alloc+release; the base stimulus alone misses some, the steered batches hit them all."""
    from fsedp.tb.coverage import close_coverage

    one, _, _ = close_coverage(ODD9, build_root, rounds=300, batches=1, opt="-O0")
    assert one.missed(), "the base stimulus alone should not close coverage"
    cov, history, mismatches = close_coverage(ODD9, build_root, rounds=300, batches=8, opt="-O0")
    assert mismatches == 0
    assert cov.missed() == []
    rep = cov.report()
    assert list(rep["icv"]["unreachable"]) == ["allocation and release in one cycle"]
    assert "padding lanes" in rep["sorter"]["hit"] and "bad record flag" in rep["eit"]["hit"]
    assert len(rep["fsm"]["hit"]) == len(cov.states) >= 12  # a reset in every FSM state
    assert rep["matcher"]["hit"]["9 completions in one beat"] > 0
    assert history[0]["profile"] == "base" and len({h["profile"] for h in history}) > 2
    for block in rep.values():  # nothing declared unreachable was hit
        assert not set(block["hit"]) & set(block["unreachable"])


def test_coverage_unreachable_bins_follow_the_parameters():
    from fsedp.tb.coverage import Coverage

    states = ("IDLE",)
    pow2 = Coverage(SchedulerParams(experts=16, chiplets=4), states).unreachable()
    assert "eit: bad record flag" in pow2 and "sorter: padding lanes" in pow2
    odd = Coverage(ODD9, states).unreachable()
    assert "eit: bad record flag" not in odd and "sorter: padding lanes" not in odd
    never = Coverage(SchedulerParams(experts=16, chiplets=4, theta_min=0), states).unreachable()
    assert "token_buffer: deferral" in never


def test_cli_coverage(in_build, capsys):
    from fsedp.cli import main

    args = ["rtl", "coverage", "--experts", "12", "--chiplets", "9", "--rounds", "300"]
    code = main(args + ["--build-opt", "-O0", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["missed"] == [] and doc["mismatches"] == 0
    assert doc["blocks"]["fsm"]["missed"] == []
    assert main(["rtl", "coverage", "--batches", "0"]) == 2
