"""Every JSON document fsedp prints or writes is strict JSON (``fsedp/jsondoc.py``): no
``NaN``, no ``Infinity``; a figure undefined on its input is ``null`` with its reason in the
``"undefined"`` map beside it.

Every command that takes ``--json`` is run here (the list is read from the parser, so a new
command fails :func:`test_every_json_command_is_run_or_listed` until it is given a run in
:data:`RUNS` or a reason in :data:`NOT_RUN`) with small arguments; its stdout and every
``*.json`` it writes (its ``--out`` folder, trace events, reports) are parsed by the strict
parser.  The runs that need minutes or tools are marked ``slow`` or skipped where a tool is
missing."""

import argparse
import ast
import json
import math
import tomllib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from tiny import TINY_RUN

from fsedp import jsondoc
from fsedp.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
LIBERTY = SHARED / "liberty" / "sky130_fd_sc_hd__tt_025C_1v80.lib"


# -- fsedp.jsondoc ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float64("nan")])
def test_dumps_refuses_a_non_finite_number_naming_its_path(bad):
    doc = {"name": "x", "rows": [{"a": 1.0}, {"layer": 1, "b": bad}]}
    with pytest.raises(jsondoc.NonFiniteError, match=r"\$\.rows\[1\]\.b\b"):
        jsondoc.dumps(doc, indent=1)
    assert issubclass(jsondoc.NonFiniteError, ValueError)


def test_dumps_writes_what_json_writes_for_finite_documents():
    doc = {"b": [1, 2.5, None, True, "é"], "a": {"x": -0.0, "y": 1e300}}
    for kw in ({}, {"indent": 1}, {"sort_keys": True, "separators": (",", ":")}):
        assert jsondoc.dumps(doc, **kw) == json.dumps(doc, **kw)
    assert jsondoc.dumps({"p": Path("a")}, default=str) == '{"p": "a"}'
    with pytest.raises(TypeError):  # not JSON at all: Python's own error
        jsondoc.dumps({"p": Path("a")})


@pytest.mark.parametrize("text", ["NaN", '{"a": Infinity}', "[1, -Infinity]"])
def test_loads_refuses_nan_and_infinity(text):
    with pytest.raises(ValueError, match="not JSON"):
        jsondoc.loads(text)
    assert jsondoc.loads('{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}


def test_finite_or_none():
    assert [jsondoc.finite_or_none(x) for x in (math.nan, math.inf, None, 2, np.float32(0.5))] == [
        None,
        None,
        None,
        2.0,
        0.5,
    ]


# -- the one writer ----------------------------------------------------------------------------

#: ``json.dump``/``json.dumps`` calls that stay outside :mod:`fsedp.jsondoc` (package file ->
#: (how many, why)): none of them writes a document fsedp prints or writes.
OTHER_JSON_DUMPS = {
    "fsedp/jsondoc.py": (1, "the writer itself"),
    "sim/executor.py": (1, "the canonical text of a point, hashed into its cache key"),
    "tb/native.py": (2, "the hash keys of a native build and of its knobs"),
    "tb/runner.py": (3, "a build's hash key; FSEDP_PARAMS and FSEDP_KNOBS to the testbench"),
    "fsedp/experiments/rtl_report.py": (1, "the hash key of a parameter set"),
    "fsedp/experiments/serve.py": (1, "a value quoted in a refusal's reason"),
    "sw/policies/device.py": (1, "a string quoted in a YAML profile"),
}


def _json_dumps_calls(path: Path) -> int:
    text = path.read_text()
    if "json" not in text:
        return 0
    return sum(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("dump", "dumps")
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "json"
        for n in ast.walk(ast.parse(text, str(path)))
    )


def test_documents_are_written_by_jsondoc_only():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = {}
    for folder in pyproject["tool"]["setuptools"]["package-dir"].values():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if n := _json_dumps_calls(path):
                found[str(path.relative_to(ROOT))] = n
    expected = {path: n for path, (n, _) in OTHER_JSON_DUMPS.items()}
    assert found == expected, (
        "a JSON document is written with json.dumps: use fsedp.jsondoc.dumps (strict JSON), "
        "or list a hash key or transport in OTHER_JSON_DUMPS"
    )


# -- every --json command ----------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One run of a command: ``argv`` (``{tmp}`` is its folder; ``--json`` is added),
    ``setup`` writes its inputs into ``{tmp}/in``, ``needs`` says why it cannot run here (a
    missing tool) or ``None``, ``check`` tests more of ``(stdout's document, {written JSON
    file: document}, the run's folder, warnings)``; ``status``: the exit statuses of a
    finished run (1: a check of the run failed, its document printed all the same)."""

    argv: tuple
    setup: Callable | None = None
    needs: Callable | None = None
    slow: bool = False
    check: Callable | None = None
    status: tuple = (0,)


def _write_tiny(folder: Path):
    (folder / "tiny.yaml").write_text(TINY_RUN)


def _write_small_rounds(folder: Path):
    (folder / "small.yaml").write_text(
        "hardware: chip2x2\n"
        "model: {name: tiny, d_model: 64, d_ffn: 128, experts: 16, top_k: 2, "
        "shared_experts: 0, layers: 2, heads: 2, params_b: 0.01}\n"
        "scheduler: {count_width: 6, requests: 4, theta_min: 2, n_threshold: 2, qos_width: 2, "
        "t_qos_init: 0}\n"
        "scenario: {tokens_per_iteration: 16, rounds: 3, seed: 5, trace: synthetic, "
        "skew: 1.2, prefill_fraction: 0.5}\n"
    )


def _trace(tokens: int, ids: Callable[[int], int], layers: int = 2, experts: int = 8):
    """A setup writing ``t.jsonl`` (fsedp.trace.io's JSON-lines import): ``tokens`` tokens,
    top-2 of ``experts``, token ``t``'s vocabulary id ``ids(t)``."""

    def setup(folder: Path):
        rng = np.random.default_rng(0)
        lines = [
            {
                "token": t,
                "layer": l,
                "experts": rng.choice(experts, 2, replace=False).tolist(),
                "token_id": ids(t),
            }
            for t in range(tokens)
            for l in range(layers)
        ]
        (folder / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    return setup


def _write_refactored(folder: Path):
    argv = ["prism", "refactor", "--iters", "20", "--profile-tokens", "1024"]
    assert main([*argv, "--out", str(folder / "r.npz")]) == 0


def _verilator():
    try:
        from fsedp.tb.runner import simulator_missing
    except ImportError as e:
        return f"the 'rtl' extra: {e}"
    return simulator_missing("verilator")


def _native():
    from fsedp.tb.native import native_missing

    return native_missing()


def _formal():
    from fsedp.tb.formal import missing_tools

    return ", ".join(missing_tools()) or None


def _synth():
    from fsedp.experiments.synth import missing_tools

    missing = missing_tools() + ([] if LIBERTY.is_file() else [str(LIBERTY)])
    return ", ".join(missing) or None


def _fpga():
    from fsedp.experiments.fpga import missing_tools

    return ", ".join(missing_tools()) or None


def _text_data():
    return None if (SHARED / "text").is_dir() else f"no WikiText-2 under {SHARED}"


STATS = ("trace", "stats", "{tmp}/in/t.jsonl", "--num-experts", "8", "--out", "{tmp}/out")


def _no_warnings(doc, written, tmp, caught):
    assert not caught, [str(w.message) for w in caught]


def _one_token(doc, written, tmp, caught):
    """One token: it fits the predictors, none is left to test them."""
    _no_warnings(doc, written, tmp, caught)
    assert doc["tokens"] == 1 and doc["skew"] == []
    for row in doc["predictability"]["layers"]:
        undefined = row["undefined"]
        for key in ("popularity", "token_id", "token_id_all", "coverage") + (
            ("inter_layer",) if row["layer"] else ()
        ):
            assert row[key] is None and undefined[key].startswith("no test tokens"), key
    assert written[tmp / "out" / "stats.json"] == doc
    md = (tmp / "out" / "stats.md").read_text()
    assert "n/a (no test tokens" in md and "nan" not in md


def _ids_never_repeat(doc, written, tmp, caught):
    """No test token's id was seen while fitting: the token-id precision is undefined, the
    rest is not."""
    _no_warnings(doc, written, tmp, caught)
    for row in doc["predictability"]["layers"]:
        assert row["token_id"] is None and row["coverage"] == 0.0
        assert set(row["undefined"]) == {"token_id"}
        assert row["undefined"]["token_id"].startswith("no test token's id occurs")
        assert row["popularity"] is not None and row["token_id_all"] is not None
    md = (tmp / "out" / "stats.md").read_text()
    assert "n/a (no test token's id occurs" in md and "nan" not in md


def _all_defined(doc, written, tmp, caught):
    _no_warnings(doc, written, tmp, caught)
    assert all("undefined" not in row for row in doc["predictability"]["layers"])


#: command -> {variant: Run}: the smallest arguments that exercise its JSON
RUNS = {
    "run": {
        "tiny": Run(
            ("run", "--config", "{tmp}/in/tiny.yaml", "--layers", "1", "--strategies", "EP,A3")
            + ("--workers", "1", "--out", "{tmp}/out", "--trace-events", "{tmp}/events.json"),
            setup=_write_tiny,
            check=lambda d, w, tmp, c: {tmp / "out/summary.json", tmp / "events.json"} <= set(w),
        )
    },
    "sweep": {
        "one-point": Run(
            ("sweep", "figure9", "--models", "deepseek-moe-16b", "--tokens", "16", "--layers")
            + ("1", "--workers", "1", "--no-cache", "--streaming", "python")
        )
    },
    "bench": {"one-layer": Run(("bench", "--layers", "1"), slow=True)},
    "rtl rounds": {
        "small": Run(
            ("rtl", "rounds", "--config", "{tmp}/in/small.yaml"),
            setup=_write_small_rounds,
            needs=_verilator,
            slow=True,
        )
    },
    "rtl verilog": {"eit": Run(("rtl", "verilog", "--block", "eit", "--out", "{tmp}/out"))},
    "rtl cosim": {
        "native": Run(
            ("rtl", "cosim", "--driver", "native", "--rounds", "20")
            + ("--report", "{tmp}/cosim.json"),
            needs=_native,
            slow=True,
            check=lambda d, w, tmp, c: tmp / "cosim.json" in w,
        )
    },
    "rtl coverage": {
        "one-batch": Run(
            ("rtl", "coverage", "--batches", "1", "--rounds", "20"),
            needs=_native,
            slow=True,
            status=(0, 1),  # 1: bins still missed after one batch
        )
    },
    "rtl report": {
        "no-tools": Run(
            ("rtl", "report", "--no-latency", "--no-cells", "--experts", "16", "--chiplets")
            + ("4", "--out", "{tmp}/report.md")
        )
    },
    "rtl formal": {
        "icv": Run(
            ("rtl", "formal", "--check", "icv", "--depth", "3", "--out", "{tmp}/out"),
            needs=_formal,
            slow=True,
        )
    },
    "rtl synth": {
        "icv": Run(
            ("rtl", "synth", "--liberty", str(LIBERTY), "--top", "icv", "--out", "{tmp}/out"),
            needs=_synth,
            slow=True,
        )
    },
    "rtl fpga": {
        "matcher": Run(
            ("rtl", "fpga", "--top", "matcher", "--device", "25k", "--freq-mhz", "100")
            + ("--out", "{tmp}/out"),
            needs=_fpga,
            slow=True,
        )
    },
    "rtl datapath": {
        "2x2": Run(
            ("rtl", "datapath", "--no-ring", "--no-cells", "--mesh", "2x2:1"),
            needs=_verilator,
            slow=True,
        )
    },
    "trace stats": {
        "random": Run(STATS, setup=_trace(64, lambda t: t % 5), check=_all_defined),
        "one-token": Run(STATS, setup=_trace(1, lambda t: 3), check=_one_token),
        "ids-never-repeat": Run(STATS, setup=_trace(40, lambda t: t), check=_ids_never_repeat),
    },
    "lm eval": {
        "128-tokens": Run(("lm", "eval", "--max-tokens", "128"), needs=_text_data, slow=True)
    },
    "offload": {
        "trace": Run(
            ("offload", "--trace", "model", "--cache-rates", "0.5", "--prefetches", "none")
        ),
        "grid": Run(
            ("offload", "--grid", "--max-tokens", "128", "--out", "{tmp}/out"),
            slow=True,
            check=lambda d, w, tmp, c: tmp / "out/offload.json" in w,
        ),
    },
    "prism curve": {
        "256-tokens": Run(
            ("prism", "curve", "--refactored", "{tmp}/in/r.npz", "--max-tokens", "256")
            + ("--out", "{tmp}/out"),
            setup=_write_refactored,
            slow=True,
        )
    },
    "serve": {
        "fifo": Run(
            ("serve", "--policy", "fifo", "--load", "low", "--duration", "20")
            + ("--out", "{tmp}/out")
        )
    },
    "shuffle": {
        "embedded": Run(("shuffle", "--cem-iters", "2", "--cem-samples", "8", "--out", "{tmp}/out"))
    },
    "codesign": {
        "one-table": Run(
            ("codesign", "--theta", "1", "--prism", "", "--budget", "", "--max-tokens", "256")
            + ("--tokens", "32", "--out", "{tmp}/out"),
            slow=True,
        )
    },
}

#: commands taking --json that no unit test can run, with the reason
NOT_RUN: dict[str, str] = {}


def _json_commands() -> dict:
    """Every command (``"rtl synth"``) whose parser takes ``--json`` -> its parser."""
    out = {}

    def walk(parser, words):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if sub not in out.values():  # an alias is the same parser
                        walk(sub, (*words, name))
        if "--json" in parser._option_string_actions:
            out[" ".join(words)] = parser

    walk(build_parser(), ())
    return out


def test_every_json_command_is_run_or_listed():
    commands = set(_json_commands())
    assert not set(RUNS) & set(NOT_RUN)
    assert commands == set(RUNS) | set(NOT_RUN), (
        f"not run: {sorted(commands - set(RUNS) - set(NOT_RUN))}; "
        f"no such command: {sorted((set(RUNS) | set(NOT_RUN)) - commands)}"
    )


def test_every_report_folder_is_read():
    """A command that writes a report (``--out``, unless that is one Markdown file) has a run
    with ``--out``, so that its report's JSON files are parsed."""
    for name, parser in _json_commands().items():
        if "--out" in parser._option_string_actions and parser.get_default("out_kind") != "file":
            if name in RUNS:
                assert any("--out" in r.argv for r in RUNS[name].values()), name


def _cases():
    for command, runs in RUNS.items():
        for variant, run in runs.items():
            marks = [pytest.mark.slow] if run.slow else []
            yield pytest.param(command, variant, marks=marks, id=f"{command}-{variant}")


@pytest.mark.parametrize("command, variant", list(_cases()))
def test_json_is_strict(command, variant, tmp_path, capsys):
    run = RUNS[command][variant]
    if run.needs is not None and (why := run.needs()):
        pytest.skip(f"{command}: {why}")
    (tmp_path / "in").mkdir()
    if run.setup is not None:
        run.setup(tmp_path / "in")
    argv = [a.format(tmp=tmp_path) for a in run.argv] + ["--json"]
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = main(argv)
    out, err = capsys.readouterr()
    assert rc in run.status, err
    doc = jsondoc.loads(out)
    written = {}
    for path in sorted(tmp_path.rglob("*.json")):
        if path.relative_to(tmp_path).parts[0] != "in":
            try:
                written[path] = jsondoc.loads(path.read_text())
            except ValueError as e:
                pytest.fail(f"{path}: {e}")
    assert not [w for w in caught if "No artists with labels" in str(w.message)]
    if run.check is not None:
        assert run.check(doc, written, tmp_path, caught) is not False
