"""Tests of fsedp.config: every shipped config loads, every malformed one fails on one line."""

import builtins
import copy
import io
import json
import math
import pathlib
import pickle
from pathlib import Path

import pytest
import yaml

from fsedp import config
from fsedp.config import (
    CONFIG_DIR,
    MAX_TOKENS_PER_ITERATION,
    SYNTHETIC_ONLY,
    HardwareConfig,
    InputError,
    ModelConfig,
    RunConfig,
    ScenarioConfig,
    SchedulerConfig,
    config_to_dict,
    default_run,
    derived_count_width,
    derived_microslices,
    load_hardware,
    load_model,
    load_run,
    load_scheduler,
    run_from_dict,
    smallest_buffer_kib,
    smallest_microslices,
)
from fsedp.files import read_yaml
from fsedp.params import SchedulerParams, max_hops
from fsedp.sw.policies.device import load_device

BAD_DIR = CONFIG_DIR / "bad"


def _load_experiment(path):
    from fsedp.sim.sweep import load_experiment, load_grid

    kind = yaml.safe_load(Path(path).read_text()).get("experiment")
    if kind is None:  # a run config (Figures 11 and 13: the main job's plots)
        return load_run(path)
    return load_grid(path) if kind == "grid" else load_experiment(path)


LOADERS = {
    "hardware": load_hardware,
    "models": load_model,
    "scheduler": load_scheduler,
    "experiments": _load_experiment,
    "devices": lambda path: load_device(str(path)),
}


def good_files():
    files = []
    for p in sorted(CONFIG_DIR.rglob("*.yaml")):
        rel = p.relative_to(CONFIG_DIR)
        if rel.parts[0] == "bad":
            continue
        files.append(p)
    return files


def bad_files():
    return sorted(BAD_DIR.glob("*.yaml"))


def expected_field(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path} must start with '# expect: FIELD'"
    return first.removeprefix("# expect: ").strip()


def test_config_dir_is_the_repo_folder():
    """The named configs are the repository's ``configs/`` (installed as ``fsedp.configs``:
    the same files, wherever the package is laid out)."""
    repo = Path(__file__).resolve().parents[1] / "configs"

    def names(d):
        return sorted(str(q.relative_to(d)) for q in d.rglob("*.yaml"))

    assert names(CONFIG_DIR) == names(repo)
    assert len(good_files()) >= 14
    assert len(bad_files()) >= 5


@pytest.mark.parametrize("path", good_files(), ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_every_config_loads(path):
    rel = path.relative_to(CONFIG_DIR)
    if len(rel.parts) == 1:
        run = load_run(path)
        assert isinstance(run, RunConfig)
        assert run.source == str(path)
        p = run.scheduler_params()
        assert p.chiplets == run.hardware.rows * run.hardware.cols
        assert 2**p.count_width - 1 >= run.scenario.tokens_per_iteration
    else:
        cfg = LOADERS[rel.parts[0]](path)
        if hasattr(cfg, "name"):
            assert cfg.name == path.stem


@pytest.mark.parametrize("path", bad_files(), ids=lambda p: p.name)
def test_bad_config_fails_on_one_line(path):
    field = expected_field(path)
    with pytest.raises(InputError) as ei:
        load_run(path)
    e = ei.value
    msg = str(e)
    assert "\n" not in msg
    assert e.file == str(path)
    assert e.field == field
    assert msg == f"{path}: {field}: {e.reason}"
    assert path.name in msg


def test_bad_config_reasons():
    def reason(name):
        with pytest.raises(InputError) as ei:
            load_run(BAD_DIR / name)
        return ei.value.reason

    assert "tokens_per_iteration" in reason("unknown-key.yaml")  # lists allowed keys
    assert "line 6" in reason("syntax-error.yaml")
    assert "qwen3-30b-a3b" in reason("unknown-model.yaml")  # lists known names
    assert "63" in reason("width-too-small.yaml")
    assert "4..64" in reason("too-few-chiplets.yaml")
    assert "replays trace: routing.npz" in reason("synthetic-key-with-trace.yaml")
    assert reason("buffer-too-small.yaml").endswith("hardware.onchip_buffer_kib >= 12096 would fit")


def test_table_i_values():
    hw = load_hardware(CONFIG_DIR / "hardware/chip2x2.yaml")
    assert (hw.rows, hw.cols, hw.chiplets) == (2, 2, 4)
    assert hw.clock_mhz == 800 and hw.macs_per_chiplet == 2048
    assert hw.d2d_bandwidth_gbps == 288 and hw.d2d_latency_ns == pytest.approx(4.02)
    assert hw.ddr_channels == 4 and hw.ddr_bandwidth_gbps_per_channel == pytest.approx(25.6)
    table = {  # name: d_model, d_ffn, experts, top_k, shared, heads, params_b
        "phi-3.5-moe": (4096, 3200, 16, 2, 0, 32, 41.9),
        "yuan2.0-m32": (2048, 4096, 32, 2, 0, 16, 40),
        "deepseek-moe-16b": (2048, 1408, 64, 6, 2, 16, 16.4),
        "qwen3-30b-a3b": (2048, 768, 128, 8, 0, 32, 30),
    }
    for name, want in table.items():
        m = load_model(CONFIG_DIR / f"models/{name}.yaml")
        assert (m.d_model, m.d_ffn, m.experts, m.top_k, m.shared_experts, m.heads) == want[:6]
        assert m.params_b == pytest.approx(want[6])


def test_default_run_needs_no_file(monkeypatch, tmp_path):
    def no_files(*a, **k):
        raise AssertionError("default_run() must not open files")

    monkeypatch.setattr(builtins, "open", no_files)
    monkeypatch.setattr(io, "open", no_files)
    monkeypatch.setattr(pathlib.Path, "open", no_files)
    monkeypatch.setattr(config, "CONFIG_DIR", tmp_path / "absent")
    run = default_run()
    assert run.source == "<default>"
    assert run.hardware.chiplets == 4 and run.model.experts == 128 and run.model.top_k == 8
    s = run.scenario
    assert (s.tokens_per_iteration, s.rounds, s.seed, s.trace) == (64, 4, 1, "synthetic")
    assert (s.skew, s.prefill_fraction) == (1.1, 0.5)
    assert run.scheduler.t_qos_init == 0


def test_default_run_matches_file_and_params():
    run = default_run()
    assert load_run(CONFIG_DIR / "run-2x2-qwen3.yaml") == run
    assert run.scheduler_params() == SchedulerParams(
        chiplets=4, experts=128, count_width=7, requests=8, theta_min=2, n_threshold=4, qos_width=4
    )
    assert run.trace_path() is None


@pytest.mark.parametrize(
    "tokens, width", [(1, 4), (15, 4), (16, 5), (64, 7), (1023, 10), (1024, 11), (65535, 16)]
)
def test_count_width_is_derived_from_the_tokens(tokens, width):
    d = config_to_dict(default_run())
    del d["scheduler"]["count_width"]
    d["scenario"]["tokens_per_iteration"] = tokens
    run = run_from_dict(d)
    assert run.scheduler.count_width == width == derived_count_width(tokens)
    assert run.scheduler_params().count_max >= tokens
    # a width the user sets too small is still refused, on one line naming the field
    if tokens < 2:
        return
    d["scheduler"]["count_width"] = tokens.bit_length() - 1
    e = pytest.raises(InputError, run_from_dict, d, "<w>").value
    assert e.field == "scheduler.count_width" and "too small" in e.reason


@pytest.mark.parametrize("width", [None, 16])
def test_tokens_beyond_the_widest_count_name_the_tokens(width):
    """The widest EIT count (16 bits) holds 65535 tokens: one more is refused at the field
    the user wrote, scenario.tokens_per_iteration, whether count_width is derived or set
    (it was refused as ``scheduler.count_width: must be in 1..16 bits, not 17``)."""
    d = config_to_dict(default_run())
    d["scheduler"]["count_width"] = width
    if width is None:
        del d["scheduler"]["count_width"]
    d["scenario"]["tokens_per_iteration"] = MAX_TOKENS_PER_ITERATION + 1
    e = pytest.raises(InputError, run_from_dict, d, "<w>").value
    assert MAX_TOKENS_PER_ITERATION == 2**16 - 1
    assert (e.field, e.reason) == (
        "scenario.tokens_per_iteration",
        "must be in 1..65535, not 65536",
    )


def test_a_config_path_that_is_not_a_regular_file_says_what_it_is(tmp_path, capsys):
    """A FIFO, a folder or a missing file given where a config file goes: each its own
    reason, without opening the FIFO (it would block)."""
    import os

    from fsedp.cli import main
    from fsedp.config import config_path

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    (tmp_path / "d.yaml").mkdir()
    for name, reason in (
        ("f.yaml", "f.yaml is a FIFO (named pipe), not a regular file"),
        ("d.yaml", "d.yaml is a folder, not a regular file"),
        ("none.yaml", "no config file"),
    ):
        e = pytest.raises(InputError, config_path, "hardware", name, str(tmp_path / "run.yaml"))
        assert e.value.field == "hardware" and reason in e.value.reason
    assert main(["offload", "--trace", "model", "--device", str(fifo)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"fsedp: <command line>: --device: {fifo} is a FIFO (named pipe), not a regular file"
    )


def test_input_error_survives_a_worker_process():
    e = pickle.loads(pickle.dumps(InputError("f.yaml", "model.top_k", "too big")))
    assert (e.file, e.field, e.reason) == ("f.yaml", "model.top_k", "too big")


def test_config_to_dict_round_trips():
    run = load_run(CONFIG_DIR / "run-4x4-deepseek.yaml")
    d = config_to_dict(run)
    assert set(d) == {"hardware", "model", "scheduler", "scenario"}
    json.dumps(d)
    assert run_from_dict(json.loads(json.dumps(d))) == run
    assert run_from_dict(yaml.safe_load(yaml.safe_dump(d))) == run
    assert config_to_dict(run.model)["experts"] == 64


def write(tmp_path, text, name="run.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def run_dict(**sections):
    d = config_to_dict(default_run())
    d.update(sections)
    return d


def error_of(data, source="x.yaml"):
    with pytest.raises(InputError) as ei:
        run_from_dict(data, source)
    assert "\n" not in str(ei.value)
    return ei.value


def test_types_and_ranges():
    d = config_to_dict(default_run())
    hw = dict(d["hardware"], clock_mhz=800)  # int where float expected: fine
    assert run_from_dict(run_dict(hardware=hw)).hardware.clock_mhz == 800.0
    cases = [
        ("hardware", "rows", "2", "hardware.rows"),
        ("hardware", "rows", 2.0, "hardware.rows"),
        ("hardware", "cols", -1, "hardware.cols"),
        ("hardware", "clock_mhz", True, "hardware.clock_mhz"),
        ("hardware", "d2d_bandwidth_gbps", 0, "hardware.d2d_bandwidth_gbps"),
        ("hardware", "onchip_buffer_kib", 0, "hardware.onchip_buffer_kib"),
        ("model", "experts", 0, "model.experts"),
        ("model", "top_k", 200, "model.top_k"),
        ("model", "name", "", "model.name"),
        ("scheduler", "requests", 65, "scheduler.requests"),
        ("scheduler", "count_width", 17, "scheduler.count_width"),
        ("scheduler", "t_qos_init", 16, "scheduler.t_qos_init"),
        ("scenario", "prefill_fraction", 1.5, "scenario.prefill_fraction"),
        ("scenario", "skew", float("nan"), "scenario.skew"),
        ("scenario", "seed", None, "scenario.seed"),
    ]
    for section, key, value, field in cases:
        sec = dict(d[section], **{key: value})
        assert error_of(run_dict(**{section: sec})).field == field, (section, key, value)


def test_structure_errors(tmp_path):
    assert error_of(run_dict(extra=1)).field == "extra"
    d = run_dict()
    del d["scheduler"]
    assert error_of(d).field == "scheduler"
    assert error_of(run_dict(hardware=5)).field == "hardware"
    assert error_of(run_dict(scenario="default")).field == "scenario"
    assert error_of(run_dict(hardware="../models/qwen3-30b-a3b")).field == "hardware"
    e = error_of([1, 2])
    assert e.field == "<top>"

    e = pytest.raises(InputError, load_run, tmp_path / "absent.yaml").value
    assert (e.field, e.file) == ("<file>", str(tmp_path / "absent.yaml"))
    e = pytest.raises(InputError, load_run, write(tmp_path, "")).value
    assert e.field == "<top>"
    e = pytest.raises(InputError, load_run, write(tmp_path, "hardware: a\nhardware: b\n")).value
    assert e.field == "<yaml>" and "line 2" in e.reason and "duplicate" in e.reason
    e = pytest.raises(InputError, load_hardware, write(tmp_path, "- 1\n")).value
    assert e.field == "<top>"


def test_section_files(tmp_path):
    hw = config_to_dict(default_run().hardware)
    p = write(tmp_path, yaml.safe_dump(dict(hw, rows=1, cols=1)), "one.yaml")
    e = pytest.raises(InputError, load_hardware, p).value  # not a multi-chiplet package
    assert (e.file, e.field) == (str(p), "rows") and "2..64 chiplets" in e.reason
    p = write(tmp_path, yaml.safe_dump(dict(hw, rows=1, cols=2)), "two.yaml")
    assert load_hardware(p).chiplets == 2  # a valid package ...
    e = error_of(run_dict(hardware=dict(hw, rows=1, cols=2)))
    assert e.field == "hardware" and "4..64" in e.reason  # ... but not for the scheduler
    # 8x8 is the largest package; 9x8 is refused on rows with the limit
    assert load_hardware(write(tmp_path, yaml.safe_dump(dict(hw, rows=8, cols=8)))).chiplets == 64
    p = write(tmp_path, yaml.safe_dump(dict(hw, rows=9, cols=8)), "big.yaml")
    e = pytest.raises(InputError, load_hardware, p).value
    assert (e.file, e.field) == (str(p), "rows") and "2..64 chiplets" in e.reason

    p = write(tmp_path, yaml.safe_dump(dict(hw, macs=1)), "hw.yaml")
    e = pytest.raises(InputError, load_hardware, p).value
    assert (e.file, e.field) == (str(p), "macs") and "rows" in e.reason

    sch = config_to_dict(default_run().scheduler)
    p = write(tmp_path, yaml.safe_dump(dict(sch, theta_min=2000)), "s.yaml")
    assert pytest.raises(InputError, load_scheduler, p).value.field == "theta_min"


def test_scheduler_params_error_names_source():
    run = default_run()
    bad = RunConfig(
        run.hardware,
        ModelConfig(**dict(config_to_dict(run.model), experts=4, top_k=2)),
        run.scheduler,
        run.scenario,
        source="mine.yaml",
    )
    e = pytest.raises(InputError, bad.scheduler_params).value
    assert (e.file, e.field) == ("mine.yaml", "model.experts")
    assert str(e).startswith("mine.yaml: model.experts: ")


def test_mixtral_is_accepted_by_the_scheduler():
    # the stock chip leaves microslices_per_expert out: it is derived per model, so the
    # large experts of Mixtral stream through the 4 MiB buffer without a hand-set value
    run = run_from_dict(run_dict(hardware="chip2x2", model="mixtral-8x7b"))
    assert run.scheduler_params().experts == 8
    m = run.hardware.microslices_per_expert
    assert m == derived_microslices(run.model.expert_bytes, 4096) == 256  # the cap
    assert run.datapath_params().slots == (4096 * 1024) // run.microslice_bytes() == 6
    phi = run_from_dict(run_dict(hardware="chip2x2", model="phi-3.5-moe"))
    assert phi.hardware.microslices_per_expert == 66
    # slots: micro-slices of Phi-3.5-MoE that fit in the 4 MiB buffer
    assert phi.datapath_params().slots == (4096 * 1024) // phi.microslice_bytes() == 7
    # with the micro-slice count fixed by hand at 8 the buffer cannot stream it
    e = error_of(run_dict(model="mixtral-8x7b"))
    assert e.field == "hardware.onchip_buffer_kib"


def test_trace_path(tmp_path):
    # a trace scenario without the synthetic keys (refused with a trace)
    sc = {"tokens_per_iteration": 64, "seed": 1, "trace": "traces/t.npz"}
    d = run_dict(scenario=sc)
    assert run_from_dict(d, str(tmp_path / "run.yaml")).trace_path() == tmp_path / "traces/t.npz"


# -- scenario keys that apply only to a synthetic workload ------------------------------

#: the first config of a user with a real trace (the routing of the project's LM: 16 experts,
#: top-2, 4 layers): no rounds, skew or prefill_fraction
TRACE_RUN = """\
hardware: chip2x2
model: {name: lm, d_model: 256, d_ffn: 512, experts: 16, top_k: 2, shared_experts: 0,
        layers: 4, heads: 4, params_b: 0.1}
scheduler: default
scenario:
  tokens_per_iteration: 64
  seed: 1
  trace: %s
"""


@pytest.mark.parametrize("trace", ["model", "long.npz"])
def test_a_trace_scenario_needs_no_synthetic_keys(tmp_path, trace):
    run = load_run(write(tmp_path, TRACE_RUN % trace))
    sc = run.scenario
    assert (sc.skew, sc.prefill_fraction) == (None, None)
    assert sc.rounds == run.model.layers == 4  # left out: one iteration
    d = config_to_dict(run)
    assert not set(SYNTHETIC_ONLY) & set(d["scenario"])
    assert run_from_dict(d, run.source) == run  # still round-trips


def test_left_out_rounds_are_one_iteration_of_the_trace(tmp_path):
    from fsedp.workload import rounds

    run = load_run(write(tmp_path, TRACE_RUN % "model"))
    assert len(rounds(run)) == run.scenario.rounds == 4
    # given with a trace, rounds is kept: fsedp rtl rounds reads it whatever the trace
    text = (TRACE_RUN % "model").replace("  seed: 1\n", "  seed: 1\n  rounds: 6\n")
    run = load_run(write(tmp_path, text, "six.yaml"))
    assert run.scenario.rounds == 6 and len(rounds(run)) == 6
    # and in a synthetic scenario too
    sc = config_to_dict(default_run().scenario)
    del sc["rounds"]
    run = run_from_dict(run_dict(scenario=sc))
    assert run.scenario.rounds == run.model.layers == 48


@pytest.mark.parametrize("key", SYNTHETIC_ONLY)
@pytest.mark.parametrize("trace", ["model", "traces/long.npz"])
def test_synthetic_keys_are_refused_with_a_trace(key, trace):
    sc = {"tokens_per_iteration": 64, "seed": 1, "trace": trace, key: 0.5}
    e = error_of(run_dict(scenario=sc), "run.yaml")
    assert (e.file, e.field) == ("run.yaml", f"scenario.{key}")
    assert e.reason == f"applies to synthetic scenarios only; this scenario replays trace: {trace}"


def test_synthetic_keys_refused_in_schema_order_with_the_trace_cut_short():
    trace = "t" * 300 + ".npz"
    sc = {"tokens_per_iteration": 64, "seed": 1, "trace": trace, "prefill_fraction": 0.5}
    e = error_of(run_dict(scenario=dict(sc, skew=1.0)))
    assert e.field == "scenario.skew" and e.reason.endswith("trace: " + "t" * 77 + "...")
    assert error_of(run_dict(scenario=sc)).field == "scenario.prefill_fraction"


@pytest.mark.parametrize("key", SYNTHETIC_ONLY)
def test_synthetic_keys_are_required_with_a_synthetic_trace(key):
    sc = config_to_dict(default_run().scenario)
    del sc[key]
    e = error_of(run_dict(scenario=sc))
    assert e.field == f"scenario.{key}"
    assert e.reason == "missing key (trace: synthetic needs skew and prefill_fraction)"
    # the range is still the field's own, with or without a trace
    bad = {"skew": 11, "prefill_fraction": -0.1}[key]
    sc = config_to_dict(default_run().scenario)
    assert error_of(run_dict(scenario=dict(sc, **{key: bad}))).field == f"scenario.{key}"
    sc = {"tokens_per_iteration": 64, "seed": 1, "trace": "model", key: bad}
    e = error_of(run_dict(scenario=sc))
    assert e.field == f"scenario.{key}" and e.reason.startswith("must be in")


# -- micro-slices derived on every shipped hardware, and the buffer a refusal names --------

HARDWARE = ("chip2x2", "mesh3x3", "mesh4x4", "mesh8x8")
#: model -> micro-slices per expert derived on chip2x2, mesh3x3, mesh4x4, mesh8x8 (4 MiB per
#: chiplet; None: refused, no count up to 256 gives deadlock freedom's slots), as
#: docs/configs.md shows them
DERIVED = {
    "deepseek-moe-16b": (15, 27, 40, 147),
    "deepseek-v2-lite": (15, 27, 40, 147),
    "mixtral-8x7b": (256, None, None, None),
    "olmoe-1b-7b": (11, 20, 29, 107),
    "phi-3.5-moe": (66, 122, 179, None),
    "qwen3-30b-a3b": (8, 15, 22, 80),
    "yuan2.0-m32": (43, 79, 115, None),
}


def hardware_dict(name, **fields):
    return dict(read_yaml(CONFIG_DIR / f"hardware/{name}.yaml"), **fields)


#: hardware configs with a larger buffer for large experts: the 4 MiB sibling otherwise
LARGE_BUFFER = {"mesh3x3-16mib": ("mesh3x3", 137), "mesh4x4-16mib": ("mesh4x4", 200)}


def test_every_shipped_hardware_derives_the_microslices():
    assert config.named_configs("hardware") == sorted([*HARDWARE, *LARGE_BUFFER])
    assert config.named_configs("models") == sorted(DERIVED)
    for name in HARDWARE:
        hw = load_hardware(CONFIG_DIR / f"hardware/{name}.yaml")
        assert hw.microslices_per_expert is None and hw.onchip_buffer_kib == 4096
    for name, (base, mixtral) in LARGE_BUFFER.items():
        hw = hardware_dict(name)
        assert hw == dict(hardware_dict(base), name=name, onchip_buffer_kib=16384)
        run = run_from_dict(run_dict(hardware=name, model="mixtral-8x7b"))
        assert run.hardware.microslices_per_expert == mixtral


def test_token_storage_takes_its_share_of_the_buffer():
    """``hardware.token_storage``: each chiplet's share of an iteration's tokens, an input and
    an output vector of ``d_model`` 16-bit values each, comes off the buffer before the
    micro-slices are cut; pinned on Qwen3-30B-A3B (d_model 2048) on the 2x2 chip and on the
    Mixtral threshold of the 4x4 mesh."""
    base = config_to_dict(default_run())
    del base["scheduler"]["count_width"]

    def run(tokens, **hw):
        d = copy.deepcopy(base)
        d["hardware"].update(hw)
        d["hardware"].pop("microslices_per_expert", None)
        d["scenario"]["tokens_per_iteration"] = tokens
        return d

    plain = run_from_dict(run(1024))
    assert (plain.token_kib, plain.weight_kib, plain.hardware.microslices_per_expert) == (
        0,
        4096,
        8,
    )
    # 256 tokens per chiplet x 2 vectors x 2048 x 2 bytes = 2048 KiB: half the buffer, so
    # the micro-slices are cut in half to keep 7 slots
    held = run_from_dict(run(1024, token_storage=True))
    assert (held.token_kib, held.weight_kib, held.hardware.microslices_per_expert) == (
        2048,
        2048,
        16,
    )
    assert held.datapath_params().slots == plain.datapath_params().slots == 7
    assert run_from_dict(run(64, token_storage=True)).token_kib == 128  # 16 tokens each
    e = error_of(run(1024, token_storage=True, onchip_buffer_kib=2048), "t.yaml")
    assert str(e) == (
        "t.yaml: hardware.onchip_buffer_kib: 2048 KiB is taken by the tokens alone "
        "(hardware.token_storage: 2048 KiB for 1024 tokens per iteration)"
    )
    # Mixtral (d_model 4096) on 4x4 at 64 tokens: 4 per chiplet take 64 KiB, so the
    # threshold of 12096 KiB becomes 12160
    mixtral = hardware_dict("mesh4x4", token_storage=True)
    d = run_dict(hardware=dict(mixtral, onchip_buffer_kib=12159), model="mixtral-8x7b")
    assert error_of(d).reason.endswith("; hardware.onchip_buffer_kib >= 12160 would fit")
    assert "12095 KiB left by 64 KiB of tokens holds" in error_of(d).reason
    d = run_dict(hardware=dict(mixtral, onchip_buffer_kib=12160), model="mixtral-8x7b")
    assert run_from_dict(d).datapath_params().slots == 18


@pytest.mark.parametrize("model", sorted(DERIVED))
@pytest.mark.parametrize("hardware", HARDWARE)
def test_every_model_on_every_hardware(hardware, model):
    want = DERIVED[model][HARDWARE.index(hardware)]
    d = run_dict(hardware=hardware, model=model)
    if want is None:
        e = error_of(d)
        assert e.field == "hardware.onchip_buffer_kib" and e.reason.endswith(" would fit")
        return
    run = run_from_dict(d)
    assert run.hardware.microslices_per_expert == want
    dp = run.datapath_params()
    assert dp.micro_slices == want and dp.slots >= dp.max_hops + 1
    # the slots derivation aims for (micro-slices' bytes rounded up), fewer only at the cap
    aim = config.mesh_slots(dp.rows, dp.cols)
    short = (model, hardware) == ("mixtral-8x7b", "chip2x2")
    assert dp.slots == aim - short, (dp.slots, aim)


@pytest.mark.parametrize("model", sorted(DERIVED))
@pytest.mark.parametrize("hardware", HARDWARE)
def test_the_named_buffer_is_the_smallest_that_fits(hardware, model):
    """With the count derived: the buffer smallest_buffer_kib names loads (every check of
    run_from_dict, DatapathParams' included), one KiB less is refused naming it."""
    hw = hardware_dict(hardware)
    size = load_model(CONFIG_DIR / f"models/{model}.yaml").expert_bytes
    kib = smallest_buffer_kib(size, hw["rows"], hw["cols"])
    assert kib is not None and kib > 1
    run = run_from_dict(run_dict(hardware=dict(hw, onchip_buffer_kib=kib), model=model))
    dp = run.datapath_params()
    assert dp.slots >= dp.max_hops + 1 and dp.held_room >= 0
    e = error_of(run_dict(hardware=dict(hw, onchip_buffer_kib=kib - 1), model=model))
    assert e.field == "hardware.onchip_buffer_kib"
    assert e.reason.endswith(f"; hardware.onchip_buffer_kib >= {kib} would fit")
    assert (kib <= 4096) == (DERIVED[model][HARDWARE.index(hardware)] is not None)


@pytest.mark.parametrize("rows, cols", [(2, 2), (2, 3), (3, 3), (4, 4), (8, 8)])
def test_the_smallest_buffer_is_a_threshold(rows, cols):
    """The bisection's premise, by brute force about the answer and up to twice it: with the
    count fixed or derived, every smaller buffer fails the slot check and every larger one
    passes it."""
    need = max_hops(rows, cols) + 1
    slots = config.mesh_slots(rows, cols)
    for size in (1, 1000, 3 * 2**20, 7_340_033, 25_165_824, 176_160_768, 1_000_000_007):
        for count in (None, 1, 8, 48, 256):

            def fits(b, size=size, count=count):
                m = count or derived_microslices(size, b, slots=slots)
                return config.buffer_slots(size, b, m, config.slot_cap(rows, cols)) >= need

            kib = smallest_buffer_kib(size, rows, cols, count)
            if kib is None:  # not even the largest buffer (1 GiB; large experts, uncut)
                assert count and (size >= 176_160_768 or rows * cols > 16) and not fits(2**20)
                continue
            near = range(max(1, kib - 1500), kib + 1500)  # every buffer about the answer
            far = range(kib, 2 * kib + 2, max(1, kib // 300))  # and a sample up to twice it
            for b in [*near, *far]:
                assert fits(b) == (b >= kib), (size, count, b, kib)


def test_mixtral_on_the_4x4_mesh_names_the_buffer_that_fits():
    e = error_of(run_dict(hardware="mesh4x4", model="mixtral-8x7b"), "run.yaml")
    assert str(e) == (
        "run.yaml: hardware.onchip_buffer_kib: 4096 KiB holds 6 micro-slices of 672 KiB "
        "(derived microslices_per_expert 256, the most), but a 4x4 mesh needs at least 18 per "
        "chiplet for deadlock-free streaming; hardware.onchip_buffer_kib >= 12096 would fit"
    )
    # the same number from the rule itself: 18 slots of a 256th of the expert
    size = load_model(CONFIG_DIR / "models/mixtral-8x7b.yaml").expert_bytes
    assert 12096 == math.ceil((max_hops(4, 4) + 1) * math.ceil(size / 256) / 1024)
    run = run_from_dict(run_dict(hardware=hardware_dict("mesh4x4", onchip_buffer_kib=12096),
                                 model="mixtral-8x7b"))  # fmt: skip
    dp = run.datapath_params()
    assert (dp.micro_slices, dp.slots, dp.held_room) == (256, 18, 0)


def test_a_count_set_by_hand_names_a_buffer_and_a_count():
    hw = hardware_dict("mesh4x4", microslices_per_expert=48)  # the count mesh4x4 had set
    e = error_of(run_dict(hardware=hw, model="phi-3.5-moe"))
    assert e.reason.endswith(
        "hardware.onchip_buffer_kib >= 14400 or hardware.microslices_per_expert >= 169 would fit"
    )
    size = load_model(CONFIG_DIR / "models/phi-3.5-moe.yaml").expert_bytes
    assert smallest_buffer_kib(size, 4, 4, 48) == 14400
    assert smallest_microslices(size, 4096, 4, 4) == 169
    for fields, ok in [
        ({"onchip_buffer_kib": 14400}, True),
        ({"onchip_buffer_kib": 14399}, False),
        ({"microslices_per_expert": 169}, True),
        ({"microslices_per_expert": 168}, False),
    ]:
        d = run_dict(hardware=dict(hw, **fields), model="phi-3.5-moe")
        if ok:
            run_from_dict(d)
        else:
            assert error_of(d).field == "hardware.onchip_buffer_kib", fields

    # Mixtral: no count up to 256 fits 4 MiB; the buffer for 48 micro-slices, and the
    # smaller one that the derived count allows
    e = error_of(run_dict(hardware=hw, model="mixtral-8x7b"), "run.yaml")
    assert str(e) == (
        "run.yaml: hardware.onchip_buffer_kib: 4096 KiB holds 1 micro-slices of 3584 KiB "
        "(microslices_per_expert 48), but a 4x4 mesh needs at least 18 per chiplet for "
        "deadlock-free streaming; hardware.onchip_buffer_kib >= 64512 would fit (no "
        "microslices_per_expert up to 256 does; >= 12096 with microslices_per_expert left out)"
    )
    run_from_dict(run_dict(hardware=dict(hw, onchip_buffer_kib=64512), model="mixtral-8x7b"))
    e = error_of(run_dict(hardware=dict(hw, onchip_buffer_kib=64511), model="mixtral-8x7b"))
    assert e.field == "hardware.onchip_buffer_kib"
    # one micro-slice per expert: neither a buffer up to 1 GiB nor a count alone fits
    e = error_of(run_dict(hardware=dict(hw, microslices_per_expert=1), model="mixtral-8x7b"))
    assert e.reason.endswith(
        "hardware.onchip_buffer_kib >= 12096 with microslices_per_expert left out would fit "
        "(neither alone does)"
    )


def test_a_model_no_buffer_fits_says_so():
    huge = dict(config_to_dict(default_run().model), d_model=65536, d_ffn=262144, experts=8,
                top_k=2)  # fmt: skip
    e = error_of(run_dict(hardware="mesh4x4", model=huge))
    assert e.field == "hardware.onchip_buffer_kib"
    assert e.reason.endswith(
        "no hardware.onchip_buffer_kib up to 1048576 fits this model on this mesh"
    )
    assert smallest_buffer_kib(3 * 65536 * 262144, 4, 4) is None


def test_docs_show_the_derived_microslices():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "configs.md").read_text()
    for model, counts in DERIVED.items():
        size = load_model(CONFIG_DIR / f"models/{model}.yaml").expert_bytes
        cells = [
            str(m) if m else f"refused; `onchip_buffer_kib >= {smallest_buffer_kib(size, *rc)}`"
            for m, rc in zip(counts, [(2, 2), (3, 3), (4, 4)])
        ]
        row = f"| `{model}` | " + " | ".join(cells) + " |"
        assert row in docs, row


def test_dataclasses_are_frozen():
    run = default_run()
    for obj in (run, run.hardware, run.model, run.scheduler, run.scenario):
        with pytest.raises(AttributeError):  # FrozenInstanceError
            obj.name = "x"
    assert isinstance(run.hardware, HardwareConfig) and isinstance(run.scheduler, SchedulerConfig)


@pytest.mark.parametrize(
    "cls", [HardwareConfig, ModelConfig, SchedulerConfig, ScenarioConfig], ids=lambda c: c.__name__
)
def test_docs_show_the_declared_fields(cls):
    """docs/configs.md shows each section's table as generated from its declarations."""
    from fsedp.fields import table

    docs = (Path(__file__).resolve().parents[1] / "docs" / "configs.md").read_text()
    begin = f"<!-- fields: {cls.__name__} "
    assert begin in docs, f"docs/configs.md lacks the table of {cls.__name__}"
    shown = docs.split(begin, 1)[1].split("\n", 1)[1].split("<!-- end fields -->", 1)[0]
    assert shown.strip() == table(cls), f"regenerate with fsedp.fields.table({cls.__name__})"


@pytest.mark.parametrize(
    "field,value",
    [
        ("rows", 10**400),
        ("clock_mhz", 1e308),
        ("clock_mhz", 1e-300),
        ("macs_per_chiplet", 2**63),
        ("onchip_buffer_kib", 2**63),
        ("d2d_bandwidth_gbps", 1e308),
        ("ddr_channels", 0),
        ("microslices_per_expert", 10**30),
    ],
)
def test_absurd_hardware_is_refused_by_its_range(field, value):
    hw = config_to_dict(default_run().hardware)
    e = error_of(run_dict(hardware=dict(hw, **{field: value})))
    assert e.field == f"hardware.{field}" and "must be in" in e.reason and len(str(e)) < 200


def test_hostile_yaml_is_refused_at_once(tmp_path):
    """Refused before any expansion: by the alias, the depth, the size or the encoding."""
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi")
    )
    cases = {
        "bomb.yaml": (bomb, "anchors"),
        "deep.yaml": ("[" * 5000, "nested deeper"),
        "big.yaml": ("k: v\n" * 400_000, "larger than"),
        "bytes.yaml": (b"\xff\xfe\x00bad", "not UTF-8"),
    }
    for name, (text, why) in cases.items():
        p = tmp_path / name
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        e = pytest.raises(InputError, load_run, p).value
        assert e.file == str(p) and e.field in ("<yaml>", "<file>"), (name, str(e))
        assert why in e.reason, (name, str(e))


def test_ring_orders_is_the_link_aware_strategies_choice():
    """``scheduler.ring_orders`` sets the ring paths of A7 and A8 only (left out: their own);
    a value outside 1, 2, 4 is refused naming the field."""
    import copy as _copy

    from tiny import TINY

    from fsedp.config import run_from_dict
    from fsedp.sim.fsedp import a7_ring_orders, variant_params
    from fsedp.sim.setup import make_setup

    d = _copy.deepcopy(TINY)
    base = make_setup(run_from_dict(d, "tiny.yaml"))
    assert variant_params(base, "A7").ring_orders == a7_ring_orders(2, 2, "cycle") == 8
    d["scheduler"] = {
        "requests": 8, "theta_min": 2, "n_threshold": 4, "qos_width": 4, "t_qos_init": 0,
        "ring_orders": 2,
    }  # fmt: skip
    s = make_setup(run_from_dict(d, "tiny.yaml"))
    assert variant_params(s, "A7").ring_orders == variant_params(s, "A8").ring_orders == 2
    assert variant_params(s, "A3").ring_orders == variant_params(s, "A6").ring_orders == 1
    assert s.sp.ring_orders == 1  # not a generic of the scheduler every run builds
    d["scheduler"]["ring_orders"] = 3
    with pytest.raises(InputError) as e:
        run_from_dict(d, "tiny.yaml")
    assert (e.value.file, e.value.field) == ("tiny.yaml", "scheduler.ring_orders")


def test_ring_path_is_the_link_aware_strategies_choice():
    """``scheduler.ring_path`` sets the ring path of A7 and A8 only; left out, they take the
    cycle where a side of the mesh is even and the snake on odd x odd meshes; the other
    strategies keep the snake; a value outside RING_PATHS is refused naming the field."""
    import copy as _copy

    from tiny import TINY

    from fsedp.config import run_from_dict
    from fsedp.sim.fsedp import a7_ring_path, variant_params
    from fsedp.sim.setup import make_setup

    assert [a7_ring_path(r, c) for r, c in ((2, 2), (3, 3), (3, 4), (5, 2), (8, 8))] == [
        "cycle", "snake", "cycle", "cycle", "cycle",
    ]  # fmt: skip
    d = _copy.deepcopy(TINY)
    base = make_setup(run_from_dict(d, "tiny.yaml"))
    assert variant_params(base, "A7").ring_path == variant_params(base, "A8").ring_path == "cycle"
    assert variant_params(base, "A3").ring_path == variant_params(base, "A6").ring_path == "snake"
    d["scheduler"] = {
        "requests": 8, "theta_min": 2, "n_threshold": 4, "qos_width": 4, "t_qos_init": 0,
        "ring_path": "snake",
    }  # fmt: skip
    s = make_setup(run_from_dict(d, "tiny.yaml"))
    assert variant_params(s, "A7").ring_path == "snake" and s.sp.ring_path == "snake"
    d["scheduler"]["ring_path"] = "hilbert"
    with pytest.raises(InputError) as e:
        run_from_dict(d, "tiny.yaml")
    assert (e.value.file, e.value.field) == ("tiny.yaml", "scheduler.ring_path")
