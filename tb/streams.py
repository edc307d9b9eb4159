"""cocotb helpers shared by every testbench: clock and reset, the parameters and knobs the
runner passes in the environment, the JSON report, and reading ports.  Each testbench drives
its streams by ``lib.stream`` rules (a transfer happens on a rising edge where
``valid & ready``; the payload stays stable while ``valid & ~ready``)."""

import json
import os

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from fsedp import jsondoc
from fsedp.params import SchedulerParams


def params() -> SchedulerParams:
    return SchedulerParams(**json.loads(os.environ["FSEDP_PARAMS"]))


def knobs() -> dict:
    return json.loads(os.environ.get("FSEDP_KNOBS", "{}"))


def write_report(report: dict):
    path = os.environ.get("FSEDP_REPORT")
    if path:
        with open(path, "w") as f:
            f.write(jsondoc.dumps(report))


async def start(dut, cycles: int = 2):
    """Start a 10 ns clock and hold reset for ``cycles`` cycles."""
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    dut.rst.value = 0


def resolved(signal) -> bool:
    return signal.value.is_resolvable


def u(signal) -> int:
    """Unsigned value of a port (``Logic`` for 1-bit ports, ``LogicArray`` otherwise)."""
    v = signal.value
    return v.to_unsigned() if hasattr(v, "to_unsigned") else int(v)
