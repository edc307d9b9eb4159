"""The one path config -> trace -> gate records (``fsedp.workload``): the simulator
(``fsedp run``) and the scheduler RTL on the run config (``fsedp rtl rounds``) schedule the
same gate records, and ``scenario.sharding`` places tokens as documented."""

import pytest
from conftest import SHARED_DATA

from fsedp.config import config_to_dict, default_run, run_from_dict
from fsedp.errors import InputError
from fsedp.sim.run import run_experiment
from fsedp.workload import iterations, rounds

TINY_MODEL = {
    "name": "tiny",
    "d_model": 256,
    "d_ffn": 128,
    "experts": 16,
    "top_k": 2,
    "shared_experts": 0,
    "layers": 3,
    "heads": 4,
    "params_b": 0.1,
}


def tiny(**scenario):
    d = config_to_dict(default_run())
    d["model"] = TINY_MODEL
    d["scenario"].update({"tokens_per_iteration": 32, "rounds": 6, **scenario})
    return run_from_dict(d, "<tiny>")


def simulated_records(cfg, n_iter):
    seen = []
    run_experiment(
        cfg,
        ["A3"],
        n_iter=n_iter,
        progress=False,
        workers=1,
        on_layer=lambda s, layer, r: seen.append((layer.records, layer.req_inits)),
    )
    return seen


@pytest.mark.parametrize(
    "scenario",
    [{}, {"sharding": "request"}, {"trace": "model"}, {"trace": "model", "sharding": "request"}],
    ids=["synthetic-token", "synthetic-request", "model-token", "model-request"],
)
def test_run_and_rtl_rounds_schedule_the_same_records(scenario):
    cfg = tiny(**scenario)
    sim = simulated_records(cfg, n_iter=2)
    rtl = rounds(cfg)
    assert len(rtl) == cfg.scenario.rounds == len(sim) == 6
    assert [(r.records, r.req_inits) for r in rtl] == sim
    assert all(r.records for r in rtl)


def test_sharding_places_tokens_as_documented():
    by_token = iterations(tiny(), 1)[0][0]
    by_request = iterations(tiny(sharding="request"), 1)[0][0]
    assert sorted(by_token.records) != sorted(by_request.records)
    # token: every chiplet holds 32 / 4 = 8 tokens of top-2 -> 16 records
    assert list(by_token.token_chiplets(4)) == [16] * 4
    # request: a request's records all sit on one chiplet
    chip_of = {}
    for r, c, _ in by_request.records:
        assert chip_of.setdefault(r, c) == c


def test_requests_are_admitted_in_the_first_layer_of_an_iteration():
    cfg = tiny()
    its = iterations(cfg, 2)
    for it in its:
        slots = sorted({r for r, _, _ in it[0].records})
        assert it[0].req_inits == [(s, cfg.scheduler.t_qos_init) for s in slots]
        assert all(layer.req_inits == [] for layer in it[1:])


def test_a_short_trace_is_an_error_for_the_simulator_not_for_rounds(tmp_path):
    cfg = tiny(trace="model", tokens_per_iteration=512)
    with pytest.raises(InputError) as e:
        iterations(cfg, 10_000)
    assert e.value.field == "scenario.trace" and "10000 requested" in e.value.reason
    assert 0 < len(rounds(cfg, 10_000)) < 10_000


def test_flame_rounds_follow_the_trace():
    flame = SHARED_DATA / "routing" / "flame-moe-290m.npz"
    if not flame.exists():
        pytest.skip(f"{flame} not found: the shared data folder is absent")
    cfg = tiny(trace=str(flame), tokens_per_iteration=64)
    cfg = run_from_dict(
        {**config_to_dict(cfg), "model": {**TINY_MODEL, "experts": 64, "top_k": 6, "layers": 8}},
        "<flame>",
    )
    rs = rounds(cfg, 16)
    assert len(rs) == 16 and all(len(r.records) == 64 * 6 for r in rs)
    assert rs[0].req_inits and not rs[1].req_inits and rs[8].req_inits
