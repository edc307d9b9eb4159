"""The one JSON writer and reader of fsedp's documents: strict JSON only.

Every JSON document fsedp prints (``--json``) or writes (``summary.json``, ``stats.json``,
markers, profiles' JSON twins, trace events) goes through :func:`dumps`, which refuses
``NaN`` and ``Infinity`` (``allow_nan=False``): RFC 8259 has no such numbers and strict
parsers (``jq``, JavaScript's ``JSON.parse``, Go, Rust's ``serde_json``) reject them.  A
figure that is undefined on its input is written as ``null`` beside a reason (documented
where the figure is), never as ``NaN``.  A non-finite number that reaches :func:`dumps` is a
bug of ours, reported with the path of the value.
"""

import json
import math

__all__ = ["dumps", "loads", "NonFiniteError", "finite_or_none"]


class NonFiniteError(ValueError):
    """A ``NaN`` or infinite number in a document about to be written as JSON."""


def _path_of_nonfinite(doc, path="$"):
    """The JSON path of the first non-finite float in ``doc`` (``None`` when none)."""
    if isinstance(doc, float):
        return None if math.isfinite(doc) else path
    if isinstance(doc, dict):
        for k, v in doc.items():
            if (p := _path_of_nonfinite(v, f"{path}.{k}")) is not None:
                return p
    elif isinstance(doc, (list, tuple)):
        for i, v in enumerate(doc):
            if (p := _path_of_nonfinite(v, f"{path}[{i}]")) is not None:
                return p
    return None


def dumps(doc, *, indent=None, sort_keys=False, separators=None, default=None) -> str:
    """``doc`` as strict JSON text (no ``NaN``, ``Infinity``); a non-finite number raises
    :class:`NonFiniteError` naming where it is."""
    try:
        return json.dumps(
            doc,
            indent=indent,
            sort_keys=sort_keys,
            separators=separators,
            default=default,
            allow_nan=False,
        )
    except ValueError as e:
        if "Out of range float" not in str(e):
            raise
        where = _path_of_nonfinite(doc)
        raise NonFiniteError(
            f"a non-finite number at {where or 'a value'} of a JSON document; fsedp writes "
            "strict JSON (undefined figures are null with their reason)"
        ) from None


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON (strict JSON has no NaN or Infinity)")


def loads(text):
    """Parse strict JSON: ``NaN``, ``Infinity`` and ``-Infinity`` are refused
    (:class:`ValueError`), as any strict parser would."""
    return json.loads(text, parse_constant=_refuse_constant)


def finite_or_none(x):
    """``x`` as a float when it is finite, else ``None`` (for figures undefined on the
    input; the caller writes the reason beside it)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None
