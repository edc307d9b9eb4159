"""Progress watchdog of a layer loop: the test that nothing can happen any more, and the
exception both streaming engines raise, with the layer's state, when it holds.

Criterion (exact, not a time-out)
---------------------------------
A layer loop (``fsedp.sim.fsedp.python_loop`` on :class:`StreamingArray`, the compiled
``fsedp.sim.fast_kernel.run``) presents the scheduler's beats in the cycles the scheduler
RTL gives them and raises ``done.ready`` only in its ``WAIT`` state
(:class:`fsedp.sw.scheduler_timing.SchedulerTiming`: a completion shown earlier waits, and
those shown by then are taken as one mask), never stalls a link or DDR, and asks the
scheduler golden model for more beats only when it takes a completion (``done``).  The
watchdog fires after a cycle in which

1. no beat was presented and none is placed to be (the timing's queue is empty);
2. the step was *inactive*: no transfer accepted, no DDR load issued or delivered, no
   computation started or ended, no ``done`` shown, no table write and no slot released
   (:attr:`StreamingArray.last_active`, the flag the exact event skipping uses); nothing but
   counters changed;
3. no counter is counting (the skip horizon is 0): every arrival, transfer, link and DDR
   gap counter is 0, no computation has more than its last cycle left and no DDR load is in
   flight;
4. and the loop would go on (the scheduler is in its round or the array is not idle).

After (2) and (3) the registered state is the one the step started from (``now`` only ages
DDR loads, and none is in flight), and the next cycle's inputs are the same (no beat, no
stall; ``done.ready`` may rise when ``WAIT`` begins, but it only matters to a ``done``
shown, and none is, by (2)), so the next cycle takes the same (no) decisions: the state is a
fixed point.  No ``done`` can come out of it, so the scheduler never takes a completion nor
makes another beat, and by (4) the loop would step this fixed point forever.  Conversely
the watchdog only fires in such a fixed point, so it can never fire on a layer that ends: on
a legal run it is silent by construction, whatever the parameters (no bound to choose).  It
costs one test per cycle of two flags the cycle computes anyway.  It does not catch a
*livelock* (activity for ever without an end); the datapath cannot make one from finite
beats (every micro-slice is loaded once and its hops left fall with every transfer), only a
broken datapath could.

What fires it: a scheduler decision the datapath refuses (a beat naming an entry chiplet
outside its trajectory or the slot of a running job: ``bad_dispatch``), a dispatch never
sent or sent as a pre-load (the scheduler waits for a ``done`` no job will give), pre-loads
whose expert is never dispatched (held for ever), a micro-slice retired with no job
(``orphan``): the experts involved never finish.
"""

from fsedp.sw.streaming.ddr import AHEAD

__all__ = ["SimulationStalled", "array_state", "scheduler_state", "slot_status", "stalled"]

#: characters of :class:`SimulationStalled`'s message (its attributes hold everything)
MESSAGE_CHARS = 400


class SimulationStalled(RuntimeError):
    """A layer loop reached a state in which nothing can happen any more (see the module).

    ``engine`` is ``"python"`` or ``"compiled"``; ``state`` the layer's state, the same for
    both engines (a dict of plain values, as :func:`stalled` builds it), its fields also
    attributes: ``cycle`` (cycles simulated), ``chiplets`` (per chiplet ``computing``
    ``(expert, index, cycles left)`` or ``None`` and the busy ``slots``, each ``(slot,
    expert, index, traj, dest, status)``, :func:`slot_status`), ``jobs`` (the open jobs:
    ``entry``, ``expert``, ``traj``, ``loaded``, ``retired``, ``count``), ``preloads`` (the
    open pre-load entries), ``ddr_queued`` (loads in flight per channel), ``done_pending``
    (the ``done`` mask registered and not yet taken: shown from the cycle after its jobs
    retire until the scheduler takes it in ``WAIT``), ``bad_dispatch`` and ``orphan`` (the
    datapath's flags) and ``scheduler`` (``in_round``, ``running``: entry slot ->
    trajectory of the dispatches it waits a ``done`` for, ``undispatched``: the experts of
    its order not dispatched yet).  The message is one line, cut at :data:`MESSAGE_CHARS`
    characters."""

    def __init__(self, engine: str, state: dict):
        self.engine = engine
        self.state = state
        for k, v in state.items():
            setattr(self, k, v)
        super().__init__(_message(engine, state))

    def __reduce__(self):
        # raised in a worker process, it must arrive whole in the parent
        return (SimulationStalled, (self.engine, self.state))


def slot_status(resv, wait, held, comp, computing, send, tx) -> str:
    """What a busy slot is doing, ``+``-joined: ``loading`` (a DDR load reserved it),
    ``arriving`` (data on its way), ``ahead`` (loaded before the layer, no trajectory yet),
    ``held`` (a pre-load waiting for its dispatch), ``compute`` (a computation pending),
    ``computing``, ``send`` (a transfer pending), ``sending``; ``done`` when none (it is
    released in the next cycle)."""
    parts = []
    if resv:
        parts.append("loading")
    if wait:
        parts.append("arriving")
    if held == AHEAD:
        parts.append("ahead")
    elif held:
        parts.append("held")
    if comp:
        parts.append("compute")
    if computing:
        parts.append("computing")
    if send:
        parts.append("send")
    if tx:
        parts.append("sending")
    return "+".join(parts) or "done"


def array_state(arr) -> dict:
    """The watchdog's state of a :class:`StreamingArray` (everything but the scheduler)."""
    chiplets = []
    for ch in arr.chips:
        slots = [
            (
                i,
                s.expert,
                s.index,
                s.traj,
                s.dest,
                slot_status(s.resv, s.wait, s.held, s.comp, s.computing, s.send, s.tx),
            )
            for i, s in enumerate(ch.slots)
            if s.busy
        ]
        computing = (ch.cexpert, ch.cindex, ch.cnt) if ch.cnt else None
        chiplets.append({"computing": computing, "slots": slots})
    jobs = [
        {
            "entry": j,
            "expert": b.expert,
            "traj": b.traj,
            "loaded": b.loaded,
            "retired": b.retired,
            "count": b.count,
        }
        for j, b in enumerate(arr.jobs)
        if b.valid
    ]
    preloads = [
        {
            "expert": q.expert,
            "traj": q.traj,
            "chiplet": q.chiplet,
            "loaded": q.loaded,
            "count": q.count,
        }
        for q in arr.pre
        if q.valid
    ]
    return {
        "cycle": arr.cycle,
        "chiplets": chiplets,
        "jobs": jobs,
        "preloads": preloads,
        "ddr_queued": [len(f) for f in arr.fifos],
        "done_pending": arr.done_pending,
        "bad_dispatch": bool(arr.bad_dispatch),
        "orphan": bool(arr.orphan),
    }


def scheduler_state(sched) -> dict:
    """The scheduler golden model's side: whether its round is open, the entry slots whose
    ``done`` it waits for (slot -> trajectory) and the experts it has not dispatched."""
    plan = sched.plan
    undispatched = (
        [e for e, s in zip(plan.order, sched.scheduled) if not s] if plan is not None else []
    )
    return {
        "in_round": plan is not None,
        "running": {s: t for s, t in enumerate(sched.running) if t},
        "undispatched": undispatched,
    }


def stalled(engine: str, state: dict, sched) -> SimulationStalled:
    """The exception of a stalled layer: ``state`` from :func:`array_state` (or the compiled
    engine's equivalent), completed with the scheduler's side."""
    return SimulationStalled(engine, {**state, "scheduler": scheduler_state(sched)})


def _message(engine: str, st: dict) -> str:
    why = []
    if st.get("bad_dispatch"):
        why.append("the datapath refused a dispatch beat (bad_dispatch)")
    if st.get("orphan"):
        why.append("a micro-slice retired with no job (orphan)")
    sch = st.get("scheduler", {})
    parts = [
        f"layer stalled at cycle {st.get('cycle')} ({engine} engine): nothing can happen any more"
    ]
    parts += why
    if sch.get("running"):
        slots = ", ".join(str(s) for s in sch["running"])
        parts.append(f"the scheduler waits for done of slot(s) {slots}")
    if sch.get("undispatched"):
        parts.append(f"{len(sch['undispatched'])} expert(s) not dispatched")
    jobs = st.get("jobs", [])
    parts.append(
        "jobs: "
        + (
            ", ".join(
                f"e{j['expert']}@{j['entry']} loaded {j['loaded']}/{j['count']} "
                f"retired {j['retired']}"
                for j in jobs
            )
            or "none"
        )
    )
    if st.get("preloads"):
        parts.append(
            "pre-loads: "
            + ", ".join(f"e{q['expert']} {q['loaded']}/{q['count']}" for q in st["preloads"])
        )
    held = [
        f"c{c}: " + " ".join(f"e{e}#{i} {what}" for _, e, i, _, _, what in ch["slots"])
        for c, ch in enumerate(st.get("chiplets", []))
        if ch["slots"]
    ]
    parts.append("slots " + ("; ".join(held) if held else "all free"))
    text = "; ".join(parts)
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."
