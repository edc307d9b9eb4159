"""Micro-slice streaming golden model: ring buffers, routers and the DDR controller of a
chiplet array, cycle by cycle (virtualization Rules 1-5 of FSE-DP, Section IV-C).

Split by block like its RTL: :mod:`.ring_buffer` (slots, arrival, release),
:mod:`.router` (offers, accepts, transfers), :mod:`.ddr` (Rule 4/5 loads, pre-loads,
dispatch beats, jobs), :mod:`.compute` (Rules 1-2 compute, retirement) and :mod:`.array`
(the chiplet array: one cycle is the blocks' decisions on the registered state, then their
next state); :mod:`.watchdog` is the layer loops' test that nothing can happen any more
(:class:`SimulationStalled`).

This is the executable specification of the datapath RTL (``fsedp.hw.ring_buffer``,
``router``, ``chiplet``, ``ddr_ctrl``, ``chiplet_array``): both compute the same next state
from the same registered state and inputs, so the cosimulation compares them cycle by cycle
(``tb/tb_chiplet_array.py``, ``tests/test_datapath_rtl.py``).  The page
``docs/blocks/datapath.md`` explains the rules with figures; the decisions taken where the
paper is silent are marked **[D]**.

Objects
-------
* **Micro-slice** (packet): ``expert``, ``index`` (0..M-1), ``traj`` (trajectory mask),
  ``dest`` (next chiplet that computes it), ``legs`` (ring legs left after ``dest``) and
  ``r`` (physical link hops left).  Every router stores a micro-slice in a slot of its ring
  buffer before forwarding it (store-and-forward), computing it only where it is a *station*
  (``dest`` is the chiplet itself); other routers on an XY path only forward it (*transit*).
* **Slot** of a ring buffer: ``busy`` (allocated), ``resv`` (reserved by a DDR load still in
  flight), ``wait`` (cycles until its data has arrived), ``held`` (a Rule 4 pre-load waiting
  for its expert's dispatch), ``comp`` (compute pending here), ``computing``, ``send``
  (forward pending), ``tx`` (cycles of the outgoing transfer left), ``ddr`` (loaded from DDR
  here, i.e. *local*), ``final`` (last station).

Per cycle (all decisions from the registered state and this cycle's inputs)
--------------------------------------------------------------------------
1. **Offer** (router output port ``d``, Rules 1-2 forwarding): among the slots ready to
   forward in direction ``d`` the one with the fewest hops left ``r`` (ties: lowest slot),
   if the link is not busy and not stalled.  [D] An offer that is not accepted may be
   replaced by a better one the next cycle (the link is an offer/accept interface, see the
   deadlock argument).
2. **Accept** (router input side): the neighbour takes at most one micro-slice per cycle,
   round-robin over its four inputs among the *admissible* offers: a micro-slice that will
   still have ``r`` hops to go is admitted only while the buffer has more than ``r`` free
   slots (forward-count admission [D]; this is what makes streaming deadlock-free), counted
   after this cycle's DDR loads into that buffer (step 3 is admitted first [D19]).
3. **DDR issue** (Rule 4): every ``ddr_interval`` cycles (per channel) the controller loads
   the next micro-slice of a running expert (round-robin over the running experts) into the
   next chiplet of its trajectory in ring order, starting at the entry -- every chiplet of
   the trajectory loads its share, as chiplet 1 loads slice 1 in Figure 6 [D] -- or with
   Rule 5 into the trajectory chiplet with the most free slots, reserving a slot under the
   same admission (``r`` = hops of its whole path).  With one DDR channel per chiplet
   (``ddr_channels = rows x cols``, the simulator's chips) Rule 4 is chiplet-driven: every chiplet
   whose channel is free and that has room loads the next micro-slice of a running expert
   covering it, else pre-loads one of an expert of its trajectory; a chiplet that has
   neither loads for a running expert, else a pre-load, whose trajectory does not cover it
   (a *remote* load [D10]: the micro-slice enters the trajectory at the chiplet with the
   shortest whole path, never more than ``H`` hops; ``DatapathParams.remote_entry``), as
   Algorithm 1 pre-loads "to any idle buffer" and a die "loads weights from DDR or from
   peer dies" (Section V).  This keeps every channel busy while any expert has micro-slices
   to load.  Pre-loads (Rule 4 of Algorithm 1) come after running experts and are admitted
   only while more than ``H + 1`` slots are free; their slots are *held* until the expert
   is dispatched.
4. **DDR delivery**: ``ddr_latency`` cycles after its issue (later while DDR is stalled).
5. **Compute** (Rules 1-2): a chiplet whose compute unit is free starts the pending
   micro-slice received over a link (Rule 1), else a local one loaded from DDR (Rule 2),
   lowest slot first; it takes ``max(1, tokens) * cycles_per_token`` cycles, ``tokens``
   being the chiplet's token count for that expert.  A new compute may start in the last
   cycle of the previous one.
6. **Release** (Rule 3): a slot whose micro-slice is computed (if a station) and forwarded
   (if not the end of its path) is freed in the next cycle.  The last station *retires* the
   micro-slice; when all ``M`` micro-slices of an expert are retired, its entry slot is
   reported on the ``done`` stream (a mask of slots, as the scheduler takes it).

Timing: a transfer accepted in cycle ``t`` keeps the link busy until ``t + L`` and the
micro-slice is usable at the receiver from ``t + L`` (``L = link_cycles``); a DDR delivery
in cycle ``t`` is usable from ``t + 1``.
"""

from fsedp.sw.streaming.array import Chiplet, StepIn, StepOut, StreamingArray
from fsedp.sw.streaming.ddr import Job, Preload
from fsedp.sw.streaming.ring_buffer import Header, Slot, arrive
from fsedp.sw.streaming.watchdog import SimulationStalled

__all__ = [
    "Header",
    "Slot",
    "StepIn",
    "StepOut",
    "StreamingArray",
    "arrive",
    "Chiplet",
    "Job",
    "Preload",
    "SimulationStalled",
]
