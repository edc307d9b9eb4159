"""The FSE-DP chip: the scheduler top and the chiplet array joined into one control loop
(gate records -> scheduler -> dispatch beats -> DDR controller -> rings -> completions ->
scheduler).

Golden model: the golden scheduler (:class:`fsedp.sw.scheduler.Scheduler`) and the
streaming array (:class:`fsedp.sw.streaming.StreamingArray`) joined with the scheduler
RTL's handshake timing (:class:`fsedp.tb.tb_chip.ChipModel`).  Testbench: ``tb/tb_chip.py``.
Doc page: ``docs/blocks/chip.md``.
"""

import dataclasses

from amaranth import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.chiplet_array import ChipletArray
from fsedp.hw.layouts import (
    dispatch_layout,
    events_layout,
    gate_layout,
    req_init_layout,
    slices_layout,
    tokens_layout,
)
from fsedp.hw.scheduler import Scheduler
from fsedp.params import DatapathParams, SchedulerParams

__all__ = ["Chip", "ChipParams"]


@dataclasses.dataclass(frozen=True)
class ChipParams:
    """The generics of the chip: the scheduler's and the datapath's, as the simulator uses
    them (``fsedp.sim.fsedp.make_scheduler(...).p`` and ``variant_params``), checked
    consistent (chiplets, experts, count width, ring path, and the mesh's columns where the
    scheduler names them).  ``sched`` and ``datapath`` may be given as
    the dicts of :func:`dataclasses.asdict` (how the cocotb runner passes them)."""

    sched: SchedulerParams
    datapath: DatapathParams

    def __post_init__(self):
        if isinstance(self.sched, dict):
            object.__setattr__(self, "sched", SchedulerParams(**self.sched))
        if isinstance(self.datapath, dict):
            object.__setattr__(self, "datapath", DatapathParams(**self.datapath))
        sp, dp = self.sched, self.datapath
        if not isinstance(sp, SchedulerParams):
            raise TypeError(f"sched must be SchedulerParams, not {sp!r}")
        if not isinstance(dp, DatapathParams):
            raise TypeError(f"datapath must be DatapathParams, not {dp!r}")
        for name, a, b in (
            ("chiplets", sp.chiplets, dp.chiplets),
            ("experts", sp.experts, dp.experts),
            ("count_width", sp.count_width, dp.count_width),
            ("ring_path", sp.ring_path, dp.ring_path),
        ):
            if a != b:
                raise ValueError(
                    f"{name}: the scheduler's {a} != the datapath's {b} "
                    "(build the datapath with DatapathParams.for_scheduler)"
                )
        if sp.mesh_cols and sp.mesh_cols != dp.cols:
            raise ValueError(
                f"mesh_cols: the scheduler's {sp.mesh_cols} != the datapath's cols {dp.cols}"
            )

    @classmethod
    def for_scheduler(cls, sp: SchedulerParams, rows: int, cols: int, **kw) -> "ChipParams":
        return cls(sp, DatapathParams.for_scheduler(sp, rows, cols, **kw))


class Chip(wiring.Component):
    """Scheduler + chiplet array: the scheduler's ``dispatch`` stream drives the array's
    (DDR controller's job table), the array's ``done`` stream drives the scheduler's.

    Members
    -------
    gate : In(stream.Signature(gate_layout))
        Gate records of one layer (round), ``last`` on the final one (the scheduler's).
    req_init : In(stream.Signature(req_init_layout))
        Request-table admissions (the scheduler's).
    tokens : In(stream.Signature(tokens_layout)), always ready
        Token-table writes of the layer (the array's): the gate writes them with the
        records, before the layer's first beat.
    slices : In(stream.Signature(slices_layout)), always ready; only with ``slice_table``
        Slice-table writes (the array's).
    stall : In(ArrayLayout(4, chiplets)), ddr_stall : In(1)
        The array's link and DDR stall test hooks; tie to 0 in a product.
    beat : Out(stream.Signature(dispatch_layout, always_ready=True))
        Observation of the internal dispatch stream: valid in the cycle a beat is
        transferred (the array is always ready, so in every cycle the scheduler presents one).
    completion : Out(stream.Signature(chiplets, always_ready=True))
        Observation of the internal ``done`` stream: valid in the cycle a completion mask
        is transferred into the scheduler.
    events, occupancy : Out
        The array's per-chiplet compute completions and ring-buffer occupancy.
    sched_idle, array_idle : Out(1)
        The scheduler between rounds; the array with nothing left anywhere.
    idle : Out(1)
        Both.
    deferred, n_active : Out
        The scheduler's.
    overflow, bad_record, spurious_done, bad_dispatch, orphan : Out(1)
        The sticky error flags of the scheduler and of the DDR controller.

    The loop adds no register: a beat the scheduler presents is taken by the array in the
    same cycle, a completion mask the array presents while the scheduler waits is taken in
    the same cycle.  So the chip's timing is the two blocks' own.  Latency (the triggering
    transfer in cycle 0): the ``last`` gate record -> first beat in cycle
    ``Scheduler.latency`` (plus the deferral's re-merge and the balanced order's build,
    ``docs/blocks/scheduler.md``); a completion -> next beat in cycle 3; a completion the
    array raises while the scheduler is not waiting is held (and further completions merged
    into it) until the scheduler waits again.  Throughput: a dispatch beat every 3 cycles, a
    pre-load 2 cycles after its dispatch.  ``docs/blocks/chip.md`` compares this loop with
    the simulator's zero-latency one.
    """

    def __init__(self, p: ChipParams):
        if not isinstance(p, ChipParams):
            self._MustUse__silence = True
            raise TypeError(f"p must be ChipParams, not {p!r}")
        # the blocks check their own generics (ring_orders, admission) eagerly; a chip
        # refused is never elaborated (no UnusedElaboratable warning for it)
        try:
            sched = Scheduler(p.sched)
        except Exception:
            self._MustUse__silence = True
            raise
        try:
            array = ChipletArray(p.datapath)
        except Exception:
            sched._MustUse__silence = True
            self._MustUse__silence = True
            raise
        self.p, self.sched, self.array = p, sched, array
        sp, dp = p.sched, p.datapath
        n = dp.chiplets
        st = dp.slice_table
        super().__init__(
            {
                "gate": In(stream.Signature(gate_layout(sp))),
                "req_init": In(stream.Signature(req_init_layout(sp))),
                "tokens": In(stream.Signature(tokens_layout(dp), always_ready=True)),
                **(
                    {"slices": In(stream.Signature(slices_layout(dp), always_ready=True))}
                    if st
                    else {}
                ),
                "stall": In(data.ArrayLayout(4, n)),
                "ddr_stall": In(1),
                "beat": Out(stream.Signature(dispatch_layout(sp), always_ready=True)),
                "completion": Out(stream.Signature(n, always_ready=True)),
                "events": Out(events_layout(dp)),
                "occupancy": Out(data.ArrayLayout(dp.free_bits, n)),
                "sched_idle": Out(1),
                "array_idle": Out(1),
                "idle": Out(1),
                "deferred": Out(sp.requests),
                "n_active": Out(sp.position_bits),
                "overflow": Out(1),
                "bad_record": Out(1),
                "spurious_done": Out(1),
                "bad_dispatch": Out(1),
                "orphan": Out(1),
            }
        )

    @property
    def latency(self) -> int:
        """``Scheduler.latency``: the ``last`` gate record -> first beat."""
        return self.sched.latency

    def elaborate(self, platform):
        m = Module()
        m.submodules.scheduler = s = self.sched
        m.submodules.array = a = self.array
        wiring.connect(m, wiring.flipped(self.gate), s.gate)
        wiring.connect(m, wiring.flipped(self.req_init), s.req_init)
        wiring.connect(m, wiring.flipped(self.tokens), a.tokens)
        if self.p.datapath.slice_table:
            wiring.connect(m, wiring.flipped(self.slices), a.slices)
        # the loop: the array is always ready for beats
        wiring.connect(m, s.dispatch, a.dispatch)
        wiring.connect(m, a.done, s.done)
        m.d.comb += [
            a.stall.eq(self.stall),
            a.ddr_stall.eq(self.ddr_stall),
            self.beat.valid.eq(s.dispatch.valid),
            self.beat.payload.eq(s.dispatch.payload),
            self.completion.valid.eq(a.done.valid & s.done.ready),
            self.completion.payload.eq(a.done.payload),
            self.events.eq(a.events),
            self.occupancy.eq(a.occupancy),
            self.sched_idle.eq(s.idle),
            self.array_idle.eq(a.idle),
            self.idle.eq(s.idle & a.idle),
            self.deferred.eq(s.deferred),
            self.n_active.eq(s.n_active),
            self.overflow.eq(s.overflow),
            self.bad_record.eq(s.bad_record),
            self.spurious_done.eq(s.spurious_done),
            self.bad_dispatch.eq(a.bad_dispatch),
            self.orphan.eq(a.orphan),
        ]
        return m
