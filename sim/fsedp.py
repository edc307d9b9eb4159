"""One MoE layer under FSE-DP: every decision from the scheduler golden model
(:class:`fsedp.sw.scheduler.Scheduler`), every micro-slice from the streaming golden model
(:class:`fsedp.sw.streaming.StreamingArray`, with exact event skipping).

Ablations (Section VI-C):

* ``A1`` naive FSE-DP, no fine-grained flow: an expert is one unit (``micro_slices = 1``)
  that is loaded whole and passed around the ring; the buffer gets the slots deadlock
  freedom needs whatever their size (the memory column shows the cost);
* ``A2`` micro-slice flows under Rules 1-4, experts in descending token count;
* ``A3`` A2 with the paired-load order and the partner pre-loads (Algorithm 1);
* ``A4`` A3 with Rule 5;
* ``A6`` A3 with this project's streaming rules for balanced regimes (``docs/simulator.md``):
  experts stream at once, one per entry chiplet (``dispatch="entry"``, scheduler decision 28),
  in the balanced order (decision 27); a shorter micro-slice preempts a long computation ([D11]); a
  compute-heavy expert keeps at most :data:`HOT_WINDOW` micro-slices loaded ahead ([D12]).
  Every rule is an RTL generic (scheduler: ``balance``, ``entry_dispatch``; datapath:
  ``preempt``, ``hot_window``);
* ``A7`` A6 with link-aware ring embeddings (scheduler decision 29) and forward-state
  admission ([D16]);
* ``A8`` A7 with every expert's tokens gathered into one region of the mesh, chosen per layer
  by a cost model (:mod:`fsedp.sim.regions`): shorter rings, more tokens moved; where the
  whole mesh stays in a balanced layer, every expert's tokens spread evenly over the
  chiplets of its ring (``regions.spread``);
* ``A5`` A3 with token buffering (Algorithm 2, 20 % slack): a deferred request pauses at the
  layer and its tokens of that layer and the following ones move to the next iteration
  (``sim/run.py``); what is still deferred after the last iteration runs at the end.
"""

import dataclasses

import numpy as np

from fsedp.errors import InputError
from fsedp.params import max_hops
from fsedp.sim.baselines import bounds, held_tokens, link_bound
from fsedp.sim.fast import python_events, run_layer, streaming_engine
from fsedp.sim.regions import all_to_all_cycles
from fsedp.sim.regions import plan as plan_regions
from fsedp.sim.result import LayerResult
from fsedp.sim.setup import Setup
from fsedp.sw.scheduler import DISPATCH, Scheduler, layer_tokens
from fsedp.sw.scheduler_timing import SchedulerTiming
from fsedp.sw.streaming import StepIn, StreamingArray
from fsedp.sw.streaming.ddr import load_ahead
from fsedp.sw.streaming.watchdog import array_state, stalled

__all__ = [
    "VARIANTS",
    "HOT_WINDOW",
    "variant_params",
    "make_scheduler",
    "fsedp_layer",
    "check_ahead",
]

VARIANTS = ("A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8")

#: Micro-slices a compute-heavy expert may have loaded and not retired under A6: two keep
#: one computing and one arriving, the least that hides a load (measured best of 1..6 on
#: the regimes sweep, ``docs/results.md``).
HOT_WINDOW = 2


def variant_params(setup: Setup, variant: str):
    dp = setup.dp
    if variant == "A1":
        return dataclasses.replace(
            dp,
            micro_slices=1,
            ddr_interval=dp.ddr_interval * dp.micro_slices,
            # usable once its last byte is on chip: the whole expert streams first
            ddr_latency=dp.ddr_latency + (dp.micro_slices - 1) * dp.ddr_interval,
            cycles_per_token=dp.cycles_per_token * dp.micro_slices,
            link_cycles=(dp.link_cycles - setup.link_latency_cycles) * dp.micro_slices
            + setup.link_latency_cycles,
            slots=dp.max_hops + 1,
            preload_entries=0,
        )
    if variant == "A4":
        return dataclasses.replace(dp, rule5=True)
    if variant == "A6":
        return dataclasses.replace(dp, preempt=True, hot_window=HOT_WINDOW)
    if variant in ("A7", "A8"):
        # and link-aware ring embeddings (the run config's scheduler.ring_orders and
        # ring_path, or A7's own), forward-state admission [D16]
        path = setup.cfg.scheduler.ring_path or a7_ring_path(dp.rows, dp.cols)
        orders = setup.cfg.scheduler.ring_orders or a7_ring_orders(dp.rows, dp.cols, path)
        try:
            return dataclasses.replace(
                dp,
                preempt=True,
                hot_window=HOT_WINDOW,
                admission="forward-state",
                ring_orders=orders,
                ring_path=path,
            )
        except InputError as e:  # e.g. the column snake's longer paths need more slots
            raise InputError(
                setup.cfg.source, "scheduler.ring_orders", f"{orders}: {e.field} {e.reason}"
            ) from None
    if variant in ("A2", "A3", "A5"):
        return dp
    raise ValueError(f"unknown FSE-DP variant {variant!r}; choose from {VARIANTS}")


def a7_ring_path(rows: int, cols: int) -> str:
    """A7's and A8's ring path unless the run config names one (``scheduler.ring_path``):
    ``cycle`` where the mesh has a ring of one-hop legs (two rows and columns or more, a side
    of even length), so that no
    ring shares a closing leg across the mesh; ``snake`` on odd x odd meshes, where the cycle
    keeps a leg of two hops and measured no better (docs/simulator.md)."""
    if min(rows, cols) < 2:  # one row or column: the cycle would be the snake
        return "snake"
    return "cycle" if rows % 2 == 0 or cols % 2 == 0 else "snake"


def a7_ring_orders(rows: int, cols: int, path: str = "snake") -> int:
    """A7's ring embeddings on a ``rows x cols`` mesh for ring ``path``: the most of 8 (the
    cycle's four embeddings both ways), 4 and 2 (:data:`fsedp.params.RING_ORDERS`) whose
    longest path is no longer than the first embedding's -- a longer one would cost every
    chiplet slots (the column snake on some non-square meshes: 2x3, 2x4, 4x6).  The snake
    keeps 4: on the odd x odd meshes it is A7's path on, its turned embeddings are its
    reversed ones (measured on 3x3 at 1024 tokens, 8 orders: Yuan2.0-M32 1.237x against
    1.221x, Phi-3.5-MoE 1.154x against 1.136x)."""
    h = max_hops(rows, cols, 1, path)
    counts = (8, 4, 2) if path == "cycle" else (4, 2)
    return next(k for k in counts if max_hops(rows, cols, k, path) <= h)


def make_scheduler(sp, dp, variant: str) -> Scheduler:
    """The scheduler golden model of a variant (fresh, for one layer)."""
    if variant in ("A6", "A7", "A8"):
        # an expert with this many tokens computes as long as its loads take
        balance = min(2**16 - 1, max(1, round(dp.ddr_interval / dp.cycles_per_token)))
        # A7: each expert's ring embedding chosen by the links' load (RING_ORDERS), those the
        # datapath follows
        return Scheduler(
            dataclasses.replace(
                sp,
                balance=balance,
                entry_dispatch=True,
                ring_orders=dp.ring_orders,
                mesh_cols=dp.cols,
                ring_path=dp.ring_path,
            )
        )
    return Scheduler(sp, order="sorted" if variant == "A2" else "paired")


def a5_params(setup: Setup, slack: float = 0.2):
    """Scheduler generics of A5: Algorithm 2 with the config's ``theta_min`` (at least 2) and
    one buffering opportunity per ``1 / slack`` forward passes (``N_threshold``; 20 % slack:
    one deferral per 5 rounds a request goes through)."""
    sp = setup.cfg.scheduler_params()
    return dataclasses.replace(
        sp, theta_min=max(2, sp.theta_min), n_threshold=max(1, round(1 / slack))
    )


def fsedp_layer(
    setup: Setup,
    records,
    variant: str = "A3",
    sched: Scheduler | None = None,
    trace: bool = False,
    streaming: str | None = None,
    log: bool = False,
    slices: dict | None = None,
    ahead: list | None = None,
    regions: tuple[int, int] | None = None,
) -> LayerResult:
    """One layer; ``sched`` is a scheduler that persists across layers (A5: its request
    table carries the QoS timers), a fresh one otherwise.  ``result.defer`` is the mask of
    requests Algorithm 2 deferred.  ``streaming``: ``"compiled"`` or ``"python"`` (default:
    :func:`fsedp.sim.fast.streaming_engine`);
    ``log`` keeps every micro-slice event in ``result.log``
    (:func:`fsedp.sim.fast.python_events`).  ``slices`` (expert -> ``0 .. micro_slices``,
    the others stream all) turns the slice table on: an expert streams only the micro-slices
    of the sub-experts its tokens selected; one with 0 (its tokens kept none of its
    sub-experts) is not routed at all ([D13], ``docs/codesign.md``; not with A1, whose
    expert is one unit).  ``ahead``: micro-slices pre-loaded before the layer began
    (predicted pre-loads across layers, :func:`check_ahead`), held in their slots until
    their expert's first beat binds them to its trajectory (``ddr.bind_ahead``).  A layer in
    which nothing can happen any more (a scheduler decision the datapath cannot serve) raises
    :class:`fsedp.sw.streaming.SimulationStalled` with its state, on either engine
    (``fsedp.sw.streaming.watchdog``).  ``regions`` (A8): the region shape ``(rows, cols)``
    to gather tokens into, instead of the cost model's choice (:func:`fsedp.sim.regions.plan`);
    the result's ``gather`` says what was chosen and moved, and its ``beats``, ``script``,
    ``timeline`` and event log are those of the streaming, which starts after the gather."""
    sp = sched.p if sched is not None else setup.sp
    dp = variant_params(setup, "A3" if variant == "A5" else variant)
    if slices is not None:
        if variant == "A1":
            raise ValueError("A1 streams an expert as one unit: no slice table")
        bad = {e: v for e, v in slices.items() if not 0 <= v <= dp.micro_slices}
        if bad:
            raise ValueError(f"slices {bad} outside 0..{dp.micro_slices}")
        dp = dataclasses.replace(dp, slice_table=True)
        records = [r for r in records if slices.get(r[2], 1)]
        # the slice table as the gate writes it: every expert, M unless given
        table = np.full(dp.experts, dp.micro_slices, np.int64)
        table[list(slices)] = list(slices.values())
    else:
        table = None
    given = records
    gathered = None
    if variant == "A8":
        if ahead:
            raise ValueError("A8 moves tokens before the layer: no pre-loads ahead of it")
        per = table if table is not None else np.full(dp.experts, dp.micro_slices, np.int64)
        gathered = plan_regions(setup, records, per, regions)
        records = gathered.records
    elif regions is not None:
        raise ValueError(f"regions apply to A8, not {variant}")
    if sched is None:
        sched = make_scheduler(sp, dp, variant)
    plan = sched.start_round(records)
    if plan.n == 0:  # everything deferred (or no records): nothing to run
        return LayerResult(
            strategy=f"FSE-DP {variant}",
            cycles=0,
            bound=0,
            busy=[0] * dp.chiplets,
            ddr_bytes=0,
            d2d_bytes=0,
            peak_weight_bytes=0,
            peak_token_bytes=0,
            ddr_cycles=0,
            compute_cycles=0,
            link_bound=0,
            stream_bound=0,
            defer=plan.defer,
        )
    tokens = layer_tokens(sp, records, plan.defer)
    ahead = check_ahead(dp, tokens, table, ahead or [])
    if streaming is None:
        streaming = streaming_engine()
    if streaming == "compiled":
        loop = run_layer(dp, sched, plan, tokens, log=log, trace=trace, slices=table, ahead=ahead)
    else:
        loop = python_loop(dp, sched, plan, tokens, trace=trace, log=log, slices=table, ahead=ahead)
    n = dp.chiplets
    slot_bytes = setup.expert_bytes // dp.micro_slices
    counts = np.zeros(sp.experts, dtype=np.int64)
    per_chiplet_tokens = [0] * n
    for (c, e), t in tokens.items():
        counts[e] += t
        per_chiplet_tokens[c] += t
    ddr_cycles, compute_cycles = bounds(setup, counts, table, ahead=len(ahead))
    held = held_tokens(n, sp.experts, ((c, e, t) for (c, e), t in tokens.items()))
    if gathered is not None:  # the bounds of the tokens where the gate left them
        held = held_tokens(
            n, sp.experts, ((c, e, t) for (c, e), t in layer_tokens(sp, given, plan.defer).items())
        )
    result = LayerResult(
        strategy=f"FSE-DP {variant}",
        cycles=loop["cycles"],
        bound=max(ddr_cycles, compute_cycles),
        busy=loop["busy"],
        ddr_bytes=loop["loads"] * slot_bytes,
        d2d_bytes=loop["transfers"] * slot_bytes,
        peak_weight_bytes=max(loop["peak"]) * slot_bytes,
        peak_token_bytes=max(per_chiplet_tokens) * setup.act_bytes * 2,
        ddr_cycles=ddr_cycles,
        compute_cycles=compute_cycles,
        link_bound=link_bound(setup, held, table, ahead=len(ahead)),
        stream_bound=link_bound(setup, held, table, ahead=len(ahead), tokens_move=False),
        timeline=loop["timeline"],
        decisions=loop["decisions"],
        link_bytes={k: v * slot_bytes for k, v in loop["link_transfers"].items()},
        ddr_per_chiplet=[x * slot_bytes for x in loop["ddr_per_loads"]],
        script=loop["script"],
        beats=loop["beats"],
        steps=loop["steps"],
        defer=plan.defer,
        activity=loop.get("activity", []),
        events=loop["loads"] + loop["transfers"] + loop["computations"],
        idle=loop["idle"],
        log=loop.get("events", []) if log else [],
    )
    if gathered is not None:
        add_gather(result, gathered, setup)
    return result


def add_gather(result: LayerResult, gathered, setup: Setup) -> None:
    """A8: the all-to-all before the streaming and the one after it in ``result``'s time
    (``cycles``, every unit idle for ``all-to-all``), the activations moved in its D2D bytes
    (there and back), and ``gather`` = shape, experts' regions, tokens moved, cycles each way.
    Tokens move, so the bound with tokens left in place does not apply: ``stream_bound`` is
    the bound of any strategy, ``link_bound``."""
    a2a, moved_bytes = all_to_all_cycles(setup, gathered.moves)
    n = len(result.busy)
    result.cycles += 2 * a2a
    for unit in ("ddr", "compute"):
        idle = result.idle.setdefault(unit, {})
        if a2a:
            idle["all-to-all"] = idle.get("all-to-all", 0) + 2 * a2a * n
    result.d2d_bytes += 2 * moved_bytes
    result.stream_bound = result.link_bound
    result.gather = {
        "shape": list(gathered.shape),
        "home": [int(g) for g in gathered.home],
        "moved": len(gathered.moves),
        "a2a_cycles": a2a,
        "scores": {f"{r}x{c}": v for (r, c), v in gathered.scores.items()},
    }


def check_ahead(dp, tokens: dict, table, ahead: list) -> list:
    """``ahead`` as ``[(chiplet, expert, index)]`` after checking it can be bound: each
    expert one the layer streams, its indices ``0 .. m - 1`` within its slice-table count,
    each once, and at most ``DatapathParams.held_room`` per chiplet (the room the deadlock
    argument leaves, [D3]); a ``ValueError`` names the first that is not."""
    n, M, room = dp.chiplets, dp.micro_slices, dp.held_room
    streamed = {e for (_, e), t in tokens.items() if t}
    per_chiplet = [0] * n
    seen: dict = {}
    out = []
    for c, e, i in ahead:
        c, e, i = int(c), int(e), int(i)
        count = M if table is None else int(table[e])
        if not 0 <= c < n:
            raise ValueError(f"pre-load ahead on chiplet {c}: the chip has {n}")
        if e not in streamed:
            raise ValueError(f"pre-load ahead of expert {e}, which this layer does not stream")
        if not 0 <= i < count:
            raise ValueError(f"pre-load ahead of expert {e} index {i}: it streams {count}")
        if i in seen.setdefault(e, set()):
            raise ValueError(f"pre-loads ahead of expert {e} are not indices 0 .. m - 1: {i} twice")
        seen[e].add(i)
        per_chiplet[c] += 1
        if per_chiplet[c] > room:
            raise ValueError(f"more than {room} micro-slices pre-loaded ahead on chiplet {c}")
        out.append((c, e, i))
    for e, idx in seen.items():
        if idx != set(range(len(idx))):
            raise ValueError(f"pre-loads ahead of expert {e} are not indices 0 .. m - 1")
    return out


def python_loop(
    dp,
    sched,
    plan,
    tokens: dict,
    trace: bool = False,
    log: bool = False,
    slices=None,
    ahead: list = (),
) -> dict:
    """The cycle loop of one layer on the Python golden model (:class:`StreamingArray`, the
    specification): the scheduler's beats in, in the cycles the scheduler RTL presents
    them, and its completions taken when it takes them
    (:class:`fsedp.sw.scheduler_timing.SchedulerTiming`, the first beat in cycle 0), the
    bookkeeping of every cycle out; the compiled engine (:func:`fsedp.sim.fast.run_layer`)
    returns the same.  ``slices``: the
    slice table, one count per expert ([D13]; default ``micro_slices`` each).  A layer that
    reaches a state in which nothing can happen any more (a scheduler decision the datapath
    cannot serve) raises :class:`fsedp.sw.streaming.SimulationStalled` with its state, as
    the compiled engine does, at the same cycle."""
    arr = StreamingArray(dp, probes=True)
    for (c, e), t in tokens.items():
        arr.tokens[c][e] = t  # the gate fills the tables with the records
    if slices is not None:
        arr.slices = [int(m) for m in slices]  # and the slice table [D13]
    load_ahead(arr, ahead)
    # the scheduler RTL's timing of the round's decisions, the first beat in cycle 0
    timing = SchedulerTiming(sched)
    timing.begin(0)
    n = dp.chiplets
    busy = [0] * n
    peak = [0] * n
    timeline = [(0, 0)]
    loads = transfers = decisions = computations = 0
    ddr_per = [0] * n
    script, made = [], []
    activity = []
    link_count: dict = {}
    events = []
    steps = 0
    # the breakdown: why each DDR channel and compute unit idles, cycle by cycle
    expected = [
        sum(arr.slices[e] for (c2, e), t in tokens.items() if c2 == c and t) for c in range(n)
    ]
    computed = [0] * n
    started = [False] * n
    dispatched = 0
    ddr_idle: dict = {}
    pe_idle: dict = {}
    while sched.in_round or timing.queue or not arr.idle:
        steps += 1
        cycle = arr.cycle
        beat = timing.present(cycle)
        ready = timing.ready(cycle)
        out = arr.step(StepIn(dispatch=beat, done_ready=ready))
        if beat is not None:
            decisions += 1
            dispatched += beat.kind == DISPATCH
            made.append([beat.kind, beat.expert, beat.entry, beat.traj])
        more = dispatched < plan.n  # experts still to be dispatched
        ddr_why = [_ddr_cause(w, more) for w in out.ddr_idle]
        pe_why = [
            _pe_cause(w, started[c], computed[c] >= expected[c]) for c, w in enumerate(out.pe_idle)
        ]
        _count(ddr_idle, ddr_why, 1)
        _count(pe_idle, pe_why, 1)
        for c, ch in enumerate(arr.chips):
            started[c] = started[c] or ch.cnt > 0
        for c, ev in enumerate(out.events):
            if ev is not None:
                computations += 1
                computed[c] += 1
                dur = max(1, arr.tokens[c][ev[0]]) * dp.cycles_per_token
                busy[c] += dur
                if trace:
                    activity.append((c, "compute", cycle - dur + 1, cycle + 1))
        if trace:
            for target, *_ in out.ddr_issues:  # the channel streams it for an interval
                activity.append((target, "DDR load", cycle, cycle + dp.ddr_interval))
            for src, d, _ in out.transfers:
                activity.append((src, "D2D send", cycle, cycle + dp.link_cycles))
                activity.append(
                    (dp.neighbour(src, d), "D2D receive", cycle, cycle + dp.link_cycles)
                )
        for c, o in enumerate(out.occupancy):
            if o > peak[c]:
                peak[c] = o
        loads += len(out.ddr_issues)
        for target, *_ in out.ddr_issues:
            ddr_per[target] += 1
        for src, d, _ in out.transfers:
            transfers += 1
            link_count[(src, d)] = link_count.get((src, d), 0) + 1
        if log:
            events += python_events(cycle, out)
        computing = sum(ch.cnt > 0 for ch in arr.chips)
        if computing != timeline[-1][1]:
            timeline.append((cycle + 1, computing))
        if out.done and ready:
            script.append(out.done)
            timing.completed(cycle, out.done)
        if not timing.queue:
            # the progress watchdog (exact: ``fsedp.sw.streaming.watchdog``): a cycle that
            # changed nothing but counters, none counting, no beat to present, and the loop
            # would go on: every further cycle is this one again (a completion shown is
            # activity; ``done.ready`` only waits for the cycles of the beats placed)
            if arr.stuck and (sched.in_round or not arr.idle):
                raise stalled("python", array_state(arr), sched)
            skipped = arr.fast_forward()
            if skipped:
                _count(ddr_idle, ddr_why, skipped)
                _count(pe_idle, pe_why, skipped)
    out = {
        "cycles": arr.cycle,
        "busy": busy,
        "peak": peak,
        "timeline": timeline,
        "loads": loads,
        "transfers": transfers,
        "computations": computations,
        "decisions": decisions,
        "ddr_per_loads": ddr_per,
        "link_transfers": link_count,
        "script": script,
        "beats": made,
        "steps": steps,
        "idle": {"ddr": ddr_idle, "compute": pe_idle},
        "flags": (arr.bad_dispatch, arr.orphan),
        "activity": activity,
    }
    if log:
        out["events"] = events
    return out


def _ddr_cause(probe: str | None, more: bool) -> str | None:
    """A DDR channel's idle cause: the probe's, with "nothing loadable" split into waiting
    for the scheduler's next dispatch and the layer's tail."""
    if probe != "none":
        return probe
    return "dispatch" if more else "drain"


def _pe_cause(probe: str | None, started: bool, finished: bool) -> str | None:
    """A compute unit's idle cause: before its first computation ``fill``, after its last
    ``drain``, in between what the probe saw (``starved`` when nothing was under way)."""
    if probe is None:
        return None
    if not started:
        return "fill"
    if finished:
        return "drain"
    return "starved" if probe == "none" else probe


def _count(acc: dict, reasons, weight: int):
    for w in reasons:
        if w is not None:
            acc[w] = acc.get(w, 0) + weight
