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

Engines:

* ``local`` -- ``workers`` processes (default: up to 2 CPUs), or in this process for one
  worker or one point;
* ``ray`` -- tasks on a Ray cluster (``pip install 'fsedp[ray]'``): a local instance with
  ``workers`` CPUs, or an existing cluster at ``address`` (``ray://host:10001``, ``auto``).
"""

import functools
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from fsedp.errors import COMMAND_LINE, InputError

__all__ = ["ENGINES", "PointCache", "code_version", "default_cache_dir", "run_points"]

ENGINES = ("local", "ray")


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


class PointCache:
    """Results on disk, one JSON file per point, named by the hash of (point, code).  A file is
    written to a temporary name and renamed, so an interrupted write leaves nothing; a file
    that cannot be read back counts as missing."""

    def __init__(self, root: Path | str | None):
        self.root = Path(root) if root is not None else None

    def key(self, point) -> str:
        return hashlib.sha256(
            _canonical({"point": point, "code": code_version()}).encode()
        ).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str):
        if self.root is None:
            return None
        try:
            return json.loads(self._path(key).read_text())["result"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, result) -> None:
        if self.root is None:
            return
        path = self._path(key)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(_canonical({"result": result}))
            os.replace(tmp, path)
        except OSError as e:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            raise InputError(
                COMMAND_LINE, "--cache", f"{self.root}: cannot write ({e.strerror or e})"
            ) from None


def _roundtrip(result):
    """The JSON document a result is cached as (a fresh result is returned in the same form)."""
    return json.loads(_canonical(result))


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
) -> list:
    """``[fn(p, k) for p in points]``, from the cache where it can, the rest on ``engine``
    (those of the highest ``costs`` first, when given); each result is cached as soon as it
    is finished."""
    if engine not in ENGINES:
        raise InputError(
            COMMAND_LINE, "--engine", f"must be one of {', '.join(ENGINES)}, not {engine!r}"
        )
    cache = cache or PointCache(None)
    keys = [cache.key(p) for p in points]
    results = [cache.get(k) for k in keys]
    todo = [i for i, r in enumerate(results) if r is None]
    if costs is not None:  # the longest first: a shorter makespan on a few workers
        todo.sort(key=lambda i: -costs[i])
    from tqdm import tqdm

    cached = len(points) - len(todo)
    bar = tqdm(
        total=len(points),
        initial=cached,
        desc=f"{label} ({cached} cached)" if cached else label,
        unit="point",
        disable=not (progress and points),
        file=sys.stderr,
        leave=True,
    )

    def finish(i, result):
        results[i] = _roundtrip(result)
        cache.put(keys[i], results[i])
        bar.update()

    try:
        _run(fn, points, todo, finish, engine, workers, address)
    finally:
        bar.close()
    return results


def _run(fn, points, todo, finish, engine, workers, address):
    if todo and engine == "ray":
        _run_ray(fn, points, todo, finish, workers, address)
    elif todo:
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


def _run_ray(fn, points, todo, finish, workers, address):
    try:
        import ray
    except ImportError:
        raise InputError(
            COMMAND_LINE,
            "--engine",
            "ray is not installed; install the optional extra: pip install 'fsedp[ray]'",
        ) from None
    started = not ray.is_initialized()
    if started:
        kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        if address:
            kw["address"] = address
        else:
            kw["num_cpus"] = workers or min(2, os.cpu_count() or 1)
        try:
            ray.init(**kw)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = address or "a local instance"
            raise InputError(
                COMMAND_LINE, "--address", f"cannot start or reach Ray at {where}: {e}"
            ) from None
    try:
        task = ray.remote(num_cpus=1)(fn)
        refs = {task.remote(points[i], 1): i for i in todo}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                finish(refs[ref], ray.get(ref))
    finally:
        if started:
            ray.shutdown()
