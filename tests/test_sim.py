"""Performance simulator: setup, baselines, FSE-DP layers, bounds, the RTL decision check."""

import copy

import numpy as np
import pytest
from tiny import TINY

from fsedp.config import SYNTHETIC_ONLY, config_to_dict, default_run, run_from_dict
from fsedp.sim.baselines import _flow_shop, ep_home, ep_layer, hydra_home
from fsedp.sim.fsedp import fsedp_layer
from fsedp.sim.run import run_experiment, summarize
from fsedp.sim.setup import make_setup
from fsedp.workload import iterations


def tiny(tokens=64, **hw):
    d = {
        **TINY,
        "hardware": {**TINY["hardware"], **hw},
        "scenario": {**TINY["scenario"], "tokens_per_iteration": tokens},
    }
    return run_from_dict(d, "tiny.yaml")


def test_setup_of_the_default_run():
    s = make_setup(default_run())
    assert s.dp.ddr_channels == 4 and s.dp.micro_slices == 8
    # slots: 4 MiB over a micro-slice of Qwen3's expert (3 x 2048 x 768 bytes / 8)
    assert s.dp.slots == (4096 * 1024) // (3 * 2048 * 768 // 8) == 7
    assert s.microslice_bytes == 3 * 2048 * 768 // 8
    # one 25.6 GB/s channel at 800 MHz moves 32 bytes per cycle
    assert s.dp.ddr_interval == -(-s.microslice_bytes // 32)
    assert s.sp.theta_min == 0  # token buffering off for A1-A4


@pytest.mark.parametrize("tokens", [16, 64, 256])
def test_no_strategy_beats_the_bound(tokens):
    cfg = tiny(tokens)
    run = run_experiment(
        cfg,
        ("EP", "Hydra", "A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8"),
        n_iter=2,
        progress=False,
    )
    for s, rs in run["results"].items():
        for r in rs:
            if r.bound == 0:  # A5: every request of the layer deferred
                assert s == "A5" and r.cycles == 0
                continue
            assert r.cycles >= r.bound > 0, (s, r.cycles, r.bound)
            assert r.cycles >= r.link_bound >= r.bound, (s, r.cycles, r.link_bound)
            if s in ("EP", "Hydra"):  # they move tokens: the stream bound does not apply
                assert r.stream_bound == 0
            else:
                assert r.cycles >= r.stream_bound >= r.link_bound, (s, r.cycles, r.stream_bound)
            assert 0 <= r.utilization <= 1 and r.peak_weight_bytes > 0
    summary = summarize(run)
    assert summary["EP"]["speedup_vs_ep"] == 1.0
    # EP moves tokens to the experts' homes and back; FSE-DP moves micro-slices instead
    assert sum(r.d2d_bytes for r in run["results"]["EP"]) > 0


def test_fsedp_loads_each_active_expert_once():
    cfg = tiny(64)
    s = make_setup(cfg)
    layer = iterations(cfg, 1)[0][0]
    counts = layer.expert_counts(s.sp.experts)
    for v in ("A1", "A2", "A3", "A4", "A6", "A8"):
        r = fsedp_layer(s, layer.records, v)
        assert r.ddr_bytes == np.count_nonzero(counts) * s.expert_bytes
        assert sum(r.busy) == sum(
            int(counts[e]) * s.dp.micro_slices * s.dp.cycles_per_token for e in range(len(counts))
        )


def test_flow_shop_pipeline():
    # 3 chunks, load 10, compute 4, latency 2, 2 slots: loads back to back, computes follow
    end, iv, _ = _flow_shop([(10, 4)] * 3, slots=2, interval=10, latency=2, start=0)
    assert iv == [(12, 16), (22, 26), (32, 36)] and end == 36
    # one slot: the second load waits for the first compute
    end, iv, _ = _flow_shop([(10, 4)] * 2, slots=1, interval=10, latency=2, start=0)
    assert iv == [(12, 16), (28, 32)]


def test_hydra_balances_predicted_load():
    s = make_setup(tiny(64))
    pred = np.array([40, 30, 20, 10] + [0] * 12)
    home = hydra_home(s, pred)
    hot = [home[e] for e in range(4)]
    assert len(set(hot)) == 4  # the four hot experts on four chiplets
    assert ep_home(16, 4)[:5] == [0, 1, 2, 3, 0]


def test_ep_compute_imbalance_costs_time():
    s = make_setup(tiny(64))
    hot = [(0, c, 0) for c in range(4) for _ in range(40)]  # one very hot expert
    r = ep_layer(s, hot, ep_home(16, 4))
    # EP: the home chiplet computes all 160 tokens of every micro-slice, the others nothing
    m, cpt = s.dp.micro_slices, s.dp.cycles_per_token
    assert r.busy == [m * 160 * cpt, 0, 0, 0]
    f = fsedp_layer(s, hot, "A3")
    # FSE-DP streams the expert through all four chiplets, each computing its own 40 tokens
    assert f.busy == [m * 40 * cpt] * 4
    assert r.cycles >= r.busy[0] and f.cycles < r.cycles


def test_paper_ep_loads_a_whole_expert_before_computing_it():
    """The paper's EP (``EP-paper``): with one whole expert in the buffer, each expert on a
    chiplet costs its whole load, the DDR latency and its compute, one after the other;
    the all-to-all comes before and after.  Ours overlaps them."""
    from fsedp.sim.baselines import _all_to_all

    s = make_setup(tiny(64))
    assert s.buffer_bytes // s.expert_bytes == 1
    recs = [(0, c, e) for c in range(4) for e in (0, 4, 8) for _ in range(5)]  # all on chiplet 0
    home = ep_home(16, 4)
    paper = ep_layer(s, recs, home, "EP-paper", whole=True)
    ours = ep_layer(s, recs, home)
    dispatch, _ = _all_to_all(s, recs, home)
    m, cpt = s.dp.micro_slices, s.dp.cycles_per_token
    per_expert = m * s.dp.ddr_interval + s.ddr_access_cycles + 20 * cpt * m
    assert paper.cycles == 3 * per_expert + dispatch
    assert paper.busy == ours.busy == [3 * 20 * cpt * m, 0, 0, 0]
    assert paper.peak_weight_bytes == s.expert_bytes  # holds a whole expert
    assert ours.cycles < paper.cycles


def test_rtl_check_reports_the_first_difference(tmp_path):
    from fsedp.sim.rtl_check import RTLSchedulerCheck
    from fsedp.tb.runner import simulator_missing

    if simulator_missing("verilator"):
        pytest.skip(simulator_missing("verilator"))
    cfg = tiny(32)
    s = make_setup(cfg)
    layer = iterations(cfg, 1)[0][0]
    r = fsedp_layer(s, layer.records, "A3")
    check = RTLSchedulerCheck(cfg, tmp_path)
    r.beats[1] = [r.beats[1][0], (r.beats[1][1] + 1) % 16, r.beats[1][2], r.beats[1][3]]
    check.record("A3", layer, r)
    res = check.finish()
    assert res["mismatches"] >= 1 and "decision 1" in res["first_mismatch"]


def one_request_run(tmp_path, iterations: int, requests: int = 1, tokens: int = 64):
    """The tiny model on a trace of ``requests`` long requests (an imported ``.npy`` is one)."""
    from fsedp.trace import synthetic
    from fsedp.trace.io import save_trace

    path = tmp_path / "long.npz"
    t = synthetic(16, 2, tokens * iterations, layers=4, seed=3, skew=1.2, requests=requests)
    save_trace(t, path)
    scenario = {k: v for k, v in TINY["scenario"].items() if k not in SYNTHETIC_ONLY}
    d = {**TINY, "scenario": {**scenario, "trace": str(path)}}
    d["scheduler"] = {"requests": 8, "theta_min": 2, "n_threshold": 4, "qos_width": 4}
    d["scheduler"]["t_qos_init"] = 0
    return run_from_dict(d, "long.yaml")


def test_a5_defers_and_conserves_work(tmp_path):
    """Token buffering moves work between iterations but loses none: every (token, expert)
    record is computed exactly once over the run (deferred ones later, or in the flush), and
    the flush is in the results and in the per-layer report."""
    cfg = one_request_run(tmp_path, 12)
    run = run_experiment(cfg, ("A3", "A5"), n_iter=12, progress=False)
    s = make_setup(cfg)
    mac = s.dp.micro_slices * s.dp.cycles_per_token
    total = {k: sum(sum(r.busy) for r in rs) for k, rs in run["results"].items()}
    assert total["A5"] == total["A3"] and total["A3"] > 0 and total["A3"] % mac == 0
    summary = summarize(run)
    assert summary["A5"]["deferrals"] > 0 and summary["A5"]["flush_layers"] > 0
    assert len(run["results"]["A5"]) == len(run["layers"]) + summary["A5"]["flush_layers"]


@pytest.mark.parametrize("iterations, requests", [(12, 1), (4, 1), (10, 3), (6, 8)])
def test_a5_keeps_every_request_within_its_slack(tmp_path, iterations, requests):
    """The host lets Algorithm 2 defer a request only while the delay stays within 20 % of
    its latency: no request is delayed beyond its slack, one long request included."""
    cfg = one_request_run(tmp_path, iterations, requests)
    run = run_experiment(cfg, ("A5",), n_iter=iterations, progress=False)
    q = summarize(run)["A5"]["qos"]
    assert q["requests"] == requests
    assert q["violations"] == 0 and q["delay_over_slack_max"] <= 1.0, q


def test_a5_does_not_defer_requests_that_cannot_afford_it():
    """Requests of one iteration (16 tokens each) have a slack of a fifth of an iteration
    and a deferral costs a whole one: A5 runs them as A3 does."""
    cfg = tiny(64)
    run = run_experiment(cfg, ("A3", "A5"), n_iter=3, progress=False)
    assert summarize(run)["A5"]["qos"]["deferrals"] == 0
    assert [r.cycles for r in run["results"]["A5"]] == [r.cycles for r in run["results"]["A3"]]


def test_parallel_run_equals_sequential():
    """The worker pool changes nothing, and both equal each layer simulated on its own in
    workload order (so no result is lost, duplicated or put in another layer's place)."""
    cfg = tiny(64)
    seq = run_experiment(cfg, ("EP", "A2", "A3"), n_iter=1, progress=False, workers=1)
    par = run_experiment(cfg, ("EP", "A2", "A3"), n_iter=1, progress=False, workers=2)
    setup = make_setup(cfg)
    layers = [lay for it in iterations(cfg, 1) for lay in it]
    direct = {
        "EP": [ep_layer(setup, lay.records, ep_home(16, 4)) for lay in layers],
        "A2": [fsedp_layer(setup, lay.records, "A2") for lay in layers],
        "A3": [fsedp_layer(setup, lay.records, "A3") for lay in layers],
    }
    for s in ("EP", "A2", "A3"):
        want = [(r.cycles, r.busy, r.ddr_bytes) for r in direct[s]]
        assert [(r.cycles, r.busy, r.ddr_bytes) for r in seq["results"][s]] == want
        assert [(r.cycles, r.busy, r.ddr_bytes) for r in par["results"][s]] == want
    # and the layers differ (a run that repeated one layer would not pass)
    assert len({r.cycles for r in direct["A3"]}) > 1


def test_bench_rows_are_consistent():
    from fsedp.sim.bench import bench, format_bench

    rows = bench(points=(("chip2x2", 16, "qwen3-30b-a3b"),), layers=1)
    r = rows[0]
    assert r["experts"] == 128 and r["micro_slices"] == 8 and r["steps_per_layer"] > 0
    # every active expert's micro-slices are loaded and computed at least once
    assert r["events_per_layer"] >= 2 * 8 * 10
    for e, s in r["s_per_layer"].items():
        assert abs(r["events_per_s"][e] * s - r["events_per_layer"]) <= 0.01 * r["events_per_layer"]
    assert set(r["s_per_layer"]) == {"python", "compiled"} and r["ratio"] > 0
    assert "qwen3-30b-a3b (128, 8)" in format_bench(rows)


def _table_i(model: str, tokens: int):
    d = config_to_dict(default_run())
    d["model"] = model
    del d["hardware"]["microslices_per_expert"]  # derived per model, as the sweeps do
    del d["scheduler"]["count_width"]
    d["scenario"]["tokens_per_iteration"] = tokens
    return run_from_dict(d, f"<{model}>")


@pytest.mark.parametrize(
    "model, tokens",
    [("qwen3-30b-a3b", 16), ("qwen3-30b-a3b", 256), ("mixtral-8x7b", 64), ("phi-3.5-moe", 64)],
)
def test_no_strategy_beats_the_bound_at_real_sizes(model, tokens):
    """Realistic expert sizes (hundreds of KiB to MiB per micro-slice, thousands of cycles per
    load): a strategy given a shorter latency than its bytes need would end below the bound
    (A1 did, with one micro-slice's latency for a whole expert).  Every strategy, every
    layer; and the per-cause breakdown adds up to the gap."""
    cfg = _table_i(model, tokens)
    strategies = ("EP", "Hydra", "A1", "A2", "A3", "A4", "A5", "A6")
    run = run_experiment(cfg, strategies, 1, 1, progress=False)
    for s, rs in run["results"].items():
        for r in rs:
            if r.bound == 0:
                continue
            assert r.cycles >= r.bound, (s, r.cycles, r.bound)
            assert abs(sum(r.lost().values()) - (r.cycles - r.bound)) <= 1, (s, r.lost())
    summary = summarize(run)
    for s, m in summary.items():
        assert abs(1 / m["x_bound"] + sum(m["lost"].values()) - 1) < 0.01, (s, m["lost"])


def test_a1_waits_for_the_whole_expert():
    """A1 loads an expert whole: it is usable once every byte has streamed in."""
    from fsedp.sim.fsedp import variant_params

    s = make_setup(default_run())
    a1 = variant_params(s, "A1")
    assert a1.ddr_interval == s.dp.ddr_interval * s.dp.micro_slices
    assert a1.ddr_latency == s.ddr_access_cycles + a1.ddr_interval


def test_breakdown_is_exact_under_event_skipping(monkeypatch):
    """The probes are constant over the cycles fast_forward skips: the idle cycles by cause
    are the same when every cycle is stepped."""
    from fsedp.sw.streaming import StreamingArray

    cfg = tiny(64)
    s = make_setup(cfg)
    layer = iterations(cfg, 1)[0][0]
    fast = fsedp_layer(s, layer.records, "A3", streaming="python")
    monkeypatch.setattr(StreamingArray, "fast_forward", lambda self: 0)
    slow = fsedp_layer(s, layer.records, "A3", streaming="python")
    assert slow.steps > fast.steps and slow.cycles == fast.cycles
    assert slow.idle == fast.idle and fast.idle["ddr"]


def test_every_probed_cause_is_shown():
    """Each reason the golden model's probes can give (but "none", which the simulator
    splits into fill, dispatch, drain or starved) has a place in the breakdown's columns."""
    from fsedp.sim.run import CAUSES
    from fsedp.sw.streaming.probe import DDR_REASONS, PE_REASONS

    shown = set(CAUSES)
    assert set(DDR_REASONS + PE_REASONS) - {"none"} <= shown
    assert {"fill", "dispatch", "drain", "starved"} <= shown


def test_a5_slack_is_a_parameter(tmp_path):
    """A5 at another QoS slack: the slack each request is held to grows with it (the request's
    latency, which the slack multiplies, itself depends on the deferrals), buffering defers
    at least as often, and every request stays within its own slack."""
    cfg = one_request_run(tmp_path, 8)
    qos = {}
    for slack in (0.1, 0.3):
        run = run_experiment(cfg, ["A5"], n_iter=8, progress=False, workers=1, a5_slack=slack)
        qos[slack] = summarize(run)["A5"]["qos"]
        assert qos[slack]["violations"] == 0
    ratio = qos[0.3]["slack_us"]["max"] / qos[0.1]["slack_us"]["max"]
    assert 2 < ratio <= 3.01
    assert qos[0.3]["deferrals"] >= qos[0.1]["deferrals"]


def test_bounds_round_up_exactly():
    """The layer's lower bounds pinned on a case where a division does not come out even:
    5 streamed micro-slices over 4 channels at 3 cycles each is 15 / 4 = 3.75 -> 4 cycles
    (rounding down would claim a bound no schedule can meet); 7 tokens x 5 micro-slices x 3
    cycles over 4 chiplets = 105 / 4 = 26.25 -> 27."""
    from types import SimpleNamespace

    from fsedp.params import DatapathParams
    from fsedp.sim.baselines import bounds

    dp = DatapathParams(rows=2, cols=2, micro_slices=5, ddr_interval=3, cycles_per_token=3)
    setup = SimpleNamespace(chiplets=4, dp=dp)
    counts = np.array([7, 0, 0, 0])
    assert bounds(setup, counts) == (4, 27)
    # one micro-slice loaded ahead: 4 x 3 / 4 = 3 exactly
    assert bounds(setup, counts, ahead=1) == (3, 27)
    # the slice table [D13]: 3 micro-slices -> 9 / 4 -> 3; 7 x 3 x 3 = 63 / 4 -> 16
    assert bounds(setup, counts, slices=np.array([3, 5, 5, 5])) == (3, 16)


def test_link_bound_pinned():
    """The link-aware bound pinned by hand on a 1x3 line (4 directed links of 1 byte per
    cycle) with one expert of one 400-byte micro-slice, one token on each chiplet, 200-byte
    activations and a 30-cycle DDR interval (10 cycles over the 3 channels).  Per ``lam``:
    one chiplet computes (tokens move: 2 x 2 x 200 / 4 = 200 link cycles) -> 200 - 190 lam;
    two chiplets, one load each (one token moves) -> 100 - 80 lam; three chiplets, a load
    each -> 30 lam; a ring over three with one load (200 link cycles) never wins.  All three
    meet at lam = 10 / 11: 27.27 -> 28 cycles, where the DDR bound is 10.  With cheap tokens
    (2-byte activations) moving them wins and the bound is the DDR bound; a micro-slice
    loaded ahead takes 10 lam off: 18.18 -> 19.  Leaving the tokens where they are (FSE-DP)
    only the three-chiplet choices remain: 200 - 190 lam against 30 lam, 28 cycles however
    cheap the tokens."""
    from types import SimpleNamespace

    from fsedp.params import DatapathParams
    from fsedp.sim.baselines import bounds, link_bound

    dp = DatapathParams(rows=1, cols=3, micro_slices=1, ddr_interval=30, cycles_per_token=1)
    setup = SimpleNamespace(
        chiplets=3, dp=dp, act_bytes=200, link_bytes_per_cycle=1.0, microslice_bytes=400
    )
    held = np.array([[1], [1], [1]])
    assert bounds(setup, held.sum(0)) == (10, 1)
    assert link_bound(setup, held) == 28
    assert link_bound(setup, held, ahead=1) == 19
    assert link_bound(setup, held, tokens_move=False) == 28
    setup.act_bytes = 2
    assert link_bound(setup, held) == 10
    assert link_bound(setup, held, tokens_move=False) == 28


def test_stream_bound_binds_on_slow_links():
    """With die-to-die links 36x slower than Table I's (8 GB/s) on a 3x3 mesh, streaming every
    micro-slice to each chiplet holding tokens takes longer over the links than over DDR:
    FSE-DP's stream bound is above its DDR / compute bound, and no FSE-DP layer is below it;
    EP, which moves tokens instead, stays above the any-strategy link bound."""
    raw = copy.deepcopy(TINY)
    raw["hardware"].update(
        name="slow3x3", rows=3, cols=3, ddr_channels=9, d2d_bandwidth_gbps=8, onchip_buffer_kib=48
    )
    run = run_experiment(run_from_dict(raw), ("EP", "A3", "A6"), n_iter=1, progress=False)
    for s, rs in run["results"].items():
        for r in rs:
            assert r.cycles >= r.link_bound >= r.bound > 0
            if s != "EP":
                assert r.cycles >= r.stream_bound > 2 * r.bound, (s, r.stream_bound, r.bound)
