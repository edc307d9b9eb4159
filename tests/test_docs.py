"""The documents that carry generated figures or name files, checked against what produces
them: ``docs/results.md``'s tables are generated blocks (``fsedp results``), one per
experiment file, with no progress output pasted in; the README's layout table names files
that exist; the compiled engine's speed-up is stated in one place, the file ``fsedp bench
--out`` writes."""

import os
import re
import tomllib
from pathlib import Path

import pytest

from fsedp.cli import main
from fsedp.errors import InputError
from fsedp.experiments.results import BEGIN, END, check_page, experiment_files, find_blocks

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
#: The one home of the compiled engine's speed-up (``fsedp bench --out``, ``make bench``).
BENCH_DOC = ROOT / "docs" / "performance-bench.md"


# -- docs/results.md ----------------------------------------------------------------------------
def test_every_experiment_file_has_its_generated_table():
    text = RESULTS.read_text()
    names = list(experiment_files(ROOT / "configs" / "experiments"))
    assert len(names) >= 14, names  # the figures of the paper and the regimes
    assert check_page(text, names, RESULTS) == []
    for b in find_blocks(text, RESULTS):
        body = text[b.start : b.end]
        # the block is the one its file produced: it names the command, and holds a table
        assert f"`fsedp run --config configs/experiments/{b.name}.yaml`" in body, b.name
        assert re.search(r"^\|(---|:?-+:?)", body, re.M), f"{b.name}: no table separator"
        assert len([x for x in body.splitlines() if x.startswith("| ")]) >= 2, b.name


def test_results_page_has_no_progress_output():
    raw = RESULTS.read_bytes()
    assert b"\r" not in raw
    text = raw.decode()
    for mark in ("%|", "it/s]", "point/s]", "layer/s]", "s/it]"):
        lines = [n for n, x in enumerate(text.splitlines(), 1) if mark in x]
        assert not lines, f"progress output {mark!r} on lines {lines[:5]} of {RESULTS}"


TINY = """\
experiment: grid
figure: "tiny"
hardware: chip2x2
model: qwen3-30b-a3b
tokens: 16
layers: 1
strategies: [EP, A3]
seed: 1
vary:
  ddr_bandwidth_gbps_per_channel: [25.6, 48]
"""

PAGE = """\
# A page

Prose before, with a table of its own that stays:

| a | b |
|---|---|
| 1 | 2 |

<!-- fsedp results: tiny -->
| stale | table |
|---|---|
<!-- end fsedp results -->

Prose between.
<!-- fsedp results: other -->
kept as it is
<!-- end fsedp results -->
Prose after, no final newline"""


def _outside(text: str) -> list[str]:
    """The text outside the generated blocks' bodies, piece by piece."""
    blocks = find_blocks(text, "page")
    cuts = [0] + [x for b in blocks for x in (b.start, b.end)] + [len(text)]
    return [text[cuts[i] : cuts[i + 1]] for i in range(0, len(cuts), 2)]


def test_generator_rewrites_only_the_named_block(tmp_path, capsys):
    exp = tmp_path / "experiments"
    exp.mkdir()
    (exp / "tiny.yaml").write_text(TINY)
    (exp / "other.yaml").write_text(TINY.replace('"tiny"', '"other"'))
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    cache = tmp_path / "cache"
    args = ["results", str(page), "--experiments", str(exp), "--cache", str(cache)]
    assert main([*args, "--only", "tiny"]) == 0
    err = capsys.readouterr().err
    assert "tiny: 2 points (0 from the cache)" in err
    new = page.read_text()
    assert _outside(new) == _outside(PAGE)  # the prose, byte for byte
    blocks = {b.name: new[b.start : b.end] for b in find_blocks(new, page)}
    assert blocks["other"] == "kept as it is\n"
    body = blocks["tiny"]
    assert "stale" not in body
    assert f"`fsedp run --config {exp / 'tiny.yaml'}`: 2 points" in body
    rows = [x for x in body.splitlines() if x.startswith("| ")]
    assert rows[0] == "| ddr_bandwidth_gbps_per_channel | EP util / us | A3 util / us |"
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| 25.6", "| 48"]
    # from the cache, the same text: the caption holds nothing of the run that made it
    assert main([*args, "--only", "tiny"]) == 0
    assert "tiny: 2 points (2 from the cache)" in capsys.readouterr().err
    assert page.read_text() == new


def test_check_reports_a_missing_block_and_runs_nothing(tmp_path, capsys):
    exp = tmp_path / "experiments"
    exp.mkdir()
    (exp / "tiny.yaml").write_text(TINY)
    (exp / "extra.yaml").write_text(TINY)  # loaded by --check, never run
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    assert main(["results", str(page), "--experiments", str(exp), "--check"]) == 1
    out = capsys.readouterr().out
    assert "no block for extra" in out
    assert "block 'other' has no experiment file" in out
    assert "block 'tiny'" not in out  # it has a table (a stale one: --check runs nothing)


def test_check_loads_every_experiment_file_and_needs_no_write_access(tmp_path, capsys, monkeypatch):
    """``results --check`` reads only: a page folder that cannot be written is fine (every
    place is unwritable here, for root too); an experiment file that is invalid, a folder or
    a FIFO is one line and exit 2, not a pass."""
    import fsedp.files

    def unwritable(path):
        raise InputError(str(path), "<file>", "cannot write into it (the test's)")

    monkeypatch.setattr(fsedp.files, "_check_place", unwritable)
    exp = tmp_path / "experiments"
    exp.mkdir()
    (exp / "tiny.yaml").write_text(TINY)
    pages = tmp_path / "pages"
    pages.mkdir()
    page = pages / "page.md"
    page.write_text(PAGE.replace("other", "tiny2").replace("kept as it is", "| a |"))
    (exp / "tiny2.yaml").write_text(TINY)
    argv = ["results", str(page), "--experiments", str(exp), "--check"]
    assert main(argv) == 0, capsys.readouterr()
    capsys.readouterr()
    assert main(argv[:-1] + ["--only", "tiny"]) == 2  # a regeneration writes: refused
    assert "cannot write into it" in capsys.readouterr().err
    for name, make in {
        "invalid": lambda p: p.write_text("not: even an experiment\n"),
        "folder": lambda p: p.mkdir(),
        "fifo": os.mkfifo,
    }.items():
        bad = exp / "tiny2.yaml"
        if bad.is_dir():
            bad.rmdir()
        else:
            bad.unlink()
        make(bad)
        assert main(argv) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "tiny2.yaml" in err[0], (name, err)


@pytest.mark.parametrize(
    "page,line",
    [
        ("<!-- fsedp results: tiny -->\n| a |\n", "line 1"),
        ("x\n" + END + "\n", "line 2"),
        ("<!-- fsedp results: tiny -->\n<!-- fsedp results: tiny -->\n", "line 2"),
    ],
)
def test_misplaced_markers_are_one_line(tmp_path, capsys, page, line):
    exp = tmp_path / "experiments"
    exp.mkdir()
    (exp / "tiny.yaml").write_text(TINY)
    f = tmp_path / "page.md"
    f.write_text(page)
    assert main(["results", str(f), "--experiments", str(exp), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(f) in err and line in err
    assert f.read_text() == page


@pytest.mark.parametrize(
    "argv,option",
    [
        (["", "--check"], "page"),
        (["{page}", "--check", "--experiments", ""], "--experiments"),
        (["{page}", "--only", ","], "--only"),
        (["{page}", "--only", "nosuch"], "no block for nosuch"),
        (["{page}", "--check", "--only", "tiny"], "--only"),
    ],
)
def test_bad_options_are_one_line(tmp_path, capsys, argv, option):
    f = tmp_path / "page.md"
    f.write_text(PAGE)
    argv = [a.replace("{page}", str(f)) for a in argv]
    assert main(["results", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and option in err
    assert f.read_text() == PAGE


# -- README's layout table ---------------------------------------------------------------------
PATH_LIKE = (".py", ".yaml", ".md", ".vlt", ".cpp")


def _layout_rows():
    """``(folder, contents)`` of each row of README's "Layout" table."""
    text = README.read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    lines = [x for x in section.splitlines() if x.startswith("|")]
    assert lines[0].replace(" ", "") == "|folder|package|contents|", lines[0]
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, line
        (folder,) = re.findall(r"`([^`]+)`", cells[0])
        rows.append((folder, cells[2]))
    return rows


def test_readme_layout_table_names_files_that_exist():
    rows = _layout_rows()
    missing, named = [], 0
    for folder, contents in rows:
        base = ROOT / folder
        assert base.is_dir(), f"README layout: no folder {folder}"
        for tok in re.findall(r"`([^`]+)`", contents):
            if " " in tok or not ("/" in tok or tok.endswith(PATH_LIKE)):
                continue
            named += 1
            if "<" in tok:  # a pattern: tb_<block>.py
                pattern = re.sub(r"<[^>]+>", "*", tok)
                if not list(base.glob(pattern)):
                    missing.append(f"{folder}{tok} (no file matches {pattern})")
            elif not (base / tok).exists():
                missing.append(f"{folder}{tok}")
    assert named >= 50, f"only {named} paths found: has the table's format changed?"
    assert not missing, "README's layout table names files that do not exist: " + ", ".join(missing)


def test_readme_layout_table_has_every_package_folder():
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    folders = {f for f, _ in _layout_rows()}
    absent = sorted(f"{d}/" for d in package_dir.values() if f"{d}/" not in folders)
    assert not absent, f"README's layout table has no row for {absent}"


# -- the compiled engine's speed-up, in one place -----------------------------------------------
#: A speed-up figure: "29-54x", "20 - 50x", "about 30x".
SPEEDUP = re.compile(
    r"\b\d+(?:\.\d+)?\s*-\s*\d+(?:\.\d+)?\s*x\b|\babout\s+\d+(?:\.\d+)?\s*x\b", re.I
)


@pytest.mark.parametrize("name", ["README.md", "pyproject.toml", "sim/fast.py"])
def test_speedup_figure_is_only_in_the_bench_doc(name):
    """The compiled engine's speed-up is measured by ``fsedp bench --out
    docs/performance-bench.md``; other places refer to that file and give no number."""
    text = (ROOT / name).read_text()
    found = [
        f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for m in SPEEDUP.finditer(text)
    ]
    assert not found, f"{name} states a speed-up ({', '.join(found)}); refer to {BENCH_DOC.name}"


def test_the_bench_doc_holds_the_one_figure_and_is_referred_to():
    text = BENCH_DOC.read_text()
    assert "fsedp bench" in text and "| python / compiled |" in text
    (line,) = [x for x in text.splitlines() if x.startswith("The compiled engine is ")]
    assert SPEEDUP.search(line), line
    for name in ("README.md", "pyproject.toml"):
        assert "docs/performance-bench.md" in (ROOT / name).read_text(), name
    assert SPEEDUP.search("the engine, 29-54x faster") and SPEEDUP.search("(about 30x slower)")
    assert not SPEEDUP.search("the 2x2 chip, 4x4 meshes, rows x cols, A1-A5, 100x slower")


# -- docs/verification.md: the mutation campaign ------------------------------------------------


def _mutate():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_campaign_table_is_the_run_of_every_mutant_listed():
    """``docs/verification.md``'s campaign table is a ``scripts/mutate.py --doc`` run over the
    mutants listed now: a row for each (a mutant added since needs a new run), each killed."""
    mutate = _mutate()
    page = (ROOT / "docs" / "verification.md").read_text()
    (block,) = [b for b in find_blocks(page, "verification.md") if b.name == mutate.BLOCK]
    table = page[block.start : block.end]
    rows = re.findall(r"^\| `([^`]+)` \| .* \| (\w+) \| .* \| [\d.]+ \|$", table, re.M)
    assert sorted(name for name, _ in rows) == sorted(m.name for m in mutate.MUTANTS)
    assert {result for _, result in rows} == {"killed"}
    n = len(mutate.MUTANTS)
    assert f"**{n} of {n} killed**" in table


def test_the_campaign_table_is_written_between_its_markers(tmp_path):
    mutate = _mutate()
    doc = tmp_path / "v.md"
    begin, end = BEGIN.format(name=mutate.BLOCK), END
    doc.write_text(f"before\n{begin}\nold\n{end}\nafter\n")
    results = [
        {"mutant": "m", "what": "a bug", "result": "killed", "killed_by": "t.py::x", "seconds": 1.5}
    ]
    counts = {"killed": 1, "survived": 0, "hang": 0, "stale": 0}
    mutate.write_doc(doc, mutate.campaign_table(results, counts, ["--doc", "v.md"], 2, 10, 4))
    text = doc.read_text()
    assert text.startswith(f"before\n{begin}\n") and text.endswith(f"{end}\nafter\n")
    assert "old" not in text and "| `m` | a bug | killed | `t.py::x` | 1.5 |" in text
    assert "`python scripts/mutate.py --doc v.md` (2 jobs" in text and "**1 of 1 killed**" in text
    doc.write_text("no markers\n")
    with pytest.raises(InputError, match="no block 'mutation-campaign'"):
        mutate.write_doc(doc, "x")
    assert doc.read_text() == "no markers\n"
