"""One executor for the points of a sweep (experiment files, ``fsedp sweep``): a local process
pool by default, Ray for sweeps beyond one machine, every finished point cached.

A *point* is a JSON-safe description of one simulation (a run config as a dict, the
strategies, iterations, layers); ``fn(point, workers)`` returns a JSON-safe result, using
``workers`` processes of its own (all of them when points run one at a time, else one).  Results are
cached on disk by a content hash of the point and of the code (:func:`code_version`: every
source and config file of the installed package), so a sweep that was interrupted or is
extended computes only the points it has not finished before, and a change of the code
invalidates everything.  A cached result and a fresh one are the same JSON document, so a
sweep gives the same table either way.  Results do not depend on the engine or the workers.
Nothing in the cache is trusted: an entry that is not what the writer produces (its envelope,
:func:`decode_entry`, and its result, the ``check`` of :func:`run_points`) is recomputed,
replaced, and reported on one line on stderr (a warning of the ``fsedp.executor`` logger).

Engines:

* ``local`` -- ``workers`` processes (default: up to 2 CPUs), or in this process for one
  worker or one point;
* ``ray`` -- tasks on a Ray cluster (``pip install 'fsedp[ray]'``): a local instance with
  ``workers`` CPUs, or an existing cluster at ``address`` (``ray://host:10001``, ``auto``),
  reached within :data:`RAY_CONNECT_TIMEOUT_S` seconds or refused on one line.
"""

import functools
import hashlib
import json
import logging
import math
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fsedp import jsondoc
from fsedp.errors import COMMAND_LINE, InputError
from fsedp.log import logger
from fsedp.log import progress as progress_bar

__all__ = [
    "ENGINES",
    "BadEntry",
    "MISSING",
    "PointCache",
    "code_version",
    "decode_entry",
    "default_cache_dir",
    "encode_entry",
    "run_points",
]

ENGINES = ("local", "ray")

log = logger("executor")

#: A cache entry larger than this is refused unread (a sweep point's is a few KiB).
MAX_ENTRY_BYTES = 1 << 20
#: Arrays and objects nest at most this deep in a cache entry (a sweep point's: 6 levels).
MAX_ENTRY_DEPTH = 32
#: Seconds to reach the Ray cluster at ``--address`` before the address is refused: the TCP
#: probe and a trial connection from a child process together, then ``ray.init`` here.
RAY_CONNECT_TIMEOUT_S = 20


#: the packages whose files decide a simulation's result (the RTL, testbenches and the CLI
#: do not)
_CODE = ("fsedp", "fsedp.trace", "fsedp.lm", "fsedp.sw", "fsedp.sim", "fsedp.configs")


@functools.cache
def code_version() -> str:
    """SHA-256 over the simulation's Python sources and embedded configs (names and bytes),
    read where the package is installed."""
    from importlib import resources

    h = hashlib.sha256()
    for pkg in _CODE:
        root = Path(str(resources.files(pkg)))
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts:
                name = f"{pkg}/{path.relative_to(root).as_posix()}"
                h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def default_cache_dir() -> Path:
    """``$FSEDP_CACHE``, else ``$XDG_CACHE_HOME/fsedp/points``, else ``~/.cache/fsedp/points``."""
    if os.environ.get("FSEDP_CACHE"):
        return Path(os.environ["FSEDP_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fsedp" / "points"


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# -- cache entries -----------------------------------------------------------------------------
class BadEntry(Exception):
    """A cache entry that is not one :func:`encode_entry` writes; ``reason`` says why."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


#: :meth:`PointCache.read` of a point that has no entry
MISSING = object()


def encode_entry(result) -> bytes:
    """The bytes of the cache entry of ``result``: canonical JSON ``{"result": RESULT}``.
    Raises ``ValueError`` for a number that is not finite and ``TypeError`` for a value JSON
    has no form for; what it returns, :func:`decode_entry` reads back as ``result`` unless the
    entry is over :data:`MAX_ENTRY_BYTES` or nests deeper than :data:`MAX_ENTRY_DEPTH`."""
    return jsondoc.dumps({"result": result}, sort_keys=True, separators=(",", ":")).encode()


def _finite(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"number out of range: {text[:20]}")
    return x


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON has")


def decode_entry(data: bytes):
    """The result held by the bytes of a cache entry; :class:`BadEntry` unless they are what
    :func:`encode_entry` writes: UTF-8 JSON of at most :data:`MAX_ENTRY_BYTES`, an object
    whose one key is ``result``, every number finite (no ``NaN``, ``Infinity`` or ``1e999``),
    arrays and objects nested at most :data:`MAX_ENTRY_DEPTH` deep.  Never recurses deeper
    than the entry allows: a document nested 100 000 deep is refused, not a RecursionError."""
    if len(data) > MAX_ENTRY_BYTES:
        raise BadEntry(f"larger than {MAX_ENTRY_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"), parse_float=_finite, parse_constant=_no_constant)
    except RecursionError:
        raise BadEntry(f"nested deeper than {MAX_ENTRY_DEPTH}") from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError included
        raise BadEntry(f"not JSON: {str(e)[:80]}") from None
    if not isinstance(doc, dict) or list(doc) != ["result"]:
        raise BadEntry('not an object {"result": ...}')
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_ENTRY_DEPTH:
                raise BadEntry(f"nested deeper than {MAX_ENTRY_DEPTH}")
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items)
    return doc["result"]


class PointCache:
    """Results on disk, one JSON file per point, named by the hash of (point, code).  A file is
    written to a temporary name and renamed, so an interrupted write leaves nothing, and a
    bad entry is replaced, never written through (a link is replaced by a file)."""

    def __init__(self, root: Path | str | None):
        self.root = Path(root) if root is not None else None

    def key(self, point) -> str:
        return hashlib.sha256(
            _canonical({"point": point, "code": code_version()}).encode()
        ).hexdigest()

    def path(self, key: str) -> Path:
        """The file of the entry ``key`` (its folder: the key's first two digits)."""
        return self.root / key[:2] / f"{key}.json"

    def read(self, key: str):
        """The result cached under ``key``; :data:`MISSING` without a cache or an entry;
        :class:`BadEntry` for a file that is not a regular file (a link, a FIFO, a device or
        a folder are not opened for reading, so nothing blocks), cannot be read, or is not
        what :func:`encode_entry` writes (:func:`decode_entry`)."""
        if self.root is None:
            return MISSING
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
        path = self.path(key)
        try:
            if path.is_symlink():
                raise BadEntry("a symbolic link, not a file")
            fd = os.open(path, flags)
        except FileNotFoundError:
            return MISSING
        except OSError as e:
            raise BadEntry(f"cannot be read: {e.strerror or e}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise BadEntry("not a regular file")
            chunks, size = [], 0
            while size <= MAX_ENTRY_BYTES:
                chunk = os.read(fd, MAX_ENTRY_BYTES + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError as e:
            raise BadEntry(f"cannot be read: {e.strerror or e}") from None
        finally:
            os.close(fd)
        return decode_entry(b"".join(chunks))

    def put(self, key: str, result) -> None:
        """Cache ``result`` under ``key`` (:func:`encode_entry`), atomically: the entry is
        either the old file or the whole new one."""
        if self.root is None:
            return
        data = encode_entry(result)
        path = self.path(key)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as e:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            raise InputError(
                COMMAND_LINE, "--cache", f"{self.root}: cannot write ({e.strerror or e})"
            ) from None


def _entry_form(result, point, check, label: str):
    """``result`` as its cache entry holds it (a cached result and a fresh one are the same
    JSON document); a RuntimeError when the entry's reader would refuse it: ``fn`` and its
    ``check`` disagree, a bug, never a user's doing."""
    try:
        doc = decode_entry(encode_entry(result))
        why = check(point, doc) if check is not None else None
    except (TypeError, ValueError) as e:
        why = str(e) or type(e).__name__
    except BadEntry as e:
        why = e.reason
    if why:
        raise RuntimeError(f"{label}: a computed result is not a valid cache entry: {why}")
    return doc


def _report(bad: dict, root) -> None:
    """One line on stderr for the bad entries of a run (``{path: reason}``), before they are
    recomputed: the first, its reason, and how many more."""
    (path, reason), more = next(iter(bad.items())), len(bad) - 1
    also = f", and {more} more bad entries in {root}" if more else ""
    line = InputError(path, "<cache>", f"unreadable entry ({reason[:200]}); recomputing it{also}")
    log.warning("%s", line)


def run_points(
    fn,
    points: list,
    *,
    engine: str = "local",
    workers: int | None = None,
    address: str | None = None,
    cache: PointCache | None = None,
    progress: bool = True,
    label: str = "sweep",
    costs: list | None = None,
    check=None,
) -> list:
    """``[fn(p, k) for p in points]``, from the cache where it can, the rest on ``engine``
    (those of the highest ``costs`` first, when given); each result is cached as soon as it
    is finished.

    ``check(point, result)``: ``None`` when ``result`` has the shape ``fn`` gives ``point``,
    else what is wrong (it never raises).  A cache entry that is not a valid entry
    (:meth:`PointCache.read`) or fails ``check`` is recomputed and replaced, and the run
    reports its bad entries on one line on stderr; a fresh result that fails it is a
    RuntimeError (:func:`_entry_form`), so every entry written passes the reader's check."""
    if engine not in ENGINES:
        raise InputError(
            COMMAND_LINE, "--engine", f"must be one of {', '.join(ENGINES)}, not {engine!r}"
        )
    cache = cache or PointCache(None)
    keys = [cache.key(p) for p in points]
    results, bad = [], {}
    for point, key in zip(points, keys):
        try:
            result = cache.read(key)
            why = None if result is MISSING or check is None else check(point, result)
            if why:
                raise BadEntry(why)
        except BadEntry as e:
            bad.setdefault(str(cache.path(key)), e.reason)
            result = MISSING
        results.append(result)
    if bad:
        _report(bad, cache.root)
    todo = [i for i, r in enumerate(results) if r is MISSING]
    if costs is not None:  # the longest first: a shorter makespan on a few workers
        todo.sort(key=lambda i: -costs[i])
    # Ray is reached (or refused) before the progress bar starts: a refusal is one line
    ray, started = _ray_connect(workers, address) if todo and engine == "ray" else (None, False)
    try:
        cached = len(points) - len(todo)
        bar = progress_bar(  # on a terminal only, never in a log file
            total=len(points),
            initial=cached,
            desc=f"{label} ({cached} cached)" if cached else label,
            unit="point",
            quiet=not (progress and points),
            leave=True,
        )

        def finish(i, result):
            results[i] = _entry_form(result, points[i], check, label)
            cache.put(keys[i], results[i])
            bar.update()

        try:
            if ray is not None:
                _run_ray(ray, fn, points, todo, finish)
            else:
                _run_local(fn, points, todo, finish, workers)
        finally:
            bar.close()
    finally:
        if started:
            ray.shutdown()
    return results


def _run_local(fn, points, todo, finish, workers):
    if not todo:
        return
    workers = workers or min(2, os.cpu_count() or 1)
    if workers == 1 or len(todo) == 1:
        for i in todo:
            finish(i, fn(points[i], workers))
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=min(workers, len(todo))) as pool:
            futures = {pool.submit(fn, points[i], 1): i for i in todo}
            try:
                for f in as_completed(futures):
                    finish(futures[f], f.result())
            except BaseException:
                for f in futures:
                    f.cancel()
                raise


# -- Ray ---------------------------------------------------------------------------------------
def _ray_endpoint(address: str) -> tuple[str, int] | None:
    """The host and port of ``HOST:PORT`` or ``ray://HOST:PORT`` (``[::1]:PORT`` for IPv6),
    ``None`` for ``auto`` and ``local``; an InputError naming ``--address`` for anything
    else."""
    if address in ("auto", "local"):
        return None
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not (sep and host and port.isascii() and port.isdigit() and 0 < int(port) < 65536) or (
        "/" in rest or any(c.isspace() for c in rest)
    ):
        raise InputError(
            COMMAND_LINE,
            "--address",
            f"must be HOST:PORT, ray://HOST:PORT, auto or local, not {address[:80]!r}",
        )
    return host, int(port)


def _probe(address: str, endpoint: tuple[str, int], timeout: float) -> None:
    """Open and close a TCP connection to where ``ray.init`` dials for ``address`` (for
    ``HOST:PORT`` Ray dials this machine's network address in place of a loopback one); an
    InputError naming ``--address`` when none opens within ``timeout`` seconds."""
    host, port = endpoint
    if not address.startswith("ray://"):
        try:
            from ray._private.services import resolve_ip_for_localhost

            host = resolve_ip_for_localhost(host)
        except Exception:  # a Ray without it: the host as given
            pass
    try:
        with socket.create_connection((host, port), timeout=max(timeout, 0.1)):
            pass
    except OSError as e:
        reason = (
            f"no answer within {RAY_CONNECT_TIMEOUT_S} s"
            if isinstance(e, TimeoutError)
            else e.strerror or str(e)
        )
        raise InputError(
            COMMAND_LINE, "--address", f"cannot reach Ray at {address[:80]}: {reason}"
        ) from None


def _ray_reason(e: BaseException) -> str:
    """Why Ray failed, on one line: the first line of ``e`` and, when it was raised from
    another exception, of the first cause (a message that embeds a traceback is represented
    by its last line, the exception it is about)."""
    said = []
    while e is not None and len(said) < 8:
        lines = [x for x in str(e).splitlines() if x.strip()] or [type(e).__name__]
        said.append(lines[-1 if "Traceback (most recent call last)" in lines[0] else 0])
        e = e.__cause__
    return (said[0] if len(said) == 1 else f"{said[0]} ({said[-1]})")[:300]


#: The child process of :func:`_ray_answers`: connects to the cluster at ``argv[1]`` and
#: disconnects; a failure is its last line on stdout, after ``_RAY_FAILED``.
_RAY_FAILED = "fsedp-ray-failed: "
_RAY_CHECK = f"""
import sys
try:
    from fsedp.sim.executor import _ray_reason
except Exception:  # fsedp not importable here: Ray's first line
    def _ray_reason(e):
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
try:
    import ray
    ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    ray.shutdown()
except BaseException as e:
    print({_RAY_FAILED!r} + _ray_reason(e), flush=True)
    sys.exit(1)
"""


def _ray_answers(address: str, timeout: float) -> None:
    """Returns when a child process connects to the Ray cluster at ``address`` and
    disconnects within ``timeout`` seconds, else an InputError naming ``--address`` with
    Ray's reason.  Ray's retries and their warnings stay in the child: its stderr is dropped,
    and the child, with all it started, is killed when the time is up (or on an interrupt),
    so nothing of a cluster that never answers is left in this process."""
    env = dict(os.environ)
    # Ray retries the cluster once a second, 20 times by default: 10 leave time to hear why
    env.setdefault("RAY_NUM_REDIS_GET_RETRIES", str(RAY_CONNECT_TIMEOUT_S // 2))
    proc = subprocess.Popen(
        [sys.executable, "-c", _RAY_CHECK, address],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    try:
        out, _ = proc.communicate(timeout=max(timeout, 0.1))
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise InputError(
            COMMAND_LINE,
            "--address",
            f"Ray at {address[:80]} gave no answer within {RAY_CONNECT_TIMEOUT_S} s",
        ) from None
    except BaseException:
        _kill(proc)
        raise
    if proc.returncode != 0:
        said = [x for x in out.splitlines() if x.startswith(_RAY_FAILED)]
        reason = said[-1][len(_RAY_FAILED) :] if said else f"exit status {proc.returncode}"
        raise InputError(COMMAND_LINE, "--address", f"cannot reach Ray at {address[:80]}: {reason}")


def _kill(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and its process group (it leads one: ``start_new_session``), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (AttributeError, OSError):  # no process groups here, or already gone
        proc.kill()
    proc.wait()


class _OffMainThreadNotice(logging.Filter):
    """Drops Ray's notice that ``ray.init`` ran off the main thread and left SIGTERM alone:
    it runs there on purpose (:func:`_ray_init`), and the notice would break the one-line
    refusals."""

    def filter(self, record) -> bool:
        return not str(record.msg).startswith("SIGTERM handler is not set")


def _ray_init(ray, address: str | None, workers: int | None) -> None:
    """``ray.init``: a local instance of ``workers`` CPUs without ``address`` (or with
    ``local``; ``RAY_ADDRESS`` is not consulted then), else a connection to the cluster at
    ``address``.  Raises an InputError on one line for an address that is not a Ray address
    (:func:`_ray_endpoint`), a host or port that refuses a TCP connection (:func:`_probe`),
    a cluster that does not answer within :data:`RAY_CONNECT_TIMEOUT_S` seconds
    (:func:`_ray_answers`), and Ray's own failure here.

    A connection runs in a daemon thread, given up (and left to Ray) after another
    :data:`RAY_CONNECT_TIMEOUT_S` seconds: one that never returns keeps no process alive.  A
    local instance starts in this thread: Ray ties the processes it starts to the thread that
    starts them (they died with a helper thread, measured with Ray 2.60), and Ray's own start
    checks bound it."""
    kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if address in (None, "local"):
        kw.update(address="local", num_cpus=workers or min(2, os.cpu_count() or 1))
        try:
            ray.init(**kw)
        except Exception as e:
            raise InputError(
                COMMAND_LINE, "--engine", f"cannot start a local Ray instance: {_ray_reason(e)}"
            ) from None
        return
    deadline = time.monotonic() + RAY_CONNECT_TIMEOUT_S
    endpoint = _ray_endpoint(address)
    if endpoint is not None:
        _probe(address, endpoint, deadline - time.monotonic())
    _ray_answers(address, deadline - time.monotonic())
    box = {}

    def attempt():
        try:
            ray.init(address=address, **kw)
        except BaseException as e:  # handed to the caller
            box["error"] = e

    worker_log = logging.getLogger("ray._private.worker")
    if not any(isinstance(f, _OffMainThreadNotice) for f in worker_log.filters):
        worker_log.addFilter(_OffMainThreadNotice())
    thread = threading.Thread(target=attempt, name="fsedp-ray-init", daemon=True)
    thread.start()
    thread.join(RAY_CONNECT_TIMEOUT_S)
    where = f"Ray at {address[:80]}"
    if thread.is_alive():
        raise InputError(
            COMMAND_LINE, "--address", f"{where} gave no answer within {RAY_CONNECT_TIMEOUT_S} s"
        )
    if "error" in box:
        raise InputError(
            COMMAND_LINE, "--address", f"cannot reach {where}: {_ray_reason(box['error'])}"
        ) from None


def _ray_connect(workers: int | None, address: str | None):
    """The ``ray`` module, connected (:func:`_ray_init`) unless it already was, and whether
    it was connected here (then the caller shuts it down); an InputError on one line when Ray
    is not installed or cannot be started or reached."""
    try:
        import ray
    except ImportError:
        raise InputError(
            COMMAND_LINE,
            "--engine",
            "ray is not installed; install the optional extra: pip install 'fsedp[ray]'",
        ) from None
    if ray.is_initialized():
        return ray, False
    _ray_init(ray, address, workers)
    return ray, True


def _run_ray(ray, fn, points, todo, finish):
    task = ray.remote(num_cpus=1)(fn)
    refs = {task.remote(points[i], 1): i for i in todo}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            finish(refs[ref], ray.get(ref))
