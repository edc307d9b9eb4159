"""Exact expectations of replacing a report folder (``fsedp.files``) on trees laid out by
hand: which entries are removed, in which order (a folder's entries before the folder),
through what (a link is unlinked, never followed), what is put back, and what is kept."""

import errno
import json
import logging
import os
from pathlib import Path

import pytest

from fsedp.errors import EnvironmentFailure, InputError
from fsedp.files import (
    LIMITS,
    MAX_YAML_DEPTH,
    OUTPUT_MARKER,
    _entries,
    _foreign,
    _merge,
    _put_back,
    _remove_empty,
    _remove_ours,
    build_dir,
    check_input_file,
    check_output_file,
    environment_failure,
    kind_of,
    open_input,
    output_dir,
    output_folder,
    parse_yaml,
    read_bytes,
    read_text,
    read_yaml,
    write_failure,
    write_text,
)


def tree(root, spec: dict):
    """Make ``spec`` under ``root``: a str is a file's text, a dict a folder."""
    root.mkdir(parents=True, exist_ok=True)
    for name, v in spec.items():
        if isinstance(v, dict):
            tree(root / name, v)
        else:
            (root / name).write_text(v)


def listing(root) -> list:
    return sorted(_entries(root)) if root.exists() else None


def test_entries_list_folders_before_what_they_hold(tmp_path):
    tree(tmp_path, {"b": "1", "a": {"z": "2", "y": {"x": "3"}}, "c": {}})
    assert list(_entries(tmp_path)) == ["a", "c", "b", "a/y", "a/z", "a/y/x"]


def test_removing_ours_goes_deepest_first_and_keeps_the_rest(tmp_path):
    """Ours: a, a/x, b and d, d/e (d holds only ours: it goes; a holds the user's y: it
    stays); c is the user's; "gone" is listed but not there."""
    f = tmp_path / "report"
    tree(f, {"a": {"x": "ours", "y": "user"}, "b": "ours", "c": "user", "d": {"e": "ours"}})
    _remove_ours(f, {"a", "a/x", "b", "d", "d/e", "gone"})
    assert listing(f) == ["a", "a/y", "c"]
    _remove_ours(f, {"a", "a/y", "c"})  # the rest: the folder itself goes too
    assert not f.exists()


def test_removing_ours_unlinks_a_link_never_what_it_points_to(tmp_path):
    outside = tmp_path / "outside"
    tree(outside, {"keep": "user"})
    f = tmp_path / "report"
    tree(f, {"r": "ours"})
    os.symlink(outside, f / "lnk")
    os.symlink(outside / "keep", f / "flnk")
    _remove_ours(f, {"r", "lnk", "flnk", "lnk/keep"})
    assert not f.exists()
    assert listing(outside) == ["keep"] and (outside / "keep").read_text() == "user"


def test_removing_ours_from_a_link_to_a_folder_touches_nothing(tmp_path):
    real = tmp_path / "real"
    tree(real, {"x": "1"})
    os.symlink(real, tmp_path / "report")
    _remove_ours(tmp_path / "report", {"x"})
    assert listing(real) == ["x"] and os.path.islink(tmp_path / "report")


def test_removing_empty_folders_deepest_first(tmp_path):
    f = tmp_path / "old"
    tree(f, {"a": {"b": {"c": {}}}, "d": {}})
    os.symlink(tmp_path / "elsewhere", f / "dangling")
    (tmp_path / "empty_target").mkdir()
    os.symlink(tmp_path / "empty_target", f / "dlink")
    _remove_empty(f)
    assert listing(f) == ["dangling", "dlink"]  # links stay, their folder with them
    assert (tmp_path / "empty_target").is_dir()
    os.unlink(f / "dangling")
    os.unlink(f / "dlink")
    _remove_empty(f)
    assert not f.exists()


def test_putting_back_what_was_made_during_the_run(tmp_path, caplog):
    """The old folder holds, after our entries went, what a user made while the report was
    written: a file, a folder with a file, and a file whose name the new report took.  The
    first two move into the new report; the third stays in the old folder, which is kept
    and named in a warning."""
    old, new = tmp_path / ".r.old" / "report", tmp_path / "r"
    tree(old, {"note": "user", "d": {"f": "user"}, "table.md": "user's"})
    tree(new, {"table.md": "report", OUTPUT_MARKER: "{}"})
    with caplog.at_level(logging.WARNING, logger="fsedp.files"):
        _put_back(old, new)
    assert listing(new) == sorted([OUTPUT_MARKER, "d", "d/f", "note", "table.md"])
    assert (new / "table.md").read_text() == "report" and (new / "d" / "f").read_text() == "user"
    assert listing(old) == ["table.md"] and (old / "table.md").read_text() == "user's"
    assert [r.getMessage() for r in caplog.records] == [
        f"kept {old}: it holds files fsedp did not write, made while the report was written, "
        f"whose names the new report of {new} took"
    ]


def test_putting_back_everything_removes_the_old_folder(tmp_path, caplog):
    old, new = tmp_path / "old", tmp_path / "new"
    tree(old, {"x": "1", "e": {}})
    new.mkdir()
    with caplog.at_level(logging.WARNING, logger="fsedp.files"):
        _put_back(old, new)
    assert not old.exists() and listing(new) == ["e", "x"] and caplog.records == []


def test_putting_back_goes_on_past_an_entry_that_cannot_move(tmp_path, caplog, monkeypatch):
    """a.md (whose name the new report took) comes first; b, after it, still moves.  Then
    c, whose rename the system refuses, stays without stopping the rest; the kept old
    folder is named by the fsedp.files logger."""
    old, new = tmp_path / "old", tmp_path / "r"
    tree(old, {"a.md": "user's", "b": "user", "c": "user", "d": "user"})
    tree(new, {"a.md": "report"})
    rename = os.rename

    def refuse_c(src, dst):
        if Path(src).name == "c":
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", refuse_c)
    with caplog.at_level(logging.WARNING, logger="fsedp.files"):
        _put_back(old, new)
    assert listing(new) == ["a.md", "b", "d"] and listing(old) == ["a.md", "c"]
    assert [r.name for r in caplog.records] == ["fsedp.files"]


def test_removing_empty_folders_goes_on_past_one_that_is_not(tmp_path):
    """x/ holds a file, y/ is empty: x cannot be removed, y still is; the folder stays."""
    f = tmp_path / "f"
    tree(f, {"x": {"k": "1"}, "y": {}})
    _remove_empty(f)
    assert listing(f) == ["x", "x/k"]


def test_removing_ours_from_a_folder_that_cannot_be_walked(tmp_path, monkeypatch):
    """When the folder cannot be listed, nothing in it is ours to remove: no error, and the
    folder, not empty, stays."""
    import fsedp.files as files

    f = tmp_path / "f"
    tree(f, {"a": "x"})

    def unreadable(folder):
        raise OSError(errno.EACCES, "Permission denied", str(folder))

    monkeypatch.setattr(files, "_entries", unreadable)
    _remove_ours(f, {"a"})
    assert (f / "a").read_text() == "x"


def test_what_is_not_ours_in_a_folder_by_hand(tmp_path, monkeypatch):
    """A marker fsedp did not write, one of an earlier format, and our own marker with more
    entries than are looked at (limited to 3 here: the fourth is not looked at)."""
    import fsedp.files as files

    f = tmp_path / "f"
    tree(f, {OUTPUT_MARKER: "not json", "u.txt": "user"})
    assert _foreign(f) == [f"{OUTPUT_MARKER} (not a marker fsedp wrote)", "u.txt"]
    old = {"tool": "fsedp", "version": 1, "files": ["u.txt"], "stamps": {}}
    (f / OUTPUT_MARKER).write_text(json.dumps(old))
    assert _foreign(f) == [f"{OUTPUT_MARKER} (an earlier fsedp's, without content stamps)", "u.txt"]
    g = tmp_path / "g"
    with output_dir(g) as d:
        tree(d, {"a": "1", "b": "2"})
    assert _foreign(g) == []  # the marker, a and b: 3 entries, all ours
    monkeypatch.setattr(files, "_MAX_ENTRIES", 3)
    assert _foreign(g) == []
    monkeypatch.setattr(files, "_MAX_ENTRIES", 2)
    assert _foreign(g) == ["more than 2 entries"]


def marker(folder) -> dict:
    return json.loads((folder / OUTPUT_MARKER).read_text())


def test_forcing_a_report_into_a_folder_the_user_added_to(tmp_path):
    """Our report of t.md and plots/a.png, to which the user added u.txt and keep/: with
    --force the new report (t.md, s.json) is merged in: t.md replaced, s.json added, and
    every other entry stays -- our old plots/a.png too (a merge removes nothing); the
    marker lists ours, old and new, never the user's."""
    path = tmp_path / "r"
    with output_dir(path) as d:
        tree(d, {"t.md": "old", "plots": {"a.png": "old"}})
    tree(path, {"u.txt": "user", "keep": {"k": "user"}})
    with output_dir(path, force=True) as d:
        tree(d, {"t.md": "new", "s.json": "{}"})
    assert listing(path) == sorted(
        [OUTPUT_MARKER, "keep", "keep/k", "plots", "plots/a.png", "s.json", "t.md", "u.txt"]
    )
    assert (path / "t.md").read_text() == "new"
    assert marker(path)["files"] == sorted(
        [OUTPUT_MARKER, "plots", "plots/a.png", "s.json", "t.md"]
    )
    assert sorted(os.listdir(tmp_path)) == ["r"]


def test_replacing_a_report_of_ours_alone(tmp_path):
    """Nothing but our earlier report there: it is replaced whole (its extra entries gone),
    the marker lists the new entries, no folder is left beside it."""
    path = tmp_path / "r"
    with output_dir(path) as d:
        tree(d, {"t.md": "old", "plots": {"a.png": "old"}})
    assert marker(path)["files"] == sorted([OUTPUT_MARKER, "plots", "plots/a.png", "t.md"])
    with output_dir(path) as d:
        tree(d, {"t.md": "new"})
    assert listing(path) == [OUTPUT_MARKER, "t.md"] and (path / "t.md").read_text() == "new"
    assert marker(path)["files"] == [OUTPUT_MARKER, "t.md"]
    assert sorted(os.listdir(tmp_path)) == ["r"]


def test_merging_into_a_users_folder(tmp_path):
    """--force into a folder with the user's u.txt and our earlier t.md (listed, stamps
    matching): t.md is replaced, plots/ made, u.txt kept; the marker lists ours only."""
    path = tmp_path / "r"
    with output_dir(path) as d:
        tree(d, {"t.md": "old"})
    (path / "u.txt").write_text("user")
    staged = tmp_path / "staged"
    tree(staged, {"t.md": "new", "plots": {"p.png": "new"}, OUTPUT_MARKER: "{}"})
    _merge(staged, path)
    assert listing(path) == sorted([OUTPUT_MARKER, "plots", "plots/p.png", "t.md", "u.txt"])
    assert (path / "t.md").read_text() == "new" and (path / "u.txt").read_text() == "user"
    assert marker(path)["files"] == sorted([OUTPUT_MARKER, "plots", "plots/p.png", "t.md"])


def test_a_merge_refused_by_a_users_namesake_moves_nothing(tmp_path):
    path = tmp_path / "r"
    tree(path, {"t.md": "user", "a.md": "user"})
    staged = tmp_path / "staged"
    tree(staged, {"a.md": "new", "b.md": "new", "t.md": "new"})
    with pytest.raises(InputError) as e:
        _merge(staged, path)
    assert (e.value.file, e.value.field, e.value.reason) == (
        str(path / "a.md"),  # the first namesake in the listing
        "<file>",
        "is the user's and in the way of the report's own entry of that name "
        "(--force writes beside a user's files, never over them)",
    )
    assert listing(path) == ["a.md", "t.md"] and (path / "a.md").read_text() == "user"
    assert listing(staged) == ["a.md", "b.md", "t.md"]


def test_a_merge_goes_into_a_users_folder_of_the_reports_folder_name(tmp_path):
    """The user's own folder plots/ (with p0.png) where the report has a folder plots/: the
    report's entries go into it, the user's stay; no namesake refuses it."""
    path = tmp_path / "r"
    tree(path, {"plots": {"p0.png": "user"}})
    staged = tmp_path / "staged"
    tree(staged, {"plots": {"p1.png": "new"}})
    _merge(staged, path)
    assert listing(path) == [OUTPUT_MARKER, "plots", "plots/p0.png", "plots/p1.png"]
    assert marker(path)["files"] == [OUTPUT_MARKER, "plots/p1.png"]


def test_a_merge_refused_by_a_users_folder_or_link_where_the_report_has_another(tmp_path):
    """The report's file a.md where the user has a folder a.md/, and the report's folder
    plots/ where the user has a link plots -> a folder: each refused, nothing moved."""
    path = tmp_path / "r"
    tree(path, {"a.md": {"k": "user"}})
    staged = tmp_path / "staged"
    tree(staged, {"a.md": "new"})
    with pytest.raises(InputError) as e:
        _merge(staged, path)
    assert e.value.file == str(path / "a.md") and listing(path) == ["a.md", "a.md/k"]
    path2 = tmp_path / "r2"
    tree(path2, {"elsewhere": {}})
    os.symlink(path2 / "elsewhere", path2 / "plots")
    staged2 = tmp_path / "staged2"
    tree(staged2, {"plots": {"p.png": "new"}})
    with pytest.raises(InputError) as e:
        _merge(staged2, path2)
    assert e.value.file == str(path2 / "plots")
    assert os.listdir(path2 / "elsewhere") == []


# ----------------------------------------------------------------------------- the read rule


def test_kinds_of_entries(tmp_path):
    import stat

    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    (tmp_path / "f").write_text("x")
    assert kind_of(os.lstat(tmp_path / "f").st_mode) == "a regular file"
    assert kind_of(os.lstat(tmp_path).st_mode) == "a folder"
    assert kind_of(os.lstat(tmp_path / "fifo").st_mode) == "a FIFO (named pipe)"
    assert kind_of(os.lstat(tmp_path / "link").st_mode) == "a symbolic link"
    assert kind_of(os.lstat("/dev/null").st_mode) == "a character device"
    assert kind_of(stat.S_IFBLK) == "a block device" and kind_of(stat.S_IFSOCK) == "a socket"
    assert kind_of(0) == "of an unknown kind"


def refusal(fn, *args, **kw) -> tuple:
    with pytest.raises(InputError) as e:
        fn(*args, **kw)
    return e.value.file, e.value.field, e.value.reason


@pytest.mark.parametrize("size, ok", [(9, True), (10, True), (11, False)])
def test_the_read_limit_at_its_value(tmp_path, monkeypatch, size, ok):
    """A kind limited to 10 bytes: 9 and 10 are read, 11 refused naming size and limit."""
    monkeypatch.setitem(LIMITS, "yaml", 10)
    f = tmp_path / "c.yaml"
    f.write_bytes(b"a" * size)
    if ok:
        assert read_bytes(f, "yaml", "cfg") == b"a" * size
        assert check_input_file(f, "yaml") == f
        with open_input(f, "yaml") as h:
            assert h.read() == b"a" * size
    else:
        msg = "11 bytes, larger than the 10 a yaml file may hold here"
        assert refusal(read_bytes, f, "yaml", "cfg") == (str(f), "cfg", msg)
        assert refusal(check_input_file, f, "yaml") == (str(f), "<file>", msg)


def test_what_the_read_rule_refuses(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    assert refusal(read_bytes, tmp_path / "fifo", "page", "--doc") == (
        str(tmp_path / "fifo"), "--doc", "is a FIFO (named pipe), not a regular file",
    )  # fmt: skip
    assert refusal(read_bytes, tmp_path, "page")[2] == "is a folder, not a regular file"
    assert refusal(read_bytes, tmp_path / "none", "page")[1:] == ("<file>", "no such file")
    assert refusal(read_bytes, "", "page") == ("''", "<file>", "not a usable path")
    assert refusal(read_bytes, "  ", "page") == ("'  '", "<file>", "not a usable path")
    assert refusal(read_bytes, "a\0b", "page") == ("'a\\x00b'", "<file>", "not a usable path")
    assert refusal(read_bytes, "/dev/null", "page")[2] == (
        "is a character device, not a regular file"
    )


def test_the_read_rules_refusals_name_file_and_field_exactly(tmp_path):
    """Each refusal of open_input and of the readers built on it: the file, the field (its
    default "<file>" or the one given) and the reason, as a user reads them."""
    import socket

    none = tmp_path / "none"
    for fn, args in [
        (open_input, ("page",)),
        (check_input_file, ("page",)),
        (read_bytes, ("page",)),
        (read_text, ()),
        (read_yaml, ()),
    ]:
        assert refusal(fn, none, *args) == (str(none), "<file>", "no such file"), fn
    assert refusal(check_input_file, none, "page", "--x") == (str(none), "--x", "no such file")
    assert refusal(read_text, none, field="--doc") == (str(none), "--doc", "no such file")
    assert refusal(read_yaml, none, "--config") == (str(none), "--config", "no such file")
    # a socket cannot be opened (ENXIO): named by its kind
    sock = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as so:
        so.bind(str(sock))
        assert refusal(open_input, sock, "page", "--s") == (
            str(sock), "--s", "is a socket, not a regular file",
        )  # fmt: skip
    # a loop of links cannot be opened nor looked at: the system's reason
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    assert refusal(open_input, tmp_path / "a", "page", "--l") == (
        str(tmp_path / "a"), "--l", "cannot read: Too many levels of symbolic links",
    )  # fmt: skip


def test_text_is_opened_as_utf8_whatever_the_locale(tmp_path):
    f = tmp_path / "p.md"
    f.write_text("x")
    with open_input(f, "page", text=True) as h:
        assert h.encoding == "utf-8"


class _Endless:
    """A file that grows as it is read: every read of ``n`` bytes returns ``n``."""

    def __init__(self, fail=None):
        self.asked, self.fail = [], fail

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read(self, n=-1):
        if self.fail:
            raise self.fail
        self.asked.append(n)
        return b"a" * n


def test_a_file_that_grows_while_read_is_read_to_one_byte_over_its_limit(tmp_path, monkeypatch):
    import fsedp.files as files

    grow = _Endless()
    monkeypatch.setitem(LIMITS, "yaml", 10)
    monkeypatch.setattr(files, "open_input", lambda *a: grow)
    assert refusal(read_bytes, tmp_path / "g.yaml", "yaml", "cfg") == (
        str(tmp_path / "g.yaml"), "cfg", "larger than the 10 bytes a yaml file may hold here",
    )  # fmt: skip
    assert grow.asked == [11]


@pytest.mark.parametrize(
    "err, reason",
    [
        (OSError(errno.EIO, "Input/output error"), "cannot read: Input/output error"),
        (OSError("odd"), "cannot read: odd"),
    ],
)
def test_a_read_that_fails_names_the_systems_reason(tmp_path, monkeypatch, err, reason):
    import fsedp.files as files

    monkeypatch.setattr(files, "open_input", lambda *a: _Endless(fail=err))
    assert refusal(read_bytes, tmp_path / "g", "page", "--doc") == (
        str(tmp_path / "g"), "--doc", reason,
    )  # fmt: skip


def test_a_yaml_error_names_the_yaml_file(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("a: [1\n")
    assert refusal(read_yaml, y)[:2] == (str(y), "<yaml>")


def test_a_write_or_a_folder_the_system_refuses_is_named(tmp_path, monkeypatch):
    import pathlib

    def refuse(*a, **kw):
        raise OSError(errno.EROFS, "Read-only file system")

    with monkeypatch.context() as m:
        m.setattr(pathlib.Path, "write_text", refuse)
        assert refusal(write_text, tmp_path / "o.md", "x") == (
            str(tmp_path / "o.md"), "<file>", "cannot write: Read-only file system",
        )  # fmt: skip
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(pathlib.Path, "mkdir", refuse)
    assert refusal(output_folder, tmp_path / "w") == (
        str(tmp_path / "w"), "<file>", "cannot make the folder: Read-only file system",
    )  # fmt: skip


def test_text_under_the_read_rule(tmp_path):
    f = tmp_path / "p.md"
    f.write_bytes("é\n".encode())
    assert read_text(f) == "é\n"
    with open_input(f, "page", text=True) as h:
        assert h.read() == "é\n"
    f.write_bytes(b"ab\xff")
    assert refusal(read_text, f, "page", "--doc") == (
        str(f), "--doc", "not UTF-8 text (invalid start byte at byte 2)",
    )  # fmt: skip
    y = tmp_path / "c.yaml"
    y.write_bytes(b"a: 1\n")
    assert read_yaml(y) == {"a": 1}
    y.write_bytes(b"a: \xff\n")
    assert refusal(read_yaml, y, "--config") == (str(y), "--config", "not UTF-8 text (byte 3)")


# ----------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    "err, reason",
    [
        (errno.ENOSPC, "the disk is full"),
        (errno.EDQUOT, "the disk quota is used up"),
        (errno.EFBIG, "the file-size limit (ulimit -f) is reached"),
        (errno.ENOMEM, "out of memory"),
        (errno.EIO, "an input/output error"),
    ],
)
def test_the_machines_refusals(err, reason):
    todo = "free space or raise the limit and run again; nothing half-written was left"
    e = environment_failure(OSError(err, "x", "/o/f.md"))
    assert (e.what, e.reason, e.todo) == ("writing /o/f.md", reason, todo)
    assert environment_failure(OSError(err, "x")).what == "writing a file"
    assert environment_failure(OSError(err, "x", "f"), "reading t").what == "reading t"
    w = write_failure("/o/r", OSError(err, "x"))
    assert isinstance(w, EnvironmentFailure) and w.what == "writing /o/r"


def test_a_write_refused_by_the_place_is_the_users():
    assert environment_failure(OSError(errno.EACCES, "Permission denied")) is None
    w = write_failure("/o/r", OSError(errno.EACCES, "Permission denied"))
    assert isinstance(w, InputError)
    assert (w.file, w.field, w.reason) == ("/o/r", "<file>", "cannot write: Permission denied")
    w = write_failure("/o/r", OSError("odd"))
    assert w.reason == "cannot write: odd"


def test_writing_text_and_folders(tmp_path):
    f = tmp_path / "a" / "b.md"
    write_text(f, "one")
    write_text(f, "two")
    assert f.read_text() == "two" and os.listdir(f.parent) == ["b.md"]
    assert refusal(write_text, tmp_path / "a", "x") == (
        str(tmp_path / "a"), "<file>", "is a folder; expected a file name",
    )  # fmt: skip
    assert refusal(check_output_file, f / "c.md")[2] == f"{f} is a file, not a folder"
    d = output_folder(tmp_path / "w" / "x")
    assert d.is_dir() and output_folder(d) == d
    assert refusal(output_folder, f) == (
        str(f), "<file>", "is a file; expected a folder for the outputs",
    )  # fmt: skip
    os.symlink(d, tmp_path / "ln")
    assert refusal(output_folder, tmp_path / "ln")[2].startswith("is a symbolic link (to ")
    assert build_dir("x", "y") == Path.cwd() / "build" / "x" / "y"


# ----------------------------------------------------------------------------- YAML


def yaml_refusal(text) -> tuple:
    with pytest.raises(InputError) as e:
        parse_yaml(text, "c.yaml")
    assert e.value.file == "c.yaml"
    return e.value.field, e.value.reason


@pytest.mark.parametrize(
    "text, field, reason",
    [
        ("a: &x 1\nb: 2\n", "<yaml>",
         "YAML error at line 1, column 4: anchors (&name) are not accepted"),
        ("a: 1\nb: *x\n", "<yaml>",
         "YAML error at line 2, column 4: aliases (*name) are not accepted"),
        ("a: 1\nb: 2\na: 3\n", "<yaml>", "YAML error at line 3, column 1: duplicate key 'a'"),
        ("? [1, 2]\n: 3\n", "<yaml>", "YAML error at line 1, column 3: a key must be a scalar"),
        ("a: [1\n", "<yaml>",
         "YAML error at line 2, column 1: expected ',' or ']', but got '<stream end>'"),
        ("", "<top>", "the document is empty; expected a mapping"),
        ("# only a comment\n", "<top>", "the document is empty; expected a mapping"),
        ("- 1\n- 2\n", "<top>", "the top level must be a mapping, not list"),
        ("7\n", "<top>", "the top level must be a mapping, not int"),
    ],
)  # fmt: skip
def test_yaml_refusals_by_hand(text, field, reason):
    assert yaml_refusal(text) == (field, reason)


def test_yaml_nesting_at_its_limit():
    """The document's mapping is level 1: 32 levels are read, 33 refused."""

    def nested(levels):
        return "a: " + "{a: " * (levels - 2) + "1" + "}" * (levels - 2) + "\n"

    assert parse_yaml(nested(MAX_YAML_DEPTH), "c.yaml")["a"] is not None
    field, reason = yaml_refusal(nested(MAX_YAML_DEPTH + 1))
    # the key "a" inside the last "{" (level 32) is level 33: at index 3 + 4 x 30 + 1
    col = 3 + 4 * (MAX_YAML_DEPTH - 2) + 2
    assert (field, reason) == (
        "<yaml>", f"YAML error at line 1, column {col}: nested deeper than {MAX_YAML_DEPTH} levels",
    )  # fmt: skip


def test_yaml_size_limit_at_its_value(monkeypatch):
    import fsedp.files as files

    monkeypatch.setattr(files, "MAX_YAML_BYTES", 8)
    assert parse_yaml("a: 12345", "c.yaml") == {"a": 12345}  # 8 characters
    with pytest.raises(InputError) as e:
        parse_yaml("a: 123456", "c.yaml")
    assert (e.value.file, e.value.field, e.value.reason) == (
        "c.yaml", "<file>", "9 characters; a YAML file here holds at most 8",
    )  # fmt: skip


def test_yaml_value_errors_are_one_line(monkeypatch):
    field, reason = yaml_refusal("a: 2001-13-45\n")
    assert field == "<yaml>" and reason.startswith("YAML error: ValueError: ")
    import yaml

    def long(*a, **kw):
        raise ValueError("x" * 300)

    monkeypatch.setattr(yaml, "load", long)
    field, reason = yaml_refusal("a: 1\n")
    assert reason == ("YAML error: ValueError: " + "x" * 300)[:200]


def test_yaml_a_control_character_is_refused_on_one_line():
    """The reader's own error (it has no marks): no position, the reader's problem."""
    field, reason = yaml_refusal("a: \x07\n")
    assert field == "<yaml>" and reason.startswith("YAML error: unacceptable character #x0007")


def test_yaml_a_duplicate_key_is_named_to_60_characters():
    key = "k" * 70
    field, reason = yaml_refusal(f"{key}: 1\n{key}: 2\n")
    assert (field, reason) == (
        "<yaml>",
        f"YAML error at line 2, column 1: duplicate key '{'k' * 60}'",
    )


# ------------------------------------------------------------------ the write rule's refusals


def test_the_write_rules_refusals_name_the_path_exactly(tmp_path, monkeypatch):
    """Every refusal of an output path, as (file, field, reason)."""
    import tempfile

    from fsedp.files import check_output_folder

    os.mkfifo(tmp_path / "fifo")
    assert refusal(check_output_file, tmp_path / "fifo") == (
        str(tmp_path / "fifo"), "<file>",
        "is a FIFO (named pipe); fsedp writes its outputs only as regular files and replaces "
        "nothing else: name a new or regular file",
    )  # fmt: skip
    target = "t" * 150
    os.symlink(target, tmp_path / "ln")
    assert refusal(check_output_folder, tmp_path / "ln") == (
        str(tmp_path / "ln"), "<file>",
        f"is a symbolic link (to {'t' * 120}); fsedp writes its outputs as new files and "
        "neither replaces a link nor writes through one: name the target itself",
    )  # fmt: skip
    for bad in [" ", "a\0b"]:  # ("" is Path(".") here, the current folder)
        assert refusal(check_output_file, bad) == (repr(bad), "<file>", "not a usable path")
    (tmp_path / "f").write_text("x")
    assert refusal(output_folder, tmp_path / "f" / "o") == (
        str(tmp_path / "f" / "o"), "<file>", f"{tmp_path / 'f'} is a file, not a folder",
    )  # fmt: skip
    assert refusal(check_output_folder, tmp_path / "f") == (
        str(tmp_path / "f"), "<file>", "is a file; expected a folder for the outputs",
    )  # fmt: skip
    # a loop of links above it: it cannot be looked at
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    assert refusal(output_folder, tmp_path / "a" / "x") == (
        str(tmp_path / "a" / "x"), "<file>",
        "cannot look at it: Too many levels of symbolic links",
    )  # fmt: skip
    # a folder the system does not let a file be made in
    real = tempfile.TemporaryFile

    def no_room(*a, dir=None, **kw):
        if dir == tmp_path:
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*a, dir=dir, **kw)

    with monkeypatch.context() as m:
        m.setattr(tempfile, "TemporaryFile", no_room)
        assert refusal(check_output_file, tmp_path / "new.md") == (
            str(tmp_path / "new.md"), "<file>",
            f"cannot write into {tmp_path}: Read-only file system",
        )  # fmt: skip


def test_the_places_a_report_may_never_replace(tmp_path, monkeypatch):
    """The root, the current folder, the home folder and a folder above either, each named;
    a current folder that cannot be found leaves the home folder still checked."""
    from pathlib import Path

    from fsedp.files import check_output_folder

    home, work = tmp_path / "home", tmp_path / "home" / "w"
    work.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)

    def why(p):
        return refusal(check_output_folder, p)

    tail = "; a report needs a folder of its own, e.g. "
    assert why(Path("/")) == ("/", "<file>", "is the file-system root" + tail + "/report")
    assert why(work) == (str(work), "<file>", "is the current folder" + tail + f"{work}/report")
    assert why(home) == (str(home), "<file>", "is your home folder" + tail + f"{home}/report")
    assert why(tmp_path)[2] == "is a folder above the current folder" + tail + f"{tmp_path}/report"

    def gone():
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    monkeypatch.setattr(Path, "cwd", staticmethod(gone))
    assert why(home)[2].startswith("is your home folder;")


def test_forcing_into_a_folder_whose_marker_fsedp_cannot_have_written(tmp_path):
    from fsedp.files import check_output_folder

    f = tmp_path / "r"
    tree(f, {OUTPUT_MARKER: "not json", "u.txt": "user"})
    assert refusal(check_output_folder, f, force=True) == (
        str(f / OUTPUT_MARKER), "<file>",
        "is not a marker fsedp wrote and would be replaced by the report's: move it away or "
        "choose another folder",
    )  # fmt: skip
    assert refusal(check_output_folder, f) == (
        str(f), "<file>",
        f"holds {OUTPUT_MARKER} (not a marker fsedp wrote), u.txt, which fsedp did not write; "
        "a report replaces only a folder of its own, as fsedp left it: choose a new folder, "
        "empty this one, or pass --force to write the report beside what it holds",
    )  # fmt: skip


def test_stamps_by_hand(tmp_path):
    """A file: its size, time and the sha256 of its first MiB only; a folder: its time; a
    link: its target and time; a FIFO: none."""
    import hashlib

    from fsedp.files import _stamp

    big = tmp_path / "big"
    data = b"a" * (1 << 20) + b"tail"
    big.write_bytes(data)
    st = os.lstat(big)
    first_mib = hashlib.sha256(data[: 1 << 20]).hexdigest()
    assert _stamp(big) == ["file", len(data), st.st_mtime_ns, first_mib]
    assert _stamp(tmp_path) == ["dir", os.lstat(tmp_path).st_mtime_ns]
    os.symlink("big", tmp_path / "ln")
    assert _stamp(tmp_path / "ln") == ["link", "big", os.lstat(tmp_path / "ln").st_mtime_ns]
    os.mkfifo(tmp_path / "fifo")
    assert _stamp(tmp_path / "fifo") is None and _stamp(tmp_path / "none") is None


def test_a_stamp_never_reads_through_a_link_swapped_in(tmp_path, monkeypatch):
    """An entry looked at as a regular file that is a link by the time it is opened (a
    race): the open does not follow it, so there is no stamp."""
    from fsedp.files import _stamp

    (tmp_path / "t").write_text("x")
    os.symlink("t", tmp_path / "ln")
    regular = os.stat(tmp_path / "t")
    real = os.lstat
    monkeypatch.setattr(os, "lstat", lambda p: regular if Path(p).name == "ln" else real(p))
    assert _stamp(tmp_path / "ln") is None


def test_the_marker_is_one_entry_per_line(tmp_path):
    with output_dir(tmp_path / "r") as d:
        (d / "a").write_text("1")
    lines = (tmp_path / "r" / OUTPUT_MARKER).read_text().splitlines()
    assert lines[:2] == ["{", '"tool": "fsedp",']


def test_markers_at_their_edges(tmp_path, monkeypatch):
    """Which markers are fsedp's: a folder, a JSON list, another tool's, one that cannot be
    looked at, and the size limit at its value (a marker of exactly the limit is read, one
    byte more is not)."""
    import fsedp.files as files

    f = tmp_path / "f"
    (f / OUTPUT_MARKER).mkdir(parents=True)
    assert _foreign(f)[0] == f"{OUTPUT_MARKER} (not a marker fsedp wrote)"
    g = tmp_path / "g"
    for doc in [[1], {"tool": "other", "version": 2, "files": [], "stamps": {}}]:
        tree(g, {OUTPUT_MARKER: json.dumps(doc)})
        assert _foreign(g) == [f"{OUTPUT_MARKER} (not a marker fsedp wrote)"], doc
    ok = {"tool": "fsedp", "version": 2, "files": [OUTPUT_MARKER], "stamps": {}}
    text = json.dumps(ok)
    monkeypatch.setattr(files, "_MAX_MARKER_BYTES", len(text) + 5)
    (g / OUTPUT_MARKER).write_text(" " * 5 + text)  # read to its last byte
    assert _foreign(g) == []
    (g / OUTPUT_MARKER).write_text(" " * 6 + text)
    assert _foreign(g) == [f"{OUTPUT_MARKER} (not a marker fsedp wrote)"]
    real = os.lstat

    def unseen(p, *a, **kw):
        if Path(p).name == OUTPUT_MARKER:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(p, *a, **kw)

    (g / OUTPUT_MARKER).write_text(text)
    monkeypatch.setattr(os, "lstat", unseen)
    assert files._Marker(g).state == "foreign"


def test_what_is_not_ours_in_a_folder_with_our_marker(tmp_path, monkeypatch):
    """Our marker lists a (stamp matching), b (changed since), c (listed without a stamp);
    the user added u/ with two files: u is named once, not what it holds; and the list
    stops at three.  A folder that cannot be walked is named."""
    import fsedp.files as files

    f = tmp_path / "f"
    with output_dir(f) as d:
        tree(d, {"a": "1", "b": "2"})
    doc = marker(f)
    doc["files"].append("c")
    doc["stamps"]["c"] = None
    (f / OUTPUT_MARKER).write_text(json.dumps(doc))
    tree(f, {"c": "3", "u": {"x": "u", "y": "u"}})
    (f / "b").write_text("changed")
    assert _foreign(f) == [
        "u",
        "b (changed since fsedp wrote it)",
        "c (listed in the marker without a stamp)",
    ]  # fmt: skip (folders are walked first)
    tree(f, {"v": "user", "w": "user"})
    assert len(_foreign(f)) == 3
    # a user's folder is named once, what it holds not again
    g = tmp_path / "g"
    with output_dir(g) as d:
        tree(d, {"a": "1"})
    tree(g, {"u": {"x": "u", "y": "u"}})
    assert _foreign(g) == ["u"]

    def unreadable(folder):
        raise OSError(errno.EACCES, "Permission denied", str(folder / "u"))
        yield

    monkeypatch.setattr(files, "_entries", unreadable)
    assert _foreign(f) == [f"{f / 'u'} (cannot be read)"]


@pytest.mark.parametrize("over", [-1, 0, 1])
def test_an_output_name_at_the_file_systems_name_limit(tmp_path, over):
    """The temporary name beside an output is ".NAME." + 8 characters + the suffix: with
    NAME_MAX 255 and the suffix ".md", a name of 255 - 12 - 3 bytes fits exactly; one byte
    more is refused, naming the path to 200 characters."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    name = "x" * (limit - 12 - 3 - 3 + over) + ".md"
    path = tmp_path / name
    if over <= 0:
        assert check_output_file(path) == path
    else:
        assert refusal(check_output_file, path) == (
            str(path)[:200], "<file>", f"the name is too long for {tmp_path}'s file system",
        )  # fmt: skip


def test_a_folder_that_cannot_be_listed_is_never_taken_as_empty(tmp_path, monkeypatch):
    tree(tmp_path / "f", {"d": {"x": "1"}})
    real = os.scandir

    def refuse_d(p="."):
        if Path(p).name == "d":
            raise PermissionError(errno.EACCES, "Permission denied", str(p))
        return real(p)

    monkeypatch.setattr(os, "scandir", refuse_d)
    with pytest.raises(PermissionError):
        list(_entries(tmp_path / "f"))
