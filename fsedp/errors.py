"""The one error type for everything a user can get wrong: configs, traces, experiment
files, model files, command-line values and hardware generics.

Every command prints it as one line ``fsedp: FILE: FIELD: REASON`` on stderr and exits
with status 2 (:func:`fsedp.cli.main`); nothing else a user can provide reaches the user as
a traceback.  What the machine refuses (memory or address space, a full disk, a file-size
limit, a tool missing or killed) is an :class:`EnvironmentFailure`: one line
``fsedp: WHAT: REASON; TODO`` and exit status 3.
"""

__all__ = ["InputError", "EnvironmentFailure", "COMMAND_LINE"]

#: The pseudo file of a command-line value (its field is the option, ``--layers``).
COMMAND_LINE = "<command line>"


class InputError(Exception):
    """A problem with user input, reported on one line ``"{file}: {field}: {reason}"``.

    Parameters
    ----------
    file : str
        The file (or pseudo file such as ``<default>``, ``<command line>``, ``<params>``,
        or a trace name) where the problem is.
    field : str
        Dotted path of the offending field or array inside ``file``, an option such as
        ``--layers``, or a pseudo field such as ``<file>`` when the file itself cannot be
        read, ``<yaml>`` for a YAML syntax error and ``<top>`` for a document that is not a
        mapping.
    reason : str
        What is wrong; newlines are folded into spaces.
    """

    def __init__(self, file, field: str, reason: str):
        self.file = str(file)
        self.field = str(field)
        self.reason = " ".join(str(reason).split())
        super().__init__(f"{self.file}: {self.field}: {self.reason}")

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.reason}"

    def __reduce__(self):
        # raised in a worker process, it must arrive whole in the parent
        return (InputError, (self.file, self.field, self.reason))

    def at(self, file, field: str | None = None, reason: str | None = None) -> "InputError":
        """The same problem reported where the user wrote the value: ``file`` and, when
        given, ``field`` (and a reason with more context)."""
        return InputError(
            file, self.field if field is None else field, self.reason if reason is None else reason
        )


class EnvironmentFailure(Exception):
    """The machine, not the input, stopped the command: out of memory or address space, a
    full disk or a file-size limit while writing, an external tool missing or killed.

    Printed as one line ``fsedp: {what}: {reason}; {todo}`` with exit status 3
    (:func:`fsedp.cli.main`); outputs staged by the command are removed as on any error.

    Parameters
    ----------
    what : str
        What was being done or written (a file, ``Yosys``, ``Verilator``).
    reason : str
        What the machine said (``no space left on device``).
    todo : str
        What the user can do about it.
    """

    def __init__(self, what, reason: str, todo: str):
        self.what = " ".join(str(what).split())
        self.reason = " ".join(str(reason).split())
        self.todo = " ".join(str(todo).split())
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.what}: {self.reason}; {self.todo}"

    def __reduce__(self):
        return (EnvironmentFailure, (self.what, self.reason, self.todo))
