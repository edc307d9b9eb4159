"""Output places never destroy what a user owns (``fsedp.files``): report folders written
whole into a fresh folder and moved into place, replacing only a folder of ours; links never
written through or replaced; the current, home and root folders never used."""

import json
import os
from pathlib import Path

import pytest

from fsedp.cli import main
from fsedp.errors import InputError
from fsedp.files import (
    OUTPUT_MARKER,
    atomic_path,
    check_output_file,
    check_output_folder,
    output_dir,
    work_folder,
    write_text,
)


def _report(folder: Path, force: bool = False, **files: str):
    with output_dir(folder, force) as staged:
        for name, text in files.items():
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            (staged / name).write_text(text)


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): p.read_text()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != OUTPUT_MARKER
    }


def test_new_report_folder_is_whole_and_marked(tmp_path):
    out = tmp_path / "a" / "report"
    _report(out, **{"x.md": "1", "sub/y.json": "2"})
    assert _tree(out) == {"x.md": "1", "sub/y.json": "2"}
    marker = json.loads((out / OUTPUT_MARKER).read_text())
    assert marker["tool"] == "fsedp"
    assert set(marker["files"]) == {"x.md", "sub", "sub/y.json", OUTPUT_MARKER}
    assert sorted(p.name for p in out.parent.iterdir()) == ["report"]  # no staging left


def test_a_report_of_ours_is_replaced_whole(tmp_path):
    out = tmp_path / "r"
    _report(out, **{"old.md": "old", "same.md": "1"})
    _report(out, **{"same.md": "2"})
    assert _tree(out) == {"same.md": "2"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_an_empty_folder_takes_a_report(tmp_path):
    (tmp_path / "e").mkdir()
    _report(tmp_path / "e", **{"x.md": "1"})
    assert _tree(tmp_path / "e") == {"x.md": "1"}


@pytest.mark.parametrize("where", ["top", "nested", "in-a-folder-of-ours"])
def test_a_foreign_file_is_never_deleted(tmp_path, where):
    out = tmp_path / "r"
    if where == "in-a-folder-of-ours":
        _report(out, **{"sub/y.md": "1"})
        foreign = out / "sub" / "mine.txt"
    else:
        foreign = out / ("mine.txt" if where == "top" else "deep/mine.txt")
        foreign.parent.mkdir(parents=True)
    foreign.write_text("precious")
    with pytest.raises(InputError, match="which fsedp did not write"):
        _report(out, **{"x.md": "1"})
    assert foreign.read_text() == "precious"
    assert not (out / "x.md").exists()
    # --force writes beside it: the foreign file stays, namesakes of ours are replaced
    _report(out, force=True, **{"x.md": "2"})
    assert foreign.read_text() == "precious"
    assert (out / "x.md").read_text() == "2"
    marker = set(json.loads((out / OUTPUT_MARKER).read_text())["files"])
    assert "x.md" in marker and str(foreign.relative_to(out)) not in marker
    # ... and without --force the folder is still not ours
    with pytest.raises(InputError, match="which fsedp did not write"):
        check_output_folder(out)


def test_a_failed_report_leaves_the_old_one(tmp_path):
    out = tmp_path / "r"
    _report(out, **{"x.md": "old"})
    with pytest.raises(RuntimeError), output_dir(out) as staged:
        (staged / "x.md").write_text("half")
        raise RuntimeError("the run failed")
    assert _tree(out) == {"x.md": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_protected_places_are_refused_even_with_force(tmp_path, monkeypatch):
    home = tmp_path / "home" / "me"
    work = home / "work"
    work.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    for place, why in [
        (".", "the current folder"),
        (str(work), "the current folder"),
        ("..", "your home folder"),
        (str(home.parent), "above the current folder"),
        ("/", "root"),
    ]:
        with pytest.raises(InputError, match=why):
            check_output_folder(place, force=True)
    assert work.is_dir() and home.is_dir()


@pytest.mark.parametrize("dangling", [False, True])
def test_links_are_never_written_through_or_replaced(tmp_path, dangling):
    target = tmp_path / "mine.txt"
    if not dangling:
        target.write_text("precious")
    link = tmp_path / "out.md"
    link.symlink_to(target.name)
    for check in (check_output_file, check_output_folder):
        with pytest.raises(InputError, match="symbolic link"):
            check(link)
    with pytest.raises(InputError, match="symbolic link"):
        write_text(link, "new")
    with pytest.raises(InputError, match="symbolic link"), atomic_path(link) as tmp:
        tmp.write_text("new")
    assert link.is_symlink() and os.readlink(link) == "mine.txt"
    assert dangling or target.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["out.md"] + ([] if dangling else ["mine.txt"])
    )


def test_work_folder_marks_what_it_wrote(tmp_path):
    out = tmp_path / "w"
    with work_folder(out) as w:
        (w / "a.log").write_text("1")
    assert check_output_folder(out) == out  # ours: accepted again
    (out / "mine.txt").write_text("precious")
    with pytest.raises(InputError):
        check_output_folder(out)
    with work_folder(out, force=True) as w:
        (w / "b.log").write_text("2")
    marker = set(json.loads((out / OUTPUT_MARKER).read_text())["files"])
    assert {"a.log", "b.log"} <= marker and "mine.txt" not in marker


def test_fsedp_run_keeps_a_users_files(tmp_path, monkeypatch, capsys):
    """The reproductions: ``--out .`` and ``--out d`` with a file of the user's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("precious")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "mine.txt").write_text("precious")
    base = ["run", "--layers", "1", "--strategies", "EP", "--json"]
    for out in (".", "d", str(tmp_path)):
        assert main([*base, "--out", out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("fsedp: "), err
    assert main([*base, "--out", "r"]) == 0
    assert main([*base, "--out", "r"]) == 0  # ours: replaced
    capsys.readouterr()
    assert (tmp_path / "keep.txt").read_text() == "precious"
    assert (tmp_path / "d" / "mine.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "keep.txt", "r"]
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == sorted(
        [OUTPUT_MARKER, "summary.json", "report.md", "utilization.png", "chiplets.png"]
    )


@pytest.mark.parametrize("name", ["../../outside.txt", "/ABS", "sub/../../../outside.txt"])
def test_a_forged_marker_reaches_nothing_outside_the_folder(tmp_path, name):
    """A marker is a file in a user's folder: one naming a path outside the folder is not
    one fsedp wrote, so the folder is not ours (refused), and nothing outside is touched."""
    out = tmp_path / "r"
    _report(out, **{"x.md": "1"})
    victim = tmp_path / "outside.txt"
    victim.write_text("precious")
    target = str(victim) if name == "/ABS" else name
    marker = out / OUTPUT_MARKER
    doc = json.loads(marker.read_text())
    marker.write_text(json.dumps({**doc, "files": doc["files"] + [target]}))
    with pytest.raises(InputError, match="which fsedp did not write"):
        _report(out, **{"x.md": "2"})
    assert victim.read_text() == "precious"
    assert _tree(out) == {"x.md": "1"}


def test_a_report_file_the_user_changed_is_the_users(tmp_path):
    out = tmp_path / "r"
    _report(out, **{"report.md": "ours"})
    with open(out / "report.md", "a") as f:
        f.write("\nmy notes\n")
    with pytest.raises(InputError, match=r"report.md \(changed since fsedp wrote it\)"):
        _report(out, **{"report.md": "new"})
    assert (out / "report.md").read_text() == "ours\nmy notes\n"


def test_a_refused_merge_moves_nothing(tmp_path):
    """--force into a folder where one of the report's names is taken by a folder: refused
    before any file of the report replaces a user's namesake."""
    out = tmp_path / "r"
    (out / "b.json").mkdir(parents=True)
    (out / "a.md").write_text("the user's")
    with pytest.raises(InputError, match="in the way"):
        _report(out, force=True, **{"a.md": "ours", "b.json": "ours"})
    assert (out / "a.md").read_text() == "the user's" and (out / "b.json").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_a_report_folder_has_the_users_umask(tmp_path):
    umask = os.umask(0o022)
    try:
        _report(tmp_path / "r", **{"x.md": "1"})
    finally:
        os.umask(umask)
    assert (tmp_path / "r").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "r" / "x.md").stat().st_mode & 0o777 == 0o644
