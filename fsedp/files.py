"""Files a user gives or gets: bounded YAML reading, outputs written so that nothing
half-written is left behind, and where outputs go by default."""

import contextlib
import os
import tempfile
from pathlib import Path

import yaml

from fsedp.errors import InputError

__all__ = [
    "atomic_path",
    "read_text",
    "check_output_folder",
    "write_text",
    "check_output_file",
    "output_folder",
    "build_dir",
    "read_yaml",
    "parse_yaml",
    "MAX_YAML_BYTES",
    "pyplot",
]


@contextlib.contextmanager
def atomic_path(path, suffix: str = ""):
    """Yield a temporary path next to ``path``; on success it is renamed to ``path``, on an
    exception it is removed.  ``suffix`` keeps an extension some writers insist on
    (``numpy.savez`` appends ``.npz`` to names without it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=suffix or path.suffix, dir=path.parent
    )
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a written file is a normal one
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_text(path) -> str:
    """A UTF-8 text file, or an :class:`~fsedp.errors.InputError` with the field ``<file>``."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(path, "<file>", "no such file") from None
    except UnicodeDecodeError as e:
        raise InputError(path, "<file>", f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise InputError(path, "<file>", e.strerror or str(e)) from None


def write_text(path, text: str):
    """Write ``text`` to ``path`` all at once (through :func:`atomic_path`): a failed run
    leaves the old file, or none, never half of the new one.  An output path that is a
    folder, or whose folder cannot be made, is an :class:`~fsedp.errors.InputError`."""
    path = check_output_file(path)
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    except OSError as e:
        raise InputError(str(path), "<file>", f"cannot write: {e.strerror}") from None


def _check_place(path: Path):
    """The nearest existing folder above ``path`` must be one a file can be made in."""
    if "\0" in str(path) or not str(path).strip():
        raise InputError(repr(str(path)), "<file>", "not a usable path")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(str(path), "<file>", f"{parent} is a file, not a folder")
            try:
                with tempfile.TemporaryFile(dir=parent):
                    pass
            except OSError as e:
                raise InputError(
                    str(path), "<file>", f"cannot write into {parent}: {e.strerror}"
                ) from None
            return


def check_output_file(path) -> Path:
    """Refuse, before any work, an output file path that is a folder or cannot be written."""
    path = Path(path)
    _check_place(path)
    if path.is_dir():
        raise InputError(str(path), "<file>", "is a folder; expected a file name")
    return path


def check_output_folder(path) -> Path:
    """Refuse, before any work, an output folder path that is a file or cannot be made
    (nothing is created: the folder is made when the outputs are written)."""
    path = Path(path)
    _check_place(path)
    if path.exists() and not path.is_dir():
        raise InputError(str(path), "<file>", "is a file; expected a folder for the outputs")
    return path


def output_folder(path) -> Path:
    """``path`` made as a folder for a command's outputs, or an
    :class:`~fsedp.errors.InputError` when it is a file or cannot be made."""
    path = check_output_folder(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(str(path), "<file>", f"cannot make the folder: {e.strerror}") from None
    return path


def build_dir(*parts) -> Path:
    """Default place of a command's outputs and build folders: ``./build/<parts>`` under the
    current directory (never inside the installed package)."""
    return Path.cwd() / "build" / Path(*parts)


# -- YAML ----------------------------------------------------------------------------------
#: Largest YAML file read (configs are a few KiB; this refuses hostile sizes at once).
MAX_YAML_BYTES = 1 << 20
#: Deepest nesting of YAML collections accepted (configs are three levels deep).
MAX_YAML_DEPTH = 32


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases (no "billion laughs"), nesting deeper
    than :data:`MAX_YAML_DEPTH` and duplicate keys."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not accepted", event.start_mark
            )
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, "anchors (&name) are not accepted", event.start_mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
                seen.add(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "a key must be a scalar",
                    key_node.start_mark,
                ) from None
            if dup:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {str(key)[:60]!r}",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


_BoundedLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _BoundedLoader.construct_mapping
)


def parse_yaml(text: str, file: str) -> dict:
    """The mapping a YAML document holds, or an :class:`~fsedp.errors.InputError` naming
    ``file`` and ``<yaml>`` (syntax, aliases, depth, duplicate keys; with line and column)
    or ``<top>`` (empty, or not a mapping)."""
    if len(text) > MAX_YAML_BYTES:
        raise InputError(
            file,
            "<file>",
            f"{len(text)} characters; a YAML file here holds at most {MAX_YAML_BYTES}",
        )
    try:
        data = yaml.load(text, Loader=_BoundedLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(file, "<yaml>", f"YAML error{where}: {problem}") from None
    except (RecursionError, ValueError, OverflowError) as e:  # e.g. a huge timestamp
        raise InputError(file, "<yaml>", f"YAML error: {type(e).__name__}: {e}"[:200]) from None
    if data is None:
        raise InputError(file, "<top>", "the document is empty; expected a mapping")
    if not isinstance(data, dict):
        raise InputError(
            file, "<top>", f"the top level must be a mapping, not {type(data).__name__}"
        )
    return data


def read_yaml(path) -> dict:
    """:func:`parse_yaml` of a file: at most :data:`MAX_YAML_BYTES`, UTF-8; an unreadable
    file is an :class:`~fsedp.errors.InputError` with the field ``<file>``."""
    file = str(path)
    if "\0" in file or not file.strip():
        raise InputError(repr(file), "<file>", "not a usable path")
    if os.path.exists(path) and not os.path.isfile(path):
        raise InputError(file, "<file>", "not a regular file")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise InputError(file, "<file>", f"cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_YAML_BYTES:
        raise InputError(
            file, "<file>", f"larger than {MAX_YAML_BYTES} bytes; a YAML file here is a few KiB"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(file, "<file>", f"not UTF-8 text (byte {e.start})") from None
    return parse_yaml(text, file)


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend (no screen needed): every plot of
    the project is a PNG written to a file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
