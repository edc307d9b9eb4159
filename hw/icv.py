from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from fsedp.params import SchedulerParams

__all__ = ["ICV"]


class ICV(wiring.Component):
    """Idle Chiplet Vector: an ``C``-bit register bank, 1 = idle.

    ``value' = (value | release) & ~alloc`` every cycle: allocation by AND-NOT with the
    trajectory, release by OR with the (already OR-ed) completion masks; a chiplet released
    and allocated in the same cycle ends busy.  Reset: all ones.

    Members
    -------
    alloc : In(C)
        Trajectory to allocate this cycle (0 = none).
    release : In(C)
        Chiplets that became idle this cycle (several completions OR-ed).
    value : Out(C)
        Current vector, read concurrently by the matcher.

    Latency: :attr:`latency` (1) cycle: an ``alloc``/``release`` of cycle 0 shows on
    ``value`` in cycle 1.  Throughput: one update per cycle.
    """

    def __init__(self, p: SchedulerParams):
        self.p = p
        C = p.chiplets
        super().__init__({"alloc": In(C), "release": In(C), "value": Out(C, init=(1 << C) - 1)})

    @property
    def latency(self) -> int:
        """Cycles from an update (cycle 0) to ``value`` (cycle ``latency``): a register."""
        return 1

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.value.eq((self.value | self.release) & ~self.alloc)
        return m
