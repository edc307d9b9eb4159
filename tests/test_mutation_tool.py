"""``scripts/mutation.py``, the automated mutation run (mutmut) of the rule modules: its
table, its reading of mutmut's names and diffs, its score table in
``docs/verification.md``, and one real run of a small module."""

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from fsedp.experiments.results import BEGIN, END, find_blocks

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("mutation", ROOT / "scripts" / "mutation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tool = _tool()


def test_every_module_and_test_file_of_the_table_is_there():
    table = tool.load_table()
    assert len(table) >= 30
    for name, m in table.items():
        assert (ROOT / name).is_file() and m.tests
        assert m.package_path.startswith("fsedp/")
    assert table["sw/eit.py"].package_path == "fsedp/sw/eit.py"
    assert table["fsedp/files.py"].package_path == "fsedp/files.py"
    assert table["sim/regions.py"].slug == "sim__regions"


@pytest.mark.parametrize(
    "text, message",
    [
        ('[module."sw/nothing.py"]\ntests = ["tests/test_golden.py"]\n', "no such file"),
        ('[module."sw/eit.py"]\ntests = ["tests/test_nothing.py"]\n', "no test file"),
        (
            '[module."sw/eit.py"]\ntests = ["tests/test_golden.py"]\n'
            '[[equivalent]]\nmodule = "sw/eit.py"\nfunction = "f"\nline = "a"\nmutant = "b"\n',
            "lacks ['why']",
        ),
        (
            '[module."sw/eit.py"]\ntests = ["tests/test_golden.py"]\n'
            '[[equivalent]]\nmodule = "sw/icv.py"\nfunction = "f"\nline = "a"\nmutant = "b"\n'
            'why = "c"\n',
            "equivalent of unknown 'sw/icv.py'",
        ),
        (
            '[deselect]\n"tests/test_golden.py" = ["tests/test_edges.py::test_x"]\n',
            "deselect of 'tests/test_golden.py': not a test file's nodes",
        ),
    ],
)
def test_a_bad_table_is_refused(tmp_path, text, message):
    bad = tmp_path / "mutation.toml"
    bad.write_text(text)
    with pytest.raises(SystemExit, match=re.escape(message)):
        tool.load_table(bad)


@pytest.mark.parametrize(
    "name, function",
    [
        ("fsedp.sw.matcher.x_lowest_bit__mutmut_7", "lowest_bit"),
        ("fsedp.sw.eit.xǁEITǁclear_flags__mutmut_12", "EIT.clear_flags"),
        ("fsedp.files.x__put_back__mutmut_3", "_put_back"),
        ("fsedp.sw.icv.xǁICVǁ__init____mutmut_1", "ICV.__init__"),
    ],
)
def test_function_of_a_mutant_and_back(name, function):
    assert tool.function_of(name) == function
    assert name.rpartition(".")[2].startswith(tool.mangled(function) + "__mutmut_")


def test_a_module_limited_to_some_functions_selects_their_mutants():
    m = tool.Module("fsedp/experiments/fpga.py", ["tests/test_fpga.py"], ["parse_fmax", "Cls.*"])
    assert m.selects("fsedp.experiments.fpga.x_parse_fmax__mutmut_1")
    assert m.selects("fsedp.experiments.fpga.xǁClsǁrun__mutmut_2")
    assert not m.selects("fsedp.experiments.fpga.x_place_and_route__mutmut_1")
    assert tool.Module("sw/eit.py", []).selects("fsedp.sw.eit.x_anything__mutmut_1")


def test_changed_lines_of_a_diff():
    diff = (
        "--- fsedp/sw/matcher.py\n+++ fsedp/sw/matcher.py\n@@ -1,3 +1,3 @@\n"
        " def lowest_bit(x: int) -> int:\n-    if x <= 0:\n+    if x < 0:\n"
    )
    assert tool.changed_lines(diff) == ("if x <= 0:", "if x < 0:")


def test_score_rows_keep_the_rows_of_modules_not_run(tmp_path):
    table = {
        "sw/a.py": tool.Module("sw/a.py", ["t"]),
        "sw/b.py": tool.Module("sw/b.py", ["t"]),
        "sw/c.py": tool.Module("sw/c.py", ["t"]),
    }
    table["sw/a.py"].equivalents.append(
        {"module": "sw/a.py", "function": "f", "line": "x", "mutant": "y", "why": "no input"}
    )
    old = (
        "| `sw/b.py` | 10 | 0 | 10 | 0 | 100.0 % | 3 | 2026-01-01 |\n"
        "| `sw/c.py` | not run | | | | | | |\n"
    )
    results = [
        {
            "module": "sw/a.py",
            "mutants": 21,
            "killed": 19,
            "survived": [{"mutant": "m"}],
            "equivalent": [{"mutant": "e"}],
            "score": 0.95,
            "seconds": 12.4,
        }
    ]
    body = tool.score_rows(results, old, table)
    rows = [ln for ln in body.splitlines() if ln.startswith("| `")]
    assert rows[0].startswith("| `sw/a.py` | 21 | 1 | 19 | 1 | 95.0 % | 12 | 20")
    assert rows[1] == old.splitlines()[0]
    assert rows[2] == "| `sw/c.py` | not run | | | | | | |"
    assert "2 of 3 modules measured" in body
    assert "* `sw/a.py` `f`: `x` -> `y`: no input" in body


def test_the_score_table_of_the_page_names_every_module_of_the_table():
    """docs/verification.md's score table is ``scripts/mutation.py --doc``'s: a row per module
    of ``scripts/mutation.toml``, the score of each measured one equal to its counts."""
    page = (ROOT / "docs" / "verification.md").read_text()
    (block,) = [b for b in find_blocks(page, "verification.md") if b.name == tool.BLOCK]
    body = page[block.start : block.end]
    rows = {m["module"]: ln for ln in body.splitlines() if (m := tool.ROW_RE.match(ln))}
    assert list(rows) == list(tool.load_table())
    measured = [m for m, ln in rows.items() if "| not run |" not in ln]
    assert f"{len(measured)} of {len(rows)} modules measured" in body
    # the equivalents listed are those the tool reads now
    eqs = [eq for m in tool.load_table().values() for eq in m.equivalents]
    listed = [ln for ln in body.splitlines() if ln.startswith("* `")]
    assert len(listed) == len(eqs)
    for eq, ln in zip(eqs, listed):
        assert ln.startswith(f"* `{eq['module']}` `{eq['function']}`: "), ln
    for module, line in rows.items():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[1] == "not run":
            continue
        mutants, eq, killed, survived = map(int, cells[1:5])
        assert killed + survived + eq == mutants, module
        assert cells[5] == f"{100 * killed / (killed + survived):.1f} %", module


def test_the_doc_block_is_written_between_its_markers(tmp_path):
    doc = tmp_path / "v.md"
    doc.write_text(f"before\n{BEGIN.format(name=tool.BLOCK)}\nold\n{END}\nafter\n")
    table = {"sw/a.py": tool.Module("sw/a.py", ["t"])}
    results = [
        {
            "module": "sw/a.py",
            "mutants": 2,
            "killed": 2,
            "survived": [],
            "equivalent": [],
            "score": 1.0,
            "seconds": 1,
        }
    ]
    tool.write_doc(doc, results, table)
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith(f"{END}\nafter\n")
    assert "| `sw/a.py` | 2 | 0 | 2 | 0 | 100.0 % | 1 |" in text and "old" not in text


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_changed_modules_against_head_include_untracked_table_modules():
    table = tool.load_table()
    changed = tool.changed_modules("HEAD", table)
    assert changed is not None and set(changed) <= set(table)
    assert tool.changed_modules("no-such-ref-anywhere", table) is None


def test_a_real_run_of_a_small_module(tmp_path):
    """mutmut over ``sw/icv.py`` in a view under ``tmp_path``: every mutant of the ICV is
    killed by the tests the table names (its rule fits in one line: ``(icv | release) &
    ~alloc``, worked out by hand in ``tests/test_golden.py``)."""
    pytest.importorskip("mutmut", reason="mutmut (the test extra) is not installed")
    out = tmp_path / "r.json"
    rc = tool.main(["sw/icv.py", "--jobs", "2", "--stage", str(tmp_path), "--json", str(out)])
    (r,) = json.loads(out.read_text())
    assert rc == 0, r
    assert r["module"] == "sw/icv.py" and r["mutants"] >= 10
    assert r["killed"] == r["mutants"] and r["score"] == 1.0 and r["survived"] == []


def test_bad_arguments_are_refused_before_any_run(tmp_path, capsys):
    assert tool.main(["sw/nothing.py", "--stage", str(tmp_path)]) == 2
    assert "not in mutation.toml: sw/nothing.py" in capsys.readouterr().out
    page = tmp_path / "v.md"
    page.write_text("no block here\n")
    assert tool.main(["sw/icv.py", "--doc", str(page), "--stage", str(tmp_path)]) == 2
    assert "no block 'mutation-score'" in capsys.readouterr().out
    assert not (tmp_path / "sw__icv").exists()  # nothing was staged
    assert tool.main(["--list"]) == 0
    assert "sw/eit.py" in capsys.readouterr().out


@pytest.mark.parametrize("ref", [None, "HEAD"])
def test_a_modules_view_is_laid_out_as_the_package(tmp_path, ref):
    if ref and shutil.which("git") is None:
        pytest.skip("git is not installed")
    table = tool.load_table()
    dest = tool.stage(table["sim/regions.py"], tmp_path, ref)
    assert dest == tmp_path / "sim__regions"
    assert (dest / "fsedp" / "sim" / "regions.py").is_file()
    assert (dest / "fsedp" / "sw" / "eit.py").is_file() and (dest / "tests").is_dir()
    assert not (dest / ".source").exists()
    import tomllib

    cfg = tomllib.loads((dest / "pyproject.toml").read_text())["tool"]["mutmut"]
    assert cfg["only_mutate"] == ["fsedp/sim/regions.py"]
    assert cfg["pytest_add_cli_args_test_selection"] == table["sim/regions.py"].tests
    assert cfg["process_isolation"] == "forkserver"
    assert "_mutation_cold_caches" in (dest / "tests" / "conftest.py").read_text()
    # the working tree's own conftest is untouched
    assert "_mutation_cold_caches" not in (ROOT / "tests" / "conftest.py").read_text()


def test_deselected_nodes_are_some_of_their_files_tests_and_reach_the_view(tmp_path):
    """Each deselected prefix leaves out at least one collected test of its file, never all
    of them, and a module that names the file runs with it left out."""
    import subprocess
    import sys
    import tomllib

    data = tomllib.loads(tool.TABLE.read_text())
    assert data["deselect"], "the table deselects nothing"
    for f, prefixes in data["deselect"].items():
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", f],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        nodes = [n for n in out if n.startswith(f + "::")]
        for p in prefixes:
            assert any(n.startswith(p) for n in nodes), p
        assert any(not n.startswith(tuple(prefixes)) for n in nodes)
    table = tool.load_table()
    m = table["sw/streaming/ring_buffer.py"]
    assert m.deselect == data["deselect"]["tests/test_streaming.py"]
    assert table["sw/eit.py"].deselect == []
    dest = tool.stage(m, tmp_path)
    args = tomllib.loads((dest / "pyproject.toml").read_text())["tool"]["mutmut"]
    args = args["pytest_add_cli_args"]
    assert args[args.index("--deselect") + 1] == m.deselect[0]
    assert args.count("--deselect") == len(m.deselect)


def test_refresh_rewrites_the_block_without_a_run(tmp_path, capsys):
    doc = tmp_path / "v.md"
    row = "| `sw/eit.py` | 10 | 0 | 10 | 0 | 100.0 % | 3 | 2026-01-01 |"
    doc.write_text(f"{BEGIN.format(name=tool.BLOCK)}\n{row}\n{END}\n")
    assert tool.main(["--doc", str(doc), "--refresh", "--stage", str(tmp_path)]) == 0
    text = doc.read_text()
    table = tool.load_table()
    assert row in text and f"1 of {len(table)} modules measured" in text
    n = sum(len(m.equivalents) for m in table.values())
    assert f"The {n} equivalent mutants of `scripts/mutation.toml`:" in text
    assert not any(p.is_dir() for p in tmp_path.iterdir())  # nothing staged
    assert tool.main(["--refresh"]) == 2
    assert "--refresh rewrites the page named by --doc" in capsys.readouterr().out
