"""Fast tier: the latencies the scheduler blocks document (``EIT.latency``, ``ICV.latency``,
``TokenBufferUnit.latency``), measured in Amaranth's simulator through the bench adapter
``tb/bench.py``.  The blocks' golden-model benches are ``tb/tb_<block>.py``, run in both
tiers by ``tests/test_block_benches.py``."""

import pytest
from test_block_benches import EIT_PARAMS, TB_PARAMS

from fsedp.hw.eit import EIT
from fsedp.hw.icv import ICV
from fsedp.hw.layouts import req_init_bits
from fsedp.hw.token_buffer import TokenBufferUnit
from fsedp.params import SchedulerParams
from fsedp.tb.bench import run_amaranth


@pytest.mark.parametrize("name", list(EIT_PARAMS)[:3], ids=["8e-w4", "12e-w2", "32e-w16"])
def test_eit_latency_is_measured(name):
    """``EIT.latency``: a record transferred in cycle 0 first counts in ``count``/``mask``
    in cycle ``latency`` (measured on every lane of a word, and for a merge)."""
    p = EIT_PARAMS[name]
    dut = EIT(p)
    seen = []

    async def bench(b, p, knobs):
        for expert in (0, p.experts - 1, p.experts // 2):
            b.set("rec.valid", 1)
            b.set("rec.payload", {"request": 0, "chiplet": 1, "expert": expert})
            assert await b.get("rec.ready")  # always ready: the constant 1
            before = await b.get(f"count.{expert}")
            await b.tick()  # the transfer (cycle 0) ends here
            b.set("rec.valid", 0)

            async def counted(e=expert, v=before):
                return await b.get(f"count.{e}") != v

            cycles = 1 + await b.until(counted, "record", 10)
            b.check(await b.get(f"mask.{expert}") >> 1 & 1, 1, "mask bit of chiplet 1")
            seen.append(cycles)
            await b.tick(3)
        # a re-merge of word 0 issued in cycle 0 (request 0 excluded: the count drops)
        b.set("merge_en", 1)
        b.set("merge_addr", 0)
        b.set("merge_include", 0)
        await b.tick()
        b.set("merge_en", 0)

        async def dropped():
            return await b.get("count.0") == 0

        seen.append(1 + await b.until(dropped, "merge", 10))

    run_amaranth(dut, bench, p, limit=200)
    assert seen == [dut.latency] * 4


@pytest.mark.parametrize("chiplets", [4, 16])
def test_icv_latency_is_measured(chiplets):
    """``ICV.latency``: an allocation, then a release, of cycle 0 shows on ``value`` in
    cycle ``latency`` and not before."""
    p = SchedulerParams(chiplets=chiplets, experts=8)
    dut = ICV(p)
    full = (1 << chiplets) - 1
    seen = []

    async def bench(b, p, knobs):
        for port, want in (("alloc", full & ~0b101), ("release", full)):
            b.set(port, 0b101)
            await b.tick()
            b.set(port, 0)

            async def shows(w=want):
                return await b.get("value") == w

            seen.append(1 + await b.until(shows, "update", 5))

    run_amaranth(dut, bench, p, limit=50)
    assert seen == [dut.latency] * 2


def test_token_buffer_latency_is_measured():
    """``TokenBufferUnit.latency``: a ``decide`` strobe of cycle 0 shows its defer mask in
    cycle ``latency``."""
    p = TB_PARAMS["5r-q2-n2"]
    dut = TokenBufferUnit(p)
    seen = []

    async def bench(b, p, knobs):
        b.set("init.valid", 1)
        b.set("init.payload", req_init_bits(p, 1, p.qos_max))
        await b.tick()
        b.set("init.valid", 0)
        b.set("present", 0b11)
        b.set("cold_hit", 0b10)  # request 1 has slack: deferred
        b.set("decide", 1)
        await b.tick()
        b.set("decide", 0)

        async def deferred():
            return await b.get("defer") == 0b10

        seen.append(1 + await b.until(deferred, "defer", 5))

    run_amaranth(dut, bench, p, limit=50)
    assert seen == [dut.latency]
