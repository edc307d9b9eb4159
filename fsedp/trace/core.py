"""Routing traces: which experts each token activates at each MoE layer.

A :class:`RoutingTrace` holds, for ``tokens`` tokens and ``layers`` MoE layers, the top-k
expert ids of every token (plus optional gate scores and vocabulary ids) and, per token, the
request (sequence) it belongs to and its position in that request.  Traces come from

* :func:`load_flame` -- the real FLAME-MoE-290M routing excerpt (npz, see
  the README of the shared data folder; never a default input of the product),
* :func:`synthetic` -- a seeded, long-tailed generator.

and are consumed iteration by iteration: :func:`iteration_windows` cuts a trace into
iterations of consecutive tokens, :func:`shard` places each token on a chiplet, and
:func:`gate_records` turns one MoE layer of one iteration into the
``(request_slot, chiplet, expert)`` records that fill the scheduler's EIT
(:class:`fsedp.sw.eit.GateRecord` takes the same three fields in the same order).
"""

import math
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fsedp import files
from fsedp.config import ModelConfig
from fsedp.errors import InputError
from fsedp.fields import specs

__all__ = [
    "RoutingTrace",
    "load_flame",
    "synthetic",
    "subset",
    "iteration_windows",
    "expert_counts",
    "shard",
    "dense_request_slots",
    "gate_records",
    "pair_counts",
    "MAX_EXPERTS",
    "MAX_TOP_K",
    "MAX_LAYERS",
    "MAX_ENTRIES",
    "experts_shape_problem",
    "NpzReader",
    "TRACE_MEMBER_BYTES",
    "read_npy_header",
]

_MODEL = specs(ModelConfig)
#: Most routed experts per layer of a trace (expert ids 0..4095): the most ``model.experts``
#: a run config takes (declared once, by :class:`fsedp.config.ModelConfig`).
MAX_EXPERTS = int(_MODEL["experts"].hi)
#: Most experts per token and layer (top-k) of a trace: the most ``model.top_k`` a run
#: config takes.
MAX_TOP_K = int(_MODEL["top_k"].hi)
#: Most MoE layers of a trace: the most ``model.layers`` a run config takes.
MAX_LAYERS = int(_MODEL["layers"].hi)
#: Most ``tokens x layers x top_k`` entries a trace *file* may declare (2**24: a million
#: tokens of a 16-layer top-1 model, 65,536 tokens of 32 layers at top-8).  Every importer
#: checks it, with :data:`MAX_LAYERS` and :data:`MAX_TOP_K`, on the declared shape before
#: any of the data is read, so that no file, however small, makes a reader allocate more
#: than about 2**24 values per array.
MAX_ENTRIES = 1 << 24
#: Expansion a deflated zip member cannot exceed (deflate's limit is about 1032:1): a member
#: that declares more is a zip bomb or a lie, and is refused before it is decompressed.
DEFLATE_MAX_RATIO = 1032
#: Bytes read from a zip member at a time.
_CHUNK = 1 << 22


@dataclass
class RoutingTrace:
    """Per-token routing of a MoE model.

    Parameters
    ----------
    experts : numpy.ndarray
        int16 ``[tokens, layers, k]``: the top-k expert ids of every token at every MoE
        layer, ``0 <= id < num_experts``, distinct within a token and layer; at most
        :data:`MAX_LAYERS` layers and :data:`MAX_TOP_K` experts per token.
    scores : numpy.ndarray or None
        float32 ``[tokens, layers, k]``: gate scores of those experts (finite, within
        float32), if known.
    token_ids : numpy.ndarray or None
        int32 ``[tokens]``: vocabulary ids (``>= 0``), if known.
    request : numpy.ndarray
        int32 ``[tokens]``: request (sequence) id of every token, ``>= 0``.
    position : numpy.ndarray
        int32 ``[tokens]``: position of every token in its request, ``>= 0``.
    num_experts : int
        Routed experts per layer ``E`` (1 .. :data:`MAX_EXPERTS`).
    name : str
        Used as the ``file`` of a :class:`InputError`.

    Notes
    -----
    ``__post_init__`` converts the arrays to the dtypes above (after checking that the
    values fit, so that no conversion overflows or warns) and raises :class:`InputError` on
    a bad shape or value.  It does not cap the token count (traces made in memory, such as
    :func:`synthetic` ones, may be long); the file importers cap it with
    :data:`MAX_ENTRIES` before they read anything.
    """

    experts: np.ndarray
    scores: np.ndarray | None
    token_ids: np.ndarray | None
    request: np.ndarray
    position: np.ndarray
    num_experts: int
    name: str = "trace"

    def __post_init__(self):
        name = self.name

        def fail(field, reason):
            raise InputError(name, field, reason)

        ne = self.num_experts
        if (
            isinstance(ne, bool)
            or not isinstance(ne, (int, np.integer))
            or not 1 <= ne <= MAX_EXPERTS
        ):
            fail("num_experts", f"must be an integer in 1..{MAX_EXPERTS}, not {ne!r}")
        self.num_experts = ne = int(ne)

        e = np.asarray(self.experts)
        if e.ndim == 3 and not np.issubdtype(e.dtype, np.integer):
            fail("experts", f"must hold integers, not {e.dtype}")
        why = experts_shape_problem(e.shape, ne, entries=None)
        if why:
            fail("experts", why)
        t, layers, k = e.shape
        if e.size:
            lo, hi = int(e.min()), int(e.max())
            if lo < 0 or hi >= ne:
                fail("experts", f"expert ids must be in 0..{ne - 1}, found {lo}..{hi}")
        e16 = e.astype(np.int16, copy=False)
        if isinstance(e16, np.memmap) or not e16.flags.writeable:
            e16 = np.array(e16)  # an array of its own, not a view of a file
        if k > 1:
            # in slices of tokens: the sort's copy stays small whatever the trace's length
            step = max(1, _CHUNK // (layers * k))
            for a in range(0, t, step):
                s = np.sort(e16[a : a + step], axis=-1)
                dup = np.argwhere((s[..., 1:] == s[..., :-1]).any(axis=-1))
                if len(dup):
                    tok, lay = (int(x) for x in dup[0])
                    tok += a
                    fail(
                        "experts",
                        f"token {tok} layer {lay} repeats an expert: {e16[tok, lay].tolist()}",
                    )
        self.experts = e16

        if self.scores is not None:
            sc = np.asarray(self.scores)
            if sc.shape != e.shape:
                fail("scores", f"shape {sc.shape} differs from experts {e.shape}")
            if not (np.issubdtype(sc.dtype, np.floating) or np.issubdtype(sc.dtype, np.integer)):
                fail("scores", f"must hold numbers, not {sc.dtype}")
            if np.issubdtype(sc.dtype, np.floating) and sc.size:
                # checked in the stored dtype: a cast of a value beyond float32 would warn
                if not np.isfinite(sc).all():
                    fail("scores", "must be finite")
                big = float(np.finfo(np.float32).max)
                lo, hi = sc.min(), sc.max()
                if lo < -big or hi > big:
                    fail(
                        "scores",
                        f"must fit float32 (|score| <= {big:.4g}), found {lo:.4g}..{hi:.4g}",
                    )
            self.scores = sc.astype(np.float32, copy=False)

        def vector(field, v, lo):
            v = np.asarray(v)
            if v.shape != (t,):
                fail(field, f"must have shape ({t},) (one per token), not {v.shape}")
            if not np.issubdtype(v.dtype, np.integer):
                fail(field, f"must hold integers, not {v.dtype}")
            if t and int(v.min()) < lo:
                fail(field, f"must be >= {lo}, found {int(v.min())}")
            if t and int(v.max()) > np.iinfo(np.int32).max:
                fail(field, "does not fit int32")
            return v.astype(np.int32, copy=False)

        if self.token_ids is not None:
            self.token_ids = vector("token_ids", self.token_ids, 0)
        self.request = vector("request", self.request, 0)
        self.position = vector("position", self.position, 0)

    @property
    def tokens(self) -> int:
        """Number of tokens."""
        return self.experts.shape[0]

    @property
    def layers(self) -> int:
        """Number of MoE layers."""
        return self.experts.shape[1]

    @property
    def top_k(self) -> int:
        """Experts activated per token and layer."""
        return self.experts.shape[2]

    def __len__(self) -> int:
        return self.tokens


# -- bounded readers -------------------------------------------------------------------


def experts_shape_problem(shape, num_experts=None, entries=MAX_ENTRIES) -> str | None:
    """Why ``shape`` cannot be the ``experts [tokens, layers, k]`` of a trace, or ``None``:
    3-D, 1..:data:`MAX_LAYERS` layers, 1..:data:`MAX_TOP_K` (and at most ``num_experts``)
    experts per token, and at most ``entries`` values in all (``None``: no cap).  The
    importers check it on a file's declared shape before they read the array."""
    shape = tuple(int(x) for x in shape)
    if len(shape) != 3:
        return f"must be 3-D [tokens, layers, k], not shape {shape}"
    t, layers, k = shape
    if layers < 1 or k < 1:
        return f"needs at least one layer and one expert per token, shape {shape}"
    if layers > MAX_LAYERS:
        return f"{layers} layers (shape {shape}); a trace has at most {MAX_LAYERS}"
    if k > MAX_TOP_K:
        return f"top-k = {k} (shape {shape}); a trace has at most {MAX_TOP_K} experts per token"
    if num_experts is not None and k > num_experts:
        return f"top-k = {k} exceeds num_experts = {num_experts}"
    if entries is not None and t * layers * k > entries:
        return (
            f"shape {shape} is {t * layers * k} (token, layer, expert) entries; a trace file "
            f"holds at most {entries}"
        )
    return None


def read_npy_header(f, file: str, field: str) -> tuple[tuple, np.dtype, bool, int]:
    """``(shape, dtype, fortran_order, count)`` of the ``.npy`` whose header starts at the
    current position of the binary stream ``f`` (left just after the header), or an
    :class:`InputError` naming ``file`` and ``field``: a header that is not ``.npy`` version
    1 or 2 (longer than numpy's 10,000-byte limit included), or a dtype that is not plain
    numbers or text (Python objects, i.e. a pickle; records; sub-arrays)."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f".npy format version {version[0]}.{version[1]} is not read here")
    except Exception as e:  # ValueError, EOFError, zlib and zip errors of a corrupt member
        raise InputError(
            file, field, f"not a readable .npy array: {type(e).__name__}: {e}"
        ) from None
    if dtype.hasobject:
        raise InputError(file, field, "holds Python objects (a pickle); not read")
    if dtype.names is not None or dtype.subdtype is not None or dtype.kind not in "biufcUS":
        raise InputError(file, field, f"dtype {dtype} is not plain numbers or text")
    return tuple(shape), dtype, bool(fortran), math.prod(shape)


class NpzReader:
    """The arrays of a user's ``.npz``, each checked before it is decompressed and read only
    when asked for (what :func:`numpy.load` does not promise: it reads a member whole,
    whatever it declares).

    On opening, every member of the zip (used or not) is refused when it is encrypted,
    compressed with another method than stored or deflated (numpy writes no other), larger
    uncompressed than ``max_member_bytes``, or declares more than deflate can expand
    (:data:`DEFLATE_MAX_RATIO` times its compressed size: a zip bomb).  :meth:`header`
    reads only a member's ``.npy`` header (dtype checked by :func:`read_npy_header`; its
    shape must account for the member's size exactly); :meth:`array` reads the data, after
    the caller has checked that shape, in slices, with the zip's CRC checked at the end.
    Every problem is an :class:`InputError` naming the file and the array (``<file>`` when
    the file is not a readable zip).  Use it as a context manager."""

    def __init__(self, path, max_member_bytes: int, what: str = "an array of this file"):
        self.file = file = str(path)
        self.max_member_bytes = int(max_member_bytes)
        self._headers: dict = {}
        self._fh = fh = files.open_input(path, "trace")
        try:
            self._zip = zipfile.ZipFile(fh)
        except Exception as e:  # BadZipFile, OSError, ValueError, EOFError, ...
            fh.close()
            raise InputError(
                file, "<file>", f"not a readable npz file: {type(e).__name__}: {e}"
            ) from None
        try:
            self.infos: dict[str, zipfile.ZipInfo] = {}
            for info in self._zip.infolist():
                name = info.filename
                key = name[:-4] if name.endswith(".npy") else name
                self._check_info(key, info, what)
                self.infos[key] = info
        except BaseException:
            self.close()
            raise

    def _check_info(self, key: str, info: zipfile.ZipInfo, what: str):
        def fail(reason):
            raise InputError(self.file, key, reason)

        if info.flag_bits & 0x1:
            fail("an encrypted zip member; not read")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            fail(
                f"compressed with zip method {info.compress_type}; only stored and deflated "
                "members (what numpy writes) are read"
            )
        if info.file_size > self.max_member_bytes:
            fail(
                f"declares {info.file_size} bytes uncompressed; {what} holds at most "
                f"{self.max_member_bytes}"
            )
        if info.file_size > DEFLATE_MAX_RATIO * info.compress_size + 1024:
            fail(
                f"declares {info.file_size} bytes from {info.compress_size} compressed bytes, "
                f"more than deflate expands ({DEFLATE_MAX_RATIO}:1): a zip bomb"
            )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._zip.close()
        self._fh.close()  # a ZipFile given a file object leaves it open

    @property
    def keys(self) -> list[str]:
        """The names of the arrays (members without their ``.npy``), in file order."""
        return list(self.infos)

    def __contains__(self, key) -> bool:
        return key in self.infos

    def header(self, key: str) -> tuple[tuple, np.dtype]:
        """``(shape, dtype)`` of the array ``key`` (only its header is decompressed)."""
        if key not in self._headers:
            info = self.infos[key]
            with self._zip.open(info) as f:
                shape, dtype, fortran, count = read_npy_header(f, self.file, key)
                offset = f.tell()
            nbytes = count * dtype.itemsize
            if offset + nbytes != info.file_size:
                raise InputError(
                    self.file,
                    key,
                    f"declares shape {shape} of {dtype} ({nbytes} bytes) but the member holds "
                    f"{info.file_size - offset} bytes of data",
                )
            self._headers[key] = (shape, dtype, fortran, count)
        shape, dtype, _, _ = self._headers[key]
        return shape, dtype

    def array(self, key: str, max_values: int | None = None) -> np.ndarray:
        """The array ``key`` (its size was bounded on opening; ``max_values`` bounds its
        number of values further, checked on the header before any data is read)."""
        shape, dtype = self.header(key)
        _, _, fortran, count = self._headers[key]
        if max_values is not None and count > max_values:
            raise InputError(
                self.file, key, f"declares shape {shape} ({count} values); at most {max_values}"
            )
        out = np.empty(count, dtype=dtype)
        nbytes = count * dtype.itemsize
        try:
            with self._zip.open(self.infos[key]) as f:
                read_npy_header(f, self.file, key)
                if nbytes:
                    view = memoryview(out.view(np.uint8))
                    pos = 0
                    while pos < nbytes:
                        n = f.readinto(view[pos : pos + _CHUNK])
                        if not n:
                            raise EOFError(f"the data ends after {pos} of {nbytes} bytes")
                        pos += n
                f.read(1)  # the end of the member: the zip's CRC is checked here
        except InputError:
            raise
        except Exception as e:  # BadZipFile (CRC), zlib.error, EOFError, OSError
            raise InputError(self.file, key, f"cannot read: {type(e).__name__}: {e}") from None
        if fortran:
            return out.reshape(shape[::-1]).transpose()
        return out.reshape(shape)

    def small(self, key: str, max_values: int = 64, max_itemsize: int = 4096) -> np.ndarray:
        """A scalar-like array (a format tag, a count, a JSON string): at most
        ``max_values`` values of at most ``max_itemsize`` bytes each, checked first."""
        shape, dtype = self.header(key)
        if dtype.itemsize > max_itemsize:
            raise InputError(
                self.file, key, f"dtype {dtype} is wider than {max_itemsize} bytes a value"
            )
        return self.array(key, max_values)


#: Largest member of a trace ``.npz`` (``experts`` or ``scores`` of :data:`MAX_ENTRIES`
#: 8-byte values, and its header): anything larger is refused from the zip's directory.
TRACE_MEMBER_BYTES = MAX_ENTRIES * 8 + (1 << 16)


def _int_value(z: NpzReader, key: str, what: str = "a positive integer scalar") -> int:
    """A one-value integer array ``key`` of ``z``, ``>= 1``."""
    shape, dtype = z.header(key)
    if math.prod(shape) != 1 or dtype.kind not in "iu":
        raise InputError(z.file, key, f"must be {what}, not {dtype} shape {shape}")
    v = int(z.array(key).reshape(()))
    if v < 1:
        raise InputError(z.file, key, f"must be {what}, not {v}")
    return v


# -- FLAME-MoE npz ------------------------------------------------------------------------


def load_flame(path, part: str = "prefill") -> RoutingTrace:
    """Load the FLAME-MoE routing excerpt (``flame-moe-290m.npz``).

    Parameters
    ----------
    path : str or os.PathLike
        The npz file (arrays described in the README of the shared data folder).
    part : {"prefill", "decode"}
        ``"prefill"``: ``prefill_topk_experts [N, L, k]`` with N = sequences x
        ``prefill_sequence_length`` tokens stored sequence-major; token ``i`` belongs to
        request ``i // prefill_sequence_length`` at position ``i % prefill_sequence_length``.
        ``"decode"``: ``decode_topk_experts [S, P, L, k]`` flattened sequence-major into
        ``S * P`` tokens; token ``s * P + p`` belongs to request ``s`` at position ``p``.
        (For a decode-like order -- one token of every sequence per step -- reorder with
        ``subset(trace, np.lexsort((trace.request, trace.position)))``.)

    Returns
    -------
    RoutingTrace
        With scores and token ids; ``name`` is ``"<file stem>:<part>"``.

    Raises
    ------
    InputError
        Unreadable file (field ``<file>``), or a missing or malformed array (field = the
        array's name).  Arrays are read through :class:`NpzReader`: shapes are checked
        (:func:`experts_shape_problem`, :data:`MAX_ENTRIES`) before any data is read, and
        arrays the part does not use are never decompressed.
    """
    file = str(path)
    if part not in ("prefill", "decode"):
        raise InputError(file, "part", f"must be 'prefill' or 'decode', not {part!r}")
    with NpzReader(path, TRACE_MEMBER_BYTES, "an array of a trace file") as z:
        return _flame(z, file, part)


def _flame(z: NpzReader, file: str, part: str) -> RoutingTrace:
    def need(key):
        if key not in z:
            raise InputError(
                file, key, f"missing array (the file has: {', '.join(sorted(z.keys)) or 'none'})"
            )
        return z.header(key)

    need("num_experts")
    num_experts = _int_value(z, "num_experts")
    if num_experts > MAX_EXPERTS:
        raise InputError(file, "num_experts", f"must be in 1..{MAX_EXPERTS}, not {num_experts}")
    ekey, skey, tkey = f"{part}_topk_experts", f"{part}_topk_scores", f"{part}_token_ids"
    eshape, edtype = need(ekey)
    sshape, _ = need(skey)
    tshape, _ = need(tkey)

    def experts_shape(shape):
        why = experts_shape_problem(shape, num_experts)
        if why:
            raise InputError(file, ekey, why)

    if part == "prefill":
        if len(eshape) != 3:
            raise InputError(file, ekey, f"must be 3-D [tokens, layers, k], not shape {eshape}")
        experts_shape(eshape)
        n = eshape[0]
        need("prefill_sequence_length")
        seq_len = _int_value(z, "prefill_sequence_length")
        if n % seq_len:
            raise InputError(
                file,
                "prefill_sequence_length",
                f"{seq_len} does not divide the {n} tokens of {ekey}",
            )
        if tshape != (n,):
            raise InputError(file, tkey, f"must have shape ({n},), not {tshape}")
    else:
        if len(eshape) != 4:
            raise InputError(
                file, ekey, f"must be 4-D [sequences, positions, layers, k], not shape {eshape}"
            )
        s, p = eshape[:2]
        experts_shape((s * p, *eshape[2:]))
        if tshape != (s, p):
            raise InputError(file, tkey, f"must have shape ({s}, {p}), not {tshape}")
    if sshape != eshape:
        raise InputError(file, skey, f"shape {sshape} differs from {ekey} {eshape}")
    if "top_k" in z:
        k = _int_value(z, "top_k")
        if k != eshape[-1]:
            raise InputError(
                file, "top_k", f"{k} differs from the last axis of {ekey} ({eshape[-1]})"
            )

    experts, scores, token_ids = z.array(ekey), z.array(skey), z.array(tkey)
    if part == "prefill":
        idx = np.arange(n)
        request, position = idx // seq_len, idx % seq_len
    else:
        experts = experts.reshape(s * p, *eshape[2:])
        scores = scores.reshape(s * p, *eshape[2:])
        token_ids = token_ids.reshape(s * p)
        request = np.repeat(np.arange(s), p)
        position = np.tile(np.arange(p), s)

    rename = {"experts": ekey, "scores": skey, "token_ids": tkey, "num_experts": "num_experts"}
    try:
        return RoutingTrace(
            experts=experts,
            scores=scores,
            token_ids=token_ids,
            request=request,
            position=position,
            num_experts=num_experts,
            name=f"{Path(file).stem}:{part}",
        )
    except InputError as e:
        raise InputError(file, rename.get(e.field, e.field), e.reason) from None


# -- synthetic ----------------------------------------------------------------------------


def synthetic(
    num_experts: int,
    top_k: int,
    tokens: int,
    layers: int = 1,
    seed: int = 0,
    skew: float = 1.1,
    requests: int | None = None,
) -> RoutingTrace:
    """A seeded synthetic routing trace with a long-tailed expert popularity.

    At every layer the experts are put in a random order (a permutation drawn from the
    seeded generator) and the expert of rank ``r`` gets the popularity weight
    ``1 / (r + 1) ** skew`` (Zipf-like; ``skew = 0`` is uniform).  Every token draws
    ``top_k`` *distinct* experts without replacement, each draw proportional to the weights
    of the experts not yet drawn (Plackett-Luce sampling, done with the Gumbel-top-k trick);
    ``experts[t, l]`` lists them in draw order.

    Tokens are grouped into ``requests`` contiguous blocks of (nearly) equal size: token
    ``i`` belongs to request ``i * requests // tokens`` and its position is its index within
    the block.

    Long tail.  Because few tokens are spread over many experts, the fraction of experts
    that receive fewer than 2 tokens in a layer grows as the token count shrinks -- the
    long-tail effect of the paper's Figure 2.  With 128 experts, top-8 and ``skew = 1.1``
    (the default run) it is roughly 0.8 at 16 tokens and near 0 at 1024 tokens
    (``tests/test_trace.py`` checks that it decreases monotonically over 16, 64, 256, 1024).

    Parameters
    ----------
    num_experts : int
        Experts per layer ``E`` (1 .. :data:`MAX_EXPERTS`).
    top_k : int
        Experts per token, ``1 <= top_k <= num_experts`` (and :data:`MAX_TOP_K`).
    tokens : int
        Number of tokens (``>= 0``).
    layers : int, default 1
        MoE layers (1 .. :data:`MAX_LAYERS`); each has its own popularity order.
    seed : int, default 0
        Seed of :func:`numpy.random.default_rng`; equal arguments give equal traces.
    skew : float, default 1.1
        Zipf exponent of the popularity (``>= 0``).
    requests : int, optional
        Number of requests, ``1 <= requests <= max(tokens, 1)``; default
        ``max(1, tokens // 16)``.

    Returns
    -------
    RoutingTrace
        Without scores or token ids; ``name`` is ``"synthetic"``.

    Raises
    ------
    InputError
        On an out-of-range argument (``file`` is ``"synthetic"``).
    """
    src = "synthetic"

    def need_int(field, v, lo, hi=None):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise InputError(src, field, f"must be an integer, not {v!r}")
        if v < lo or (hi is not None and v > hi):
            rng_txt = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise InputError(src, field, f"must be {rng_txt}, not {v}")
        return int(v)

    num_experts = need_int("num_experts", num_experts, 1, MAX_EXPERTS)
    top_k = need_int("top_k", top_k, 1, min(num_experts, MAX_TOP_K))
    tokens = need_int("tokens", tokens, 0)
    layers = need_int("layers", layers, 1, MAX_LAYERS)
    if requests is None:
        requests = max(1, tokens // 16)
    requests = need_int("requests", requests, 1, max(tokens, 1))
    try:
        skew = float(skew)
    except (TypeError, ValueError):
        raise InputError(src, "skew", f"must be a number, not {skew!r}") from None
    if not np.isfinite(skew) or skew < 0:
        raise InputError(src, "skew", f"must be finite and >= 0, not {skew}")

    rng = np.random.default_rng(seed)
    rank_weight = 1.0 / np.arange(1, num_experts + 1, dtype=np.float64) ** skew
    experts = np.empty((tokens, layers, top_k), dtype=np.int16)
    # the Gumbel keys [tokens, E] are drawn in slices of tokens (the same numbers as one
    # draw, in the same order), so memory does not grow with tokens x experts
    step = max(1, _CHUNK // num_experts)
    for layer in range(layers):
        perm = rng.permutation(num_experts)
        logw = np.empty(num_experts)
        logw[perm] = np.log(rank_weight)
        for a in range(0, tokens, step):
            n = min(step, tokens - a)
            keys = logw + rng.gumbel(size=(n, num_experts))
            top = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
            order = np.argsort(-np.take_along_axis(keys, top, axis=1), axis=1, kind="stable")
            experts[a : a + n, layer, :] = np.take_along_axis(top, order, axis=1)

    idx = np.arange(tokens)
    request = idx * requests // max(tokens, 1)
    starts = np.searchsorted(request, np.arange(requests))
    position = idx - starts[request] if tokens else idx
    return RoutingTrace(
        experts=experts,
        scores=None,
        token_ids=None,
        request=request,
        position=position,
        num_experts=num_experts,
        name=src,
    )


# -- slicing ------------------------------------------------------------------------------


def subset(trace: RoutingTrace, index, name: str | None = None) -> RoutingTrace:
    """The tokens ``index`` of ``trace`` (a slice, an index array or a boolean mask).

    Parameters
    ----------
    trace : RoutingTrace
    index : slice or array_like
        Selects tokens (axis 0 of every per-token array), in the given order.
    name : str, optional
        Name of the result; default ``trace.name``.

    Returns
    -------
    RoutingTrace
    """
    return RoutingTrace(
        experts=trace.experts[index],
        scores=None if trace.scores is None else trace.scores[index],
        token_ids=None if trace.token_ids is None else trace.token_ids[index],
        request=trace.request[index],
        position=trace.position[index],
        num_experts=trace.num_experts,
        name=trace.name if name is None else name,
    )


def iteration_windows(
    trace: RoutingTrace, tokens_per_iteration: int, drop_last: bool = False
) -> Iterator[RoutingTrace]:
    """Cut a trace into iterations of consecutive tokens.

    Parameters
    ----------
    trace : RoutingTrace
    tokens_per_iteration : int
        Tokens per window (``>= 1``).
    drop_last : bool, default False
        Leave out a last window shorter than ``tokens_per_iteration`` (by default it is
        yielded).

    Yields
    ------
    RoutingTrace
        Tokens ``[i * n, (i + 1) * n)`` of ``trace``, named ``"{name}[a:b]"``; request ids
        and positions are kept as they are in ``trace``.
    """
    n = tokens_per_iteration
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(
            trace.name, "tokens_per_iteration", f"must be a positive integer, not {n!r}"
        )
    n = int(n)
    for a in range(0, trace.tokens, n):
        b = min(a + n, trace.tokens)
        if b - a < n and drop_last:
            return
        yield subset(trace, slice(a, b), name=f"{trace.name}[{a}:{b}]")


def expert_counts(trace: RoutingTrace, layer: int | None = None) -> np.ndarray:
    """Tokens per expert.

    Parameters
    ----------
    trace : RoutingTrace
    layer : int, optional
        One MoE layer; by default all of them.

    Returns
    -------
    numpy.ndarray
        int64 ``[num_experts]`` for one layer, ``[layers, num_experts]`` otherwise.
        (A token counts once per expert, since its top-k experts are distinct.)
    """
    e = trace.num_experts
    if layer is not None:
        _check_layer(trace, layer)
        return np.bincount(trace.experts[:, layer, :].ravel(), minlength=e).astype(np.int64)
    return np.stack(
        [np.bincount(trace.experts[:, l, :].ravel(), minlength=e) for l in range(trace.layers)]
    ).astype(np.int64)


def _check_layer(trace, layer):
    if (
        isinstance(layer, bool)
        or not isinstance(layer, (int, np.integer))
        or not 0 <= layer < trace.layers
    ):
        raise InputError(trace.name, "layer", f"must be in 0..{trace.layers - 1}, not {layer!r}")


# -- placement and gate records -----------------------------------------------------------


def shard(trace: RoutingTrace, chiplets: int, mode: str = "request") -> np.ndarray:
    """Chiplet that holds each token's activation.

    Parameters
    ----------
    trace : RoutingTrace
    chiplets : int
        Number of chiplets ``C`` (``>= 1``).
    mode : {"request", "token"}
        ``"request"``: all tokens of a request live on chiplet ``request % C`` (requests
        round-robin by id; stable across iterations, so a request's KV cache and deferred
        activations stay where they are).  ``"token"``: token ``i`` of the trace lives on
        chiplet ``i % C`` (tokens round-robin; the even sharding of Figure 3).

    Returns
    -------
    numpy.ndarray
        int64 ``[tokens]`` with values in ``0 .. C-1``.
    """
    if isinstance(chiplets, bool) or not isinstance(chiplets, (int, np.integer)) or chiplets < 1:
        raise InputError(trace.name, "chiplets", f"must be a positive integer, not {chiplets!r}")
    if mode == "request":
        return trace.request.astype(np.int64) % chiplets
    if mode == "token":
        return np.arange(trace.tokens, dtype=np.int64) % chiplets
    raise InputError(trace.name, "mode", f"must be 'request' or 'token', not {mode!r}")


def dense_request_slots(trace: RoutingTrace, table_depth: int) -> dict[int, int]:
    """Map the requests of ``trace`` to request-table slots ``0, 1, ...`` in order of first
    appearance (no two requests share a slot, unlike ``request % table_depth``).

    Parameters
    ----------
    trace : RoutingTrace
        Typically one iteration window.
    table_depth : int
        Request-table depth ``R``.

    Returns
    -------
    dict of int to int
        Request id -> slot.

    Raises
    ------
    InputError
        When the trace has more than ``table_depth`` requests.
    """
    _, first = np.unique(trace.request, return_index=True)
    ids = trace.request[np.sort(first)].tolist()
    if len(ids) > table_depth:
        raise InputError(
            trace.name,
            "request",
            f"{len(ids)} requests do not fit a request table of depth {table_depth}",
        )
    return {int(r): s for s, r in enumerate(ids)}


def gate_records(
    trace: RoutingTrace,
    layer: int,
    chiplet_of_token,
    request_slot: Mapping[int, int] | np.ndarray | None = None,
    *,
    table_depth: int | None = None,
) -> list[tuple[int, int, int]]:
    """Gate records of one MoE layer: what the gate hands the scheduler's EIT.

    Parameters
    ----------
    trace : RoutingTrace
        Usually one iteration window.
    layer : int
        MoE layer index, ``0 .. trace.layers - 1``.
    chiplet_of_token : array_like of int
        ``[tokens]``: the chiplet of each token (see :func:`shard`).
    request_slot : mapping or array_like, optional
        Request id -> request-table slot, as a mapping (e.g. from
        :func:`dense_request_slots`) or an array indexed by request id.  By default the slot
        is ``request % table_depth``, or the request id itself when ``table_depth`` is None.
    table_depth : int, optional
        Request-table depth ``R``.  Used for the default slot mapping and, when given,
        every slot must be in ``0 .. R-1``.

    Returns
    -------
    list of tuple of int
        ``(request_slot, chiplet, expert)`` for every token and each of its top-k experts,
        token-major then in top-k order (``tokens * top_k`` records; the field order of
        :class:`fsedp.sw.eit.GateRecord`).

    Raises
    ------
    InputError
        Bad layer, a ``chiplet_of_token`` of the wrong shape or negative, a request without
        a slot, or a slot outside ``0 .. table_depth - 1``.
    """
    _check_layer(trace, layer)
    t, k = trace.tokens, trace.top_k
    chip = np.asarray(chiplet_of_token)
    if chip.shape != (t,) or (t and not np.issubdtype(chip.dtype, np.integer)):
        raise InputError(
            trace.name,
            "chiplet_of_token",
            f"must be {t} integers (one per token), not {chip.dtype} shape {chip.shape}",
        )
    if t and int(chip.min()) < 0:
        raise InputError(trace.name, "chiplet_of_token", "chiplets must be >= 0")
    if table_depth is not None and (isinstance(table_depth, bool) or table_depth < 1):
        raise InputError(
            trace.name, "table_depth", f"must be a positive integer, not {table_depth!r}"
        )

    req = trace.request.astype(np.int64)
    if request_slot is None:
        slot = req % table_depth if table_depth is not None else req
    elif isinstance(request_slot, Mapping):
        try:
            slot = np.array([request_slot[int(r)] for r in req], dtype=np.int64)
        except KeyError as e:
            raise InputError(
                trace.name, "request_slot", f"no slot for request {e.args[0]}"
            ) from None
    else:
        table = np.asarray(request_slot, dtype=np.int64)
        if t and int(req.max()) >= len(table):
            raise InputError(
                trace.name,
                "request_slot",
                f"no slot for request {int(req.max())} (the table has {len(table)} entries)",
            )
        slot = table[req]
    if table_depth is not None and t and (int(slot.min()) < 0 or int(slot.max()) >= table_depth):
        raise InputError(
            trace.name,
            "request_slot",
            f"slots must be in 0..{table_depth - 1}, found {int(slot.min())}..{int(slot.max())}",
        )

    rs = np.repeat(slot, k).tolist()
    cs = np.repeat(chip.astype(np.int64), k).tolist()
    es = trace.experts[:, layer, :].astype(np.int64).ravel().tolist()
    return list(zip(rs, cs, es))


def pair_counts(
    a: np.ndarray, b: np.ndarray, n: int, other_slots: bool = False, weight=None
) -> np.ndarray:
    """``C [n, n]``: over tokens, ``C[a[t, x], b[t, y]] += w`` for every slot pair ``(x, y)``
    of experts ``a [N, ka]`` and ``b [N, kb]`` (the same token at two layers: transitions;
    the same layer with ``other_slots``: co-activations, ``x != y``).  ``weight(x, y)``
    gives per-token weights ``[N]`` (default 1)."""
    c = np.zeros((n, n))
    for x in range(a.shape[1]):
        for y in range(b.shape[1]):
            if not (other_slots and x == y):
                np.add.at(c, (a[:, x], b[:, y]), 1.0 if weight is None else weight(x, y))
    return c
