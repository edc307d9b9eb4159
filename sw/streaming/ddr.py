"""DDR controller (golden model of ``fsedp.hw.ddr_ctrl``): Rule 4 loads of running experts
(striped over the trajectory, or Rule 5's emptiest chiplet, or chiplet-driven with a channel
per chiplet, remote loads included), pre-loads of Algorithm 1, the issue-to-delivery
pipeline, dispatch beats and the retirement of jobs."""

from dataclasses import dataclass

from fsedp.params import ring_after
from fsedp.sw.scheduler import DISPATCH, PRELOAD, Dispatch
from fsedp.sw.streaming.ring_buffer import Header, store

__all__ = [
    "Job",
    "Preload",
    "issue",
    "deliveries",
    "commit",
    "take_dispatch",
    "retire_jobs",
    "ddr_target",
    "need",
    "within_window",
    "window_quota",
    "per_chiplet",
    "AHEAD",
    "load_ahead",
    "bind_ahead",
]

#: ``Slot.held`` of a micro-slice pre-loaded for this layer before it began (a predicted
#: pre-load across layers, ``docs/codesign.md``): held, and not yet bound to a trajectory
AHEAD = 2


@dataclass
class Job:
    valid: bool = False
    expert: int = 0
    traj: int = 0
    loaded: int = 0
    retired: int = 0
    target: int = 0  # chiplet of the next load (Rule 4 striping), starts at the entry
    count: int = 0  # micro-slices it streams (the slice table's entry, [D13])


@dataclass
class Preload:
    valid: bool = False
    expert: int = 0
    traj: int = 0
    chiplet: int = 0
    loaded: int = 0
    count: int = 0  # micro-slices it streams (the slice table's entry, [D13])


def issue(arr, inp, room):
    """This cycle's DDR loads: ``(issues, used, issue_out)``; ``room`` (the ring buffers'
    admission ledger on the registered state, :class:`~.ring_buffer.Room`) takes every
    load; the routers' accepts then take what the loads leave ([D19])."""
    p = arr.p
    n = p.chiplets
    # 3. DDR issue: running experts round-robin, then pre-loads; one load per channel
    issues = []  # (kind, index, target, expert, traj, micro-slice)
    top = p.held_claim
    used = [False] * arr.channels

    def channel_ok(target):
        ch = target if arr.channels > 1 else 0
        return (
            not used[ch]
            and arr.gaps[ch] == 0
            and not inp.ddr_stall
            and len(arr.fifos[ch]) < arr.fifo_depth
        )

    if arr.channels > 1 and not p.rule5:
        per_chiplet(arr, room, channel_ok, issues, used)
    else:
        for k in range(n):
            j = (arr.ddr_rr + k) % n
            job = arr.jobs[j]
            if not job.valid or job.loaded >= job.count or not within_window(arr, job, 0):
                continue
            target = ddr_target(arr, j, job, room, channel_ok)
            if target is not None:
                issues.append(("job", j, target, job.expert, job.traj, job.loaded, target))
                used[target if arr.channels > 1 else 0] = True
                room.take(target, need(arr, job.traj, target, job.expert))
    if arr.channels > 1 and p.rule5:
        # Rule 5 with a channel per chiplet: pre-loads go to any idle buffer of their
        # trajectory (Algorithm 1: "pre-load e to any idle buffer"), chiplet by chiplet
        pre_extra = [0] * len(arr.pre)
        for c in range(n):
            if not channel_ok(c) or not room.admits_load(c, top):
                continue
            for k, q in enumerate(arr.pre):
                if q.valid and q.traj >> c & 1 and q.loaded + pre_extra[k] < q.count:
                    issues.append(("pre", k, c, q.expert, q.traj, q.loaded + pre_extra[k], c))
                    pre_extra[k] += 1
                    used[c] = True
                    room.take(c, top)
                    break
    elif arr.channels == 1:
        for k, q in enumerate(arr.pre):
            if (
                q.valid
                and q.loaded < q.count
                and channel_ok(q.chiplet)
                and room.admits_load(q.chiplet, top)
            ):
                issues.append(("pre", k, q.chiplet, q.expert, q.traj, q.loaded, q.chiplet))
                used[0] = True
                room.take(q.chiplet, top)
    issue_out = []
    for kind, _, target, expert, traj, index, dest in issues:
        slots = arr.chips[target].slots
        slot = max(i for i, x in enumerate(slots) if not x.busy)
        h = Header(
            expert,
            index,
            traj,
            dest,
            bin(traj).count("1") - 1,
            p.path_hops(traj, dest, arr.ring_order[expert]) + p.distance(target, dest),
        )
        issue_out.append((target, slot, h, kind == "pre"))
    return issues, used, issue_out


def window_quota(arr, job: Job) -> int:
    """[D12] How many more micro-slices a running expert may load before its window closes
    (``within_window`` true for ``extra = 0 .. quota - 1``): its micro-slices left, fewer
    when it is compute-heavy and near its ``hot_window``."""
    p = arr.p
    left = job.count - job.loaded
    if not p.hot_window or within_window(arr, job, p.hot_window + job.count):
        return left
    return max(0, min(left, p.hot_window - (job.loaded - job.retired)))


def per_chiplet(arr, room, channel_ok, issues, used):
    """Issue with a channel per chiplet (Rule 4, remote loads, pre-loads) [D18]: every
    chiplet picks from the state at the start of the cycle, independently of the others,

    1. a **local** load: the first running expert, round-robin, that covers it, has a quota
       left and is admitted with its path's hops;
    2. else a local **pre-load**: the lowest pre-load entry that covers it and has
       micro-slices left, if it admits a held micro-slice (``H + 1``);
    3. else (forward admission) a **remote** load [D10]: the first running expert,
       round-robin, with a quota left that is admitted with the hops from its entry;
    4. else a remote pre-load.

    Then each expert's picks are granted in order (its local picks in chiplet order, then
    its remote ones) up to its quota for this cycle (:func:`window_quota`), each pre-load
    entry's up to its micro-slices left; a chiplet whose pick is not granted idles this
    cycle.  The picks are parallel over the chiplets and the grants a prefix
    count per expert, so the RTL's issue is ``log n`` deep, not ``n`` picks in series.
    ``issues`` in order: local loads, local pre-loads, then remote loads and pre-loads, each
    by chiplet."""
    p = arr.p
    n, top = p.chiplets, p.held_claim
    rr = [(arr.ddr_rr + k) % n for k in range(n)]
    quota = [window_quota(arr, job) if job.valid else 0 for job in arr.jobs]
    pquota = [q.count - q.loaded if q.valid else 0 for q in arr.pre]
    picks = {}  # chiplet -> (stage, index, dest, claim)
    for c in range(n):
        if not channel_ok(c):
            continue
        for j in rr:
            job = arr.jobs[j]
            if quota[j] and job.traj >> c & 1:
                r = need(arr, job.traj, c, job.expert)
                if room.admits_load(c, r):
                    picks[c] = ("job", j, c, r)
                    break
        if c in picks:
            continue
        if room.admits_load(c, top):
            k = next((k for k, q in enumerate(arr.pre) if pquota[k] and q.traj >> c & 1), None)
            if k is not None:
                picks[c] = ("pre", k, c, top)
                continue
        if not arr.admission:
            continue
        for j in rr:
            job = arr.jobs[j]
            if quota[j]:
                dest, r = p.remote_entry(job.traj, c, arr.ring_order[job.expert])
                if room.admits_load(c, r):
                    picks[c] = ("rjob", j, dest, r)
                    break
        if c in picks or not room.admits_load(c, top):
            continue
        k = next((k for k in range(len(arr.pre)) if pquota[k]), None)
        if k is not None:
            q = arr.pre[k]
            picks[c] = ("rpre", k, p.remote_entry(q.traj, c, arr.ring_order[q.expert])[0], top)
    taken, ptaken = [0] * n, [0] * len(arr.pre)
    for stages in (("job",), ("pre",), ("rjob", "rpre")):
        for c in range(n):
            if c not in picks or picks[c][0] not in stages:
                continue
            stage, x, dest, r = picks[c]
            if stage in ("job", "rjob"):
                if taken[x] >= quota[x]:
                    continue
                job = arr.jobs[x]
                issues.append(("job", x, c, job.expert, job.traj, job.loaded + taken[x], dest))
                taken[x] += 1
            else:
                if ptaken[x] >= pquota[x]:
                    continue
                q = arr.pre[x]
                issues.append(("pre", x, c, q.expert, q.traj, q.loaded + ptaken[x], dest))
                ptaken[x] += 1
            used[c] = True
            room.take(c, r)


def deliveries(arr, inp) -> list:
    """Per channel, the load whose latency has passed: ``(channel, (target, slot, Header,
    held))``; a held pre-load is released when its expert runs or is being dispatched."""
    p = arr.p
    # 4. DDR delivery
    dispatch_e = (
        inp.dispatch.expert if inp.dispatch is not None and inp.dispatch.kind == DISPATCH else None
    )
    deliveries = []
    for ch, fifo in enumerate(arr.fifos):
        if fifo and not inp.ddr_stall:
            target, slot, h, held, ts = fifo[0]
            if (arr.now - ts) % (1 << arr.age_bits) >= p.ddr_latency:
                if held and (
                    any(j.valid and j.expert == h.expert for j in arr.jobs)
                    or dispatch_e == h.expert
                ):
                    held = False
                deliveries.append((ch, (target, slot, h, held)))
    return deliveries


def commit(arr, delivered, issues, issue_out, used):
    """Next state of the DDR pipeline: deliveries stored, issues reserved, gaps counted."""
    p = arr.p
    n = p.chiplets
    # DDR
    for ch, (target, slot, h, held) in delivered:
        arr.fifos[ch].popleft()
        store(arr, target, slot, h, wait=0, ddr=True, held=held)
    for (kind, idx, *_), (t, slot, h, held) in zip(issues, issue_out):
        ch = t if arr.channels > 1 else 0
        sl = arr.chips[t].slots[slot]
        sl.busy, sl.resv = True, True
        sl.claim = p.held_claim if held else h.r
        arr.fifos[ch].append((t, slot, h, held, arr.now))
        if kind == "job":
            job = arr.jobs[idx]
            job.loaded += 1
            job.target = ring_after(job.traj, t, n, *p.ring_table(arr.ring_order[job.expert]))
            arr.ddr_rr = (idx + 1) % n
        else:
            arr.pre[idx].loaded += 1
    for ch in range(arr.channels):
        if used[ch]:
            arr.gaps[ch] = p.ddr_interval - 1
        elif arr.gaps[ch]:
            arr.gaps[ch] -= 1


def retire_jobs(arr, retired) -> int:
    """Count retired micro-slices per job; the mask of entry slots whose job finished."""
    p = arr.p
    n = p.chiplets
    done_new = 0
    # jobs
    for j in range(n):
        if retired[j]:
            job = arr.jobs[j]
            job.retired += retired[j]
            if job.retired >= job.count:
                job.valid = False
                done_new |= 1 << j
    return done_new


def ddr_target(arr, j: int, job: Job, room, channel_ok) -> int | None:
    """Chiplet of a running expert's next load (Rule 4 striping, or Rule 5's emptiest)."""
    p = arr.p
    if not p.rule5:
        t = job.target
        ok = channel_ok(t) and room.admits_load(t, need(arr, job.traj, t, job.expert))
        return t if ok else None
    best = None
    free = room.free
    for a in range(p.chiplets):
        if (
            job.traj >> a & 1
            and channel_ok(a)
            and room.admits_load(a, need(arr, job.traj, a, job.expert))
        ):
            if best is None or free[a] > free[best]:
                best = a
    return best


def within_window(arr, job: Job, extra: int) -> bool:
    """[D12] Whether a running expert may load one more micro-slice: always, unless it is
    compute-heavy (a micro-slice takes longer to compute on some chiplet than a DDR interval)
    and already has ``hot_window`` micro-slices loaded and not retired."""
    p = arr.p
    if not p.hot_window or job.loaded + extra - job.retired < p.hot_window:
        return True
    t = max(arr.tokens[c][job.expert] for c in range(p.chiplets) if job.traj >> c & 1)
    return max(1, t) * p.cycles_per_token <= p.ddr_interval


def need(arr, traj: int, a: int, expert: int) -> int:
    """Free slots a load of ``expert`` into chiplet ``a`` must leave (forward-count
    admission: the hops of its path in the expert's ring embedding)."""
    return arr.p.path_hops(traj, a, arr.ring_order[expert]) if arr.admission else 0


def take_dispatch(arr, b: Dispatch):
    """A dispatch beat opens the job of its entry slot (taking over a pre-load of the same
    expert); a pre-load beat opens a pre-load entry; a malformed beat sets ``bad_dispatch``."""
    p = arr.p
    n = p.chiplets
    if (
        b.traj == 0
        or b.traj >> n
        or not 0 <= b.entry < n
        or not b.traj >> b.entry & 1
        or not 0 <= b.expert < p.experts
        or not 0 <= b.order < p.ring_orders
    ):
        arr.bad_dispatch = True
        return
    if b.kind == PRELOAD:
        arr.ring_order[b.expert] = b.order
        k = next((k for k, q in enumerate(arr.pre) if not q.valid), None)
        if k is not None:
            got = bind_ahead(arr, b.expert, b.traj, held=True)
            arr.pre[k] = Preload(True, b.expert, b.traj, b.entry, got, arr.slices[b.expert])
        return
    if arr.jobs[b.entry].valid:
        arr.bad_dispatch = True
        return
    arr.ring_order[b.expert] = b.order
    loaded, count = bind_ahead(arr, b.expert, b.traj, held=False), arr.slices[b.expert]
    k = next((k for k, q in enumerate(arr.pre) if q.valid and q.expert == b.expert), None)
    if k is not None:
        q = arr.pre[k]
        # already includes an issue of this cycle; the count its loads were made for [D13]
        loaded, count = q.loaded, q.count
        q.valid = False
        for c in range(n):  # its chiplet, or any with a channel each or ones loaded ahead
            for s in arr.chips[c].slots:
                if s.busy and s.held and s.expert == b.expert:
                    s.held = False
                    s.claim = s.r
    arr.jobs[b.entry] = Job(True, b.expert, b.traj, loaded, 0, b.entry, count)


def load_ahead(arr, loads):
    """Before the layer's first cycle: micro-slices pre-loaded while the previous layer
    drained and attention ran (predicted pre-loads across layers, ``docs/codesign.md``),
    ``(chiplet, expert, index)`` each, stored held and :data:`AHEAD` (no trajectory yet).
    An expert's indices must be ``0 .. m - 1``; the caller flushes those of experts the
    layer does not stream (or beyond their slice-table count) before calling."""
    for c, e, i in loads:
        slots = arr.chips[c].slots
        k = next((k for k, s in enumerate(slots) if not s.busy), None)
        if k is None:
            raise ValueError(f"no free slot on chiplet {c} for a carried micro-slice")
        s = slots[k]
        s.busy, s.held, s.ddr, s.expert, s.index, s.traj, s.dest = True, AHEAD, True, e, i, 0, c
        s.claim = arr.p.held_claim


def bind_ahead(arr, expert: int, traj: int, held: bool) -> int:
    """At the first beat naming ``expert`` (dispatch or pre-load), its micro-slices loaded ahead
    take the beat's trajectory: one on the trajectory starts its ring there, as a Rule 4
    load does; one off it travels to the trajectory's nearest chiplet, as a remote load
    does.  Held still under a pre-load beat.  Returns how many it had (the job's or
    pre-load's ``loaded``)."""
    p = arr.p
    o = arr.ring_order[expert]
    got = 0
    for c, ch in enumerate(arr.chips):
        for k, s in enumerate(ch.slots):
            if s.busy and s.held == AHEAD and s.expert == expert:
                dest, r = (
                    (c, p.path_hops(traj, c, o)) if traj >> c & 1 else p.remote_entry(traj, c, o)
                )
                legs = bin(traj).count("1") - 1
                h = Header(expert, s.index, traj, dest, legs, r)
                store(arr, c, k, h, wait=0, ddr=True, held=held)
                got += 1
    return got
