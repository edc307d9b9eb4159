"""The offload model's decisions executed on real hardware (``fsedp offload --trace T
--replay``), and a device profile fitted from measured primitives (``fsedp offload
--profile-device OUT.yaml``); ``docs/offload.md``.

The replay takes the ordered decisions of :meth:`OffloadRuntime.decisions` and runs them
with torch on the current device (CUDA when present, else the CPU):

* **host store**: one bf16 tensor per expert id (``3 d f`` values: ``W1 [d, f]``,
  ``W3 [d, f]``, ``W2 [f, d]``, random), shared by the layers -- every transfer moves the
  model's bytes; pinned memory on CUDA;
* **cache**: per layer, ``capacity`` slots of one expert each on the device, first filled
  (untimed) with the model's initial units; a fetch copies the expert into the slot the
  model's LRU put it in (a buffer of its own when the model found no room);
* **link**: one FIFO of copies -- a copy stream on CUDA; on the CPU a copy thread (torch
  releases the GIL while it copies), so prefetches overlap compute as the model says;
* **compute**: per (step, layer), once its demand fetches and the prefetches it uses have
  arrived (CUDA events the compute stream waits on; thread events on the CPU), the layer's
  dense FLOPs (one ``[d, 4d]`` matmul of its tokens) and each expert's SwiGLU ``silu(x W1)
  * (x W3) W2`` on its tokens, **eager**, one expert after another (no CUDA graph, no
  batching);
* copies of a layer are issued when the layer starts, after the previous layer's compute
  (the copy stream waits for it): the model's clock, in which a layer's transfers and a
  slot's overwrite never precede the compute before them.

Measured tokens/s is the replay's tokens over its wall time (the device synchronised at the
end); the model predicts the same sizes (``--replay-scale`` divides ``d_model`` and
``d_ffn``) with the device profile it is given.
"""

import gc
import math
import queue
import threading
import time

import numpy as np

from fsedp.errors import COMMAND_LINE, InputError

__all__ = [
    "torch_device",
    "replay_sizes",
    "replay_trace",
    "execute",
    "measure_primitives",
    "fit_profile",
    "profile_device",
    "format_replay",
]


def _torch():
    try:
        import torch
    except ImportError:
        raise InputError(
            COMMAND_LINE, "--replay", "needs torch: pip install 'fsedp[model]'"
        ) from None
    return torch


def torch_device():
    """CUDA when present, else the CPU."""
    torch = _torch()
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def replay_dtype(dev):
    """bf16 on CUDA (as offloaded); float32 on the CPU, where bf16 matmuls are emulated (slow
    and erratic) -- the model is then given 4 bytes per weight."""
    torch = _torch()
    return torch.bfloat16 if dev.type == "cuda" else torch.float32


class _threads:
    """On the CPU, one torch thread for the compute (the copy thread takes another core):
    the profile and the replay measure the same arrangement."""

    def __init__(self, dev):
        self.dev = dev

    def __enter__(self):
        torch = _torch()
        self.n = torch.get_num_threads()
        if self.dev.type == "cpu":
            torch.set_num_threads(1)

    def __exit__(self, *exc):
        _torch().set_num_threads(self.n)
        return False


def replay_sizes(scale_to: str, scale: int = 1) -> tuple[int, int]:
    """``(d_model, d_ffn)`` of ``scale_to`` divided by ``scale`` (at least 1 each)."""
    from fsedp.experiments.offload import expert_sizes

    d, f = expert_sizes(scale_to)
    return max(1, d // scale), max(1, f // scale)


# -- the link: one FIFO of copies -----------------------------------------------------------
class _ThreadLink:
    """CPU: a copy thread taking copies in order; a copy's handle is a thread event."""

    def __init__(self):
        self.q: queue.Queue = queue.Queue()
        self.times: list = []
        self.failed: BaseException | None = None
        self.t = threading.Thread(target=self._work, daemon=True)
        self.t.start()

    def _work(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            dst, src, done = item
            try:
                t0 = time.perf_counter()
                dst.copy_(src)
                self.times.append(time.perf_counter() - t0)
            except BaseException as e:  # reported by the waiter, never lost
                self.failed = e
            done.set()

    def after(self, _event):
        """The copies issued next start after the compute before them: on the CPU the
        compute ran in the caller's thread and has returned."""

    def copy(self, dst, src):
        done = threading.Event()
        self.q.put((dst, src, done))
        return done

    def wait(self, handle):
        handle.wait()
        if self.failed is not None:
            raise self.failed

    def finish(self, handles):
        """Return once the copies of ``handles`` (issued in order) are done."""
        for h in handles:
            self.wait(h)

    def close(self):
        self.q.put(None)
        self.t.join()
        if self.failed is not None:
            raise self.failed


class _StreamLink:
    """CUDA: a copy stream; a copy's handle is an event the compute stream waits on."""

    def __init__(self, torch, dev):
        self.torch = torch
        self.s = torch.cuda.Stream(dev)
        self.compute = torch.cuda.Stream(dev)
        self.times: list = []

    def after(self, event):
        if event is not None:
            self.s.wait_event(event)

    def copy(self, dst, src):
        with self.torch.cuda.stream(self.s):
            dst.copy_(src, non_blocking=True)
            e = self.torch.cuda.Event()
            e.record(self.s)
        return e

    def wait(self, handle):
        self.compute.wait_event(handle)

    def finish(self, handles):
        """Return once the copies of ``handles`` (issued in order on one stream) are done."""
        if handles:
            handles[-1].synchronize()

    def close(self):
        self.torch.cuda.synchronize()


def _link(torch, dev):
    return _StreamLink(torch, dev) if dev.type == "cuda" else _ThreadLink()


def _sync(torch, dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _ffn(torch, x, w, d: int, f: int):
    """SwiGLU of the expert packed in ``w`` (``W1``, ``W3``, ``W2``) on ``x [n, d]``."""
    w1 = w[: d * f].view(d, f)
    w3 = w[d * f : 2 * d * f].view(d, f)
    w2 = w[2 * d * f :].view(f, d)
    return (torch.nn.functional.silu(x @ w1) * (x @ w3)) @ w2


def _scratch_needed(decisions) -> int:
    """Most buffers of their own (slot -1) live at once: from a fetch to its layer's run."""
    live, most = set(), 0
    for ev in decisions:
        key = (ev["step"], ev["layer"])
        if ev["op"] == "fetch" and ev["slot"] < 0:
            live.add((key, ev["unit"]))
            most = max(most, len(live))
        elif ev["op"] == "run":
            live = {k for k in live if k[0] != key}
    return most


def execute(decisions, rt, sizes, dev, seed: int = 0, verify: bool = False) -> dict:
    """Run ``decisions`` (of ``rt``, an :class:`OffloadRuntime` after its run) with torch on
    ``dev``: real copies into real caches, real dense and expert compute, each run waiting
    for the fetches the model says.  Returns what was done (``order``: ``("fetch", kind,
    step, layer, unit)`` and ``("run", step, layer, units)`` in execution order;
    ``bytes``, ``fetches``, ``expert_runs``), the wall time and its parts.  ``verify``:
    before each run, check that every expert it uses holds that expert's weights (slow: for
    tests)."""
    torch = _torch()
    with _threads(dev):
        return _execute(torch, decisions, rt, sizes, dev, seed, verify)


_STORES: dict = {}


def _host(t, dev):
    """``t`` as host memory a copy to ``dev`` reads: pinned on CUDA (as offloaded weights)."""
    return t.pin_memory() if dev.type == "cuda" else t


def _store(torch, units: int, n: int, dtype, dev, seed: int):
    """The host store of ``units`` random experts of ``n`` weights (pinned on CUDA), built
    once per shape and seed: repeated replays copy from the same memory."""
    key = (units, n, str(dtype), dev.type, seed)
    if key not in _STORES:
        _STORES.clear()  # one store at a time: they can be gigabytes
        g = torch.Generator().manual_seed(seed)
        _STORES[key] = _host((torch.randn(units, n, generator=g) * 0.05).to(dtype), dev)
    return _STORES[key]


def _execute(torch, decisions, rt, sizes, dev, seed, verify):
    d, f = sizes
    n = 3 * d * f
    dtype = replay_dtype(dev)
    esize = torch.empty(0, dtype=dtype).element_size()
    store = _store(torch, rt.units, n, dtype, dev, seed)
    g = torch.Generator().manual_seed(seed + 1)  # the activations and the dense weights
    caches = [torch.empty(rt.capacity, n, dtype=dtype, device=dev) for _ in range(rt.layers)]
    for layer, units in enumerate(rt.initial):  # the model's initial residents, untimed
        for slot, u in enumerate(units):
            caches[layer][slot].copy_(store[u])
    scratch = [torch.empty(n, dtype=dtype, device=dev) for _ in range(_scratch_needed(decisions))]
    free = list(range(len(scratch)))
    own: dict = {}  # (step, layer, unit) -> scratch index
    batch = max((ev["tokens"] for ev in decisions if ev["op"] == "run"), default=1)
    x = (torch.randn(batch, d, generator=g) * 0.5).to(dtype).to(dev)
    dense = (torch.randn(d, 4 * d, generator=g) * 0.02).to(dtype).to(dev)
    content = [dict(zip(range(rt.capacity), units)) for units in rt.initial]
    link = _link(torch, dev)
    compute = getattr(link, "compute", None)
    ready: dict = {}
    order, moved, fetches, runs, checks = [], 0, 0, 0, 0
    run_s = []
    prev = None  # the event of the last compute (CUDA)
    issued_after = True
    _sync(torch, dev)
    gc_was = gc.isenabled()
    gc.disable()  # no collector pauses inside the timed loop
    t0 = time.perf_counter()
    try:
        for ev in decisions:
            step, layer = ev["step"], ev["layer"]
            if ev["op"] == "fetch":
                if not issued_after:
                    link.after(prev)
                    issued_after = True
                u, slot = ev["unit"], ev["slot"]
                if slot >= 0:
                    dst = caches[layer][slot]
                    content[layer][slot] = u
                else:
                    i = free.pop()
                    own[(step, layer, u)] = i
                    dst = scratch[i]
                ready[(step, layer, u)] = link.copy(dst, store[u])
                moved += n * esize
                fetches += 1
                order.append(("fetch", ev["kind"], step, layer, u))
                continue
            for u in ev["waits"]:
                link.wait(ready.pop((step, layer, u)))
            bufs = []
            for u, slot in zip(ev["units"], ev["slots"]):
                if slot >= 0:
                    if content[layer].get(slot) != u:
                        raise RuntimeError(
                            f"replay: step {step} layer {layer} runs expert {u} from slot "
                            f"{slot}, which holds {content[layer].get(slot)}"
                        )
                    bufs.append(caches[layer][slot])
                else:
                    bufs.append(scratch[own[(step, layer, u)]])
            if verify:
                _sync(torch, dev)
                for u, w in zip(ev["units"], bufs):
                    assert torch.equal(w.cpu(), store[u]), (step, layer, u)
                    checks += 1
            tr = time.perf_counter()
            ctx = torch.cuda.stream(compute) if compute is not None else _nullcontext()
            with ctx:
                xs = x[: ev["tokens"]]
                xs @ dense
                for w, c in zip(bufs, ev["counts"]):
                    _ffn(torch, x[:c], w, d, f)
                    runs += 1
                if compute is not None:
                    prev = torch.cuda.Event()
                    prev.record(compute)
            run_s.append(time.perf_counter() - tr)
            issued_after = False
            for key in [k for k in own if k[:2] == (step, layer)]:
                free.append(own.pop(key))
            for key in [k for k in ready if k[:2] == (step, layer)]:
                del ready[key]  # prefetches the layer did not use: nothing waits for them
            order.append(("run", step, layer, tuple(ev["units"])))
        _sync(torch, dev)
        wall = time.perf_counter() - t0
    finally:
        if gc_was:
            gc.enable()
        link.close()
    return {
        "order": order,
        "bytes": moved,
        "fetches": fetches,
        "expert_runs": runs,
        "wall_s": wall,
        "copy_s": float(sum(link.times)) if link.times else None,
        "compute_issue_s": float(sum(run_s)),
        "verified_experts": checks,
    }


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def replay_trace(
    trace, cfg, sizes, dev, steps=None, fit: float = 0.2, verify=False, repeat: int = 1
) -> dict:
    """The model on ``trace`` at ``sizes`` (``cfg``'s device profile) and its replay on
    ``dev``: predicted against measured tokens/s, and what each moved and ran.  ``repeat``
    runs: the median wall time is the measurement, every run's kept."""
    import dataclasses

    from fsedp.experiments.offload import deployment_cost, trace_runtime

    torch = _torch()
    esize = torch.empty(0, dtype=replay_dtype(dev)).element_size()
    cost = deployment_cost(cfg, sizes=sizes, weight_bytes=esize)
    rt = trace_runtime(trace, cfg, fit, cost=cost, steps=steps)
    stats = rt.timing()
    model = stats.as_dict()
    decisions = rt.decisions()
    runs = [execute(decisions, rt, sizes, dev, seed=cfg.seed, verify=verify) for _ in range(repeat)]
    walls = [r["wall_s"] for r in runs]
    run = runs[int(np.argsort(walls)[(len(walls) - 1) // 2])]  # the median run (lower middle)
    measured = stats.tokens / run["wall_s"] if run["wall_s"] else None
    pred = model["tokens_per_s"]
    return {
        "cache_rate": cfg.cache_rate,
        "prefetch": cfg.prefetch,
        "steps": stats.steps,
        "tokens": stats.tokens,
        "predicted_tokens_per_s": pred,
        "measured_tokens_per_s": round(measured, 2) if measured else None,
        "error": round(pred / measured - 1, 4) if pred and measured else None,
        "predicted_s": round(stats.time_s, 6),
        "measured_s": round(run["wall_s"], 6),
        "runs_s": [round(w, 6) for w in walls],
        "model_bytes": stats.bytes,
        "replay_bytes": float(run["bytes"]),
        "demand_fetches": stats.demand,
        "prefetches": stats.prefetched,
        "fetches": run["fetches"],
        "expert_runs": run["expert_runs"],
        "copy_s": None if run["copy_s"] is None else round(run["copy_s"], 6),
        "decisions": len(decisions),
        "cfg": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "buddy"},
    }


# -- primitives and the fitted profile -----------------------------------------------------
def _timed(torch, dev, fn, repeat: int) -> float:
    """Median over 3 rounds of ``repeat`` calls of ``fn``, seconds per call."""
    fn()
    _sync(torch, dev)
    rounds = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        _sync(torch, dev)
        rounds.append((time.perf_counter() - t0) / repeat)
    return float(np.median(rounds))


def measure_primitives(sizes, batch: int, dev, repeat: int = 20) -> dict:
    """Times on ``dev`` of the replay's primitives through its own code paths: copies of
    1/16, 1/4, 1 and 2 experts' bytes from the host store over the link (back to back, the
    link's steady rate), one expert's SwiGLU at 1, 2, 4, ... ``batch`` tokens, and the dense
    matmul of ``batch`` tokens."""
    torch = _torch()
    with _threads(dev):
        return _measure(torch, sizes, batch, dev, repeat)


def _measure(torch, sizes, batch, dev, repeat):
    d, f = sizes
    n = 3 * d * f
    dtype = replay_dtype(dev)
    esize = torch.empty(0, dtype=dtype).element_size()
    copies = {}
    link = _link(torch, dev)
    try:
        for frac in (1 / 16, 1 / 4, 1, 2):
            m = max(1, int(n * frac))
            # sources rotated over more memory than a CPU cache holds, as the replay's store
            srcs = _host(torch.randn(_cold(m * esize), m).to(dtype), dev)
            dst = torch.empty(m, dtype=dtype, device=dev)
            turn = iter(range(1 << 62))

            def burst(srcs=srcs, dst=dst, turn=turn):
                link.finish([link.copy(dst, srcs[next(turn) % len(srcs)]) for _ in range(4)])

            copies[m * esize] = _timed(torch, dev, burst, max(1, repeat // 4)) / 4
        issue_s = _issue_time(torch, dev, link, dtype, n)
    finally:
        link.close()
    w = (torch.randn(n) * 0.05).to(dtype).to(dev)
    x = (torch.randn(batch, d) * 0.5).to(dtype).to(dev)
    dense = (torch.randn(d, 4 * d) * 0.02).to(dtype).to(dev)
    tokens = sorted({min(batch, 2**i) for i in range(int(math.log2(batch)) + 1)} | {batch})
    ffn = {t: _timed(torch, dev, lambda t=t: _ffn(torch, x[:t], w, d, f), repeat) for t in tokens}
    dense_s = _timed(torch, dev, lambda: x @ dense, repeat)
    device_s = _device_time(torch, dev, lambda: _ffn(torch, x, w, d, f), repeat) or ffn[batch]
    in_loop = _in_loop(torch, sizes, batch, dev, dense_s)
    return {
        "copy_s": copies,
        "ffn_s": ffn,
        "dense_s": dense_s,
        "batch": batch,
        "issue_s": issue_s,
        "device_s": device_s,
        "in_loop": in_loop,
    }


class _Synthetic:
    """A runtime shaped for :func:`_execute`: ``units`` experts, all resident in one layer."""

    def __init__(self, units: int):
        self.units = self.capacity = units
        self.layers = 1
        self.initial = [list(range(units))]


def _in_loop(torch, sizes, batch: int, dev, dense_s: float, units: int = 8, layers: int = 40):
    """One expert run's seconds inside the replay's own loop: a synthetic schedule of
    ``layers`` layer runs of ``units`` resident experts at ``batch // units`` tokens each (no
    copies), executed by :func:`_execute`, its wall time less the dense matmuls, per expert
    run (median of 3).  The runs rotate over enough resident experts to exceed a CPU cache,
    as the replay's caches do.  Under asynchronous issue this is the host's time per expert
    run as the replay spends it; ``tokens`` is the count it was measured at."""
    c = max(1, batch // units)
    d, f = sizes
    resident = _cold(3 * d * f * torch.empty(0, dtype=replay_dtype(dev)).element_size(), units)
    runs = []
    for s in range(layers):
        us = [(s * units + j) % resident for j in range(units)]
        runs.append(dict(op="run", step=s, layer=0, tokens=batch, units=us, counts=[c] * units,
                         slots=us, waits=[]))  # fmt: skip
    rt = _Synthetic(resident)
    walls = [_execute(torch, runs, rt, sizes, dev, 0, False)["wall_s"] for _ in range(3)]
    per = (float(np.median(walls)) - layers * dense_s) / (layers * units)
    return {"tokens": c, "s": max(per, 0.0)}


#: bytes beyond any CPU cache: measurements rotate over at least this much memory
COLD_BYTES = 64 * 2**20


def _cold(item_bytes: int, lo: int = 1, hi: int = 256) -> int:
    """How many items of ``item_bytes`` fill :data:`COLD_BYTES` (``lo`` .. ``hi``)."""
    return int(min(hi, max(lo, math.ceil(COLD_BYTES / max(1, item_bytes)))))


def _issue_time(torch, dev, link, dtype, n: int) -> float:
    """Host seconds to issue one expert-sized copy on the link (the issuing loop alone; the
    copies are waited for afterwards), median of 3 rounds of 8."""
    src = _host(torch.randn(n).to(dtype), dev)
    dst = torch.empty(n, dtype=dtype, device=dev)
    rounds = []
    for _ in range(3):
        t0 = time.perf_counter()
        hs = [link.copy(dst, src) for _ in range(8)]
        rounds.append((time.perf_counter() - t0) / 8)
        link.finish(hs)
    return float(np.median(rounds))


def _device_time(torch, dev, fn, repeat: int) -> float | None:
    """CUDA: the device's own seconds per call of ``fn`` -- the calls queued behind a sleep
    kernel, so the device runs them back to back without waiting for the host -- timed by
    CUDA events, median of 3 rounds.  None elsewhere (the CPU runs what the host issues)."""
    if dev.type != "cuda" or not hasattr(torch.cuda, "_sleep"):
        return None
    fn()
    torch.cuda.synchronize(dev)
    rounds = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(5e7))  # ~25 ms: the host queues the calls meanwhile
        a.record()
        for _ in range(repeat):
            fn()
        b.record()
        torch.cuda.synchronize(dev)
        rounds.append(a.elapsed_time(b) * 1e-3 / repeat)
    return float(np.median(rounds))


#: Largest relative standard error of the fitted copy slope (1 / bandwidth) a written
#: profile may rest on: beyond it the link term is not resolved by the measured copies.
FIT_MAX_SLOPE_ERROR = 0.25


def _line(x, y):
    """Least squares ``y = slope x + icpt``: ``(slope, icpt, rse, slope_se)``, with ``rse``
    the residual standard error ``sqrt(RSS / (n - 2))`` and ``slope_se`` the slope's standard
    error (both ``inf`` with two points or fewer: no residual to judge the fit by)."""
    slope, icpt = np.polyfit(x, y, 1)
    if len(x) <= 2:
        return float(slope), float(icpt), math.inf, math.inf
    rss = float(np.sum((y - (slope * x + icpt)) ** 2))
    rse = math.sqrt(rss / (len(x) - 2))
    return float(slope), float(icpt), rse, rse / math.sqrt(float(np.sum((x - x.mean()) ** 2)))


def _check_fit(link, launch_fit, raw: dict, table: dict, where: str):
    """Refuse a fit that :func:`fit_profile` would otherwise clamp or rest on noise: an
    :class:`~fsedp.errors.EnvironmentFailure` with the figures (the measurement, not the
    user's input, is at fault), so that no such profile is written.

    * the copy slope (1 / ``link_gbs``) must be positive and known to
      :data:`FIT_MAX_SLOPE_ERROR` (its standard error over itself);
    * a negative intercept (``link_latency_us``, ``expert_launch_us``) is written as 0 when
      it is within its fit's residual standard error of 0, else refused;
    * every other figure (``raw``: field -> value in the field's unit) must lie inside its
      field's range (:class:`~fsedp.sw.policies.device.DeviceProfile`), not be clamped to it,
      and so must each entry of ``table`` (``expert_table_us``: 0..1e8 us).
    """
    from fsedp.errors import EnvironmentFailure
    from fsedp.fields import specs
    from fsedp.sw.policies.device import DeviceProfile

    problems = []
    (b, t), (slope, icpt, rse, slope_se) = link
    span = f"copies of {b[0]:.4g}..{b[-1]:.4g} B took {t.min() * 1e6:.4g}..{t.max() * 1e6:.4g} us"
    if slope <= 0:
        problems.append(f"link_gbs not resolved: {span}, not growing with the bytes")
    elif slope_se > FIT_MAX_SLOPE_ERROR * slope:
        problems.append(
            f"link_gbs not resolved: {span}; the fit gives {1 / slope / 1e9:.4g} GB/s "
            f"+- {slope_se / slope * 100:.0f} % (bound {FIT_MAX_SLOPE_ERROR * 100:.0f} %), "
            f"residual {rse * 1e6:.3g} us"
        )
    for field, (icpt_s, rse_s) in (
        ("link_latency_us", (icpt, rse)),
        ("expert_launch_us", launch_fit),
    ):
        if icpt_s < -rse_s:
            problems.append(
                f"{field} fitted {icpt_s * 1e6:.4g} us, below 0 by more than the fit's "
                f"residual {rse_s * 1e6:.3g} us"
            )
    fields = specs(DeviceProfile)
    for field, v in raw.items():
        s = fields[field]
        if not (math.isfinite(v) and s.lo <= v <= s.hi):
            problems.append(
                f"{field} measured {v:.4g} {s.unit}, outside the field's range {s.range_text()}"
            )
    for k, us in table.items():
        if not 0 <= us <= 1e8:
            problems.append(f"expert_table_us.{k} came out {us:.4g} us, outside 0..1e+08 us")
    if problems:
        raise EnvironmentFailure(
            f"fitting a device profile on {where}",
            ", ".join(problems),
            "nothing was written; measure again on a quiet machine, with larger copies (a "
            "smaller --replay-scale) where the link is not resolved",
        )


def fit_profile(prims: dict, sizes, dev, name: str, base) -> "object":
    """A device profile from measured primitives: link bandwidth and latency by least
    squares of copy time on bytes; per-expert launch and rate by least squares of FFN time
    on tokens, and the FFN times themselves as ``expert_table_us``; ``expert_tflops`` the
    dense matmul's rate at ``batch`` tokens (it prices the layer's dense FLOPs).  The
    serving model's fields are ``base``'s (not measured here).

    A fit that is not resolved or that a field's range would clamp is refused, never
    written (:func:`_check_fit`; ``docs/offload.md``): identical CPU runs of tiny copies
    fitted ``link_gbs`` anywhere from 0.5 GB/s to the field's limit 1e5."""
    from fsedp.sw.policies.device import DeviceProfile

    d, f = sizes
    b = np.array(sorted(prims["copy_s"]), dtype=float)
    t = np.array([prims["copy_s"][k] for k in sorted(prims["copy_s"])])
    link = _line(b, t)
    slope, icpt = link[0], link[1]
    ks = np.array(sorted(prims["ffn_s"]), dtype=float)
    ts = np.array([prims["ffn_s"][k] for k in sorted(prims["ffn_s"])])
    if len(ks) > 1:
        fs, fi, frse, _ = _line(ks, ts)
    else:
        fs, fi, frse = 0.0, ts[0], 0.0
    dense_rate = prims["batch"] * 2 * 4 * d * d / prims["dense_s"] / 1e12
    where = _torch().cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    raw = {
        "link_latency_us": max(0.0, icpt) * 1e6,
        "expert_launch_us": max(0.0, fi) * 1e6,
        "link_issue_us": prims["issue_s"] * 1e6,
        "expert_device_us": prims["device_s"] * 1e6,
        "expert_tflops": dense_rate,
    }
    if slope > 0:
        raw["link_gbs"] = 1.0 / slope / 1e9
    # the FFN alone, scaled to what an expert run costs inside the replay's loop (measured at
    # in_loop's tokens; the loop's own overhead per run applied at every count)
    loop = prims["in_loop"]
    alone = float(np.interp(loop["tokens"], ks, ts))
    extra = loop["s"] - alone
    table = {int(k): (float(v) + extra) * 1e6 for k, v in prims["ffn_s"].items()}
    _check_fit(((b, t), link), (fi, frse), raw, table, where)
    gbs, lat, launch = raw["link_gbs"], raw["link_latency_us"], raw["expert_launch_us"]
    table = {k: round(us, 3) for k, us in table.items()}
    return DeviceProfile(
        name=name,
        link_gbs=round(gbs, 4),  # each inside its field's range (_check_fit)
        link_latency_us=round(lat, 3),
        pinned=dev.type == "cuda",
        expert_launch_us=round(launch, 3),
        link_issue_us=round(raw["link_issue_us"], 3),
        issue="async" if dev.type == "cuda" else "sync",
        expert_device_us=round(raw["expert_device_us"], 3),
        expert_tflops=round(dense_rate, 6),
        tflops=base.tflops,
        memory_gbs=base.memory_gbs,
        step_launch_us=base.step_launch_us,
        expert_table_us=table,
        source=f"fitted by fsedp offload --profile-device on {where} (d {d}, f {f}, "
        f"{str(replay_dtype(dev)).replace('torch.', '')}); "
        f"per-expert slope {fs * 1e6:.4g} us/token; expert_table_us is the FFN alone "
        f"({', '.join(f'{k}: {v * 1e6:.4g}' for k, v in sorted(prims['ffn_s'].items()))} us) "
        f"plus {extra * 1e6:.4g} us per run measured inside the replay's loop; serving fields "
        f"from {base.name}",
    )


def profile_device(sizes, batch: int, dev, out, name: str = "fitted", base=None):
    """Measure the primitives on ``dev``, fit a profile and write it to ``out`` at once
    (no half-written file on failure or Ctrl-C).  Returns the profile."""
    from fsedp.files import write_text
    from fsedp.sw.policies.device import load_device, profile_yaml

    base = base or load_device()
    prof = fit_profile(measure_primitives(sizes, batch, dev), sizes, dev, name, base)
    write_text(out, profile_yaml(prof, "device profile fitted by `fsedp offload --profile-device`"))
    return prof


def format_replay(name, cfg, sizes, dev, rows, scale) -> str:
    d, f = sizes
    out = [
        f"replay of the offload model's decisions on {name} (fetch on demand, steps of "
        f"{cfg.batch} tokens, {cfg.scale_to} / {scale}: d {d}, f {f}, "
        f"{3 * d * f * _esize(dev) / 1e6:.4g} MB per expert in "
        f"{str(replay_dtype(dev)).replace('torch.', '')}) on {dev}, eager SwiGLU experts, "
        f"predicted with device profile {cfg.device}:\n",
        "| cache rate | prefetcher | steps | fetches | expert runs | MB moved (model / replay) "
        "| predicted tokens/s | measured tokens/s | error | wall s (runs) |",
        "|---:|---|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        err = "-" if r["error"] is None else f"{r['error'] * 100:+.1f} %"
        runs = ", ".join(f"{w:.3f}" for w in r.get("runs_s", [r["measured_s"]]))
        out.append(
            f"| {r['cache_rate']} | {r['prefetch']} | {r['steps']} | {r['fetches']} | "
            f"{r['expert_runs']} | {r['model_bytes'] / 1e6:.3f} / {r['replay_bytes'] / 1e6:.3f} "
            f"| {r['predicted_tokens_per_s']} | {r['measured_tokens_per_s']} | {err} | {runs} |"
        )
    return "\n".join(out)


def _esize(dev) -> int:
    return _torch().empty(0, dtype=replay_dtype(dev)).element_size()
