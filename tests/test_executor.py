"""The sweep executor (``fsedp.sim.executor``): the point cache, an interrupted sweep that
restarts without recomputing, the local pool and Ray giving the same results."""

import json
import os

import pytest

from fsedp.cli import main
from fsedp.sim.executor import PointCache, code_version, run_points

EXPERIMENT = """\
experiment: sweep
figure: "test"
table: latency
hardware: chip2x2
models: [deepseek-moe-16b, qwen3-30b-a3b]
tokens: [%s]
iterations: 1
layers: 1
strategies: [EP, A3]
seed: 1
"""


def square(point, workers):
    """A point function that leaves a mark per computation (it may run in another process)."""
    with open(os.path.join(point["marks"], f"{point['x']}.{os.getpid()}"), "a") as f:
        f.write("x")
    if point["x"] == point.get("fail_at"):
        raise KeyboardInterrupt  # the user stops the sweep here
    return {"x": point["x"], "square": point["x"] ** 2, "workers": workers}


def marks(folder):
    """The points computed, once per computation."""
    out = []
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            out += [int(name.split(".")[0])] * len(f.read())
    return sorted(out)


def points(tmp_path, n, **kw):
    folder = tmp_path / "marks"
    folder.mkdir(exist_ok=True)
    return [{"x": x, "marks": str(folder), **kw} for x in range(n)]


def test_cache_key_depends_on_the_point_and_the_code(tmp_path):
    cache = PointCache(tmp_path)
    assert cache.key({"a": 1, "b": 2}) == cache.key({"b": 2, "a": 1})
    assert cache.key({"a": 1}) != cache.key({"a": 2})
    assert len(code_version()) == 64 and code_version() == code_version()


@pytest.mark.parametrize("workers", [1, 2])
def test_results_in_order_cached_and_identical(tmp_path, workers):
    cache = PointCache(tmp_path / "cache")
    pts = points(tmp_path, 5)
    first = run_points(square, pts, workers=workers, cache=cache, progress=False)
    assert [r["square"] for r in first] == [0, 1, 4, 9, 16]
    assert marks(pts[0]["marks"]) == [0, 1, 2, 3, 4]
    again = run_points(square, pts, workers=workers, cache=cache, progress=False)
    assert again == first and marks(pts[0]["marks"]) == [0, 1, 2, 3, 4]  # nothing recomputed


def test_interrupted_sweep_restarts_without_recomputing(tmp_path):
    cache = PointCache(tmp_path / "cache")
    pts = points(tmp_path, 6)
    with pytest.raises(KeyboardInterrupt):
        run_points(
            square, [{**p, "fail_at": 3} for p in pts], workers=1, cache=cache, progress=False
        )
    # the three finished points are on disk, nothing half-written
    assert marks(pts[0]["marks"]) == [0, 1, 2, 3]
    files = list((tmp_path / "cache").rglob("*"))
    assert sum(f.suffix == ".json" for f in files) == 3 and not any(
        f.suffix == ".tmp" for f in files
    )
    # the restart (the same points, without the interruption) computes only the other three
    for f in (tmp_path / "marks").iterdir():
        f.unlink()
    keyed = [{**p, "fail_at": 3} for p in pts]
    res = run_points(
        lambda p, w: square({**p, "fail_at": None}, w),
        keyed,
        workers=1,
        cache=cache,
        progress=False,
    )
    assert marks(pts[0]["marks"]) == [3, 4, 5]
    assert [r["square"] for r in res] == [0, 1, 4, 9, 16, 25]


def test_unreadable_cache_entry_is_recomputed(tmp_path):
    cache = PointCache(tmp_path / "cache")
    pts = points(tmp_path, 2)
    run_points(square, pts, workers=1, cache=cache, progress=False)
    (tmp_path / "cache").joinpath(cache.key(pts[1])[:2], cache.key(pts[1]) + ".json").write_text(
        "{"
    )
    res = run_points(square, pts, workers=1, cache=cache, progress=False)
    assert res[1]["square"] == 1 and marks(pts[0]["marks"]) == [0, 1, 1]


def test_experiment_file_cached_and_extended(tmp_path, capsys):
    """A sweep run twice computes nothing the second time; extended by a token count, it
    computes only the new points; the tables are the same either way."""
    exp, cache = tmp_path / "exp.yaml", tmp_path / "cache"
    exp.write_text(EXPERIMENT % "16")

    def run():
        assert main(["run", "--config", str(exp), "--cache", str(cache), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        return [strip(r) for r in doc["rows"]], len(list(cache.rglob("*.json")))

    first, n = run()
    assert n == 2 and len(first) == 2
    again, n = run()
    assert again == first and n == 2
    exp.write_text(EXPERIMENT % "16, 64")
    wider, n = run()
    assert n == 4 and [r for r in wider if r["tokens"] == 16] == first


def strip(row):
    """A sweep row without wall times (the only field that differs between two runs)."""
    return {
        k: ({kk: vv for kk, vv in v.items() if kk != "wall_s"} if isinstance(v, dict) else v)
        for k, v in row.items()
    }


def test_ray_gives_the_local_pool_results(tmp_path, capsys):
    pytest.importorskip("ray", reason="ray is an optional extra: pip install 'fsedp[ray]'")
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT % "16")
    rows = {}
    for engine in ("local", "ray"):
        args = ["run", "--config", str(exp), "--no-cache", "--engine", engine, "--workers", "2"]
        assert main([*args, "--json"]) == 0
        rows[engine] = [strip(r) for r in json.loads(capsys.readouterr().out)["rows"]]
    assert rows["ray"] == rows["local"] and len(rows["local"]) == 2


@pytest.mark.parametrize(
    "args,option",
    [
        (["--address", "auto"], "--address"),
        (["--cache", "x", "--no-cache"], "--cache"),
        (["--cache", "{file}"], "exp.yaml"),
        (["--engine", "spark"], "--engine"),
    ],
)
def test_bad_executor_arguments_one_line_exit_2(tmp_path, capsys, args, option):
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT % "16")
    args = [a.format(file=exp) for a in args]
    assert main(["run", "--config", str(exp), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and option in err and "Traceback" not in err
