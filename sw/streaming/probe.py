"""Why a resource is idle: the golden model's own account of every DDR channel and compute
unit in one cycle, from the same registered state the cycle's decisions are taken on.

Used by the simulator's per-cause breakdown of the gap to the lower bound
(``fsedp.sim.fsedp``, ``docs/simulator.md#where-the-time-goes``).  A probe never changes the
state, so a run with probes equals a run without (``tests/test_streaming.py``); and it is
constant over the cycles :meth:`StreamingArray.fast_forward` skips, because every predicate
below is a counter being zero or not and a skip ends before any counter reaches zero.

DDR channel (``None`` = streaming a micro-slice, i.e. busy)
    ``stall``      the channel is stalled or its delivery queue is full;
    ``full``       a micro-slice could be loaded but the target buffer has no free slot;
    ``admission``  a running expert has a micro-slice to load and the target buffer has free
                   slots, but forward-count admission refuses them (too few for its path);
    ``preload``    only pre-loads have micro-slices to load, and the buffer keeps the
                   ``H + 1`` slots a running expert may need;
    ``window``     the only running experts with micro-slices left are compute-heavy ones at
                   their ``hot_window`` ([D12]);
    ``none``       nothing is loadable (no running expert or pre-load has micro-slices left).

Compute unit (``None`` = computing)
    ``ddr``   a DDR load into this chiplet is under way (its data has not arrived);
    ``link``  a micro-slice for this chiplet is on a link, or waits at a neighbour for the
              link or for this chiplet's admission;
    ``held``  a pre-loaded micro-slice is here but its expert is not dispatched yet;
    ``none``  nothing for this chiplet is under way.
"""

from fsedp.sw.streaming.ddr import within_window

__all__ = ["DDR_REASONS", "PE_REASONS", "DDR_CAUSES", "PE_CAUSES", "ddr_idle", "pe_idle"]

DDR_REASONS = ("stall", "full", "admission", "preload", "window", "none")
PE_REASONS = ("ddr", "link", "held", "none")
#: The simulator's idle causes (``fsedp.sim.fsedp``, ``docs/simulator.md``): a probe's
#: reason, with ``none`` split by when it happens -- a DDR channel with nothing to load
#: waits for the scheduler's next ``dispatch`` or is in the layer's ``drain``; a compute unit
#: idles before its first computation (``fill``), after its last (``drain``) or in between
#: with nothing under way (``starved``).  The compiled engine indexes these tuples.
DDR_CAUSES = DDR_REASONS + ("dispatch", "drain")
PE_CAUSES = PE_REASONS + ("fill", "drain", "starved")


def ddr_idle(arr, inp, used, issues, free2) -> list:
    """Per DDR channel: ``None`` if it issues or streams this cycle, else the reason it
    idles (:data:`DDR_REASONS`); ``free2`` are the free slots left after this cycle's
    accepts and issues."""
    issued_job = [0] * len(arr.jobs)
    issued_pre = [0] * len(arr.pre)
    for kind, idx, *_ in issues:
        if kind == "job":
            issued_job[idx] += 1
        else:
            issued_pre[idx] += 1
    left = [
        j for j, job in enumerate(arr.jobs) if job.valid and job.loaded + issued_job[j] < job.count
    ]
    jobs = [j for j in left if within_window(arr, arr.jobs[j], issued_job[j])]
    pres = [k for k, q in enumerate(arr.pre) if q.valid and q.loaded + issued_pre[k] < q.count]
    out = []
    for ch in range(arr.channels):
        if used[ch] or arr.gaps[ch]:
            out.append(None)
        elif inp.ddr_stall or len(arr.fifos[ch]) >= arr.fifo_depth:
            out.append("stall")
        elif not jobs and not pres:
            out.append("window" if left else "none")
        elif arr.channels > 1:
            # chiplet-driven: the channel loads into its own chiplet
            if free2[ch] == 0:
                out.append("full")
            else:
                out.append("admission" if jobs else "preload")
        else:
            targets = [arr.jobs[j].target for j in jobs] or [arr.pre[k].chiplet for k in pres]
            if all(free2[t] == 0 for t in targets):
                out.append("full")
            else:
                out.append("admission" if jobs else "preload")
    return out


def pe_idle(arr, starts) -> list:
    """Per chiplet: ``None`` if its compute unit is busy this cycle, else what it waits for
    (:data:`PE_REASONS`).  A unit that starts a micro-slice while idle waited for that
    micro-slice's source (DDR or link) until this cycle."""
    out = []
    for c, ch in enumerate(arr.chips):
        if ch.cnt:
            out.append(None)
            continue
        if starts[c] is not None:
            out.append("ddr" if ch.slots[starts[c][0]].ddr else "link")
            continue
        reason = "none"
        for s in ch.slots:
            if s.busy and s.held:
                reason = "held"
            elif s.busy and (s.resv or s.wait):
                reason = "ddr" if (s.resv or s.ddr) else "link"
                break
        if reason == "none":
            for src in arr.nb[c]:
                if src is None:
                    continue
                if any(
                    s.busy and s.send and s.tx == 0 and arr.nb[src][s.dir] == c
                    for s in arr.chips[src].slots
                ):
                    reason = "link"
                    break
        out.append(reason)
    return out
