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
"""

import json
from pathlib import Path

import numpy as np

from fsedp.errors import InputError
from fsedp.files import atomic_path
from fsedp.trace.core import RoutingTrace, load_flame

__all__ = ["save_trace", "load_trace", "load_jsonl", "load_npy", "load_any", "FORMATS", "record_hf"]

FORMATS = ("auto", "fsedp", "flame", "jsonl", "npy")


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


def _npz(path) -> dict:
    file = str(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise InputError(file, "<file>", "no such file") from None
    except Exception as e:
        raise InputError(
            file, "<file>", f"not a readable npz file: {type(e).__name__}: {e}"
        ) from None


def load_trace(path) -> RoutingTrace:
    file = str(path)
    a = _npz(path)
    if str(a.get("format", "")) != "fsedp-trace":
        raise InputError(file, "format", "not an fsedp trace (expected format = 'fsedp-trace')")
    version = a["version"].item() if "version" in a and a["version"].size == 1 else None
    if version != 1:
        raise InputError(file, "version", f"unsupported version {version} (this reader: 1)")
    for key in ("num_experts", "experts", "request", "position"):
        if key not in a:
            raise InputError(file, key, "missing array")
    try:
        return RoutingTrace(
            experts=a["experts"],
            scores=a.get("scores"),
            token_ids=a.get("token_ids"),
            request=a["request"],
            position=a["position"],
            num_experts=_int_scalar(file, a["num_experts"]),
            name=file,
        )
    except (TypeError, ValueError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(file, "num_experts", str(e)) from None


def _lines(fh, file: str):
    """The lines of a text file; bytes that are not UTF-8 are an error naming the line."""
    n = 0
    while True:
        try:
            line = fh.readline()
        except UnicodeDecodeError as e:
            raise InputError(file, f"line {n + 1}", f"not UTF-8 text (byte {e.start})") from None
        if not line:
            return
        n += 1
        yield line


def _int_scalar(file: str, v) -> int:
    """An integer stored as a 0-d integer array (``num_experts``)."""
    v = np.asarray(v)
    if v.ndim != 0 or v.dtype.kind not in "iu":
        raise InputError(
            file, "num_experts", f"must be an integer scalar, not {v.dtype} of shape {v.shape}"
        )
    return int(v)


def _is_int(x) -> bool:
    """A JSON integer within int64 (``true``/``false`` are not integers)."""
    return isinstance(x, int) and not isinstance(x, bool) and -(2**63) <= x < 2**63


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) < 1e300


def load_jsonl(path, num_experts: int | None = None) -> RoutingTrace:
    file = str(path)
    rows = {}
    meta = {}
    try:
        fh = open(path, encoding="utf-8")
    except OSError as e:
        raise InputError(file, "<file>", e.strerror or str(e)) from None
    with fh:
        for n, line in enumerate(_lines(fh, file), 1):
            if not line.strip():
                continue
            where = f"line {n}"
            if len(line) > 1 << 20:
                raise InputError(file, where, "longer than 1 MiB; a record is a few hundred bytes")
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
            if not isinstance(ex, list) or not ex or not all(_is_int(x) for x in ex):
                raise InputError(file, f"{where}.experts", "must be a non-empty list of integers")
            probs = rec.get("probs")
            if probs is not None and (
                not isinstance(probs, list)
                or len(probs) != len(ex)
                or not all(_is_num(x) for x in probs)
            ):
                raise InputError(
                    file, f"{where}.probs", "must be a list of numbers as long as experts"
                )
            if (tok, lay) in rows:
                raise InputError(file, where, f"token {tok} layer {lay} appears twice")
            rows[tok, lay] = (ex, probs)
            m = (rec.get("request", 0), rec.get("position"), rec.get("token_id"))
            if not all(x is None or _is_int(x) for x in m):
                raise InputError(file, where, "request, position and token_id must be integers")
            if tok in meta and meta[tok] != m:
                raise InputError(
                    file, where, f"token {tok}: request/position/token_id differ between its layers"
                )
            meta[tok] = m
    if not rows:
        raise InputError(file, "<file>", "no records")
    tokens = sorted(meta)
    layers = sorted({lay for _, lay in rows})
    if tokens != list(range(len(tokens))) or layers != list(range(len(layers))):
        raise InputError(file, "token", "tokens and layers must be numbered 0..N-1 without gaps")
    k = len(next(iter(rows.values()))[0])
    t, nl = len(tokens), len(layers)
    experts = np.zeros((t, nl, k), dtype=np.int64)
    has_probs = all(p is not None for _, p in rows.values())
    scores = np.zeros((t, nl, k), dtype=np.float64) if has_probs else None
    for tok in tokens:
        for lay in layers:
            if (tok, lay) not in rows:
                raise InputError(file, "layer", f"token {tok} has no record for layer {lay}")
            ex, pr = rows[tok, lay]
            if len(ex) != k:
                raise InputError(
                    file, "experts", f"token {tok} layer {lay} has {len(ex)} experts, others {k}"
                )
            experts[tok, lay] = ex
            if has_probs:
                scores[tok, lay] = pr
    request = np.asarray([meta[i][0] for i in tokens])
    pos = [meta[i][1] for i in tokens]
    position = np.asarray(pos) if all(p is not None for p in pos) else _positions(request)
    ids = [meta[i][2] for i in tokens]
    token_ids = np.asarray(ids) if all(x is not None for x in ids) else None
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
    file = str(path)
    try:
        a = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(file, "<file>", "no such file") from None
    except Exception as e:
        raise InputError(file, "<file>", f"not a readable .npy array: {e}") from None
    if not isinstance(a, np.ndarray):
        raise InputError(
            file, "<file>", "holds several arrays (an .npz); use --format fsedp or flame"
        )
    if a.ndim != 3:
        raise InputError(file, "experts", f"must be 3-D [tokens, layers, k], not shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise InputError(file, "experts", f"must hold integers, not {a.dtype}")
    ne = num_experts if num_experts is not None else (int(a.max()) + 1 if a.size else 1)
    t = a.shape[0]
    return RoutingTrace(
        experts=a,
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
            keys = _npz(path)
            fmt = (
                "fsedp" if "format" in keys else "flame" if "prefill_topk_experts" in keys else None
            )
            if fmt is None:
                raise InputError(
                    file,
                    "<file>",
                    "an .npz that is neither an fsedp trace nor a "
                    "FLAME excerpt (arrays: " + ", ".join(sorted(keys)) + ")",
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
            str(model_path), "<model>", "needs torch and transformers: pip install -e '.[model]'"
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
    text = read_text(text_path)
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
