"""Ring buffer of one chiplet (golden model of ``fsedp.hw.ring_buffer``): the micro-slice
slots, what a stored micro-slice does next (:func:`arrive`), storing (:func:`store`) and the
per-cycle release and counters (Rule 3, :func:`tick`)."""

from dataclasses import dataclass

from fsedp.params import DatapathParams, ring_after

__all__ = ["Header", "Slot", "Room", "arrive", "store", "tick", "free_slots"]


@dataclass(frozen=True)
class Header:
    """A micro-slice as it travels: on a link ``r`` counts the hops left *after* the
    receiver, in a DDR load the hops of the whole path."""

    expert: int
    index: int
    traj: int
    dest: int
    legs: int
    r: int


@dataclass
class Slot:
    busy: bool = False
    resv: bool = False
    wait: int = 0
    held: bool = False
    comp: bool = False
    computing: bool = False
    send: bool = False
    tx: int = 0
    ddr: bool = False
    final: bool = False
    rem: int = 0  # compute cycles left of a preempted micro-slice (0: not started)
    dir: int = 0
    r: int = 0
    expert: int = 0
    # slot storage (the RTL's lib.memory): the next leg of the micro-slice
    index: int = 0
    traj: int = 0
    dest: int = 0
    legs: int = 0
    #: the hops this slot counts for under forward-state admission ([D16]): its micro-slice's
    #: ``r``, or ``H + 1`` while it is held (pre-load, loaded ahead); set when the slot is
    #: reserved or written
    claim: int = 0

    @property
    def present(self) -> bool:
        return self.busy and not self.resv and self.wait == 0 and not self.held

    @property
    def releasable(self) -> bool:
        return (
            self.busy
            and not self.resv
            and self.wait == 0
            and not self.held
            and not self.comp
            and not self.computing
            and not self.send
            and self.tx == 0
        )


def arrive(p: DatapathParams, c: int, h: Header, order: int = 0) -> dict:
    """Slot fields of micro-slice ``h`` stored at chiplet ``c`` (station or transit); its
    ring's embedding is ``order``."""
    if h.dest == c:  # a station: compute here, then the next ring leg
        if h.legs:
            nxt = ring_after(h.traj, c, p.chiplets, *p.ring_table(order))
            return dict(
                comp=True,
                send=True,
                final=False,
                dest=nxt,
                legs=h.legs - 1,
                dir=p.direction(c, nxt),
                r=h.r,
            )
        return dict(comp=True, send=False, final=True, dest=c, legs=0, dir=0, r=h.r)
    return dict(
        comp=False,
        send=True,
        final=False,
        dest=h.dest,
        legs=h.legs,
        dir=p.direction(c, h.dest),
        r=h.r,
    )


def free_slots(slots) -> int:
    """Free slots of one ring buffer."""
    return sum(not s.busy for s in slots)


class Room:
    """This cycle's admission ledger of every ring buffer: what a micro-slice that will still
    have ``r`` hops to go may take, and what each admission leaves (the DDR loads first,
    on the registered free slots, then the routers' accepts in what they leave, as the
    hardware decides them: [D19]).

    * ``forward-count`` [D4]: admitted only while more than ``r`` slots are free.
    * ``forward-state`` [D16]: admitted only while, for every ``i <= r``, the slots claimed
      by micro-slices with at least ``i`` hops to go, this one included, leave ``i`` free:
      ``N(>= i) + 1 + i <= K``.  Micro-slices close to the end of their path do not count
      against one that starts a long one.
    * the naive rule (``admission=False``, only to show the deadlock): any free slot.

    A held micro-slice (pre-load, loaded ahead) claims ``H + 1`` under every rule.
    ``free[c]`` are the free slots left (Rule 5's emptiest chiplet, the idle probes)."""

    def __init__(self, arr):
        p = arr.p
        self.slots = p.slots
        self.top = p.held_claim
        self.free = [free_slots(ch.slots) for ch in arr.chips]
        self.rule = p.admission if arr.admission else "naive"
        if self.rule == "forward-state":
            self.claims = [[0] * (self.top + 1) for _ in arr.chips]
            for c, ch in enumerate(arr.chips):
                for s in ch.slots:
                    if s.busy:
                        self.claims[c][s.claim] += 1

    @classmethod
    def counting(cls, arr, free) -> "Room":
        """A forward-count ledger over given free-slot counts, one per chiplet: what the
        RTL's router and DDR controller see (a block's bench drives them as inputs)."""
        if arr.p.admission != "forward-count":
            raise ValueError(f"a ledger of free counts is forward-count, not {arr.p.admission}")
        room = cls.__new__(cls)
        room.slots, room.top = arr.p.slots, arr.p.held_claim
        room.free = list(free)
        room.rule = "forward-count" if arr.admission else "naive"
        return room

    def admits(self, c: int, r: int) -> bool:
        """Whether chiplet ``c`` admits a micro-slice with ``r`` hops to go (``H + 1``: a
        held one)."""
        if self.rule == "forward-state":
            return self.fits(c, r, 1)
        if self.rule == "naive" and r <= self.top - 1:
            return self.free[c] > 0
        return self.free[c] > r

    def admits_load(self, c: int, r: int) -> bool:
        """Whether chiplet ``c`` admits a DDR load claiming ``r`` ([D20]): as :meth:`admits`,
        and under forward-state admission only if, with the load taken, an arrival that will
        still have ``min(r, H - 1)`` hops to go would be admitted too -- a load leaves the
        rung below its own to the ring's traffic, so that fresh loads do not fill the top
        hop classes of every buffer and hold each other's first hops."""
        if not self.admits(c, r):
            return False
        return self.rule != "forward-state" or self.fits(c, min(r, self.top - 2), 2)

    def fits(self, c: int, r: int, new: int) -> bool:
        """Forward-state's ladder in chiplet ``c``: for every ``i <= r``, the slots claiming at
        least ``i`` hops and ``new`` more (each claiming ``r`` or more) leave ``i`` free:
        ``N(>= i) + new + i <= K``."""
        above = 0
        for i in range(self.top, -1, -1):
            above += self.claims[c][i]
            if i <= r and above + new + i > self.slots:
                return False
        return True

    def take(self, c: int, r: int):
        """Account one admission of a micro-slice claiming ``r`` into chiplet ``c``."""
        self.free[c] -= 1
        if self.rule == "forward-state":
            self.claims[c][r] += 1


def store(arr, c: int, slot: int, h: Header, wait: int, ddr: bool, held: bool):
    """Write micro-slice ``h`` into slot ``slot`` of chiplet ``c`` (a link arrival or a DDR
    delivery): what it does next follows from :func:`arrive`."""
    s = arr.chips[c].slots[slot]
    f = arrive(arr.p, c, h, arr.ring_order[h.expert])
    s.busy, s.resv, s.wait, s.held, s.ddr = True, False, wait, held, ddr
    s.computing, s.tx, s.rem = False, 0, 0
    s.comp, s.send, s.final, s.dir, s.r = f["comp"], f["send"], f["final"], f["dir"], f["r"]
    s.claim = arr.p.held_claim if held else f["r"]
    s.expert, s.index, s.traj, s.dest, s.legs = h.expert, h.index, h.traj, f["dest"], f["legs"]


def tick(arr, release):
    """Next state of every ring buffer: slots whose release condition held (Rule 3, on the
    registered state) are freed; arrival, transfer and link counters count down."""
    # slots: release (registered condition), counters
    for ch, rel in zip(arr.chips, release):
        for s, free_it in zip(ch.slots, rel):
            if free_it:
                s.busy = False
            if s.wait:
                s.wait -= 1
            if s.tx:
                s.tx -= 1
        ch.link_busy = [max(0, b - 1) for b in ch.link_busy]
