"""A8: tokens gathered into regions of the mesh (``fsedp.sim.regions``): the tilings, the
placement of every token, the all-to-all's price, and layers whose rings stay inside their
expert's region."""

import copy
import math
import random

import numpy as np
import pytest
from tiny import TINY

from fsedp.config import run_from_dict
from fsedp.params import mesh_position
from fsedp.sim.baselines import _all_to_all, ep_home
from fsedp.sim.fsedp import fsedp_layer
from fsedp.sim.regions import (
    all_to_all_cycles,
    assign,
    gather,
    plan,
    regions_of,
    spread,
    tilings,
)
from fsedp.sim.setup import make_setup
from fsedp.workload import iterations


def mesh_config(rows: int, cols: int, tokens: int, seed: int = 5):
    d = copy.deepcopy(TINY)
    d["hardware"].update(
        name=f"tiny{rows}x{cols}",
        rows=rows,
        cols=cols,
        ddr_channels=rows * cols,
        onchip_buffer_kib=96,  # 32 slots of 3 KiB: deadlock freedom on 4x4 needs 18
    )
    d["model"]["experts"] = 32
    d["scenario"].update(tokens_per_iteration=tokens, seed=seed)
    return run_from_dict(d, "tiny.yaml")


@pytest.mark.parametrize("rows,cols", [(2, 2), (3, 3), (4, 4), (2, 4), (8, 8)])
def test_tilings_cover_the_mesh_with_rectangles(rows, cols):
    shapes = tilings(rows, cols)
    assert shapes[0] == (rows, cols)
    for rh, rw in shapes:
        assert rows % rh == 0 and cols % rw == 0 and rh * rw >= 2
        regions = regions_of(rows, cols, (rh, rw))
        assert sorted(c for r in regions for c in r) == list(range(rows * cols))
        for region in regions:
            pos = [mesh_position(c, cols) for c in region]
            r0, k0 = min(p[0] for p in pos), min(p[1] for p in pos)
            assert {(r - r0, k - k0) for r, k in pos} == {
                (i, j) for i in range(rh) for j in range(rw)
            }
    with pytest.raises(ValueError, match="do not tile"):
        regions_of(rows, cols, (rows + 1, cols))


def random_records(rng, n: int, experts: int, tokens: int, top_k: int = 2):
    return [
        (t % 8, rng.randrange(n), e)
        for t in range(tokens)
        for e in rng.sample(range(experts), top_k)
    ]


@pytest.mark.parametrize("seed", range(20))
def test_every_token_lands_in_its_experts_region_evenly(seed):
    rng = random.Random(seed)
    rows, cols = rng.choice([(2, 2), (3, 3), (4, 4), (2, 4), (4, 2)])
    setup = make_setup(mesh_config(rows, cols, 64))
    dp, n, experts = setup.dp, rows * cols, 32
    records = random_records(rng, n, experts, rng.choice([4, 32, 128]))
    shape = rng.choice(tilings(rows, cols))
    regions = regions_of(rows, cols, shape)
    held = np.zeros((n, experts), np.int64)
    for _, c, e in records:
        held[c, e] += 1
    per = np.full(experts, dp.micro_slices, np.int64)
    home = assign(held, per, dp, regions)
    active = set(np.flatnonzero(held.sum(0)))
    assert {e for e in range(experts) if home[e] >= 0} == active
    out, moves = gather(records, home, regions, cols, per, dp)
    assert len(out) == len(records)
    changed = [(a[1], b[1]) for a, b in zip(records, out) if a != b]
    assert sorted(changed) == sorted(moves)
    for (r, _c, e), (r2, c2, e2) in zip(records, out):
        assert (r, e) == (r2, e2) and c2 in regions[home[e]]
    for e in active:
        region = regions[home[e]]
        share = [sum(1 for _, c, x in out if x == e and c == d) for d in region]
        assert max(share) - min(share) <= 1, (e, share)
        # a token already in the region moves only where its chiplet holds more than its share
        before = {d: int(held[d, e]) for d in region}
        for d, s in zip(region, share):
            stayed = sum(1 for a, b in zip(records, out) if a[2] == e and a[1] == d == b[1])
            assert stayed == min(before[d], s)


def shares(records, n: int, experts: int) -> np.ndarray:
    held = np.zeros((n, experts), np.int64)
    for _, c, e in records:
        held[c, e] += 1
    return held


@pytest.mark.parametrize("seed", range(20))
def test_spread_evens_each_expert_over_the_chiplets_that_hold_it(seed):
    """A balanced layer's whole mesh (``spread``): every expert's tokens as even as whole
    tokens allow over the chiplets that already hold them -- its trajectory unchanged -- a
    token moving only off a chiplet that holds more than its share, and the moves those of
    the records that changed."""
    rng = random.Random(seed)
    rows, cols = rng.choice([(2, 2), (3, 3), (4, 4), (2, 4), (8, 8)])
    n, experts = rows * cols, 32
    records = random_records(rng, n, experts, rng.choice([4, 32, 128, 512]))
    out, moves = spread(records, n, cols)
    assert len(out) == len(records)
    assert sorted((a[1], b[1]) for a, b in zip(records, out) if a != b) == sorted(moves)
    assert all((r, e) == (r2, e2) for (r, _, e), (r2, _, e2) in zip(records, out))
    before, after = shares(records, n, experts), shares(out, n, experts)
    assert ((before > 0) == (after > 0)).all()  # the same trajectories
    for e in range(experts):
        on = after[before[:, e] > 0, e]
        if len(on):
            assert on.max() - on.min() <= 1, (e, on)
    # a token stays where its chiplet keeps room for it
    stayed = shares([b for a, b in zip(records, out) if a == b], n, experts)
    assert (stayed == np.minimum(before, after)).all()


def test_all_to_all_is_the_busiest_chiplets_links():
    setup = make_setup(mesh_config(2, 2, 64))
    act, bw, lat = setup.act_bytes, setup.link_bytes_per_cycle, setup.link_latency_cycles
    assert all_to_all_cycles(setup, []) == (0, 0)
    assert all_to_all_cycles(setup, [(1, 1)]) == (0, 0)
    # chiplet 0 sends three activations over its two links; the farthest goes 2 hops (0 -> 2)
    moves = [(0, 1), (0, 2), (0, 3)]
    assert all_to_all_cycles(setup, moves) == (math.ceil(3 * act / 2 / bw) + 2 * lat, 3 * act)
    # EP's all-to-all is the same function, each token to its expert's home
    rng = random.Random(1)
    records = random_records(rng, 4, 32, 64)
    home = ep_home(32, 4)
    assert _all_to_all(setup, records, home) == all_to_all_cycles(
        setup, [(c, home[e]) for _, c, e in records]
    )


def test_a8_streams_each_expert_inside_its_region():
    """Gathered into 2x2 regions on the 4x4 mesh, every trajectory the scheduler dispatches
    lies inside its expert's region, the micro-slices cross fewer links than A7's rings over
    the whole mesh, each expert is still loaded once, and the all-to-all is in the layer's
    time as its own cause."""
    cfg = mesh_config(4, 4, 256)
    setup = make_setup(cfg)
    lay = iterations(cfg, 1, 1)[0][0]
    a7 = fsedp_layer(setup, lay.records, "A7")
    a8 = fsedp_layer(setup, lay.records, "A8", regions=(2, 2))
    regions = regions_of(4, 4, (2, 2))
    masks = [sum(1 << c for c in r) for r in regions]
    home = a8.gather["home"]
    assert a8.beats
    for _kind, expert, _entry, traj in a8.beats:
        assert traj & ~masks[home[expert]] == 0, (expert, bin(traj))
    assert sum(a8.link_bytes.values()) < sum(a7.link_bytes.values())
    assert a8.ddr_bytes == a7.ddr_bytes
    assert a8.gather["moved"] > 0 and a8.gather["a2a_cycles"] > 0
    assert a8.lost()["all-to-all"] == 2 * a8.gather["a2a_cycles"]
    assert a8.cycles >= a8.link_bound >= a8.bound and a8.stream_bound == a8.link_bound
    assert (a8.bound, a8.link_bound) == (a7.bound, a7.link_bound)


def test_a8_keeps_one_ring_on_a_balanced_layer_and_takes_a_given_shape():
    cfg = mesh_config(2, 2, 64)
    setup = make_setup(cfg)
    lay = iterations(cfg, 1, 1)[0][0]
    r = fsedp_layer(setup, lay.records, "A8", regions=(1, 2))
    assert r.gather["shape"] == [1, 2] and list(r.gather["scores"]) == ["1x2"]
    # the whole mesh: nothing moves, the layer is A7's
    whole = fsedp_layer(setup, lay.records, "A8", regions=(2, 2))
    a7 = fsedp_layer(setup, lay.records, "A7")
    assert whole.gather["moved"] == 0 and whole.cycles == a7.cycles and whole.beats == a7.beats
    with pytest.raises(ValueError, match="regions apply to A8"):
        fsedp_layer(setup, lay.records, "A7", regions=(1, 2))
    with pytest.raises(ValueError, match="do not tile"):
        fsedp_layer(setup, lay.records, "A8", regions=(3, 1))
    per = np.full(setup.sp.experts, setup.dp.micro_slices, np.int64)
    p = plan(setup, lay.records, per)
    assert p.shape in tilings(2, 2) and set(p.scores) <= set(tilings(2, 2))


@pytest.mark.parametrize("tokens,gathers", [(256, True), (1024, False)])
def test_the_cost_model_gathers_a_ddr_bound_layer_not_a_balanced_one(tokens, gathers):
    """Qwen3-30B-A3B on the 4x4 mesh (``docs/results.md``): at 256 tokens (DDR-bound) the
    rings over all 16 chiplets load the busiest link as long as DDR takes, and regions
    halve that at the same DDR and compute time; at 1024 (DDR and compute balanced) one ring
    keeps up, and the whole mesh stays, its tokens spread evenly over each expert's ring."""
    from fsedp.sim.sweep import sweep_config

    hw = {
        "name": "mesh4x4",
        "rows": 4,
        "cols": 4,
        "clock_mhz": 800,
        "macs_per_chiplet": 2048,
        "onchip_buffer_kib": 4096,
        "d2d_bandwidth_gbps": 288,
        "d2d_latency_ns": 4.02,
        "ddr_channels": 16,
        "ddr_bandwidth_gbps_per_channel": 25.6,
    }
    cfg = sweep_config(hw, "qwen3-30b-a3b", tokens, 1, "mesh4x4.yaml")
    setup = make_setup(cfg)
    lay = iterations(cfg, 1, 1)[0][0]
    per = np.full(setup.sp.experts, setup.dp.micro_slices, np.int64)
    p = plan(setup, lay.records, per)
    assert (p.shape != (4, 4)) == gathers, p.scores
    whole = p.scores[4, 4]
    if gathers:
        assert p.scores[p.shape][0] <= 1.01 * whole[0] and p.scores[p.shape][1] < whole[1] / 2
    else:
        # the whole mesh, every expert's tokens evened out over its own chiplets (A7's rings),
        # each chiplet keeping its number of tokens
        assert list(p.scores) == [(4, 4)] and p.moves
        assert (p.records, p.moves) == spread(lay.records, 16, 4)
        experts = setup.sp.experts
        before, after = shares(lay.records, 16, experts), shares(p.records, 16, experts)
        assert ((before > 0) == (after > 0)).all()
        assert (before.sum(1) == after.sum(1)).all()
        assert p.a2a == all_to_all_cycles(setup, p.moves)[0] > 0
