"""Exact expectations of the ring buffers' admission rungs (``fsedp.sw.streaming.ring_buffer``,
[D4], [D16], [D19], [D20]) on ledgers worked out by hand: each rule at its threshold, one
slot below and one above, the top hop class of a held micro-slice, and what a stored
micro-slice does next."""

import pickle
from types import SimpleNamespace

import pytest

from fsedp.params import DatapathParams
from fsedp.sw.streaming import compute
from fsedp.sw.streaming.ddr import AHEAD
from fsedp.sw.streaming.ring_buffer import Header, Room, Slot, arrive, free_slots, tick
from fsedp.sw.streaming.router import accept, offers
from fsedp.sw.streaming.watchdog import (
    MESSAGE_CHARS,
    SimulationStalled,
    scheduler_state,
    slot_status,
    stalled,
)


def ledger(admission, claims_by_chiplet, slots=6, top=4, on=True):
    """A Room over chiplets whose busy slots claim the given hop counts (``top``: H + 1)."""
    p = SimpleNamespace(slots=slots, held_claim=top, admission=admission)
    chips = []
    for claims in claims_by_chiplet:
        ss = [Slot(busy=True, claim=k) for k in claims]
        ss += [Slot() for _ in range(slots - len(claims))]
        chips.append(SimpleNamespace(slots=ss))
    return Room(SimpleNamespace(p=p, chips=chips, admission=on))


@pytest.mark.parametrize(
    "busy, r, admitted",
    [
        (2, 3, True),  # 4 free > 3
        (3, 3, False),  # 3 free, not more than 3
        (3, 2, True),
        (5, 0, True),  # one free slot takes a micro-slice at the end of its path
        (6, 0, False),
        (1, 4, True),  # a held one (H + 1 = 4) needs 5 free
        (2, 4, False),
    ],
)
def test_forward_count_admits_while_more_than_r_slots_are_free(busy, r, admitted):
    room = ledger("forward-count", [[1] * busy])
    assert room.free == [6 - busy]
    assert room.admits(0, r) is admitted
    assert room.admits_load(0, r) is admitted  # a load: the same rule


def test_the_naive_rule_takes_any_free_slot_but_not_for_a_held_one():
    room = ledger("forward-count", [[1] * 5], on=False)
    assert room.rule == "naive"
    assert room.admits(0, 3) is True  # H = 3: any free slot
    assert room.admits(0, 4) is False  # held: H + 1 = 4 needs more than 4 free
    assert ledger("forward-count", [[1] * 1], on=False).admits(0, 4) is True
    assert ledger("forward-count", [[1] * 6], on=False).admits(0, 0) is False


def test_forward_state_ladder_by_hand():
    """K = 6, H + 1 = 4.  Busy slots claiming 1, 3, 3: for a newcomer with r hops, every
    rung i <= r needs N(>= i) + 1 + i <= 6: rung 4: 0 + 1 + 4; rung 3: 2 + 1 + 3 = 6 (the
    value: admitted); rung 1: 3 + 1 + 1.  A fourth claim of 3 puts rung 3 at 7: a newcomer
    with 3 or more hops is refused, one with 2 still admitted (rung 2: 3 + 1 + 2 = 6)."""
    room = ledger("forward-state", [[1, 3, 3], [1, 3, 3, 3]])
    assert room.claims == [[0, 1, 0, 2, 0], [0, 1, 0, 3, 0]]
    assert [room.admits(0, r) for r in range(5)] == [True] * 5
    assert [room.admits(1, r) for r in range(5)] == [True, True, True, False, False]
    assert room.fits(1, 2, 1) and not room.fits(1, 2, 2)  # two newcomers: rung 2 at 7


def test_forward_state_ladder_counts_rung_zero():
    """Six slots claiming 0 are full at rung 0: 6 + 1 + 0 > 6."""
    room = ledger("forward-state", [[0] * 5, [0] * 6])
    assert room.admits(0, 0) is True and room.admits(1, 0) is False


def test_a_ddr_load_leaves_the_rung_below_its_own():
    """[D20]: a load claiming r is admitted only if an arrival with min(r, H - 1) hops would
    still be after it.  Claims 1, 1, 3, 3 (K = 6, H + 1 = 4): an arrival with 3 hops fits
    (rung 3: 2 + 1 + 3; rung 1: 4 + 1 + 1), a load with 3 hops does not: with it taken,
    rung 1 holds 4 + 2 + 1 = 7.  With one claim of 1 fewer, both fit."""
    room = ledger("forward-state", [[1, 1, 3, 3], [1, 3, 3]])
    assert room.admits(0, 3) is True and room.admits_load(0, 3) is False
    assert room.admits(1, 3) is True and room.admits_load(1, 3) is True
    # a held load (H + 1 = 4) checks the rung below the top: min(4, 2) = 2, two newcomers
    assert room.admits_load(1, 4) is True
    # a load at the end of its path checks rung 0 only: 4 + 1 and 4 + 2, both <= 6
    assert room.admits_load(0, 0) is True
    # five slots claiming 0: an arrival fits (5 + 1 + 0 = 6), a load does not (5 + 2 + 0)
    full = ledger("forward-state", [[0] * 5])
    assert full.admits(0, 0) is True and full.admits_load(0, 0) is False


def test_take_accounts_one_admission():
    room = ledger("forward-state", [[1, 3]])
    room.take(0, 2)
    assert room.free == [3] and room.claims == [[0, 1, 1, 1, 0]]
    count = ledger("forward-count", [[1, 3]])
    count.take(0, 2)
    assert count.free == [3] and not hasattr(count, "claims")


def test_counting_ledger_is_forward_count_only():
    arr = SimpleNamespace(p=SimpleNamespace(slots=6, held_claim=4, admission="forward-count"))
    arr.admission = True
    room = Room.counting(arr, [2, 5])
    assert (room.free, room.rule, room.slots, room.top) == ([2, 5], "forward-count", 6, 4)
    assert room.admits(0, 1) is True and room.admits(0, 2) is False
    arr.admission = False
    assert Room.counting(arr, [1]).rule == "naive"
    arr.p.admission = "forward-state"
    with pytest.raises(ValueError, match="^a ledger of free counts is forward-count, not forward"):
        Room.counting(arr, [1])


def test_what_a_stored_micro_slice_does_next():
    """2 x 2 mesh (0 1 / 3 2), a ring over 0, 1, 2: at its station 1 with a leg left, it is
    computed and sent on to 2 (east of 1 is none: 2 is south); at its last station it is
    computed only; in transit it is sent on to its destination."""
    p = DatapathParams(rows=2, cols=2)
    h = Header(expert=3, index=0, traj=0b0111, dest=1, legs=1, r=2)
    assert arrive(p, 1, h) == dict(
        comp=True, send=True, final=False, dest=2, legs=0, dir=p.direction(1, 2), r=2
    )
    last = Header(expert=3, index=0, traj=0b0111, dest=2, legs=0, r=0)
    assert arrive(p, 2, last) == dict(comp=True, send=False, final=True, dest=2, legs=0, dir=0, r=0)
    assert arrive(p, 3, h) == dict(
        comp=False, send=True, final=False, dest=1, legs=1, dir=p.direction(3, 1), r=2
    )
    # the ring's second embedding (backwards): after 1 comes 0
    assert arrive(p, 1, h, order=1)["dest"] == 0


def test_a_stored_micro_slice_claims_its_hops_or_the_held_claim():
    """store() writes arrive()'s fields into the slot: at station 1 of the ring 0, 1, 2 with
    r = 2 hops left, a slot that is not held claims r (2); a held one claims the
    parameters' held claim whatever its r."""
    from fsedp.sw.streaming.ring_buffer import store

    p = DatapathParams(rows=2, cols=2)
    h = Header(expert=3, index=0, traj=0b0111, dest=1, legs=1, r=2)
    arr = SimpleNamespace(p=p, chips=[chip([Slot(), Slot()])] * 4, ring_order=[0] * 4)
    store(arr, 1, 0, h, wait=2, ddr=False, held=False)
    s0 = arr.chips[1].slots[0]
    assert (s0.busy, s0.wait, s0.held, s0.claim, s0.r, s0.dest, s0.legs) == (
        True, 2, False, 2, 2, 2, 0,
    )  # fmt: skip
    assert p.held_claim != 2
    store(arr, 1, 1, h, wait=0, ddr=True, held=True)
    s1 = arr.chips[1].slots[1]
    assert (s1.held, s1.ddr, s1.claim) == (True, True, p.held_claim)


def test_slot_states_and_the_tick():
    s = Slot(busy=True)
    assert s.present and s.releasable
    for field in ("resv", "held", "comp", "computing", "send"):
        t = Slot(busy=True, **{field: True})
        assert not t.releasable
        assert t.present is (field not in ("resv", "held"))
    assert not Slot(busy=True, wait=1).present and not Slot(busy=True, tx=1).releasable
    ch = SimpleNamespace(slots=[Slot(busy=True, wait=2, tx=1), Slot(busy=True)], link_busy=[2, 0])
    tick(SimpleNamespace(chips=[ch]), [[False, True]])
    assert (ch.slots[0].busy, ch.slots[0].wait, ch.slots[0].tx) == (True, 1, 0)
    assert ch.slots[1].busy is False and ch.link_busy == [1, 0]
    assert free_slots(ch.slots) == 1


# ----------------------------------------------------------------------------- the watchdog


@pytest.mark.parametrize(
    "flags, status",
    [
        ({}, "done"),
        ({"resv": True}, "loading"),
        ({"wait": 3}, "arriving"),
        ({"held": AHEAD}, "ahead"),
        ({"held": True}, "held"),
        ({"comp": True}, "compute"),
        ({"computing": True}, "computing"),
        ({"send": True}, "send"),
        ({"tx": 2}, "sending"),
        ({"resv": True, "wait": 1, "held": True, "comp": True}, "loading+arriving+held+compute"),
        ({"computing": True, "send": True, "tx": 1}, "computing+send+sending"),
    ],
)
def test_slot_status_words(flags, status):
    args = dict(resv=False, wait=0, held=False, comp=False, computing=False, send=False, tx=0)
    args.update(flags)
    assert slot_status(**args) == status


STATE = {
    "cycle": 120,
    "chiplets": [
        {"computing": None, "slots": [(0, 5, 1, 3, 1, "held"), (2, 5, 2, 3, 1, "send")]},
        {"computing": (5, 0, 1), "slots": []},
    ],
    "jobs": [{"entry": 1, "expert": 5, "traj": 3, "loaded": 2, "retired": 1, "count": 4}],
    "preloads": [{"expert": 6, "traj": 2, "chiplet": 1, "loaded": 1, "count": 3}],
    "ddr_queued": [0, 0],
    "done_pending": 0,
    "bad_dispatch": True,
    "orphan": True,
    "scheduler": {"in_round": True, "running": {1: 3, 3: 8}, "undispatched": [7, 2]},
}


def test_the_stall_message_by_hand():
    e = SimulationStalled("python", STATE)
    assert str(e) == (
        "layer stalled at cycle 120 (python engine): nothing can happen any more; "
        "the datapath refused a dispatch beat (bad_dispatch); "
        "a micro-slice retired with no job (orphan); "
        "the scheduler waits for done of slot(s) 1, 3; 2 expert(s) not dispatched; "
        "jobs: e5@1 loaded 2/4 retired 1; pre-loads: e6 1/3; "
        "slots c0: e5#1 held e5#2 send"
    )
    assert e.engine == "python" and e.cycle == 120 and e.orphan is True
    assert e.state is STATE and e.jobs == STATE["jobs"]
    again = pickle.loads(pickle.dumps(e))
    assert str(again) == str(e) and again.state == STATE and again.engine == "python"


def test_the_stall_message_without_anything_to_say():
    quiet = {"cycle": 7, "chiplets": [{"computing": None, "slots": []}], "jobs": []}
    assert str(SimulationStalled("compiled", quiet)) == (
        "layer stalled at cycle 7 (compiled engine): nothing can happen any more; "
        "jobs: none; slots all free"
    )


def test_the_stall_message_is_cut_at_its_limit():
    many = dict(STATE, jobs=[dict(STATE["jobs"][0], expert=k) for k in range(60)])
    msg = str(SimulationStalled("python", many))
    assert len(msg) == MESSAGE_CHARS and msg.endswith("...")
    exact = {"cycle": 1, "chiplets": [], "jobs": []}
    text = str(SimulationStalled("python", exact))
    pad = MESSAGE_CHARS - len(text)
    exact["cycle"] = int("1" * (pad + 1))  # the message exactly at the limit: not cut
    assert len(str(SimulationStalled("python", exact))) == MESSAGE_CHARS
    assert not str(SimulationStalled("python", exact)).endswith("...")
    exact["cycle"] = int("1" * (pad + 2))  # one character over: cut
    over = str(SimulationStalled("python", exact))
    assert len(over) == MESSAGE_CHARS and over.endswith("...")


def test_the_schedulers_side_of_a_stall():
    plan = SimpleNamespace(order=[4, 9, 2])
    sched = SimpleNamespace(plan=plan, scheduled=[True, False, False], running=[0, 6, 0, 1])
    assert scheduler_state(sched) == {
        "in_round": True,
        "running": {1: 6, 3: 1},
        "undispatched": [9, 2],
    }
    closed = SimpleNamespace(plan=None, scheduled=[], running=[0, 0])
    assert scheduler_state(closed) == {"in_round": False, "running": {}, "undispatched": []}
    e = stalled("python", {"cycle": 3, "jobs": []}, closed)
    assert e.state["scheduler"] == scheduler_state(closed) and e.cycle == 3


# ----------------------------------------------------------------------------- router, compute


def chip(slots, busy=(0, 0, 0, 0), rr=0, **kw):
    return SimpleNamespace(slots=slots, link_busy=list(busy), rr=rr, **kw)


def sending(d, r, **kw):
    return Slot(busy=True, send=True, dir=d, r=r, **kw)


def test_a_link_offers_the_fewest_hops_left():
    """Chiplet 0 of a 1 x 2 mesh (its east neighbour is chiplet 1; no north, south, west).
    East: slots 0 (3 hops left) and 1 (2) and 2 (2): slot 1, the fewest, then the lower
    slot.  Slots transmitting, held, reserved or arriving are not offered."""
    slots = [sending(1, 3), sending(1, 2), sending(1, 2), sending(1, 0, tx=1)]
    slots += [sending(1, 0, held=True), sending(1, 0, resv=True), sending(1, 0, wait=1)]
    slots += [sending(3, 0), Slot(busy=True, dir=1, r=0)]  # west: no link; not sending
    arr = SimpleNamespace(chips=[chip(slots)], nb=[[None, 1, None, None]])
    assert offers(arr, 0, 0) == [None, 1, None, None]
    assert offers(arr, 0, 0b0010) == [None, None, None, None]  # east stalled
    arr.chips[0].link_busy[1] = 2
    assert offers(arr, 0, 0) == [None, None, None, None]  # east link still busy


class Ledger:
    """Admits a micro-slice or load with fewer than ``limit`` hops left (one limit, or one
    per chiplet); records what it takes.  ``free``: 3 slots less each chiplet's limit."""

    def __init__(self, limit):
        self.limit, self.taken = limit, []
        self.free = [3 - x for x in limit] if isinstance(limit, list) else None

    def admits(self, c, r):
        return r < (self.limit[c] if isinstance(self.limit, list) else self.limit)

    admits_load = admits

    def take(self, c, r):
        self.taken.append((c, r))


def test_accepts_round_robin_over_the_inputs_and_the_lowest_free_slot():
    """2 x 2 (0 1 / 3 2).  Chiplet 1 is offered a micro-slice from 0 (arriving on its west
    input, 2 hops left after it) and one from 2 (south input, 1 hop left).  Round robin from
    input 2 (south): 2's is taken, into chiplet 1's lowest free slot (1)."""
    p = DatapathParams(rows=2, cols=2)
    a = Slot(busy=True, send=True, dir=1, r=3, expert=4, index=1, traj=0b0111, dest=1, legs=1)
    b = Slot(busy=True, send=True, dir=0, r=2, expert=5, index=0, traj=0b0110, dest=1, legs=0)
    chips = [chip([a, Slot()]), chip([Slot(busy=True), Slot(), Slot()], rr=2)]
    chips += [chip([b, Slot()]), chip([Slot()])]
    arr = SimpleNamespace(p=p, chips=chips, nb=[[p.neighbour(c, d) for d in range(4)]
                                                for c in range(4)])  # fmt: skip
    room = Ledger(limit=3)
    got = accept(arr, [0, 0, 0, 0], room)
    assert got[0] is None and got[2] is None and got[3] is None
    d, src, s, h, slot = got[1]
    assert (d, src, s, slot) == (2, 2, 0, 1) and h == Header(5, 0, 0b0110, 1, 0, 1)
    assert room.taken == [(1, 1)]
    # from input 3 (west) on: 0's is taken, one hop fewer than it had
    chips[1].rr = 3
    d, src, s, h, slot = accept(arr, [0, 0, 0, 0], Ledger(limit=3))[1]
    assert (d, src, s, slot) == (3, 0, 0, 1) and h.r == 2
    # a ledger that admits only the end of a path: 0's (2 hops left) is refused, 2's taken
    d, src, s, h, slot = accept(arr, [0, 0, 0, 0], Ledger(limit=2))[1]
    assert (d, src) == (2, 2)


def test_compute_takes_a_received_micro_slice_before_a_loaded_one():
    """Slots 0 (loaded from DDR) and 2 (received over a link) are present with a computation
    pending: slot 2 goes first, for max(1, tokens) x cycles_per_token cycles."""
    p = SimpleNamespace(chiplets=1, preempt=False, cycles_per_token=3)
    s0 = Slot(busy=True, comp=True, ddr=True, expert=1)
    s2 = Slot(busy=True, comp=True, expert=2)
    ch = chip([s0, Slot(), s2], cnt=0, cslot=0, cexpert=0, cindex=0, cfinal=False)
    arr = SimpleNamespace(p=p, chips=[ch], tokens=[[0, 4, 0]])
    assert compute.decide(arr) == ([None], [(2, 3)])  # expert 2 has no token here: 1 x 3
    assert compute.duration(arr, 0, s0) == 12 and compute.duration(arr, 0, Slot(rem=5)) == 5
    s2.comp = False
    assert compute.decide(arr) == ([None], [(0, 12)])
    s0.ddr = False
    ch.cnt, ch.cexpert, ch.cindex, ch.cfinal = 1, 7, 3, True  # the last cycle of another
    assert compute.decide(arr) == ([(7, 3, True)], [(0, 12)])
    ch.cnt = 2
    assert compute.decide(arr) == ([None], [None])  # busy, no preemption


def test_compute_commit_by_hand():
    """Chiplet 0 ends its computation (1 cycle left) and starts nothing: its slot stops
    computing, the counter goes to 0.  Chiplet 1 is preempted with 2 cycles left by slot 1
    (3 cycles, a remainder of 5 from an earlier preemption): slot 0 resumes later with 1
    cycle (rem 1, pending again); slot 1 starts afresh (rem 0) for 3 cycles.  Chiplet 2
    counts down (4 -> 3)."""
    a0 = Slot(busy=True, computing=True, expert=1)
    a1 = Slot(busy=True, computing=True, expert=2, index=3)
    b1 = Slot(busy=True, comp=True, expert=6, index=2, final=True, rem=5)
    c2 = Slot(busy=True, computing=True, expert=3)
    chips = [
        chip([a0], cnt=1, cslot=0, cexpert=1, cindex=0, cfinal=False),
        chip([a1, b1], cnt=2, cslot=0, cexpert=2, cindex=3, cfinal=False),
        chip([c2], cnt=4, cslot=0, cexpert=3, cindex=0, cfinal=False),
    ]
    arr = SimpleNamespace(p=SimpleNamespace(chiplets=3), chips=chips)
    compute.commit(arr, [None, (1, 3), None])
    assert a0.computing is False and chips[0].cnt == 0
    assert (a1.computing, a1.comp, a1.rem) == (False, True, 1) and a1.computing is False
    assert (b1.computing, b1.comp) == (True, False) and b1.rem == 0
    ch = chips[1]
    assert (ch.cnt, ch.cslot, ch.cexpert, ch.cindex, ch.cfinal) == (3, 1, 6, 2, True)
    assert c2.computing is True and chips[2].cnt == 3


def test_a_final_computation_retires_a_micro_slice_of_its_job():
    jobs = [SimpleNamespace(valid=True, expert=4), SimpleNamespace(valid=False, expert=5)]
    jobs += [SimpleNamespace(valid=True, expert=5)]
    arr = SimpleNamespace(p=SimpleNamespace(chiplets=3), jobs=jobs, orphan=False)
    assert compute.retired(arr, [(5, 0, True), (4, 1, False), (5, 2, True)]) == [0, 0, 2]
    assert arr.orphan is False
    assert compute.retired(arr, [(9, 0, True), None, None]) == [0, 0, 0] and arr.orphan


def test_the_watchdog_state_of_an_array_by_hand():
    """Chiplet 0 busy in slots 0, 2, 3, 5, 6, 7 and 8 (each with one flag: its word), slot 1
    free, not computing; chiplet 1 computing e4#2 with 3 cycles left, no busy slot.  Two open
    jobs of three entries, one open pre-load of two; the flags as counts (true when not 0)."""
    from fsedp.sw.streaming.watchdog import array_state

    def slot(busy=True, **flags):
        base = dict(resv=False, wait=0, held=False, comp=False, computing=False, send=False)
        base.update(tx=0, expert=9, index=1, traj=0b11, dest=1)
        base.update(flags)
        return SimpleNamespace(busy=busy, **base)

    slots = [
        slot(resv=True), slot(busy=False), slot(wait=2), slot(comp=True), slot(busy=False),
        slot(computing=True), slot(send=True), slot(tx=1), slot(held=True, index=4),
    ]  # fmt: skip
    chips = [
        SimpleNamespace(slots=slots, cexpert=0, cindex=0, cnt=0),
        SimpleNamespace(slots=[slot(busy=False)], cexpert=4, cindex=2, cnt=3),
    ]
    job = dict(expert=9, traj=3, loaded=2, retired=1, count=4)
    jobs = [
        SimpleNamespace(valid=True, **job),
        SimpleNamespace(valid=False, **job),
        SimpleNamespace(valid=True, **dict(job, expert=5, loaded=4)),
    ]
    pre = [
        SimpleNamespace(valid=False, expert=1, traj=1, chiplet=0, loaded=0, count=1),
        SimpleNamespace(valid=True, expert=6, traj=2, chiplet=1, loaded=1, count=3),
    ]
    arr = SimpleNamespace(
        chips=chips, jobs=jobs, pre=pre, fifos=[[1, 2], []], cycle=77, done_pending=0b100,
        bad_dispatch=2, orphan=1,
    )  # fmt: skip
    words = [(0, "loading"), (2, "arriving"), (3, "compute"), (5, "computing"), (6, "send")]
    words += [(7, "sending")]
    assert array_state(arr) == {
        "cycle": 77,
        "chiplets": [
            {
                "computing": None,
                "slots": [(i, 9, 1, 3, 1, w) for i, w in words] + [(8, 9, 4, 3, 1, "held")],
            },
            {"computing": (4, 2, 3), "slots": []},
        ],
        "jobs": [
            {"entry": 0, "expert": 9, "traj": 3, "loaded": 2, "retired": 1, "count": 4},
            {"entry": 2, "expert": 5, "traj": 3, "loaded": 4, "retired": 1, "count": 4},
        ],
        "preloads": [{"expert": 6, "traj": 2, "chiplet": 1, "loaded": 1, "count": 3}],
        "ddr_queued": [2, 0],
        "done_pending": 0b100,
        "bad_dispatch": True,
        "orphan": True,
    }
    sched = SimpleNamespace(plan=None, scheduled=[], running=[0, 0])
    e = stalled("compiled", array_state(arr), sched)
    assert e.engine == "compiled" and e.state["scheduler"] == {
        "in_round": False, "running": {}, "undispatched": [],
    }  # fmt: skip


def test_the_stall_message_lists_every_job_pre_load_and_chiplet():
    state = dict(
        STATE,
        jobs=STATE["jobs"] + [dict(STATE["jobs"][0], expert=7, entry=2)],
        preloads=STATE["preloads"] + [dict(STATE["preloads"][0], expert=8)],
        chiplets=[STATE["chiplets"][0], {"computing": None, "slots": [(1, 6, 0, 2, 1, "held")]}],
        bad_dispatch=False,
        orphan=False,
        scheduler={},
    )
    assert str(SimulationStalled("python", state)) == (
        "layer stalled at cycle 120 (python engine): nothing can happen any more; "
        "jobs: e5@1 loaded 2/4 retired 1, e7@2 loaded 2/4 retired 1; "
        "pre-loads: e6 1/3, e8 1/3; "
        "slots c0: e5#1 held e5#2 send; c1: e6#0 held"
    )
    assert str(SimulationStalled("python", {"cycle": 3})) == (
        "layer stalled at cycle 3 (python engine): nothing can happen any more; "
        "jobs: none; slots all free"
    )


# ---------------------------------------------------------------------- the DDR controller


def test_retiring_micro_slices_ends_a_job_at_its_count():
    """Job 0 (count 4, 2 retired) retires 2 more: done exactly at its count, its entry's
    bit set and the job closed; job 1 (count 2) retires 1 and stays; job 2 retires none."""
    from fsedp.sw.streaming.ddr import Job, retire_jobs

    jobs = [Job(True, count=4, retired=2), Job(True, count=2), Job(True, count=3)]
    arr = SimpleNamespace(p=SimpleNamespace(chiplets=3), jobs=jobs)
    assert retire_jobs(arr, [2, 1, 0]) == 0b001
    assert (jobs[0].valid, jobs[0].retired) == (False, 4)
    assert (jobs[1].valid, jobs[1].retired) == (True, 1) and jobs[2].retired == 0
    assert retire_jobs(arr, [0, 1, 3]) == 0b110


def window_arr(hot=2, tokens=(2, 0, 9)):
    """3 chiplets; expert 0's tokens per chiplet ``tokens``; 3 cycles a token, a DDR load
    every 6 cycles: a micro-slice is compute-heavy when max(1, tokens) x 3 > 6."""
    p = SimpleNamespace(chiplets=3, hot_window=hot, cycles_per_token=3, ddr_interval=6)
    return SimpleNamespace(p=p, tokens=[[t] for t in tokens])


def test_the_hot_window_of_a_compute_heavy_expert():
    """[D12] On chiplets 0, 1 (traj 0b011): at most 2 tokens, 2 x 3 = 6 <= 6, light:
    always within.  On 0, 2 (chiplet 2 has 9 tokens): heavy, within while fewer than 2
    micro-slices are loaded and not retired (loaded + extra - retired < 2)."""
    from fsedp.sw.streaming.ddr import Job, window_quota, within_window

    arr = window_arr()
    light = Job(True, 0, 0b011, loaded=5, retired=0, count=8)
    assert within_window(arr, light, 0) and window_quota(arr, light) == 3
    heavy = Job(True, 0, 0b101, loaded=3, retired=2, count=8)
    assert within_window(arr, heavy, 0) and not within_window(arr, heavy, 1)
    assert window_quota(arr, heavy) == 1  # 2 - (3 - 2)
    heavy.retired = 1
    assert not within_window(arr, heavy, 0) and window_quota(arr, heavy) == 0
    heavy.retired, heavy.loaded = 6, 7
    assert window_quota(arr, heavy) == 1  # its last micro-slice: min(8 - 7, 2 - (7 - 6))
    # no window: always within, the quota is what is left
    arr0 = window_arr(hot=0)
    assert within_window(arr0, heavy, 100) and window_quota(arr0, heavy) == 1
    # no tokens anywhere counts as one: 3 <= 6, light; also with a DDR interval of 4
    assert within_window(window_arr(tokens=(0, 0, 0)), Job(True, 0, 0b101, 9, 0, 0, 12), 0)
    short = window_arr(tokens=(0, 0, 0))
    short.p.ddr_interval = 4
    assert within_window(short, Job(True, 0, 0b101, 9, 0, 0, 12), 0)
    # exactly at the DDR interval is light, one token more is heavy
    assert within_window(window_arr(tokens=(0, 0, 2)), heavy, 5)
    assert not within_window(window_arr(tokens=(0, 0, 3)), heavy, 5)


def test_a_loads_needed_room_is_its_path_under_forward_admission():
    from fsedp.sw.streaming.ddr import need

    # the ring over 0, 1, 2 entered at 0: 2 hops on to its end ascending, 3 the other way
    p = DatapathParams(rows=2, cols=2, ring_orders=2)
    arr = SimpleNamespace(p=p, ring_order=[0, 1], admission=True)
    assert (need(arr, 0b0111, 0, 0), need(arr, 0b0111, 0, 1)) == (2, 3)
    arr.admission = False
    assert need(arr, 0b0111, 0, 1) == 0


@pytest.mark.parametrize(
    "field, value",
    [("traj", 0), ("traj", 0b10001), ("entry", 4), ("entry", -1), ("entry", 3),
     ("expert", 8), ("expert", -1), ("order", 1)],
)  # fmt: skip
def test_a_malformed_beat_is_flagged_and_opens_nothing(field, value):
    """A 2 x 2 array of 8 experts, one ring embedding: no trajectory, one beyond the
    chiplets, an entry outside them or off the trajectory (3 is not on 0b0111), an expert
    or embedding beyond the table's."""
    from fsedp.sw.scheduler import DISPATCH, Dispatch
    from fsedp.sw.streaming.ddr import Job, take_dispatch

    p = SimpleNamespace(chiplets=4, experts=8, ring_orders=1)
    arr = SimpleNamespace(p=p, bad_dispatch=False, jobs=[Job() for _ in range(4)])
    beat = dict(kind=DISPATCH, expert=2, count=3, traj=0b0111, entry=0, order=0)
    beat[field] = value
    take_dispatch(arr, Dispatch(next_hop=(), **beat))
    assert arr.bad_dispatch is True and not any(j.valid for j in arr.jobs)


def test_ddr_deliveries_after_the_latency_across_the_age_wrap():
    """Latency 3, ages mod 16: a load issued at 15 is delivered at 2 ((2 - 15) mod 16 =
    3), one issued at 0 is not yet (2); a stalled DDR delivers nothing.  A held pre-load
    is released when its expert runs (a valid job) or is being dispatched, not when a
    pre-load beat names it."""
    from collections import deque

    from fsedp.sw.scheduler import DISPATCH, PRELOAD, Dispatch
    from fsedp.sw.streaming.ddr import Job, deliveries

    h5, h6 = Header(5, 0, 0b11, 0, 1, 1), Header(6, 0, 0b11, 0, 1, 1)
    arr = SimpleNamespace(
        p=SimpleNamespace(ddr_latency=3), now=2, age_bits=4, jobs=[Job(), Job()],
        fifos=[deque([(0, 1, h5, True, 15)]), deque([(1, 2, h6, False, 0)])],
    )  # fmt: skip
    inp = SimpleNamespace(dispatch=None, ddr_stall=False)
    assert deliveries(arr, inp) == [(0, (0, 1, h5, True))]
    assert deliveries(arr, SimpleNamespace(dispatch=None, ddr_stall=True)) == []
    arr.now = 3
    assert deliveries(arr, inp) == [(0, (0, 1, h5, True)), (1, (1, 2, h6, False))]
    arr.jobs[1] = Job(True, expert=5)
    assert deliveries(arr, inp)[0] == (0, (0, 1, h5, False))
    arr.jobs[1] = Job(False, expert=5)

    def beat(kind, e):
        return SimpleNamespace(dispatch=Dispatch(kind, e, 1, 0b11, 0, ()), ddr_stall=False)

    assert deliveries(arr, beat(DISPATCH, 5))[0] == (0, (0, 1, h5, False))
    assert deliveries(arr, beat(PRELOAD, 5))[0] == (0, (0, 1, h5, True))
    assert deliveries(arr, beat(DISPATCH, 6))[0] == (0, (0, 1, h5, True))


def test_ddr_commit_stores_reserves_and_counts_the_gaps(monkeypatch):
    """A delivery leaves its FIFO and is stored; an issue reserves its slot (claiming its
    hops, or H + 1 when held), enters its channel's FIFO stamped now, and moves the job on
    (the next load's chiplet along its ring, the round-robin past it); a channel that
    issued waits ddr_interval - 1 cycles, one that did not counts its gap down."""
    from collections import deque

    from fsedp.sw.streaming.ddr import Job, Preload, commit

    p = DatapathParams(rows=2, cols=2, ddr_interval=4)
    chips = [chip([Slot(), Slot()]) for _ in range(4)]
    arr = SimpleNamespace(
        p=p, chips=chips, channels=1, now=9, fifos=[deque([(0, 0, None, False, 1)])],
        jobs=[Job(), Job(True, 3, 0b0111, 1, 0, 1, 4), Job(), Job()],
        pre=[Preload(True, 2, 0b0011, 0, 0, 2)], ring_order=[0] * 16, gaps=[2], ddr_rr=0,
    )  # fmt: skip
    h = Header(3, 1, 0b0111, 1, 2, 3)
    hp = Header(2, 0, 0b0011, 0, 1, 1)
    stored = []
    import fsedp.sw.streaming.ddr as ddr

    monkeypatch.setattr(ddr, "store", lambda arr, c, slot, h, **kw: stored.append((c, slot, h, kw)))
    commit(arr, [(0, (2, 1, h, False))], [("job", 1, 1), ("pre", 0, 0)],
           [(1, 1, h, False), (0, 0, hp, True)], [True])  # fmt: skip
    assert stored == [(2, 1, h, dict(wait=0, ddr=True, held=False))]
    assert list(arr.fifos[0]) == [(1, 1, h, False, 9), (0, 0, hp, True, 9)]
    s = chips[1].slots[1]
    assert (s.busy, s.resv, s.claim) == (True, True, 3)
    assert chips[0].slots[0].claim == p.held_claim
    assert (arr.jobs[1].loaded, arr.jobs[1].target, arr.ddr_rr) == (2, 2, 2)
    assert arr.pre[0].loaded == 1 and arr.gaps == [3]
    commit(arr, [], [], [], [False])
    assert arr.gaps == [2]


def ddr_array(**kw):
    """A 2 x 2 array (two ring embeddings) of 3 slots per chiplet, for the beats' tests."""
    from fsedp.sw.streaming.ddr import Job, Preload

    p = DatapathParams(rows=2, cols=2, ring_orders=2, **kw)
    return SimpleNamespace(
        p=p, chips=[chip([Slot(), Slot(), Slot()]) for _ in range(4)], ring_order=[0] * 16,
        jobs=[Job() for _ in range(4)], pre=[Preload(True, 9), Preload()],
        slices=[5] * 16, bad_dispatch=False,
    )  # fmt: skip


def test_a_preload_beat_opens_a_preload_entry_and_a_dispatch_takes_it_over():
    """Pre-load of expert 3 on chiplets 0, 1 (entry 1, embedding 1): the free entry 1 opens
    with 5 micro-slices and none loaded.  After 2 are loaded (held in slots), its dispatch
    at entry 0 opens job 0 with the pre-load's loaded and count, closes the entry, and
    releases the held micro-slices of expert 3 (claiming their hops), not another's."""
    from fsedp.sw.scheduler import DISPATCH, PRELOAD, Dispatch
    from fsedp.sw.streaming.ddr import Job, Preload, take_dispatch

    arr = ddr_array()
    take_dispatch(arr, Dispatch(PRELOAD, 3, 5, 0b0011, 1, (), order=1))
    assert arr.pre[1] == Preload(True, 3, 0b0011, 1, 0, 5) and arr.ring_order[3] == 1
    arr.pre[1].loaded = 2
    mine = Slot(busy=True, held=True, expert=3, r=1, claim=9)
    other = Slot(busy=True, held=True, expert=4, r=1, claim=9)
    arr.chips[1].slots[:2] = [mine, other]
    take_dispatch(arr, Dispatch(DISPATCH, 3, 5, 0b0011, 0, (), order=1))
    assert arr.jobs[0] == Job(True, 3, 0b0011, 2, 0, 0, 5) and not arr.pre[1].valid
    assert (mine.held, mine.claim) == (False, 1) and (other.held, other.claim) == (True, 9)
    assert not arr.bad_dispatch
    # a second dispatch into the running entry 0 is malformed; a pre-load with no free
    # entry opens nothing
    take_dispatch(arr, Dispatch(DISPATCH, 4, 5, 0b0011, 0, ()))
    assert arr.bad_dispatch and arr.jobs[0].expert == 3
    arr = ddr_array()
    arr.pre[1] = Preload(True, 8)
    take_dispatch(arr, Dispatch(PRELOAD, 3, 5, 0b0011, 1, ()))
    assert [q.expert for q in arr.pre] == [9, 8] and not arr.bad_dispatch
    # a dispatch without a pre-load: the slice table's count, nothing loaded
    take_dispatch(arr, Dispatch(DISPATCH, 3, 5, 0b0011, 1, ()))
    assert arr.jobs[1] == Job(True, 3, 0b0011, 0, 0, 1, 5)


def test_micro_slices_loaded_ahead_take_the_first_beats_trajectory():
    """Expert 2's micro-slices 0 (chiplet 1) and 1 (chiplet 3) were loaded ahead, held and
    without a trajectory.  Its dispatch on 0, 1 (ring 0 -> 1): the one on chiplet 1 starts
    its ring there (1 hop to go, legs 1), the one on 3 travels to the trajectory's nearest
    chiplet as a remote load does; both released (not held), the job starts with 2."""
    from fsedp.sw.scheduler import DISPATCH, Dispatch
    from fsedp.sw.streaming.ddr import AHEAD, load_ahead, take_dispatch

    arr = ddr_array()
    load_ahead(arr, [(1, 2, 0), (3, 2, 1)])
    s = arr.chips[1].slots[0]
    assert (s.busy, s.held, s.ddr, s.expert, s.index, s.traj, s.dest) == (
        True, AHEAD, True, 2, 0, 0, 1,
    )  # fmt: skip
    assert s.claim == arr.p.held_claim
    take_dispatch(arr, Dispatch(DISPATCH, 2, 5, 0b0011, 0, ()))
    a, b = arr.chips[1].slots[0], arr.chips[3].slots[0]
    assert (a.held, a.traj, a.legs, a.r) == (False, 0b0011, 0, 1)
    dest, r = arr.p.remote_entry(0b0011, 3, 0)
    assert (b.held, b.traj, b.r) == (False, 0b0011, r) and arr.jobs[0].loaded == 2
    arr.chips[0].slots[:] = [Slot(busy=True)] * 3
    with pytest.raises(ValueError) as e:
        load_ahead(arr, [(0, 5, 0)])
    assert str(e.value) == "no free slot on chiplet 0 for a carried micro-slice"


def test_one_channel_issues_the_next_running_experts_load_else_a_preload():
    """One channel, round robin from job 1: job 1 (expert 3 on 0, 1, next load to chiplet
    1) issues into chiplet 1's highest free slot, its header the ring's remaining hops;
    job 2 has loaded all.  The channel is then used: no pre-load.  Without a loadable job
    the pre-load of expert 9 goes to its chiplet 2 (claiming H + 1).  A stalled DDR, a gap
    still counting or a full FIFO issue nothing."""
    from collections import deque

    from fsedp.sw.streaming.ddr import Job, Preload, issue

    p = DatapathParams(rows=2, cols=2, ring_orders=2)
    arr = SimpleNamespace(
        p=p, chips=[chip([Slot(), Slot(), Slot(busy=True)]) for _ in range(4)], channels=1,
        jobs=[Job(), Job(True, 3, 0b0011, 0, 0, 1, 2), Job(True, 4, 0b0110, 2, 0, 1, 2), Job()],
        pre=[Preload(True, 9, 0b0110, 2, 0, 3)], ring_order=[0] * 16, ddr_rr=1, gaps=[0],
        fifos=[deque()], fifo_depth=2, admission=True,
    )  # fmt: skip
    inp = SimpleNamespace(ddr_stall=False)
    room = Ledger([9, 9, 9, 9])
    issues, used, out = issue(arr, inp, room)
    need = p.path_hops(0b0011, 1, 0)
    assert issues == [("job", 1, 1, 3, 0b0011, 0, 1)] and used == [True]
    assert out == [(1, 1, Header(3, 0, 0b0011, 1, 1, need), False)]
    assert room.taken == [(1, need)]
    arr.jobs[1].loaded = 2
    room = Ledger([9, 9, 9, 9])
    issues, used, out = issue(arr, inp, room)
    assert issues == [("pre", 0, 2, 9, 0b0110, 0, 2)] and room.taken == [(2, p.held_claim)]
    assert out[0][3] is True
    # the pre-load's chiplet refuses a held micro-slice: nothing
    assert issue(arr, inp, Ledger([9, 9, p.held_claim, 9]))[0] == []
    for blocked in (dict(stall=True), dict(gap=1), dict(full=True)):
        arr.gaps = [blocked.get("gap", 0)]
        arr.fifos = [deque([None, None])] if blocked.get("full") else [deque()]
        got = issue(arr, SimpleNamespace(ddr_stall=blocked.get("stall", False)), Ledger([9] * 4))
        assert got[0] == [] and got[1] == [False], blocked


def chiplet_channels(jobs, pre, admission=True):
    from collections import deque

    p = DatapathParams(rows=2, cols=2, ddr_channels=4)
    return SimpleNamespace(
        p=p, chips=[chip([Slot(), Slot(), Slot()]) for _ in range(4)], channels=4, jobs=jobs,
        pre=pre, ring_order=[0] * 16, ddr_rr=0, gaps=[0] * 4,
        fifos=[deque() for _ in range(4)], fifo_depth=2, admission=admission,
    )  # fmt: skip


def test_a_channel_per_chiplet_picks_local_then_preload_then_remote():
    """[D18] Expert 3 runs on 0, 1 (3 to load), expert 4 on 1, 2 (1 to load), expert 9 is
    pre-loaded for 3.  Chiplet 0 and 1 load expert 3 (round robin from job 0), 2 loads 4,
    3 (covered by no running expert) pre-loads 9: local loads first, in chiplet order,
    then the pre-load."""
    from fsedp.sw.streaming.ddr import Job, Preload, issue

    jobs = [Job(True, 3, 0b0011, 0, 0, 0, 3), Job(True, 4, 0b0110, 0, 0, 1, 1), Job(), Job()]
    arr = chiplet_channels(jobs, [Preload(True, 9, 0b1000, 3, 0, 2)])
    room = Ledger([9] * 4)
    issues, used, _ = issue(arr, SimpleNamespace(ddr_stall=False), room)
    assert issues == [
        ("job", 0, 0, 3, 0b0011, 0, 0), ("job", 0, 1, 3, 0b0011, 1, 1),
        ("job", 1, 2, 4, 0b0110, 0, 2), ("pre", 0, 3, 9, 0b1000, 0, 3),
    ]  # fmt: skip
    assert used == [True] * 4
    p = arr.p
    assert room.taken == [(0, p.path_hops(0b0011, 0, 0)), (1, p.path_hops(0b0011, 1, 0)),
                          (2, p.path_hops(0b0110, 2, 0)), (3, p.held_claim)]  # fmt: skip


def test_a_chiplet_whose_pick_is_not_granted_idles():
    """Expert 3 (on 0, 1) has one micro-slice left to load: chiplets 0 and 1 both pick it,
    0's pick is granted, 1 idles.  Chiplet 3 (off every trajectory, no pre-load) picks a
    remote load of expert 3 under forward admission, which its quota no longer grants; 2
    loads expert 4.  Without forward admission there are no remote picks."""
    from fsedp.sw.streaming.ddr import Job, issue

    def run(admission):
        jobs = [Job(True, 3, 0b0011, 2, 0, 0, 3), Job(True, 4, 0b0110, 0, 0, 1, 4), Job(), Job()]
        arr = chiplet_channels(jobs, [], admission)
        return issue(arr, SimpleNamespace(ddr_stall=False), Ledger([9] * 4))

    issues, used, _ = run(True)
    assert issues == [("job", 0, 0, 3, 0b0011, 2, 0), ("job", 1, 2, 4, 0b0110, 0, 2)]
    assert used == [True, False, True, False]
    # once expert 3 has nothing left, chiplets 0 and 3 load expert 4 remotely, after the
    # local loads
    jobs = [Job(True, 3, 0b0011, 3, 0, 0, 3), Job(True, 4, 0b0110, 0, 0, 1, 4), Job(), Job()]
    arr = chiplet_channels(jobs, [])
    issues, used, _ = issue(arr, SimpleNamespace(ddr_stall=False), Ledger([9] * 4))
    d0, d3 = arr.p.remote_entry(0b0110, 0, 0)[0], arr.p.remote_entry(0b0110, 3, 0)[0]
    assert issues == [("job", 1, 1, 4, 0b0110, 0, 1), ("job", 1, 2, 4, 0b0110, 1, 2),
                      ("job", 1, 0, 4, 0b0110, 2, d0), ("job", 1, 3, 4, 0b0110, 3, d3)]  # fmt: skip
    assert [i[2] for i in run(False)[0]] == [0, 2]


def test_rule5_loads_into_the_emptiest_admitting_chiplet_of_the_trajectory():
    """Trajectory 0, 1, 2 with 2, 5, 5 free slots (3, off it, has 9): chiplet 1 (the first
    of the emptiest); with 1's channel busy, 2; none admitting: none.  Without Rule 5 the
    job's striped target, if its channel and room allow."""
    from fsedp.sw.streaming.ddr import Job, ddr_target

    p = SimpleNamespace(rule5=True, chiplets=4)
    arr = SimpleNamespace(p=p, admission=False)
    job = Job(True, 0, 0b0111, target=2)
    room = Ledger([9] * 4)
    room.free = [2, 5, 5, 9]
    assert ddr_target(arr, 0, job, room, lambda c: True) == 1
    assert ddr_target(arr, 0, job, room, lambda c: c != 1) == 2
    assert ddr_target(arr, 0, job, Ledger([0] * 4), lambda c: True) is None
    p.rule5 = False
    assert ddr_target(arr, 0, job, room, lambda c: True) == 2
    assert ddr_target(arr, 0, job, room, lambda c: c != 2) is None
    assert ddr_target(arr, 0, job, Ledger([9, 9, 0, 9]), lambda c: True) is None


# ---------------------------------------------------------------------- the idle probes


def probe_arr(channels=1, jobs=(), pre=(), gaps=None, fifos=None, hot=0):
    from collections import deque

    p = SimpleNamespace(chiplets=2, hot_window=hot, cycles_per_token=9, ddr_interval=1)
    return SimpleNamespace(
        p=p, jobs=list(jobs), pre=list(pre), channels=channels, gaps=gaps or [0] * channels,
        fifos=fifos or [deque() for _ in range(channels)], fifo_depth=1,
        tokens=[[1] * 4, [1] * 4],
    )  # fmt: skip


def test_why_a_ddr_channel_idles_by_hand():
    """One channel: issuing or in its gap -> None; stalled or its queue full -> stall; a
    running expert with slices left whose target has no free slot -> full, with free slots
    -> admission; only a pre-load -> preload; only a compute-heavy expert at its window ->
    window; nothing left -> none.  A load issued this cycle counts as loaded."""
    from collections import deque

    from fsedp.sw.streaming.ddr import Job, Preload
    from fsedp.sw.streaming.probe import ddr_idle

    go = SimpleNamespace(ddr_stall=False)
    job = Job(True, 1, 0b11, loaded=1, target=1, count=2)
    assert ddr_idle(probe_arr(jobs=[job]), go, [True], [], [0, 0]) == [None]
    assert ddr_idle(probe_arr(jobs=[job], gaps=[1]), go, [False], [], [0, 0]) == [None]
    stall = SimpleNamespace(ddr_stall=True)
    assert ddr_idle(probe_arr(jobs=[job]), stall, [False], [], [0, 0]) == ["stall"]
    full_q = probe_arr(jobs=[job], fifos=[deque([0])])
    assert ddr_idle(full_q, go, [False], [], [0, 0]) == ["stall"]
    assert ddr_idle(probe_arr(jobs=[job]), go, [False], [], [5, 0]) == ["full"]
    assert ddr_idle(probe_arr(jobs=[job]), go, [False], [], [0, 1]) == ["admission"]
    # its last micro-slice issued this cycle: nothing left
    assert ddr_idle(probe_arr(jobs=[job]), go, [False], [("job", 0)], [0, 1]) == ["none"]
    pre = Preload(True, 2, 0b11, chiplet=0, loaded=0, count=1)
    assert ddr_idle(probe_arr(pre=[pre]), go, [False], [], [1, 0]) == ["preload"]
    assert ddr_idle(probe_arr(pre=[pre]), go, [False], [], [0, 1]) == ["full"]
    assert ddr_idle(probe_arr(pre=[pre]), go, [False], [("pre", 0)], [1, 1]) == ["none"]
    heavy = Job(True, 1, 0b11, loaded=1, retired=0, target=1, count=3)
    assert ddr_idle(probe_arr(jobs=[heavy], hot=1), go, [False], [], [1, 1]) == ["window"]
    assert ddr_idle(probe_arr(), go, [False], [], [1, 1]) == ["none"]
    # a channel per chiplet loads into its own chiplet
    two = probe_arr(channels=2, jobs=[job])
    assert ddr_idle(two, go, [False, True], [], [0, 3]) == ["full", None]
    assert ddr_idle(two, go, [False, False], [], [1, 0]) == ["admission", "full"]
    two = probe_arr(channels=2, pre=[pre])
    assert ddr_idle(two, go, [False, False], [], [1, 1]) == ["preload", "preload"]


def test_why_a_compute_unit_idles_by_hand():
    """Computing -> None; starting a micro-slice loaded from DDR -> ddr, received -> link;
    a DDR load under way -> ddr, a transfer arriving -> link; a held pre-load -> held; a
    neighbour's slot offering this chiplet a micro-slice -> link; nothing -> none."""
    from fsedp.sw.streaming.probe import pe_idle

    def arr(slots0, slots1=(), cnt=0):
        chips = [
            SimpleNamespace(cnt=cnt, slots=list(slots0)),
            SimpleNamespace(cnt=0, slots=list(slots1)),
        ]
        return SimpleNamespace(chips=chips, nb=[[None, 1, None, None], [None, None, None, 0]])

    assert pe_idle(arr([], cnt=2), [None, None])[0] is None
    assert pe_idle(arr([Slot(busy=True, ddr=True)]), [(0, 3), None])[0] == "ddr"
    assert pe_idle(arr([Slot(busy=True)]), [(0, 3), None])[0] == "link"
    assert pe_idle(arr([Slot(busy=True, resv=True)]), [None, None])[0] == "ddr"
    assert pe_idle(arr([Slot(busy=True, wait=2, ddr=True)]), [None, None])[0] == "ddr"
    assert pe_idle(arr([Slot(busy=True, wait=2)]), [None, None])[0] == "link"
    assert pe_idle(arr([Slot(busy=True, held=True)]), [None, None])[0] == "held"
    # a held slot before a load under way: the load is what it waits for
    both = [Slot(busy=True, held=True), Slot(busy=True, resv=True)]
    assert pe_idle(arr(both), [None, None])[0] == "ddr"
    # chiplet 1 offers chiplet 0 a micro-slice (its west output leads to 0)
    offer = Slot(busy=True, send=True, tx=0, dir=3)
    assert pe_idle(arr([], [offer]), [None, None]) == ["link", "none"]
    assert pe_idle(arr([], [Slot(busy=True, send=True, tx=1, dir=3)]), [None, None])[0] == "none"
    assert pe_idle(arr([], [Slot(busy=True, send=True, tx=0, dir=1)]), [None, None])[0] == "none"
    assert pe_idle(arr([Slot()]), [None, None]) == ["none", "none"]


# ---------------------------------------------------------------------- the array's tables


def test_the_token_and_slice_tables_take_only_writes_in_range():
    """Token counts are masked to count_width bits (6: 70 -> 6); a chiplet or expert out of
    range is ignored.  The slice table takes 1 .. micro_slices (4) per expert, ignores 0,
    5 and experts out of range, and nothing at all without slice_table; a reset restores
    micro_slices but keeps the token table (a memory)."""
    from fsedp.sw.streaming.array import StepIn, StreamingArray

    arr = StreamingArray(DatapathParams(rows=2, cols=2, slice_table=True))
    for w in [(1, 3, 70), (4, 0, 9), (-1, 0, 9), (0, 16, 9), (0, -1, 9), (3, 15, 63)]:
        arr.step(StepIn(tokens=w))
    assert arr.tokens[1][3] == 6 and arr.tokens[3][15] == 63
    assert sum(map(sum, arr.tokens)) == 69
    for w in [(2, 1), (3, 4), (5, 0), (6, 5), (16, 2), (-1, 2)]:
        arr.step(StepIn(slices=w))
    assert arr.slices[2:7] == [1, 4, 4, 4, 4] and arr.slices[15] == 4
    arr.reset()
    assert arr.slices == [4] * 16 and arr.tokens[1][3] == 6
    off = StreamingArray(DatapathParams(rows=2, cols=2))
    off.step(StepIn(slices=(2, 1)))
    assert off.slices[2] == 4


def test_the_done_stream_holds_until_taken_and_gathers_new_ones():
    """A done mask stays on the stream while the scheduler is not ready and is cleared
    once taken; one finishing meanwhile is ORed in.  The age counter wraps at age_bits."""
    from fsedp.sw.streaming.array import StepIn, StreamingArray

    arr = StreamingArray(DatapathParams(rows=2, cols=2))
    arr.done_pending = 0b0010
    assert arr.step(StepIn(done_ready=False)).done == 0b0010 and arr.done_pending == 0b0010
    assert arr.step(StepIn(done_ready=True)).done == 0b0010 and arr.done_pending == 0
    arr.now = (1 << arr.age_bits) - 1
    arr.step(StepIn())
    assert arr.now == 0 and arr.cycle == 3


def test_the_counters_horizon_is_the_nearest_counter_to_matter():
    """A transfer with 5 cycles left, a link busy 4, a computation with 3 cycles left (it
    decides at 1: 2 to go), a DDR gap of 6 and a load 3 cycles from its latency of 4
    (issued 1 ago): the nearest is 2.  Nothing counting: 0."""
    from collections import deque

    from fsedp.sw.streaming.array import StreamingArray

    arr = StreamingArray(DatapathParams(rows=2, cols=2, ddr_latency=4))
    assert arr._counters_horizon() == 0
    arr.chips[0].slots[0].tx = 5
    arr.chips[1].link_busy = [0, 4, 0, 0]
    assert arr._counters_horizon() == 4
    arr.gaps = [6]
    arr.now = 5
    arr.fifos = [deque([(0, 0, None, False, 4)])]
    assert arr._counters_horizon() == 3
    arr.chips[2].cnt = 3
    assert arr._counters_horizon() == 2
    arr.chips[3].slots[1].wait = 1
    assert arr._counters_horizon() == 1


def test_a_router_commit_by_hand(monkeypatch):
    """Chiplet 1 accepted, on its west input (3), slot 0 of chiplet 0 into its slot 1: the
    source stops offering it, its transfer and the east link (the opposite side) count
    link_cycles - 1 = 2; chiplet 1's round robin resumes after west (at 0); the micro-slice
    is stored arriving in 2 cycles, not from DDR, not held."""
    from fsedp.sw.streaming.router import commit

    p = DatapathParams(rows=2, cols=2, link_cycles=3)
    chips = [chip([Slot(busy=True, send=True, dir=1)]), chip([Slot(busy=True), Slot()], rr=2)]
    chips += [chip([Slot()]), chip([Slot()])]
    arr = SimpleNamespace(p=p, chips=chips)
    h = Header(4, 1, 0b0011, 1, 0, 0)
    stored = []
    import fsedp.sw.streaming.router as router

    monkeypatch.setattr(
        router, "store", lambda arr, c, slot, h, **kw: stored.append((c, slot, h, kw))
    )
    commit(arr, [None, (3, 0, 0, h, 1), None, None])
    s = chips[0].slots[0]
    assert (s.send, s.tx) == (False, 2) and chips[0].link_busy == [0, 2, 0, 0]
    assert chips[1].rr == 0
    assert stored == [(1, 1, h, dict(wait=2, ddr=False, held=False))]


def test_per_chiplet_picks_round_robin_from_the_pointer_and_past_a_busy_channel():
    """Experts 3 (entry 0) and 5 (entry 3) both cover chiplet 0: with the round robin at
    2 (order 2, 3, 0, 1) chiplet 0 loads expert 5.  Chiplet 0's channel busy (a gap): the
    others still pick (1 loads expert 3)."""
    from fsedp.sw.streaming.ddr import Job, issue

    def run(gaps):
        jobs = [Job(True, 3, 0b0011, 0, 0, 0, 4), Job(), Job(), Job(True, 5, 0b1001, 0, 0, 3, 4)]
        arr = chiplet_channels(jobs, [])
        arr.ddr_rr, arr.gaps = 2, gaps
        return issue(arr, SimpleNamespace(ddr_stall=False), Ledger([9] * 4))[0]

    got = run([0, 0, 0, 0])
    assert got[0] == ("job", 3, 0, 5, 0b1001, 0, 0) and got[1] == ("job", 0, 1, 3, 0b0011, 0, 1)
    got = run([1, 0, 0, 0])
    assert [i[2] for i in got][:2] == [1, 3] and all(i[2] != 0 for i in got)


def test_per_chiplet_without_forward_admission_goes_on_to_the_next_chiplet():
    """Without forward admission chiplet 0 (on no trajectory) has no remote pick, and
    chiplet 1 still loads its local expert."""
    from fsedp.sw.streaming.ddr import Job, issue

    jobs = [Job(), Job(True, 3, 0b0010, 0, 0, 1, 4), Job(), Job()]
    arr = chiplet_channels(jobs, [], admission=False)
    got = issue(arr, SimpleNamespace(ddr_stall=False), Ledger([9] * 4))[0]
    assert got == [("job", 1, 1, 3, 0b0010, 0, 1)]


def test_a_remote_load_enters_by_the_experts_ring_embedding():
    """Expert 3 on 0, 1, 2 in embedding 1 (backwards): chiplet 3's remote load enters where
    that embedding's whole path from 3 is shortest."""
    from fsedp.sw.streaming.ddr import Job, issue

    jobs = [Job(True, 3, 0b0111, 3, 0, 0, 8), Job(), Job(), Job()]
    arr = chiplet_channels(jobs, [])
    arr.p = DatapathParams(rows=2, cols=2, ddr_channels=4, ring_orders=2)
    arr.ring_order[3] = 1
    got = issue(arr, SimpleNamespace(ddr_stall=False), Ledger([9] * 4))[0]
    remote = [i for i in got if i[2] == 3]
    assert remote == [("job", 0, 3, 3, 0b0111, 6, arr.p.remote_entry(0b0111, 3, 1)[0])]
    assert arr.p.remote_entry(0b0111, 3, 1) != arr.p.remote_entry(0b0111, 3, 0)


def test_per_chiplet_preloads_are_granted_up_to_what_is_left():
    """Pre-load 0 (expert 8 on 0, 1) has one micro-slice left: chiplets 0 and 1 both pick
    it, 0's is granted, 1 idles; chiplet 3 still gets pre-load 1 (expert 9).  Chiplet 2
    (on neither) loads pre-load 0 remotely by its embedding, which is spent."""
    from fsedp.sw.streaming.ddr import Job, Preload, issue

    pre = [Preload(True, 8, 0b0011, 0, 3, 4), Preload(True, 9, 0b1000, 3, 0, 2)]
    arr = chiplet_channels([Job() for _ in range(4)], pre)
    got = issue(arr, SimpleNamespace(ddr_stall=False), Ledger([9] * 4))[0]
    assert got == [("pre", 0, 0, 8, 0b0011, 3, 0), ("pre", 1, 3, 9, 0b1000, 0, 3)]


def test_a_remote_preload_enters_by_the_experts_ring_embedding():
    """Pre-load of expert 8 on 0, 1, 2 in embedding 1; chiplet 3 (off it) pre-loads it
    remotely, entering where embedding 1's whole path from 3 is shortest."""
    from fsedp.sw.streaming.ddr import Job, Preload, issue

    arr = chiplet_channels([Job() for _ in range(4)], [Preload(True, 8, 0b0111, 0, 0, 9)])
    arr.p = DatapathParams(rows=2, cols=2, ddr_channels=4, ring_orders=2)
    arr.ring_order[8] = 1
    got = issue(arr, SimpleNamespace(ddr_stall=False), Ledger([9] * 4))[0]
    assert got[-1] == ("pre", 0, 3, 8, 0b0111, 3, arr.p.remote_entry(0b0111, 3, 1)[0])


def test_micro_slices_loaded_ahead_enter_by_their_experts_embedding(monkeypatch):
    """Ring 0, 1, 2.  Expert 2 (embedding 0) has a micro-slice ahead on chiplet 1: it starts
    there, 3 hops from the end of that embedding's path (a remote entry would go by 0).
    Expert 5 (embedding 1) has one on chiplet 0, on its path (3 hops in embedding 1, 2 in
    0), and one on chiplet 3, off it, which enters at 2 (at 0 in embedding 0), 3 hops."""
    import fsedp.sw.streaming.ddr as ddr
    from fsedp.sw.scheduler import DISPATCH, Dispatch

    arr = ddr_array()
    ddr.load_ahead(arr, [(1, 2, 0), (0, 5, 0), (3, 5, 1)])
    stored = []
    monkeypatch.setattr(ddr, "store", lambda arr, c, k, h, **kw: stored.append((c, h, kw)))
    ddr.take_dispatch(arr, Dispatch(DISPATCH, 2, 5, 0b0111, 0, (), order=0))
    ddr.take_dispatch(arr, Dispatch(DISPATCH, 5, 5, 0b0111, 2, (), order=1))
    assert [(c, h.expert, h.index, h.dest, h.legs, h.r) for c, h, _ in stored] == [
        (1, 2, 0, 1, 2, 3), (0, 5, 0, 0, 2, 3), (3, 5, 1, 2, 2, 3),
    ]  # fmt: skip
    # each is in place already (no wait), loaded from DDR, no longer held
    assert all(kw == dict(wait=0, ddr=True, held=False) for _, _, kw in stored)
