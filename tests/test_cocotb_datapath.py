"""cocotb testbench of the chiplet array on Verilator and Icarus: lockstep against the
streaming golden model plus the conservation / occupancy / progress scoreboard."""

import dataclasses

import pytest
from test_cocotb import run

from fsedp.params import DatapathParams, SchedulerParams

SP4 = SchedulerParams(
    chiplets=4, experts=8, count_width=4, requests=4, theta_min=2, n_threshold=2, qos_width=2
)
ARRAY_2X2 = DatapathParams.for_scheduler(
    SP4,
    2,
    2,
    slots=5,
    micro_slices=3,
    link_cycles=2,
    ddr_interval=2,
    ddr_latency=6,
    preload_entries=2,
)


def knobs(sp, **kw):
    return {
        "sched": dataclasses.asdict(sp),
        "seed": 3,
        "stall": 0.25,
        "gap": 0.2,
        "done_stall": 0.2,
        **kw,
    }


@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_array_2x2(sim):
    res = run(
        "chiplet_array",
        ARRAY_2X2,
        sim,
        knobs=knobs(SP4, layers=12 if sim == "icarus" else 40, reset_every=5),
    )
    assert res["mismatches"] == 0 and not res["violations"] and res["deadlocks"] == 0
    assert res["resets"] >= 2 and res["computed"] > 0
    assert max(res["peak_rtl"]) <= ARRAY_2X2.slots


def test_array_2x2_ddr_per_chiplet():
    """[D10] A DDR channel per chiplet: chiplet-driven Rule 4 loads, local and remote
    (micro-slices loaded outside their expert's trajectory), under stalls and resets."""
    p = dataclasses.replace(ARRAY_2X2, ddr_channels=4, slots=6, micro_slices=6, ddr_interval=3)
    res = run("chiplet_array", p, "verilator", knobs=knobs(SP4, layers=30, reset_every=5))
    assert res["mismatches"] == 0 and not res["violations"] and res["deadlocks"] == 0
    assert res["resets"] >= 2 and res["computed"] > 0 and res["remote_loads"] > 0


def test_array_2x2_a6_rules_in_rtl():
    """A6's rules in the RTL: experts at once in the balanced order (scheduler generics,
    driven by the golden scheduler here), the hot-expert window of the DDR controller and
    compute preemption in the ring buffers, under stalls and resets, cycle for cycle
    against the golden model."""
    sp = dataclasses.replace(SP4, balance=3, entry_dispatch=True)
    p = dataclasses.replace(ARRAY_2X2, hot_window=1, preempt=True, cycles_per_token=3)
    res = run("chiplet_array", p, "verilator", knobs=knobs(sp, layers=30, reset_every=7))
    assert res["mismatches"] == 0 and not res["violations"] and res["deadlocks"] == 0
    assert res["computed"] > 0 and max(res["peak_rtl"]) <= p.slots


@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_array_2x2_slice_table(sim):
    """[D13] A micro-slice count per expert and layer (sub-expert streaming), random
    1..M with rejected out-of-range writes, under stalls and resets (which return the
    table to M), cycle for cycle against the golden model; Rule 5 and pre-loads on."""
    p = dataclasses.replace(ARRAY_2X2, slice_table=True, micro_slices=5, rule5=True)
    layers = 12 if sim == "icarus" else 30
    res = run("chiplet_array", p, sim, knobs=knobs(SP4, layers=layers, reset_every=4))
    assert res["mismatches"] == 0 and not res["violations"] and res["deadlocks"] == 0
    assert res["resets"] >= 2 and res["computed"] > 0


def test_array_2x2_flame_trace(tmp_path):
    """Layers of real routing (FLAME-MoE-290M, 64 experts, top-6) through the 2x2 array."""
    from test_cocotb import flame_config, flame_rounds

    cfg = flame_config(tokens=16, rounds=8, n_threshold=2, qos_width=2)
    sp = cfg.scheduler_params()
    p = DatapathParams.for_scheduler(
        sp, 2, 2, slots=5, micro_slices=2, link_cycles=1, ddr_interval=1, ddr_latency=4
    )
    path, n = flame_rounds(tmp_path, cfg)
    res = run("chiplet_array", p, "verilator", knobs=knobs(sp, rounds_file=str(path)))
    assert res["mismatches"] == 0 and not res["violations"] and res["layers"] == n


@pytest.mark.slow
@pytest.mark.parametrize("rows,cols,slots,channels", [(3, 3, 12, 1), (4, 4, 18, 1), (3, 3, 12, 9)])
def test_array_large(rows, cols, slots, channels):
    sp = SchedulerParams(
        chiplets=rows * cols,
        experts=16,
        count_width=4,
        requests=4,
        theta_min=2,
        n_threshold=2,
        qos_width=2,
    )
    p = DatapathParams.for_scheduler(
        sp,
        rows,
        cols,
        slots=slots,
        micro_slices=3,
        link_cycles=2,
        ddr_interval=1,
        ddr_latency=6,
        preload_entries=2,
        ddr_channels=channels,
    )
    res = run("chiplet_array", p, "verilator", knobs=knobs(sp, layers=10, reset_every=4))
    assert res["mismatches"] == 0 and not res["violations"] and res["deadlocks"] == 0


def test_rtl_datapath_cli_ddr_per_chiplet(tmp_path, capsys):
    """``fsedp rtl datapath --ddr-per-chiplet``: the cosimulation runs a channel per chiplet
    and reports its remote loads; the command it records reproduces the run."""
    import json

    from fsedp.cli import main

    out = tmp_path / "d.md"
    args = ["rtl", "datapath", "--no-ring", "--no-cells", "--mesh", "2x2:6", "--ddr-per-chiplet"]
    rc = main([*args, "--stall", "0.1", "--out", str(out), "--json"])
    doc = json.loads(capsys.readouterr().out)
    run = doc["runs"][0]
    assert rc == 0 and run["mismatches"] == 0 and run["params"]["ddr_channels"] == 4
    assert run["remote_loads"] > 0 and run["command"].endswith("--ddr-per-chiplet")
    assert "DDR channels: 4, remote loads:" in out.read_text()
