"""Automated mutation testing of the rule modules with mutmut 3 (the ``test`` extra).

mutmut writes every mutant it can make of a module's functions (an operator swapped, a
number moved by one, a keyword argument dropped, a string changed, ...) into a copy of the
package, runs once the tests that :file:`scripts/mutation.toml` names for the module to learn
which test reaches which function, and then runs, for each mutant, only the tests that reach
its function (fastest first, stopping at the first failure), two mutants at a time.  A mutant
that no test fails *survives*; it is either a gap in the tests, to be closed with a test that
expects on a case worked out by hand what the rule must give, or *equivalent* (no input tells
it from the original), argued in the ``[[equivalent]]`` list of the same file, which this
script reads.

    python scripts/mutation.py                         # every module of the table
    python scripts/mutation.py sw/matcher.py sim/regions.py
    python scripts/mutation.py --changed main          # the modules that differ from main
    python scripts/mutation.py --doc docs/verification.md   # every module, the table rewritten
    python scripts/mutation.py --list

The working tree is never touched: each module runs in ``build/mutation/<module>/``, a view
of the sources laid out as the installed package (``fsedp/`` with ``sw/``, ``sim/``, ...
mapped in as ``pyproject.toml`` maps them, so mutmut's module names are the package's), the
tests and the other files the tests read.  Exit status: 0 when every module reaches
:data:`TARGET` of its non-equivalent mutants killed, 1 when one does not, 2 on a bad argument
or a table that names what is not there.
"""

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutate import PACKAGE_DIRS, ROOT, doc_problem  # noqa: E402  (the package view of the hand-listed campaign)

TABLE = ROOT / "scripts" / "mutation.toml"
STAGE = ROOT / "build" / "mutation"
#: the generated block of ``--doc``'s page (:mod:`fsedp.experiments.results`' markers)
BLOCK = "mutation-score"
#: the share of non-equivalent mutants a module's tests must kill
TARGET = 0.95
#: mutmut's exit codes of a mutant's test run, by what they mean here: a timeout or a crash
#: (killed by a signal: abort, bus error, arithmetic, segfault, kill) is a detected mutant
#: (the tests did not pass), "no tests" is a survivor (nothing reached it)
KILLED = {1, 3, -6, -7, -8, -11, -9, 36, 37, 24, -24, 152, 255}
#: not run to the end (an interrupted run): neither killed nor survived, and the module's
#: run is incomplete
UNCHECKED = {None, 2}
#: appended to the view's ``tests/conftest.py``: the package's caches (``functools`` caches
#: and the ``*_CACHE`` dicts of memoised results) emptied when a test session starts, so
#: that a mutant's session recomputes what the unmutated collection may have cached
CONFTEST = """

@pytest.fixture(autouse=True, scope="session")
def _mutation_cold_caches():
    import sys

    for name, mod in list(sys.modules.items()):
        if name == "fsedp" or name.startswith("fsedp."):
            for key, value in list(vars(mod).items()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()
                elif key.endswith("_CACHE") and isinstance(value, dict):
                    value.clear()
"""
#: top-level files and folders the tests read besides the package (docs pages, configs, ...)
ALSO = ["tests", "docs", "configs", "scripts", "README.md", "CHANGELOG.md", "Makefile", "LICENSE"]


@dataclass
class Module:
    path: str  # as in the working tree, e.g. "sw/matcher.py"
    tests: list
    functions: list = field(default_factory=list)  # empty: all of the module's functions
    equivalents: list = field(default_factory=list)
    deselect: list = field(default_factory=list)  # node-id prefixes left out of its tests

    def selects(self, mutant: str) -> bool:
        """Whether a mutant (mutmut's name) is of one of :attr:`functions`."""
        fn = function_of(mutant)
        return not self.functions or any(fnmatch.fnmatchcase(fn, f) for f in self.functions)

    @property
    def package_path(self) -> str:
        top, _, rest = self.path.partition("/")
        return f"{PACKAGE_DIRS[top]}/{rest}"

    @property
    def slug(self) -> str:
        return self.path.replace("/", "__").removesuffix(".py")


def load_table(path: Path = TABLE) -> dict:
    """The modules of :file:`scripts/mutation.toml`, each with its tests and equivalents;
    a module, test file or equivalent's module that is not there is refused (exit 2)."""
    data = tomllib.loads(path.read_text())
    deselect = data.get("deselect", {})
    for f, prefixes in deselect.items():
        bad = [p for p in prefixes if not p.startswith(f + "::")]
        if not (ROOT / f).is_file() or bad:
            raise SystemExit(
                f"mutation.py: {path.name}: deselect of {f!r}: not a test file's nodes"
            )
    modules = {}
    for name, entry in data.get("module", {}).items():
        if not (ROOT / name).is_file():
            raise SystemExit(f"mutation.py: {path.name}: module {name!r}: no such file")
        for t in entry["tests"]:
            if not (ROOT / t.split("::")[0]).is_file():
                raise SystemExit(f"mutation.py: {path.name}: module {name!r}: no test file {t!r}")
        files = {t.split("::")[0] for t in entry["tests"]}
        modules[name] = Module(
            name,
            list(entry["tests"]),
            list(entry.get("functions", [])),
            deselect=[d for f in sorted(files) for d in deselect.get(f, [])],
        )
    for eq in data.get("equivalent", []):
        missing = {"module", "function", "line", "mutant", "why"} - set(eq)
        if missing:
            raise SystemExit(f"mutation.py: {path.name}: an equivalent lacks {sorted(missing)}")
        if eq["module"] not in modules:
            raise SystemExit(f"mutation.py: {path.name}: equivalent of unknown {eq['module']!r}")
        modules[eq["module"]].equivalents.append(eq)
    return modules


def changed_modules(ref: str, table: dict) -> list | None:
    """The table's modules whose file differs from ``ref`` in the working tree (committed
    or not), or that git does not track yet; ``None`` when git cannot compare with ``ref``."""
    diff = subprocess.run(
        ["git", "diff", "--name-only", ref, "--"], cwd=ROOT, capture_output=True, text=True
    )
    if diff.returncode != 0:
        return None
    new = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    files = set(diff.stdout.split()) | set(new.stdout.split())
    return [m for m in table if m in files]


def stage(module: Module, where: Path = STAGE, ref: str | None = None) -> Path:
    """``build/mutation/<module>/``: the package view, the files the tests read, and a
    ``pyproject.toml`` whose ``[tool.mutmut]`` names the module and its tests; of the
    working tree, or with ``ref`` of that commit (what is being edited meanwhile is left
    out of the run)."""
    dest = where / module.slug
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if ref is None:
        src_root = ROOT
    else:
        src_root = dest / ".source"
        src_root.mkdir()
        archive = subprocess.run(
            ["git", "archive", "--format=tar", ref], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(src_root)], input=archive.stdout, check=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for src, rel in PACKAGE_DIRS.items():
        shutil.copytree(src_root / src, dest / rel, ignore=ignore, dirs_exist_ok=True)
    also = []
    for name in dict.fromkeys(ALSO + list(PACKAGE_DIRS)):
        if name == "fsedp" or not (src_root / name).exists():
            continue
        also.append(name)
        if (src_root / name).is_dir():
            shutil.copytree(src_root / name, dest / name, ignore=ignore)
        else:
            shutil.copy2(src_root / name, dest / name)
    text = (src_root / "pyproject.toml").read_text()
    mutmut = {
        "source_paths": ["fsedp"],
        "only_mutate": [module.package_path],
        "also_copy": also,
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-m", "not slow and not cocotb_tier"]
        + [arg for t in module.deselect for arg in ("--deselect", t)],
        "pytest_add_cli_args_test_selection": module.tests,
        "use_git_change_detection": False,
        # each mutant in a process forked from a server that has collected the tests but run
        # none of them (the stats run is a child too); the caches are emptied when a test
        # session starts (CONFTEST), so a cached function runs under its mutant
        "process_isolation": "forkserver",
        "forkserver_warmup": "collect",
    }
    lines = ["", "[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in mutmut.items()]
    (dest / "pyproject.toml").write_text(text + "\n".join(lines) + "\n")
    with open(dest / "tests" / "conftest.py", "a") as f:
        f.write(CONFTEST)
    if ref is not None:
        shutil.rmtree(src_root)
    return dest


def run_module(module: Module, jobs: int, where: Path = STAGE, ref: str | None = None) -> dict:
    dest = stage(module, where, ref)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    data = ROOT.parent / "shared" / "data"
    if data.is_dir():
        env.setdefault("FSEDP_DATA", str(data))
    t0 = time.time()
    prefix = module.package_path.removesuffix(".py").replace("/", ".")
    names = [f"{prefix}.{mangled(f)}__mutmut_*" for f in module.functions]
    proc = subprocess.run(
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *names],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.time() - t0
    (dest / "mutmut.log").write_text(proc.stdout + proc.stderr)
    meta = dest / "mutants" / (module.package_path + ".meta")
    if proc.returncode != 0 or not meta.is_file():
        # mutmut's spinner lines left out: the tests' failures and mutmut's reason remain
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if not SPINNER.match(ln)]
        tail = "\n".join(lines[-25:])
        return {"module": module.path, "error": tail, "seconds": seconds}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    codes = {k: v for k, v in codes.items() if module.selects(k)}
    return classify(module, dest, codes, seconds)


#: run in a module's view: the unified diff of each mutant named on stdin, as JSON
DIFFS = """
import json, sys
from mutmut.__main__ import find_mutant
from mutmut.mutation.diff_apply import get_diff_for_mutant

names = json.load(sys.stdin)
path = find_mutant(names[0]).path if names else None
json.dump({n: get_diff_for_mutant(n, path=path) for n in names}, sys.stdout)
"""


def mutant_diffs(dest: Path, names: list) -> dict:
    """The diff of each of ``names`` (mutants of one module), read by mutmut in one process."""
    if not names:
        return {}
    proc = subprocess.run(
        [sys.executable, "-c", DIFFS],
        cwd=dest,
        input=json.dumps(names),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)


def changed_lines(diff: str) -> tuple[str, str]:
    """The lines a mutant's unified diff removes and adds, each stripped and joined."""
    lines = [ln for ln in diff.splitlines() if not ln.startswith(("---", "+++"))]
    old = [ln[1:].strip() for ln in lines if ln.startswith("-")]
    new = [ln[1:].strip() for ln in lines if ln.startswith("+")]
    return " ".join(old), " ".join(new)


def mangled(function: str) -> str:
    """The inverse of :func:`function_of` (a glob stays a glob): ``Cls.*`` -> ``xǁClsǁ*``."""
    cls, dot, meth = function.rpartition(".")
    return f"xǁ{cls}ǁ{meth}" if dot else f"x_{function}"


def function_of(name: str) -> str:
    """``fsedp.sw.matcher.xǁCls ǁmeth__mutmut_3`` -> ``Cls.meth``; ``x_f__mutmut_1`` -> ``f``."""
    mangled = name.rpartition(".")[2].partition("__mutmut_")[0]
    if mangled.startswith("x_"):
        return mangled[2:]
    _, cls, meth = mangled.split("ǁ")
    return f"{cls}.{meth}"


def classify(module: Module, dest: Path, codes: dict, seconds: float) -> dict:
    killed, survived, equivalent, unchecked, matched = [], [], [], [], []
    left = [n for n, code in codes.items() if code not in KILLED | UNCHECKED]
    diffs = mutant_diffs(dest, left)
    for name, code in sorted(codes.items(), key=lambda kv: natural(kv[0])):
        if code in KILLED:
            killed.append(name)
            continue
        if code in UNCHECKED:
            unchecked.append(name)
            continue
        diff = diffs[name]
        old, new = changed_lines(diff)
        fn = function_of(name)
        match = [
            eq
            for eq in module.equivalents
            if eq["function"] == fn and eq["line"] == old and eq["mutant"] == new
        ]
        entry = {"mutant": name, "function": fn, "line": old, "to": new, "code": code, "diff": diff}
        (equivalent if match else survived).append(entry)
        matched.extend(id(eq) for eq in match)
    counted = len(killed) + len(survived)
    return {
        "module": module.path,
        "mutants": len(codes),
        "killed": len(killed),
        "survived": survived,
        "equivalent": equivalent,
        "unchecked": unchecked,
        # equivalents of the list that matched no survivor: killed since, or stale
        "unmatched": [eq for eq in module.equivalents if id(eq) not in matched],
        "score": len(killed) / counted if counted else 1.0,
        "seconds": seconds,
    }


SPINNER = re.compile(r"^[\u2800-\u28ff] ")
ROW_RE = re.compile(r"^\| `(?P<module>[^`]+)` \|")


def score_rows(results: list, old_body: str, table: dict) -> str:
    """The body of the block :data:`BLOCK`: one row per module of the table, the modules of
    this run from ``results``, the others kept from ``old_body`` (each row has its date), and
    the equivalents the tool read, with why each is one."""
    today = time.strftime("%Y-%m-%d")
    old = {}
    for line in old_body.splitlines():
        m = ROW_RE.match(line)
        if m and "| not run |" not in line:
            old[m["module"]] = line
    new = {}
    for r in results:
        if "error" in r or r.get("unchecked"):
            continue  # a failed or incomplete run leaves the module's row as it was
        counted = r["killed"] + len(r["survived"])
        new[r["module"]] = (
            f"| `{r['module']}` | {r['mutants']} | {len(r['equivalent'])} | {r['killed']} | "
            f"{len(r['survived'])} | {100 * r['score']:.1f} % | {r['seconds']:.0f} | {today} |"
        )
        if counted == 0:
            new[r["module"]] = new[r["module"]].replace(f"{100 * r['score']:.1f} %", "-")
    rows = [new.get(m) or old.get(m) or f"| `{m}` | not run | | | | | | |" for m in table]
    below = [m for m in table if m in new or m in old]
    lines = [
        f"{len(below)} of {len(table)} modules measured; each row is the module's latest run "
        f"(`python scripts/mutation.py MODULE ... --doc docs/verification.md`), its date in the "
        f"last column.  Score: killed / (mutants - equivalents); the target is "
        f"{100 * TARGET:.0f} %.",
        "",
        "| module | mutants | equivalent | killed | survived | score | s | run |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
    ]
    eqs = [eq for m in table.values() for eq in m.equivalents]
    if eqs:
        lines += [f"The {len(eqs)} equivalent mutants of `scripts/mutation.toml`:", ""]
        for eq in eqs:
            lines.append(
                f"* `{eq['module']}` `{eq['function']}`: `{eq['line']}` -> `{eq['mutant']}`: "
                f"{eq['why']}"
            )
        lines.append("")
    return "\n" + "\n".join(lines) + "\n"


def write_doc(path: Path, results: list, table: dict):
    """Rewrite the block :data:`BLOCK` of ``path`` (the page written all at once)."""
    from fsedp.experiments.results import find_blocks, replace_block
    from fsedp.files import read_text, write_text

    text = read_text(path)
    block = next(b for b in find_blocks(text, path) if b.name == BLOCK)
    body = score_rows(results, text[block.start : block.end], table)
    write_text(path, replace_block(text, BLOCK, body, path))


def natural(name: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="modules of the table (default: all)")
    ap.add_argument("--changed", metavar="REF", help="the table's modules that differ from REF")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--stage", default=str(STAGE), help="where the modules' views are made")
    ap.add_argument(
        "--ref", help="mutate the sources of this commit, not the working tree (e.g. HEAD)"
    )
    ap.add_argument("--doc", help="rewrite the score table of this Markdown file")
    ap.add_argument(
        "--refresh",
        action="store_true",
        help="with --doc: rewrite the block without a run (its rows kept, the equivalents "
        "listed anew from the table)",
    )
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    table = load_table()
    if args.list:
        for m in table.values():
            print(f"{m.path:34} {len(m.equivalents):3} equivalents  {' '.join(m.tests)}")
        return 0
    chosen = args.modules or list(table)
    if args.changed:
        chosen = changed_modules(args.changed, table)
        if chosen is None:
            print(f"mutation.py: --changed {args.changed}: git cannot compare with it")
            return 2
        print(f"modules changed since {args.changed}: {' '.join(chosen) or 'none'}")
    unknown = [m for m in chosen if m not in table]
    if unknown:
        print(f"mutation.py: not in {TABLE.name}: {' '.join(unknown)}")
        return 2
    if args.doc:
        problem = doc_problem(args.doc, BLOCK)  # before a run of many minutes
        if problem:
            print(f"mutation.py: {problem}")
            return 2
    if args.refresh:
        if not args.doc:
            print("mutation.py: --refresh rewrites the page named by --doc")
            return 2
        write_doc(Path(args.doc), [], table)
        return 0
    results = []
    for name in chosen:
        r = run_module(table[name], args.jobs, Path(args.stage), args.ref)
        results.append(r)
        if "error" in r:
            print(f"{name}: mutmut failed after {r['seconds']:.0f} s\n{r['error']}", flush=True)
            continue
        print(
            f"{name}: {r['killed']}/{r['mutants'] - len(r['equivalent'])} killed "
            f"({100 * r['score']:.1f} %), {len(r['equivalent'])} equivalent, "
            f"{len(r['survived'])} survived"
            + (f", {len(r['unchecked'])} not checked" if r["unchecked"] else "")
            + f"; {r['seconds']:.0f} s",
            flush=True,
        )
        for eq in r["unmatched"]:
            print(f"    equivalent listed but not a survivor: {eq['function']}: {eq['line']}")
        for s in r["survived"]:
            print(
                f"    {s['mutant']}  code {s['code']}\n        - {s['line']}\n        + {s['to']}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, ensure_ascii=False))
    if args.doc:
        write_doc(Path(args.doc), results, table)
    ok = all("error" not in r and not r["unchecked"] and r["score"] >= TARGET for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
