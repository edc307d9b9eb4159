"""Nothing in the sweep cache is trusted, and no Ray address hangs: a poisoned cache
entry is recomputed, rewritten valid and reported once; an unreachable Ray cluster is refused
on one line within the connection timeout."""

import json
import math
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from fsedp.cli import main
from fsedp.errors import InputError
from fsedp.sim import executor
from fsedp.sim.executor import (
    MAX_ENTRY_BYTES,
    RAY_CONNECT_TIMEOUT_S,
    BadEntry,
    PointCache,
    decode_entry,
    encode_entry,
    run_points,
)
from fsedp.sim.sweep import figure9, point_result_error

ROOT = Path(__file__).resolve().parents[1]
#: the smallest sweep: one model, one token count, one layer, one point (A5: its qos too)
SWEEP = dict(
    models=("deepseek-moe-16b",), tokens=(16,), layers=1, strategies=("EP", "A5"), progress=False
)


@pytest.fixture(autouse=True)
def _cli_logging():
    """The sweeps here report as ``fsedp`` does (:func:`fsedp.log.configure`, called by
    :func:`fsedp.cli.main`): a bad entry is a warning line ``fsedp: ...`` on stderr."""
    from fsedp.log import configure

    configure()


def strip(rows):
    """Sweep rows without wall times (the only field that differs between two runs)."""
    return [
        {
            k: ({kk: vv for kk, vv in v.items() if kk != "wall_s"} if isinstance(v, dict) else v)
            for k, v in row.items()
        }
        for row in rows
    ]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A clean run of the smallest sweep: its rows, its one cache entry (bytes) and its
    result."""
    folder = tmp_path_factory.mktemp("clean-cache")
    rows = figure9(**SWEEP, cache=PointCache(folder))
    (entry,) = folder.rglob("*.json")
    data = entry.read_bytes()
    return {"rows": strip(rows), "folder": folder, "entry": entry, "data": data}


def poisoned(clean, tmp_path):
    """A copy of the clean cache and the path of its one entry there."""
    folder = tmp_path / "cache"
    shutil.copytree(clean["folder"], folder)
    return folder, folder / clean["entry"].relative_to(clean["folder"])


def result_with(clean, change):
    """The clean entry's bytes after ``change(result)`` (NaN written as JSON's ``NaN``)."""
    result = json.loads(clean["data"])["result"]
    change(result)
    return json.dumps({"result": result}).encode()


def _set(path, value):
    def change(result):
        node = result
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value

    return change


def _drop(path):
    def change(result):
        node = result
        for k in path[:-1]:
            node = node[k]
        del node[path[-1]]

    return change


DEEP = b"[" * 100_000 + b"]" * 100_000
POISONS = {
    "result-a-string": lambda c: b'{"result": "x"}',
    "a-list": lambda c: b"[1, 2]",
    "result-empty": lambda c: b'{"result": {}}',
    "summary-a-string": lambda c: result_with(c, _set(["summary"], "fast")),
    "summary-holds-nan": lambda c: result_with(
        c, _set(["summary", "EP", "moe_layer_us"], float("nan"))
    ),
    "summary-holds-infinity": lambda c: c["data"].replace(b'"x_bound":', b'"x_bound":1e999,"x":'),
    "nested-100000-deep": lambda c: DEEP,
    "result-nested-100000-deep": lambda c: b'{"result":' + DEEP + b"}",
    "a-count-that-is-a-bool": lambda c: result_with(c, _set(["summary", "EP", "layers"], True)),
    "a-negative-count": lambda c: result_with(c, _set(["summary", "A5", "decisions"], -1)),
    "a-number-that-is-a-string": lambda c: result_with(
        c, _set(["summary", "A5", "utilization"], "0.5")
    ),
    "a-missing-field": lambda c: result_with(c, _drop(["summary", "A5", "breakdown"])),
    "a-missing-qos-field": lambda c: result_with(c, _drop(["summary", "A5", "qos", "slack_us"])),
    "a-missing-strategy": lambda c: result_with(c, _drop(["summary", "A5"])),
    "slots-missing": lambda c: result_with(c, _drop(["slots"])),
    "infeasible-not-a-triple": lambda c: b'{"result": {"infeasible": ["a", 1]}}',
    "an-extra-key": lambda c: c["data"][:-1] + b',"more":1}',
    "not-utf8": lambda c: b'{"result": "\xff"}',
    "truncated": lambda c: c["data"][: len(c["data"]) // 2],
    "empty": lambda c: b"",
    "over-the-size-cap": lambda c: c["data"] + b" " * MAX_ENTRY_BYTES,
}


def run_poisoned(clean, tmp_path, capsys, write):
    """Poison the entry with ``write(entry)``, run the sweep again; check that it gives the
    clean rows, leaves a valid entry and reports it on one line; return that line."""
    folder, entry = poisoned(clean, tmp_path)
    write(entry)
    capsys.readouterr()
    rows = figure9(**SWEEP, cache=PointCache(folder))
    err = capsys.readouterr().err.strip()
    assert strip(rows) == clean["rows"]
    assert not entry.is_symlink() and entry.is_file()
    rewritten = decode_entry(entry.read_bytes())
    assert no_wall(rewritten) == no_wall(decode_entry(clean["data"]))
    assert point_result_error(_point(clean), rewritten) is None
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"fsedp: {entry}: <cache>: unreadable entry (") and "recomputing" in err
    # rewritten valid: the next run reads it and says nothing
    again = figure9(**SWEEP, cache=PointCache(folder))
    assert strip(again) == clean["rows"] and capsys.readouterr().err == ""
    assert not list(folder.rglob("*.tmp"))
    return err


def no_wall(result):
    """A point's result without its wall times."""
    summary = {
        s: {k: v for k, v in m.items() if k != "wall_s"} for s, m in result["summary"].items()
    }
    return {**result, "summary": summary}


def _point(clean):
    """The sweep's one point, as the cache reader sees it (its strategies)."""
    return {"strategies": list(SWEEP["strategies"])}


@pytest.mark.parametrize("name", list(POISONS))
def test_poisoned_entry_is_recomputed_rewritten_and_reported_once(clean, tmp_path, capsys, name):
    poison = POISONS[name](clean)
    run_poisoned(clean, tmp_path, capsys, lambda entry: entry.write_bytes(poison))


def test_report_names_the_field(clean, tmp_path, capsys):
    poison = POISONS["summary-a-string"](clean)
    err = run_poisoned(clean, tmp_path, capsys, lambda entry: entry.write_bytes(poison))
    assert "summary: not an object" in err
    poison = POISONS["a-number-that-is-a-string"](clean)
    err = run_poisoned(clean, tmp_path / "2", capsys, lambda entry: entry.write_bytes(poison))
    assert "summary.A5.utilization: not a finite number" in err


def test_entry_that_is_a_link_is_replaced_never_written_through(clean, tmp_path, capsys):
    """An entry that is a symbolic link to a user's file: the link is replaced by a valid
    entry, the user's file is untouched."""
    mine = tmp_path / "my-notes.json"
    mine.write_text('{"result": "my own words"}')

    def write(entry):
        entry.unlink()
        entry.symlink_to(mine)

    err = run_poisoned(clean, tmp_path, capsys, write)
    assert "symbolic link" in err
    assert mine.read_text() == '{"result": "my own words"}'


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_entry_that_is_a_fifo_does_not_hang(clean, tmp_path, capsys):
    def write(entry):
        entry.unlink()
        os.mkfifo(entry)

    t0 = time.monotonic()
    err = run_poisoned(clean, tmp_path, capsys, write)
    assert "not a regular file" in err and time.monotonic() - t0 < 60


def test_entry_that_is_a_folder_is_reported_and_kept(clean, tmp_path, capsys):
    """A folder where an entry belongs is not replaced (it may hold someone's files): the
    sweep reports it, then stops on one line naming ``--cache``."""
    folder, entry = poisoned(clean, tmp_path)
    entry.unlink()
    entry.mkdir()
    (entry / "keep.txt").write_text("mine")
    capsys.readouterr()
    with pytest.raises(InputError, match="--cache: .*cannot write"):
        figure9(**SWEEP, cache=PointCache(folder))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unreadable entry (not a regular file)" in err[0], err
    assert (entry / "keep.txt").read_text() == "mine"
    assert not list(folder.rglob("*.tmp"))


# -- the entry format, without a simulation ----------------------------------------------------
def cheap(point, workers):
    return {"x": point["x"], "double": 2 * point["x"]}


def cheap_check(point, result):
    ok = isinstance(result, dict) and result.get("x") == point["x"]
    return None if ok and isinstance(result.get("double"), int) else "not the point's result"


def test_several_bad_entries_one_line(tmp_path, capsys):
    cache = PointCache(tmp_path / "cache")
    pts = [{"x": x} for x in range(5)]
    first = run_points(cheap, pts, workers=1, cache=cache, progress=False, check=cheap_check)
    for p, poison in zip(pts[1:4], (b"[1, 2]", b"NaN", b'{"result": {"x": 0}}')):
        cache.path(cache.key(p)).write_bytes(poison)
    capsys.readouterr()
    again = run_points(cheap, pts, workers=1, cache=cache, progress=False, check=cheap_check)
    err = capsys.readouterr().err.strip()
    assert again == first
    assert len(err.splitlines()) == 1 and "and 2 more bad entries" in err, err
    run_points(cheap, pts, workers=1, cache=cache, progress=False, check=cheap_check)
    assert capsys.readouterr().err == ""


def test_a_fresh_result_the_reader_would_refuse_is_a_bug_not_an_entry(tmp_path):
    """The writer shares the reader's description: a computed result that fails it is never
    cached (it would be recomputed forever)."""
    cache = PointCache(tmp_path / "cache")

    def wrong(point, workers):
        return {"x": point["x"], "double": "two"}

    with pytest.raises(RuntimeError, match="not a valid cache entry"):
        run_points(wrong, [{"x": 1}], workers=1, cache=cache, progress=False, check=cheap_check)
    with pytest.raises(RuntimeError, match="not a valid cache entry"):
        run_points(lambda p, w: {"x": math.inf}, [{"x": 1}], workers=1, progress=False)
    assert not list((tmp_path / "cache").rglob("*"))


@pytest.mark.parametrize(
    "data,reason",
    [
        (b'{"result": NaN}', "not JSON"),
        (b'{"result": -Infinity}', "not JSON"),
        (b'{"result": 1e400}', "not JSON"),
        (b'{"result": 1, "extra": 2}', "not an object"),
        (b"[" * 40 + b"]" * 40, "not an object"),
        (b'{"result":' + b"[" * 40 + b"]" * 40 + b"}", "nested deeper"),
        (DEEP, "nested deeper"),
        (b" " * (MAX_ENTRY_BYTES + 1), "larger than"),
    ],
)
def test_decode_entry_refuses(data, reason):
    with pytest.raises(BadEntry, match=reason):
        decode_entry(data)


def test_encode_entry_is_what_decode_entry_reads():
    result = {"a": [1, 2.5, None, "s", {"b": True}], "c": -0.0}
    assert decode_entry(encode_entry(result)) == result
    with pytest.raises(ValueError):
        encode_entry({"a": math.nan})


def test_point_result_error_accepts_infeasible_and_the_fresh_result(clean):
    result = json.loads(clean["data"])["result"]
    assert point_result_error(_point(clean), result) is None
    assert point_result_error(_point(clean), {"infeasible": ["f", "field", "why"]}) is None
    assert point_result_error({"strategies": ["EP"]}, result) is not None  # not its strategies
    assert point_result_error(_point(clean), {"slots": 10**400, "summary": "x"}) is not None


# -- Ray -----------------------------------------------------------------------------------------
def _children() -> list[int]:
    """The live child processes of this one (Linux)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def refused_in_one_line(capsys, args, limit):
    capsys.readouterr()
    threads = set(threading.enumerate())
    t0 = time.monotonic()
    assert main(args) == 2
    took = time.monotonic() - t0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--address" in err and "Traceback" not in err, err
    assert took < limit, (took, err)
    assert not [t for t in set(threading.enumerate()) - threads if t.is_alive()]
    return err


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1"])
def test_unreachable_ray_address_refused_in_one_line(tmp_path, capsys, address):
    pytest.importorskip("ray", reason="ray is an optional extra: pip install 'fsedp[ray]'")
    sweep = ["sweep", "figure9", "--layers", "1", "--models", "deepseek-moe-16b"]
    sweep += ["--tokens", "16", "--no-cache", "--engine", "ray", "--address", address]
    err = refused_in_one_line(capsys, sweep, RAY_CONNECT_TIMEOUT_S)
    assert address in err and "refused" in err.lower()
    run = ["run", "--config", str(ROOT / "configs/experiments/fig9.yaml"), "--no-cache"]
    run += ["--engine", "ray", "--address", address]
    assert address in refused_in_one_line(capsys, run, RAY_CONNECT_TIMEOUT_S)


@pytest.mark.parametrize("address", ["nonsense", "127.0.0.1", "ray://", "host:99999", "a b:1"])
def test_malformed_ray_address_refused_in_one_line(capsys, address):
    pytest.importorskip("ray", reason="ray is an optional extra: pip install 'fsedp[ray]'")
    args = ["sweep", "figure9", "--layers", "1", "--models", "deepseek-moe-16b", "--tokens"]
    args += ["16", "--no-cache", "--engine", "ray", "--address", address]
    assert "must be HOST:PORT" in refused_in_one_line(capsys, args, 5)


def test_silent_ray_address_given_up_after_the_timeout(capsys, monkeypatch):
    """A port that accepts connections and never answers: refused once the (here shortened)
    timeout is up, and the child process that tried is gone."""
    pytest.importorskip("ray", reason="ray is an optional extra: pip install 'fsedp[ray]'")
    monkeypatch.setattr(executor, "RAY_CONNECT_TIMEOUT_S", 4)
    with socket.create_server(("0.0.0.0", 0)) as server:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        args = ["sweep", "figure9", "--layers", "1", "--models", "deepseek-moe-16b"]
        args += ["--tokens", "16", "--no-cache", "--engine", "ray", "--address", address]
        err = refused_in_one_line(capsys, args, 4 + 5)
    assert "within 4 s" in err or "cannot reach" in err, err
    if Path("/proc/self/stat").exists():
        assert _children() == []


def test_ray_not_installed_one_line(capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    args = ["sweep", "figure9", "--layers", "1", "--models", "deepseek-moe-16b", "--tokens"]
    args += ["16", "--no-cache", "--engine", "ray"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fsedp[ray]" in err and "--engine" in err, err
