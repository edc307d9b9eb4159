"""``fsedp rtl synth``: the blocks synthesised to a real standard-cell library and timed.

For each top: its Verilog (:func:`fsedp.hw.generate.write_verilog`), Debian's Yosys
(``synth``, ``dfflibmap``, then ABC mapping the logic to the Liberty's cells against the
clock period, buffering high-fanout nets and sizing gates: :data:`ABC_SCRIPT`), the mapped
netlist, then OpenSTA on that netlist with the same Liberty and a clock at the asked
frequency: area (the Liberty's cell areas), cells by kind, flip-flops, the critical path,
the worst and total negative slack, and OpenSTA's vectorless power estimate.  The
library's FO4 delay is measured once per run, with OpenSTA on a generated inverter chain
(:func:`fo4_netlist`), so that a critical path also reads in FO4.

The Liberty comes from the user only (``--liberty``); :func:`read_liberty` checks it and
reads what the flow needs of it (cell areas and pins, units, which cells are special).
The command-line module (:mod:`fsedp.cli.rtl`) checks the options and calls :func:`run`;
the flow and its choices are described in ``docs/rtl-synthesis.md``."""

import contextlib
import dataclasses
import math
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fsedp import jsondoc
from fsedp.errors import InputError
from fsedp.files import LIMITS, open_input, output_dir
from fsedp.hw.generate import (
    BLOCKS,
    DATAPATH_BLOCKS,
    TOPS,
    tool_stopped,
    top_name,
    top_params,
    write_verilog,
)
from fsedp.log import logger

__all__ = [
    "DEFAULT_TOPS",
    "TOPS",
    "CLOCK_MHZ",
    "CLOCK_RANGE_MHZ",
    "TOOLS",
    "MAX_LIBERTY_BYTES",
    "SPECIAL",
    "LibertyPin",
    "LibertyCell",
    "Liberty",
    "read_liberty",
    "missing_tools",
    "ABC_SCRIPT",
    "abc_script",
    "abc_constraints",
    "WORK_FILES",
    "FO4_STAGES",
    "FO4_TAPS",
    "yosys_script",
    "sta_script",
    "fo4_netlist",
    "measure_fo4",
    "synthesize",
    "run",
    "format_report",
]

_log = logger("synth")

#: Every top the command synthesises: the scheduler's blocks (generics
#: :class:`~fsedp.params.SchedulerParams`) and the datapath's (:class:`DatapathParams`).
#: Without ``--top``: every scheduler block, the scheduler itself, and one chiplet's
#: datapath blocks and the chiplet (the whole mesh, ``chiplet_array``, only when named).
DEFAULT_TOPS = (*BLOCKS, *(b for b in DATAPATH_BLOCKS if b != "chiplet_array"))
#: The clock of a run without ``--clock-mhz`` (the embedded hardware config's clock).
CLOCK_MHZ = 800.0
#: The FO4 delay assumed for 28 nm, the technology of the paper's synthesized scheduler
#: (UMC 28 nm): the rule of thumb of 500 ps per um of drawn gate length (worst case; Ho,
#: Mai and Horowitz, "The Future of Wires", Proc. IEEE 89(4), 2001) gives 14 ps, scaled by
#: 1.08, the ratio of SKY130 HD's measured FO4 (80.9 ps, typical corner) to the same rule at
#: its 0.15 um (75 ps).  A path meets a clock "at 28 nm" when its cycle -- arrival plus the
#: capturing flip-flop's setup (or the output delay), in FO4 of the library it was mapped
#: to -- fits the period in 28-nm FO4: at 800 MHz, 1250 / 15.1 = 82.8 FO4
#: (``docs/rtl-synthesis.md``).
FO4_28NM_PS = 15.1
#: Clock frequencies ``--clock-mhz`` takes.
CLOCK_RANGE_MHZ = (1.0, 5000.0)
#: The tools the flow runs and the Debian package of each.
TOOLS = {"yosys": "yosys", "sta": "opensta"}
#: Largest Liberty file read (the SKY130 HD typical corner is 9 MB; CCS libraries reach
#: hundreds of MB).
MAX_LIBERTY_BYTES = LIMITS["liberty"]

#: Cells kept out of the mapping, by the attribute of the Liberty that makes them special
#: purpose: they stay in the library that area and timing are computed with, but ABC and
#: ``dfflibmap`` read a copy in which they carry ``dont_use : true`` (Yosys 0.23's ``abc``
#: has no ``-dont_use``).  SKY130 HD's ``lpflow_*`` cells (isolation, level shifters, the
#: always-on ``kapwr`` buffers) are these.
SPECIAL = {
    "dont_use": "marked dont_use",
    "is_isolation_cell": "isolation cell",
    "is_level_shifter": "level shifter",
    "always_on": "always-on cell",
    "backup_power": "has a backup-power pin",
}

#: ABC's mapping (``{D}``: the clock period in ps).  The default liberty script of Yosys
#: without its retiming (Yosys hands ABC the combinational logic only, the flip-flops are
#: mapped by ``dfflibmap``), then delay-targeted mapping, buffering, up- and down-sizing.
#: ``buffer -p`` buffers the primary inputs too, which are the flip-flop outputs and the
#: top's inputs: with the driving cell of :func:`abc_constraints` ABC sizes and buffers
#: them as it does every gate, without one it leaves them alone.  ``-N 4``: at ABC's
#: default fanout of ten ``buffer`` strings a net's sinks along a chain of buffers, each
#: driving nine sinks and the next (22 buffers, 4.6 ns, on the 64-expert EIT's read
#: address); at four the chains are a few buffers deep (``docs/rtl-synthesis.md``).
ABC_SCRIPT = (
    "strash; &get -n; &fraig -x; &put; dc2; strash; &get -n; &dch -f; &nf -D {D}; &put; "
    "topo; buffer -p -N 4; upsize -D {D}; dnsize -D {D}; stime -p"
)

#: Inverters of the FO4 chain: stages driving 1 + 3 loads each, and where the delay is
#: read (its first stages are driven by an ideal input and are left out).
FO4_STAGES = 14
FO4_TAPS = (3, 11)


# -- the Liberty ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LibertyPin:
    name: str
    direction: str
    function: str | None = None
    capacitance: float | None = None


@dataclass(frozen=True)
class LibertyCell:
    name: str
    area: float
    #: a flip-flop or a latch (``ff``, ``latch`` or ``statetable`` group)
    sequential: bool
    #: why ABC must not use it (:data:`SPECIAL`), ``None`` for an ordinary cell
    special: str | None
    pins: dict = field(default_factory=dict)
    #: the ``ff`` or ``latch`` group: ``kind``, ``vars`` (its two state variables) and its
    #: attributes (``clocked_on``, ``next_state``, ``enable``, ``data_in``, ``clear``, ...)
    state: dict | None = field(default=None, compare=False)

    def inputs(self) -> list:
        return [p for p in self.pins.values() if p.direction == "input"]

    def outputs(self) -> list:
        return [p for p in self.pins.values() if p.direction == "output"]

    def is_inverter(self) -> bool:
        ins, outs = self.inputs(), self.outputs()
        if self.sequential or len(ins) != 1 or len(outs) != 1 or not outs[0].function:
            return False
        f = outs[0].function.replace(" ", "").strip('"')
        a = re.escape(ins[0].name)
        return re.fullmatch(rf"\(?(!{a}|{a}')\)?", f) is not None


@dataclass
class Liberty:
    """What the flow reads of a Liberty library."""

    path: Path
    name: str
    #: one time unit of the library, in ps; one capacitance unit, in fF
    time_unit_ps: float
    cap_unit_ff: float
    cells: dict
    #: the text without comments, and where each cell's group opens (after its ``{``)
    text: str = field(repr=False)
    cell_open: dict = field(repr=False)

    def inverter(self) -> LibertyCell:
        """The smallest inverter (area, then input capacitance): the FO4 stage and the
        driver assumed at every input of a top."""
        invs = [c for c in self.cells.values() if c.is_inverter() and not c.special]
        return min(invs, key=lambda c: (c.area, c.inputs()[0].capacitance or 0.0, c.name))

    def special(self) -> dict:
        """The cells kept out of the mapping and why (:data:`SPECIAL`)."""
        return {n: c.special for n, c in self.cells.items() if c.special}

    def mapping_text(self) -> str:
        """The library ABC and ``dfflibmap`` read: this one, its special cells marked
        ``dont_use``."""
        cuts = sorted(self.cell_open[n] for n, c in self.cells.items() if c.special)
        parts, last = [], 0
        for at in cuts:
            parts += [self.text[last:at], "\n    dont_use : true;"]
            last = at
        return "".join(parts) + self.text[last:]


_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_TOKEN = re.compile(
    r"(?P<open>[A-Za-z_][\w.]*)\s*\((?P<args>[^(){};]*)\)\s*\{"
    r"|(?P<close>\})"
    r'|(?P<attr>[A-Za-z_][\w.]*)\s*:\s*(?P<value>"[^"]*"|[^;{}"\n]*?)\s*;'
    r'|"[^"]*"'  # a string of a table (values, index_1): skipped whole
)
_LIBRARY = re.compile(r"\s*library\s*\(\s*\"?([^\")]*)\"?\s*\)\s*\{")
_TIME = {"1ps": 1.0, "10ps": 10.0, "100ps": 100.0, "1ns": 1000.0, "10ns": 1e4, "100ns": 1e5}
_CAP = {"ff": 1.0, "pf": 1000.0}


def _uncomment(text: str) -> str:
    """``text`` with its comments blanked (offsets kept)."""
    return _COMMENT.sub(lambda m: " " * (m.end() - m.start()), text)


#: bytes of a Liberty file read first, to refuse most files that are not one at once
_HEAD = 1 << 16
_NOT_LIBERTY = "not a Liberty library: it does not begin with 'library (NAME) {'"


def _head_decides(head: str, whole: bool) -> bool:
    """Whether the uncommented ``head`` of a file (``whole``: all of it) tells that the file
    does not begin with ``library (NAME) {``: not when the file goes on and its head is
    blank, an unclosed comment, or ends within 1 KiB of its first word (a header the head's
    end may cut)."""
    if whole:
        return True
    rest = head.lstrip()
    return not rest.startswith("/*") and len(rest) > 1024


def _fail(path, reason: str) -> InputError:
    return InputError(str(path), "<liberty>", reason)


def read_liberty(path) -> Liberty:
    """The Liberty library at ``path``, or an :class:`~fsedp.errors.InputError` (file
    ``path``, field ``<liberty>``) when it cannot be read or is not a usable Liberty
    library: no ``library (NAME) {`` group, unbalanced braces, no cell with an area, no
    inverter (the FO4 stage) or no flip-flop."""
    path = Path(path)
    try:
        with open_input(path, "liberty", "<liberty>") as f:
            raw = f.read(_HEAD)  # the head first: most files that are not one stop here
            if b"\0" in raw:
                raise _fail(path, "a binary file, not a Liberty library (text)")
            start = _uncomment(raw.decode("latin-1"))
            if _LIBRARY.match(start) is None and _head_decides(start, len(raw) < _HEAD):
                raise _fail(path, _NOT_LIBERTY)
            raw += f.read(MAX_LIBERTY_BYTES)
    except OSError as e:
        raise _fail(path, f"cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_LIBERTY_BYTES:
        raise _fail(path, f"larger than {MAX_LIBERTY_BYTES} bytes")
    text = _uncomment(raw.decode("latin-1"))
    head = _LIBRARY.match(text)
    if head is None:
        raise _fail(path, _NOT_LIBERTY)
    lib_attrs, cells, cell_open = {}, {}, {}
    stack: list[tuple[str, str]] = []
    cur: dict | None = None  # the cell being read
    pin: dict | None = None
    for m in _TOKEN.finditer(text):
        if m["open"]:
            name, args = m["open"], m["args"].strip().strip('"')
            stack.append((name, args))
            if len(stack) == 2 and name == "cell":
                cur = {"name": args, "attrs": {}, "pins": {}, "seq": False, "special": None}
                cell_open[args] = m.end()
            elif cur is not None and len(stack) >= 3:
                if name in ("ff", "latch", "statetable", "ff_bank", "latch_bank"):
                    cur["seq"] = True
                    if name in ("ff", "latch") and len(stack) == 3:
                        names = [v.strip().strip('"') for v in args.split(",")]
                        cur["state"] = {"kind": name, "vars": names}
                elif name == "pin" and all(g != "test_cell" for g, _ in stack[2:-1]):
                    # a test_cell's pins describe the scan model, not the cell's own pins
                    pin = {"name": args}
                    cur["pins"][args] = pin
        elif m["close"]:
            if not stack:
                raise _fail(path, f"unbalanced braces: a '}}' at offset {m.start()} closes nothing")
            name, _ = stack.pop()
            if len(stack) == 1 and name == "cell" and cur is not None:
                cells[cur["name"]] = cur
                cur = None
            elif name == "pin":
                pin = None
        elif m["attr"]:
            key, value = m["attr"], m["value"].strip().strip('"')
            depth = len(stack)
            if depth == 1:
                lib_attrs[key] = value
            elif cur is not None and depth >= 2:
                if key in SPECIAL and value.lower() == "true" and not cur["special"]:
                    cur["special"] = SPECIAL[key]
                elif key == "pg_type" and value == "backup_power" and not cur["special"]:
                    cur["special"] = SPECIAL["backup_power"]
                elif depth == 2 and key == "area":
                    cur["attrs"]["area"] = value
                elif pin is not None and stack[-1][0] == "pin":
                    pin[key] = value
                elif len(stack) == 3 and stack[-1][0] in ("ff", "latch") and cur.get("state"):
                    cur["state"][key] = value
    if stack:
        raise _fail(path, f"unbalanced braces: the {stack[-1][0]} group is never closed")
    lib = Liberty(
        path=path,
        name=head[1].strip(),
        time_unit_ps=_unit(path, lib_attrs.get("time_unit", "1ns"), _TIME, "time_unit"),
        cap_unit_ff=_cap_unit(path, text),
        cells={},
        text=text,
        cell_open=cell_open,
    )
    for name, c in cells.items():
        try:
            area = float(c["attrs"].get("area", "nan"))
        except ValueError:
            raise _fail(path, f"cell {name}: area {c['attrs']['area']!r} is not a number") from None
        pins = {}
        for pname, p in c["pins"].items():
            try:
                cap = float(p["capacitance"]) if "capacitance" in p else None
            except ValueError:
                cap = None
            pins[pname] = LibertyPin(pname, p.get("direction", ""), p.get("function"), cap)
        if math.isfinite(area):
            lib.cells[name] = LibertyCell(name, area, c["seq"], c["special"], pins, c.get("state"))
    if not lib.cells:
        raise _fail(path, "not a Liberty library: it has no cell with an area")
    if not any(c.is_inverter() and not c.special for c in lib.cells.values()):
        raise _fail(path, "has no inverter (a cell with one input A and the function !A)")
    if not any(c.sequential and not c.special for c in lib.cells.values()):
        raise _fail(path, "has no flip-flop (a cell with an ff group)")
    return lib


def _unit(path, text: str, table: dict, what: str) -> float:
    key = text.replace(" ", "").lower()
    if key not in table:
        raise _fail(path, f"{what} {text!r} is not one of {', '.join(table)}")
    return table[key]


def _cap_unit(path, text: str) -> float:
    """``capacitive_load_unit (N, pf|ff)`` in fF (1 pF without one)."""
    m = re.search(r"capacitive_load_unit\s*\(\s*([0-9.eE+-]+)\s*,\s*\"?(\w+)\"?\s*\)", text)
    if m is None:
        return 1000.0
    try:
        return float(m[1]) * _unit(path, m[2], _CAP, "capacitive_load_unit")
    except ValueError:
        raise _fail(path, f"capacitive_load_unit {m[0]!r} is not a number") from None


# -- the tools -------------------------------------------------------------------------------
def missing_tools() -> list[str]:
    """The tools of :data:`TOOLS` not on PATH, each with its Debian package."""
    return [f"{t} (Debian package {pkg})" for t, pkg in TOOLS.items() if not shutil.which(t)]


def _tool_versions() -> dict:
    out = {}
    for tool, flag in (("yosys", "-V"), ("sta", "-version")):
        proc = subprocess.run([shutil.which(tool), flag], capture_output=True, text=True)
        out[tool] = (proc.stdout.strip().splitlines() or ["?"])[0]
    return out


def abc_script(period_ps: float) -> str:
    """:data:`ABC_SCRIPT` at the clock period ``period_ps``."""
    return ABC_SCRIPT.replace("{D}", f"{period_ps:.0f}")


def abc_constraints(lib: Liberty) -> str:
    """ABC's constraints (``abc -constr``): every primary input driven by the library's
    smallest inverter, every primary output loaded by one of its inputs (fF)."""
    inv = lib.inverter()
    load = (inv.inputs()[0].capacitance or 0.0) * lib.cap_unit_ff
    return f"set_driving_cell {inv.name}\nset_load {load:.4f}\n"


def yosys_script(top: str, period_ps: float) -> str:
    """The Yosys script of one top, run in its work folder (:data:`WORK_FILES`): generic
    synthesis (memories as flip-flops, their bits counted first), the flip-flops mapped by
    ``dfflibmap``, the logic by ABC (:data:`ABC_SCRIPT`), the area from the library's cell
    areas, the mapped netlist written."""
    f = WORK_FILES
    return "\n".join(
        [
            f"read_verilog -sv {f['rtl']}",
            f"hierarchy -top {top}",
            "proc",
            "flatten",
            f"tee -q -o {f['pre_stat']} stat",
            f"synth -top {top} -flatten -noabc",
            f"dfflibmap -liberty {f['maplib']}",
            "opt_clean",
            f"abc -liberty {f['maplib']} -constr {f['constr']} -D {period_ps:.0f} "
            f"-script {f['abc']}",
            "setundef -zero",
            "opt_clean -purge",
            f"tee -q -o {f['stat']} stat -liberty {f['lib']}",
            f"write_verilog -noattr -noexpr -nohex -nodec {f['netlist']}",
            "",
        ]
    )


#: The files of a run's work folder, where Yosys and OpenSTA run: plain names, so that no
#: path of the user's (a folder with a space) reaches a tool's command language.
WORK_FILES = {
    "lib": "library.lib",  # a link to the user's Liberty
    "maplib": "mapping.lib",  # the library ABC and dfflibmap map to
    "constr": "abc.constr",
    "abc": "abc.script",
    "rtl": "rtl.v",
    "pre_stat": "pre.stat",
    "stat": "stat.txt",
    "netlist": "netlist.v",
    "yosys_log": "yosys.log",
    "sta": "sta.tcl",
    "sta_log": "sta.log",
}


def sta_script(
    lib: Liberty, top: str, period: float, clock: str | None, activity: str | None = None
) -> str:
    """OpenSTA's script of one mapped top (run in the work folder): a clock of ``period``
    (library time units) on the port ``clock`` (a virtual clock for a top without one),
    every other input arriving at the clock edge from the library's smallest inverter,
    every output due at the next edge with one inverter input as its load; then the worst
    path, the worst and total negative slack, the max-transition violations and the
    vectorless power; with ``activity`` (a script of recorded activities,
    :mod:`fsedp.experiments.activity`) the power again with those activities."""
    f = WORK_FILES
    inv = lib.inverter()
    out_pin = inv.outputs()[0].name
    load = inv.inputs()[0].capacitance or 0.0
    src = f"[get_ports {{{clock}}}]" if clock else ""
    others = f"[delete_from_list [all_inputs] {src}]" if clock else "[all_inputs]"
    return "\n".join(
        [
            f"read_liberty {f['lib']}",
            f"read_verilog {f['netlist']}",
            f"link_design {top}",
            f"create_clock -name clk -period {period:.6g} {src}",
            f"set ins {others}",
            "if {[llength $ins]} {",
            "  set_input_delay 0 -clock clk $ins",
            f"  set_driving_cell -lib_cell {inv.name} -pin {out_pin} $ins",
            "}",
            "if {[llength [all_outputs]]} {",
            "  set_output_delay 0 -clock clk [all_outputs]",
            f"  set_load {load:.6g} [all_outputs]",
            "}",
            'puts "@@ checks"',
            "report_checks -path_delay max -digits 4",
            'puts "@@ slack"',
            "report_worst_slack -digits 4",
            "report_tns -digits 4",
            'puts "@@ transition"',
            "report_check_types -max_transition -all_violators -digits 4",
            'puts "@@ power"',
            "report_power -digits 6",
            *(
                [f"source {activity}", 'puts "@@ activity_power"', "report_power -digits 6"]
                if activity
                else []
            ),
            'puts "@@ end"',
            "",
        ]
    )


def _run_tool(argv, work: Path, log: str) -> subprocess.CompletedProcess:
    """``argv`` run in ``work``, its output kept in ``work/log``; a tool a signal stopped
    (out of memory, a limit) is an :class:`~fsedp.errors.EnvironmentFailure`, not a top's
    error."""
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", cwd=work)
    (work / log).write_text(proc.stdout + proc.stderr)
    stopped = tool_stopped(Path(argv[0]).name, proc.returncode)  # (its work folder goes)
    if stopped:
        raise stopped
    return proc


def _sta_run(work: Path, script: str, log: str) -> tuple[str, str | None]:
    """OpenSTA on ``script`` in ``work``: its output and its first error line (``None``
    when it ran clean to the script's end)."""
    argv = [shutil.which("sta"), "-no_init", "-no_splash", "-exit", script]
    proc = _run_tool(argv, work, log)
    out = proc.stdout + proc.stderr
    errors = [x for x in out.splitlines() if x.startswith("Error")]
    if proc.returncode != 0 or errors or "@@ end" not in out:
        return out, f"sta: {(errors or out.strip().splitlines()[-1:] or ['failed'])[0]}"
    return out, None


def _sta(work: Path, script: str, log: str) -> str:
    """OpenSTA on ``script`` in ``work``; its output, or a RuntimeError with its first
    error line."""
    out, error = _sta_run(work, script, log)
    if error:
        raise RuntimeError(error)
    return out


# -- FO4 --------------------------------------------------------------------------------------
def fo4_netlist(inv: LibertyCell) -> str:
    """A chain of :data:`FO4_STAGES` inverters ``inv``, each driving the next and three
    more (fanout 4); the outputs ``tap_a`` and ``tap_b`` are the nets after the stages of
    :data:`FO4_TAPS`."""
    a, y = inv.inputs()[0].name, inv.outputs()[0].name
    taps = dict(zip(FO4_TAPS, ("tap_a", "tap_b"), strict=True))

    def net(i):
        return taps.get(i, f"n{i}")

    lines = ["module fo4_chain (in, tap_a, tap_b);", "  input in;", "  output tap_a;"]
    lines += ["  output tap_b;"]
    lines += [f"  wire {net(i)};" for i in range(FO4_STAGES) if i not in taps]
    lines += [f"  wire d{i}_{j};" for i in range(FO4_STAGES) for j in range(3)]
    for i in range(FO4_STAGES):
        src = "in" if i == 0 else net(i - 1)
        lines.append(f"  {inv.name} s{i} (.{a}({src}), .{y}({net(i)}));")
        lines += [f"  {inv.name} l{i}_{j} (.{a}({net(i)}), .{y}(d{i}_{j}));" for j in range(3)]
    return "\n".join([*lines, "endmodule", ""])


def measure_fo4(lib: Liberty, work: Path) -> dict:
    """The library's FO4 delay (ps): OpenSTA's delay of the inverter chain of
    :func:`fo4_netlist` between its two taps per stage, the paths to a rising and to a
    falling tap averaged (each crosses as many rising as falling stages).  Also the netlist
    and the report, for the output folder.  Run in ``work``, which holds the library as
    ``WORK_FILES['lib']``."""
    inv = lib.inverter()
    (work / "fo4_chain.v").write_text(fo4_netlist(inv))
    lines = [
        f"read_liberty {WORK_FILES['lib']}",
        "read_verilog fo4_chain.v",
        "link_design fo4_chain",
        "create_clock -name vclk -period 1000",
        "set_input_delay 0 -clock vclk [get_ports in]",
        "set_output_delay 0 -clock vclk [all_outputs]",
    ]
    for edge in ("rise", "fall"):
        for tap in ("tap_a", "tap_b"):
            lines += [f'puts "@@ {edge} {tap}"']
            lines += [f"report_checks -{edge}_to [get_ports {tap}] -digits 6"]
    (work / "fo4.tcl").write_text("\n".join([*lines, 'puts "@@ end"', ""]))
    out = _sta(work, "fo4.tcl", "fo4.log")
    arrival = {}
    for key, body in _sections(out).items():
        if key == "end":
            continue
        m = re.search(r"(-?[0-9.]+)\s+data arrival time", body)
        if m is None:
            raise RuntimeError(f"sta: no path to {key} in the FO4 chain")
        arrival[key] = float(m[1])
    stages = FO4_TAPS[1] - FO4_TAPS[0]
    per = [
        (arrival[f"{e} tap_b"] - arrival[f"{e} tap_a"]) / stages * lib.time_unit_ps
        for e in ("rise", "fall")
    ]
    return {
        "cell": inv.name,
        "fo4_ps": round(sum(per) / 2, 2),
        "stages": stages,
        "netlist": fo4_netlist(inv),
        "report": out,
    }


def _sections(out: str) -> dict:
    """The output of an STA script cut at its ``@@ name`` markers."""
    parts = re.split(r"^@@ (.*)$", out, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


# -- one top ---------------------------------------------------------------------------------
def _clock_port(netlist: str, top: str) -> str | None:
    m = re.search(rf"^module {re.escape(top)}\s*\(([^)]*)\)", netlist, re.M)
    ports = {p.strip() for p in (m[1].split(",") if m else [])}
    return "clk" if "clk" in ports else None


def _stat(text: str) -> dict:
    """Cells by kind, cell count, chip area and memory bits of a Yosys ``stat``."""
    cells = {
        name: int(n)
        for name, n in re.findall(r"^\s{5}(\S+)\s+(\d+)\s*$", text, re.M)
        if not name.startswith("Number")
    }
    area = re.search(r"Chip area for (?:module|top module) '[^']*':\s+([0-9.]+)", text)
    bits = re.search(r"Number of memory bits:\s+(\d+)", text)
    total = re.search(r"Number of cells:\s+(\d+)", text)
    return {
        "cells": cells,
        "cell_count": int(total[1]) if total else sum(cells.values()),
        "area_um2": float(area[1]) if area else None,
        "memory_bits": int(bits[1]) if bits else 0,
    }


def _max_fanout(netlist: str, lib: Liberty, clock: str | None) -> tuple[int, str | None]:
    """The largest number of cell inputs one net of the mapped netlist drives (the clock
    left out: it is ideal here, a clock tree is not built) and that net."""
    loads: dict[str, int] = {}
    for kind, body in re.findall(r"^\s*(\S+)\s+\S+\s*\((.*?)\);", netlist, re.M | re.S):
        cell = lib.cells.get(kind)
        if cell is None:
            continue
        for pin, net in re.findall(r"\.(\w+)\(([^()]*)\)", body):
            p = cell.pins.get(pin)
            net = net.strip()
            if p is not None and p.direction == "input" and net and "'" not in net:
                loads[net] = loads.get(net, 0) + 1
    loads.pop(clock or "", None)
    if not loads:
        return 0, None
    net = max(loads, key=loads.get)
    return loads[net], net


def _parse_sta(out: str, period: float, unit_ps: float) -> dict:
    """Critical path, slack, TNS, max-transition violations and power of
    :func:`sta_script`'s output (times in ns, power in mW)."""
    s = _sections(out)
    ns = unit_ps / 1000.0

    def num(pattern, text):
        m = re.search(pattern, text, re.M)
        return float(m[1]) if m else None

    checks = s.get("checks", "")
    arrival = num(r"^\s*(-?[0-9.]+)\s+data arrival time", checks)
    required = num(r"^\s*(-?[0-9.]+)\s+data required time", checks)
    slack = num(r"^\s*(-?[0-9.]+)\s+slack \(", checks)
    setup = num(r"^\s*(-?[0-9.]+)\s+-?[0-9.]+\s+library setup time", checks)
    out_delay = num(r"^\s*(-?[0-9.]+)\s+-?[0-9.]+\s+output external delay", checks)
    start = re.search(r"^Startpoint: (.*)$", checks, re.M)
    end = re.search(r"^Endpoint: (.*)$", checks, re.M)
    levels = len(re.findall(r"^\s*-?[0-9.]+\s+-?[0-9.]+ [v^] \S+/\S+ \(", checks, re.M))
    tr = s.get("transition", "")
    return {
        "period_ns": round(period * ns, 6),
        "arrival_ns": None if arrival is None else round(arrival * ns, 6),
        "required_ns": None if required is None else round(required * ns, 6),
        "setup_ns": None if setup is None else round(-setup * ns, 6),
        "output_delay_ns": None if out_delay is None else round(out_delay * ns, 6),
        "slack_ns": None if slack is None else round(slack * ns, 6),
        "worst_slack_ns": _scaled(num(r"^worst slack\s+(-?[0-9.]+)", s.get("slack", "")), ns),
        "tns_ns": _scaled(num(r"^tns\s+(-?[0-9.]+)", s.get("slack", "")), ns),
        "startpoint": start[1].strip() if start else None,
        "endpoint": end[1].strip() if end else None,
        "path_cells": levels,
        "max_transition_violations": len(re.findall(r"\(VIOLATED\)", tr)),
        "power_mw": _power(s.get("power", "")),
        **({"activity_power_mw": _power(s["activity_power"])} if "activity_power" in s else {}),
    }


def _power(text: str) -> dict | None:
    """The ``Total`` line of ``report_power``, in mW."""
    m = re.search(
        r"^Total\s+([0-9.eE+-]+)\s+([0-9.eE+-]+)\s+([0-9.eE+-]+)\s+([0-9.eE+-]+)", text, re.M
    )
    if m is None:
        return None
    return {
        k: float(f"{float(m[i]) * 1e3:.6g}")  # W -> mW, the digits STA gave
        for i, k in enumerate(("internal", "switching", "leakage", "total"), 1)
    }


def _scaled(x, k):
    return None if x is None else round(x * k, 6)


def synthesize(
    top: str,
    params,
    lib: Liberty,
    clock_mhz: float,
    work: Path,
    out: Path,
    activity: bool = False,
    fo4: dict | None = None,
) -> dict:
    """One top through the flow in the work folder ``work`` (which holds the library, the
    mapping library and ABC's constraints, :data:`WORK_FILES`): its Verilog, mapped netlist,
    Yosys statistics and STA report written into ``out``; its figures.  With ``activity``,
    a top with a bench of its own (:data:`fsedp.experiments.activity.BENCH_KNOBS`) also
    runs it on the mapped netlist under Verilator, and its power is reported again with the
    activity recorded there; with ``fo4`` (:func:`workspace`'s) its critical path in FO4
    too.  A tool that fails is the top's ``error``, not an exception."""
    f = WORK_FILES
    name = top_name(top)
    period_ps = 1e6 / clock_mhz
    period = period_ps / lib.time_unit_ps  # library time units
    rtl = write_verilog(top, params, out)
    res = {"top": top, "module": name, "params": dataclasses.asdict(params)}
    files = {"verilog": rtl.name, "netlist": f"{name}.netlist.v", "stat": f"{name}.stat.txt"}
    files["sta"] = f"{name}.sta.txt"
    res["files"] = files
    for key in ("pre_stat", "stat", "netlist"):
        (work / f[key]).unlink(missing_ok=True)  # the previous top's
    shutil.copyfile(rtl, work / f["rtl"])
    (work / f["abc"]).write_text(abc_script(period_ps) + "\n")
    (work / "synth.ys").write_text(yosys_script(name, period_ps))
    t0 = time.time()
    argv = [shutil.which("yosys"), "-q", "-l", f["yosys_log"], "-s", "synth.ys"]
    proc = _run_tool(argv, work, "yosys.out")
    res["synth_s"] = round(time.time() - t0, 1)
    if proc.returncode != 0 or not (work / f["netlist"]).exists():
        last = [x for x in (proc.stderr + proc.stdout).splitlines() if x.strip()]
        res["error"] = "yosys: " + (last[-1][:300] if last else f"exit {proc.returncode}")
        return res
    shutil.copyfile(work / f["netlist"], out / files["netlist"])
    shutil.copyfile(work / f["stat"], out / files["stat"])
    st = _stat((work / f["stat"]).read_text())
    st["memory_bits"] = _stat((work / f["pre_stat"]).read_text())["memory_bits"]
    res.update(st)
    res["flip_flops"] = sum(
        n for c, n in st["cells"].items() if c in lib.cells and lib.cells[c].sequential
    )
    unmapped = sorted(c for c in st["cells"] if c not in lib.cells)
    if unmapped:
        res["error"] = f"cells not mapped to the library: {', '.join(unmapped[:8])}"
        return res
    text = (work / f["netlist"]).read_text()
    clock = _clock_port(text, name)
    res["clock_port"] = clock
    res["max_fanout"], res["max_fanout_net"] = _max_fanout(text, lib, clock)
    script = None
    if activity:
        from fsedp.experiments import activity as act

        if top not in act.BENCH_KNOBS or clock is None:
            why = "no clock" if clock is None else "no bench of its own"
            res["activity"] = {"no_bench": True, "error": f"{why}: vectorless only"}
        else:
            t0 = time.time()
            try:
                rec = act.record(
                    top, params, lib, work / f["netlist"], name, clock, work / "gate-level"
                )
            except Exception as e:  # a build or simulator failure: the top's, reported
                res["activity"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            else:
                script = f"{name}.activity.tcl"
                (work / script).write_text(rec.pop("tcl"))
                shutil.copyfile(work / script, out / script)
                files["activity"] = script
                rec["seconds"] = round(time.time() - t0, 1)
                res["activity"] = rec
    (work / f["sta"]).write_text(sta_script(lib, name, period, clock, script))
    t0 = time.time()
    report, error = _sta_run(work, f["sta"], f["sta_log"])
    if error:  # the top fails; what STA did report is kept (a power error after the timing)
        res["error"] = error
        if "@@ checks" not in report:
            return res
    res["sta_s"] = round(time.time() - t0, 1)
    (out / files["sta"]).write_text(report)
    if script is not None:
        m = re.search(r"^@@ pins_set (\d+)$", report, re.M)
        res["activity"]["pins_set"] = int(m[1]) if m else 0
    res.update(_parse_sta(report, period, lib.time_unit_ps))
    if res.get("arrival_ns") is not None and (fo4 or {}).get("fo4_ps"):
        res["arrival_fo4"] = round(res["arrival_ns"] * 1000 / fo4["fo4_ps"], 1)
        if res.get("required_ns") is not None:
            cycle = res["arrival_ns"] + res["period_ns"] - res["required_ns"]
            res["cycle_fo4"] = round(cycle * 1000 / fo4["fo4_ps"], 1)
            res["budget_fo4_28nm"] = round(budget_fo4(clock_mhz), 1)
            res["meets_28nm"] = res["cycle_fo4"] <= res["budget_fo4_28nm"]
    return res


def budget_fo4(clock_mhz: float) -> float:
    """The clock period in FO4 delays of 28 nm (:data:`FO4_28NM_PS`)."""
    return 1e6 / clock_mhz / FO4_28NM_PS


# -- the run ---------------------------------------------------------------------------------
@contextlib.contextmanager
def workspace(lib: Liberty, say=lambda msg: None):
    """A temporary work folder for :func:`synthesize` (the library linked, the mapping
    library and ABC's constraints written, :data:`WORK_FILES`) and the library's FO4
    delay measured there (its chain and report left as ``fo4_chain.v``, ``fo4.sta.txt``):
    ``(work, fo4)``, ``fo4["fo4_ps"]`` None with an ``error`` where it failed (the tops
    are still measured; a run then fails)."""
    with tempfile.TemporaryDirectory(prefix="fsedp-synth-") as tmp:
        work = Path(tmp)
        f = WORK_FILES
        (work / f["lib"]).symlink_to(lib.path.resolve())
        if lib.special():
            (work / f["maplib"]).write_text(lib.mapping_text(), encoding="latin-1")
        else:
            (work / f["maplib"]).symlink_to(lib.path.resolve())
        (work / f["constr"]).write_text(abc_constraints(lib))
        say(f"measuring the FO4 delay of {lib.name} ...")
        try:
            fo4 = measure_fo4(lib, work)
            (work / "fo4_chain.v").write_text(fo4.pop("netlist"))
            (work / "fo4.sta.txt").write_text(fo4.pop("report"))
        except RuntimeError as e:
            fo4 = {"cell": lib.inverter().name, "fo4_ps": None, "error": str(e)}
            say(f"FO4: {e}")
        yield work, fo4


def run(
    tops,
    params,
    dp_params,
    lib: Liberty,
    clock_mhz: float,
    out,
    force: bool,
    command: str,
    quiet: bool = False,
    activity: bool = False,
):
    """``fsedp rtl synth``: each of ``tops`` (scheduler blocks at ``params``, datapath
    blocks at ``dp_params``) synthesised to ``lib`` at ``clock_mhz`` and timed, after the
    library's FO4 delay is measured; everything written into the folder ``out`` whole or
    not at all (:func:`~fsedp.files.output_dir`): per top the Verilog, the mapped netlist,
    Yosys' statistics and the STA report, and the report itself (``synth.md``,
    ``synth.json``); with ``activity`` the power also from activity recorded in a
    gate-level run of each top's bench (:func:`synthesize`).  ``(doc, text, ok)``: ok when
    every top went through (and, with ``activity``, its netlist passed its bench)."""
    say = (lambda msg: None) if quiet else _log.info
    versions = _tool_versions()
    special = lib.special()
    with workspace(lib, say) as (work, fo4), output_dir(out, force) as staged:
        for name in ("fo4_chain.v", "fo4.sta.txt"):
            if (work / name).exists():
                shutil.copyfile(work / name, staged / name)
        results = []
        for top in tops:
            p = top_params(top, params, dp_params)
            say(f"synthesising {top} ...")
            r = synthesize(top, p, lib, clock_mhz, work, staged, activity, fo4)
            if r.get("error"):
                say(f"{top}: {r['error']}")
            results.append(r)
        doc = {
            "command": command,
            "liberty": str(lib.path),
            "library": lib.name,
            "clock_mhz": clock_mhz,
            "period_ns": round(1000 / clock_mhz, 6),
            "fo4": fo4,
            "excluded_cells": special,
            "abc_script": abc_script(1e6 / clock_mhz),
            "tools": versions,
            "power": "vectorless (OpenSTA defaults: activity 0.1, duty 0.5 at the inputs)"
            + (
                "; and from activity recorded in a gate-level run of each top's bench"
                if activity
                else ""
            ),
            "params": dataclasses.asdict(params),
            "datapath_params": dataclasses.asdict(dp_params) if dp_params else None,
            "tops": results,
        }
        text = format_report(doc)
        (staged / "synth.json").write_text(jsondoc.dumps(doc, indent=1) + "\n")
        (staged / "synth.md").write_text(text + "\n")
    doc["out"] = str(out)
    ok = all(not r.get("error") and _netlist_passed(r) for r in results) and not fo4.get("error")
    return doc, text + f"\n\nwritten to {out}", ok


def _netlist_passed(r: dict) -> bool:
    """A top's gate-level run, where one was asked for and its top has a bench, passed
    (:func:`fsedp.experiments.activity.passed`)."""
    from fsedp.experiments import activity as act

    a = r.get("activity")
    return a is None or a.get("no_bench", False) or act.passed(a)


def _met(r: dict) -> str:
    m = r.get("meets_28nm")
    return "-" if m is None else "met" if m else "missed"


def _f(x, fmt="{:.3f}"):
    return "-" if x is None else fmt.format(x)


def format_report(doc: dict) -> str:
    """The report (Markdown): how it was produced, one row per top, the cells by kind."""
    fo4 = doc["fo4"]
    activity = any("activity" in r for r in doc["tops"])
    lines = [
        f"Synthesis to `{doc['library']}` ({doc['liberty']}) at {doc['clock_mhz']:g} MHz "
        f"(period {doc['period_ns']:g} ns): `{doc['command']}`.",
        "",
        f"Tools: {doc['tools'].get('yosys', '?')}; OpenSTA {doc['tools'].get('sta', '?')}. "
        + (
            f"FO4 of the library: {fo4['fo4_ps']:.1f} ps ({fo4['cell']} driving four of "
            f"itself, OpenSTA over {fo4['stages']} stages of a chain)."
            if fo4.get("fo4_ps")
            else f"FO4 not measured: {fo4.get('error')}."
        )
        + f" Cycle: critical path plus setup, in FO4, against the period in 28-nm FO4 "
        f"({FO4_28NM_PS} ps assumed, `FO4_28NM_PS`): met or missed at the paper's technology."
        + " Power: OpenSTA's "
        "vectorless estimate (default activities: 0.1 transitions per cycle, duty 0.5 at "
        "the inputs, propagated through the logic; no wires, ideal clock).",
        "",
        "| top | cells | flip-flops | memory bits (as flip-flops) | area um^2 | critical path "
        f"ns | in FO4 | slack ns | TNS ns | cycle in FO4 (at 28 nm: "
        f"{budget_fo4(doc['clock_mhz']):.1f}) | power mW | max fanout | seconds |"
        + (" power mW, recorded activity |" if activity else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if activity else ""),
    ]
    for r in doc["tops"]:
        if r.get("error") and r.get("cell_count") is None:
            lines.append(f"| {r['top']} | failed: {r['error']} |" + " |" * 11)
            continue
        power = (r.get("power_mw") or {}).get("total")
        lines.append(
            f"| {r['top']} | {r.get('cell_count', '-')} | {r.get('flip_flops', '-')} | "
            f"{r.get('memory_bits', 0)} | {_f(r.get('area_um2'), '{:.1f}')} | "
            f"{_f(r.get('arrival_ns'))} | {_f(r.get('arrival_fo4'), '{:.1f}')} | "
            f"{_f(r.get('slack_ns'))} | {_f(r.get('tns_ns'), '{:.2f}')} | "
            f"{_f(r.get('cycle_fo4'), '{:.1f}')} ({_met(r)}) | "
            f"{_f(power, '{:.3f}')} | {r.get('max_fanout', '-')} | "
            f"{r.get('synth_s', 0) + r.get('sta_s', 0):.1f} |"
            + (f" {_f((r.get('activity_power_mw') or {}).get('total'))} |" if activity else "")
        )
    failed = [r for r in doc["tops"] if r.get("error")]
    if failed:
        lines += ["", "Failed: " + "; ".join(f"{r['top']}: {r['error']}" for r in failed) + "."]
    lines += ["", "Critical paths:", ""]
    for r in doc["tops"]:
        if r.get("arrival_ns") is not None:
            lines.append(
                f"* {r['top']}: {r['startpoint']} -> {r['endpoint']}, {r['path_cells']} cells, "
                f"arrival {r['arrival_ns']:.3f} ns, required {r['required_ns']:.3f} ns, "
                f"slack {r['slack_ns']:.3f} ns; max-transition violations: "
                f"{r['max_transition_violations']}"
            )
    if activity:
        lines += [
            "",
            "Recorded activity: each top's own bench (driver, monitor and checker against "
            "the golden model) run on its mapped netlist under Verilator with cell models "
            "written from the Liberty functions; registers and ports recorded, every other "
            "net evaluated from the cell functions cycle by cycle (zero delay, no glitch); "
            "each cell output's toggles per cycle and its share of cycles high set in "
            "OpenSTA (`sta::set_power_pin_activity`), the input bits' likewise "
            "(`fsedp.experiments.activity`):",
            "",
        ]
        for r in doc["tops"]:
            a = r.get("activity")
            if a is None:
                continue
            if "error" in a:
                lines.append(f"* {r['top']}: {a['error']}")
                continue
            cone = a["input_cone_cells"] / max(1, a["cells"])
            verdict = (
                "the netlist passed its bench, the recording checked"
                if _netlist_passed(r)
                else f"the netlist FAILED its bench or its check ({a.get('failed')} failed, "
                f"{a.get('mismatches')} mismatches; {a['check']}; "
                f"{a.get('pins_set')} pins set in OpenSTA)"
            )
            lines.append(
                f"* {r['top']}: `{a['bench']}` {a['knobs']}, {a['cycles']} cycles; activity "
                f"on {a['cell_outputs_recorded']} of {a['cell_outputs']} cell outputs "
                f"({a.get('pins_set')} set in OpenSTA) and {a['input_ports_recorded']} of "
                f"{a['input_ports']} input bits; {100 * cone:.0f} % of the cells in input "
                f"bits' cones (re-propagated by OpenSTA); {verdict} ({a['seconds']:.1f} s)"
            )
    lines += ["", "Cells by kind (the ten most used):", ""]
    for r in doc["tops"]:
        kinds = sorted(r.get("cells", {}).items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        if kinds:
            lines.append(f"* {r['top']}: " + ", ".join(f"{k} {n}" for k, n in kinds))
    return "\n".join(lines)
