"""Device profiles of the software-side models: the shipped profiles load, the
default reproduces the models' earlier constants exactly, every field is checked (one line,
exit 2), and ``--device`` reaches the offload and serving models."""

import json
from pathlib import Path

import pytest

from fsedp.cli import main
from fsedp.experiments.offload import OffloadConfig, deployment_cost, link_of
from fsedp.fields import table
from fsedp.sw.policies.device import (
    DeviceProfile,
    interpolate,
    load_device,
    profile_from_dict,
    profile_yaml,
)
from fsedp.sw.policies.offload import Cost, links

ROOT = Path(__file__).resolve().parents[1]
GOOD = load_device("pcie4-default").as_dict()


def test_shipped_profiles_load():
    for name in ("pcie4-default", "h100-pcie5"):
        p = load_device(name)
        assert p.name == name and p.source
    h = load_device("h100-pcie5")
    assert h.link_gbs == 52.0 and h.pinned and h.expert_table_us == {1: 50.0, 256: 50.0}


def test_default_profile_is_the_models_earlier_constants():
    """PCIe 4 at 25 GB/s and 10 us; 5 us plus FLOPs at 50 TFLOP/s per expert; the serving
    model's 150 TFLOP/s, 2 TB/s and 2 ms per step."""
    cfg = OffloadConfig()
    link = link_of(cfg)
    assert (link.bandwidth_gbs, link.latency_us) == (25.0, 10.0)
    assert links()["pcie4"].seconds(1e6) == link.seconds(1e6)
    cost = deployment_cost(cfg)
    assert (cost.flops, cost.overhead_s, cost.table) == (50e12, 5.0 * 1e-6, None)
    from fsedp.experiments.serve import perf_model

    pm = perf_model("mixtral-8x7b", 4)
    assert (pm.flops, pm.bandwidth, pm.launch_s) == (150e12, 2.0e12, 2e-3)


def test_default_trace_figures_are_unchanged(capsys):
    """The routing-only figures docs/offload.md shows, from the default profile."""
    assert main(["offload", "--trace", "model", "--json", "--cache-rates", "0.5"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(["offload", "--trace", "model", "--json", "--cache-rates", "0.5",
                 "--link", "pcie4", "--tflops", "50", "--overhead-us", "5"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out) == default


def test_h100_profile_changes_the_prediction(capsys):
    args = ["offload", "--trace", "model", "--json", "--prefetches", "none"]
    assert main(args) == 0
    slow = json.loads(capsys.readouterr().out)[0]
    assert main([*args, "--device", "h100-pcie5"]) == 0
    fast = json.loads(capsys.readouterr().out)[0]
    assert fast["demand_fetches"] == slow["demand_fetches"]
    assert fast["stall_s"] < slow["stall_s"] and fast["compute_s"] > slow["compute_s"]


def test_table_interpolates_and_extrapolates_at_the_rate():
    t = ((1, 10e-6), (5, 50e-6))
    assert interpolate(t, 0.5, 1e12, 1e6) == 10e-6
    assert interpolate(t, 3, 1e12, 1e6) == pytest.approx(30e-6)
    assert interpolate(t, 7, 1e12, 1e6) == pytest.approx(50e-6 + 2 * 1e-6)
    c = Cost(1.0, 1e6, 2e6, flops=1e12, overhead_s=1.0, table=t)
    assert c.compute_s([1, 5], 4) == pytest.approx(4 * 2e-6 + 60e-6)


def test_profile_yaml_round_trips(tmp_path):
    p = load_device("h100-pcie5")
    path = tmp_path / "p.yaml"
    path.write_text(profile_yaml(p, "a comment"))
    assert load_device(str(path)) == p


@pytest.mark.parametrize(
    "change,field",
    [
        ({"link_gbs": -1.0}, "link_gbs"),
        ({"link_gbs": "fast"}, "link_gbs"),
        ({"link_latency_us": float("nan")}, "link_latency_us"),
        ({"pinned": "yes"}, "pinned"),
        ({"expert_tflops": 0}, "expert_tflops"),
        ({"expert_launch_us": -5}, "expert_launch_us"),
        ({"memory_gbs": True}, "memory_gbs"),
        ({"bogus": 1}, "bogus"),
        ({"expert_table_us": {0: 5.0}}, "expert_table_us.0"),
        ({"expert_table_us": {4: -1.0}}, "expert_table_us.4"),
        ({"expert_table_us": {4: "x"}}, "expert_table_us.4"),
        ({"expert_table_us": {"a": 1.0}}, "expert_table_us.a"),
        ({"expert_table_us": []}, "expert_table_us"),
        ({"name": None}, "name"),
    ],
)
def test_bad_profile_field_is_one_line(tmp_path, capsys, change, field):
    import yaml

    data = {**GOOD, **change}
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(Exception) as e:
        profile_from_dict(data, str(path))
    assert e.value.field == field
    for argv in (
        ["offload", "--trace", "model", "--device", str(path)],
        ["serve", "--device", str(path), "--duration", "5"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "Traceback" not in err
        assert str(path) in err and f": {field}:" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["offload", "--trace", "model", "--device", "nosuch"],
        ["serve", "--device", "nosuch"],
        ["offload", "--trace", "model", "--device", "/nonexistent/d.yaml"],
        ["offload", "--replay"],
        ["offload", "--replay-steps", "3", "--trace", "model"],
        ["offload", "--replay-repeat", "3", "--profile-device", "x.yaml"],
        ["offload", "--replay-repeat", "0", "--trace", "model", "--replay"],
    ],
)
def test_bad_device_arguments_are_one_line(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err


def test_serve_device_option(capsys):
    argv = ["serve", "--policy", "fifo", "--load", "low", "--duration", "20", "--json"]
    assert main(argv) == 0
    base = json.loads(capsys.readouterr().out)
    assert main([*argv, "--tflops", "150", "--bandwidth", "2000"]) == 0
    assert json.loads(capsys.readouterr().out) == base


def test_docs_show_the_declared_fields():
    docs = (ROOT / "docs" / "configs.md").read_text()
    begin = "<!-- fields: DeviceProfile "
    assert begin in docs
    shown = docs.split(begin, 1)[1].split("\n", 1)[1].split("<!-- end fields -->", 1)[0]
    assert shown.strip() == table(DeviceProfile)
