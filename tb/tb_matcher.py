"""cocotb testbench of the E-C matcher: eligibility, entry chiplet, pre-load chiplet and ring
routing table for random trajectories and ICVs; the running-slot table under random commits
and multi-slot completions, with the release mask checked against the golden model."""

import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from fsedp.sw.matcher import entry_chiplet, lowest_bit, next_hops, release_mask
from fsedp.tb.streams import knobs, params, start, u, write_report


@cocotb.test()
async def matcher_vs_golden(dut):
    p, k = params(), knobs()
    rng = random.Random(k.get("seed", 1))
    C = p.chiplets
    running = [0] * C
    await start(dut)
    checks = 0
    for _ in range(k.get("cycles", 400)):
        traj = rng.getrandbits(C) or 1 << rng.randrange(C)
        icv = rng.getrandbits(C) if rng.random() < 0.8 else 0
        commit = int(
            rng.random() < 0.3 and bool(traj & icv) and not running[entry_chiplet(traj, icv)]
        )
        done = 0
        if not commit and rng.random() < 0.4:
            done = rng.getrandbits(C)
        dut.traj.value, dut.icv.value, dut.commit.value, dut.done.value = traj, icv, commit, done
        await ReadOnly()
        eligible = bool(traj & icv)
        assert u(dut.eligible) == eligible
        if eligible:
            assert u(dut.entry) == entry_chiplet(traj, icv)
        assert u(dut.first) == lowest_bit(traj)
        hops = u(dut.next_hop)
        got = tuple(hops >> (c * p.chiplet_bits) & ((1 << p.chiplet_bits) - 1) for c in range(C))
        assert got == next_hops(traj, C), f"{traj:b}: {got} != {next_hops(traj, C)}"
        valid = sum(1 << s for s in range(C) if running[s])
        assert u(dut.running) == valid
        assert u(dut.release) == release_mask(running, done)
        assert u(dut.spurious) == int(bool(done & ~valid))
        checks += 1
        await RisingEdge(dut.clk)
        if commit:
            running[entry_chiplet(traj, icv)] = traj
        for s in range(C):
            if done >> s & 1 and not (commit and s == entry_chiplet(traj, icv)):
                running[s] = 0
    write_report({"checks": checks})
