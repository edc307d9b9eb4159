"""One testbench body, two simulators: a thin adapter over Amaranth's simulator and cocotb.

A block's bench ``tb/tb_<block>.py`` is written once, as ``async def bench(b, p, knobs) ->
dict`` against :class:`Bench`; :func:`run_amaranth` runs it in Amaranth's Python simulator
(the fast tier, no HDL simulator needed) and :func:`cocotb_entry` makes the cocotb test that
runs it on the generated Verilog under Verilator or Icarus (``tb/runner.py``).  cocotb is
imported only inside the cocotb backend, so the fast tier runs without it.

Ports are named by their Amaranth path in the component's signature: ``"rec.valid"``,
``"offer.2.payload"``, ``"count"`` (cocotb's ``rec__valid``, ``offer__2__payload``,
``count``, as ``fsedp.hw.generate.component_ports`` names them).  A path may go on into a
port's layout (``"count.3"``, ``"rec.payload.expert"``: read-only).  :meth:`Bench.set` takes an
``int``, or for a port with a ``data.Layout`` a ``dict``/``list`` (``Layout.const(...)``) or a
``data.Const``; :meth:`Bench.get` returns the port's bits as an ``int`` and
:meth:`Bench.view` the layout's ``data.Const`` of them.  A constant member of the signature
(``ready`` of an ``always_ready`` stream, which has no Verilog port) reads as its constant.

Timing contract (both backends):

* :meth:`Bench.tick` returns just after a rising clock edge, with every register updated and
  the combinational logic settled (cocotb: ``RisingEdge`` then a fixed 1 ns offset, so the
  inputs written next are legal writes of the new cycle, never of the edge's time step).
* :meth:`Bench.set` drives an input from now on; it is sampled by the next edge.  Inputs keep
  their value until set again.
* :meth:`Bench.get` returns the value settled from the registers after the last edge and
  every input set since (cocotb: when inputs were set since the last read it first lets 1 ps
  pass, so the writes are applied and their combinational effects settled; the clock is
  10 ns, so up to 8000 such reads fit in one cycle).
* So a value read before :meth:`tick` is the one the edge samples: a stream transfer happens
  at that edge exactly when ``valid`` and ``ready`` both read 1 before it (``lib.stream``).
* Reset (``rst``) is synchronous: :meth:`Bench.reset` holds it over ``cycles`` edges.  Both
  runners drive every input 0 and reset for 2 cycles before the body starts
  (:attr:`Bench.cycle` then counts the body's edges from 0).

Stream helpers: :class:`StreamDriver` (a source into the DUT, with :func:`pause` gaps before
every beat) and :class:`StreamMonitor` (a sink of a DUT stream, with random back-pressure on
``ready`` unless the stream is always ready, and the check that a valid payload not taken stays
unchanged).  Failures raise :class:`BenchFailure`, naming the cycle and :attr:`Bench.case`.
"""

import inspect
import random
from collections import deque

from amaranth import ClockDomain, Const, Module, Value, ValueCastable
from amaranth.lib import data, wiring

from fsedp.hw.generate import component_ports
from fsedp.tb.stimulus import PAUSE, pause

__all__ = [
    "Bench",
    "BenchFailure",
    "StreamDriver",
    "StreamMonitor",
    "cocotb_entry",
    "run_amaranth",
    "unpack",
]

#: The cocotb clock period and where in it the bench writes and reads (see the contract).
PERIOD_NS = 10
OFFSET_NS = 1
SETTLE_PS = 1


class BenchFailure(AssertionError):
    """A bench check failed (or a cycle budget ran out)."""


def unpack(value: int, width: int, n: int) -> list[int]:
    """The ``n`` fields of ``width`` bits of a packed array port, lowest first."""
    return [value >> (i * width) & ((1 << width) - 1) for i in range(n)]


class Bench:
    """What a bench body sees of the DUT (the backend-independent part).

    ``component`` is the Amaranth component of the DUT (the same one the Amaranth tier
    simulates, or a twin built from the same parameters under cocotb): its signature names
    the ports and gives their layouts.  :attr:`limit` bounds the cycles of one run (a stuck
    block fails instead of hanging); :attr:`case` is named by every failure."""

    def __init__(self, component: wiring.Component, limit: int = 1_000_000):
        self.component = component
        self.limit = limit
        self.cycle = 0
        self.case = ""
        self._ports = {}  # Value of every Verilog port -> its name
        for name, (value, _) in component_ports(component).items():
            self._ports[id(value)] = name
        self._inputs = [
            name for name, (_, d) in component_ports(component).items() if d.name == "Input"
        ]
        self._resolved = {}

    # -- ports ------------------------------------------------------------------------------
    def _resolve(self, path: str):
        """``(amaranth value, shape, port name or None, bit offset, width)`` of ``path``."""
        hit = self._resolved.get(path)
        if hit is not None:
            return hit
        obj = self.component
        for part in path.split("."):
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
        shape = obj.shape() if isinstance(obj, ValueCastable) else Value.cast(obj).shape()
        value = Value.cast(obj)
        if isinstance(value, Const):
            hit = (value, shape, None, 0, len(value))
        elif id(value) in self._ports:
            hit = (value, shape, self._ports[id(value)], 0, len(value))
        else:  # a field or element of a port (a slice of its signal)
            base = getattr(value, "value", None)
            if base is None or id(base) not in self._ports:
                raise KeyError(f"{path!r} is not a port of {type(self.component).__name__}")
            hit = (value, shape, self._ports[id(base)], value.start, len(value))
        self._resolved[path] = hit
        return hit

    def encode(self, path: str, value) -> int:
        """The bits of ``value`` for port ``path``: an int, a layout's const, dict or list."""
        _, shape, _, _, width = self._resolve(path)
        if isinstance(value, data.Const):
            value = value.as_bits()
        elif isinstance(value, dict | list | tuple):
            value = shape.const(value).as_bits()
        return int(value) & ((1 << width) - 1)

    def width(self, path: str) -> int:
        return self._resolve(path)[4]

    # -- the body's API -----------------------------------------------------------------------
    def set(self, path: str, value):
        """Drive input ``path`` with ``value`` from now on (sampled by the next edge)."""
        v, _, name, offset, width = self._resolve(path)
        if name is None or offset or width != len(self._port_value(name)):
            raise KeyError(f"{path!r} is not a whole input port")
        self._set(name, v, self.encode(path, value))

    async def get(self, path: str) -> int:
        """The settled value of ``path`` (see the timing contract), as an unsigned int."""
        v, _, name, offset, width = self._resolve(path)
        if name is None:
            return v.value
        bits = await self._get(name, self._port_value(name))
        return bits >> offset & ((1 << width) - 1)

    async def view(self, path: str):
        """The settled value of ``path`` as its layout's ``data.Const`` (``int`` without one)."""
        _, shape, _, _, _ = self._resolve(path)
        bits = await self.get(path)
        return shape.from_bits(bits) if isinstance(shape, data.Layout) else bits

    async def tick(self, cycles: int = 1):
        """Let ``cycles`` rising edges pass; fails past :attr:`limit` cycles."""
        for _ in range(cycles):
            if self.cycle >= self.limit:
                self.fail(f"cycle limit {self.limit} reached")
            await self._tick()
            self.cycle += 1

    async def reset(self, cycles: int = 1):
        """Hold the synchronous reset over ``cycles`` edges."""
        self._set_rst(1)
        await self.tick(cycles)
        self._set_rst(0)

    async def until(self, pred, what: str, budget: int) -> int:
        """Tick until ``pred()`` (a plain or an awaitable result) is true, at most ``budget``
        cycles; returns the cycles taken."""
        start = self.cycle
        while True:
            ok = pred()
            if inspect.isawaitable(ok):
                ok = await ok
            if ok:
                return self.cycle - start
            if self.cycle - start >= budget:
                self.fail(f"{what}: not within {budget} cycles")
            await self.tick()

    def fail(self, what: str):
        raise BenchFailure(f"{what}\n  at cycle {self.cycle} {self.case} ({self.backend})")

    def check(self, got, want, what: str):
        if got != want:
            self.fail(f"{what}: RTL {got!r} != golden {want!r}")

    async def zero_inputs(self):
        for name in self._inputs:
            if name not in ("clk", "rst"):
                self._set(name, self._port_value(name), 0)

    # -- backend ------------------------------------------------------------------------------
    backend = "?"

    def _port_value(self, name: str):
        return component_ports(self.component)[name][0]

    def _set(self, name, value, bits):
        raise NotImplementedError

    async def _get(self, name, value) -> int:
        raise NotImplementedError

    async def _tick(self):
        raise NotImplementedError

    def _set_rst(self, v):
        raise NotImplementedError


class AmaranthBench(Bench):
    """:class:`Bench` on Amaranth's simulator: ``ctx`` of an async testbench."""

    backend = "amaranth"

    def __init__(self, component, ctx, rst, limit=1_000_000):
        super().__init__(component, limit)
        self.ctx, self.rst = ctx, rst
        self._pv = {n: v for n, (v, _) in component_ports(component).items()}

    def _port_value(self, name):
        return self._pv[name]

    def _set(self, name, value, bits):
        self.ctx.set(self._pv[name], bits)

    async def _get(self, name, value):
        return self.ctx.get(value)

    async def _tick(self):
        await self.ctx.tick()

    def _set_rst(self, v):
        self.ctx.set(self.rst, v)


class CocotbBench(Bench):
    """:class:`Bench` on cocotb: ``dut`` is the simulator's toplevel (``fsedp_<block>``)."""

    backend = "cocotb"

    def __init__(self, component, dut, limit=1_000_000):
        super().__init__(component, limit)
        self.dut = dut
        self._dirty = False
        self._settles = 0
        self._handles = {}
        self._pv = {n: v for n, (v, _) in component_ports(component).items()}

    def _port_value(self, name):
        return self._pv[name]

    def _handle(self, name):
        h = self._handles.get(name)
        if h is None:
            h = self._handles[name] = getattr(self.dut, name)
        return h

    def _set(self, name, value, bits):
        self._handle(name).value = bits
        self._dirty = True

    async def _get(self, name, value):
        from cocotb.triggers import Timer

        if self._dirty:
            self._settles += 1
            if self._settles * SETTLE_PS >= (PERIOD_NS - OFFSET_NS - 1) * 1000:
                self.fail("too many settling reads in one cycle")
            await Timer(SETTLE_PS, unit="ps")
            self._dirty = False
        v = self._handle(name).value
        if not v.is_resolvable:
            self.fail(f"port {name} is {v} (not resolvable)")
        return v.to_unsigned() if hasattr(v, "to_unsigned") else int(v)

    async def _tick(self):
        from cocotb.triggers import RisingEdge, Timer

        await RisingEdge(self.dut.clk)
        await Timer(OFFSET_NS, unit="ns")
        self._dirty = False
        self._settles = 0

    def _set_rst(self, v):
        self.dut.rst.value = v
        self._dirty = True

    async def start(self):
        """Start the clock (when the DUT has one)."""
        import cocotb
        from cocotb.clock import Clock

        if hasattr(self.dut, "clk"):
            cocotb.start_soon(Clock(self.dut.clk, PERIOD_NS, unit="ns").start())
            # first edge, then the offset: the bench starts inside a clock period
            await self._tick()


def run_amaranth(component, body, p, knobs: dict | None = None, limit: int = 1_000_000) -> dict:
    """Run ``body(b, p, knobs)`` on ``component`` in Amaranth's simulator; its report."""
    m = Module()
    m.domains.sync = cd = ClockDomain()
    m.submodules.dut = component
    out = {}

    async def testbench(ctx):
        b = AmaranthBench(component, ctx, cd.rst, limit)
        await b.zero_inputs()
        await b.reset(2)
        b.cycle = 0
        out.update(await body(b, p, dict(knobs or {})) or {})

    from amaranth.sim import Simulator

    sim = Simulator(m)
    sim.add_clock(PERIOD_NS * 1e-9)
    sim.add_testbench(testbench)
    sim.run()
    return out


def cocotb_entry(name: str, make_component, body, params_type=None):
    """The cocotb test of a bench: ``tb_<block>.py`` binds it to a module-level name (cocotb
    collects it there).  It reads the parameters and knobs the runner passes
    (``FSEDP_PARAMS``, ``FSEDP_KNOBS``), builds the component's twin for the port names and
    layouts, runs ``body`` and writes its report (``FSEDP_REPORT``).  ``None`` when cocotb is
    not installed (the Amaranth tier imports the bench modules without it)."""
    try:
        import cocotb
    except ImportError:
        return None

    async def entry(dut):
        import json
        import os

        from fsedp.params import SchedulerParams
        from fsedp.tb.streams import knobs, write_report

        p = (params_type or SchedulerParams)(**json.loads(os.environ["FSEDP_PARAMS"]))
        k = knobs()
        b = CocotbBench(make_component(p), dut, k.get("limit", 1_000_000))
        clocked = hasattr(dut, "clk")
        await b.zero_inputs()
        if clocked:
            await b.start()
            await b.reset(2)
            b.cycle = 0
        write_report(await body(b, p, k) or {})

    entry.__name__ = entry.__qualname__ = name
    return cocotb.test(name=name)(entry)


class StreamDriver:
    """A ``lib.stream`` source into the DUT's stream ``name`` (``name.valid``,
    ``name.payload``, ``name.ready``): items queued with :meth:`send` go out in order, each
    after :func:`~fsedp.tb.stimulus.pause` idle cycles (``valid`` low); once ``valid`` is up
    the payload stays until the transfer.  Once per cycle, before :meth:`Bench.tick`:
    :meth:`drive` (sets) and then :meth:`sample` (reads ``ready``), or :meth:`cycle` for
    both.  ``ready`` may depend on other inputs (``lib.stream`` lets it depend on ``valid``
    and on the sinks' ``ready``): set them all, every :class:`StreamMonitor`'s
    :meth:`~StreamMonitor.drive` included, before any :meth:`sample`."""

    def __init__(self, b: Bench, name: str, rng: random.Random, chance: float = PAUSE):
        self.b, self.rng, self.chance = b, rng, chance
        self.valid, self.payload, self.ready = f"{name}.valid", f"{name}.payload", f"{name}.ready"
        self.queue = deque()
        self.beat = None
        self.gap = None
        self.sent = 0

    def send(self, item, payload=None):
        """Queue ``item``; its beat carries ``payload`` (default: ``item`` itself), in any
        form :meth:`Bench.set` takes."""
        self.queue.append((item, item if payload is None else payload))

    @property
    def idle(self) -> bool:
        return self.beat is None and not self.queue

    def drive(self):
        """Set this cycle's ``valid`` and ``payload``."""
        if self.beat is None and self.queue:
            if self.gap is None:
                self.gap = pause(self.rng, self.chance)
            if self.gap == 0:
                self.beat, self.gap = self.queue.popleft(), None
            else:
                self.gap -= 1
        self.b.set(self.valid, self.beat is not None)
        if self.beat is not None:
            self.b.set(self.payload, self.beat[1])

    async def sample(self):
        """The item the coming edge transfers (``valid & ready``), or ``None``."""
        if self.beat is None or not await self.b.get(self.ready):
            return None
        item, self.beat = self.beat[0], None
        self.sent += 1
        return item

    async def cycle(self):
        """:meth:`drive` then :meth:`sample`."""
        self.drive()
        return await self.sample()


class StreamMonitor:
    """A ``lib.stream`` sink of the DUT's stream ``name``: ``ready`` is low in a random
    ``chance`` of the cycles (0: always high), unless the stream is always ready; a beat
    offered and not taken must be offered again, unchanged.  Once per cycle, before
    :meth:`Bench.tick`: :meth:`drive` (sets ``ready``) and then :meth:`sample` (the payload,
    an ``int``, the coming edge transfers, or ``None``), or :meth:`cycle` for both.
    ``stable=False`` drops the payload check, for a stream documented to update a beat it
    holds (the DDR controller's ``done`` mask collects bits while ``ready`` is low).  Counts
    ``offered``, ``taken`` and ``stalled`` cycles."""

    def __init__(self, b: Bench, name: str, rng: random.Random, chance: float = PAUSE, stable=True):
        self.b, self.rng, self.chance, self.stable = b, rng, chance, stable
        self.valid, self.payload, self.ready = f"{name}.valid", f"{name}.payload", f"{name}.ready"
        self.driven = b._resolve(self.ready)[2] is not None
        self.pending = None
        self.ready_now = True
        self.offered = self.taken = self.stalled = 0

    def drive(self):
        """Set this cycle's ``ready``."""
        self.ready_now = not self.driven or self.rng.random() >= self.chance
        if self.driven:
            self.b.set(self.ready, self.ready_now)

    async def sample(self):
        """The payload the coming edge transfers, or ``None``; checks the stream rules."""
        b = self.b
        valid = await b.get(self.valid)
        payload = await b.get(self.payload) if valid else None
        if self.pending is not None:
            if not valid:
                b.fail(f"{self.valid} dropped before the transfer (lib.stream)")
            if self.stable:
                b.check(payload, self.pending, f"{self.payload} changed while not ready")
        if not valid:
            self.pending = None
            return None
        self.offered += 1
        if self.ready_now:
            self.pending = None
            self.taken += 1
            return payload
        self.pending = payload
        self.stalled += 1
        return None

    async def cycle(self):
        """:meth:`drive` then :meth:`sample`."""
        self.drive()
        return await self.sample()
