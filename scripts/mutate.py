"""Mutation check of the fast test tier: apply each plausible bug of :data:`MUTANTS` to a
copy of the sources, one at a time, run the fast tests that cover it, and report which
mutants the tests kill, which survive and which make them hang.

    python scripts/mutate.py                 # every mutant, 2 at a time
    python scripts/mutate.py --only eit-wrap --jobs 1 --json out.json
    python scripts/mutate.py --list
    python scripts/mutate.py --doc docs/verification.md    # every mutant, the table rewritten

The working tree is never touched: each mutant runs in a temporary package view (``fsedp/``
with ``hw/``, ``sw/``, ``tb/``, ``sim/``, ``configs/`` mapped in as in ``pyproject.toml``)
that ``PYTHONPATH`` puts before the installed package.  A mutant whose ``old`` text is not
found exactly once is reported as stale (the source moved on; update the list).  Exit status:
0 when every mutant is killed, 1 otherwise.  Figures: ``docs/verification.md``, whose
campaign table (the generated block :data:`BLOCK`, marked as ``fsedp results`` marks its
tables) ``--doc`` rewrites from the run.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: source folder -> where it sits in the package view (pyproject.toml's package-dir, read)
PACKAGE_DIRS = {
    folder: package.replace(".", "/")
    for package, folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"].items()
}

#: the generated block of ``--doc``'s file that holds the campaign table
#: (:mod:`fsedp.experiments.results`' markers)
BLOCK = "mutation-campaign"

GOLDEN = ["tests/test_golden.py"]
STREAM = ["tests/test_streaming.py"]
#: the block benches of ``tests/test_block_benches.py`` (the scheduler top's ``test_scheduler``
#: included) run in their Amaranth tier only (the ``-m`` filter of :func:`run_tests` leaves
#: the cocotb tier out); ``tests/test_rtl_amaranth.py``: sorter variants, priority encoder
RTL = [
    "tests/test_block_benches.py",
    "tests/test_blocks_amaranth.py",
    "tests/test_rtl_amaranth.py",
]
DATAPATH = ["tests/test_datapath_rtl.py"]
FORMAL = ["tests/test_formal.py"]
FAST = ["tests/test_fast.py"]
SIM = ["tests/test_sim.py"]
TRACE = ["tests/test_trace.py"]
REGIONS = ["tests/test_regions.py"]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # source file, relative to the project root
    old: str  # text replaced (must occur exactly once)
    new: str
    what: str  # the plausible bug, in words
    tests: tuple  # fast-tier test files that must kill it


def M(name, path, old, new, what, *tests):
    return Mutant(name, path, old, new, what, tuple(t for group in tests for t in group))


#: the plausible bugs: the ones of an earlier outside campaign and our own
MUTANTS = [
    # -- RTL ---------------------------------------------------------------------------------
    M(
        "eit-wrap",
        "hw/eit.py",
        "wp.data.count.eq(Mux(old.count == p.count_max, old.count, old.count + 1))",
        "wp.data.count.eq(old.count + 1)",
        "EIT count wraps instead of saturating",
        RTL,
    ),
    M(
        "tb-cfw-rtl",
        "hw/token_buffer.py",
        "m.d.sync += [t.eq(t1 - 1), c.eq(0)]",
        "m.d.sync += [t.eq(t1 - 1), c.eq(c1)]",
        "token buffer RTL keeps C_fw on a deferral",
        RTL,
    ),
    M(
        "icv-release-wins",
        "hw/icv.py",
        "self.value.eq((self.value | self.release) & ~self.alloc)",
        "self.value.eq((self.value & ~self.alloc) | self.release)",
        "ICV: a release wins over an allocation of the same chiplet",
        RTL,
        FORMAL,
    ),
    M(
        "ring-buffer-snake-only",
        "hw/ring_buffer.py",
        "nxt.eq(ring_after(h.traj, c, p.chiplets, p.chiplet_bits, p.ring_table(0)[0])),",
        "nxt.eq(ring_after(h.traj, c, p.chiplets, p.chiplet_bits)),",
        "a station's next leg follows the chiplet numbers, not the ring path ([D17])",
        DATAPATH,
    ),
    M(
        "matcher-snake-only",
        "hw/matcher.py",
        "ring_next_hops(self.traj, C, Cb, self.p.ring_table(0)[0])",
        "ring_next_hops(self.traj, C, Cb)",
        "the matcher's next-hop tables follow the chiplet numbers, not the ring path ([D17])",
        RTL,
    ),
    M(
        "matcher-highest",
        "hw/matcher.py",
        "self.entry.eq(lowest_bit(free, C, Cb)),",
        "self.entry.eq(C - 1 - lowest_bit(free[::-1], C, Cb)),",
        "E-C matcher picks the highest idle chiplet, not the lowest",
        RTL,
    ),
    M(
        "eit-merged-wrap",
        "hw/eit.py",
        "new_total.eq(Mux(full | total_full, w_total, w_total + 1)),",
        "new_total.eq(w_total + 1),",
        "EIT merged count wraps instead of saturating",
        RTL,
    ),
    M(
        "sorter-stage-dropped",
        "sw/sorter.py",
        "    return Network(kind, lanes, steps)",
        "    return Network(kind, lanes, steps[:-1])",
        "the sorter network (RTL and its description) loses its last step",
        RTL,
    ),
    M(
        "defer-merge-short",
        "hw/scheduler.py",
        "(addr == eit.words + 1)",
        "(addr == eit.words - 1)",
        "deferral re-merge stops one word early",
        RTL,
    ),
    M(
        "preload-entry",
        "hw/scheduler.py",
        "load_beat(BeatKind.PRELOAD, matcher.first)",
        "load_beat(BeatKind.PRELOAD, matcher.entry)",
        "pre-load beat names the entry chiplet instead of the partner's first",
        RTL,
    ),
    M(
        "ddr-gap-rtl",
        "hw/ddr_ctrl.py",
        "m.d.sync += gaps[ch].eq(p.ddr_interval - 1)",
        "m.d.sync += gaps[ch].eq(p.ddr_interval)",
        "datapath RTL: DDR issue interval one cycle long",
        DATAPATH,
    ),
    M(
        "state-resv-ignored-rtl",
        "hw/router.py",
        "ok = self.admit.bit_select(r, 1) & (",
        "ok = self.admit.bit_select(r, 1) | (",
        "datapath RTL [D16, D19]: a link arrival ignores the DDR load reserved in its chiplet "
        "this cycle",
        DATAPATH,
    ),
    M(
        "count-resv-ignored-rtl",
        "hw/router.py",
        "ok = Mux(self.resv, r + 1 < self.free, r < self.free)",
        "ok = r < self.free",
        "datapath RTL [D4, D19]: forward-count admission of a link arrival ignores the DDR "
        "load reserved in its chiplet this cycle",
        DATAPATH,
    ),
    M(
        "state-slack-off-by-one-rtl",
        "hw/ring_buffer.py",
        "n0.eq(ok0 & (at_least + 1 + i <= K)),",
        "n0.eq(ok0 & (at_least + 1 + i <= K + 1)),",
        "datapath RTL [D16]: forward-state admission leaves one slot too few",
        DATAPATH,
    ),
    M(
        "state-unhold-keeps-claim-rtl",
        "hw/ring_buffer.py",
        "m.d.sync += claim[i].eq(hops[i])",
        "m.d.sync += claim[i].eq(claim[i])",
        "datapath RTL [D16]: an un-held pre-load keeps claiming H + 1",
        DATAPATH,
    ),
    M(
        "slices-ignored-rtl",
        "hw/ddr_ctrl.py",
        "b_count = slc[b.expert]",
        "b_count = Const(M, ld_bits)",
        "datapath RTL: the slice table is written but every expert streams M micro-slices",
        DATAPATH,
    ),
    M(
        "preload-count-golden",
        "sw/streaming/ddr.py",
        "loaded, count = q.loaded, q.count",
        "loaded = q.loaded",
        "golden model: a dispatch that takes over a pre-load uses the table, not the "
        "pre-load's count",
        DATAPATH,
    ),
    M(
        "pe-time-rtl",
        "hw/chiplet.py",
        "return Mux(count == 0, 1, count) * p.cycles_per_token",
        "return count * p.cycles_per_token",
        "datapath RTL: a chiplet with no tokens of the expert takes 0 cycles, not 1",
        DATAPATH,
    ),
    M(
        "wait-never-drains",
        "hw/scheduler.py",
        "with m.If((nsched == n) & ~matcher.running.any()):",
        "with m.If((nsched == n + 1) & ~matcher.running.any()):",
        "the scheduler never leaves WAIT (a round that never ends must fail, not hang)",
        RTL,
    ),
    M(
        "pairing-lone",
        "hw/pairing.py",
        "self.partner_valid.eq((self.index < n) & (other != self.index)),",
        "self.partner_valid.eq(self.index < n),",
        "the lone middle expert of an odd n is its own partner",
        RTL,
    ),
    M(
        "tb-threshold-rtl",
        "hw/token_buffer.py",
        "refill = c >= p.n_threshold",
        "refill = c > p.n_threshold",
        "token buffer RTL refills T_QoS one round late",
        RTL,
    ),
    M(
        "sorter-tie-order",
        "hw/sorter.py",
        "return Cat(~x.id, x.count) > Cat(~y.id, y.count)",
        "return Cat(x.id, x.count) > Cat(y.id, y.count)",
        "sorter breaks count ties by the higher id",
        RTL,
    ),
    # -- golden models ---------------------------------------------------------------------
    M(
        "tb-cfw-golden",
        "sw/token_buffer.py",
        "                t -= 1\n                c = 0\n",
        "                t -= 1\n",
        "golden token buffer keeps C_fw on a deferral",
        GOLDEN,
        RTL,
    ),
    M(
        "tb-threshold",
        "sw/token_buffer.py",
        "if c >= p.n_threshold:",
        "if c > p.n_threshold:",
        "T_QoS refill one round late",
        GOLDEN,
        RTL,
    ),
    M(
        "partner-off",
        "sw/pairing.py",
        "other = position ^ 1",
        "other = position + 1",
        "pairing partner off by one",
        GOLDEN,
        RTL,
    ),
    M(
        "icv-golden-order",
        "sw/icv.py",
        "self.value = ((self.value | release) & ~alloc) & self.full",
        "self.value = ((self.value & ~alloc) | release) & self.full",
        "golden ICV: a release wins over an allocation",
        GOLDEN,
        RTL,
    ),
    M(
        "eit-golden-wrap",
        "sw/eit.py",
        "            if count[r][e] == cmax:",
        "            if count[r][e] > cmax:",
        "golden EIT count passes its width",
        GOLDEN,
        RTL,
    ),
    M(
        "release-keeps",
        "sw/matcher.py",
        "    return finished & ~keep",
        "    return finished",
        "golden matcher releases chiplets another running expert still holds",
        GOLDEN,
        RTL,
    ),
    M(
        "ring-skip",
        "fsedp/params.py",
        "m = seq[(q + s) % n]",
        "m = seq[(q + s + 1) % n]",
        "golden next_hop skips a chiplet of the trajectory",
        GOLDEN,
        RTL,
    ),
    M(
        "ddr-interval",
        "sw/streaming/ddr.py",
        "arr.gaps[ch] = p.ddr_interval - 1",
        "arr.gaps[ch] = p.ddr_interval",
        "DDR issue interval one cycle long",
        STREAM,
    ),
    M(
        "compute-time",
        "sw/streaming/compute.py",
        "return s.rem or max(1, arr.tokens[c][s.expert]) * arr.p.cycles_per_token",
        "return s.rem or max(1, arr.tokens[c][s.expert]) * arr.p.cycles_per_token + 1",
        "computation one cycle long",
        STREAM,
    ),
    M(
        "preload-target",
        "sw/streaming/ddr.py",
        'issues.append(("pre", k, q.chiplet, q.expert, q.traj, q.loaded, q.chiplet))',
        'issues.append(("pre", k, q.chiplet, q.expert, q.traj, q.loaded, '
        "(q.traj & -q.traj).bit_length() - 1))",
        "Rule 4 pre-load sent to the trajectory's first chiplet, not the named one",
        STREAM,
    ),
    M(
        "ahead-off-trajectory",
        "sw/streaming/ddr.py",
        "(c, p.path_hops(traj, c, o)) if traj >> c & 1 else p.remote_entry(traj, c, o)",
        "(c, p.path_hops(traj, c, o))",
        "golden model: a micro-slice loaded ahead off its expert's trajectory binds as if "
        "it were on it (computed where the expert has no tokens)",
        STREAM,
    ),
    # -- forward-state admission [D16] and the column embeddings ----------------
    M(
        "state-admission-no-self",
        "sw/streaming/ring_buffer.py",
        "return self.fits(c, r, 1)",
        "return self.fits(c, r, 0)",
        "forward-state admission forgets the arriving micro-slice: one slot too many admitted",
        STREAM,
    ),
    M(
        "state-load-rung-golden",
        "sw/streaming/ring_buffer.py",
        "self.fits(c, min(r, self.top - 2), 2)",
        "self.fits(c, min(r, self.top - 2), 1)",
        "golden model [D20]: a DDR load no longer leaves the rung below it to the ring",
        STREAM,
    ),
    M(
        "state-load-rung-compiled",
        "sim/fast_kernel.py",
        "room_fits(P, CLM, c, min(r, P[P_H] - 1), 2)",
        "room_fits(P, CLM, c, min(r, P[P_H] - 1), 1)",
        "compiled engine [D20]: a DDR load no longer leaves the rung below it to the ring",
        FAST,
    ),
    M(
        "state-load-rung-rtl",
        "hw/chiplet.py",
        "self.admit.eq(buf.admit_load),",
        "self.admit.eq(buf.admit),",
        "datapath RTL [D20]: the DDR controller admits loads on the arrivals' vector",
        DATAPATH,
    ),
    M(
        "state-admission-compiled",
        "sim/fast_kernel.py",
        "if i <= r and above + new + i > P[P_K]:",
        "if i < r and above + new + i > P[P_K]:",
        "compiled forward-state admission skips the check at i = r",
        FAST,
    ),
    M(
        "unhold-keeps-claim",
        "sw/streaming/ddr.py",
        """                    s.held = False
                    s.claim = s.r""",
        """                    s.held = False""",
        "an un-held pre-load keeps claiming H + 1 under forward-state admission",
        STREAM,
    ),
    M(
        "column-snake-up",
        "fsedp/params.py",
        "col = [(r if k % 2 == 0 else rows - 1 - r, k) for k in range(cols) for r in range(rows)]",
        "col = [(r, k) for k in range(cols) for r in range(rows)]",
        "the column snake runs every column downwards (legs back to the top)",
        STREAM,
    ),
    # -- derived values a rounding or an index could slip (a held-out check) ---------------------
    M(
        "ddr-bound-floor",
        "sim/baselines.py",
        "ddr = math.ceil(moved * dp.ddr_interval / n)",
        "ddr = moved * dp.ddr_interval // n",
        "the DDR lower bound rounded down: a bound no schedule can meet",
        SIM,
    ),
    M(
        "jsonl-positions-global",
        "fsedp/trace/io.py",
        "position = meta[:, 0, 1] if (has[:, 0] & 2).all() else _positions(request)",
        "position = meta[:, 0, 1] if (has[:, 0] & 2).all() else np.arange(len(request))",
        "a JSON-lines trace without positions: positions counted over the file, not per request",
        TRACE,
    ),
    M(
        "ahead-off-trajectory-compiled",
        "sim/fast_kernel.py",
        "dest, r = rdest[c], rhops[c]",
        "dest, r = c, hops[c]",
        "compiled engine: a micro-slice loaded ahead off its expert's trajectory binds as if "
        "it were on it",
        FAST,
    ),
    M(
        "ahead-released-at-preload-compiled",
        "sim/fast_kernel.py",
        "got = ddr_bind_ahead(P, DIRT, RO, RG, SL, expert, traj, 1, QH[k], QRD[k], tmp)",
        "got = ddr_bind_ahead(P, DIRT, RO, RG, SL, expert, traj, 0, QH[k], QRD[k], tmp)",
        "compiled engine: micro-slices loaded ahead released at a PRELOAD beat instead of "
        "held (ran forever before the progress watchdog; now stops as SimulationStalled)",
        FAST,
    ),
    # -- A8's token spreading (sim/regions.py) -------------------------------------------
    M(
        "spread-remainder-by-id",
        "sim/regions.py",
        "extra = sorted(h, key=lambda c: (-short[c], -h[c], c))[:rest]",
        "extra = sorted(h)[:rest]",
        "A8 spreading: an expert's remainder tokens to its lowest-numbered chiplets, not to "
        "those still short of their own totals (the chiplets' totals drift apart)",
        REGIONS,
    ),
]


def package_view(dest: Path):
    """The sources as the installed package lays them out, plus tests and pyproject."""
    for src, rel in PACKAGE_DIRS.items():
        shutil.copytree(
            ROOT / src,
            dest / rel,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            dirs_exist_ok=True,
        )
    shutil.copytree(ROOT / "tests", dest / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


def view_path(dest: Path, path: str) -> Path:
    top, _, rest = path.partition("/")
    return dest / PACKAGE_DIRS[top] / rest


def run_tests(dest: Path, tests, timeout: float) -> tuple[str, float, str]:
    """``("pass"|"fail"|"hang", seconds, last lines)`` of the fast tests in ``dest``."""
    env = {**os.environ, "PYTHONPATH": str(dest), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "not slow and not cocotb_tier",
    ]
    t0 = time.time()
    try:
        proc = subprocess.run(
            cmd + list(tests), cwd=dest, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return "hang", time.time() - t0, f"no result after {timeout:.0f} s"
    tail = "\n".join(proc.stdout.strip().splitlines()[-3:])
    return ("pass" if proc.returncode == 0 else "fail"), time.time() - t0, tail


def check(m: Mutant, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"mutant-{m.name}-") as tmp:
        dest = Path(tmp)
        package_view(dest)
        target = view_path(dest, m.path)
        text = target.read_text()
        if text.count(m.old) != 1:
            return {
                "mutant": m.name,
                "result": "stale",
                "what": m.what,
                "seconds": 0,
                "detail": f"{m.path}: the text to mutate occurs {text.count(m.old)} times",
            }
        target.write_text(text.replace(m.old, m.new))
        status, secs, tail = run_tests(dest, m.tests, timeout)
    result = {"pass": "survived", "fail": "killed", "hang": "hang"}[status]
    failed = [ln.split()[1] for ln in tail.splitlines() if ln.startswith("FAILED ")]
    return {
        "mutant": m.name,
        "result": result,
        "what": m.what,
        "seconds": round(secs, 1),
        "tests": list(m.tests),
        "killed_by": failed[0] if failed else None,
        "detail": tail,
    }


def campaign_table(results: list, counts: dict, argv: list, jobs: int, seconds: float, base: float):
    """The Markdown of a run: the command and its totals, then a row per mutant."""
    cmd = " ".join(["python scripts/mutate.py", *argv])
    lines = [
        f"`{cmd}` ({jobs} jobs, {time.strftime('%Y-%m-%d')}): **{counts['killed']} of "
        f"{len(results)} killed**, {counts['survived']} survived, {counts['hang']} hung, "
        f"{counts['stale']} stale; {seconds:.0f} s in all (the unmutated baseline: {base:.0f} s). "
        "A row's seconds include the tests that run before the killing one under `-x`.",
        "",
        "| mutant | the bug | result | killed by | s |",
        "|---|---|---|---|---:|",
    ]
    for r in results:
        by = f"`{r['killed_by']}`" if r.get("killed_by") else "-"
        lines.append(f"| `{r['mutant']}` | {r['what']} | {r['result']} | {by} | {r['seconds']} |")
    return "\n".join(lines)


def write_doc(path: Path, table: str):
    """Replace the body of the block :data:`BLOCK` of ``path`` with ``table`` (the page
    written all at once; a page without the block is an ``InputError``, left as it was)."""
    from fsedp.experiments.results import replace_block
    from fsedp.files import read_text, write_text

    write_text(path, replace_block(read_text(path), BLOCK, f"\n{table}\n\n", path))


def doc_problem(doc, block: str) -> str | None:
    """Why ``doc`` cannot take the generated block ``block`` (no such page, no such block,
    a marker out of place), or ``None``."""
    from fsedp.errors import InputError
    from fsedp.experiments.results import find_blocks
    from fsedp.files import read_text

    try:
        if block not in [b.name for b in find_blocks(read_text(doc), doc)]:
            raise InputError(doc, "<blocks>", f"no block {block!r}")
    except InputError as e:
        return str(e)
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", help="run this mutant (repeatable)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900, help="seconds before a run is a hang")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--doc", help="rewrite the campaign table of this Markdown file")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    if args.doc:
        problem = doc_problem(args.doc, BLOCK)  # before a run of many minutes
        if problem:
            print(f"mutate.py: {problem}")
            return 2
        if args.only:
            print(f"mutate.py: --doc {args.doc}: the table is a run of every mutant (no --only)")
            return 2
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list or not chosen:
        for m in MUTANTS:
            print(f"{m.name:20} {m.path:26} {m.what}")
        return 0 if args.list else 2
    t0 = time.time()
    # the unmutated sources must pass the same tests, or every "kill" means nothing
    with tempfile.TemporaryDirectory(prefix="mutant-baseline-") as tmp:
        package_view(Path(tmp))
        tests = sorted({t for m in chosen for t in m.tests})
        status, secs, tail = run_tests(Path(tmp), tests, args.timeout * 2)
    base = secs
    print(f"baseline ({len(tests)} test files): {status} in {secs:.0f} s", flush=True)
    if status != "pass":
        print(tail)
        return 2
    results = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for r in pool.map(lambda m: check(m, args.timeout), chosen):
            results.append(r)
            by = f"\n{'':10}killed by {r['killed_by']}" if r.get("killed_by") else ""
            print(
                f"{r['result']:9} {r['mutant']:20} {r['seconds']:6.1f} s  {r['what']}{by}",
                flush=True,
            )
    counts = {
        k: sum(r["result"] == k for r in results) for k in ("killed", "survived", "hang", "stale")
    }
    print(
        f"{counts['killed']}/{len(results)} killed, {counts['survived']} survived, "
        f"{counts['hang']} hung, {counts['stale']} stale; {time.time() - t0:.0f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, **counts}, indent=1))
    if args.doc:
        table = campaign_table(results, counts, argv, args.jobs, time.time() - t0, base)
        write_doc(Path(args.doc), table)
    return 0 if counts["killed"] == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
