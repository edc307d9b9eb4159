"""Tests of fsedp.config: every shipped config loads, every malformed one fails on one line."""

import builtins
import io
import json
import pathlib
import pickle
from pathlib import Path

import pytest
import yaml

from fsedp import config
from fsedp.config import (
    CONFIG_DIR,
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
)
from fsedp.params import SchedulerParams

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
    assert CONFIG_DIR == Path(__file__).resolve().parents[1] / "configs"
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
    assert "4..16" in reason("too-few-chiplets.yaml")


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
    "tokens, width", [(1, 4), (15, 4), (16, 5), (64, 7), (1023, 10), (1024, 11)]
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
    assert (e.file, e.field) == (str(p), "rows") and "2..16 chiplets" in e.reason
    p = write(tmp_path, yaml.safe_dump(dict(hw, rows=1, cols=2)), "two.yaml")
    assert load_hardware(p).chiplets == 2  # a valid package ...
    e = error_of(run_dict(hardware=dict(hw, rows=1, cols=2)))
    assert e.field == "hardware" and "4..16" in e.reason  # ... but not for the scheduler

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
    d = run_dict(scenario=dict(config_to_dict(default_run().scenario), trace="traces/t.npz"))
    assert run_from_dict(d, str(tmp_path / "run.yaml")).trace_path() == tmp_path / "traces/t.npz"


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
