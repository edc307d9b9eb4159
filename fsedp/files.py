"""Files a user gives or gets: bounded YAML reading, outputs written so that nothing
half-written is left behind (SIGTERM unwinds as an interrupt does), and where outputs go by
default."""

import contextlib
import errno
import hashlib
import os
import shutil
import signal
import stat
import tempfile
import threading
from pathlib import Path, PurePosixPath

import yaml

from fsedp import jsondoc
from fsedp.errors import EnvironmentFailure, InputError
from fsedp.log import logger

__all__ = [
    "atomic_path",
    "output_dir",
    "work_folder",
    "sigterm_raises",
    "OUTPUT_MARKER",
    "read_text",
    "read_bytes",
    "open_input",
    "check_input_file",
    "write_failure",
    "environment_failure",
    "kind_of",
    "LIMITS",
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


#: The most bytes fsedp reads from one file of each kind (``docs/configs.md``, "What fsedp
#: reads and writes").  A larger file is refused on one line before it is parsed.
LIMITS = {
    "yaml": 1 << 20,  # run configs, experiment files, device profiles: a few KiB
    "page": 16 << 20,  # Markdown pages with generated blocks (results.md is ~100 KiB)
    "text": 256 << 20,  # corpora for the LM and the tokenizer (WikiText-2 is ~11 MiB)
    "json": 64 << 20,  # JSON documents: tokenizers, serving logs, markers' folders
    "trace": 4 << 30,  # routing traces (jsonl, csv, npz); the importers' own caps apply too
    "liberty": 1 << 30,  # standard-cell libraries (SKY130 HD tt is ~12 MiB; some are ~1 GiB)
    "model": 4 << 30,  # model weights (.npz)
}

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """``"a regular file"``, ``"a folder"``, ``"a FIFO (named pipe)"``, ... of an
    ``st_mode``."""
    if stat.S_ISREG(mode):
        return "a regular file"
    for test, name in _KINDS:
        if test(mode):
            return name
    return "of an unknown kind"


def _refuse_special(path: Path):
    """The write rule: an existing output name fsedp may replace is a regular file.  A
    device, FIFO, socket (or anything else but a folder or link, which have their own
    messages) is refused: writing to it could block, or replace a system file such as
    ``/dev/null``."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise InputError(str(path), "<file>", f"cannot look at it: {e.strerror}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        raise InputError(
            str(path),
            "<file>",
            f"is {kind_of(mode)}; fsedp writes its outputs only as regular files and "
            "replaces nothing else: name a new or regular file",
        )


#: errno values that mean the machine, not the input, stopped a write or a read.
_ENVIRONMENT = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file-size limit (ulimit -f) is reached",
    errno.ENOMEM: "out of memory",
    errno.EIO: "an input/output error",
}


def environment_failure(e: OSError, what: str = "") -> EnvironmentFailure | None:
    """The :class:`~fsedp.errors.EnvironmentFailure` an ``OSError`` means when the machine
    refused (a full disk, a file-size limit, no memory, an I/O error), else ``None``."""
    if e.errno not in _ENVIRONMENT:
        return None
    if not what:
        what = f"writing {e.filename}" if e.filename else "writing a file"
    return EnvironmentFailure(
        what,
        _ENVIRONMENT[e.errno],
        "free space or raise the limit and run again; nothing half-written was left",
    )


def write_failure(path, e: OSError) -> Exception:
    """The one-line error of a failed write of ``path``: an
    :class:`~fsedp.errors.EnvironmentFailure` (exit 3) when the machine refused (a full
    disk, a file-size limit, no memory), else an :class:`~fsedp.errors.InputError` (a place
    the user named that cannot be written)."""
    failure = environment_failure(e, f"writing {path}")
    if failure is not None:
        return failure
    return InputError(str(path), "<file>", f"cannot write: {e.strerror or e}")


@contextlib.contextmanager
def atomic_path(path, suffix: str = ""):
    """Yield a temporary path next to ``path``; on success it is renamed to ``path``, on an
    exception it is removed.  ``suffix`` keeps an extension some writers insist on
    (``numpy.savez`` appends ``.npz`` to names without it).

    ``path`` itself must be absent or a regular file (:func:`check_output_file`): the rename
    would replace a user's link, device or FIFO, and writing through a link would replace
    the file it points at, so neither is done; checked again just before the rename."""
    path = Path(path)
    _refuse_link(path)
    _refuse_special(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=suffix or path.suffix, dir=path.parent
    )
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a written file is a normal one
    try:
        try:
            yield Path(tmp)
        except OSError as e:  # a full disk or a file-size limit: named, exit 3
            failure = environment_failure(e, f"writing {path}")
            if failure is None:
                raise
            raise failure from None
        _refuse_link(path)  # made while we worked: still never replaced
        _refuse_special(path)
        if os.path.isdir(path):
            raise InputError(str(path), "<file>", "is a folder; expected a file name")
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


def open_input(path, kind: str, field: str = "<file>", text: bool = False):
    """The read rule: ``path`` opened for reading, which must be a regular file (a FIFO or
    device is refused without blocking: opened non-blocking and checked with ``fstat``
    before any read) of at most ``LIMITS[kind]`` bytes; else an
    :class:`~fsedp.errors.InputError` naming ``path`` and ``field``.  A binary file object,
    or UTF-8 text with ``text``; the caller closes it (``with``)."""
    limit = LIMITS[kind]
    file = str(path)
    if "\0" in file or not file.strip():
        raise InputError(repr(file), field, "not a usable path")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputError(file, field, "no such file") from None
    except OSError as e:  # a folder, a socket (ENXIO), no permission, ...
        with contextlib.suppress(OSError):
            mode = os.stat(path).st_mode
            if not stat.S_ISREG(mode):
                raise InputError(file, field, f"is {kind_of(mode)}, not a regular file") from None
        raise InputError(file, field, f"cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(file, field, f"is {kind_of(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise InputError(
                file,
                field,
                f"{st.st_size} bytes, larger than the {limit} a {kind} file may hold here",
            )
        os.set_blocking(fd, True)
        if text:
            return open(fd, encoding="utf-8")
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path, kind: str, field: str = "<file>") -> bytes:
    """The bytes of ``path`` under the read rule (:func:`open_input`): a regular file of at
    most ``LIMITS[kind]`` bytes, else an :class:`~fsedp.errors.InputError` naming ``path``
    and ``field``."""
    limit = LIMITS[kind]
    with open_input(path, kind, field) as f:
        try:
            raw = f.read(limit + 1)
        except OSError as e:
            raise InputError(str(path), field, f"cannot read: {e.strerror or e}") from None
    if len(raw) > limit:  # grew while read
        raise InputError(
            str(path), field, f"larger than the {limit} bytes a {kind} file may hold here"
        )
    return raw


def check_input_file(path, kind: str, field: str = "<file>") -> Path:
    """The read rule checked without reading (for files a library opens itself by name):
    ``path`` opened as :func:`open_input` opens it, and closed."""
    with open_input(path, kind, field):
        return Path(path)


def read_text(path, kind: str = "page", field: str = "<file>") -> str:
    """A UTF-8 text file under the read rule (:func:`read_bytes`), or an
    :class:`~fsedp.errors.InputError` with ``field`` (``<file>``)."""
    raw = read_bytes(path, kind, field)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(path, field, f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def write_text(path, text: str):
    """Write ``text`` to ``path`` all at once (through :func:`atomic_path`): a failed run
    leaves the old file, or none, never half of the new one.  An output path that is a
    folder, or whose folder cannot be made, is an :class:`~fsedp.errors.InputError`."""
    path = check_output_file(path)
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    except OSError as e:
        raise write_failure(path, e) from None


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
    """Refuse, before any work, an output file path that is a folder, a symbolic link, a
    device, FIFO or socket, or cannot be written.  An existing regular file of that name is
    replaced (the user named it) once the new one is complete."""
    path = Path(path)
    _check_place(path)
    _refuse_link(path)
    if path.is_dir():
        raise InputError(str(path), "<file>", "is a folder; expected a file name")
    _refuse_special(path)
    return path


# -- report folders --------------------------------------------------------------------------
#: The file every output folder of fsedp holds: which entries fsedp wrote there, each with a
#: stamp (:func:`_stamp`).  An entry is fsedp's only while its stamp matches; a folder holding
#: nothing but entries of fsedp's may be replaced by the next report; any other entry is the
#: user's: refused without ``--force``, kept with it.
OUTPUT_MARKER = ".fsedp-output.json"
#: The marker's format: 2 stamps every entry with its kind, size, time and content hash.
MARKER_VERSION = 2
#: Entries looked at when deciding whether a folder is one of ours (a report has a few dozen).
_MAX_ENTRIES = 100_000
#: Bytes of a file hashed into its stamp (a report's files are smaller; a larger one is
#: hashed on its first MiB, beside its exact size and time).
_HASHED_BYTES = 1 << 20
#: Largest marker read (a report lists a few dozen entries).
_MAX_MARKER_BYTES = 1 << 22


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


class _Marker:
    """What a folder's marker says: ``state`` is ``"none"`` (no marker), ``"foreign"`` (a
    file of that name fsedp cannot have written: not JSON, another tool, a path outside the
    folder, no stamps), ``"old"`` (an earlier fsedp's, without content hashes) or ``"ok"``;
    ``stamps`` maps each listed entry to its recorded stamp (``None`` when unstamped)."""

    def __init__(self, folder: Path):
        self.state, self.stamps = "none", {}
        marker = folder / OUTPUT_MARKER
        try:
            st = os.lstat(marker)
        except FileNotFoundError:
            return
        except OSError:
            self.state = "foreign"
            return
        self.state = "foreign"
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_MARKER_BYTES:
            return
        try:
            with open(marker, "rb") as f:
                doc = jsondoc.loads(f.read(_MAX_MARKER_BYTES + 1).decode("utf-8"))
        except (OSError, ValueError, RecursionError):
            return
        if not isinstance(doc, dict) or doc.get("tool") != "fsedp":
            return
        files, stamps = doc.get("files"), doc.get("stamps")
        if not isinstance(files, list) or not all(isinstance(f, str) and _plain(f) for f in files):
            return  # a marker naming "../x" or "/x" is not one fsedp wrote
        if not isinstance(stamps, dict):
            return
        self.stamps = {f: stamps.get(f) for f in files if f != OUTPUT_MARKER}
        self.state = "ok" if doc.get("version") == MARKER_VERSION else "old"

    def owns(self, folder: Path, entry: str) -> bool:
        """``entry`` is fsedp's: listed with a stamp of this format that matches it now."""
        if self.state != "ok":
            return False
        recorded = self.stamps.get(entry)
        return recorded is not None and recorded == _stamp(folder / entry)

    def ours(self, folder: Path) -> set[str]:
        """The listed entries that are fsedp's now (:meth:`owns`)."""
        return {e for e in self.stamps if self.owns(folder, e)}


def _plain(entry: str) -> bool:
    """A relative path in normal form that stays inside its folder."""
    p = PurePosixPath(entry)
    return bool(entry) and not p.is_absolute() and ".." not in p.parts and p.as_posix() == entry


def _stamp(p: Path) -> list | None:
    """What identifies an entry fsedp wrote, so that one the user has changed, replaced or
    added since is the user's: ``["file", size, mtime_ns, sha256 of the first MiB]`` for a
    regular file, ``["dir", mtime_ns]`` for a folder (its time moves when an entry is added
    or removed), ``["link", target, mtime_ns]`` for a symbolic link; ``None`` for anything
    else or what cannot be read."""
    try:
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            fd = os.open(
                p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
            )
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return None
                h.update(f.read(_HASHED_BYTES))
            return ["file", st.st_size, st.st_mtime_ns, h.hexdigest()]
        if stat.S_ISDIR(st.st_mode):
            return ["dir", st.st_mtime_ns]
        if stat.S_ISLNK(st.st_mode):
            return ["link", os.readlink(p), st.st_mtime_ns]
    except OSError:
        return None
    return None


def _entries(folder: Path):
    """Every entry under ``folder`` (relative paths, folders before what they hold), links
    not followed."""

    def fail(e: OSError):  # a folder that cannot be listed is never taken as empty
        raise e

    for root, dirs, files in os.walk(folder, followlinks=False, onerror=fail):
        rel = Path(root).relative_to(folder)
        for name in sorted(dirs) + sorted(files):
            yield (rel / name).as_posix()


def _foreign(folder: Path, marker: "_Marker | None" = None) -> list[str]:
    """Entries of the existing folder ``folder`` that are not fsedp's (at most a few):
    everything when it has no marker of this fsedp, else what its marker does not list or
    lists with another stamp (changed or replaced by the user since), and what cannot be
    read."""
    marker = marker or _Marker(folder)
    found = []
    if marker.state == "foreign":
        found.append(f"{OUTPUT_MARKER} (not a marker fsedp wrote)")
    elif marker.state == "old":
        found.append(f"{OUTPUT_MARKER} (an earlier fsedp's, without content stamps)")
    try:
        for n, entry in enumerate(_entries(folder)):
            if n >= _MAX_ENTRIES:
                found.append(f"more than {_MAX_ENTRIES} entries")
                break
            if entry == OUTPUT_MARKER or any(entry.startswith(f + "/") for f in found):
                continue
            if marker.owns(folder, entry):
                continue
            if marker.state == "ok" and marker.stamps.get(entry) is not None:
                found.append(f"{entry} (changed since fsedp wrote it)")
            elif marker.state == "ok" and entry in marker.stamps:
                found.append(f"{entry} (listed in the marker without a stamp)")
            else:
                found.append(entry)
            if len(found) >= 3:
                break
    except OSError as e:
        found.append(f"{e.filename} (cannot be read)")
    return found


def check_output_folder(path, force: bool = False) -> Path:
    """Refuse, before any work, an output folder that cannot hold a report: a file, a
    symbolic link, a place that cannot be written, the root, the current or home folder (or
    one above them), and, unless ``force``, an existing folder holding anything fsedp did
    not write there (:func:`_foreign`).  With ``force`` a folder whose marker fsedp cannot
    have written is still refused: the report's marker would replace it.  Nothing is created
    here (:func:`output_dir` makes the folder when the outputs are complete)."""
    path = Path(path)
    _check_place(path)
    _refuse_link(path)
    _refuse_special(path)
    if path.exists() and not path.is_dir():
        raise InputError(str(path), "<file>", "is a file; expected a folder for the outputs")
    why = _protected(path)
    if why:
        raise InputError(
            str(path),
            "<file>",
            f"{why}; a report needs a folder of its own, e.g. {path / 'report'}",
        )
    if path.is_dir():
        marker = _Marker(path)
        if force and marker.state == "foreign":
            raise InputError(
                str(path / OUTPUT_MARKER),
                "<file>",
                "is not a marker fsedp wrote and would be replaced by the report's: move it "
                "away or choose another folder",
            )
        foreign = [] if force else _foreign(path, marker)
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
    a link, a device or FIFO, or cannot be made."""
    path = Path(path)
    _check_place(path)
    _refuse_link(path)
    _refuse_special(path)
    if path.exists() and not path.is_dir():
        raise InputError(str(path), "<file>", "is a file; expected a folder for the outputs")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(str(path), "<file>", f"cannot make the folder: {e.strerror}") from None
    return path


def _write_marker(folder: Path, files):
    """The marker of ``folder``, listing ``files`` (entries inside it, never the folder
    itself) with their stamps as they are now; the marker itself is listed, unstamped.
    Written last, when every entry is in place: a folder's stamp is its time after
    everything in it was written."""
    names = sorted(set(files) | {OUTPUT_MARKER})
    stamps = {f: s for f in names if f != OUTPUT_MARKER and (s := _stamp(folder / f))}
    doc = {"tool": "fsedp", "version": MARKER_VERSION, "files": names, "stamps": stamps}
    with atomic_path(folder / OUTPUT_MARKER) as tmp:
        tmp.write_text(jsondoc.dumps(doc, indent=0) + "\n")


def _remove_ours(folder: Path, ours: set[str]):
    """Remove from ``folder`` the entries of ``ours`` (deepest first; folders only when
    empty), then the folder if nothing else is left.  ``ours`` must be entries whose stamps
    matched (:meth:`_Marker.ours`), taken before any removal moved a folder's time; only
    entries found inside ``folder`` (walked, links not followed) are touched."""
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
    with contextlib.suppress(OSError):
        folder.rmdir()


def _put_back(old: Path, path: Path):
    """Move what is left in ``old`` (entries not fsedp's, made while the report was written)
    into the new report folder ``path``, never over an entry there; what cannot move stays
    in ``old``, which is then kept and named."""
    try:
        left = list(_entries(old))
    except OSError:
        left = []
    for entry in left:  # folders before their entries: a folder moved takes them along
        src, dst = old / entry, path / entry
        if not os.path.lexists(src) or os.path.lexists(dst):
            continue
        with contextlib.suppress(OSError):
            os.rename(src, dst)
    _remove_empty(old)
    if os.path.lexists(old):
        logger("files").warning(
            f"kept {old}: it holds files fsedp did not write, made while the report was "
            f"written, whose names the new report of {path} took"
        )


def _remove_empty(folder: Path):
    """Remove the empty folders under ``folder`` (deepest first) and ``folder`` if then
    empty."""
    with contextlib.suppress(OSError):
        for entry in sorted(_entries(folder), key=lambda e: e.count("/"), reverse=True):
            with contextlib.suppress(OSError):
                if (folder / entry).is_dir() and not (folder / entry).is_symlink():
                    (folder / entry).rmdir()
        folder.rmdir()


def _merge(staged: Path, path: Path):
    """Move the staged report's entries into the existing folder ``path`` (``--force``):
    a namesake of fsedp's is replaced, a folder is merged into, and any other namesake (the
    user's) refuses the whole merge before anything moves; every other entry of ``path``
    stays.  The marker then lists fsedp's entries, old and new."""
    marker = _Marker(path)
    before = marker.ours(path)
    entries = list(_entries(staged))
    for entry in entries:  # every obstacle first: a refused merge has moved nothing
        src, dst = staged / entry, path / entry
        if entry == OUTPUT_MARKER or not os.path.lexists(dst):
            continue
        both_dirs = src.is_dir() and dst.is_dir() and not dst.is_symlink()
        if not both_dirs and entry not in before:
            raise InputError(
                str(dst),
                "<file>",
                "is the user's and in the way of the report's own entry of that name "
                "(--force writes beside a user's files, never over them)",
            )
    made = set()
    for entry in entries:
        src, dst = staged / entry, path / entry
        if src.is_dir():
            if not os.path.lexists(dst):
                dst.mkdir()
                made.add(entry)
        elif entry != OUTPUT_MARKER:
            os.replace(src, dst)
            made.add(entry)
    kept = {e for e in before if os.path.lexists(path / e)}
    _write_marker(path, kept | made)


@contextlib.contextmanager
def work_folder(path, force: bool = False):
    """A folder a command fills in place as it goes (formal runs: the paths it prints while
    it works must stay true): checked as a report folder is (:func:`check_output_folder`),
    made, and on leaving given the marker listing what fsedp wrote there: what is new, and
    what was fsedp's before (a user's entry never becomes fsedp's)."""
    path = check_output_folder(path, force)
    try:
        before = set(_entries(path)) if path.is_dir() else set()
    except OSError as e:
        raise InputError(str(path), "<file>", f"cannot list {e.filename}: {e.strerror}") from None
    path = output_folder(path)
    ours = _Marker(path).ours(path)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError, InputError):
            new = {e for e in _entries(path) if e not in before and e != OUTPUT_MARKER}
            kept = {e for e in ours if os.path.lexists(path / e)}
            _write_marker(path, new | kept)


@contextlib.contextmanager
def output_dir(path, force: bool = False):
    """A report folder written whole or not at all.

    Yields a fresh temporary folder beside ``path``; when the block ends without an error
    it gets the marker :data:`OUTPUT_MARKER` and takes the place of ``path``:

    * no ``path`` yet: the staged folder is renamed to it;
    * ``path`` empty or one of ours (every entry fsedp's by its marker's stamps): it is
      replaced, and only the entries of our earlier report are deleted;
    * ``path`` holding anything else: refused (checked before any work by
      :func:`check_output_folder`), unless ``force``, which moves the report's files into it
      and leaves every other entry there as it was (a user's namesake refuses the merge).

    On an error or an interrupt the staged folder is removed and ``path`` is untouched.
    The root, the current folder and the home folder are never used, ``--force`` or not.
    A full disk or file-size limit while the report is written is an
    :class:`~fsedp.errors.EnvironmentFailure` (exit 3), with nothing half-written left."""
    path = check_output_folder(path, force)
    made = [p for p in path.parents if not os.path.lexists(p)]  # removed again on a failure
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
            ours = _Marker(path).ours(path)  # stamps taken before anything moves
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
            _put_back(old / "report", path)
            with contextlib.suppress(OSError):
                old.rmdir()
        else:
            _merge(staged, path)
        made = []
    except OSError as e:
        raise write_failure(path, e) from None
    finally:
        shutil.rmtree(staged, ignore_errors=True)
        for p in made:  # deepest first: folders this report made above it, when empty
            with contextlib.suppress(OSError):
                p.rmdir()


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
MAX_YAML_BYTES = LIMITS["yaml"]
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
        # every error of PyYAML's safe loader marks its problem; the reader's (a character
        # YAML does not allow) has no mark and no problem, only its message
        mark = getattr(e, "problem_mark", None)
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


def read_yaml(path, field: str = "<file>") -> dict:
    """:func:`parse_yaml` of a file under the read rule (:func:`read_bytes`, at most
    :data:`MAX_YAML_BYTES`, a regular file), UTF-8; an unreadable file is an
    :class:`~fsedp.errors.InputError` with the field ``field`` (``<file>``)."""
    file = str(path)
    raw = read_bytes(path, "yaml", field)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(file, field, f"not UTF-8 text (byte {e.start})") from None
    return parse_yaml(text, file)


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend (no screen needed): every plot of
    the project is a PNG written to a file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
