"""The one path config -> trace -> gate records (``fsedp.workload``): the simulator
(``fsedp run``) and the scheduler RTL on the run config (``fsedp rtl rounds``) schedule the
same gate records, and ``scenario.sharding`` places tokens as documented."""

import pytest
from conftest import SHARED_DATA

from fsedp.config import SYNTHETIC_ONLY, config_to_dict, default_run, run_from_dict
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
    "layers": 4,
    "heads": 4,
    "params_b": 0.1,
}


def tiny(requests=8, **scenario):
    d = config_to_dict(default_run())
    d["scheduler"]["requests"] = requests
    d["model"] = TINY_MODEL
    del d["scheduler"]["count_width"]  # derived from the tokens
    d["scenario"].update({"tokens_per_iteration": 32, "rounds": 8, **scenario})
    if d["scenario"]["trace"] != "synthetic":  # the synthetic generator's keys do not apply
        for key in SYNTHETIC_ONLY:
            d["scenario"].pop(key, None)
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
    assert len(rtl) == cfg.scenario.rounds == len(sim) == 8
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


def test_a_trace_must_match_the_model(tmp_path):
    """Another model's routing is refused on one line, not simulated silently."""
    for field, value in (("top_k", 3), ("layers", 5)):
        cfg = run_from_dict(
            {**config_to_dict(tiny(trace="model")), "model": {**TINY_MODEL, field: value}}, "<m>"
        )
        with pytest.raises(InputError) as e:
            iterations(cfg, 1)
        assert e.value.field == "scenario.trace" and f"{field} = " in e.value.reason


def test_only_whole_iterations_are_simulated():
    """A short last window is left out; a trace shorter than one iteration is an error."""
    cfg = tiny(16, trace="model", tokens_per_iteration=1000)  # 8192 tokens
    its = iterations(cfg, 8)
    assert {l.tokens for it in its for l in it} == {1000}
    with pytest.raises(InputError, match="8 iterations"):
        iterations(cfg, 9)
    with pytest.raises(InputError) as e:
        iterations(tiny(trace="model", tokens_per_iteration=9000), 1)
    assert e.value.field == "scenario.tokens_per_iteration"
