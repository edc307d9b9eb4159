"""cocotb helpers shared by every testbench: clock/reset, parameters, stream driver and
sink with random stalls (``lib.stream`` rules: a transfer happens on a rising edge where
``valid & ready``; payload stays stable while ``valid & ~ready``)."""

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from fsedp.sw.params import SchedulerParams


def params() -> SchedulerParams:
    return SchedulerParams(**json.loads(os.environ["FSEDP_PARAMS"]))


def knobs() -> dict:
    return json.loads(os.environ.get("FSEDP_KNOBS", "{}"))


def write_report(report: dict):
    path = os.environ.get("FSEDP_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(report, f)


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


class Port:
    """Access to ``<name>__valid/__ready/__payload`` of a stream port."""

    def __init__(self, dut, name):
        self.valid = getattr(dut, f"{name}__valid")
        self.ready = getattr(dut, f"{name}__ready")
        self.payload = getattr(dut, f"{name}__payload")


class StreamDriver:
    """Drives beats into a sink port, idling a random fraction ``stall`` of cycles."""

    def __init__(self, dut, name, rng: random.Random, stall: float = 0.0):
        self.port = Port(dut, name)
        self.clk = dut.clk
        self.rng = rng
        self.stall = stall
        self.port.valid.value = 0

    async def send(self, value: int):
        while self.rng.random() < self.stall:
            self.port.valid.value = 0
            await RisingEdge(self.clk)
        self.port.valid.value = 1
        self.port.payload.value = value
        while True:
            await ReadOnly()
            accepted = self.port.ready.value == 1
            await RisingEdge(self.clk)
            if accepted:
                break
        self.port.valid.value = 0
