"""The architecture's layers, checked: every import in the package runs down the layers
(``docs/architecture.md``).  A module may import its own layer or any layer below; an edge up
the layers, or between the two independent branches of one layer, fails with its file and
line.  Imports inside functions count too: a lazy import is still a dependency."""

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: top-level folder -> package it is installed as (pyproject.toml's package-dir, read)
FOLDERS = {
    folder: package
    for package, folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"].items()
}

#: Bottom to top.  Each layer is a list of branches; a branch is a list of module prefixes.
#: Branches of one layer must not import each other.
LAYERS = [
    (
        "foundations",
        [
            [
                "fsedp.errors",
                "fsedp.log",
                "fsedp.fields",
                "fsedp.files",
                "fsedp.jsondoc",
                "fsedp.params",
                "fsedp.config",
                "fsedp.configs",
                "fsedp.trace",
            ]
        ],
    ),
    ("workloads", [["fsedp.workload", "fsedp.lm"]]),
    ("golden models", [["fsedp.sw"]]),
    ("RTL | policies", [["fsedp.hw"], ["fsedp.sw.policies"]]),
    ("verification", [["fsedp.tb"]]),
    ("simulator", [["fsedp.sim"]]),
    ("experiments", [["fsedp.experiments"]]),
    ("CLI", [["fsedp.cli", "fsedp.__main__"]]),
]


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    mod = ".".join([FOLDERS[parts[0]], *parts[1:]])
    return mod.removesuffix(".__init__")


def _place(module: str) -> tuple[int, int] | None:
    """(layer, branch) of a project module: the longest matching prefix wins."""
    if module == "fsedp":  # the package's docstring only
        return 0, 0
    best, where = -1, None
    for li, (_, branches) in enumerate(LAYERS):
        for bi, prefixes in enumerate(branches):
            for p in prefixes:
                if (module == p or module.startswith(p + ".")) and len(p) > best:
                    best, where = len(p), (li, bi)
    return where


def _imports(path: Path, module: str):
    """(line, imported module) of every project import in ``path``, lazy ones included."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "fsedp":
                    yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "fsedp":
                # ``from fsedp.x import y`` may name a submodule y: the edge goes to y
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    yield node.lineno, sub if sub in MODULES else target


def _files():
    for folder in FOLDERS:
        yield from sorted((ROOT / folder).rglob("*.py"))


MODULES = {_module(p) for p in _files()}


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if _place(m) is None)
    assert not missing, f"modules outside the layers of docs/architecture.md: {missing}"


def test_imports_run_down_the_layers():
    bad = []
    for path in _files():
        mod = _module(path)
        here = _place(mod)
        for line, target in _imports(path, mod):
            there = _place(target)
            if there is None:
                continue
            name = LAYERS[there[0]][0]
            if there[0] > here[0]:
                bad.append(
                    f"{path.relative_to(ROOT)}:{line}: {mod} ({LAYERS[here[0]][0]}) "
                    f"imports {target} ({name}), a layer above"
                )
            elif there[0] == here[0] and there[1] != here[1]:
                bad.append(
                    f"{path.relative_to(ROOT)}:{line}: {mod} imports {target}: two "
                    f"independent branches of the layer {name}"
                )
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "bad_edge",
    [
        ("fsedp/config.py", "fsedp.sim.run"),
        ("hw/eit.py", "fsedp.sw.policies.buddy"),
        ("sw/eit.py", "fsedp.hw.eit"),
    ],
)
def test_an_upward_edge_is_caught(bad_edge):
    """The checker itself: an edge up the layers (or across branches) is reported."""
    file, target = bad_edge
    here, there = _place(_module(ROOT / file)), _place(target)
    assert there[0] > here[0] or (there[0] == here[0] and there[1] != here[1])
