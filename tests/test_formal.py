"""Formal properties (``fsedp.tb.formal``): they hold on the RTL at the stated depths, and
deliberately broken copies of the ICV and the sorter fail them with a counterexample."""

import pytest
from amaranth import Module

from fsedp.hw.icv import ICV
from fsedp.hw.sorter import Sorter
from fsedp.hw.token_buffer import TokenBufferUnit
from fsedp.sw.sorter import Network
from fsedp.tb.formal import CHECKS, missing_tools, properties, prove

pytestmark = pytest.mark.skipif(
    bool(missing_tools()), reason=f"formal tools missing: {', '.join(missing_tools())}"
)


class ReleaseLosingICV(ICV):
    """A plausible bug: allocation written after release, so a release meeting an
    allocation of another chiplet in the same cycle is lost."""

    def elaborate(self, platform):
        m = Module()
        with m.If(self.alloc.any()):
            m.d.sync += self.value.eq(self.value & ~self.alloc)
        with m.Else():
            m.d.sync += self.value.eq(self.value | self.release)
        return m


class ReleaseWinsICV(ICV):
    """A plausible bug: release applied after allocation (a chiplet released and allocated
    in one cycle ends idle)."""

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.value.eq((self.value & ~self.alloc) | self.release)
        return m


def short_sorter(p, kind="shuffle2"):
    """A sorter whose network lost its last step (the fast tier once hung on this one)."""
    s = Sorter(p, kind)
    s.network = Network(s.network.kind, s.network.lanes, s.network.steps[:-1])
    return s


@pytest.mark.parametrize("name", ["icv", "matcher", "token_buffer"])
def test_properties_hold(name, tmp_path):
    res = prove(CHECKS[name], tmp_path)
    assert res.status == "pass", res.properties
    assert [p["name"] for p in res.properties] == properties(CHECKS[name])
    assert all(p["depth"] == CHECKS[name].depth for p in res.properties)
    if CHECKS[name].induction:
        assert all(p["induction"] == "pass" for p in res.properties)


@pytest.mark.parametrize(
    "broken,expected",
    [(ReleaseLosingICV, "icv.release"), (ReleaseWinsICV, "icv.alloc")],
    ids=["release-lost", "release-wins"],
)
def test_broken_icv_fails(broken, expected, tmp_path):
    res = prove(CHECKS["icv"], tmp_path, dut_factory=broken, only=[expected])
    assert res.status == "fail" and res.failed[0].startswith(expected)
    assert res.vcd and (tmp_path / expected / "trace.vcd").stat().st_size > 0


def test_sorter_holds_and_a_short_network_fails(tmp_path):
    check = CHECKS["sorter-shuffle2"]
    ok = prove(check, tmp_path / "ok", only=["sorter.sorted", "sorter.latency"])
    assert ok.status == "pass", ok.properties
    bad = prove(check, tmp_path / "bad", dut_factory=short_sorter, only=["sorter.sorted"])
    assert bad.status == "fail" and bad.failed[0].startswith("sorter.sorted")


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CHECKS if n not in ("icv", "matcher")])
def test_slow_checks_hold(name, tmp_path):
    res = prove(CHECKS[name], tmp_path)
    assert res.status == "pass", res.properties


def test_depth_override_and_cli(tmp_path, capsys):
    import json

    from fsedp.cli import main

    rc = main(["rtl", "formal", "--check", "icv", "--depth", "3", "--out", str(tmp_path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["checks"][0]["depth"] == 3
    assert {p["name"] for p in doc["checks"][0]["properties"]} == set(properties(CHECKS["icv"]))


class KeepsCfwTokenBuffer(TokenBufferUnit):
    """The mutant the fast tier once missed: ``C_fw`` not reset on a deferral."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.decide & self.present[0] & self.cold_hit[0]):
            m.d.sync += self.c_fw[0].eq(self.c_fw[0])
        return m


def test_token_buffer_keeping_cfw_fails(tmp_path):
    check = CHECKS["token_buffer"]
    only = ["token_buffer.defer_resets_cfw"]
    res = prove(check, tmp_path, dut_factory=KeepsCfwTokenBuffer, only=only)
    assert res.status == "fail" and res.failed[0].startswith(only[0])
