"""Progress and info lines: :mod:`logging` for lines, tqdm for bars.

* :func:`logger` -- the logger of a part of the project, ``fsedp.<name>``.  Info lines
  (what a command is doing) are ``INFO``; notices a user should see even under ``--json``
  (a fallback, a bad cache entry recomputed) are ``WARNING``.
* :func:`progress` -- a tqdm bar on stderr, shown only when stderr is a terminal (tqdm's
  ``disable=None``), never when ``quiet`` (``--json``): a log file gets no bars.
* :func:`configure` -- called once per command by :func:`fsedp.cli.main`: one handler on the
  ``fsedp`` logger that writes ``fsedp: MESSAGE`` lines on stderr, at ``INFO`` (``WARNING``
  under ``--json``, so that stdout's JSON and the refusals are all a command prints).

Nothing here runs at import: used as a library, the project configures no logging (its
warnings reach Python's last-resort handler, its info lines are dropped) and the root
logger is never touched.  A refusal is not a log line: it is the
:class:`~fsedp.errors.InputError` that :func:`fsedp.cli.main` prints.
"""

import logging
import sys

__all__ = ["ROOT", "FORMAT", "logger", "progress", "configure"]

#: The logger every other one of the project is a child of.
ROOT = "fsedp"
#: An info line as the command-line tool prints it.
FORMAT = "fsedp: %(message)s"


def logger(name: str) -> logging.Logger:
    """The logger ``fsedp.<name>`` (``name`` a short part name: ``run``, ``executor``)."""
    return logging.getLogger(f"{ROOT}.{name}")


def progress(iterable=None, *, total=None, desc=None, quiet: bool = False, **kwargs):
    """A tqdm bar over ``iterable`` (or of ``total`` steps, advanced by ``update``) on
    stderr: shown on a terminal only (``disable=None``), never when ``quiet``."""
    from tqdm import tqdm

    kwargs.setdefault("file", sys.stderr)
    return tqdm(iterable, total=total, desc=desc, disable=True if quiet else None, **kwargs)


class _Stderr(logging.StreamHandler):
    """A handler on the stderr of the moment (``sys.stderr`` when a line is written, not when
    the handler was made: a test's capture, or a worker's stream, is honoured)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler sets it; the stream is always sys.stderr
        pass


def configure(json: bool = False, verbose: bool = False) -> logging.Logger:
    """Set the ``fsedp`` logger up for one command: one handler (replacing any earlier one
    of this function) writing ``fsedp: MESSAGE`` on stderr; level ``INFO``, or ``WARNING``
    under ``json`` unless ``verbose`` asks for the info lines anyway.  The root logger is not
    touched; records still propagate to it (an application's or pytest's handlers)."""
    log = logging.getLogger(ROOT)
    for h in [h for h in log.handlers if isinstance(h, _Stderr)]:
        log.removeHandler(h)
    handler = _Stderr()
    handler.setFormatter(logging.Formatter(FORMAT))
    log.addHandler(handler)
    log.setLevel(logging.WARNING if json and not verbose else logging.INFO)
    return log
