"""The one error type for bad user input (configs, traces, arguments)."""

__all__ = ["InputError"]


class InputError(Exception):
    """A problem with user input, reported on one line ``"{file}: {field}: {reason}"``.

    Parameters
    ----------
    file : str
        The file (or pseudo file such as ``<default>``, or a trace name) where the problem is.
    field : str
        Dotted path of the offending field or array inside ``file``, or a pseudo field such
        as ``<file>`` when the file itself cannot be read.
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
