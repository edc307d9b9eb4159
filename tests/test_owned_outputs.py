"""Nothing a user owns is lost: the write rule (only regular files are replaced;
devices, FIFOs, sockets and links named as outputs are refused before any work) and markers
that cannot be forged into a deletion, as a property: folders of user files, links and
sub-folders, with random and forged markers, given to report-folder writers with and without
``--force``.  Afterwards every byte the user had is still there, or the writer refused on one
line having changed nothing."""

import json
import os
import socket
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsedp.cli import main
from fsedp.errors import InputError
from fsedp.files import (
    OUTPUT_MARKER,
    atomic_path,
    check_output_file,
    check_output_folder,
    output_dir,
    output_folder,
    work_folder,
    write_text,
)

# -- the write rule: special files ------------------------------------------------------------


def _special(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"{kind}.out"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
        s.close()
    elif kind == "chardev":
        try:
            os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a copy of /dev/null
        except PermissionError:
            pytest.skip("mknod needs root here")
    return p


def _same_kind(p: Path, kind: str) -> bool:
    mode = os.lstat(p).st_mode
    return {"fifo": stat.S_ISFIFO, "socket": stat.S_ISSOCK, "chardev": stat.S_ISCHR}[kind](mode)


@pytest.mark.parametrize("kind", ["fifo", "socket", "chardev"])
def test_a_special_file_named_as_an_output_is_refused_and_kept(tmp_path, kind):
    p = _special(tmp_path, kind)
    for check in (check_output_file, check_output_folder, output_folder):
        with pytest.raises(InputError, match="fsedp writes its outputs only as regular files"):
            check(p)
    with pytest.raises(InputError, match="only as regular files"):
        write_text(p, "new")
    with pytest.raises(InputError, match="only as regular files"), atomic_path(p) as tmp:
        tmp.write_text("new")
    with pytest.raises(InputError, match="only as regular files"), output_dir(p) as staged:
        (staged / "x").write_text("new")
    assert _same_kind(p, kind)
    assert sorted(q.name for q in tmp_path.iterdir()) == [p.name]


def test_a_special_file_made_while_the_output_was_written_is_kept(tmp_path):
    p = tmp_path / "out.md"
    with pytest.raises(InputError, match="FIFO"), atomic_path(p) as tmp:
        tmp.write_text("new")
        os.mkfifo(p)
    assert stat.S_ISFIFO(os.lstat(p).st_mode)
    assert sorted(q.name for q in tmp_path.iterdir()) == ["out.md"]


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "figure9", "--layers", "1", "--tokens", "16", "--models", "qwen3-30b-a3b"]
        + ["--no-cache", "--out", "{p}"],
        ["run", "--layers", "1", "--strategies", "EP", "--trace-events", "{p}"],
        ["results", "{p}", "--check"],
    ],
    ids=["sweep-out", "trace-events", "results-page"],
)
@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_cli_refuses_a_special_file_on_one_line(tmp_path, monkeypatch, capsys, argv, kind):
    """The reproductions: ``--out null`` (a copy of /dev/null), a FIFO as
    ``--trace-events`` and as a results page: one line, exit 2, the file as it was, and no
    blocking."""
    monkeypatch.chdir(tmp_path)
    p = _special(tmp_path, kind)
    assert main([a.format(p=p.name) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fsedp: {p.name}: "), err
    assert _same_kind(p, kind)


# -- markers ----------------------------------------------------------------------------------


def test_a_marker_entry_without_a_stamp_is_the_users(tmp_path, monkeypatch, capsys):
    """A reproduction: a marker listing ``precious.txt`` with no stamp.  Refused
    without ``--force``; kept with it."""
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "precious.txt").write_text("P\n")
    (d / OUTPUT_MARKER).write_text(
        json.dumps({"tool": "fsedp", "files": ["precious.txt", OUTPUT_MARKER], "stamps": {}})
    )
    base = ["run", "--layers", "1", "--strategies", "EP", "--json", "--out", "d"]
    assert main(base) == 2
    assert "precious.txt" in capsys.readouterr().err
    assert main([*base, "--force"]) == 0
    capsys.readouterr()
    assert (d / "precious.txt").read_text() == "P\n"
    assert (d / "summary.json").is_file()
    # the report's marker does not adopt the user's file: still refused without --force
    assert main(base) == 2
    assert "precious.txt" in capsys.readouterr().err
    assert (d / "precious.txt").read_text() == "P\n"


def test_a_note_added_to_a_report_and_to_its_marker_stays(tmp_path):
    out = tmp_path / "r"
    with output_dir(out) as staged:
        (staged / "report.md").write_text("ours")
    (out / "notes.txt").write_text("mine")
    doc = json.loads((out / OUTPUT_MARKER).read_text())
    doc["files"].append("notes.txt")
    doc["stamps"]["notes.txt"] = ["file", 4, 0, "0" * 64]  # forged, wrong
    (out / OUTPUT_MARKER).write_text(json.dumps(doc))
    with pytest.raises(InputError, match="notes.txt"), output_dir(out) as staged:
        (staged / "report.md").write_text("new")
    with output_dir(out, force=True) as staged:
        (staged / "report.md").write_text("new")
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "report.md").read_text() == "new"


def test_a_users_namesake_refuses_a_forced_merge(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "report.md").write_text("the user's")
    with pytest.raises(InputError, match="in the way"), output_dir(out, True) as staged:
        (staged / "report.md").write_text("ours")
        (staged / "other.md").write_text("ours")
    assert (out / "report.md").read_text() == "the user's"
    assert sorted(p.name for p in out.iterdir()) == ["report.md"]


def test_a_marker_of_an_earlier_fsedp_is_not_trusted(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "report.md").write_text("x")
    st_ = (out / "report.md").stat()
    (out / OUTPUT_MARKER).write_text(
        json.dumps(
            {
                "tool": "fsedp",
                "files": ["report.md", OUTPUT_MARKER],
                "stamps": {"report.md": [st_.st_size, st_.st_mtime_ns]},
            }
        )
    )
    with pytest.raises(InputError, match="earlier fsedp"):
        check_output_folder(out)
    assert check_output_folder(out, force=True) == out


def test_a_marker_fsedp_cannot_have_written_is_kept_even_with_force(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / OUTPUT_MARKER).write_text("my own notes, not JSON")
    for force in (False, True):
        with pytest.raises(InputError, match="not a marker fsedp wrote"):
            check_output_folder(out, force)
    assert (out / OUTPUT_MARKER).read_text() == "my own notes, not JSON"


def test_stamps_of_folders_see_an_added_entry(tmp_path):
    """A folder of fsedp's is fsedp's while nothing was added to it or taken from it."""
    out = tmp_path / "r"
    with output_dir(out) as staged:
        (staged / "sub").mkdir()
        (staged / "sub" / "a.json").write_text("1")
    assert check_output_folder(out) == out
    (out / "sub" / "mine.txt").write_text("mine")
    with pytest.raises(InputError, match="sub"):
        check_output_folder(out)
    with output_dir(out, force=True) as staged:
        (staged / "sub").mkdir()
        (staged / "sub" / "a.json").write_text("2")
    assert (out / "sub" / "mine.txt").read_text() == "mine"
    assert (out / "sub" / "a.json").read_text() == "2"


# -- the property -----------------------------------------------------------------------------

_NAMES = ["report.md", "summary.json", "a.txt", "notes.txt", "sub", "sub/x.json", "deep/y.md"]


def _snapshot(folder: Path) -> dict:
    """Every entry under ``folder`` (links not followed) with what it holds."""
    if not os.path.lexists(folder):
        return {}
    snap = {}
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            p = Path(root) / name
            rel = p.relative_to(folder).as_posix()
            mode = os.lstat(p).st_mode
            if stat.S_ISLNK(mode):
                snap[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(mode):
                snap[rel] = ("dir",)
            else:
                snap[rel] = ("file", p.read_bytes())
    return snap


@st.composite
def _folders(draw):
    """A plan of a folder: an earlier report of fsedp's (or none), the user's entries
    beside or over it, and a marker: fsedp's own, or forged in one of many ways."""
    report = draw(st.sets(st.sampled_from(["report.md", "summary.json", "sub/x.json"])))
    user = draw(
        st.dictionaries(
            st.sampled_from(_NAMES + ["u/1.txt", "link", "sub/link", "empty"]),
            st.one_of(
                st.binary(max_size=40).map(lambda b: ("file", b)),
                st.sampled_from(["report.md", "../outside", "nowhere"]).map(lambda t: ("link", t)),
                st.just(("dir",)),
            ),
            max_size=5,
        )
    )
    marker = draw(
        st.sampled_from(
            ["real", "none", "garbage", "other-tool", "unstamped", "null", "random", "stale", "v1"]
        )
    )
    listed = draw(st.sets(st.sampled_from(_NAMES + ["link", "u/1.txt", "empty"]), max_size=5))
    writes = draw(st.sets(st.sampled_from(["report.md", "summary.json", "sub/x.json"]), min_size=1))
    how = draw(st.sampled_from(["output_dir", "work_folder", "fail"]))
    force = draw(st.booleans())
    return report, user, marker, listed, writes, how, force


def _build(folder: Path, plan) -> set[str]:
    """Make the folder of ``plan``; the entries that are fsedp's (an earlier report's files
    the user left alone)."""
    report, user, marker, listed, *_ = plan
    if report:
        with output_dir(folder) as staged:
            for name in report:
                (staged / name).parent.mkdir(parents=True, exist_ok=True)
                (staged / name).write_text(f"fsedp's {name}")
    folder.mkdir(exist_ok=True)
    for name, what in sorted(user.items()):
        p = folder / name
        if os.path.lexists(p) or any(os.path.lexists(q) and not q.is_dir() for q in p.parents):
            if not (p.is_file() and not p.is_symlink() and what[0] == "file"):
                continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if what[0] == "file":
            p.write_bytes(what[1] + b"\0user")  # never the bytes fsedp wrote
        elif what[0] == "link":
            p.symlink_to(what[1])
        else:
            p.mkdir()
    snap = _snapshot(folder)
    ours = {f"{n}" for n in report if snap.get(n) == ("file", f"fsedp's {n}".encode())}
    ours |= {d for n in ours for d in [Path(n).parent.as_posix()] if d != "."}
    # a folder of fsedp's that the user added to is the user's (its stamp moved)
    ours = {
        e
        for e in ours
        if snap[e][0] == "file" or all(k in ours for k in snap if k.startswith(e + "/"))
    }
    mpath = folder / OUTPUT_MARKER
    if marker == "real":
        return ours
    if marker == "none":
        if mpath.exists():
            mpath.unlink()
        return set()
    doc = {"tool": "fsedp", "version": 2, "files": sorted(listed | {OUTPUT_MARKER})}
    if marker == "garbage":
        mpath.write_bytes(b"\x00not json{")
        return set()
    if marker == "other-tool":
        doc["tool"] = "other"
    elif marker == "unstamped":
        doc["stamps"] = {}
    elif marker == "null":
        doc["stamps"] = dict.fromkeys(listed)
    elif marker == "random":
        doc["stamps"] = {n: ["file", 3, 12345, "ab" * 32] for n in listed}
    elif marker == "stale":  # stamps of other contents under these names
        doc["stamps"] = {
            n: ["file", 5, os.lstat(mpath.parent).st_mtime_ns, "00" * 32] for n in listed
        }
    elif marker == "v1":
        del doc["version"]
        doc["stamps"] = {
            n: [os.lstat(folder / n).st_size, os.lstat(folder / n).st_mtime_ns]
            for n in listed
            if os.path.lexists(folder / n)
        }
    mpath.write_text(json.dumps(doc))
    return set()


def _check(tmp_path: Path, plan):
    folder = tmp_path / "out"
    outside = tmp_path / "outside"
    outside.write_text("outside")
    ours = _build(folder, plan)
    *_, writes, how, force = plan
    before = _snapshot(folder)
    try:
        if how == "work_folder":
            with work_folder(folder, force) as w:
                for name in writes:
                    p = w / name
                    if any(
                        os.path.lexists(q) and (q == p or q.is_symlink() or not q.is_dir())
                        for q in [p, p.parent]
                    ):
                        continue  # a formal run writes only new files, into folders
                    p.parent.mkdir(parents=True, exist_ok=True)
                    (w / name).write_text("new")
        else:
            with output_dir(folder, force) as staged:
                for name in writes:
                    (staged / name).parent.mkdir(parents=True, exist_ok=True)
                    (staged / name).write_text("new")
                if how == "fail":
                    raise RuntimeError("the run failed")
        refused = False
    except (InputError, RuntimeError):
        refused = True
    after = _snapshot(folder)
    assert (tmp_path / "outside").read_text() == "outside"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "outside"], "staging left"
    if refused:
        assert after == before, "a refused writer changed the folder"
        return
    for entry, what in before.items():
        if entry == OUTPUT_MARKER or entry in ours:
            continue
        if what == ("dir",):
            assert after.get(entry) == ("dir",), f"the user's folder {entry} is gone"
        else:
            assert after.get(entry) == what, f"the user's {entry} changed: {after.get(entry)}"


@settings(
    max_examples=int(os.environ.get("FSEDP_OWNED_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(plan=_folders())
def test_no_users_byte_is_lost(tmp_path_factory, plan):
    _check(tmp_path_factory.mktemp("p"), plan)


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(plan=_folders())
def test_no_users_byte_is_lost_many(tmp_path_factory, plan):
    _check(tmp_path_factory.mktemp("p"), plan)


@settings(max_examples=6, deadline=None)
@given(plan=_folders())
def test_report_commands_keep_every_users_byte(tmp_path_factory, plan):
    """The property through a report-folder command, ``fsedp run --out DIR [--force]``."""
    tmp_path = tmp_path_factory.mktemp("cli")
    folder = tmp_path / "out"
    ours = _build(folder, plan)
    force = plan[-1]
    before = _snapshot(folder)
    argv = ["run", "--layers", "1", "--strategies", "EP", "--json", "--out", str(folder)]
    code = main(argv + (["--force"] if force else []))
    after = _snapshot(folder)
    assert code in (0, 2)
    if code == 2:
        assert after == before
        return
    for entry, what in before.items():
        if entry != OUTPUT_MARKER and entry not in ours:
            assert after.get(entry) == what, entry


# -- when the machine refuses -----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,made",
    [
        (["run", "--layers", "1", "--strategies", "EP", "--out", "r"], "r"),
        (["trace", "convert", "t.jsonl", "t.npz"], "t.npz"),
    ],
    ids=["report-folder", "single-file"],
)
def test_a_file_size_limit_is_one_line_exit_3_and_nothing_half_written(tmp_path, argv, made):
    """A disk that fills while a report is written, as ``ulimit -f`` makes it: one line
    naming what was written and what to do, exit 3, and nothing left in the folder."""
    import resource
    import subprocess
    import sys

    limit = 1500  # bytes: below summary.json and the trace events of one layer

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    (tmp_path / "keep.txt").write_text("precious")
    (tmp_path / "t.jsonl").write_text(
        "".join(
            json.dumps({"token": t, "layer": 0, "experts": [t % 7, (t % 7 + 1 + t % 5) % 7]}) + "\n"
            for t in range(400)
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "fsedp", *argv],
        cwd=tmp_path,
        preexec_fn=small_disk,
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert len(err) == 1 and "file-size limit" in err[0] and made in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "t.jsonl"]


# -- the read rule ----------------------------------------------------------------------------


def test_the_read_rule_takes_its_limit_and_refuses_one_byte_more(tmp_path, monkeypatch):
    from fsedp import files

    monkeypatch.setitem(files.LIMITS, "page", 10)
    p = tmp_path / "p.md"
    for size, ok in ((9, True), (10, True), (11, False)):
        p.write_bytes(b"x" * size)
        if ok:
            assert files.read_bytes(p, "page") == b"x" * size
            assert files.check_input_file(p, "page") == p
        else:
            for read in (files.read_bytes, files.check_input_file, files.read_text):
                with pytest.raises(InputError, match="11 bytes, larger than the 10 a page file"):
                    read(p, "page")


@pytest.mark.parametrize("kind", ["fifo", "socket", "chardev", "folder"])
def test_the_read_rule_refuses_what_is_not_a_regular_file_without_blocking(tmp_path, kind):
    from fsedp import files

    if kind == "folder":
        p = tmp_path / "d"
        p.mkdir()
    else:
        p = _special(tmp_path, kind)
    for read in (files.read_bytes, files.check_input_file, files.read_text, files.read_yaml):
        with pytest.raises(InputError, match="not a regular file"):
            read(p, "yaml") if read is not files.read_yaml else read(p)
