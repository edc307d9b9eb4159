"""Expert-Chiplet (E-C) matcher golden model.

* Eligibility: expert ``e`` may start when ``T_e & ICV != 0``.
* Entry chiplet ``c*``: the lowest-numbered chiplet of ``T_e & ICV``.  It is where the
  expert's first micro-slice enters and it names the *slot* of the running expert: the
  entry chiplets of running experts are distinct (an entry chiplet was idle, so no running
  expert covered it), hence at most ``C`` experts run at once and a completion is a ``C``-bit
  mask over slots.
* Ring order of the trajectory: chiplets of ``T_e`` in ascending number, wrapping around (or,
  with ``ring_orders`` 2 or 4 and another embedding chosen, or the ``cycle`` ring path, in
  that embedding's order: ``fsedp.params.ring_after``, ``ring_tables``).  ``next_hop[c]`` is
  the next chiplet of the ring after ``c`` for ``c`` in ``T_e`` (itself for a one-chiplet
  trajectory) and ``0`` for chiplets outside ``T_e``.  This is the routing table the routers
  receive; the ring is logical, XY routing maps it onto the mesh.
* Release: when the experts in slots ``done`` complete, a chiplet becomes idle iff it was
  covered by one of them and is covered by no expert that keeps running.
* Rule 4 pre-load: when an expert is dispatched and its pair partner is still unscheduled, not
  yet pre-loaded and not eligible under the updated ICV, the partner is pre-loaded on the
  lowest-numbered chiplet of its own trajectory (the chiplet's ring buffer then fills free
  slots with its micro-slices from DDR; the scheduler does not track buffer occupancy).
"""

from fsedp.params import ring_after

__all__ = ["lowest_bit", "entry_chiplet", "next_hops", "release_mask"]


def lowest_bit(x: int) -> int:
    if x <= 0:
        raise ValueError("lowest_bit of an empty mask")
    return (x & -x).bit_length() - 1


def entry_chiplet(traj: int, icv: int) -> int:
    return lowest_bit(traj & icv)


def next_hops(traj: int, chiplets: int, table=None) -> tuple[int, ...]:
    """The next-hop table of ``traj`` in the ring embedding ``table`` (``(seq, pos)``,
    ``SchedulerParams.ring_table``; ascending chiplet numbers when not given)."""
    seq, pos = table or (range(chiplets), range(chiplets))
    return tuple(
        ring_after(traj, c, chiplets, seq, pos) if traj >> c & 1 else 0 for c in range(chiplets)
    )


def release_mask(running: list[int], done: int) -> int:
    """``running[s]`` is the trajectory of the expert in slot ``s`` (0 = free slot)."""
    finished = keep = 0
    for s, traj in enumerate(running):
        if done >> s & 1:
            finished |= traj
        else:
            keep |= traj
    return finished & ~keep
