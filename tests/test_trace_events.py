"""``fsedp run --trace-events``: the Trace Event Format file of the traced layers
(``sim/trace_events.py``), tied span for span to the layers' activity and event log and
decision for decision to the cycle loop; the binned utilization of ``utilization.png``."""

import copy
import json
from collections import Counter

import numpy as np
import pytest
from tiny import TINY_RUN as TINY

import fsedp.sim.fsedp as fsedp_sim
from fsedp.cli import main
from fsedp.config import load_run
from fsedp.sim.run import binned_utilization
from fsedp.sim.setup import make_setup
from fsedp.sim.trace_events import KINDS, check_trace_events
from fsedp.sw.streaming import StreamingArray
from fsedp.workload import iterations

#: A2 (no pre-loads, a dispatch every 3 cycles) shows a completion outside ``WAIT`` in
#: these layers: the scheduler takes it later, merged with those shown by then
FSEDP = ("A2", "A3", "A6")
LAYERS = 2


def us(cycle, ns_per_cycle):
    """Cycles as microseconds on the 1 ns grid the file uses (``docs/simulator.md``)."""
    return round(cycle * ns_per_cycle) / 1000


def duration(start, end, ns_per_cycle):
    return (round(end * ns_per_cycle) - round(start * ns_per_cycle)) / 1000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    cfg.write_text(TINY)
    return cfg


@pytest.fixture(scope="module")
def traced(tiny, tmp_path_factory):
    """The CLI's trace of the first two layers of a tiny run (EP, A3, A6)."""
    where = tmp_path_factory.mktemp("run")
    path = where / "trace.json"
    rc = main(
        [
            "run",
            "--config",
            str(tiny),
            "--layers",
            str(LAYERS),
            "--strategies",
            "EP," + ",".join(FSEDP),
            "--workers",
            "2",  # the pool's workers keep the event log too
            "--out",
            str(where / "report"),
            "--trace-events",
            str(path),
            "--trace-layers",
            str(LAYERS),
            "--json",
        ]
    )
    assert rc == 0
    return json.loads(path.read_text())


class _Recording(StreamingArray):
    """The golden model, noting the cycle of every beat it is presented and every
    completion mask the scheduler takes (shown while ``done.ready`` is high: one shown
    outside the scheduler's ``WAIT`` is not taken and stays shown)."""

    seen: list = []

    def step(self, inp):
        cycle = self.cycle
        out = super().step(inp)
        if inp.dispatch is not None:
            kind = "dispatch" if inp.dispatch.kind == 0 else "pre-load"
            self.seen.append((cycle, kind, inp.dispatch.expert))
        if out.done and inp.done_ready:
            self.seen.append((cycle, "done", out.done))
        return out


@pytest.fixture(scope="module")
def expected(tiny):
    """The same layers on the Python golden model: results and the cycles of the decisions
    the cycle loop presented and took."""
    cfg = load_run(tiny)
    setup = make_setup(cfg)
    layers = iterations(cfg, 1, LAYERS)[0]
    mp = pytest.MonkeyPatch()
    mp.setattr(fsedp_sim, "StreamingArray", _Recording)
    out = {}
    try:
        for s in FSEDP:
            for lay in layers:
                _Recording.seen = []
                r = fsedp_sim.fsedp_layer(
                    setup, lay.records, s, trace=True, log=True, streaming="python"
                )
                out[s, lay.layer] = (r, list(_Recording.seen))
    finally:
        mp.undo()
    return setup, layers, out


def _process(doc, label):
    pids = [
        e["pid"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name" and e["args"]["name"] == label
    ]
    assert len(pids) == 1, label
    return pids[0]


def _threads(doc, pid):
    return {
        e["tid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid
    }


def test_trace_file_passes_the_format_rules(traced):
    check_trace_events(traced)
    assert traced["displayTimeUnit"] == "ns" and isinstance(traced["otherData"], dict)
    # every track that holds an event is named and ordered; every process is named
    named = {(e["pid"], e["tid"]) for e in traced["traceEvents"] if e["name"] == "thread_name"}
    sorted_ = {
        (e["pid"], e["tid"]) for e in traced["traceEvents"] if e["name"] == "thread_sort_index"
    }
    used = {(e["pid"], e["tid"]) for e in traced["traceEvents"] if e["ph"] in "Xi"}
    assert used and used <= named and named == sorted_
    procs = {e["pid"] for e in traced["traceEvents"] if e["name"] == "process_name"}
    assert procs == {e["pid"] for e in traced["traceEvents"]} and len(procs) == 1 + len(FSEDP)
    for e in traced["traceEvents"]:
        if e["ph"] == "X" and e["cat"] != "layer":
            assert {"expert", "micro_slice", "chiplet"} <= set(e["args"])
        if e["ph"] == "i":
            assert e["s"] == "t" and {"expert", "chiplet", "micro_slices"} <= set(e["args"])


def test_spans_are_the_activity_and_the_event_log(traced, expected):
    setup, layers, res = expected
    npc = setup.ns_per_cycle
    for s in FSEDP:
        pid = _process(traced, f"FSE-DP {s}")
        names = _threads(traced, pid)
        got: dict = {}
        got_log = Counter()
        for e in traced["traceEvents"]:
            if e["pid"] != pid or e["ph"] != "X" or e["cat"] == "layer":
                continue
            a = e["args"]
            c, kind = a["chiplet"], a["activity"]
            assert names[e["tid"]].startswith(f"chiplet {c} {kind}")
            got.setdefault((a["layer"], c, kind), []).append(
                (a["start_cycle"], a["end_cycle"], e["ts"], e["dur"])
            )
            at = a["end_cycle"] - 1 if kind == "compute" else a["start_cycle"]
            if kind != "D2D receive":  # a transfer is one event: its send
                got_log[a["layer"], at, c, a["expert"], a["micro_slice"]] += 1
        want: dict = {}
        want_log = Counter()
        offset = 0
        for lay in layers:
            r, _ = res[s, lay.layer]
            assert r.activity and r.log
            for c, kind, start, end in r.activity:
                want.setdefault((lay.layer, c, kind), []).append(
                    (
                        start,
                        end,
                        us(offset + start, npc),
                        duration(offset + start, offset + end, npc),
                    )
                )
            for _, cycle, c, _, e, i in r.log:
                want_log[lay.layer, cycle, c, e, i] += 1
            offset += r.cycles
        assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}
        assert sum(map(len, got.values())) == sum(len(res[s, x.layer][0].activity) for x in layers)
        assert got_log == want_log
        assert {k[2] for k in got} == set(KINDS)


def test_decisions_are_the_cycles_the_loop_took(traced, expected):
    setup, layers, res = expected
    npc = setup.ns_per_cycle
    for s in FSEDP:
        pid = _process(traced, f"FSE-DP {s}")
        assert _threads(traced, pid)[2] == "scheduler"
        got = Counter()
        done = set()
        for e in traced["traceEvents"]:
            if e["pid"] == pid and e["ph"] == "i":
                a = e["args"]
                if a["decision"] == "completion":
                    done.add((a["layer"], a["cycle"], a["done_mask"]))
                else:
                    got[a["layer"], a["cycle"], a["decision"], a["expert"]] += 1
        want = Counter()
        want_done = set()
        offset = 0
        for lay in layers:
            r, seen = res[s, lay.layer]
            for cycle, kind, x in seen:
                if kind == "done":
                    want_done.add((lay.layer, cycle, x))
                else:
                    want[lay.layer, cycle, kind, x] += 1
            offset += r.cycles
        assert got == want and sum(want.values()) == sum(
            len(res[s, x.layer][0].beats) for x in layers
        )
        assert done == want_done
        # the layers lie back to back: layer 1's decisions after layer 0's end
        first = res[s, layers[0].layer][0].cycles
        ts = [
            e["ts"]
            for e in traced["traceEvents"]
            if e["pid"] == pid and e["ph"] == "i" and e["args"]["layer"] == layers[1].layer
        ]
        assert min(ts) >= us(first, npc)


def test_every_strategy_has_its_layers_and_timeline(traced, expected):
    setup, layers, res = expected
    npc = setup.ns_per_cycle
    for label in ("EP", *(f"FSE-DP {s}" for s in FSEDP)):
        pid = _process(traced, label)
        spans = [e for e in traced["traceEvents"] if e["pid"] == pid and e.get("cat") == "layer"]
        assert [e["args"]["layer"] for e in spans] == [x.layer for x in layers]
        offset = 0
        for e in spans:
            cycles = e["args"]["cycles"]
            assert e["ts"] == us(offset, npc) and e["dur"] == duration(offset, offset + cycles, npc)
            offset += cycles
        counts = [e for e in traced["traceEvents"] if e["pid"] == pid and e["ph"] == "C"]
        assert counts and all(0 <= e["args"]["chiplets"] <= setup.chiplets for e in counts)
    for s in FSEDP:
        pid = _process(traced, f"FSE-DP {s}")
        for e in traced["traceEvents"]:
            if e["pid"] == pid and e.get("cat") == "layer":
                assert e["args"]["cycles"] == res[s, e["args"]["layer"]][0].cycles


GOOD = {
    "traceEvents": [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "p"}},
        {"name": "a", "ph": "X", "ts": 1.0, "dur": 2.0, "pid": 1, "tid": 1, "args": {}},
        {"name": "b", "ph": "X", "ts": 1.5, "dur": 0.5, "pid": 1, "tid": 1},
        {"name": "c", "ph": "X", "ts": 3.0, "dur": 1.0, "pid": 1, "tid": 1},
        {"name": "d", "ph": "i", "s": "t", "ts": 2.0, "pid": 1, "tid": 2},
        {"name": "n", "ph": "C", "ts": 2.0, "pid": 1, "tid": 0, "args": {"v": 3}},
    ],
    "displayTimeUnit": "ns",
    "otherData": {},
}


@pytest.mark.parametrize(
    "index,change,words",
    [
        (1, {"dur": -1.0}, "dur"),
        (1, {"ts": float("nan")}, "ts"),
        (1, {"tid": "1"}, "tid"),
        (1, {"name": None}, "name"),
        (1, {"ph": "Z"}, "phase"),
        (2, {"dur": 2.0}, "overlaps"),  # 1.5 .. 3.5 across the end of a (1 .. 3)
        (4, {"s": None}, "scope"),
        (0, {"args": {}}, "args.name"),
        (5, {"args": {"v": "x"}}, "counter"),
        (1, {"args": {"x": {1, 2}}}, "JSON"),
    ],
)
def test_validator_refuses_what_the_format_does_not_allow(index, change, words):
    check_trace_events(GOOD)
    doc = copy.deepcopy(GOOD)
    doc["traceEvents"][index].update(change)
    doc["traceEvents"][index] = {
        k: v for k, v in doc["traceEvents"][index].items() if v is not None
    }
    with pytest.raises(ValueError, match=words):
        check_trace_events(doc)


def _run(tiny, *extra):
    return main(["run", "--config", str(tiny), "--layers", "1", "--strategies", "A3", *extra])


def _no_work(monkeypatch):
    import fsedp.sim.run

    def refuse(*a, **k):
        raise AssertionError("simulated before the options were checked")

    monkeypatch.setattr(fsedp.sim.run, "run_experiment", refuse)


@pytest.mark.parametrize("where", ["folder", "link", "under-a-file", "in-report"])
def test_bad_trace_events_path_refused_before_any_work(tiny, tmp_path, capsys, monkeypatch, where):
    _no_work(monkeypatch)
    out = tmp_path / "report"
    (tmp_path / "file").write_text("x")
    (tmp_path / "target.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    path = {
        "folder": tmp_path,
        "link": tmp_path / "link.json",
        "under-a-file": tmp_path / "file" / "t.json",
        "in-report": out / "t.json",
    }[where]
    assert _run(tiny, "--out", str(out), "--trace-events", str(path)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and str(path) in err
    assert not out.exists() and (tmp_path / "target.json").read_text() == "{}"


@pytest.mark.parametrize(
    "extra,option",
    [
        (["--trace-events", "t.json", "--trace-layers", "0"], "--trace-layers"),
        (["--trace-events", "t.json", "--trace-layers", "-1"], "--trace-layers"),
        (["--trace-events", "t.json", "--trace-layers", "4"], "--trace-layers"),  # 1 layer run
        (["--trace-layers", "1"], "--trace-layers"),  # without --trace-events
        (["--trace-events", " "], "--trace-events"),
    ],
)
def test_bad_trace_layers_refused(tiny, tmp_path, capsys, monkeypatch, extra, option):
    _no_work(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert _run(tiny, "--out", str(tmp_path / "r"), *extra) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and option in err
    assert not (tmp_path / "t.json").exists()


def test_binned_utilization_is_the_mean_of_each_bin():
    # 0 chiplets of 4 computing until cycle 10, 4 until 20, 2 until the end at 40
    timeline = [(0, 0), (10, 4), (20, 2)]
    got = binned_utilization(timeline, 40, [0, 10, 20, 30, 40, 50], 4)
    assert np.allclose(got[:4], [0, 1, 0.5, 0.5]) and np.isnan(got[4])
    # bins that straddle steps and the end: [0, 15) and [15, 40) of [15, 45)
    got = binned_utilization(timeline, 40, [0, 15, 45], 4)
    assert np.allclose(got, [(4 * 5) / 15 / 4, (4 * 5 + 2 * 20) / 25 / 4])
    # the mean over the layer is the layer's utilization
    assert np.isclose(binned_utilization(timeline, 40, [0, 40], 4)[0], (40 + 40) / (4 * 40))
