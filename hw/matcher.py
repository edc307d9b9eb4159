from amaranth import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from fsedp.hw.common import lowest_bit, ring_next_hops
from fsedp.params import SchedulerParams

__all__ = ["ECMatcher"]


class ECMatcher(wiring.Component):
    """Expert-Chiplet matcher: eligibility, entry chiplet, ring routing table and the table of
    running experts (one slot per entry chiplet) that turns completions into releases.

    Members
    -------
    traj : In(C)
        Trajectory ``T_e`` of the candidate expert.
    icv : In(C)
        Current Idle Chiplet Vector.
    eligible : Out(1)
        ``T_e & ICV != 0``.
    entry : Out(chiplet_bits)
        ``c*``: lowest chiplet of ``T_e & ICV``.
    first : Out(chiplet_bits)
        Lowest chiplet of ``T_e`` (the Rule 4 pre-load chiplet).
    next_hop : Out(ArrayLayout(chiplet_bits, C))
        Ring routing table of ``T_e`` (the ring path's first embedding,
        ``ring_table(0)``: ascending chiplet numbers on the snake; wrapping).
    commit : In(1)
        Record ``T_e`` as running in slot ``entry`` (next cycle).
    done : In(C)
        Completion mask over slots, applied this cycle (several at once allowed).
    release : Out(C)
        Chiplets that become idle: covered by a completing expert and by no other running
        one.  Combinational from ``done`` (latency 0); feed it to the ICV.
    spurious : Out(1)
        ``done`` names a slot that is not running (those bits are ignored).
    running : Out(C)
        Slots with a running expert.

    All outputs are combinational; the slot table updates on the clock edge.
    """

    def __init__(self, p: SchedulerParams):
        self.p = p
        C, Cb = p.chiplets, p.chiplet_bits
        super().__init__(
            {
                "traj": In(C),
                "icv": In(C),
                "eligible": Out(1),
                "entry": Out(Cb),
                "first": Out(Cb),
                "next_hop": Out(data.ArrayLayout(Cb, C)),
                "commit": In(1),
                "done": In(C),
                "release": Out(C),
                "spurious": Out(1),
                "running": Out(C),
            }
        )

    def elaborate(self, platform):
        m = Module()
        C, Cb = self.p.chiplets, self.p.chiplet_bits
        slots = [Signal(C, name=f"slot{s}") for s in range(C)]
        m.d.comb += self.running.eq(sum((slots[s].any() << s for s in range(C)), 0))

        free = self.traj & self.icv
        m.d.comb += [
            self.eligible.eq(free.any()),
            self.entry.eq(lowest_bit(free, C, Cb)),
            self.first.eq(lowest_bit(self.traj, C, Cb)),
        ]
        for c, hop in enumerate(ring_next_hops(self.traj, C, Cb, self.p.ring_table(0)[0])):
            m.d.comb += self.next_hop[c].eq(hop)

        finished = 0
        keep = 0
        for s in range(C):
            finished = finished | (slots[s] & self.done[s].replicate(C))
            keep = keep | (slots[s] & (~self.done[s]).replicate(C))
        m.d.comb += [
            # entry dispatch (decision 28): a completion frees its entry chiplet only
            self.release.eq(
                (self.done & self.running) if self.p.entry_dispatch else finished & ~keep
            ),
            self.spurious.eq((self.done & ~self.running).any()),
        ]
        for s in range(C):
            with m.If(self.commit & (self.entry == s)):
                m.d.sync += slots[s].eq(self.traj)
            with m.Elif(self.done[s]):
                m.d.sync += slots[s].eq(0)
        return m
