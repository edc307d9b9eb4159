"""Routing traces on disk: the project's format, and importers (``fsedp trace convert``).

The project's format (``.npz``, written by :func:`save_trace`, read by :func:`load_trace`)
-----------------------------------------------------------------------------------------
================  ======================  =================================================
array             dtype, shape            meaning
================  ======================  =================================================
``format``        str scalar              ``"fsedp-trace"``
``version``       int scalar              ``1``
``num_experts``   int scalar              routed experts per layer ``E``
``experts``       int16 ``[T, L, k]``     top-k expert ids per token and MoE layer
``scores``        float32 ``[T, L, k]``   router probabilities of those experts (optional)
``token_ids``     int32 ``[T]``           vocabulary ids (optional)
``request``       int32 ``[T]``           request / sequence of each token
``position``      int32 ``[T]``           position of each token in its request
``name``          str scalar              a label
================  ======================  =================================================

Importers (``fmt`` of :func:`load_any`; ``auto`` picks by content):

* ``fsedp``: the format above;
* ``flame``: the FLAME-MoE excerpt (:func:`fsedp.trace.load_flame`, prefill part);
* ``jsonl``: one JSON object per line and (token, layer): ``{"token": int, "layer": int,
  "experts": [ids], "probs": [floats] (optional), "request": int (optional, default 0),
  "position": int (optional, default: order of the tokens), "token_id": int (optional)}``;
  every token must have every layer, all with the same ``k``;
* ``npy``: an integer array ``[tokens, layers, k]`` (one request, positions in order);
* Hugging Face models: :func:`record_hf` (``fsedp trace record``).

Every file is read as hostile, with its sizes bounded before anything is allocated: at most
:data:`~fsedp.trace.core.MAX_EXPERTS` experts (4096, the most a model config takes; the
ids of a file without ``num_experts`` are checked against it before they become the expert
count), :data:`~fsedp.trace.core.MAX_LAYERS` layers, :data:`~fsedp.trace.core.MAX_TOP_K`
experts per token and :data:`~fsedp.trace.core.MAX_ENTRIES` (token, layer, expert) entries;
``.npz`` members are checked on the zip directory and their ``.npy`` headers before they
are decompressed (:class:`~fsedp.trace.core.NpzReader`; an unused member is never read),
an ``.npy`` is checked on its header and then memory-mapped, and JSON lines are bounded
by :data:`MAX_LINE` and :data:`MAX_RECORDS`.  Every problem is one
:class:`~fsedp.errors.InputError` naming the file and the array (or line).
"""

import json
from array import array
from pathlib import Path

import numpy as np

from fsedp import files
from fsedp.errors import InputError
from fsedp.files import atomic_path
from fsedp.trace.core import (
    MAX_ENTRIES,
    MAX_EXPERTS,
    MAX_LAYERS,
    MAX_TOP_K,
    TRACE_MEMBER_BYTES,
    NpzReader,
    RoutingTrace,
    experts_shape_problem,
    load_flame,
    read_npy_header,
)

__all__ = [
    "save_trace",
    "load_trace",
    "load_jsonl",
    "load_npy",
    "load_any",
    "FORMATS",
    "record_hf",
    "MAX_LINE",
    "MAX_RECORDS",
]

FORMATS = ("auto", "fsedp", "flame", "jsonl", "npy")

#: Longest line of a JSON-lines trace (a record is a few hundred bytes).
MAX_LINE = 1 << 16
#: Most records (token, layer) of a JSON-lines trace (each costs about 100 bytes of memory
#: while it is read, so a file of the longest accepted size is read in well under 1 GB).
MAX_RECORDS = 1 << 21
#: Longest text member (``format``, ``name``) of a trace ``.npz``, in characters.
MAX_TEXT = 4096


def save_trace(trace: RoutingTrace, path) -> None:
    arrays = {
        "format": np.asarray("fsedp-trace"),
        "version": np.asarray(1),
        "num_experts": np.asarray(trace.num_experts),
        "experts": trace.experts,
        "request": trace.request,
        "position": trace.position,
        "name": np.asarray(trace.name),
    }
    if trace.scores is not None:
        arrays["scores"] = trace.scores
    if trace.token_ids is not None:
        arrays["token_ids"] = trace.token_ids
    with atomic_path(path, suffix=".npz") as tmp:
        np.savez_compressed(tmp, **arrays)


def _reader(path) -> NpzReader:
    """A trace ``.npz`` opened for bounded reading (:class:`~fsedp.trace.core.NpzReader`):
    no member larger than :data:`~fsedp.trace.core.TRACE_MEMBER_BYTES` or bigger than
    deflate can expand, whether used or not."""
    return NpzReader(path, TRACE_MEMBER_BYTES, "an array of a trace file")


def load_trace(path) -> RoutingTrace:
    """A trace in the project's format.  Every array is checked on its ``.npy`` header
    (dtype, shape against ``experts`` and the caps of
    :func:`~fsedp.trace.core.experts_shape_problem`) before its data is read; ``name`` is
    never read."""
    file = str(path)
    with _reader(path) as z:
        fmt = z.small("format", 1, 4 * MAX_TEXT) if "format" in z else None
        if fmt is None or str(fmt.reshape(())) != "fsedp-trace":
            raise InputError(file, "format", "not an fsedp trace (expected format = 'fsedp-trace')")
        version = z.small("version", 1).item() if "version" in z else None
        if version != 1 or isinstance(version, (str, bytes, bool)):
            raise InputError(file, "version", f"unsupported version {version!r} (this reader: 1)")
        for key in ("num_experts", "experts", "request", "position"):
            if key not in z:
                raise InputError(file, key, "missing array")
        ne = _int_scalar(file, z.small("num_experts", 1, 16))
        if not 1 <= ne <= MAX_EXPERTS:
            raise InputError(file, "num_experts", f"must be in 1..{MAX_EXPERTS}, not {ne}")
        shape, dtype = z.header("experts")
        if len(shape) == 3 and dtype.kind not in "iu":
            raise InputError(file, "experts", f"must hold integers, not {dtype}")
        why = experts_shape_problem(shape, ne)
        if why:
            raise InputError(file, "experts", why)
        t = shape[0]
        want = {"scores": shape, "token_ids": (t,), "request": (t,), "position": (t,)}
        for key, expect in want.items():
            if key in z and z.header(key)[0] != expect:
                got = z.header(key)[0]
                if key == "scores":
                    raise InputError(file, key, f"shape {got} differs from experts {shape}")
                raise InputError(file, key, f"must have shape {expect} (one per token), not {got}")
        a = {key: z.array(key) for key in ("experts", *want) if key in z}
    return RoutingTrace(
        experts=a["experts"],
        scores=a.get("scores"),
        token_ids=a.get("token_ids"),
        request=a["request"],
        position=a["position"],
        num_experts=ne,
        name=file,
    )


def _lines(fh, file: str):
    """The lines of a text file, each at most :data:`MAX_LINE` characters (a longer one is
    refused before more of it is read); bytes that are not UTF-8 are an error naming the
    line."""
    n = 0
    while True:
        try:
            line = fh.readline(MAX_LINE + 1)
        except UnicodeDecodeError as e:
            raise InputError(file, f"line {n + 1}", f"not UTF-8 text (byte {e.start})") from None
        if not line:
            return
        n += 1
        if len(line) > MAX_LINE:
            raise InputError(
                file,
                f"line {n}",
                f"longer than {MAX_LINE} characters; a record is a few hundred bytes",
            )
        yield line


def _int_scalar(file: str, v) -> int:
    """An integer stored as a one-value integer array (``num_experts``)."""
    v = np.asarray(v)
    if v.size != 1 or v.ndim != 0 or v.dtype.kind not in "iu":
        raise InputError(
            file, "num_experts", f"must be an integer scalar, not {v.dtype} of shape {v.shape}"
        )
    return int(v)


def _check_num_experts(file: str, ne) -> None:
    """A given expert count (``--num-experts``) is checked before the file is read."""
    if ne is not None and (
        isinstance(ne, bool) or not isinstance(ne, (int, np.integer)) or not 1 <= ne <= MAX_EXPERTS
    ):
        raise InputError(file, "num_experts", f"must be an integer in 1..{MAX_EXPERTS}, not {ne!r}")


def _is_int(x) -> bool:
    """A JSON integer within int64 (``true``/``false`` are not integers)."""
    return isinstance(x, int) and not isinstance(x, bool) and -(2**63) <= x < 2**63


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) < 1e300


def load_jsonl(path, num_experts: int | None = None) -> RoutingTrace:
    """A JSON-lines trace (see the module's documentation).

    Bounds, checked as the file is read: lines of at most :data:`MAX_LINE` characters, at
    most :data:`MAX_RECORDS` records, each a JSON object whose values are integers, numbers
    or flat lists of them (JSON nested past the parser's recursion limit is refused as well);
    ``token < MAX_ENTRIES``, ``layer < MAX_LAYERS``, 1..``MAX_TOP_K`` expert ids in
    0..``MAX_EXPERTS - 1``.  The records are kept in flat arrays, and the trace's arrays are
    made only once the records are known to fill every (token, layer) exactly once."""
    file = str(path)
    tok_a, lay_a, line_a = array("q"), array("q"), array("q")
    ex_a, pr_a = array("h"), array("d")  # expert ids are < MAX_EXPERTS
    meta_a = array("q")  # request, position, token_id per record
    has_a = array("b")  # bit 0: probs, bit 1: position, bit 2: token_id
    k = None
    _check_num_experts(file, num_experts)
    fh = files.open_input(path, "trace", text=True)
    with fh:
        for n, line in enumerate(_lines(fh, file), 1):
            if not line.strip():
                continue
            where = f"line {n}"
            if len(tok_a) >= MAX_RECORDS:
                raise InputError(file, where, f"more than {MAX_RECORDS} records")
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(file, where, f"not JSON: {e.msg}") from None
            except (RecursionError, ValueError) as e:
                raise InputError(file, where, f"not a record: {type(e).__name__}") from None
            if not isinstance(rec, dict):
                raise InputError(file, where, "must be a JSON object")
            for key in ("token", "layer", "experts"):
                if key not in rec:
                    raise InputError(file, f"{where}.{key}", "missing")
            tok, lay, ex = rec["token"], rec["layer"], rec["experts"]
            if not (_is_int(tok) and _is_int(lay)) or tok < 0 or lay < 0:
                raise InputError(file, f"{where}.token", "token and layer must be integers >= 0")
            if tok >= MAX_ENTRIES:
                raise InputError(file, f"{where}.token", f"must be < {MAX_ENTRIES}, not {tok}")
            if lay >= MAX_LAYERS:
                raise InputError(
                    file, f"{where}.layer", f"must be < {MAX_LAYERS} (a trace's most layers)"
                )
            if not isinstance(ex, list) or not ex or not all(_is_int(x) for x in ex):
                raise InputError(file, f"{where}.experts", "must be a non-empty list of integers")
            if len(ex) > MAX_TOP_K or not all(0 <= x < MAX_EXPERTS for x in ex):
                raise InputError(
                    file,
                    f"{where}.experts",
                    f"must be 1..{MAX_TOP_K} expert ids in 0..{MAX_EXPERTS - 1}",
                )
            if k is None:
                k = len(ex)
            elif len(ex) != k:
                raise InputError(
                    file,
                    "experts",
                    f"{where}: token {tok} layer {lay} has {len(ex)} experts, others {k}",
                )
            probs = rec.get("probs")
            if probs is not None and (
                not isinstance(probs, list)
                or len(probs) != len(ex)
                or not all(_is_num(x) for x in probs)
            ):
                raise InputError(
                    file, f"{where}.probs", "must be a list of numbers as long as experts"
                )
            m = (rec.get("request", 0), rec.get("position"), rec.get("token_id"))
            if not _is_int(m[0]) or not all(x is None or _is_int(x) for x in m[1:]):
                raise InputError(file, where, "request, position and token_id must be integers")
            if len(ex_a) + k > MAX_ENTRIES:
                raise InputError(
                    file, where, f"more than {MAX_ENTRIES} (token, layer, expert) entries"
                )
            tok_a.append(tok)
            lay_a.append(lay)
            line_a.append(n)
            ex_a.extend(ex)
            pr_a.extend(probs if probs is not None else [0.0] * k)
            meta_a.extend(0 if x is None else x for x in m)
            has_a.append((probs is not None) | (m[1] is not None) << 1 | (m[2] is not None) << 2)
    if not tok_a:
        raise InputError(file, "<file>", "no records")
    return _jsonl_trace(file, num_experts, k, tok_a, lay_a, line_a, ex_a, pr_a, meta_a, has_a)


def _jsonl_trace(file, num_experts, k, tok_a, lay_a, line_a, ex_a, pr_a, meta_a, has_a):
    """The trace of the records of :func:`load_jsonl`: every (token, layer) exactly once."""
    toks = np.frombuffer(tok_a, dtype=np.int64)
    lays = np.frombuffer(lay_a, dtype=np.int64)
    lines = np.frombuffer(line_a, dtype=np.int64)
    n = len(toks)
    t, nl = int(toks.max()) + 1, int(lays.max()) + 1
    present_t = np.unique(toks)
    present_l = np.unique(lays)
    if len(present_t) != t or len(present_l) != nl:
        raise InputError(file, "token", "tokens and layers must be numbered 0..N-1 without gaps")
    key = toks * nl + lays
    order = np.argsort(key, kind="stable")
    sk = key[order]
    dup = np.flatnonzero(sk[1:] == sk[:-1])
    if len(dup):
        i = order[dup[0] + 1]
        raise InputError(
            file,
            f"line {int(lines[i])}",
            f"token {int(toks[i])} layer {int(lays[i])} appears twice",
        )
    if n != t * nl:  # no duplicates: some (token, layer) has no record
        off = np.flatnonzero(sk != np.arange(n))  # the first key not in its place is missing
        miss = int(off[0]) if len(off) else n
        raise InputError(file, "layer", f"token {miss // nl} has no record for layer {miss % nl}")
    why = experts_shape_problem((t, nl, k), num_experts)
    if why:
        raise InputError(file, "experts", why)
    experts = np.frombuffer(ex_a, dtype=np.int16).reshape(n, k)[order].reshape(t, nl, k)
    has = np.frombuffer(has_a, dtype=np.int8)[order].reshape(t, nl)
    meta = np.frombuffer(meta_a, dtype=np.int64).reshape(n, 3)[order].reshape(t, nl, 3)
    same = (meta == meta[:, :1]).all(-1) & ((has >> 1) == (has[:, :1] >> 1))
    if not same.all():
        tok, lay = (int(x) for x in np.argwhere(~same)[0])
        raise InputError(
            file,
            f"line {int(lines[order[tok * nl + lay]])}",
            f"token {tok}: request/position/token_id differ between its layers",
        )
    scores = None
    if (has & 1).all():
        scores = np.frombuffer(pr_a, dtype=np.float64).reshape(n, k)[order].reshape(t, nl, k)
    request = meta[:, 0, 0]
    position = meta[:, 0, 1] if (has[:, 0] & 2).all() else _positions(request)
    token_ids = meta[:, 0, 2] if (has[:, 0] & 4).all() else None
    ne = num_experts if num_experts is not None else int(experts.max()) + 1
    return RoutingTrace(
        experts=experts,
        scores=scores,
        token_ids=token_ids,
        request=request,
        position=position,
        num_experts=ne,
        name=file,
    )


def _positions(request: np.ndarray) -> np.ndarray:
    pos = np.zeros(len(request), dtype=np.int64)
    seen: dict = {}
    for i, r in enumerate(request.tolist()):
        pos[i] = seen.get(r, 0)
        seen[r] = pos[i] + 1
    return pos


def load_npy(path, num_experts: int | None = None) -> RoutingTrace:
    """An integer ``.npy`` ``[tokens, layers, k]``: its header is read and checked (dtype,
    shape, :func:`~fsedp.trace.core.experts_shape_problem`, the file's size) before the
    data is mapped (``mmap``, never read whole into memory before it is checked); without
    ``num_experts`` the expert count is the largest id + 1, at most
    :data:`~fsedp.trace.core.MAX_EXPERTS`."""
    file = str(path)
    _check_num_experts(file, num_experts)
    fh = files.open_input(path, "trace")
    with fh:
        if fh.read(4) == b"PK\x03\x04":
            raise InputError(
                file, "<file>", "holds several arrays (an .npz); use --format fsedp or flame"
            )
        fh.seek(0)
        shape, dtype, fortran, count = read_npy_header(fh, file, "<file>")
        offset = fh.tell()
        size = fh.seek(0, 2)
    if len(shape) == 3 and dtype.kind not in "iu":
        raise InputError(file, "experts", f"must hold integers, not {dtype}")
    why = experts_shape_problem(shape, num_experts)
    if why:
        raise InputError(file, "experts", why)
    if offset + count * dtype.itemsize != size:
        raise InputError(
            file,
            "<file>",
            f"not a readable .npy array: shape {shape} of {dtype} needs "
            f"{count * dtype.itemsize} bytes of data, the file holds {size - offset}",
        )
    if count:
        try:
            a = np.memmap(
                path,
                dtype=dtype,
                mode="r",
                offset=offset,
                shape=shape,
                order="F" if fortran else "C",
            )
        except (OSError, ValueError) as e:
            raise InputError(file, "<file>", f"not a readable .npy array: {e}") from None
    else:
        a = np.zeros(shape, dtype=dtype)
    lo, hi = (int(a.min()), int(a.max())) if count else (0, 0)
    if lo < 0:
        raise InputError(file, "experts", f"expert ids must be >= 0, found {lo}")
    if num_experts is None and hi >= MAX_EXPERTS:
        raise InputError(
            file,
            "experts",
            f"expert id {hi} is out of range: a trace has at most {MAX_EXPERTS} experts "
            f"(ids 0..{MAX_EXPERTS - 1})",
        )
    ne = num_experts if num_experts is not None else hi + 1
    t = shape[0]
    experts = np.array(a, dtype=np.int16) if hi <= np.iinfo(np.int16).max else a
    del a  # the file is unmapped once the ids are copied
    return RoutingTrace(
        experts=experts,
        scores=None,
        token_ids=None,
        request=np.zeros(t, dtype=np.int64),
        position=np.arange(t),
        num_experts=ne,
        name=file,
    )


def load_any(path, fmt: str = "auto", num_experts: int | None = None) -> RoutingTrace:
    """Read a trace in any supported format (``auto``: by extension and content); a trace
    without tokens is refused."""
    trace = _load_any(path, fmt, num_experts)
    if trace.tokens == 0:
        raise InputError(str(path), "experts", "the trace holds no tokens")
    return trace


def _load_any(path, fmt: str = "auto", num_experts: int | None = None) -> RoutingTrace:
    file = str(path)
    if fmt not in FORMATS:
        raise InputError(file, "--format", f"must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if fmt == "auto":
        suffix = Path(path).suffix.lower()
        if suffix in (".jsonl", ".json"):
            fmt = "jsonl"
        elif suffix == ".npy":
            fmt = "npy"
        elif suffix == ".npz":
            with _reader(path) as z:  # the zip's directory only: no array is read
                keys = z.keys
            fmt = (
                "fsedp" if "format" in keys else "flame" if "prefill_topk_experts" in keys else None
            )
            if fmt is None:
                names = ", ".join(sorted(k[:40] for k in keys)[:20])
                raise InputError(
                    file,
                    "<file>",
                    "an .npz that is neither an fsedp trace nor a FLAME excerpt "
                    f"(arrays: {names}{', ...' if len(keys) > 20 else ''})",
                )
        else:
            raise InputError(
                file,
                "<file>",
                f"cannot tell the format from {suffix or 'no extension'!r}; pass --format",
            )
    if fmt == "fsedp":
        return load_trace(path)
    if fmt == "flame":
        return load_flame(path)
    if fmt == "jsonl":
        return load_jsonl(path, num_experts)
    return load_npy(path, num_experts)


def record_hf(
    model_path, text_path, max_tokens: int = 4096, seq_len: int = 256, tokenizer_path=None
) -> RoutingTrace:
    """Routing of a Hugging Face ``transformers`` MoE model on a text file: the model runs
    with ``output_router_logits=True`` over windows of ``seq_len`` tokens; each layer's
    router logits give the top-k experts (k = the config's ``num_experts_per_tok``) and
    their softmax probabilities.  Needs torch and transformers (the ``model`` extra)."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise InputError(
            str(model_path),
            "<model>",
            "needs torch and transformers, the 'model' extra: pip install 'fsedp[model]'",
        ) from None
    from fsedp.files import read_text

    file = str(model_path)
    try:
        cfg = AutoConfig.from_pretrained(model_path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(tokenizer_path or model_path, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(
            file, "<model>", f"cannot load a transformers model: {str(e).splitlines()[0]}"
        ) from None
    k = getattr(cfg, "num_experts_per_tok", None)
    ne = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if not k or not ne:
        raise InputError(file, "config", "not a MoE model (no num_experts_per_tok / num_experts)")
    text = read_text(text_path, "text")
    ids = tok(text, return_tensors=None)["input_ids"][:max_tokens]
    if not ids:
        raise InputError(str(text_path), "<file>", "no tokens in the text")
    model.eval()
    experts, scores, request, position = [], [], [], []
    with torch.no_grad():
        for r, s in enumerate(range(0, len(ids), seq_len)):
            chunk = torch.tensor([ids[s : s + seq_len]])
            out = model(chunk, output_router_logits=True)
            logits = [
                x.reshape(chunk.shape[1], -1).float() for x in out.router_logits if x is not None
            ]
            p = torch.stack([torch.softmax(x, -1) for x in logits], 1)  # [t, L, E]
            top_p, top = p.topk(k, dim=-1)
            experts.append(top.numpy())
            scores.append(top_p.numpy())
            request += [r] * chunk.shape[1]
            position += list(range(chunk.shape[1]))
    return RoutingTrace(
        experts=np.concatenate(experts),
        scores=np.concatenate(scores),
        token_ids=np.asarray(ids),
        request=np.asarray(request),
        position=np.asarray(position),
        num_experts=int(ne),
        name=file,
    )
