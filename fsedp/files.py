"""Files a user gives or gets: bounded YAML reading, outputs written so that nothing
half-written is left behind (SIGTERM unwinds as an interrupt does), and where outputs go by
default."""

import contextlib
import json
import os
import shutil
import signal
import stat
import tempfile
import threading
from pathlib import Path, PurePosixPath

import yaml

from fsedp.errors import InputError
from fsedp.log import logger

__all__ = [
    "atomic_path",
    "output_dir",
    "work_folder",
    "sigterm_raises",
    "OUTPUT_MARKER",
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
    (``numpy.savez`` appends ``.npz`` to names without it).

    ``path`` itself must not be a symbolic link (:func:`check_output_file`): the rename
    would replace the user's link, and writing through it would replace the file it points
    at, so neither is done."""
    path = Path(path)
    _refuse_link(path)
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
        _refuse_link(path)  # made while we worked: still never replaced
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _refuse_link(path: Path):
    if os.path.islink(path):
        raise InputError(
            str(path),
            "<file>",
            f"is a symbolic link (to {os.readlink(path)[:120]}); fsedp writes its outputs as "
            "new files and neither replaces a link nor writes through one: name the target "
            "itself",
        )


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
                name_max = os.pathconf(parent, "PC_NAME_MAX")
            except OSError as e:
                raise InputError(
                    str(path), "<file>", f"cannot write into {parent}: {e.strerror}"
                ) from None
            # the temporary name beside it: ".NAME.XXXXXXXX" plus a suffix (atomic_path)
            if len(os.fsencode(path.name)) + 12 + len(os.fsencode(path.suffix or ".tmp")) > (
                name_max
            ):
                raise InputError(
                    str(path)[:200], "<file>", f"the name is too long for {parent}'s file system"
                )
            return


def check_output_file(path) -> Path:
    """Refuse, before any work, an output file path that is a folder, a symbolic link or
    cannot be written.  An existing regular file of that name is replaced (the user named
    it) once the new one is complete."""
    path = Path(path)
    _check_place(path)
    _refuse_link(path)
    if path.is_dir():
        raise InputError(str(path), "<file>", "is a folder; expected a file name")
    return path


# -- report folders --------------------------------------------------------------------------
#: The file every output folder of fsedp holds: which files fsedp wrote there.  A folder with
#: it, holding nothing else, is one of ours and may be replaced by the next report; any other
#: non-empty folder is left alone unless ``--force`` says to write beside what it holds.
OUTPUT_MARKER = ".fsedp-output.json"
#: Entries looked at when deciding whether a folder is one of ours (a report has a few dozen).
_MAX_ENTRIES = 100_000


def _protected(path: Path) -> str | None:
    """Why ``path`` may never be a report folder: the file-system root, the current folder,
    the home folder or a folder above either; ``None`` otherwise."""
    try:
        target = path.resolve()
    except (OSError, RuntimeError):
        return None
    if target == Path(target.anchor):
        return "is the file-system root"
    places = []
    for name, where in (("the current folder", Path.cwd), ("your home folder", Path.home)):
        try:
            places.append((name, where().resolve()))
        except (OSError, RuntimeError, KeyError):
            continue
    for name, here in places:
        if target == here:
            return f"is {name}"
    for name, here in places:
        if target in here.parents:
            return f"is a folder above {name}"
    return None


def _manifest(folder: Path) -> set[str] | None:
    """The entries (relative paths) the marker of ``folder`` lists, ``None`` without a
    readable marker."""
    marker = folder / OUTPUT_MARKER
    try:
        if marker.is_symlink() or not marker.is_file() or marker.stat().st_size > 1 << 22:
            return None
        doc = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    files = doc.get("files") if isinstance(doc, dict) and doc.get("tool") == "fsedp" else None
    if not isinstance(files, list) or not all(isinstance(f, str) and _plain(f) for f in files):
        return None  # a marker naming "../x" or "/x" is not one fsedp wrote: not ours
    stamps = doc.get("stamps")
    if not isinstance(stamps, dict):
        return None
    return {f: stamps.get(f) for f in files}


def _plain(entry: str) -> bool:
    """A relative path in normal form that stays inside its folder."""
    p = PurePosixPath(entry)
    return bool(entry) and not p.is_absolute() and ".." not in p.parts and p.as_posix() == entry


def _stamp(p: Path) -> list | None:
    """Size and modification time of a regular file (``None`` for anything else): a file
    of ours that the user has changed since is the user's."""
    st = p.lstat()
    return [st.st_size, st.st_mtime_ns] if stat.S_ISREG(st.st_mode) else None


def _entries(folder: Path):
    """Every entry under ``folder`` (relative paths, folders before what they hold), links
    not followed."""

    def fail(e: OSError):  # a folder that cannot be listed is never taken as empty
        raise e

    for root, dirs, files in os.walk(folder, followlinks=False, onerror=fail):
        rel = Path(root).relative_to(folder)
        for name in sorted(dirs) + sorted(files):
            yield (rel / name).as_posix()


def _foreign(folder: Path) -> list[str]:
    """Entries of the existing folder ``folder`` that are not fsedp's (at most a few):
    everything when it has no marker, else what its marker does not list or lists with
    another size or time (changed by the user since), and what cannot be read."""
    ours = _manifest(folder) or {}
    found = []
    try:
        for n, entry in enumerate(_entries(folder)):
            if n >= _MAX_ENTRIES:
                found.append(f"more than {_MAX_ENTRIES} entries")
                break
            if entry == OUTPUT_MARKER or any(entry.startswith(f + "/") for f in found):
                continue
            if entry not in ours:
                found.append(entry)
            elif ours[entry] is not None and _stamp(folder / entry) != ours[entry]:
                found.append(f"{entry} (changed since fsedp wrote it)")
            if len(found) == 3:
                break
    except OSError as e:
        found.append(f"{e.filename} (cannot be read)")
    return found


def check_output_folder(path, force: bool = False) -> Path:
    """Refuse, before any work, an output folder that cannot hold a report: a file, a
    symbolic link, a place that cannot be written, the root, the current or home folder (or
    one above them), and, unless ``force``, an existing folder holding anything fsedp did
    not write there.  Nothing is created here (:func:`output_dir` makes the folder when the
    outputs are complete)."""
    path = Path(path)
    _check_place(path)
    _refuse_link(path)
    if path.exists() and not path.is_dir():
        raise InputError(str(path), "<file>", "is a file; expected a folder for the outputs")
    why = _protected(path)
    if why:
        raise InputError(
            str(path),
            "<file>",
            f"{why}; a report needs a folder of its own, e.g. {path / 'report'}",
        )
    if path.is_dir() and not force:
        foreign = _foreign(path)
        if foreign:
            raise InputError(
                str(path),
                "<file>",
                f"holds {', '.join(foreign)}, which fsedp did not write; a report replaces only "
                "a folder of its own, as fsedp left it: choose a new folder, empty this one, or "
                "pass --force to write the report beside what it holds",
            )
    return path


def output_folder(path) -> Path:
    """``path`` made as a folder that a command fills in place (work folders such as the
    sweep cache and formal runs), or an :class:`~fsedp.errors.InputError` when it is a file,
    a link or cannot be made."""
    path = Path(path)
    _check_place(path)
    _refuse_link(path)
    if path.exists() and not path.is_dir():
        raise InputError(str(path), "<file>", "is a file; expected a folder for the outputs")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(str(path), "<file>", f"cannot make the folder: {e.strerror}") from None
    return path


def _write_marker(folder: Path, files):
    names = sorted(set(files) | {OUTPUT_MARKER})
    stamps = {}
    for f in names:
        with contextlib.suppress(OSError):
            if f != OUTPUT_MARKER and (s := _stamp(folder / f)) is not None:
                stamps[f] = s
    doc = {"tool": "fsedp", "files": names, "stamps": stamps}
    with atomic_path(folder / OUTPUT_MARKER) as tmp:
        tmp.write_text(json.dumps(doc, indent=0) + "\n")


def _remove_ours(folder: Path, ours: set[str]):
    """Remove from ``folder`` the entries of ``ours`` (deepest first), then the folder if
    nothing else is left; what fsedp did not write stays, and is said once.  Only entries
    found inside ``folder`` (walked, links not followed) are touched: a marker naming
    ``../x`` or an absolute path reaches nothing outside."""
    try:
        present = set() if os.path.islink(folder) else set(_entries(folder))
    except OSError:
        present = set()
    for entry in sorted(set(ours) & present, key=lambda e: e.count("/"), reverse=True):
        p = folder / entry
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            else:
                p.unlink()
    try:
        folder.rmdir()
    except OSError:
        logger("files").warning(f"kept {folder}: it holds files fsedp did not write")


def _merge(staged: Path, path: Path):
    """Move the staged report's entries into the existing folder ``path`` (``--force``):
    namesakes are replaced, every other entry of ``path`` stays; the marker then lists our
    files, old and new."""
    entries = list(_entries(staged))
    for entry in entries:  # every obstacle first: a refused merge has moved nothing
        src, dst = staged / entry, path / entry
        if dst.is_symlink() or (dst.exists() and dst.is_dir() != src.is_dir()):
            raise InputError(str(dst), "<file>", "is in the way of the report's own entry")
    for entry in entries:
        src, dst = staged / entry, path / entry
        if src.is_dir():
            dst.mkdir(exist_ok=True)
        elif entry != OUTPUT_MARKER:
            os.replace(src, dst)
    kept = {e for e in (_manifest(path) or {}) if os.path.lexists(path / e)}
    _write_marker(path, kept | set(entries))


@contextlib.contextmanager
def work_folder(path, force: bool = False):
    """A folder a command fills in place as it goes (formal runs: the paths it prints while
    it works must stay true): checked as a report folder is (:func:`check_output_folder`),
    made, and on leaving given the marker listing what fsedp wrote there (with ``force``,
    only what was not there before)."""
    path = check_output_folder(path, force)
    try:
        before = set(_entries(path)) if path.is_dir() else set()
    except OSError as e:
        raise InputError(str(path), "<file>", f"cannot list {e.filename}: {e.strerror}") from None
    path = output_folder(path)
    ours = _manifest(path) or {}
    try:
        yield path
    finally:
        with contextlib.suppress(OSError, InputError):
            new = {e for e in _entries(path) if e not in before}
            kept = {e for e in ours if os.path.lexists(path / e)}
            _write_marker(path, new | kept | (before if not force else set()))


@contextlib.contextmanager
def output_dir(path, force: bool = False):
    """A report folder written whole or not at all.

    Yields a fresh temporary folder beside ``path``; when the block ends without an error
    it gets the marker :data:`OUTPUT_MARKER` and takes the place of ``path``:

    * no ``path`` yet: the staged folder is renamed to it;
    * ``path`` empty or one of ours (a marker listing everything it holds): it is replaced,
      and only the files of our earlier report are deleted;
    * ``path`` holding anything else: refused (checked before any work by
      :func:`check_output_folder`), unless ``force``, which moves the report's files into it
      and leaves every other file there as it was.

    On an error or an interrupt the staged folder is removed and ``path`` is untouched.
    The root, the current folder and the home folder are never used, ``--force`` or not."""
    path = check_output_folder(path, force)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staged, 0o777 & ~umask)  # mkdtemp makes 0700; a report is a normal folder
    except OSError as e:
        raise InputError(str(path), "<file>", f"cannot make the folder: {e.strerror}") from None
    try:
        yield staged
        path = check_output_folder(path, force)  # again: the run may have taken minutes
        _write_marker(staged, _entries(staged))
        if not os.path.lexists(path):
            os.rename(staged, path)
        elif not _foreign(path):
            ours = set(_manifest(path) or {})
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.rename(path, old / "report")
            if os.path.islink(old / "report") or not (old / "report").is_dir():
                os.rename(old / "report", path)  # made a link since the check: left as it is
                raise InputError(str(path), "<file>", "changed while the report was written")
            try:
                os.rename(staged, path)
            except BaseException:  # an error or an interrupt: the old report back in place
                os.rename(old / "report", path)
                with contextlib.suppress(OSError):
                    old.rmdir()
                raise
            _remove_ours(old / "report", ours | {OUTPUT_MARKER})
            with contextlib.suppress(OSError):
                old.rmdir()
        else:
            _merge(staged, path)
    except OSError as e:
        raise InputError(str(path), "<file>", f"cannot write the report: {e.strerror}") from None
    finally:
        shutil.rmtree(staged, ignore_errors=True)


@contextlib.contextmanager
def sigterm_raises(exc_type: type[BaseException]):
    """Inside the block SIGTERM (``timeout``, a job scheduler) raises ``exc_type`` where the
    program is, so that it unwinds as an interrupt does: staged outputs (:func:`output_dir`)
    are removed, a long run reports what it has done.  The previous handler is back on
    leaving.  Only the main thread can take signals: elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise exc_type

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


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
