"""Bench of the token-buffering unit, Algorithm 2 (one body: Amaranth's simulator and cocotb,
``tb/bench.py``).

Random admissions ``(request, T_QoS)`` on the ``init`` stream (:class:`~fsedp.tb.bench.
StreamDriver`, with pauses; ``init.ready`` must be ``~decide``; an id past the table, where
the field has room, is ignored by both) and decision strobes with dense, sparse or no cold
hits; the defer mask and the request table (T_QoS, C_fw) must equal the golden model after
every edge.  The report counts ``decisions``, ``admissions``, ``defers``,
``defer_cfw_nonzero`` (a deferral resets a non-zero C_fw), ``timer_zero``, ``saturated``
(a refill at the timer's top) and ``cfw_at_max``.  Knobs: ``cycles``, ``seed``.
"""

import random
from collections import Counter

from fsedp.hw.layouts import req_init_bits
from fsedp.hw.token_buffer import TokenBufferUnit
from fsedp.sw.token_buffer import TokenBuffer
from fsedp.tb.bench import Bench, StreamDriver, cocotb_entry, unpack


def component(p):
    return TokenBufferUnit(p)


async def bench(b: Bench, p, knobs: dict) -> dict:
    rng = random.Random(knobs.get("seed", 1))
    gold = TokenBuffer(p)
    R = p.requests
    seen = Counter()
    init = StreamDriver(b, "init", rng)

    def t_qos():
        return rng.choice([0, 1, p.qos_max, p.qos_max - 1, rng.randrange(p.qos_max + 1)])

    for cycle in range(knobs.get("cycles", 1000)):
        decide = int(rng.random() < 0.5)
        # cold hits dense, sparse or none, so C_fw both restarts and climbs
        present = rng.getrandbits(R) | rng.getrandbits(R)
        cold = rng.choice([rng.getrandbits(R), rng.getrandbits(R) & rng.getrandbits(R), 0])
        if len(init.queue) < 2 and rng.random() < 0.4:
            r, t = rng.randrange(1 << p.request_bits), t_qos()
            init.send((r, t), req_init_bits(p, r, t))
        b.set("decide", decide)
        b.set("present", present)
        b.set("cold_hit", cold)
        admitted = await init.cycle()
        b.case = f"cycle {cycle}: decide {decide} admission {admitted}"
        b.check(await b.get("init.ready"), int(not decide), "init.ready")
        await b.tick()
        expected = None
        if decide:
            for q in range(R):
                if present >> q & 1:
                    tq, cq = gold.t_qos[q], gold.c_fw[q]
                    refill = cq >= p.n_threshold
                    seen["saturated"] += refill and tq == p.qos_max
                    tq = min(tq + refill, p.qos_max)
                    cq = 0 if refill else cq
                    if cold >> q & 1:
                        seen["defer_cfw_nonzero"] += tq > 0 and cq != 0
                        seen["timer_zero"] += tq == 0
            expected = gold.decide(present, cold)
            seen["decisions"] += 1
            seen["defers"] += expected.bit_count()
        elif admitted is not None:
            gold.init_request(*admitted)
            seen["admissions"] += 1
        if expected is not None:
            b.check(await b.get("defer"), expected, "defer")
        b.check(unpack(await b.get("t_qos"), p.qos_width, R), gold.t_qos, "T_QoS")
        b.check(unpack(await b.get("c_fw"), p.cfw_width, R), gold.c_fw, "C_fw")
        seen["cfw_at_max"] += p.cfw_max in gold.c_fw
    return dict(seen)


token_buffer_vs_golden = cocotb_entry("token_buffer_vs_golden", component, bench)
