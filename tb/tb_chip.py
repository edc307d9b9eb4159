"""Bench of the chip top (``fsedp_chip``: scheduler + chiplet array, ``hw/chip.py``) against
the golden models: one body, :func:`bench`, run in Amaranth's simulator
(``tests/test_chip.py``, the fast tier) and by cocotb on the generated Verilog under
Verilator (:data:`chip_vs_golden`, ``tests/test_chip.py`` slow tier), through ``tb/bench.py``.

Driver -> DUT -> monitor -> checker:

* The driver feeds a layer: its ``req_init`` beats, then its gate records (``last`` on the
  final one), each after a pause of chance ``gap``; in parallel, from the layer's first
  cycle, its token-table writes (``fsedp.sw.scheduler.layer_tokens``: what the gate writes
  with the records), one per cycle.  Every cycle it draws the link and DDR stalls (chance
  ``stall``, as the array bench does).
* The checker, :class:`ChipModel`, predicts every cycle of the chip from the layer's
  inputs alone: the golden scheduler (:class:`fsedp.sw.scheduler.Scheduler`) makes the
  decisions, :class:`fsedp.sw.scheduler_timing.SchedulerTiming` (the golden timing of the
  scheduler's back half, the one the simulator follows too) places them in the cycles the
  scheduler RTL presents them (first beat ``front_latency`` after the last gate record, a
  dispatch every ``DISPATCH_CYCLES``, a pre-load ``DISPATCH_TO_PRELOAD`` after its dispatch,
  ``done`` taken only while waiting, the next beat ``DONE_TO_BEAT`` after a completion), and
  the streaming golden model
  (:class:`fsedp.sw.streaming.StreamingArray`) is stepped with them.  Every cycle the chip's
  beat (the internal dispatch stream), completion (the internal ``done`` transfer),
  ``events`` and ``occupancy`` must equal the prediction, and ``idle`` must rise in the
  cycle the prediction says.
* Per layer the report keeps the beats ``[kind, expert, entry, traj]``, the completion
  masks in order, the cycle of the first beat and the end (the first cycle after the last
  completion with the array idle, as the simulator counts a layer): with ``expected`` (per
  layer ``{"beats", "script", "cycles"}`` from :func:`fsedp.sim.fsedp.fsedp_layer`) they are
  compared with the simulator's (``sim_mismatches``): the simulator follows the same
  scheduler timing, so a difference is a mismatch and fails the run
  (``docs/blocks/chip.md``).

A reset in the middle of every ``reset_every``-th layer resets the chip and the models
together; the bench then waits for ``idle`` and goes on with the next layer.

Knobs: ``layers``, ``seed``, ``stall``, ``gap``, ``tokens``, ``top_k`` (random rounds,
:func:`fsedp.tb.scoreboard.random_round`), ``rounds`` (a list of ``{"records":
[[request, chiplet, expert], ...], "req_inits": [[request, t_qos], ...]}``, or
``rounds_file``: a JSON file of it), ``expected``, ``reset_every``,
``max_layer_cycles``, ``limit`` (cycles of the whole run: the run stops there, every cycle
before it checked, and says so with ``limited``; a gate-level recording of a window of a
long layer, ``fsedp.experiments.activity``).
"""

import json
import random
from collections import deque

from fsedp.hw.chip import Chip, ChipParams
from fsedp.hw.layouts import (
    dispatch_bits,
    gate_bits,
    req_init_bits,
    tokens_bits,
    unpack_events,
    unpack_occupancy,
)
from fsedp.sw.scheduler import Scheduler, layer_tokens
from fsedp.sw.scheduler_timing import SchedulerTiming
from fsedp.sw.streaming import StepIn, StreamingArray
from fsedp.tb.bench import Bench, cocotb_entry
from fsedp.tb.scoreboard import random_round

__all__ = ["ChipModel", "SchedulerTiming", "bench", "chip_vs_golden", "component"]


def component(p: ChipParams) -> Chip:
    return Chip(p)


class ChipModel:
    """The chip's golden model: :class:`SchedulerTiming` around the golden scheduler, and
    the streaming golden model, joined as the RTL joins them (a beat taken in the cycle it is
    presented, a completion taken in the cycle the scheduler waits)."""

    def __init__(self, p: ChipParams, sched: Scheduler | None = None):
        self.p = p
        self.timing = SchedulerTiming(sched or Scheduler(p.sched))
        self.arr = StreamingArray(p.datapath)

    def reset(self):
        self.timing.reset()
        self.arr.reset()

    def step(self, c: int, stall=(), ddr_stall=False, tokens=None, slices=None):
        """Cycle ``c``: ``(beat, completion mask or 0, StepOut)``."""
        beat, ready = self.timing.cycle(c)
        out = self.arr.step(StepIn(beat, ready, stall, ddr_stall, tokens, slices))
        done = out.done if ready else 0
        if done:
            self.timing.completed(c, done)
        return beat, done, out

    @property
    def idle(self) -> bool:
        return self.timing.idle and self.arr.idle


def _rounds(k: dict, sp, rng: random.Random) -> list | None:
    if k.get("rounds_file"):
        with open(k["rounds_file"]) as f:
            return json.load(f)
    return k.get("rounds")


#: the chip's sticky error flags, checked at the end of every layer (and at a ``limit``)
FLAGS = ("overflow", "bad_record", "spurious_done", "bad_dispatch", "orphan")


async def bench(b: Bench, p: ChipParams, k: dict) -> dict:
    sp, dp = p.sched, p.datapath
    n = dp.chiplets
    rng = random.Random(k.get("seed", 1))
    trng = random.Random(k.get("seed", 1) + 7919)  # timing: stalls, gaps, reset points
    stall, gap = k.get("stall", 0.0), k.get("gap", 0.0)
    reset_every = k.get("reset_every", 0)
    bound = k.get("max_layer_cycles", 50_000)
    limit = k.get("limit")
    rounds = _rounds(k, sp, rng)
    layers = len(rounds) if rounds is not None else k.get("layers", 4)
    expected = k.get("expected")
    model = ChipModel(p)
    report = {
        "layers": 0,
        "resets": 0,
        "cycles": 0,
        "beats": 0,
        "mismatches": 0,
        "first_mismatches": [],
        "first_mismatch_layer": None,
        "sim_mismatches": [],
        "per_layer": [],
    }

    def miss(layer, what):
        if not report["mismatches"]:
            report["first_mismatch_layer"] = layer
        report["mismatches"] += 1
        if len(report["first_mismatches"]) < 5:
            report["first_mismatches"].append(f"layer {layer} cycle {b.cycle}: {what}")

    async def check_flags(layer) -> bool:
        """The chip's sticky error flags, a mismatch when one is raised."""
        flags = {f: await b.get(f) for f in FLAGS}
        if any(flags.values()):
            miss(layer, f"error flags raised: {flags}")
        return any(flags.values())

    for layer in range(layers):
        if rounds is not None:
            rec = [tuple(r) for r in rounds[layer]["records"]]
            inits = [tuple(r) for r in rounds[layer].get("req_inits", [])]
        else:
            rnd = random_round(sp, rng, tokens=k.get("tokens"), top_k=k.get("top_k"))
            rec, inits = [tuple(r) for r in rnd.records], list(rnd.req_inits)
        for r, t in inits:
            model.timing.s.init_request(r, t)
        plan = model.timing.start_round(rec)
        tok = deque((c, e, t) for (c, e), t in sorted(layer_tokens(sp, rec, plan.defer).items()))
        items = deque([("init", x) for x in inits] + [("rec", x) for x in rec])
        start = b.cycle
        reset_at = (
            start + trng.randint(10, 120)
            if reset_every and layer % reset_every == reset_every - 1
            else None
        )
        beats, script, first, last_done, end = [], [], None, None, None
        offered = False
        fed = None  # cycle of the last gate record
        while True:
            if b.cycle == reset_at:
                for name in ("gate.valid", "req_init.valid", "tokens.valid"):
                    b.set(name, 0)
                await b.reset(1)
                model.reset()
                report["resets"] += 1
                # the scheduler clears its tables, then waits for gate records
                while not await b.get("idle"):
                    model.step(b.cycle)
                    await b.tick()
                    if b.cycle - start > bound:
                        miss(layer, "not idle after reset")
                        break
                break
            # -- drive
            c = b.cycle
            st = tuple(
                sum(1 << d for d in range(4) if trng.random() < stall) if stall else 0
                for _ in range(n)
            )
            ddr_stall = bool(stall) and trng.random() < stall
            b.set("stall", sum(s << (4 * i) for i, s in enumerate(st)))
            b.set("ddr_stall", ddr_stall)
            tw = tok[0] if tok else None
            b.set("tokens.valid", tw is not None)
            if tw is not None:
                b.set("tokens.payload", tokens_bits(dp, *tw))
            if items and not offered:  # a pause before a beat; a beat offered stays
                offered = not (gap and trng.random() < gap)
            item = items[0] if items and offered else None
            b.set("req_init.valid", item is not None and item[0] == "init")
            b.set("gate.valid", item is not None and item[0] == "rec")
            if item is not None and item[0] == "init":
                b.set("req_init.payload", req_init_bits(sp, *item[1]))
            if item is not None and item[0] == "rec":
                b.set("gate.payload", gate_bits(sp, *item[1], len(items) == 1))
            # -- sample
            taken = False
            if item is not None:
                taken = bool(await b.get("req_init.ready" if item[0] == "init" else "gate.ready"))
            rbeat = await b.get("beat.payload") if await b.get("beat.valid") else None
            rdone = await b.get("completion.payload") if await b.get("completion.valid") else 0
            events = unpack_events(dp, await b.get("events"))
            occ = unpack_occupancy(dp, await b.get("occupancy"))
            aidle = bool(await b.get("array_idle"))
            idle = bool(await b.get("idle"))
            # -- the golden model of the same cycle
            # the array's ``idle`` is its registered state of this cycle: the golden array's
            # before its step (after it, a slot released at this cycle's edge is already
            # free); the scheduler's, the timing model's state after its step
            arr_idle = model.arr.idle
            mbeat, mdone, out = model.step(c, st, ddr_stall, tw)
            midle = model.timing.idle and arr_idle
            want = dispatch_bits(sp, mbeat) if mbeat is not None else None
            if rbeat != want:
                miss(layer, f"beat: RTL {rbeat} != golden {want} ({mbeat})")
            if rdone != mdone:
                miss(layer, f"completion: RTL {rdone:#x} != golden {mdone:#x}")
            if events != out.events:
                miss(layer, f"events: RTL {events} != golden {out.events}")
            if occ != out.occupancy:
                miss(layer, f"occupancy: RTL {occ} != golden {out.occupancy}")
            if report["mismatches"]:
                break
            if mbeat is not None:
                first = c if first is None else first
                beats.append([mbeat.kind, mbeat.expert, mbeat.entry, mbeat.traj])
            if mdone:
                script.append(mdone)
                last_done, end = c, None
            if end is None and last_done is not None and c > last_done and aidle:
                end = c
            if tw is not None:
                tok.popleft()
            if taken:
                items.popleft()
                offered = False
                if item[0] == "rec" and not items:
                    model.timing.last_record(c)
                    fed = c
            if fed is None or c == fed or tok:
                pass
            elif idle:
                if not midle:
                    miss(layer, "idle: RTL 1 before the golden model")
                break
            elif midle:
                miss(layer, "idle: golden model idle, RTL not")
                break
            await b.tick()
            if limit is not None and b.cycle >= limit:
                report["limited"] = True
                await check_flags(layer)
                break
            if b.cycle - start > bound:
                miss(layer, f"layer not over within {bound} cycles")
                break
        if report["mismatches"] or report.get("limited"):
            break
        if reset_at is None or b.cycle < reset_at:
            report["layers"] += 1
            report["beats"] += len(beats)
            cyc = end - first if first is not None else 0
            if await check_flags(layer):
                break
            first_ok = first is None or first == model.timing.first_beat
            if not first_ok:
                miss(layer, f"first beat in {first}, golden {model.timing.first_beat}")
                break
            report["per_layer"].append(
                {"first_beat": first, "end": end, "cycles": cyc, "beats": beats, "script": script}
            )
            if expected is not None:
                exp = expected[layer]
                diffs = [
                    f"{what}: chip {got} != simulator {want}"
                    for what, got, want in (
                        ("cycles", cyc, exp["cycles"]),
                        ("beats", beats, [list(x) for x in exp["beats"]]),
                        ("script", script, list(exp["script"])),
                    )
                    if got != want
                ]
                if diffs:
                    report["sim_mismatches"].append(
                        {"layer": layer, "diffs": [d[:300] for d in diffs]}
                    )
                    miss(layer, "simulator: " + "; ".join(d[:300] for d in diffs))
                    break
    report["cycles"] = b.cycle
    return report


def verdict(b: Bench, report: dict, layers: int):
    """Fail the run on a mismatch with the golden model or with the simulator's layers, or
    when a layer was not run to its end (but for a run stopped at its ``limit``)."""
    problems = list(report["first_mismatches"])
    if report["layers"] + report["resets"] != layers and not report.get("limited"):
        problems.append(f"{report['layers']} layers + {report['resets']} resets of {layers}")
    if report["sim_mismatches"]:
        problems.append(f"simulator: {report['sim_mismatches'][:2]}")
    if problems:
        b.fail(f"{report['mismatches']} mismatches:\n" + "\n".join(problems))


async def _bench_reporting(b: Bench, p: ChipParams, k: dict) -> dict:
    report = await bench(b, p, k)
    rounds = _rounds(k, p.sched, random.Random(0))
    layers = len(rounds) if rounds is not None else k.get("layers", 4)
    try:
        verdict(b, report, layers)
    except AssertionError as e:
        report["failure"] = str(e)
        from fsedp.tb.streams import write_report

        write_report(report)
        raise
    return report


chip_vs_golden = cocotb_entry("chip_vs_golden", component, _bench_reporting, ChipParams)
