"""Verilog generation of every scheduler block with Amaranth's built-in Yosys."""

from pathlib import Path

from amaranth.back import verilog

from ..sw.params import SchedulerParams
from .eit import EIT
from .icv import ICV
from .matcher import ECMatcher
from .pairing import PairingUnit
from .scheduler import Scheduler
from .sorter import BitonicSorter
from .token_buffer import TokenBufferUnit

__all__ = ["BLOCKS", "top_name", "verilog_text", "write_verilog"]

#: block name -> component class; the name is shared by RTL, golden model, testbench
#: (``tb/tb_<name>.py``) and doc page (``docs/blocks/<name>.md``).
BLOCKS = {
    "eit": EIT,
    "sorter": BitonicSorter,
    "pairing": PairingUnit,
    "token_buffer": TokenBufferUnit,
    "icv": ICV,
    "matcher": ECMatcher,
    "scheduler": Scheduler,
}


def top_name(block: str) -> str:
    return f"fsedp_{block}"


def verilog_text(block: str, p: SchedulerParams) -> str:
    if block not in BLOCKS:
        raise ValueError(f"unknown block {block!r}; choose from {', '.join(BLOCKS)}")
    return verilog.convert(BLOCKS[block](p), name=top_name(block), emit_src=False)


def write_verilog(block: str, p: SchedulerParams, out_dir) -> Path:
    """Write ``fsedp_<block>.v`` into ``out_dir`` (atomically) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{top_name(block)}.v"
    text = verilog_text(block, p)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".v.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path
