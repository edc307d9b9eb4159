"""``fsedp``: the command-line tool, one module per command group.

* :mod:`.run`: ``run`` (the main job), ``sweep``, ``bench`` -- the simulator;
* :mod:`.rtl`: ``rtl rounds|verilog|cosim|coverage|report|formal|synth|fpga|datapath`` -- the
  hardware;
* :mod:`.trace`, :mod:`.lm`: ``trace ...``, ``lm ...`` -- workloads;
* :mod:`.offload`, :mod:`.prism`, :mod:`.serve`, :mod:`.shuffle` -- the software papers'
  policies; :mod:`.codesign` -- the chip with them.

Every command that produces results takes ``--json`` and then prints one JSON document on
stdout.  Anything a user can get wrong (a config, trace, experiment file or option value)
prints one line ``fsedp: FILE: FIELD: REASON`` on stderr and exits with status 2
(:class:`~fsedp.errors.InputError`, the one error type).
"""

import argparse
import contextlib
import os
import sys
from pathlib import Path

from fsedp.cli import codesign, lm, offload, prism, results, rtl, run, serve, shuffle, trace
from fsedp.cli.common import Parser, add_force, held_warnings, usage
from fsedp.errors import EnvironmentFailure, InputError
from fsedp.files import (
    check_output_file,
    check_output_folder,
    environment_failure,
    sigterm_raises,
)
from fsedp.log import configure
from fsedp.sw.streaming import SimulationStalled

__all__ = ["main", "build_parser"]

#: Command groups in the order ``fsedp --help`` lists them.
GROUPS = (run, rtl, trace, lm, offload, prism, serve, shuffle, codesign, results)


def build_parser() -> Parser:
    ap = Parser(
        prog="fsedp",
        description="FSE-DP co-design toolkit: golden models, RTL, "
        "cosimulation, performance simulator, policies.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    for group in GROUPS:
        group.add_parsers(sub)
    for p in _parsers(ap):
        if p.get_default("out_kind") == "folder" and "--force" not in p._option_string_actions:
            add_force(p)
    return ap


def _parsers(parser: argparse.ArgumentParser):
    """``parser`` and every parser of its sub-commands."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in dict.fromkeys(action.choices.values()):
                yield from _parsers(p)


#: Options that name a file or folder: an empty value is refused, not taken as "not given".
PATHS = (
    "config",
    "out",
    "data",
    "curve",
    "trace",
    "like",
    "weights",
    "tokenizer",
    "refactored",
    "text",
    "input",
    "model",
)


def check_common(args):
    """Checks every command shares, done before any work: paths, seeds, the output place
    (``out_kind``: ``file`` or ``folder``, set by the command), the data folder and the model
    a cost model is scaled to."""
    for name in PATHS:
        v = getattr(args, name, None)
        if isinstance(v, str) and (not v.strip() or "\0" in v):
            raise usage(f"--{name}", f"must name a file or folder, not {v[:40]!r}")
    seed = getattr(args, "seed", None)
    if isinstance(seed, int) and not 0 <= seed <= 2**32 - 1:
        raise usage("--seed", f"must be in 0..2**32 - 1, not {seed}")
    out, kind = getattr(args, "out", None), getattr(args, "out_kind", None)
    if out and kind == "file":
        check_output_file(out)
    elif out and kind == "folder":
        check_output_folder(out, getattr(args, "force", False))
    report = getattr(args, "report", None)
    if isinstance(report, str):  # the report file of rtl cosim --driver native
        try:
            check_output_file(report)
        except InputError as e:
            raise usage("--report", f"{report[:200]}: {e.reason}") from None
    data = getattr(args, "data", None)
    if data is not None and not Path(data).expanduser().is_dir():
        raise usage("--data", f"{data[:200]} is not a folder")


class _Terminated(Exception):
    """SIGTERM (``timeout``, a job scheduler): unwinds like Ctrl-C, so that every staged
    output is removed and nothing half-written stays (:func:`fsedp.files.sigterm_raises`)."""


def main(argv=None) -> int:
    """Run one command; its exit status (2 for bad input, 3 when the machine refused (memory,
    disk, a tool: :class:`~fsedp.errors.EnvironmentFailure`) or for a stalled simulation, 130
    when interrupted, 143 when terminated)."""
    try:
        with sigterm_raises(_Terminated), held_warnings():
            # a refusal is its one line: a library's warnings are dropped
            args = build_parser().parse_args(argv)
            # info lines on stderr through logging; only warnings under --json
            configure(json=getattr(args, "json", False), verbose=getattr(args, "verbose", False))
            check_common(args)
            return args.func(args)
    except InputError as e:
        print(f"fsedp: {e}", file=sys.stderr)
        return 2
    except EnvironmentFailure as e:  # the machine refused: memory, disk, a tool
        print(f"fsedp: {e}", file=sys.stderr)
        return 3
    except MemoryError:
        print(
            "fsedp: out of memory (or of address space: ulimit -v); run a smaller case or "
            "raise the limit",
            file=sys.stderr,
        )
        return 3
    except SimulationStalled as e:  # a contradiction inside the models, not the user's input
        print(f"fsedp: internal error: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130
    except _Terminated:
        return 143
    except BrokenPipeError:  # the reader went away (fsedp ... | head): not an error of ours
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:  # a full disk, a file-size limit, ...: one line; anything else is ours
        failure = environment_failure(e)
        if failure is None:
            raise
        print(f"fsedp: {failure}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
