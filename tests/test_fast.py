"""The compiled streaming engine (``fsedp.sim.fast``) against the Python golden model: the
same micro-slice events at the same cycles (every DDR load, link transfer and computation),
the same layer end cycle and the same bookkeeping, on random layers over 2x2, 3x3 and 4x4,
every FSE-DP strategy, one DDR channel and one per chiplet (with remote loads), and the
FLAME-MoE-290M routing.  The 1 000-layer run is behind ``slow``:
``pytest -m slow tests/test_fast.py``."""

import dataclasses
import random

import pytest

pytest.importorskip("numba", reason="the compiled engine needs numba")

from fsedp.config import mesh_slots, run_from_dict  # noqa: E402
from fsedp.sim.fast import as_int64, as_mask  # noqa: E402
from fsedp.sim.fsedp import VARIANTS, fsedp_layer  # noqa: E402
from fsedp.sim.setup import make_setup  # noqa: E402
from fsedp.workload import iterations  # noqa: E402

STRATEGIES = [v for v in VARIANTS if v != "A5"]


def config(rng: random.Random, rows: int, cols: int, channels: int, tokens: int):
    """A small random run config on ``rows x cols`` chiplets."""
    experts = rng.choice([8, 16, 32])
    micro = rng.choice([2, 4, 8])
    d_model, d_ffn = rng.choice([(64, 128), (128, 64), (96, 96)])
    slot_kib = 3 * d_model * d_ffn * 2 / micro / 1024
    slots = mesh_slots(rows, cols) + rng.choice([0, 1, 3])
    return run_from_dict(
        {
            "hardware": {
                "name": f"rand{rows}x{cols}",
                "rows": rows,
                "cols": cols,
                "clock_mhz": 800,
                "macs_per_chiplet": rng.choice([256, 2048, 8192]),
                "onchip_buffer_kib": int(slots * slot_kib) + 1,
                "d2d_bandwidth_gbps": rng.choice([72, 288]),
                "d2d_latency_ns": 4.02,
                "ddr_channels": rows * cols,
                "ddr_bandwidth_gbps_per_channel": rng.choice([6.4, 25.6, 102.4]),
                "microslices_per_expert": micro,
            },
            "model": {
                "name": "rand",
                "d_model": d_model,
                "d_ffn": d_ffn,
                "experts": experts,
                "top_k": rng.choice([1, 2, 4]),
                "shared_experts": 0,
                "layers": 2,
                "heads": 2,
                "params_b": 0.01,
            },
            "scheduler": "default",
            "scenario": {
                "tokens_per_iteration": tokens,
                "rounds": 2,
                "seed": rng.randrange(1000),
                "trace": "synthetic",
                "skew": rng.choice([0.8, 1.2, 2.0]),
                "prefill_fraction": 0.5,
            },
        },
        "random.yaml",
    )


def same(setup, records, strategy, trace=False, slices=None):
    """Both engines on one layer: every field of the results, the event log included."""
    kw = dict(log=True, trace=trace, slices=slices)
    py = fsedp_layer(setup, records, strategy, streaming="python", **kw)
    fast = fsedp_layer(setup, records, strategy, streaming="compiled", **kw)
    a, b = dataclasses.asdict(py), dataclasses.asdict(fast)
    diff = [k for k in a if a[k] != b[k]]
    assert not diff, f"{strategy}: {diff}; first events {first_difference(py.log, fast.log)}"
    assert py.log and len(py.log) == py.events
    return py


def first_difference(x, y):
    for i, (p, q) in enumerate(zip(x, y)):
        if p != q:
            return f"#{i}: python {p}, compiled {q}"
    return f"lengths {len(x)} and {len(y)}"


def check_random(seed: int, rows: int, cols: int, channels: int, layers: int = 1):
    rng = random.Random(seed)
    cfg = config(rng, rows, cols, channels, rng.choice([8, 16, 64]))
    # one package-level channel (the RTL's) or one per chiplet
    setup = make_setup(cfg, ddr_channels=channels)
    done = 0
    for i, lay in enumerate(x for it in iterations(cfg, 1, layers) for x in it):
        for s in STRATEGIES:
            same(setup, lay.records, s, trace=i == 0 and seed % 2 == 0)
            done += 1
    return done


@pytest.mark.parametrize(
    "rows,cols,channels",
    [(2, 2, 1), (2, 2, 4), (3, 3, 1), (3, 3, 9), (4, 4, 16), (4, 6, 24), (8, 8, 64)],
)
def test_compiled_equals_python_every_strategy(rows, cols, channels):
    """Every strategy, both engines, on meshes up to 8x8: on 64 chiplets a trajectory over
    all of them is bit 63 set, a negative ``int64`` in the kernel (``fast.as_int64``)."""
    assert check_random(rows * 10 + channels, rows, cols, channels) == len(STRATEGIES)


@pytest.mark.parametrize("rows,cols,channels", [(2, 2, 1), (2, 2, 4), (3, 3, 9)])
def test_compiled_equals_python_with_slice_table(rows, cols, channels):
    """[D13] a micro-slice count per expert (sub-expert streaming): both engines agree, the
    DDR bytes are exactly the micro-slices of the table, and no layer is below the bound
    of what it moved."""
    rng = random.Random(rows * 7 + channels)
    cfg = config(rng, rows, cols, channels, 32)
    setup = make_setup(cfg, ddr_channels=channels)
    M = setup.dp.micro_slices
    slot = setup.expert_bytes // M
    for lay in (x for it in iterations(cfg, 1, 2) for x in it):
        active = sorted({e for _, _, e in lay.records})
        slices = {e: rng.randint(1, M) for e in active}
        for s in ("A2", "A3", "A4", "A6"):
            r = same(setup, lay.records, s, slices=slices)
            assert r.ddr_bytes == sum(slices.values()) * slot
            assert r.cycles >= r.link_bound >= r.bound
        full = fsedp_layer(setup, lay.records, "A3", slices={e: M for e in active})
        assert dataclasses.asdict(full) == dataclasses.asdict(fsedp_layer(setup, lay.records, "A3"))
    with pytest.raises(ValueError, match="outside"):
        fsedp_layer(setup, lay.records, "A3", slices={active[0]: M + 1})
    with pytest.raises(ValueError, match="A1"):
        fsedp_layer(setup, lay.records, "A1", slices={active[0]: 1})


def random_ahead(rng: random.Random, dp, records, slices=None) -> list:
    """Micro-slices pre-loaded ahead of a layer: 0-4 of its streamed experts, each its
    first 1 .. count micro-slices on random chiplets with room (``slots - H - 1`` each)."""
    streamed = sorted({e for _, _, e in records if (slices or {}).get(e, 1)})
    left = [dp.slots - dp.max_hops - 1] * dp.chiplets
    out = []
    for e in rng.sample(streamed, min(len(streamed), rng.randint(0, 4))):
        count = dp.micro_slices if slices is None else slices[e]
        for i in range(rng.randint(1, count)):
            room = [c for c in range(dp.chiplets) if left[c]]
            if not room:
                return out
            c = rng.choice(room)
            left[c] -= 1
            out.append((c, e, i))
    return out


@pytest.mark.parametrize("rows,cols,channels", [(2, 2, 1), (2, 2, 4), (3, 3, 1), (3, 3, 9)])
def test_compiled_equals_python_with_ahead_micro_slices(rows, cols, channels):
    """Predicted pre-loads across layers: a layer that starts with micro-slices loaded
    ahead (held until their expert's first beat binds them) runs the same on both engines,
    loads exactly that many fewer, computes exactly as many micro-slices, and stays at or
    above the bound of what it loaded; none ahead is the plain layer."""
    rng = random.Random(rows * 13 + channels)
    for _ in range(3):
        cfg = config(rng, rows, cols, channels, rng.choice([16, 64]))
        setup = make_setup(cfg, ddr_channels=channels)
        dp, slot = setup.dp, setup.expert_bytes // setup.dp.micro_slices
        for lay in (x for it in iterations(cfg, 1, 1) for x in it):
            active = sorted({e for _, _, e in lay.records})
            slices = rng.choice([None, {e: rng.randint(1, dp.micro_slices) for e in active}])
            for s in ("A2", "A3", "A4", "A6"):
                ahead = random_ahead(rng, dp, lay.records, slices)
                base = fsedp_layer(setup, lay.records, s, slices=slices)
                py = fsedp_layer(
                    setup, lay.records, s, streaming="python", slices=slices, log=True, ahead=ahead
                )
                fast = fsedp_layer(
                    setup,
                    lay.records,
                    s,
                    streaming="compiled",
                    slices=slices,
                    log=True,
                    ahead=ahead,
                )
                a, b = dataclasses.asdict(py), dataclasses.asdict(fast)
                assert not [k for k in a if a[k] != b[k]], first_difference(py.log, fast.log)
                assert py.ddr_bytes == base.ddr_bytes - len(ahead) * slot
                computed = sum(ev[0] == 2 for ev in py.log)
                assert computed == base.events - (base.ddr_bytes + base.d2d_bytes) // slot
                assert py.cycles >= py.link_bound >= py.bound
            none = fsedp_layer(setup, lay.records, "A3", ahead=[])
            assert dataclasses.asdict(none) == dataclasses.asdict(
                fsedp_layer(setup, lay.records, "A3")
            )


def test_compiled_equals_python_with_remote_loads_and_a6():
    """Per-chiplet channels load for experts whose trajectory does not cover them (remote
    loads) and A6 preempts and windows: both engines agree on many small layers."""
    for seed in range(6):
        check_random(100 + seed, 2, 2, 4)


def test_compiled_equals_python_on_a5():
    """A5 keeps one scheduler across layers (its request table): the run is the same."""
    from fsedp.sim.run import run_experiment, summarize

    cfg = config(random.Random(7), 2, 2, 4, 16)
    out = {}
    for engine in ("python", "compiled"):
        import os

        os.environ["FSEDP_STREAMING"] = engine
        try:
            run = run_experiment(cfg, ["A5"], n_iter=3, layers=2, progress=False, workers=1)
        finally:
            del os.environ["FSEDP_STREAMING"]
        s = summarize(run)["A5"]
        s.pop("wall_s")
        out[engine] = (s, [dataclasses.asdict(r) for r in run["results"]["A5"]])
    assert out["python"] == out["compiled"]


def test_compiled_equals_python_on_flame_layers():
    from test_cocotb import flame_config

    cfg = flame_config(tokens=64, rounds=8)
    setup = make_setup(cfg)
    for lay in [x for it in iterations(cfg, 1, 4) for x in it]:
        for s in ("A3", "A6"):
            same(setup, lay.records, s)


@pytest.mark.slow
def test_compiled_equals_python_on_1000_random_layers():
    meshes = [(2, 2, 1), (2, 2, 4), (3, 3, 1), (3, 3, 9), (4, 4, 1), (4, 4, 16)]
    done, seed = 0, 0
    while done < 1000:
        rows, cols, channels = meshes[seed % len(meshes)]
        done += check_random(10_000 + seed, rows, cols, channels, layers=2)
        seed += 1
    assert done >= 1000


def test_fallback_is_said_once(monkeypatch, caplog):
    # caplog, not the captured stderr: which handler prints a record depends on whether an
    # earlier test of the session configured the CLI's (fsedp.log.configure)
    from fsedp.sim import fast

    monkeypatch.setattr(fast, "_kernel", False)
    monkeypatch.setattr(fast, "_said", False)
    monkeypatch.delenv("FSEDP_STREAMING", raising=False)
    with caplog.at_level("WARNING", logger="fsedp"):
        assert fast.streaming_engine() == "python" and fast.streaming_engine() == "python"
    said = [r for r in caplog.records if "numba is not available" in r.getMessage()]
    assert len(said) == 1


# -- one description, two interpreters: the kernel's functions and their counterparts -----------
def _counterpart(doc: str):
    """The object a kernel function's docstring opens with (``module.function``), resolved
    as the kernel's docstrings write it: relative to the streaming package, its ``array``
    or ``ring_buffer`` module, ``fsedp.params``, or absolute."""
    import builtins
    import importlib
    import re

    m = re.match(r"\s*``([\w.]+)``", doc or "")
    if m is None:
        return None, None
    name = m.group(1)
    for base in ("", "fsedp.sw.streaming.", "fsedp.sw.streaming.array.",
                 "fsedp.sw.streaming.ring_buffer.", "fsedp.params."):  # fmt: skip
        parts = (base + name).split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            return name, obj
    obj = builtins
    for attr in name.split("."):
        obj = getattr(obj, attr, None)
    return name, obj


def _kernel_functions() -> dict:
    from numba.core.registry import CPUDispatcher

    from fsedp.sim import fast_kernel

    return {
        name: f
        for name, f in vars(fast_kernel).items()
        if isinstance(f, CPUDispatcher) and f.py_func.__module__ == fast_kernel.__name__
    }


def test_kernel_functions_name_their_golden_counterpart():
    """Every compiled function opens its docstring with the golden (or simulator) function
    it interprets, and that function exists; one named after a golden module's function
    (``router_accept``) interprets that very function (``router.accept``); and every
    function of the streaming golden model's blocks has its interpretation."""
    from fsedp.sw.streaming import compute, ddr, probe, ring_buffer, router

    named, kernel = set(), _kernel_functions()
    for name, f in kernel.items():
        said, obj = _counterpart(f.py_func.__doc__)
        assert said is not None, f"fast_kernel.{name}: its docstring names no counterpart"
        assert obj is not None, f"fast_kernel.{name}: ``{said}`` does not exist"
        named.add(said)
        for mod in ("ring_buffer", "router", "ddr", "compute", "probe"):
            if name.startswith(mod + "_"):
                want = name.removeprefix(mod + "_")
                assert said in (f"{mod}.{want}", f"{mod}.{name}"), (name, said)
    for mod in (ring_buffer, router, ddr, compute, probe):
        short = mod.__name__.rsplit(".", 1)[1]
        for fn in mod.__all__:
            obj = getattr(mod, fn)
            if callable(obj) and not isinstance(obj, type) and fn != "load_ahead":
                # load_ahead runs once before a layer, in Python (fast.run_layer)
                assert f"{short}.{fn}" in named or any(
                    f"``{short}.{fn}``" in (g.py_func.__doc__ or "") for g in kernel.values()
                ), f"{short}.{fn} has no compiled interpretation"


def test_architecture_table_pairs_each_kernel_function_with_its_counterpart():
    """``docs/architecture.md``'s table of interpreters: every kernel function that mirrors a
    golden one (or a ``fsedp.params`` one) is in the row of its counterpart."""
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
    if not path.exists():  # scripts/mutate.py's package view has no docs
        pytest.skip("docs/architecture.md is not in this tree")
    page = path.read_text()
    section = page.split("## One rule, its interpreters", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| rule")]
    cells = [[re.findall(r"`([^`]+)`", c) for c in r.strip("|").split("|")] for r in rows]
    seen = set()
    for name, f in _kernel_functions().items():
        said, obj = _counterpart(f.py_func.__doc__)
        obj = obj.fget if isinstance(obj, property) else obj
        module = getattr(obj, "__module__", "") or ""
        qual = getattr(obj, "__qualname__", "")
        if not (module.startswith("fsedp.sw.streaming") or module == "fsedp.params"):
            continue  # the simulator's bookkeeping and builtins have no row
        if "." in qual and qual.split(".")[0] not in (
            "DatapathParams",
            "Slot",
            "Room",
            "StreamingArray",
        ):
            continue
        row = [c for c in cells if name in c[2]]
        assert len(row) == 1, f"fast_kernel.{name} is in {len(row)} rows of the table"
        assert said in row[0][1] or f"fsedp.params.{said}" in row[0][1], (name, said, row[0][1])
        seen.add(name)
    listed = {n for c in cells for n in c[2]}
    assert listed <= seen | {"ring_after"}, listed - seen


def test_compiled_equals_python_on_64_chiplets():
    """8x8 at 256 tokens: trajectories over chiplet 63 (bit 63, the sign bit of the kernel's
    ``int64``) and completions of entry 63 occur, and both engines agree on every field."""
    rng = random.Random(0)  # 16 experts; A3 dispatches one at entry 63
    cfg = config(rng, 8, 8, 64, 256)
    setup = make_setup(cfg, ddr_channels=64)
    lay = next(iter(iterations(cfg, 1, 1)))[0]
    r = same(setup, lay.records, "A3")
    assert any(b[3] >> 63 for b in r.beats), "no trajectory over chiplet 63"
    assert any(m >> 63 for m in r.script), "entry 63 never completed"
    for mask in (0, 1, 1 << 62, 1 << 63, (1 << 64) - 1):
        assert as_mask(as_int64(mask)) == mask
        assert -(2**63) <= as_int64(mask) < 2**63


def test_compiled_admission_ledger_equals_the_golden_one():
    """``room_open`` / ``room_admits`` / ``room_admits_load`` / ``room_take`` against
    ``ring_buffer.Room`` on random buffers of a 4x4 mesh (``H`` = 17, 19 slots): every ``r``
    from 0 to ``H + 1`` (a held one), before and after a few admissions, under both rules."""
    import numpy as np

    from fsedp.params import DatapathParams
    from fsedp.sim import fast_kernel as k
    from fsedp.sw.streaming import StreamingArray
    from fsedp.sw.streaming.ring_buffer import Room

    rng = random.Random(3)
    for rule in ("forward-count", "forward-state"):
        p = DatapathParams(rows=4, cols=4, slots=19, admission=rule)
        top = p.max_hops + 1
        for _ in range(200):
            arr = StreamingArray(p)
            SL = np.zeros((p.chiplets, p.slots, k.NS), np.int64)
            for c, ch in enumerate(arr.chips):
                for i in rng.sample(range(p.slots), rng.randrange(p.slots + 1)):
                    claim = rng.choice([rng.randrange(top), top])
                    s = ch.slots[i]
                    s.busy, s.r, s.claim = True, min(claim, top - 1), claim
                    SL[c, i, k.S_BUSY], SL[c, i, k.S_CLAIM] = 1, claim
            P = np.zeros(k.NP, np.int64)
            P[k.P_N], P[k.P_K], P[k.P_H] = p.chiplets, p.slots, p.max_hops
            P[k.P_ADMIT] = k.ADMIT_STATE if rule == "forward-state" else k.ADMIT_COUNT
            W = np.zeros((k.NW, 2 * p.chiplets + 2), np.int64)
            CLM = np.zeros((p.chiplets, top + 1), np.int64)
            room = Room(arr)
            k.room_open(P, SL, W, CLM)
            for _ in range(3):
                c = rng.randrange(p.chiplets)
                want = [room.admits(c, r) for r in range(top + 1)]
                got = [bool(k.room_admits(P, W, CLM, c, r)) for r in range(top + 1)]
                assert got == want, (rule, c, room.free[c])
                want = [room.admits_load(c, r) for r in range(top + 1)]
                got = [bool(k.room_admits_load(P, W, CLM, c, r)) for r in range(top + 1)]
                assert got == want, ("load", rule, c, room.free[c])
                r = rng.randrange(top + 1)
                if want[r]:
                    room.take(c, r)
                    k.room_take(P, W, CLM, c, r)
