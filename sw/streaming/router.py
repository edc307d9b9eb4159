"""Router of one chiplet (golden model of ``fsedp.hw.router``): Rules 1-2 forwarding.
Each output link offers the ready micro-slice with the fewest hops left (:func:`offers`);
each chiplet accepts at most one offer per cycle, round-robin over its inputs, under
forward-count or forward-state admission (:func:`accept`); an accepted transfer occupies
the link for ``link_cycles`` (:func:`commit`)."""

from fsedp.params import OPPOSITE
from fsedp.sw.streaming.ring_buffer import Header, store

__all__ = ["offers", "accept", "commit"]


def offers(arr, c: int, stall: int) -> list:
    """Per direction, the slot offered on that output link (or None): one pass over the
    slots, fewest hops left first, ties to the lower slot."""
    ch = arr.chips[c]
    best = [None, None, None, None]
    best_r = [0, 0, 0, 0]
    for i, s in enumerate(ch.slots):
        if s.send and s.busy and not s.resv and s.wait == 0 and not s.held and s.tx == 0:
            d = s.dir
            if best[d] is None or s.r < best_r[d]:
                best[d], best_r[d] = i, s.r
    nb, busy = arr.nb[c], ch.link_busy
    return [
        b if b is not None and nb[d] is not None and not busy[d] and not stall >> d & 1 else None
        for d, b in enumerate(best)
    ]


def accept(arr, stall, room) -> list:
    """Per chiplet, the accepted transfer ``(input dir, src chiplet, src slot, Header, slot)``
    or ``None``; ``room`` (:class:`~.ring_buffer.Room`, the registered state less this
    cycle's DDR loads, [D19]) takes each."""
    p = arr.p
    n = p.chiplets
    offers_ = [offers(arr, c, stall[c]) for c in range(n)]

    # 2. accepts: input port d of chiplet c is fed by its neighbour in direction d
    accepts = [None] * n  # (input dir, src chiplet, src slot, Header)
    for c in range(n):
        ch = arr.chips[c]
        for k in range(4):
            d = (ch.rr + k) % 4
            src = arr.nb[c][d]
            if src is None:
                continue
            s = offers_[src][OPPOSITE[d]]
            if s is None:
                continue
            sl = arr.chips[src].slots[s]
            h = Header(sl.expert, sl.index, sl.traj, sl.dest, sl.legs, sl.r - 1)
            if room.admits(c, h.r):
                slot = min(i for i, x in enumerate(ch.slots) if not x.busy)
                accepts[c] = (d, src, s, h, slot)
                break
        if accepts[c] is not None:
            room.take(c, accepts[c][3].r)
    return accepts


def commit(arr, accepts):
    """Next state of the links and buffers for this cycle's accepted transfers."""
    p = arr.p
    n = p.chiplets
    # transfers
    for c in range(n):
        a = accepts[c]
        if a is None:
            continue
        d, src, s, h, slot = a
        sch = arr.chips[src]
        sch.slots[s].send = False
        sch.slots[s].tx = p.link_cycles - 1
        sch.link_busy[OPPOSITE[d]] = p.link_cycles - 1
        arr.chips[c].rr = (d + 1) % 4
        store(arr, c, slot, h, wait=p.link_cycles - 1, ddr=False, held=False)
