"""Second tier: cocotb testbenches on the generated Verilog, on Verilator and Icarus.

One build folder per (block, simulator, parameters) under ``build/cocotb``.
"""

from pathlib import Path

import pytest

from runner import SIMULATORS, run_tb, simulator_missing  # noqa: E402
from fsedp.sw.params import SchedulerParams

BUILD = Path(__file__).resolve().parents[1] / "build" / "cocotb"


def run(block, p, sim, knobs=None, seed=1):
    why = simulator_missing(sim)
    if why:
        pytest.skip(why)
    res = run_tb(block, p, sim, BUILD, knobs=knobs, seed=seed)
    assert res["tests"] > 0 and res["failed"] == 0, f"{block} on {sim} failed; see {res['log']}"
    return res


SMALL = SchedulerParams(chiplets=4, experts=8, count_width=6, requests=4, theta_min=3,
                        n_threshold=2, qos_width=2)
ODD = SchedulerParams(chiplets=5, experts=12, count_width=3, requests=3, theta_min=2,
                      n_threshold=3, qos_width=3)


@pytest.mark.parametrize("sim", SIMULATORS)
@pytest.mark.parametrize("p", [SMALL, ODD], ids=["4c8e", "5c12e-w3"])
def test_scheduler(sim, p):
    res = run("scheduler", p, sim, knobs={"rounds": 20, "seed": 7, "reset_every": 6,
                                          "bad_records": 0.02 if p is ODD else 0})
    assert res["mismatches"] == 0 and res["beats"] > 0 and res["resets"] >= 2


FLAME = Path(__file__).resolve().parents[2] / "shared" / "data" / "routing" / "flame-moe-290m.npz"


def flame_rounds(tmp_path, p, windows, tokens=64):
    """Trace-driven stimulus: FLAME-MoE-290M routing, 64 tokens per iteration, all 8 MoE
    layers of each window as consecutive rounds, sequences as requests."""
    import json

    from fsedp.trace import dense_request_slots, gate_records, iteration_windows, load_flame, shard

    if not FLAME.exists():
        pytest.skip(f"{FLAME} not found: the shared data folder is absent")
    trace = load_flame(FLAME)
    rounds = []
    for i, w in enumerate(iteration_windows(trace, tokens)):
        if i == windows:
            break
        chip = shard(w, p.chiplets, mode="token")
        slots = dense_request_slots(w, p.requests)
        for layer in range(w.layers):
            rounds.append({"records": gate_records(w, layer, chip, slots, table_depth=p.requests),
                           "req_inits": [[s, 1] for s in sorted(set(slots.values()))] if layer == 0 else []})
    path = tmp_path / "flame-rounds.json"
    path.write_text(json.dumps(rounds))
    return path, len(rounds)


FLAME_P = SchedulerParams(chiplets=4, experts=64, count_width=8, requests=8, theta_min=2,
                          n_threshold=3, qos_width=3)


@pytest.mark.parametrize("sim", ["verilator", pytest.param("icarus", marks=pytest.mark.slow)])
def test_scheduler_flame_trace(sim, tmp_path):
    path, n = flame_rounds(tmp_path, FLAME_P, windows=2)
    res = run("scheduler", FLAME_P, sim, knobs={"rounds_file": str(path), "stall": 0.2, "seed": 3})
    assert res["mismatches"] == 0 and res["rounds"] == n and res["beats"] > n


@pytest.mark.slow
@pytest.mark.parametrize("experts,chiplets", [(128, 4), (64, 16), (256, 16)])
def test_scheduler_large(experts, chiplets):
    p = SchedulerParams(chiplets=chiplets, experts=experts, count_width=10, requests=8,
                        theta_min=2, n_threshold=4, qos_width=4)
    res = run("scheduler", p, "verilator", knobs={"rounds": 40, "seed": 11, "reset_every": 10,
                                                  "tokens": 64, "top_k": 8})
    assert res["mismatches"] == 0 and res["rounds"] + res["resets"] == 40
