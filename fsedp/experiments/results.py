"""``fsedp results``: the tables of ``docs/results.md``, generated from the experiment files.

Every table an experiment file (``configs/experiments/NAME.yaml``) produces sits in the page
between two marker lines, which name the file::

    <!-- fsedp results: fig16 -->
    (caption and table, written by this module; never edited by hand)
    <!-- end fsedp results -->

:func:`update` runs the files whose blocks it is asked for through the code of
``fsedp run --config FILE`` (:func:`fsedp.sim.sweep.run_grid`,
:func:`~fsedp.sim.sweep.run_experiment_file`; a run config as one point of the same executor),
with the sweep's point cache, so a rerun computes only what changed, and rewrites those
blocks only: the prose around them is kept byte for byte, and the page is replaced whole
(:func:`fsedp.files.write_text`) after each block, so an interrupted run loses nothing
finished.  Progress bars go to stderr, never into the page.

A block's caption names the command, the points and the seconds of simulation they took,
summed over points and strategies as the point results record them: a block regenerated
from the cache is the same text.  The wall time of each generation goes to stderr.
"""

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fsedp.config import CONFIG_DIR, load_run
from fsedp.errors import InputError
from fsedp.files import check_input_file, read_text, read_yaml, write_text
from fsedp.sim.executor import MISSING, PointCache, run_points
from fsedp.sim.run import DEFAULT_STRATEGIES
from fsedp.sim.sweep import (
    load_experiment,
    load_grid,
    make_point,
    point_result_error,
    run_experiment_file,
    run_grid,
    sweep_point,
)

__all__ = [
    "BEGIN",
    "END",
    "EXPERIMENTS",
    "Block",
    "find_blocks",
    "experiment_files",
    "check_page",
    "generate",
    "replace_block",
    "update",
    "format_run",
]

#: The marker line that opens a generated block; the name is the experiment file's stem.
BEGIN = "<!-- fsedp results: {name} -->"
#: The marker line that closes it.
END = "<!-- end fsedp results -->"
_BEGIN_RE = re.compile(r"<!-- fsedp results: (?P<name>[A-Za-z0-9_.-]+) -->")
#: The project's experiment files.
EXPERIMENTS = CONFIG_DIR / "experiments"


@dataclass(frozen=True)
class Block:
    """One generated block of a page: ``text[start:end]`` is its body, the lines between
    its two markers (``line``: the 1-based line of the opening marker)."""

    name: str
    start: int
    end: int
    line: int


def find_blocks(text: str, source) -> list[Block]:
    """The marked blocks of ``text`` in order; a marker out of place (a block opened inside
    another, an end without a beginning, a block never closed, a name twice) is an
    :class:`~fsedp.errors.InputError` naming the page and the line."""
    blocks, opened, seen = [], None, set()
    pos = 0
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        stripped = line.strip()
        m = _BEGIN_RE.fullmatch(stripped)
        if m:
            if opened is not None:
                raise InputError(
                    str(source), f"line {n}", f"block {m['name']!r} opens inside {opened[0]!r}"
                )
            if m["name"] in seen:
                raise InputError(str(source), f"line {n}", f"a second block {m['name']!r}")
            seen.add(m["name"])
            opened = (m["name"], pos + len(line), n)
        elif stripped == END:
            if opened is None:
                raise InputError(str(source), f"line {n}", "an end marker without a block")
            blocks.append(Block(opened[0], opened[1], pos, opened[2]))
            opened = None
        elif stripped.startswith(("<!-- fsedp results", "<!-- end fsedp results")):
            raise InputError(str(source), f"line {n}", f"not a marker line: {stripped[:80]!r}")
        pos += len(line)
    if opened is not None:
        raise InputError(str(source), f"line {opened[2]}", f"block {opened[0]!r} is never closed")
    return blocks


def experiment_files(folder=None) -> dict[str, Path]:
    """``{stem: path}`` of the ``*.yaml`` files of ``folder`` (default: the project's
    ``configs/experiments``); each must be a regular file of a YAML file's size (the read
    rule, :func:`fsedp.files.check_input_file`): a folder, FIFO or device named ``*.yaml``
    is refused on one line."""
    folder = Path(folder) if folder is not None else EXPERIMENTS
    if not folder.is_dir():
        raise InputError(str(folder), "<folder>", "no such folder of experiment files")
    found = {p.stem: p for p in sorted(folder.glob("*.yaml"))}
    for p in found.values():
        check_input_file(p, "yaml")
    return found


def check_experiment(path) -> tuple[str, object, dict]:
    """``(kind, loaded, raw)`` of the experiment file ``path``, loaded as :func:`generate`
    runs it and running nothing: ``kind`` ``"grid"`` (``loaded`` from :func:`load_grid`),
    ``"experiment"`` (:func:`load_experiment`) or ``"run"`` (a run config,
    :func:`load_run`); ``raw`` the YAML mapping.  An invalid file is an
    :class:`~fsedp.errors.InputError` naming it and its field."""
    path = Path(path)
    raw = read_yaml(path)
    kind = raw.get("experiment")
    if kind == "grid":
        return "grid", load_grid(path), raw
    if kind is not None:
        return "experiment", load_experiment(path), raw
    return "run", load_run(path), raw


def check_page(text: str, names, source) -> list[str]:
    """What is wrong with the page's blocks against the experiment files ``names``: a file
    without its block, a block without its file, a block without a table.  Empty when all
    is well; runs nothing."""
    blocks = {b.name: b for b in find_blocks(text, source)}
    problems = [f"{source}: no block for {n} (add {BEGIN.format(name=n)})" for n in names]
    problems = [p for n, p in zip(names, problems) if n not in blocks]
    for b in blocks.values():
        body = text[b.start : b.end]
        if b.name not in names:
            problems.append(f"{source}: line {b.line}: block {b.name!r} has no experiment file")
        elif not any(line.startswith("|") for line in body.splitlines()):
            problems.append(f"{source}: line {b.line}: block {b.name!r} has no table")
    return problems


def replace_block(text: str, name: str, body: str, source) -> str:
    """``text`` with the body of block ``name`` replaced by ``body`` (everything else kept
    byte for byte)."""
    for b in find_blocks(text, source):
        if b.name == name:
            return text[: b.start] + body + text[b.end :]
    raise InputError(str(source), "<blocks>", f"no block {name!r}")


class _CountingCache(PointCache):
    """A :class:`PointCache` that counts the points it is asked for and those it has."""

    def __init__(self, root):
        super().__init__(root)
        self.asked = self.found = 0

    def read(self, key: str):
        self.asked += 1
        result = super().read(key)
        self.found += result is not MISSING
        return result


def _seconds(rows) -> float:
    """Seconds of simulation recorded in ``rows``' strategy summaries (``wall_s``)."""
    return sum(
        v["wall_s"]
        for r in rows
        for v in r.values()
        if isinstance(v, dict) and isinstance(v.get("wall_s"), (int, float))
    )


def _display(path: Path) -> str:
    """The path the caption's command names: ``configs/experiments/NAME.yaml`` for the
    project's own files, else the path as given."""
    try:
        if path.resolve().parent == EXPERIMENTS.resolve():
            return f"configs/experiments/{path.name}"
    except OSError:
        pass
    return str(path)


def _label(s: str) -> str:
    return s if s in ("EP", "EP-paper", "Hydra") else f"FSE-DP {s}"


def format_run(summary: dict) -> str:
    """A run config's summary as the main job's Markdown table: latency, speedup, x bound,
    utilization, on-chip memory, throughput, imbalances and the time over the bound by
    cause (% of the strategy's MoE time)."""
    out = [
        "| strategy | MoE layer (us) | speedup vs EP | x bound | utilization "
        "| on-chip (MB): weights + tokens | e2e tokens/s | DDR imbalance | compute imbalance "
        "| time over the bound, by cause |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s, m in summary.items():
        b = m["breakdown"]
        lost = sorted(((k, v) for k, v in m["lost"].items() if v >= 0.001), key=lambda kv: -kv[1])
        causes = ", ".join(f"{k} {v * 100:.1f} %" for k, v in lost) or "-"

        def num(x, fmt):
            return "-" if x is None else format(x, fmt)

        out.append(
            f"| {_label(s)} | {m['moe_layer_us']:.1f} | {num(m['speedup_vs_ep'], '.3f')} "
            f"| {num(m['x_bound'], '.3f')} | {m['utilization'] * 100:.1f} % "
            f"| {m['weights_mb']:.2f} + {m['tokens_mb']:.2f} "
            f"| {num(m['throughput_tok_s'], '.1f')} | {num(b['ddr_imbalance'], '.2f')} "
            f"| {b['compute_imbalance']:.3f} | {causes} |"
        )
    return "\n".join(out)


def generate(path, progress: bool = True, **executor) -> tuple[str, dict]:
    """The block body of one experiment file, run as ``fsedp run --config FILE`` runs it,
    and ``{"points", "cached", "wall_s"}`` of this generation.  ``executor``: ``engine``,
    ``workers``, ``address``, ``cache`` (a :class:`PointCache`) of
    :func:`fsedp.sim.executor.run_points`."""
    path = Path(path)
    shown = _display(path)
    cache = _CountingCache(getattr(executor.pop("cache", None), "root", None))
    t0 = time.time()
    kind, exp, raw = check_experiment(path)
    if kind == "grid":
        rows, table = run_grid(exp, progress=progress, cache=cache, **executor)
        title = f"Figure {exp['figure']} (grid over {', '.join(exp['vary'])})"
    elif kind == "experiment":
        rows, table = run_experiment_file(exp, progress=progress, cache=cache, **executor)
        title = f"Figure {exp['figure']} ({exp['table']})"
    else:  # a run config (Figures 11 and 13): the main job's table; the plots stay in build/
        cfg = exp
        point = make_point(raw, shown, list(DEFAULT_STRATEGIES), 1, None)
        (res,) = run_points(
            sweep_point,
            [point],
            progress=progress,
            label=path.stem,
            check=point_result_error,
            cache=cache,
            **executor,
        )
        if "infeasible" in res:
            raise InputError(*res["infeasible"])
        # in the order of the command's strategies (a cached result's keys are sorted)
        summary = {s: res["summary"][s] for s in point["strategies"]}
        rows, table = [summary], format_run(summary)
        layers = next(iter(summary.values()))["layers"]
        title = (
            f"{cfg.model.name} on {cfg.hardware.name}, {cfg.scenario.tokens_per_iteration} tokens "
            f"per iteration, 1 iteration x {layers} MoE layers (a run config: the command also "
            f"writes the plots, build/run/{path.stem}/)"
        )
    points = cache.asked
    caption = (
        f"{title}, `fsedp run --config {shown}`: {points} point{'s' * (points != 1)}, "
        f"{_seconds(rows):.0f} s of simulation:"
    )
    info = {"points": points, "cached": cache.found, "wall_s": round(time.time() - t0, 1)}
    return f"\n{caption}\n\n{table}\n\n", info


def update(page, folder=None, only=None, progress: bool = True, log=None, **executor):
    """Regenerate the blocks of ``page`` named in ``only`` (default: every block), each from
    its experiment file in ``folder`` (default: the project's), and write the page after
    each one.  Returns ``{name: info}`` (:func:`generate`).  Every name is checked (a block
    and a file for each) before anything runs."""
    log = log or sys.stderr
    page = Path(page)
    files = experiment_files(folder)
    text = read_text(page)
    names = [b.name for b in find_blocks(text, page)]
    if only is not None:
        wanted = list(dict.fromkeys(only))
        missing = [n for n in wanted if n not in names]
        if missing:
            raise InputError(str(page), "<blocks>", f"no block for {', '.join(missing)}")
        names = wanted
    unknown = [n for n in names if n not in files]
    if unknown:
        raise InputError(
            str(page),
            "<blocks>",
            f"no experiment file for {', '.join(unknown)} in {folder or EXPERIMENTS}",
        )
    done = {}
    for name in names:
        body, info = generate(files[name], progress=progress, **executor)
        text = read_text(page)  # the page as it is now: edits made meanwhile are kept
        write_text(page, replace_block(text, name, body, page))
        done[name] = info
        print(
            f"{name}: {info['points']} point{'s' * (info['points'] != 1)} ({info['cached']} "
            "from the cache), "
            f"{info['wall_s']} s",
            file=log,
            flush=True,
        )
    return done
