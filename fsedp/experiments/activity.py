"""Switching activity of a gate-level cosimulation, for OpenSTA's power report.

The mapped netlist of a top (``fsedp rtl synth``) runs the top's own cocotb bench
(``tb/tb_<top>.py``: the driver, the DUT, the monitor and the checker against the golden
model) under Verilator, with a Verilog model of every library cell it uses written from the
Liberty file's own ``function``, ``ff`` and ``latch`` groups (:func:`cell_models`).  The
bench checks the netlist against the golden model as it checks the RTL, so the run is also
a gate-level verification of the mapped netlist.

Verilator records the netlist's registers and ports (its other nets it optimises away); every
other net is evaluated from the cells' Liberty functions cycle by cycle, over all cycles at
once (:func:`evaluate`: numpy arrays, the cells in topological order), and the recording is
checked as it is read: every recorded net the evaluation reaches must agree, and every
flip-flop's next state (evaluated) must be its output one cycle later (recorded).  Each
cell output's toggles per clock cycle and its fraction of cycles high become its activity
and duty, and each input bit's too (:func:`activity_tcl`), which OpenSTA then uses in
``report_power`` instead of propagating its defaults.

Decided here: the activity is cycle based (zero delay): a net toggles at most once a
cycle, glitches are not counted (an event-driven zero-delay simulation would count
glitches no real circuit makes, and Icarus on these netlists measured 162 s for four
vectors of the 64-lane sorter, which Verilator runs in seconds); the first clock edge is
the recording's start; every flip-flop of the cell models starts at 0 (memories mapped to
flip-flops have no reset; the RTL's start at 0 too).

This OpenSTA (the 2019 snapshot Debian packages) has no ``read_vcd`` or ``read_saif``, and
its ``set_power_activity -pins`` fails inside its own Tcl (it calls an undefined
``get_pins_error``); the command under it, ``sta::set_power_pin_activity PIN ACTIVITY
DUTY``, works and is what the script uses, after a first ``report_power`` (before one,
this OpenSTA drops the activities set; the flow reports the vectorless power first).  Both
are checked in ``tests/test_activity.py``.  An activity is toggles per clock cycle, so the
power is that of the recorded run's cycles at the clock the top is timed at.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# -- Liberty functions as Verilog --------------------------------------------------------------
_FTOKEN = re.compile(r"\s*(?:(?P<id>[A-Za-z_][\w]*)|(?P<op>[!'&*|+^()])|(?P<const>[01]))")


def liberty_expr(func: str) -> str:
    """A Liberty boolean ``function`` as a Verilog expression: ``!`` and postfix ``'`` are
    not, ``&``, ``*`` and juxtaposition and, ``|`` and ``+`` or, ``^`` xor (precedence not,
    and, xor, or), ``0`` and ``1`` constants.  A ValueError for anything else."""
    text = func.strip().strip('"')
    toks: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _FTOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ValueError(f"cannot read the function {func!r} at {text[pos:]!r}")
        pos = m.end()
        kind = m.lastgroup
        toks.append((kind, m[kind]))
    at = 0

    def peek():
        return toks[at] if at < len(toks) else (None, None)

    def take():
        nonlocal at
        if at >= len(toks):
            raise ValueError(f"the function {func!r} ends too soon")
        at += 1
        return toks[at - 1]

    def factor() -> str:
        kind, v = take()
        if v == "!":
            x = f"~{factor()}"
        elif v == "(":
            x = f"({disj()})"
            if take()[1] != ")":
                raise ValueError(f"unbalanced parentheses in {func!r}")
        elif kind == "id":
            x = v
        elif kind == "const":
            x = f"1'b{v}"
        else:
            raise ValueError(f"cannot read the function {func!r}")
        while peek()[1] == "'":
            take()
            x = f"~({x})"
        return x

    def conj() -> str:
        parts = [factor()]
        while True:
            kind, v = peek()
            if v in ("&", "*"):
                take()
                parts.append(factor())
            elif kind in ("id", "const") or v in ("!", "("):  # juxtaposition
                parts.append(factor())
            else:
                return " & ".join(parts) if len(parts) > 1 else parts[0]

    def xor() -> str:
        parts = [conj()]
        while peek()[1] == "^":
            take()
            parts.append(conj())
        return " ^ ".join(parts) if len(parts) > 1 else parts[0]

    def disj() -> str:
        parts = [xor()]
        while peek()[1] in ("|", "+"):
            take()
            parts.append(xor())
        return "(" + " | ".join(parts) + ")" if len(parts) > 1 else parts[0]

    out = disj()
    if at != len(toks):
        raise ValueError(f"cannot read the function {func!r}")
    return out


def cell_models(lib, names) -> str:
    """Verilog models of the library cells ``names`` (a ValueError naming a cell that has
    no model: a statetable, an output without a function)."""
    out = [f"// Cell models of {lib.name}, written from its Liberty functions by fsedp", ""]
    for name in sorted(names):
        cell = lib.cells[name]
        state = cell.state
        pins = [p.name for p in cell.pins.values() if p.direction in ("input", "output")]
        ports = ", ".join(pins)
        body = [f"module {name} ({ports});"]
        body += [f"  {p.direction} {p.name};" for p in cell.pins.values() if p.name in pins]
        if cell.sequential:
            if state is None or state["kind"] not in ("ff", "latch"):
                raise ValueError(f"cell {name}: no ff or latch group to model")
            q, qn = state["vars"]
            body.append(f"  reg {q}, {qn};")
            body.append(f"  initial begin {q} = 1'b0; {qn} = 1'b1; end")
            clr = liberty_expr(state["clear"]) if state.get("clear") else None
            pre = liberty_expr(state["preset"]) if state.get("preset") else None
            if state["kind"] == "ff":
                body.append(f"  wire fsedp_clk = {liberty_expr(state['clocked_on'])};")
                body.append(f"  wire fsedp_d = {liberty_expr(state['next_state'])};")
                events = ["posedge fsedp_clk"]
                if clr:
                    body.append(f"  wire fsedp_clr = {clr};")
                    events.append("posedge fsedp_clr")
                if pre:
                    body.append(f"  wire fsedp_pre = {pre};")
                    events.append("posedge fsedp_pre")
                body.append(f"  always @({' or '.join(events)}) begin")
            else:
                body.append(f"  wire fsedp_en = {liberty_expr(state['enable'])};")
                body.append(f"  wire fsedp_d = {liberty_expr(state['data_in'])};")
                if clr:
                    body.append(f"  wire fsedp_clr = {clr};")
                if pre:
                    body.append(f"  wire fsedp_pre = {pre};")
                body.append("  always @* begin")
            chain = []
            if clr:
                chain.append(f"if (fsedp_clr) begin {q} <= 1'b0; {qn} <= 1'b1; end")
            if pre:
                chain.append(f"if (fsedp_pre) begin {q} <= 1'b1; {qn} <= 1'b0; end")
            cond = "" if state["kind"] == "ff" else "if (fsedp_en) "
            chain.append(f"{cond}begin {q} <= fsedp_d; {qn} <= ~fsedp_d; end")
            body.append("    " + "\n    else ".join(chain))
            body.append("  end")
        for p in cell.outputs():
            if not p.function:
                raise ValueError(f"cell {name}: output {p.name} has no function")
            body.append(f"  assign {p.name} = {liberty_expr(p.function)};")
        body += ["endmodule", ""]
        out += body
    return "\n".join(out)


# -- the netlist -------------------------------------------------------------------------------
_INST = re.compile(r"^\s*([A-Za-z_][\w$]*)\s+(\\\S+|[A-Za-z_][\w$]*)\s*\((.*?)\);", re.S | re.M)
_CONN = re.compile(r"\.(\w+)\s*\(\s*([^()]*?)\s*\)")
_CONST = re.compile(r"\d*'[hbd]([01])")


def net_name(ref: str) -> str:
    """A net reference of the netlist or a VCD as one key: escapes and spaces dropped
    (``\\a.b [3]`` and ``a.b[3]`` are one bit)."""
    return ref.replace("\\", "").replace(" ", "")


@dataclass
class Instance:
    cell: str
    name: str
    inputs: dict  # pin -> net (or "0"/"1" for a constant)
    outputs: dict  # pin -> net


def netlist_instances(text: str, lib) -> list[Instance]:
    """Every instance of a library cell in a Yosys netlist, its pins' nets."""
    out = []
    for cell, inst, conns in _INST.findall(text):
        c = lib.cells.get(cell)
        if c is None:
            continue
        outs = {p.name for p in c.outputs()}
        ins, drives = {}, {}
        for pin, ref in _CONN.findall(conns):
            if not ref:
                continue
            k = _CONST.fullmatch(ref.strip())
            (drives if pin in outs else ins)[pin] = k[1] if k else net_name(ref)
        out.append(Instance(cell, inst.lstrip("\\").strip(), ins, drives))
    return out


def drivers(instances) -> list[tuple[str, str, str]]:
    """``(instance, pin, net)`` for every output pin of the instances."""
    return [(i.name, pin, net) for i in instances for pin, net in i.outputs.items()]


_PORT = re.compile(r"(?<![\w$\\])input\s+(?:\[(\d+):(\d+)\]\s+)?(\\\S+|[A-Za-z_][\w$]*)\s*;", re.M)


def input_bits(text: str, clock: str | None) -> list[str]:
    """Every input bit of the netlist's top but the clock (``name[i]`` for a vector)."""
    out = []
    for hi, lo, name in _PORT.findall(text):
        name = net_name(name)
        if name == clock:
            continue
        if hi:
            a, b = int(hi), int(lo)
            out += [f"{name}[{i}]" for i in range(min(a, b), max(a, b) + 1)]
        else:
            out.append(name)
    return out


# -- the VCD -----------------------------------------------------------------------------------
def vcd_samples(path, scope: str, clock: str) -> tuple[int, dict]:
    """``(cycles, {bit: values})``: every signal of the VCD ``path``'s scope ``scope`` (a
    vector's bits one by one, ``name[i]``) sampled just before each rising edge of
    ``clock`` but the first -- the settled value of every cycle, what the flip-flops
    capture -- as a numpy bool array (X and Z read as 0)."""
    ids: dict[str, list[list[str]]] = {}  # identifier code -> per $var its bits, MSB first
    stack: list[str] = []
    changes: dict[str, list] = {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "$scope":
                stack.append(w[2])
            elif w[0] == "$upscope":
                stack.pop()
            elif w[0] == "$var" and stack and stack[-1] == scope:
                width, code, ref = int(w[2]), w[3], w[4]
                rng = w[5] if len(w) > 6 and w[5].startswith("[") else None
                name = net_name(ref)
                if width == 1:
                    bits = [name if rng is None else name + rng]
                else:
                    m = re.fullmatch(r"\[(-?\d+):(-?\d+)\]", rng or "")
                    hi, lo = (int(m[1]), int(m[2])) if m else (width - 1, 0)
                    step = -1 if hi >= lo else 1
                    bits = [f"{name}[{i}]" for i in range(hi, lo + step, step)]
                ids.setdefault(code, []).append(bits)  # one code may name several nets
            elif w[0] == "$enddefinitions":
                break
        for code in ids:
            changes[code] = []
        now = 0
        for line in f:
            c = line[:1]
            if c == "#":
                now = int(line[1:])
            elif c in "01xzXZ":
                code = line[1:].strip()
                if code in changes:
                    changes[code].append((now, c))
            elif c in "bB":
                v, code = line[1:].split()
                if code in changes:
                    changes[code].append((now, v))
    clock_code = next((k for k, vs in ids.items() if [clock] in vs), None)
    if clock_code is None:
        raise ValueError(f"the recording has no clock {clock!r} in {scope!r}")
    edges = [
        t
        for (t, v), (_, u) in zip(changes[clock_code][1:], changes[clock_code])
        if v == "1" and u != "1"
    ]
    if changes[clock_code][:1] and changes[clock_code][0][1] == "1":
        edges.insert(0, changes[clock_code][0][0])
    edges = edges[1:]  # before the first edge the recording has not settled
    at = np.asarray(edges, np.int64)
    samples = {}
    for code, variables in ids.items():
        ch = changes[code]
        width = max(len(b) for b in variables)
        times = np.asarray([t for t, _ in ch], np.int64)
        vals = np.zeros((len(ch) + 1, width), bool)  # row 0: before any change
        for r, (_, v) in enumerate(ch, 1):
            v = v.lower().rjust(width, "0" if v[0] in "01" else v[0])[-width:]
            vals[r] = np.frombuffer(v.encode(), np.uint8) == ord("1")
        rows = np.searchsorted(times, at, side="left")  # the last change strictly before
        picked = vals[rows]
        for names in variables:  # each $var at its own width (the value's low bits)
            for i, n in enumerate(names):
                samples[n] = picked[:, width - len(names) + i]
    return len(edges), samples


# -- cycle-based evaluation --------------------------------------------------------------------
def _py_expr(func: str) -> str:
    """A Liberty function as a Python expression over numpy bool arrays."""
    return liberty_expr(func).replace("1'b0", "_0").replace("1'b1", "_1")


def evaluate(instances, lib, samples: dict, cycles: int) -> tuple[dict, dict]:
    """Every net of the netlist in every cycle: the flip-flops' outputs and the inputs as
    recorded (``samples``), the combinational cells evaluated from their Liberty functions
    in topological order (zero delay: no glitch).  ``(values, check)``: ``check`` counts the
    recorded nets the evaluation disagrees with and the flip-flops whose next state
    (evaluated) is not their output one cycle later (recorded) -- both 0 for a recording
    the netlist explains."""
    zero, one = np.zeros(cycles, bool), np.ones(cycles, bool)
    values: dict = {"0": zero, "1": one}
    fns: dict = {}

    def fn(func: str):
        """``(pins it reads, f(_0, _1, *their values))`` of a Liberty function."""
        if func not in fns:
            names = sorted(set(re.findall(r"[A-Za-z_]\w*", func)))
            args = ", ".join(["_0", "_1", *names])
            fns[func] = (names, eval(f"lambda {args}: {_py_expr(func)}"))  # noqa: S307
        return fns[func]

    def apply(func: str, i: Instance, state=None):
        """``func`` over ``i``'s pins' values (``state``: the state variables' values);
        a KeyError where a pin it reads is unconnected or has no value."""
        names, f = fn(func)
        args = [(state or {}).get(q) if q in (state or {}) else values[i.inputs[q]] for q in names]
        return np.broadcast_to(f(zero, one, *args), (cycles,))

    seq = [i for i in instances if lib.cells[i.cell].sequential]
    comb = [i for i in instances if not lib.cells[i.cell].sequential]
    missing = 0
    for i in seq:
        for net in i.outputs.values():
            if net in samples:
                values[net] = samples[net]
            else:
                missing += 1
    for net, v in samples.items():
        values.setdefault(net, v)
    # topological order: a cell is ready when every input net has a value
    readers: dict = {}
    waiting = {}
    for k, i in enumerate(comb):
        need = {n for n in i.inputs.values() if n not in values}
        waiting[k] = len(need)
        for n in need:
            readers.setdefault(n, []).append(k)
    ready = [k for k, w in waiting.items() if w == 0]
    done = 0
    disagree = 0
    while ready:
        k = ready.pop()
        i = comb[k]
        cell = lib.cells[i.cell]
        try:
            outs = {net: apply(cell.pins[pin].function, i) for pin, net in i.outputs.items()}
        except KeyError:  # an input pin left unconnected: counted as unevaluated
            continue
        for net, v in outs.items():
            v = v.astype(bool)
            if net in samples and not np.array_equal(samples[net], v):
                disagree += 1
            first = net not in values
            values[net] = v
            if first:
                for r in readers.pop(net, []):
                    waiting[r] -= 1
                    if waiting[r] == 0:
                        ready.append(r)
        done += 1
    unevaluated = len(comb) - done
    bad_next = unchecked = 0
    for i in seq:
        cell = lib.cells[i.cell]
        st = cell.state or {}
        q_var, qn_var = (st.get("vars") or [None, None])[:2]
        q = next((n for p, n in i.outputs.items() if cell.pins[p].function == q_var), None)
        qn = next((n for p, n in i.outputs.items() if cell.pins[p].function == qn_var), None)
        if q is not None and q in values:
            state = values[q]
        elif qn is not None and qn in values:
            state = ~values[qn]
        else:
            unchecked += 1
            continue
        if st.get("kind") != "ff" or not st.get("next_state"):
            unchecked += 1  # a latch: its output follows within the cycle
            continue
        try:
            d = apply(st["next_state"], i, {q_var: state, qn_var: ~state})
            quiet = np.ones(cycles, bool)  # cycles in which no clear or preset acts
            for key in ("clear", "preset"):
                if st.get(key):
                    quiet &= ~apply(st[key], i, {q_var: state, qn_var: ~state})
        except KeyError:
            unchecked += 1
            continue
        both = quiet[:-1] & quiet[1:]
        if not np.array_equal(d[:-1][both], state[1:][both]):
            bad_next += 1
    return values, {
        "flip_flop_outputs_unrecorded": missing,
        "cells_unevaluated": unevaluated,
        "recorded_nets_disagreeing": disagree,
        "flip_flops_next_state_wrong": bad_next,
        "flip_flops_unchecked": unchecked,
    }


#: The counts of :func:`evaluate`'s check that mean the recording is not explained by the
#: netlist or does not cover it (``flip_flops_unchecked`` is information: a latch, or a
#: flip-flop whose next state reads an unconnected pin).
CHECK_FAILURES = (
    "flip_flop_outputs_unrecorded",
    "cells_unevaluated",
    "recorded_nets_disagreeing",
    "flip_flops_next_state_wrong",
)


def passed(rec: dict) -> bool:
    """A gate-level run (``record``'s result, or an ``error``) passed: the bench ran and
    passed on the netlist, the recording checked, and OpenSTA found every pin it set."""
    if "error" in rec:
        return False
    check = rec.get("check") or {}
    return (
        (rec.get("tests") or 0) >= 1
        and rec.get("failed") == 0
        and not rec.get("mismatches")
        and not any(check.get(k) for k in CHECK_FAILURES)
        and rec.get("pins_set", rec.get("cell_outputs_recorded"))
        == rec.get("cell_outputs_recorded")
    )


def input_cone(instances, lib, inputs) -> set:
    """The cells reached from the input bits through combinational cells: their outputs'
    activities OpenSTA (the 2019 snapshot) re-propagates from the input ports' on every
    ``report_power``, over the values set (measured: ``tests/test_activity.py``)."""
    readers: dict = {}
    for k, i in enumerate(instances):
        if not lib.cells[i.cell].sequential:
            for net in i.inputs.values():
                readers.setdefault(net, []).append(k)
    seen, todo = set(), list(inputs)
    while todo:
        for k in readers.get(todo.pop(), ()):
            if k not in seen:
                seen.add(k)
                todo.extend(instances[k].outputs.values())
    return seen


def activity_tcl(drivers, inputs, values: dict, cycles: int) -> tuple[str, dict]:
    """OpenSTA commands that set every cell output's and input bit's activity (toggles per
    clock cycle over the ``cycles`` values of ``values``) and duty; ``(script, coverage)``."""
    if cycles <= 1:
        raise ValueError("the recording has fewer than two clock cycles")
    lines = ["# switching activity of a cycle-based gate-level recording (fsedp)", "set fsedp_n 0"]

    def rate(v):
        v = np.asarray(v, bool)
        return int(np.count_nonzero(v[1:] != v[:-1])) / (cycles - 1), float(v.mean())

    found = 0
    for inst, pin, net in drivers:
        if net not in values:
            continue
        a, duty = rate(values[net])
        found += 1
        lines.append(
            f"foreach p [get_pins {{{inst}/{pin}}}] "
            f"{{ sta::set_power_pin_activity $p {a:.6g} {duty:.6g}; incr fsedp_n }}"
        )
    ports = 0
    for port in inputs:
        if port in values:
            a, duty = rate(values[port])
            ports += 1
            lines.append(
                f"set_power_activity -input_ports [get_ports {{{port}}}] "
                f"-activity {a:.6g} -duty {duty:.6g}"
            )
    lines.append('puts "@@ pins_set $fsedp_n"')
    return "\n".join(lines) + "\n", {
        "cell_outputs": len(drivers),
        "cell_outputs_recorded": found,
        "input_ports": len(inputs),
        "input_ports_recorded": ports,
        "cycles": cycles,
    }


# -- the run -----------------------------------------------------------------------------------
#: The bench of each top and its knobs for the recording: a short run of the bench's own
#: stimulus (the chance of a pause or back-pressure at the bench's default unless named).
#: Tops without a bench of their own (``chiplet``; ``pairing``, which has no clock) are
#: left to the vectorless estimate.
BENCH_KNOBS = {
    "eit": {"rounds": 8},
    "sorter": {"vectors": 24},
    "token_buffer": {"cycles": 400},
    "icv": {"cycles": 400, "reset_every": 200},
    "matcher": {"cycles": 400},
    "scheduler": {"rounds": 4, "tokens": 64, "per_token": 2, "max_delay": 4},
    "ring_buffer": {"cycles": 400},
    "router": {"cycles": 400},
    "ddr_ctrl": {"cycles": 400},
    # a layer of the embedded config's chip lasts some 300 000 cycles: a window of its
    # beginning (dispatch, loads, rings and compute all under way), every cycle checked
    "chip": {"layers": 1, "limit": 20_000},
}


def record(top: str, params, lib, netlist: Path, module: str, clock: str, work: Path) -> dict:
    """The top's bench on its mapped ``netlist`` under Verilator (cell models from the
    Liberty), the netlist's registers and ports recorded, every other net evaluated cycle by
    cycle (:func:`evaluate`); the OpenSTA commands of their activity (``tcl``), how much of
    the netlist they cover, the recording's check, and the bench's verdict on the netlist
    (``mismatches``, ``failed``)."""
    from fsedp.tb.runner import run_tb

    text = netlist.read_text()
    instances = netlist_instances(text, lib)
    work.mkdir(parents=True, exist_ok=True)
    models = work / "cells.v"
    models.write_text(cell_models(lib, {i.cell for i in instances}))
    res = run_tb(
        top,
        params,
        "verilator",
        work / "build",
        knobs=BENCH_KNOBS[top],
        netlist=(netlist, models),
        waves=True,
        tag="-activity",
    )
    if not res.get("waves"):
        raise RuntimeError("the gate-level run wrote no VCD")
    vcd = Path(res["waves"])
    cycles, samples = vcd_samples(vcd, module, clock)
    vcd.unlink()  # large; the activity is in the script
    values, check = evaluate(instances, lib, samples, cycles)
    inputs = input_bits(text, clock)
    tcl, cover = activity_tcl(drivers(instances), inputs, values, cycles)
    cone = input_cone(instances, lib, inputs)
    return {
        "tcl": tcl,
        **cover,
        "input_cone_cells": len(cone),
        "cells": len(instances),
        "check": check,
        "bench": f"tb_{top}",
        "knobs": BENCH_KNOBS[top],
        "tests": res.get("tests"),
        "failed": res.get("failed"),
        "mismatches": res.get("mismatches"),
    }
