"""Bench of the E-C matcher (one body: Amaranth's simulator and cocotb, ``tb/bench.py``).

Eligibility, entry chiplet c*, pre-load chiplet and ring routing table for random, 1-chiplet
and full trajectories and empty, full, single and random ICVs; the running-slot table under
random commits and multi-slot completions (some exactly the running slots, some spurious),
with the release mask and ``spurious`` checked against the golden model every cycle.  The
report counts ``checks``, ``single``, ``full``, ``choice`` (two or more idle chiplets to
choose from), ``release`` and ``commit``.  Knobs: ``cycles``, ``seed``.
"""

import random
from collections import Counter

from fsedp.hw.matcher import ECMatcher
from fsedp.sw.matcher import entry_chiplet, lowest_bit, next_hops, release_mask
from fsedp.tb.bench import Bench, cocotb_entry, unpack


def component(p):
    return ECMatcher(p)


async def bench(b: Bench, p, knobs: dict) -> dict:
    rng = random.Random(knobs.get("seed", 1))
    C, Cb = p.chiplets, p.chiplet_bits
    full = (1 << C) - 1
    running = [0] * C
    seen = Counter()

    def trajectory():
        kind = rng.randrange(5)
        if kind == 0:
            return 1 << rng.randrange(C)
        if kind == 1:
            return full
        return rng.getrandbits(C) or 1 << rng.randrange(C)

    def idle_vector():
        kind = rng.randrange(6)
        if kind == 0:
            return 0
        if kind == 1:
            return full
        if kind == 2:
            return 1 << rng.randrange(C)
        return rng.getrandbits(C)

    for _ in range(knobs.get("cycles", 1000)):
        traj, icv = trajectory(), idle_vector()
        eligible = bool(traj & icv)
        commit = int(rng.random() < 0.3 and eligible and not running[entry_chiplet(traj, icv)])
        done = 0
        if not commit and rng.random() < 0.4:
            done = rng.getrandbits(C)
            if rng.random() < 0.3:  # exactly the running slots (no spurious bit)
                done &= sum(1 << s for s in range(C) if running[s])
        for port, v in (("traj", traj), ("icv", icv), ("commit", commit), ("done", done)):
            b.set(port, v)
        b.case = f"traj {traj:#x} icv {icv:#x} running {running}"
        b.check(await b.get("eligible"), int(eligible), "eligible")
        if eligible:
            b.check(await b.get("entry"), entry_chiplet(traj, icv), "entry c*")
        b.check(await b.get("first"), lowest_bit(traj), "first (pre-load chiplet)")
        got = tuple(unpack(await b.get("next_hop"), Cb, C))
        b.check(got, next_hops(traj, C, p.ring_table(0)), "next_hop")
        valid = sum(1 << s for s in range(C) if running[s])
        b.check(await b.get("running"), valid, "running")
        b.check(await b.get("release"), release_mask(running, done), "release")
        b.check(await b.get("spurious"), int(bool(done & ~valid)), "spurious")
        seen["checks"] += 1
        seen["single"] += traj.bit_count() == 1
        seen["full"] += traj == full
        seen["choice"] += (traj & icv).bit_count() >= 2
        seen["release"] += release_mask(running, done) != 0
        seen["commit"] += commit
        await b.tick()
        if commit:
            running[entry_chiplet(traj, icv)] = traj
        for s in range(C):
            if done >> s & 1 and not (commit and s == entry_chiplet(traj, icv)):
                running[s] = 0
    return dict(seen)


matcher_vs_golden = cocotb_entry("matcher_vs_golden", component, bench)
