"""Verilog generation of every scheduler block with Amaranth's built-in Yosys."""

import dataclasses
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Const, Value, ValueCastable
from amaranth.hdl._ir import PortDirection
from amaranth.lib import wiring

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
    return verilog.convert(top, name=top_name(block), ports=component_ports(top), emit_src=False)


def write_verilog(block: str, p, out_dir) -> Path:
    """Write ``fsedp_<block>.v`` into ``out_dir`` (atomically) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{top_name(block)}.v"
    text = verilog_text(block, p)
    if not path.exists() or path.read_text() != text:
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    return path
