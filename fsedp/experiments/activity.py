"""Switching activity recorded in a gate-level cosimulation, for OpenSTA's power report.

The mapped netlist of a top (``fsedp rtl synth``) runs the top's own cocotb bench
(``tb/tb_<top>.py``: the driver, the DUT, the monitor and the checker against the golden
model) under Icarus Verilog, with a Verilog model of every library cell it uses written
from the Liberty file's own ``function``, ``ff`` and ``latch`` groups (:func:`cell_models`).
Every net of the flattened netlist is recorded as a VCD (:func:`vcd_activity`); each cell
output's toggles per clock cycle and the fraction of time it is high become its activity
and duty, and each input port's too (:func:`activity_tcl`), which OpenSTA then uses in
``report_power`` instead of propagating its defaults.  The bench checks the netlist
against the golden model as it checks the RTL, so the run is also a gate-level
verification of the mapped netlist: its mismatches are reported beside the power.

Decided here: every flip-flop and latch of the cell models starts at 0 (a memory mapped to
flip-flops has no reset; the RTL's memories start at 0 too), X and Z are not propagated
specially (Icarus' own four-valued operators); the activity is that of the whole run,
reset included, over the clock's cycles counted in the VCD.

This OpenSTA (the 2019 snapshot Debian packages) has no ``read_vcd`` or ``read_saif``, and
its ``set_power_activity -pins`` fails inside its own Tcl (it calls an undefined
``get_pins_error``); the command under it, ``sta::set_power_pin_activity PIN ACTIVITY
DUTY``, works and is what the script uses, after a first ``report_power`` (before one,
this OpenSTA drops the activities set; the flow reports the vectorless power first).  Both
are checked in ``tests/test_activity.py``.  An activity is toggles per clock cycle, so the
power is that of the recorded run's cycles at the clock the top is timed at.
"""

import re
from pathlib import Path

from fsedp.errors import InputError

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


def net_name(ref: str) -> str:
    """A net reference of the netlist or a VCD as one key: escapes and spaces dropped
    (``\\a.b [3]`` and ``a.b[3]`` are one bit)."""
    return ref.replace("\\", "").replace(" ", "")


def netlist_drivers(text: str, lib) -> list[tuple[str, str, str]]:
    """``(instance, pin, net)`` for every output pin of a library cell in a Yosys netlist."""
    out = []
    for cell, inst, conns in _INST.findall(text):
        c = lib.cells.get(cell)
        if c is None:
            continue
        outs = {p.name for p in c.outputs()}
        for pin, ref in _CONN.findall(conns):
            if pin in outs and ref:
                out.append((inst.lstrip("\\").strip(), pin, net_name(ref)))
    return out


# -- the VCD -----------------------------------------------------------------------------------
def vcd_activity(path, scope: str, clock: str) -> tuple[int, dict]:
    """``(cycles, {bit: (toggles, time high)})`` of every signal in the VCD ``path``'s
    scope ``scope`` (the netlist's flattened nets): a vector's bits one by one
    (``name[i]``), the time high over the whole dump; ``cycles`` the rising edges of
    ``clock``."""
    ids: dict[str, list[str]] = {}  # identifier code -> bit names, MSB first
    stack: list[str] = []
    path = Path(path)
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
                ids.setdefault(code, []).extend(bits)
            elif w[0] == "$enddefinitions":
                break
        clock_codes = [c for c, b in ids.items() if clock in b]
        toggles = {c: [0] * len(b) for c, b in ids.items()}
        high = {c: [0] * len(b) for c, b in ids.items()}
        value = {c: ["x"] * len(b) for c, b in ids.items()}
        since = {c: [0] * len(b) for c, b in ids.items()}
        now, edges = 0, 0

        def change(code, bits):
            nonlocal edges
            if code not in value:
                return
            old = value[code]
            bits = bits.rjust(len(old), "0" if bits[0] in "01" else bits[0])[-len(old) :]
            for i, (a, b) in enumerate(zip(old, bits)):
                if a != b:
                    if a == "1":
                        high[code][i] += now - since[code][i]
                    if a in "01" and b in "01":
                        toggles[code][i] += 1
                        if code in clock_codes and b == "1":
                            edges += 1
                    since[code][i] = now
                    old[i] = b

        for line in f:
            if not line or line[0] in "$\n":
                continue
            c = line[0]
            if c == "#":
                now = int(line[1:])
            elif c in "01xzXZ":
                change(line[1:].strip(), c.lower())
            elif c in "bB":
                v, code = line[1:].split()
                change(code, v.lower())
    for code, vals in value.items():
        for i, v in enumerate(vals):
            if v == "1":
                high[code][i] += now - since[code][i]
    total = max(now, 1)
    bits = {}
    for code, names in ids.items():
        for i, n in enumerate(names):
            bits[n] = (toggles[code][i], high[code][i] / total)
    return edges, bits


def activity_tcl(drivers, inputs, bits: dict, cycles: int) -> tuple[str, dict]:
    """OpenSTA commands that set every recorded cell output's and input port's activity
    (toggles per clock cycle) and duty; ``(script, coverage)``."""
    if cycles <= 0:
        raise ValueError("the recording has no clock edge")
    lines = ["# switching activity recorded in a gate-level cosimulation (fsedp)"]
    found = 0
    for inst, pin, net in drivers:
        if net not in bits:
            continue
        t, duty = bits[net]
        found += 1
        lines.append(
            f"foreach p [get_pins {{{inst}/{pin}}}] "
            f"{{ sta::set_power_pin_activity $p {t / cycles:.6g} {duty:.6g} }}"
        )
    ports = 0
    for port in inputs:
        if port in bits:
            t, duty = bits[port]
            ports += 1
            lines.append(
                f"set_power_activity -input_ports [get_ports {{{port}}}] "
                f"-activity {t / cycles:.6g} -duty {duty:.6g}"
            )
    return "\n".join(lines) + "\n", {
        "cell_outputs": len(drivers),
        "cell_outputs_recorded": found,
        "input_ports": len(inputs),
        "input_ports_recorded": ports,
        "cycles": cycles,
    }


def _fail(what: str, reason: str) -> InputError:
    return InputError("<activity>", what, reason)


# -- the run -----------------------------------------------------------------------------------
#: The module that records the netlist's nets (a second root beside the top).
DUMP_MODULE = "fsedp_activity_dump"
VCD = "activity.vcd"

#: The bench of each top and its knobs for the recording: a short run of the bench's own
#: stimulus (the chance of a pause or back-pressure at the bench's default unless named).
#: Tops without a bench of their own (``chiplet``; ``pairing``, which has no clock) are
#: left to the vectorless estimate.
BENCH_KNOBS = {
    "eit": {"rounds": 8},
    "sorter": {"vectors": 24},
    "pairing": {"vectors": 12},
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


def dump_verilog(module: str) -> str:
    """The second root: every net at the top level of ``module`` (the flattened netlist)
    into :data:`VCD`."""
    return (
        f"module {DUMP_MODULE};\n"
        f'  initial begin $dumpfile("{VCD}"); $dumpvars(1, {module}); end\n'
        "endmodule\n"
    )


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


def record(top: str, params, lib, netlist: Path, module: str, clock: str, work: Path) -> dict:
    """The top's bench on its mapped ``netlist`` under Icarus, the nets recorded; the
    OpenSTA commands of their activity (``tcl``), how much of the netlist they cover, and
    the bench's verdict on the netlist (``mismatches``, ``failed``)."""
    from fsedp.tb.runner import run_tb

    text = netlist.read_text()
    used = {cell for cell, _, _ in _INST.findall(text) if cell in lib.cells}
    work.mkdir(parents=True, exist_ok=True)
    models, dump = work / "cells.v", work / "dump.v"
    models.write_text(cell_models(lib, used))
    dump.write_text(dump_verilog(module))
    res = run_tb(
        top,
        params,
        "icarus",
        work / "build",
        knobs=BENCH_KNOBS[top],
        netlist=(netlist, models, dump),
        roots=(DUMP_MODULE,),
        tag="-activity",
    )
    vcd = Path(res["build_dir"]) / VCD
    if not vcd.exists():
        raise RuntimeError(f"the gate-level run wrote no {VCD} (see {res['log']})")
    cycles, bits = vcd_activity(vcd, module, clock)
    tcl, cover = activity_tcl(netlist_drivers(text, lib), input_bits(text, clock), bits, cycles)
    vcd.unlink()  # large; the activity is in the script
    return {
        "tcl": tcl,
        **cover,
        "bench": f"tb_{top}",
        "knobs": BENCH_KNOBS[top],
        "tests": res.get("tests"),
        "failed": res.get("failed"),
        "mismatches": res.get("mismatches"),
    }
