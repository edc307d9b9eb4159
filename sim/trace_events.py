"""Simulated MoE layers in the Chrome / Perfetto Trace Event Format (``fsedp run
--trace-events FILE.json``): open the file in https://ui.perfetto.dev or chrome://tracing.

:func:`trace_events` turns traced layers (their :class:`~fsedp.sim.result.LayerResult`, the
:class:`~fsedp.workload.Layer` they ran and the :class:`~fsedp.sim.setup.Setup`) into the
format's JSON object form, ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData":
{...}}``; nothing is simulated again.  :func:`check_trace_events` checks a document against
the format's rules (``docs/simulator.md``, "Trace viewer").

What a layer records and where it comes from (FSE-DP A1-A4 and A6, traced with
``fsedp_layer(trace=True, log=True)``):

* ``result.activity``, the spans ``(chiplet, kind, start, end)`` of Figure 13, and
  ``result.log``, the micro-slice events ``(kind, cycle, a, b, expert, index)`` they are made
  of (:func:`fsedp.sim.fast.python_events`): loads ``(0, cycle, target, slot, ...)``,
  transfers ``(1, cycle, src, direction, ...)``, computations ``(2, cycle, chiplet, final,
  ...)``.  The spans are the activity's start and end, each tied to its event (same
  chiplet, kind and cycle; checked) for the expert and micro-slice.
* ``result.beats`` (the scheduler's dispatch and pre-load beats, in order) and
  ``result.script`` (the completion masks it took, in order), without cycles.  The cycles
  follow from the cycle loop's protocol, the scheduler RTL's timing
  (:class:`fsedp.sw.scheduler_timing.SchedulerTiming`): the round's first beat is presented
  in cycle 0 and each later one in the cycle the RTL's ``PICK`` / ``EMIT_D`` / ``PCHECK`` /
  ``EMIT_P`` states give it; a job whose last micro-slice retires in cycle ``t`` shows its
  completion from cycle ``t + 1``, and the scheduler takes it only in ``WAIT``
  (``done.ready``), so a completion can wait and those shown by then are taken together as
  one mask; the beats it then decides follow from the cycle it was taken.  The round is
  replayed from its completions alone (:func:`fsedp.sw.scheduler_timing.replay_round`, the
  scheduler golden model started on the layer's records, as ``--scheduler rtl`` does): its
  beats are checked against ``result.beats`` and the masks it takes against
  ``result.script``; each completion instant is drawn at the cycle its mask was taken
  (``last_retired``: the cycle its job's last micro-slice retired).

EP, Hydra and A5 record no per-chiplet spans (``docs/simulator.md``); their processes show
the layer and the number of chiplets computing (``result.timeline``).
"""

import math
from collections import namedtuple

from fsedp import jsondoc
from fsedp.params import BeatKind
from fsedp.sim.fast import Event, by_cycle
from fsedp.sw.scheduler_timing import replay_round

__all__ = [
    "KINDS",
    "Span",
    "Decision",
    "layer_spans",
    "layer_decisions",
    "trace_events",
    "check_trace_events",
    "us",
    "ns",
    "duration",
]

#: Activity kinds, in track order under each chiplet.
KINDS = ("DDR load", "compute", "D2D send", "D2D receive")
_CATEGORY = {"DDR load": "ddr", "compute": "compute", "D2D send": "d2d", "D2D receive": "d2d"}
_DIRECTION = ("north", "east", "south", "west")
#: FSE-DP variants whose decisions can be replayed from a layer alone (a fresh scheduler per
#: layer; A5's scheduler carries its request table from layer to layer).
REPLAYED = ("A1", "A2", "A3", "A4", "A6", "A7")

#: One activity span: cycles ``[start, end)`` on ``chiplet``; ``args`` what else is known.
Span = namedtuple("Span", "chiplet kind start end expert micro_slice args")
#: One scheduler decision at ``cycle``: ``kind`` is ``dispatch``, ``pre-load`` or
#: ``completion``; ``chiplet`` the entry chiplet (of the job that completed).
Decision = namedtuple("Decision", "cycle kind expert chiplet args")


def ns(cycle: int, ns_per_cycle: float) -> int:
    """A cycle count as whole nanoseconds (the resolution of Perfetto's importer)."""
    return round(cycle * ns_per_cycle)


def us(cycle: int, ns_per_cycle: float) -> float:
    """A cycle count as microseconds on the 1 ns grid of :func:`ns`: equal cycles give equal
    times and the end of one span is exactly the start of the next, so spans that do not
    overlap in cycles do not overlap in the viewer either (a ``dur`` is a difference on the
    grid too, :func:`duration`)."""
    return ns(cycle, ns_per_cycle) / 1000


def duration(start: int, end: int, ns_per_cycle: float) -> float:
    """The ``dur`` of cycles ``[start, end)`` in microseconds, on the grid of :func:`us`."""
    return (ns(end, ns_per_cycle) - ns(start, ns_per_cycle)) / 1000


def _variant_dp(setup, variant: str):
    from fsedp.sim.fsedp import variant_params

    return variant_params(setup, "A3" if variant == "A5" else variant)


def layer_spans(dp, result) -> list:
    """The layer's activity spans, each with the expert and micro-slice of its event: the
    event log walked in the order the activity was made (per cycle: computations, loads,
    transfers as a send and a receive), every span checked against its event.  A layer
    without an event log has none (``fsedp_layer(log=True)`` keeps it)."""
    log, act = result.log, result.activity
    if not log:
        return []
    out = []
    k = 0

    def take(chiplet, kind, cycle, expert, index, args):
        nonlocal k
        if k >= len(act):
            raise ValueError(f"the event log has more events than the activity ({len(act)})")
        c, kd, start, end = act[k]
        at = end - 1 if kind == "compute" else start
        if (c, kd, at) != (chiplet, kind, cycle):
            raise ValueError(
                f"activity span {k} {act[k]} is not the event log's {kind} on chiplet "
                f"{chiplet} at cycle {cycle}"
            )
        k += 1
        out.append(Span(c, kd, int(start), int(end), int(expert), int(index), args))

    for cycle, group in by_cycle(log):  # the order fsedp.sim.fast.activity made them in
        for kind, _, c, final, e, idx in group:
            if kind == Event.COMPUTE:
                take(c, "compute", cycle, e, idx, {"final": bool(final)})
        for kind, _, t, slot, e, idx in group:
            if kind == Event.LOAD:
                take(t, "DDR load", cycle, e, idx, {"slot": int(slot)})
        for kind, _, src, d, e, idx in group:
            if kind == Event.TRANSFER:
                dst = dp.neighbour(src, d)
                way = _DIRECTION[d]
                take(src, "D2D send", cycle, e, idx, {"to": dst, "direction": way})
                take(dst, "D2D receive", cycle, e, idx, {"from": int(src), "direction": way})
    if k != len(act):
        raise ValueError(f"the activity has {len(act)} spans, the event log {k}")
    return out


def layer_decisions(setup, variant: str, layer, result, slices: dict | None = None) -> list:
    """The scheduler's decisions of one FSE-DP layer with their cycles (see the module's
    docstring): every dispatch and pre-load beat, and one completion per expert, at the
    cycle the scheduler took the mask it was merged into.  ``slices``:
    the layer's slice table, if it ran with one.  A ``ValueError`` says where the recorded
    beats, completion script and event log disagree."""
    from fsedp.sim.fsedp import make_scheduler

    if not result.beats:
        return []
    dp = _variant_dp(setup, variant)
    entry = {int(e): int(en) for kind, e, en, _ in result.beats if kind == BeatKind.DISPATCH}
    last: dict = {}  # expert -> cycle of its last retiring computation
    streamed: dict = {}  # expert -> micro-slices retired (those it streams)
    for kind, cycle, _, final, e, _ in result.log:
        if kind == Event.COMPUTE and final:
            last[e] = max(last.get(e, cycle), cycle)
            streamed[e] = streamed.get(e, 0) + 1
    for e in last:
        if e not in entry:
            raise ValueError(f"expert {e} completed without a dispatch beat")
    records = layer.records
    if slices:
        records = [r for r in records if slices.get(r[2], 1)]
    sched = make_scheduler(setup.sp, dp, variant)
    sched.start_round(records)
    # a job whose last micro-slice retires in cycle t shows its completion from t + 1; the
    # scheduler takes it in WAIT, with every other completion shown by then (one mask)
    beats, taken = replay_round(sched, [(t + 1, 1 << entry[e]) for e, t in last.items()])
    masks = [m for _, m in taken]
    if masks != [int(m) for m in result.script]:
        raise ValueError(
            f"completions from the event log {masks} are not the recorded script "
            f"{list(result.script)}"
        )
    replay = [[int(b.kind), b.expert, b.entry, b.traj] for _, b in beats]
    if replay != [[int(x) for x in b] for b in result.beats]:
        raise ValueError("the scheduler's replay does not give the recorded beats")
    out = []
    for t, b in beats:
        kind = "dispatch" if b.kind == BeatKind.DISPATCH else "pre-load"
        out.append(
            Decision(
                t,
                kind,
                b.expert,
                b.entry,
                {
                    "tokens": b.count,
                    "trajectory": [c for c in range(dp.chiplets) if b.traj >> c & 1],
                    "micro_slices": streamed.get(b.expert, 0),
                },
            )
        )
    pending = sorted(last, key=lambda e: (last[e], e))  # experts not yet taken
    for d, mask in taken:
        # the jobs whose completion was shown by cycle d, merged into the mask taken in d
        es = [e for e in pending if last[e] + 1 <= d and mask >> entry[e] & 1]
        pending = [e for e in pending if e not in es]
        for e in sorted(es):
            out.append(
                Decision(
                    d,
                    "completion",
                    e,
                    entry[e],
                    {"micro_slices": streamed[e], "done_mask": mask, "last_retired": last[e]},
                )
            )
    out.sort(key=lambda x: (x.cycle, x.kind != "completion"))
    return out


def _lanes(spans: list) -> list[int]:
    """A lane per span such that spans in one lane do not overlap (greedy, in start order):
    the format wants the complete events of a thread nested, and two links or a preempted
    computation can overlap on one chiplet."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], spans[i][1]))
    ends: list[int] = []
    lane = [0] * len(spans)
    for i in order:
        start, end = spans[i]
        k = next((k for k, e in enumerate(ends) if e <= start), None)
        if k is None:
            k = len(ends)
            ends.append(end)
        ends[k] = end
        lane[i] = k
    return lane


def _label(strategy: str) -> str:
    from fsedp.sim.run import BASELINES

    return strategy if strategy in BASELINES else f"FSE-DP {strategy}"


def trace_events(
    setup, layers: list, results: dict, slices: dict | None = None, other: dict | None = None
) -> dict:
    """The trace of ``layers`` (consecutive :class:`~fsedp.workload.Layer`) under every
    strategy of ``results`` (``{strategy: [LayerResult of each layer]}``): one process per
    strategy, its layers back to back from time 0 (MoE time; attention is not drawn).

    Tracks (threads) of a process: ``MoE layers`` (one complete event per layer),
    ``scheduler`` (dispatch, pre-load and completion instants), and per chiplet one track per
    activity kind (:data:`KINDS`; ``#2``... where spans of a kind overlap); a counter
    ``computing`` of the chiplets computing (``result.timeline``).  ``ts``/``dur`` in
    microseconds (:func:`us`); ``args`` carry the exact cycles.  ``slices``: per
    ``(iteration, layer)`` the slice table the layer ran with.
    ``other``: extra ``otherData`` entries."""
    npc = setup.ns_per_cycle
    n = setup.chiplets
    events: list = []
    meta: list = []

    def thread(pid, tid, name):
        meta.append(_meta(pid, tid, "thread_name", {"name": name}))
        meta.append(_meta(pid, tid, "thread_sort_index", {"sort_index": tid}))

    for pid, (strategy, rs) in enumerate(results.items(), 1):
        if len(rs) < len(layers):
            raise ValueError(f"{strategy}: {len(rs)} results for {len(layers)} layers")
        meta.append(_meta(pid, 0, "process_name", {"name": _label(strategy)}))
        meta.append(_meta(pid, 0, "process_sort_index", {"sort_index": pid}))
        thread(pid, 1, "MoE layers")
        spans: dict = {}  # (chiplet, kind) -> [(start, end, Span, layer args)]
        decisions = []
        offset = 0
        for lay, r in zip(layers, rs):
            where = {"iteration": lay.iteration, "layer": lay.layer}
            events.append(
                _span(
                    pid,
                    1,
                    f"MoE layer {lay.layer}",
                    "layer",
                    offset,
                    offset + r.cycles,
                    npc,
                    {
                        **where,
                        "tokens": lay.tokens,
                        "cycles": r.cycles,
                        "bound_cycles": r.bound,
                        "utilization": round(r.utilization, 4),
                    },
                )
            )
            steps = list(r.timeline)
            if steps and r.cycles:
                if steps[-1][0] < r.cycles:
                    steps.append((r.cycles, 0))
                for cycle, count in steps:
                    events.append(
                        {
                            "name": "computing",
                            "ph": "C",
                            "ts": us(offset + cycle, npc),
                            "pid": pid,
                            "tid": 0,
                            "args": {"chiplets": int(count)},
                        }
                    )
            if r.log:
                variant = strategy
                for sp in layer_spans(_variant_dp(setup, variant), r):
                    spans.setdefault((sp.chiplet, sp.kind), []).append(
                        (offset + sp.start, offset + sp.end, sp, where)
                    )
                if variant in REPLAYED:
                    sl = (slices or {}).get((lay.iteration, lay.layer))
                    for d in layer_decisions(setup, variant, lay, r, sl):
                        decisions.append((offset + d.cycle, d, where))
            offset += r.cycles
        if decisions:
            thread(pid, 2, "scheduler")
            for cycle, d, where in decisions:
                name = {"dispatch": "dispatch", "pre-load": "pre-load", "completion": "done"}
                events.append(
                    {
                        "name": f"{name[d.kind]} expert {d.expert}",
                        "cat": "scheduler",
                        "ph": "i",
                        "s": "t",
                        "ts": us(cycle, npc),
                        "pid": pid,
                        "tid": 2,
                        "args": {
                            "decision": d.kind,
                            "expert": d.expert,
                            "chiplet": d.chiplet,
                            **d.args,
                            "cycle": d.cycle,
                            **where,
                        },
                    }
                )
        if spans:
            tid = 10
            for c in range(n):
                for kind in KINDS:
                    mine = spans.get((c, kind), [])
                    lanes = _lanes([(a, b) for a, b, *_ in mine])
                    for lane in range(max(lanes, default=0) + 1):
                        suffix = f" #{lane + 1}" if lane else ""
                        thread(pid, tid, f"chiplet {c} {kind}{suffix}")
                        for (a, b, sp, where), ln in zip(mine, lanes):
                            if ln != lane:
                                continue
                            events.append(
                                _span(
                                    pid,
                                    tid,
                                    f"expert {sp.expert}",
                                    _CATEGORY[kind],
                                    a,
                                    b,
                                    npc,
                                    {
                                        "expert": sp.expert,
                                        "micro_slice": sp.micro_slice,
                                        "chiplet": c,
                                        "activity": kind,
                                        **sp.args,
                                        "start_cycle": sp.start,
                                        "end_cycle": sp.end,
                                        **where,
                                    },
                                )
                            )
                        tid += 1
    events.sort(key=lambda e: (e["pid"], e["ts"], e["tid"]))
    cfg = setup.cfg
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ns",
        "otherData": {
            "generator": "fsedp run --trace-events",
            "model": cfg.model.name,
            "hardware": cfg.hardware.name,
            "clock_mhz": cfg.hardware.clock_mhz,
            "ns_per_cycle": npc,
            "chiplets": n,
            "layers": ", ".join(f"iteration {x.iteration} layer {x.layer}" for x in layers),
            "time": "ts and dur in microseconds (1 ns grid), layers back to back from 0; "
            "args give cycles within the layer",
            **(other or {}),
        },
    }


def _meta(pid: int, tid: int, name: str, args: dict) -> dict:
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def _span(pid, tid, name, cat, start, end, npc, args) -> dict:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": us(start, npc),
        "dur": duration(start, end, npc),
        "pid": pid,
        "tid": tid,
        "args": args,
    }


# -- the format's rules ------------------------------------------------------------------------
#: Phases of the Trace Event Format (duration, complete, instant, counter, async, flow,
#: sample, object, metadata, memory dump, mark, clock sync, context).
PHASES = frozenset("BEXiICbnesftPNODMVvRc(),")
_METADATA = {
    "process_name": "name",
    "thread_name": "name",
    "process_labels": "labels",
    "process_sort_index": "sort_index",
    "thread_sort_index": "sort_index",
}


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _integer(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_trace_events(doc, limit: int = 10) -> None:
    """Check ``doc`` against the Trace Event Format (JSON object form) and raise a
    ``ValueError`` naming the first ``limit`` problems.  The rules: an object with a
    ``traceEvents`` list (``displayTimeUnit`` ``"ms"`` or ``"ns"``, ``otherData`` an object,
    when given); the whole document JSON (no NaN or infinity); every event an object with
    ``name`` (a string), ``ph`` (a phase), ``ts`` (a finite number of microseconds), ``pid``
    and ``tid`` (integers), ``args`` an object when given; ``X``: ``dur`` a finite number
    ``>= 0``; ``i``/``I``: scope ``s`` one of ``g``, ``p``, ``t``; ``C``: ``args`` a non-empty
    object of finite numbers; ``M``: a known metadata name with its argument (``args.name`` a
    string for ``process_name``/``thread_name``, ``args.sort_index`` an integer for the sort
    indices); ``B``/``E`` matched per thread; and the complete events of one thread nested
    (each either inside another or after it ends), compared at the importers' 1 ns
    resolution."""
    problems: list[str] = []

    def bad(where, why):
        if len(problems) < limit:
            problems.append(f"{where}: {why}")

    if not isinstance(doc, dict):
        raise ValueError("a trace in the JSON object form is an object with traceEvents")
    try:
        jsondoc.dumps(doc)
    except (TypeError, ValueError) as e:
        bad("document", f"not JSON-serialisable ({e})")
    evs = doc.get("traceEvents")
    if not isinstance(evs, list):
        raise ValueError("traceEvents: missing or not a list")
    if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in ("ms", "ns"):
        bad("displayTimeUnit", f"{doc['displayTimeUnit']!r} is not 'ms' or 'ns'")
    if "otherData" in doc and not isinstance(doc["otherData"], dict):
        bad("otherData", "not an object")
    complete: dict = {}
    open_b: dict = {}
    for i, ev in enumerate(evs):
        at = f"traceEvents[{i}]"
        if not isinstance(ev, dict):
            bad(at, "not an object")
            continue
        ph = ev.get("ph")
        if not isinstance(ph, str) or ph not in PHASES:
            bad(at, f"ph {ph!r} is not a phase of the format")
            continue
        if not isinstance(ev.get("name"), str) or not ev["name"]:
            bad(at, "name missing or not a string")
        if not _number(ev.get("ts")):
            bad(at, f"ts {ev.get('ts')!r} is not a finite number")
            continue
        for key in ("pid", "tid"):
            if not _integer(ev.get(key)):
                bad(at, f"{key} {ev.get(key)!r} is not an integer")
        if "args" in ev and not isinstance(ev["args"], dict):
            bad(at, "args is not an object")
            continue
        thread = (ev.get("pid"), ev.get("tid"))
        if ph == "X":
            dur = ev.get("dur")
            if not _number(dur) or dur < 0:
                bad(at, f"complete event with dur {dur!r} (a finite number >= 0)")
            else:
                begin = round(ev["ts"] * 1000)
                complete.setdefault(thread, []).append((begin, begin + round(dur * 1000), i))
        elif ph in "iI":
            if ev.get("s") not in ("g", "p", "t"):
                bad(at, f"instant event scope s {ev.get('s')!r} (one of g, p, t)")
        elif ph == "C":
            args = ev.get("args")
            if not args or not all(_number(v) for v in args.values()):
                bad(at, "counter event without finite numbers in args")
        elif ph == "M":
            key = _METADATA.get(ev.get("name"))
            args = ev.get("args") or {}
            if key is None:
                bad(at, f"unknown metadata event {ev.get('name')!r}")
            elif key == "name" and not isinstance(args.get("name"), str):
                bad(at, f"{ev['name']} without a string args.name")
            elif key == "sort_index" and not _integer(args.get("sort_index")):
                bad(at, f"{ev['name']} without an integer args.sort_index")
        elif ph == "B":
            open_b.setdefault(thread, []).append(i)
        elif ph == "E":
            if not open_b.get(thread):
                bad(at, "end event without a begin event on its thread")
            else:
                open_b[thread].pop()
    for left in open_b.values():
        for i in left:
            bad(f"traceEvents[{i}]", "begin event never ended")
    for thread, spans in complete.items():
        spans.sort(key=lambda x: (x[0], -x[1]))
        stack: list = []
        for begin, end, i in spans:
            while stack and stack[-1][1] <= begin:
                stack.pop()
            if stack and end > stack[-1][1]:
                bad(
                    f"traceEvents[{i}]",
                    f"complete event overlaps traceEvents[{stack[-1][2]}] on thread "
                    f"{thread} without nesting in it",
                )
            stack.append((begin, end, i))
    if problems:
        raise ValueError("; ".join(problems))
