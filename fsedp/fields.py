"""Declared fields: every user-settable parameter is declared once, with its type, its
physical range and its meaning, and checked by one function.

A dataclass field declared with :func:`spec` carries a :class:`Spec` in its metadata;
:func:`check` validates one value against it and :func:`build` a whole mapping against a
dataclass, raising :class:`~fsedp.errors.InputError` (``file: field: reason``) at the first
problem.  The configs (:mod:`fsedp.config`) and the hardware generics (:mod:`fsedp.params`)
are declared this way, so a value a file may hold is a value every later computation
(cycles, bytes, widths) can take without overflow or division by zero; ``docs/configs.md``
lists the ranges (:func:`table` writes them).

Type rules: an ``int`` field takes an integer only (``true``/``false`` are not integers);
a ``float`` field takes an integer or a float (stored as ``float``, must be finite); a
``str`` field takes a non-empty string of at most :data:`MAX_STR` characters; a field with
``choices`` takes one of them.
"""

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from fsedp.errors import InputError

__all__ = [
    "Spec",
    "spec",
    "same_as",
    "specs",
    "check",
    "build",
    "describe",
    "table",
    "MAX_STR",
    "MAX_ITEMS",
    "number_text",
]

#: Longest string a field takes (names, trace paths).
MAX_STR = 4096
#: Most items a list field takes.
MAX_ITEMS = 64


@dataclass(frozen=True)
class Spec:
    """Type, range and meaning of one field (``lo``/``hi`` inclusive; ``None``: unbounded)."""

    kind: type
    lo: float | None = None
    hi: float | None = None
    unit: str = ""
    doc: str = ""
    choices: tuple = ()
    items: type | None = None  # a list field: the type of its items (``kind`` is list)

    def range_text(self) -> str:
        if self.items is not None:
            return f"a list of 1..{MAX_ITEMS} ({self.item().range_text()})"
        if self.kind is dict:
            return "a mapping"
        if self.choices:
            return " or ".join(map(str, self.choices))
        if self.kind is str:
            return f"non-empty, at most {MAX_STR} characters"
        if self.kind is bool:
            return "true | false"
        return f"{number_text(self.lo)}..{number_text(self.hi)}"

    def item(self) -> "Spec":
        """The spec of one item of a list field."""
        return Spec(self.items, self.lo, self.hi, self.unit, self.doc, self.choices)


def number_text(v) -> str:
    """A bound as the docs and ``--help`` write it: ``any`` for none, ``2**k`` for a large
    power of two, floats in short form."""
    if v is None:
        return "any"
    if isinstance(v, int) and v >= 2**16 and v & (v - 1) == 0:
        return f"2**{v.bit_length() - 1}"
    return f"{v:g}" if isinstance(v, float) else str(v)


def spec(
    kind: type,
    lo=None,
    hi=None,
    *,
    unit: str = "",
    doc: str = "",
    choices=(),
    items: type | None = None,
    default=dataclasses.MISSING,
):
    """A dataclass field declared with its :class:`Spec` (``kind=list, items=T`` for a list
    of ``T`` whose every item is checked against the range and choices)."""
    s = Spec(kind, lo, hi, unit, doc, tuple(choices), items)
    return dataclasses.field(default=default, metadata={"spec": s})


def same_as(cls, name: str, *, default=dataclasses.MISSING):
    """A field declared by another class's field of the same meaning (one declaration)."""
    return dataclasses.field(default=default, metadata={"spec": specs(cls)[name]})


def specs(cls) -> dict[str, Spec]:
    """Field name -> :class:`Spec` of a dataclass declared with :func:`spec`."""
    return {f.name: f.metadata["spec"] for f in dataclasses.fields(cls) if "spec" in f.metadata}


def describe(v: Any) -> str:
    """A value for an error message, cut short: never the whole of a hostile input."""
    text = repr(v) if not isinstance(v, (dict, list, tuple)) else f"a {type(v).__name__}"
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(v).__name__} {text}" if not isinstance(v, (dict, list, tuple)) else text


def check(file: str, where: str, s: Spec, v: Any):
    """``v`` checked against ``s``; the value to store (a ``float`` field stores a float)."""
    if s.items is not None:
        if not isinstance(v, list):
            raise InputError(file, where, f"must be a list, not {describe(v)}")
        if not 1 <= len(v) <= MAX_ITEMS:
            raise InputError(file, where, f"must hold 1..{MAX_ITEMS} items, not {len(v)}")
        return [check(file, f"{where}[{i}]", s.item(), x) for i, x in enumerate(v)]
    if s.kind is dict:
        if not isinstance(v, dict) or not v:
            raise InputError(file, where, f"must be a non-empty mapping, not {describe(v)}")
        return v
    if s.kind is str:
        if not isinstance(v, str):
            raise InputError(file, where, f"must be a string, not {describe(v)}")
        if not v.strip():
            raise InputError(file, where, "must be a non-empty string")
        if len(v) > MAX_STR:
            raise InputError(file, where, f"must be at most {MAX_STR} characters, not {len(v)}")
        if s.choices and v not in s.choices:
            if len(s.choices) > 12:
                raise InputError(file, where, f"unknown {v[:60]!r}")
            raise InputError(file, where, f"must be one of {', '.join(s.choices)}, not {v!r}")
        return v
    if s.kind is bool:
        if not isinstance(v, bool):
            raise InputError(file, where, f"must be true or false, not {describe(v)}")
        return v
    if s.kind is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(file, where, f"must be an integer, not {describe(v)}")
        if s.choices and v not in s.choices:
            raise InputError(
                file, where, f"must be one of {', '.join(map(str, s.choices))}, not {describe(v)}"
            )
    else:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InputError(file, where, f"must be a number, not {describe(v)}")
        if isinstance(v, int) and abs(v) > 2**64:
            raise InputError(file, where, f"must be in {s.range_text()}, not {describe(v)}")
        v = float(v)
        if not math.isfinite(v):
            raise InputError(file, where, f"must be finite, not {v}")
    if (s.lo is not None and v < s.lo) or (s.hi is not None and v > s.hi):
        unit = f" {s.unit}" if s.unit else ""
        shown = (
            v
            if s.kind is int and abs(v) < 10**30
            else f"{v:.3g}"
            if s.kind is float
            else "a huge integer"
        )
        raise InputError(file, where, f"must be in {s.range_text()}{unit}, not {shown}")
    return v


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def build(cls, data: Any, file: str, prefix: str = ""):
    """The dataclass ``cls`` built from the mapping ``data``, every field checked.

    Unknown keys, missing keys without a default and bad values raise
    :class:`~fsedp.errors.InputError` naming ``file`` and the dotted field.
    """
    if not isinstance(data, dict):
        raise InputError(
            file, prefix or "<top>", f"must be a mapping of fields, not {describe(data)}"
        )
    fields = {f.name: f for f in dataclasses.fields(cls) if "spec" in f.metadata}
    for key in data:
        if key not in fields:
            raise InputError(
                file,
                _join(prefix, str(key)[:60]),
                f"unknown key; allowed keys: {', '.join(fields)}",
            )
    values = {}
    for name, f in fields.items():
        if name in data:
            values[name] = check(file, _join(prefix, name), f.metadata["spec"], data[name])
        elif f.default is dataclasses.MISSING:
            required = [n for n, g in fields.items() if g.default is dataclasses.MISSING]
            raise InputError(
                file, _join(prefix, name), f"missing key (required keys: {', '.join(required)})"
            )
    return values


def table(cls) -> str:
    """The Markdown table of every declared field of ``cls`` (field, type, range, default,
    meaning): what ``docs/configs.md`` shows, checked by ``tests/test_config.py``."""
    rows = ["| Field | Type | Range | Default | Meaning |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if "spec" not in f.metadata:
            continue
        s = f.metadata["spec"]
        kind = s.kind.__name__ if s.items is None else f"list of {s.items.__name__}"
        rng = s.range_text() + (f" {s.unit}" if s.unit else "")
        default = (
            "required"
            if f.default is dataclasses.MISSING
            else ("derived" if f.default is None else f"`{f.default}`")
        )
        cells = [f"`{f.name}`", kind, rng, default, s.doc]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)
