"""Every file we read is hostile; tiny files must not cost gigabytes.

Each case writes a small hostile file -- a 136-byte ``.npy`` whose expert id 32766 was once
taken as the expert count (16.8 GB of dense tables), an ``.npz`` whose unused member
inflates to 2 GiB of zeros (read whole, 4.2 GB), members that declare huge shapes, a lying
zip directory, scores beyond float32, hostile JSON lines and model files -- and runs
:func:`fsedp.cli.main` on it in a forked child (the runner of ``tests/test_fuzz.py``) under
an address-space limit of :data:`MEMORY_GROWTH` beyond this process's, measuring the child's
peak resident memory (``wait4``).  A refused case must exit 2 with exactly one line
``fsedp: FILE: FIELD: REASON`` holding the expected refusal (not a ``MemoryError`` caught
on the way), grow the memory by less than :data:`MEMORY_CAP` and take less than
:data:`TIME_CAP` seconds.

The big members are written without the memory or the time they declare: the deflate
stream of a block of zeros after a full flush is the same bytes for every block, and the
CRC of ``n`` zero bytes is computed from the CRC register's matrix over GF(2).
"""

import contextlib
import functools
import io
import json
import os
import select
import signal
import struct
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import test_fuzz
from test_fuzz import Outcome, _child, _snapshot, problems

from fsedp.errors import InputError
from fsedp.trace.core import MAX_ENTRIES, MAX_EXPERTS

#: Peak memory a case may add to the forked child (the brief: under 1 GB)
MEMORY_CAP = 2**30
#: Address space a case may add to this process's: beyond it an allocation fails at once
MEMORY_GROWTH = 3 * 2**29
#: Seconds a case may take (killed after)
TIME_CAP = 30.0
GIB = 2**30
BLOCK = 1 << 24


# -- zip files written by hand ------------------------------------------------------------


def _crc32_zeros(crc: int, n: int) -> int:
    """``zlib.crc32(bytes(n), crc)`` without the ``n`` bytes: appending a zero byte is a
    linear map of the CRC register, raised to the ``n``-th power by squaring."""

    def apply(mat, v):
        out, i = 0, 0
        while v:
            if v & 1:
                out ^= mat[i]
            v >>= 1
            i += 1
        return out

    ones = 0xFFFFFFFF
    step = [zlib.crc32(b"\0", (1 << i) ^ ones) ^ ones for i in range(32)]  # one zero byte
    reg = crc ^ ones
    while n:
        if n & 1:
            reg = apply(step, reg)
        step = [apply(step, c) for c in step]
        n >>= 1
    return reg ^ ones


def test_crc_of_zeros_matches_zlib():
    for crc, n in ((0, 0), (0, 1), (0x1234, 1000), (zlib.crc32(b"head"), 65537)):
        assert _crc32_zeros(crc, n) == zlib.crc32(bytes(n), crc)


def _npy_header(dtype, shape) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape}
    )
    return buf.getvalue()


def _member(name: str, data: bytes) -> tuple:
    """A deflated member holding ``data``."""
    co = zlib.compressobj(6, zlib.DEFLATED, -15)
    return name, zlib.crc32(data), len(data), [co.compress(data) + co.flush()], 8


def _npy_member(name: str, a) -> tuple:
    buf = io.BytesIO()
    np.save(buf, np.asarray(a), allow_pickle=False)
    return _member(name, buf.getvalue())


@functools.cache
def _deflated_block() -> bytes:
    """:data:`BLOCK` zero bytes deflated from a fresh state and fully flushed."""
    co = zlib.compressobj(6, zlib.DEFLATED, -15)
    return co.compress(bytes(BLOCK)) + co.flush(zlib.Z_FULL_FLUSH)


def _zeros_member(name: str, dtype, shape) -> tuple:
    """A deflated ``.npy`` member of zeros of ``shape``, none of it made in memory: a full
    flush ends every block of zeros on a byte boundary with a fresh state, so every block
    deflates to the same bytes."""
    header = _npy_header(dtype, shape)
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    co = zlib.compressobj(6, zlib.DEFLATED, -15)
    chunks = [co.compress(header) + co.flush(zlib.Z_FULL_FLUSH)]
    full, rest = divmod(size, BLOCK)
    chunks += [_deflated_block()] * full
    chunks.append(co.compress(bytes(rest)) + co.flush())
    crc = _crc32_zeros(zlib.crc32(header), size)
    return name, crc, len(header) + size, chunks, 8


def _write_zip(path: Path, members) -> Path:
    """A zip of ``(name, crc, size, compressed chunks, method)`` members, sizes as given
    (the central directory is what a reader trusts)."""
    date = (0 << 9) | (1 << 5) | 1  # 1980-01-01
    central = []
    with open(path, "wb") as f:
        for name, crc, size, chunks, method in members:
            assert size < 0xFFFFFFFF  # no zip64 records written here
            n = name.encode()
            offset = f.tell()
            csize = sum(len(c) for c in chunks)
            f.write(
                struct.pack(
                    "<4s5H3I2H", b"PK\x03\x04", 20, 0, method, 0, date, crc, csize, size, len(n), 0
                )
                + n
            )
            for c in chunks:
                f.write(c)
            central.append(
                struct.pack(
                    "<4s6H3I5H2I",
                    b"PK\x01\x02",
                    20,
                    20,
                    0,
                    method,
                    0,
                    date,
                    crc,
                    csize,
                    size,
                    len(n),
                    0,
                    0,
                    0,
                    0,
                    0,
                    offset,
                )
                + n
            )
        start = f.tell()
        for c in central:
            f.write(c)
        f.write(
            struct.pack(
                "<4s4H2IH",
                b"PK\x05\x06",
                0,
                0,
                len(central),
                len(central),
                f.tell() - start,
                start,
                0,
            )
        )
    return path


def _trace_members(**change) -> list:
    """The members of a small valid fsedp trace (8 tokens, 2 layers, top-2 of 4), with
    ``change`` replacing (an array) or adding (a member tuple) members."""
    rng = np.random.default_rng(0)
    experts = np.stack([[rng.choice(4, 2, replace=False) for _ in range(2)] for _ in range(8)])
    arrays = {
        "format": np.asarray("fsedp-trace"),
        "version": np.asarray(1),
        "num_experts": np.asarray(4),
        "experts": experts.astype(np.int16),
        "scores": np.full((8, 2, 2), 0.5, np.float32),
        "request": np.zeros(8, np.int32),
        "position": np.arange(8, dtype=np.int32),
        "name": np.asarray("hostile"),
    }
    members = {k: _npy_member(f"{k}.npy", v) for k, v in arrays.items()}
    for k, v in change.items():
        members[k] = v if isinstance(v, tuple) else _npy_member(f"{k}.npy", v)
    return list(members.values())


def test_hand_written_zips_are_what_numpy_reads(tmp_path):
    """The writer above makes zips numpy reads back, CRC checked, zeros member included;
    the trace reader takes such a file and leaves its unused member (under the size cap)
    unread."""
    path = _write_zip(
        tmp_path / "t.npz",
        _trace_members(junk=_zeros_member("junk.npy", np.uint8, (2 * BLOCK + 5,))),
    )
    with np.load(path) as z:
        assert z["experts"].shape == (8, 2, 2) and str(z["format"]) == "fsedp-trace"
        junk = z["junk"]
    assert junk.shape == (2 * BLOCK + 5,) and not junk.any()
    from fsedp.trace.io import load_trace

    assert load_trace(path).tokens == 8


# -- the forked runner --------------------------------------------------------------------


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/self/status")


def run(folder: Path, argv: list[str], monkeypatch) -> tuple[Outcome, int]:
    """Run ``fsedp argv`` in a forked child (``test_fuzz._child``: own process group,
    redirected output, an address-space limit) and return its outcome and the peak resident
    memory it added to this process's, in bytes."""
    limit = _status_kib("VmSize") * 1024 + MEMORY_GROWTH
    monkeypatch.setattr(test_fuzz, "MEMORY_LIMIT", limit)
    before = _snapshot(folder)
    out, err = folder.parent / f"{folder.name}.out", folder.parent / f"{folder.name}.err"
    argv = [a.replace("{dir}", str(folder)) for a in argv]
    rss = _status_kib("VmRSS") * 1024
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(folder, argv, out, err)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], TIME_CAP)
    finally:
        os.close(fd)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    seconds = time.monotonic() - t0
    after = _snapshot(folder)
    changes = sorted(
        [f"new {p}" for p in after.keys() - before.keys()]
        + [f"rewritten {p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    )
    outcome = Outcome(
        os.waitstatus_to_exitcode(status) if ready else None,
        out.read_text(errors="backslashreplace"),
        err.read_text(errors="backslashreplace"),
        seconds,
        changes,
    )
    return outcome, usage.ru_maxrss * 1024 - rss


# -- the cases ----------------------------------------------------------------------------


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _jsonl(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _model_config(**change) -> np.ndarray:
    cfg = dict(vocab=8, d_model=4, layers=1, heads=1, context=4, experts=2, top_k=1, d_ffn=4)
    return np.asarray(json.dumps({**cfg, "shared_experts": 0, **change}))


def _model_members(**change) -> list:
    """The members of a tiny valid model file, ``change`` replacing some."""
    from fsedp.lm.config import LMConfig
    from fsedp.lm.model import weight_shapes

    cfg = _model_config()
    shapes = weight_shapes(LMConfig.from_dict(json.loads(str(cfg))))
    members = {k: _npy_member(f"{k}.npy", np.ones(v, np.float32)) for k, v in shapes.items()}
    return [_npy_member("config.npy", cfg), *{**members, **change}.values()]


def _lying_header() -> tuple:
    """An experts member whose header declares 2**40 tokens over 64 bytes of data."""
    data = _npy_header(np.int16, (2**40, 1, 1)) + bytes(64)
    return _member("experts.npy", data)


def _ratio_lie() -> tuple:
    """A stored member whose directory entry declares 100 MiB from 200 bytes."""
    data = _npy_header(np.int16, (8, 2, 2)) + bytes(64)
    return "experts.npy", zlib.crc32(data), 100 * 2**20, [data], 0


def _bzip2() -> tuple:
    import bz2

    buf = io.BytesIO()
    np.save(buf, np.zeros((8, 2, 2), np.int16))
    data = buf.getvalue()
    return "experts.npy", zlib.crc32(data), len(data), [bz2.compress(data)], 12


#: name -> (argv, a function making the files (name -> bytes, or the members of a zip),
#: what the one line must hold)
CASES = {
    # the 136-byte reproduction: expert id 32766 taken as the expert count
    "npy-id-32766": (
        ["trace", "stats", "{dir}/t.npy"],
        lambda: {"t.npy": _npy(np.full((4, 1, 1), 32766, np.int16))},
        ["t.npy: experts: ", "32766", str(MAX_EXPERTS)],
    ),
    # the 2 MB reproduction: an unused member inflating to 2 GiB of zeros
    "npz-unused-2gib-member": (
        ["trace", "convert", "{dir}/t.npz", "{dir}/out.npz"],
        lambda: {"t.npz": _trace_members(junk=_zeros_member("junk.npy", np.uint8, (2 * GIB,)))},
        ["t.npz: junk: declares 2147483776 bytes"],
    ),
    # a used member whose header declares more entries than a trace holds (64 MiB of
    # zeros, under the member size cap: refused on its header, never decompressed)
    "npz-experts-declares-2p26-entries": (
        ["trace", "stats", "{dir}/t.npz"],
        lambda: {
            "t.npz": _trace_members(experts=_zeros_member("experts.npy", np.uint8, (2**26, 1, 1)))
        },
        ["t.npz: experts: ", f"at most {MAX_ENTRIES}"],
    ),
    "npz-scores-declare-2gib": (
        ["trace", "stats", "{dir}/t.npz"],
        lambda: {"t.npz": _trace_members(scores=_zeros_member("scores.npy", np.float64, (2**28,)))},
        ["t.npz: scores: declares"],
    ),
    "npz-header-declares-2p40-tokens": (
        ["trace", "stats", "{dir}/t.npz"],
        lambda: {"t.npz": _trace_members(experts=_lying_header())},
        ["t.npz: experts: declares shape (1099511627776, 1, 1)"],
    ),
    "npz-directory-declares-100mib-from-200-bytes": (
        ["trace", "stats", "{dir}/t.npz"],
        lambda: {"t.npz": _trace_members(experts=_ratio_lie())},
        ["t.npz: experts: ", "zip bomb"],
    ),
    "npz-bzip2-member": (
        ["trace", "stats", "{dir}/t.npz"],
        lambda: {"t.npz": _trace_members(experts=_bzip2())},
        ["t.npz: experts: ", "zip method 12"],
    ),
    # float64 scores beyond float32: refused without NumPy's overflow warning
    "npz-scores-beyond-float32": (
        ["trace", "stats", "{dir}/t.npz"],
        lambda: {"t.npz": _trace_members(scores=np.full((8, 2, 2), 1e300))},
        ["t.npz: scores: must fit float32"],
    ),
    "npz-num-experts-above-the-configs": (
        ["trace", "stats", "{dir}/t.npz"],
        lambda: {"t.npz": _trace_members(num_experts=np.asarray(MAX_EXPERTS + 1))},
        ["t.npz: num_experts: ", str(MAX_EXPERTS)],
    ),
    "jsonl-one-long-line": (
        ["trace", "stats", "{dir}/t.jsonl"],
        lambda: {"t.jsonl": b'{"token": 0, "layer": 0, "experts": [' + b"1, " * 10**6 + b"1]}\n"},
        ["t.jsonl: line 1: longer than"],
    ),
    "jsonl-deep-nesting": (
        ["trace", "stats", "{dir}/t.jsonl"],
        lambda: {"t.jsonl": b"[" * 20000 + b"]" * 20000 + b"\n"},
        ["t.jsonl: line 1: not a record"],
    ),
    "jsonl-sparse-grid": (  # 3000 tokens x 1024 layers declared by 4023 records
        ["trace", "stats", "{dir}/t.jsonl"],
        lambda: {
            "t.jsonl": _jsonl(
                [{"token": t, "layer": 0, "experts": [1]} for t in range(3000)]
                + [{"token": 0, "layer": lay, "experts": [1]} for lay in range(1, 1024)]
            )
        },
        ["t.jsonl: layer: token 1 has no record for layer 1"],
    ),
    "jsonl-expert-id-32766": (
        ["trace", "stats", "{dir}/t.jsonl"],
        lambda: {"t.jsonl": _jsonl([{"token": 0, "layer": 0, "experts": [32766]}])},
        ["t.jsonl: line 1.experts: ", str(MAX_EXPERTS - 1)],
    ),
    # model files: sizes come from the config, checked before any array is read
    "model-config-declares-10g-parameters": (
        ["prism", "curve", "--refactored", "{dir}/m.npz"],
        lambda: {
            "m.npz": [
                _npy_member("config.npy", _model_config(vocab=2**20, d_model=4096, layers=64))
            ]
        },
        ["m.npz: config: declares"],
    ),
    "model-config-declares-1e12-layers": (
        ["prism", "curve", "--refactored", "{dir}/m.npz"],
        lambda: {
            "m.npz": [_npy_member("config.npy", _model_config(layers=10**12, vocab=1, d_model=1))]
        },
        ["m.npz: config: declares"],
    ),
    "model-unused-600mib-member": (
        ["prism", "curve", "--refactored", "{dir}/m.npz"],
        lambda: {
            "m.npz": [
                _npy_member("config.npy", _model_config()),
                _zeros_member("junk.npy", np.uint8, (600 * 2**20,)),
            ]
        },
        ["m.npz: junk: declares"],
    ),
    "model-weight-declares-2p26-values": (
        ["prism", "curve", "--refactored", "{dir}/m.npz"],
        lambda: {"m.npz": _model_members(embed=_zeros_member("embed.npy", np.float32, (2**24, 4)))},
        ["m.npz: embed: shape (16777216, 4), expected (8, 4)"],
    ),
    # a valid tiny trace of the most experts: fitting a generator to it would need 640 MiB
    "synth-like-4096-experts": (
        ["trace", "synth", "--like", "{dir}/t.npy", "--out", "{dir}/s.npz"],
        lambda: {"t.npy": _npy(np.where(np.arange(64) == 0, MAX_EXPERTS - 1, 0).reshape(64, 1, 1))},
        ["t.npy: num_experts: ", "MiB"],
    ),
}


def _write(folder: Path, files: dict):
    for name, content in files.items():
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            _write_zip(folder / name, content)


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_file_is_refused_in_one_line_small_and_fast(name, tmp_path, monkeypatch):
    argv, files, expect = CASES[name]
    folder = tmp_path / "case"
    folder.mkdir()
    _write(folder, files())
    assert sum(p.stat().st_size for p in folder.iterdir()) < 10 * 2**20  # tiny inputs
    outcome, grew = run(folder, argv, monkeypatch)
    found = problems(outcome)
    assert not found, f"{found}; stderr: {outcome.stderr[:300]!r}"
    line = outcome.stderr.strip()
    for text in expect:
        assert text in line, line
    assert "MemoryError" not in line and "Warning" not in line, line
    assert grew < MEMORY_CAP, f"{grew / 2**20:.0f} MiB"
    assert outcome.seconds < TIME_CAP


def test_statistics_of_a_small_trace_of_the_most_experts_stay_small(tmp_path, monkeypatch):
    """Accepted, not refused: 20,000 tokens over 4096 experts with token ids (a file of a
    few hundred KiB) once needed [tokens, k, E] and [tokens, E] float64 tables (gigabytes);
    the statistics now build no table larger than a slice."""
    from fsedp.trace import RoutingTrace
    from fsedp.trace.io import save_trace

    folder = tmp_path / "case"
    folder.mkdir()
    t = 20_000
    rng = np.random.default_rng(0)
    first = rng.integers(0, MAX_EXPERTS // 2, size=(t, 2))
    experts = np.stack([first, first + MAX_EXPERTS // 2], axis=-1)  # distinct per token
    save_trace(
        RoutingTrace(
            experts=experts,
            scores=None,
            token_ids=np.arange(t) % 5000,
            request=np.arange(t) // 100,
            position=np.arange(t) % 100,
            num_experts=MAX_EXPERTS,
            name="wide",
        ),
        folder / "t.npz",
    )
    assert (folder / "t.npz").stat().st_size < 2**20
    outcome, grew = run(folder, ["trace", "stats", "{dir}/t.npz"], monkeypatch)
    assert outcome.status == 0, outcome.stderr
    assert f"top-2 of {MAX_EXPERTS} experts" in outcome.stdout
    assert grew < MEMORY_CAP, f"{grew / 2**20:.0f} MiB"
    assert outcome.seconds < TIME_CAP


def test_scores_beyond_float32_are_refused_without_a_warning(tmp_path):
    """The check runs on the stored dtype: no NumPy overflow warning on the way."""
    from fsedp.errors import InputError
    from fsedp.trace.io import load_jsonl, load_trace

    npz = _write_zip(tmp_path / "t.npz", _trace_members(scores=np.full((8, 2, 2), -1e39)))
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_bytes(_jsonl([{"token": 0, "layer": 0, "experts": [1], "probs": [1e299]}]))
    for load, path in ((load_trace, npz), (load_jsonl, jsonl)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(InputError, match="must fit float32"):
                load(path)


def test_the_tiny_model_file_of_the_cases_is_valid(tmp_path):
    """The model cases are refused for what they change, not for the rest of the file."""
    from fsedp.lm.model import MoELM

    m = MoELM.load(_write_zip(tmp_path / "m.npz", _model_members()))
    assert m.parameters == 8 * 4 + 4 * 4 + 4 + 2 * 4 + 4 * 2 + 3 * 2 * 4 * 4 + 4 * 16


# -- the JSON-lines importer's caps, at the value, one below and one above -------------------


def _records(tokens=2, layers=2, k=2, experts=4, first=0):
    return [
        {"token": t, "layer": l, "experts": [(first + t + j) % experts for j in range(k)]}
        for t in range(tokens)
        for l in range(layers)
    ]


@pytest.mark.parametrize(
    "cap,value,records,field",
    [
        # 4 records: the cap at 4 takes them, 3 refuses the 4th (on its line)
        ("MAX_RECORDS", 4, _records(), None),
        ("MAX_RECORDS", 5, _records(), None),
        ("MAX_RECORDS", 3, _records(), "line 4"),
        # 8 (token, layer, expert) entries
        ("MAX_ENTRIES", 8, _records(), None),
        ("MAX_ENTRIES", 9, _records(), None),
        ("MAX_ENTRIES", 7, _records(), "line 4"),
        # layers 0 and 1
        ("MAX_LAYERS", 2, _records(), None),
        ("MAX_LAYERS", 3, _records(), None),
        ("MAX_LAYERS", 1, _records(), "line 2.layer"),
        # top-2
        ("MAX_TOP_K", 2, _records(), None),
        ("MAX_TOP_K", 3, _records(), None),
        ("MAX_TOP_K", 1, _records(), "line 1.experts"),
        # expert ids up to 3
        ("MAX_EXPERTS", 4, _records(), None),
        ("MAX_EXPERTS", 5, _records(), None),
        ("MAX_EXPERTS", 3, _records(first=2), "line 1.experts"),
    ],
)
def test_jsonl_caps_at_their_exact_values(tmp_path, monkeypatch, cap, value, records, field):
    from fsedp.trace import io as trace_io

    monkeypatch.setattr(trace_io, cap, value)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    if field is None:
        trace = trace_io.load_jsonl(path)
        assert (trace.tokens, trace.layers, trace.top_k) == (2, 2, 2)
    else:
        with pytest.raises(InputError) as e:
            trace_io.load_jsonl(path)
        assert e.value.field == field, e.value


@pytest.mark.parametrize("length,ok", [(63, True), (64, True), (65, False)])
def test_jsonl_line_cap_at_its_exact_value(tmp_path, monkeypatch, length, ok):
    """A line of ``MAX_LINE`` characters (its newline included) is read; one more is
    refused before more of it is read."""
    from fsedp.trace import io as trace_io

    monkeypatch.setattr(trace_io, "MAX_LINE", 64)
    recs = _records(tokens=1, layers=1)
    line = json.dumps(recs[0])
    line = line[:-1] + " " * (length - len(line) - 1) + "}\n"
    assert len(line) == length
    path = tmp_path / "t.jsonl"
    path.write_text(line)
    if ok:
        assert trace_io.load_jsonl(path).tokens == 1
    else:
        with pytest.raises(InputError, match="longer than 64 characters") as e:
            trace_io.load_jsonl(path)
        assert e.value.field == "line 1"
