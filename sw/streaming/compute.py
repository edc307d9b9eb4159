"""Compute unit of one chiplet (golden model of the compute side of ``fsedp.hw.chiplet``):
Rules 1-2 choose the next micro-slice (received over a link first, then loaded from DDR,
lowest slot first); it takes ``max(1, tokens) * cycles_per_token`` cycles; the last station
retires a micro-slice of its expert's job."""

__all__ = ["decide", "retired", "commit", "duration"]


def decide(arr):
    """``(events, starts)``: per chiplet the computation ending this cycle ``(expert, index,
    final)`` and the one starting ``(slot, cycles)``."""
    p = arr.p
    n = p.chiplets
    # 5. compute
    events = [None] * n
    starts = [None] * n
    for c in range(n):
        ch = arr.chips[c]
        if ch.cnt == 1:
            events[c] = (ch.cexpert, ch.cindex, ch.cfinal)
        if ch.cnt > 1 and p.preempt:
            # [D11] the shortest present computation preempts a longer remainder
            best = None
            for i, s in enumerate(ch.slots):
                if s.present and s.comp:
                    d = duration(arr, c, s)
                    if d < ch.cnt - 1 and (best is None or d < best[1]):
                        best = (i, d)
            starts[c] = best
            continue
        if ch.cnt <= 1:
            cand = [i for i, s in enumerate(ch.slots) if s.present and s.comp]
            pick = next((i for i in cand if not ch.slots[i].ddr), None)
            if pick is None and cand:
                pick = cand[0]
            if pick is not None:
                s = ch.slots[pick]
                starts[c] = (pick, duration(arr, c, s))
    return events, starts


def duration(arr, c: int, s) -> int:
    """Cycles the computation of the micro-slice in slot ``s`` of chiplet ``c`` takes (what
    is left of it, if it was preempted)."""
    return s.rem or max(1, arr.tokens[c][s.expert]) * arr.p.cycles_per_token


def retired(arr, events) -> list:
    """Micro-slices retired this cycle, per job (entry slot)."""
    n = arr.p.chiplets
    # 6. retire, done
    retired = [0] * n
    for c in range(n):
        ev = events[c]
        if ev is not None and ev[2]:
            j = next(
                (j for j in range(n) if arr.jobs[j].valid and arr.jobs[j].expert == ev[0]), None
            )
            if j is None:
                arr.orphan = True
            else:
                retired[j] += 1
    return retired


def commit(arr, starts):
    """Next state of the compute units."""
    n = arr.p.chiplets
    # compute
    for c in range(n):
        ch = arr.chips[c]
        if ch.cnt == 1:
            ch.slots[ch.cslot].computing = False
        if starts[c] is not None and ch.cnt > 1:  # preempted: resumes with what is left
            cur = ch.slots[ch.cslot]
            cur.computing, cur.comp, cur.rem = False, True, ch.cnt - 1
        if starts[c] is not None:
            i, cycles = starts[c]
            s = ch.slots[i]
            s.rem = 0
            s.comp, s.computing = False, True
            ch.cnt, ch.cslot = cycles, i
            ch.cexpert, ch.cindex, ch.cfinal = s.expert, s.index, s.final
        elif ch.cnt:
            ch.cnt -= 1
