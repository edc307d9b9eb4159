"""The chip top (``hw/chip.py``: scheduler + chiplet array in one control loop) against its
golden model (``tb/tb_chip.py``: golden scheduler with the RTL's handshake timing, streaming
golden model), cycle for cycle, and against the simulator's layers
(:func:`fsedp.sim.fsedp.fsedp_layer`): the same beats, completions and cycles.

Fast tier: Amaranth's simulator, 2x2.  Slow tier: 3x3, FLAME-MoE routing, and the
generated Verilog under Verilator (cocotb)."""

from pathlib import Path

import pytest

from fsedp.hw.chip import Chip, ChipParams
from fsedp.params import DatapathParams, SchedulerParams
from fsedp.tb import tb_chip
from fsedp.tb.bench import run_amaranth

SP4 = SchedulerParams(
    chiplets=4, experts=8, count_width=4, requests=4, theta_min=2, n_threshold=2, qos_width=2
)
FLAME = Path(__file__).resolve().parents[2] / "shared" / "data" / "routing" / "flame-moe-290m.npz"
#: FLAME layers the chip runs in the slow tier: the bench checks every cycle in Python
#: (about 360 cycles/s for the 2x2 chip under Verilator), and the first two layers take
#: 263 000 cycles on 2x2 and 122 000 on 3x3 (all eight: 1.37 and 0.63 million)
FLAME_LAYERS = 2


def run(p: ChipParams, **knobs) -> dict:
    res = run_amaranth(Chip(p), tb_chip.bench, p, knobs)
    assert res["mismatches"] == 0, res["first_mismatches"]
    return res


def test_params_checked_eagerly():
    sp = SchedulerParams(chiplets=4, experts=8)
    with pytest.raises(ValueError, match="count_width: the scheduler's 8 != the datapath's 6"):
        ChipParams(sp, DatapathParams(experts=8))
    with pytest.raises(TypeError, match="p must be ChipParams, not 3"):
        Chip(3)
    with pytest.raises(ValueError, match="ring_orders 2"):
        import dataclasses

        Chip(ChipParams.for_scheduler(dataclasses.replace(sp, ring_orders=2), 2, 2))


def test_golden_timing_is_the_rtls():
    """``sw/scheduler_timing.py``'s front latency is the scheduler RTL's ``latency``, for the
    sorter networks of a few sizes (one source of the back half's cycle counts)."""
    import dataclasses

    from fsedp.hw.scheduler import Scheduler as SchedulerRTL
    from fsedp.sw.scheduler_timing import front_latency

    for experts in (8, 16, 64):
        sp = dataclasses.replace(SP4, experts=experts)
        rtl = SchedulerRTL(sp)
        rtl._MustUse__silence = True  # built for its latency figure only, never elaborated
        assert rtl.latency == front_latency(sp)


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(ddr_channels=4, preempt=True, hot_window=2, cycles_per_token=2, ddr_interval=3),
    ],
    ids=["default", "ch4-a6"],
)
def test_chip_2x2_random_layers_with_stalls_and_reset(kw):
    """Random rounds (with token buffering: deferred requests), link/DDR stalls, gaps in the
    gate stream, a reset in the middle of every third layer."""
    p = ChipParams.for_scheduler(SP4, 2, 2, **kw)
    # a reset drawn after its layer has ended is not made: a seed whose two draws fall
    # inside their layers under both parameter sets (seed 5 lost one to a short layer when
    # the DDR rules changed, [D18]/[D19])
    res = run(p, layers=6, seed=6, stall=0.2, gap=0.2, reset_every=3)
    assert res["layers"] + res["resets"] == 6 and res["resets"] == 2
    assert res["beats"] > 0


def test_chip_bench_stops_at_its_limit():
    """``limit`` ends the run at that cycle, every cycle before it checked, and the verdict
    accepts the unfinished layer (the window a gate-level recording takes); without it the
    same run finishes its layers."""
    p = ChipParams.for_scheduler(SP4, 2, 2)
    res = run(p, layers=3, seed=5, limit=60)
    assert res["limited"] and res["cycles"] == 60 and res["layers"] < 3
    assert not run(p, layers=1, seed=5).get("limited")


def test_chip_2x2_balanced_entry_dispatch():
    """The A6 scheduler generics (balanced order, entry dispatch) on a random layer."""
    import dataclasses

    sp = dataclasses.replace(SP4, balance=3, entry_dispatch=True, mesh_cols=2)
    p = ChipParams.for_scheduler(sp, 2, 2, preempt=True, hot_window=2, cycles_per_token=2)
    res = run(p, layers=3, seed=9, stall=0.1)
    assert res["layers"] == 3 and res["beats"] > 0


def tiny_setup(rows: int = 2, cols: int = 2):
    """The simulator's chip with the embedded trace of our tiny MoE LM (as
    ``tests/test_datapath_rtl.py::test_simulator_layer_replays_on_rtl``)."""
    from fsedp.config import SYNTHETIC_ONLY, config_to_dict, default_run, run_from_dict
    from fsedp.sim.setup import make_setup

    d = config_to_dict(default_run())
    d["model"] = dict(
        name="tiny", d_model=128, d_ffn=128, experts=16, top_k=2, shared_experts=0,
        layers=4, heads=4, params_b=0.1,
    )  # fmt: skip
    d["hardware"].update(rows=rows, cols=cols, ddr_channels=rows * cols)
    d["hardware"]["onchip_buffer_kib"] = 48 if rows * cols == 4 else 96
    del d["scheduler"]["count_width"]
    d["scenario"].update(tokens_per_iteration=32, trace="model")
    for key in SYNTHETIC_ONLY:  # the synthetic generator's keys do not apply to a trace
        del d["scenario"][key]
    return make_setup(run_from_dict(d, "<chip>"))


def simulator_layers(setup, variant: str, layers) -> tuple[ChipParams, list, list]:
    """The chip's generics of ``variant`` and, per layer, its rounds entry and the
    simulator's result (beats, completion masks, cycles)."""
    from fsedp.sim.fsedp import fsedp_layer, make_scheduler, variant_params

    dp = variant_params(setup, variant)
    sp = make_scheduler(setup.sp, dp, variant).p
    rounds, expected = [], []
    for layer in layers:
        res = fsedp_layer(setup, layer.records, variant, streaming="python")
        if res.cycles == 0:
            continue
        rounds.append({"records": [list(r) for r in layer.records]})
        expected.append({"cycles": res.cycles, "beats": res.beats, "script": res.script})
    return ChipParams(sp, dp), rounds, expected


def check_simulator(p, rounds, expected, exact=True):
    res = run(p, rounds=rounds, expected=expected, max_layer_cycles=200_000)
    assert res["layers"] == len(rounds)
    if exact:
        assert not res["sim_mismatches"], res["sim_mismatches"][:2]
    return res


@pytest.mark.parametrize("variant", ["A3", pytest.param("A6", marks=pytest.mark.slow)])
def test_chip_replays_simulator_layer_2x2(variant):
    """One layer of the embedded routing on the simulator's 2x2 chip: the chip gives the
    same beats, completions and ``end - first beat`` as ``fsedp_layer``."""
    from fsedp.workload import iterations

    setup = tiny_setup()
    p, rounds, expected = simulator_layers(setup, variant, iterations(setup.cfg, 1, 1)[0])
    check_simulator(p, rounds, expected)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["A3", "A6"])
def test_chip_replays_simulator_layers_3x3(variant):
    """Two layers of the embedded routing on a 3x3 chip: the simulator follows the scheduler
    RTL's timing (``fsedp.sw.scheduler_timing``), so beats, completion order and ``end -
    first beat`` are the chip's exactly."""
    from fsedp.workload import iterations

    setup = tiny_setup(3, 3)
    p, rounds, expected = simulator_layers(setup, variant, iterations(setup.cfg, 1, 2)[0])
    check_simulator(p, rounds, expected)


def verilator_missing():
    from fsedp.tb.runner import simulator_missing

    return simulator_missing("verilator")


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["A3", "A6"])
@pytest.mark.parametrize("mesh", [(2, 2), (3, 3)], ids=["2x2", "3x3"])
def test_chip_verilator_flame(tmp_path, variant, mesh):
    """FLAME-MoE-290M routing (``../shared/data``) through the generated Verilog under
    Verilator, the first :data:`FLAME_LAYERS` layers: every cycle equals the golden model,
    every layer the simulator."""
    why = verilator_missing()
    if why:
        pytest.skip(why)
    if not FLAME.exists():
        pytest.skip(f"{FLAME} not found: the shared data folder is absent")
    import json

    from fsedp.tb.runner import run_tb
    from fsedp.workload import iterations

    setup = flame_setup(*mesh)
    layers = iterations(setup.cfg, 1)[0][:FLAME_LAYERS]
    p, rounds, expected = simulator_layers(setup, variant, layers)
    path = tmp_path / "rounds.json"
    path.write_text(json.dumps(rounds))
    # the bench's default limit (a million cycles) is below what the layers take on 2x2
    total = sum(e["cycles"] for e in expected)
    res = run_tb(
        "chip",
        p,
        "verilator",
        tmp_path / "build",
        knobs={
            "rounds_file": str(path),
            "expected": expected,
            "max_layer_cycles": 400_000,
            "limit": 2 * total + 10_000,
        },
        tag=f"-{variant}",
    )
    assert res.get("failed") == 0 and res["mismatches"] == 0, res.get("failure", res)
    assert res["layers"] == len(rounds) and not res["sim_mismatches"]


def flame_setup(rows: int, cols: int):
    """FLAME-MoE-290M (64 experts, top-6) routing on a ``rows x cols`` chip, 32 tokens per
    iteration, all 8 MoE layers."""
    from fsedp.config import SYNTHETIC_ONLY, config_to_dict, default_run, run_from_dict
    from fsedp.sim.setup import make_setup

    d = config_to_dict(default_run())
    d["model"] = dict(
        name="flame-moe-290m", d_model=512, d_ffn=256, experts=64, top_k=6, shared_experts=0,
        layers=8, heads=8, params_b=0.29,
    )  # fmt: skip
    d["hardware"].update(rows=rows, cols=cols, ddr_channels=rows * cols)
    d["scenario"].update(tokens_per_iteration=32, rounds=1, trace=str(FLAME))
    for key in SYNTHETIC_ONLY:
        del d["scenario"][key]
    return make_setup(run_from_dict(d, "<flame-chip>"))


@pytest.mark.slow
def test_chip_verilator_random_with_stalls_and_resets(tmp_path):
    """A long random regression on the Verilog: stalls, gate gaps, resets."""
    why = verilator_missing()
    if why:
        pytest.skip(why)
    from fsedp.tb.runner import run_tb

    p = ChipParams.for_scheduler(SP4, 2, 2, ddr_channels=4, preempt=True, hot_window=2)
    knobs = dict(layers=60, seed=2, stall=0.2, gap=0.2, reset_every=7)
    res = run_tb("chip", p, "verilator", tmp_path, knobs=knobs)
    assert res.get("failed") == 0 and res["mismatches"] == 0, res.get("failure", res)
    assert res["layers"] + res["resets"] == 60 and res["resets"] > 0
