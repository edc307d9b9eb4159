"""Second tier: cocotb testbenches on the generated Verilog, on Verilator and Icarus.

One build folder per (block, simulator, parameters) under ``build/cocotb``.
"""

import os
from pathlib import Path

import pytest

from fsedp.params import SchedulerParams
from fsedp.tb.runner import SIMULATORS, run_tb, simulator_missing  # noqa: E402

BUILD = Path(__file__).resolve().parents[1] / "build" / "cocotb"


def run(block, p, sim, knobs=None, seed=1):
    """Run a testbench; ``FSEDP_WAVES=1`` records every signal.  A failing run is run again
    with waves on (same seed, same knobs) and the failure names the waveform."""
    why = simulator_missing(sim)
    if why:
        pytest.skip(why)
    waves = bool(os.environ.get("FSEDP_WAVES"))
    res = run_tb(block, p, sim, BUILD, knobs=knobs, seed=seed, waves=waves)
    if not (res["tests"] > 0 and res["failed"] == 0):
        if not waves:
            res = run_tb(block, p, sim, BUILD, knobs=knobs, seed=seed, waves=True)
        pytest.fail(f"{block} on {sim} failed; see {res['log']}; waveform {res.get('waves')}")
    return res


SMALL = SchedulerParams(
    chiplets=4, experts=8, count_width=6, requests=4, theta_min=3, n_threshold=2, qos_width=2
)
ODD = SchedulerParams(
    chiplets=5, experts=12, count_width=3, requests=3, theta_min=2, n_threshold=3, qos_width=3
)
#: A6's scheduler generics: the balanced order and experts at once (decisions 27-28)
A6 = SchedulerParams(
    chiplets=4,
    experts=8,
    count_width=6,
    requests=4,
    theta_min=3,
    n_threshold=2,
    qos_width=2,
    balance=3,
    entry_dispatch=True,
)


@pytest.mark.parametrize("sim", SIMULATORS)
@pytest.mark.parametrize("p", [SMALL, ODD, A6], ids=["4c8e", "5c12e-w3", "4c8e-a6"])
def test_scheduler(sim, p):
    """The scheduler bench (``tb/tb_scheduler.py``, the body of the Amaranth tier's
    ``tests/test_block_benches.py::test_scheduler``) on the generated Verilog: every beat and
    round == golden model, mid-round resets, every first dispatch at its documented latency."""
    res = run(
        "scheduler",
        p,
        sim,
        knobs={
            "rounds": 20,
            "seed": 7,
            "reset_every": 6,
            "bad_records": 0.02 if p is ODD else 0,
            "exact_latency": True,
        },
    )
    assert res["mismatches"] == 0 and res["beats"] > 0 and res["resets"] >= 2
    assert res["rounds"] + res["resets"] == 20 and res["dispatch_stalled"] > 0, res
    assert res["latency_checked"] == len(res["latency_first_dispatch"]) > 0, res


FLAME = Path(__file__).resolve().parents[2] / "shared" / "data" / "routing" / "flame-moe-290m.npz"


def flame_config(tokens=64, rounds=16, **scheduler):
    """FLAME-MoE-290M routing as a run config: 64 tokens per iteration, all 8 MoE layers of
    each window as consecutive rounds, sequences as requests (``fsedp.workload``)."""
    from fsedp.config import SYNTHETIC_ONLY, config_to_dict, default_run, run_from_dict

    if not FLAME.exists():
        pytest.skip(f"{FLAME} not found: the shared data folder is absent")
    d = config_to_dict(default_run())
    d["model"] = {
        "name": "flame-moe-290m",
        "d_model": 512,
        "d_ffn": 256,
        "experts": 64,
        "top_k": 6,
        "shared_experts": 0,
        "layers": 8,
        "heads": 8,
        "params_b": 0.29,
    }
    d["scheduler"] = {
        "count_width": 8,
        "requests": 8,
        "theta_min": 2,
        "n_threshold": 3,
        "qos_width": 3,
        "t_qos_init": 1,
        **scheduler,
    }
    d["scenario"].update({"tokens_per_iteration": tokens, "rounds": rounds, "trace": str(FLAME)})
    for key in SYNTHETIC_ONLY:  # the synthetic generator's keys do not apply to a trace
        del d["scenario"][key]
    return run_from_dict(d, "<flame>")


def flame_rounds(tmp_path, cfg=None):
    import json

    from fsedp.workload import rounds

    rs = rounds(cfg or flame_config())
    path = tmp_path / "flame-rounds.json"
    path.write_text(json.dumps([{"records": r.records, "req_inits": r.req_inits} for r in rs]))
    return path, len(rs)


@pytest.mark.parametrize("sim", ["verilator", pytest.param("icarus", marks=pytest.mark.slow)])
def test_scheduler_flame_trace(sim, tmp_path):
    path, n = flame_rounds(tmp_path)
    p = flame_config().scheduler_params()
    res = run("scheduler", p, sim, knobs={"rounds_file": str(path), "stall": 0.2, "seed": 3})
    assert res["mismatches"] == 0 and res["rounds"] == n and res["beats"] > n


@pytest.mark.slow
@pytest.mark.parametrize("experts,chiplets", [(128, 4), (64, 16), (256, 16)])
def test_scheduler_large(experts, chiplets):
    p = SchedulerParams(
        chiplets=chiplets,
        experts=experts,
        count_width=10,
        requests=8,
        theta_min=2,
        n_threshold=4,
        qos_width=4,
    )
    res = run(
        "scheduler",
        p,
        "verilator",
        knobs={"rounds": 40, "seed": 11, "reset_every": 10, "tokens": 64, "top_k": 8},
    )
    assert res["mismatches"] == 0 and res["rounds"] + res["resets"] == 40
