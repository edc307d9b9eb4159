"""MoE-Prism's online QoS scheduling (``002_808375f33056e8fe.txt``, Section 5.1): the
quality-constrained throughput scheduler against FIFO and FullBatch, on a discrete-event
model of one serving instance (``docs/serving.md``).

* **Operating points**: ``K`` = sub-experts run per token (1 .. top_k x S); the quality of
  each is the perplexity of the project's refactored MoE LM at that ``K`` (``fsedp prism
  curve``). The original model has only ``K = S`` (top-1) and ``K = top_k x S`` (top-2).
* **Performance model** ``f(K, B)``, seconds per decode step of a batch of ``B`` requests,
  from the deployment's sizes (a model config, default Mixtral-8x7B: top-2, so ``K`` has the
  LM's range) on an accelerator (``flops``, memory ``bandwidth``): ``launch + max(compute,
  memory)``, compute = ``B (dense + K x sub-expert) FLOPs``, memory = dense weights plus the
  distinct sub-experts the batch touches, ``U = N (1 - (1 - K / N)^B)`` per layer for ``N``
  sub-experts (uniform routing). Prefill: compute-bound, ``prompt tokens x FLOPs / flops``.
* **Requests** (:func:`workload`): Poisson arrivals, prompt and output lengths uniform in
  ranges, a quality floor per request (the largest perplexity it accepts); a request can
  run at any ``K`` whose perplexity meets its floor.
* **Batches run to completion** (static batching): prefill of all prompts, then decode steps
  until the longest output is done; a request's first token comes after the prefill, its
  last after its own output length.
* **QoS scheduler**: one virtual queue per ``K``; a request joins every queue whose ``K``
  meets its floor; when the instance is free it launches, in order of precedence, the queue
  holding a request older than ``timeout`` (timeout trigger), a queue with ``max_batch``
  requests (batch-full trigger), else the queue of highest utility = local throughput
  (output tokens of the batch / its time), ties to the lower ``K``; the launched requests
  leave every queue at once.
* **FIFO**: when free, the oldest ``max_batch`` pending requests, at the smallest original
  operating point that meets all their floors.  **FullBatch**: the same, but it waits for
  ``max_batch`` requests (or ``timeout`` for the oldest).

**Continuous batching** (:func:`serve_continuous`, as vLLM and SGLang batch): requests join
and leave the running batch at every step.  A step prefills the requests admitted at its
start and runs one decode step of every running request (each new one gets its first token
at the end of that step); a request leaves after its last token, and its slot is free for
the next step.  Admission is in arrival order into free slots (at most ``max_batch``
running).  The operating point is decided per step:

* **QoS**: MoE-Prism's sub-experts are chosen per token, so each request runs at its own
  ``K``, the smallest of the refactored model's points that meets its floor (the virtual
  queue it is served from: with the batch shared, a lower ``K`` only shortens the step);
  the step costs :meth:`PerfModel.step_mixed_s` of the running requests' ``K``;
* **FIFO**: the original model's points, one per step: the smallest that meets every
  running request's floor (a request records the largest ``K`` it ran at).

FullBatch, which waits for a full batch, has no continuous form.
"""

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "PerfModel",
    "Request",
    "workload",
    "serve",
    "serve_continuous",
    "metrics",
    "POLICIES",
    "CONTINUOUS_POLICIES",
]

POLICIES = ("qos", "fifo", "fullbatch")
CONTINUOUS_POLICIES = ("qos", "fifo")


@dataclass(frozen=True)
class PerfModel:
    """The sizes of a deployment on an accelerator (``flops`` FLOP/s, memory ``bandwidth``
    bytes/s, ``launch_s`` per decode step): :meth:`on` takes the accelerator from a device
    profile (:mod:`fsedp.sw.policies.device`)."""

    layers: int
    d_model: int
    d_ffn: int
    experts: int
    top_k: int
    S: int = 4
    flops: float = field(kw_only=True)
    bandwidth: float = field(kw_only=True)
    launch_s: float = field(kw_only=True)
    bytes_per_param: float = 2.0

    @classmethod
    def on(cls, device, **sizes) -> "PerfModel":
        """The model of ``sizes`` on ``device`` (a device profile)."""
        return cls(
            **sizes,
            flops=device.tflops * 1e12,
            bandwidth=device.memory_gbs * 1e9,
            launch_s=device.step_launch_us * 1e-6,
        )

    @property
    def sub_params(self) -> float:
        return 3 * self.d_model * self.d_ffn / self.S

    @property
    def dense_params(self) -> float:
        return 4 * self.d_model * self.d_model

    def step_s(self, K: int, B: int) -> float:
        """One decode step of ``B`` requests at ``K`` sub-experts per token."""
        n = self.experts * self.S
        return self._step(B, K * B, n * (1 - (1 - K / n) ** B))

    def step_mixed_s(self, Ks) -> float:
        """One decode step of a batch whose request ``i`` runs ``Ks[i]`` sub-experts per token
        (continuous batching with MoE-Prism's per-token ``K``): the sub-experts touched are
        ``N (1 - prod_i (1 - K_i / N))``; :meth:`step_s` when every ``K`` is the same."""
        n = self.experts * self.S
        Ks = np.asarray(Ks, dtype=np.float64)
        return self._step(len(Ks), float(Ks.sum()), n * (1 - float(np.prod(1 - Ks / n))))

    def _step(self, B: int, sub_per_step: float, touched: float) -> float:
        """A decode step of ``B`` requests running ``sub_per_step`` sub-experts in all, which
        read ``touched`` distinct sub-experts per layer: launch + max(memory, compute)."""
        memory = (
            self.layers
            * (self.dense_params + touched * self.sub_params)
            * self.bytes_per_param
            / self.bandwidth
        )
        compute = (
            self.layers * 2 * (B * self.dense_params + sub_per_step * self.sub_params) / self.flops
        )
        return self.launch_s + max(memory, compute)

    def prefill_s(self, K: int, tokens: int) -> float:
        return self.layers * tokens * 2 * (self.dense_params + K * self.sub_params) / self.flops


@dataclass
class Request:
    rid: int
    arrival: float
    prompt: int
    output: int
    floor: float  # the largest perplexity the request accepts
    start: float | None = None
    first: float | None = None
    done: float | None = None
    K: int | None = None


def workload(
    rate: float, duration: float, floors, floor_p, seed: int = 0, prompt=(64, 512), output=(32, 256)
) -> list[Request]:
    """Poisson arrivals at ``rate`` per second for ``duration`` seconds."""
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    while True:
        t += rng.exponential(1.0 / rate)
        if t >= duration:
            return out
        out.append(
            Request(
                len(out),
                t,
                int(rng.integers(prompt[0], prompt[1] + 1)),
                int(rng.integers(output[0], output[1] + 1)),
                float(rng.choice(floors, p=floor_p)),
            )
        )


def _batch_time(pm: PerfModel, K: int, batch) -> tuple[float, float]:
    prefill = pm.prefill_s(K, sum(r.prompt for r in batch))
    step = pm.step_s(K, len(batch))
    return prefill, step


def serve(
    requests: list[Request],
    policy: str,
    pm: PerfModel,
    quality: dict,
    max_batch: int = 32,
    timeout: float = 2.0,
) -> list[Request]:
    """Run ``requests`` through one instance under ``policy``; ``quality`` maps every
    available ``K`` to its perplexity.  Returns the requests with their times filled in."""
    _check(policy, POLICIES, quality, max_batch)
    ks = sorted(quality)
    reqs = sorted(requests, key=lambda r: r.arrival)
    _min_ks(reqs, ks, quality)
    i, now, pending = 0, 0.0, []
    while i < len(reqs) or pending:
        if not pending:
            now = max(now, reqs[i].arrival)
        while i < len(reqs) and reqs[i].arrival <= now:
            pending.append(reqs[i])
            i += 1
        choice = _choose(policy, pending, now, ks, quality, pm, max_batch, timeout)
        if choice is None:
            # FullBatch waits: for the next arrival or the oldest request's timeout
            nxt = reqs[i].arrival if i < len(reqs) else float("inf")
            now = min(nxt, pending[0].arrival + timeout)
            continue
        K, batch = choice
        prefill, step = _batch_time(pm, K, batch)
        for r in batch:
            r.start, r.K = now, K
            r.first = now + prefill + step
            r.done = now + prefill + r.output * step
        now = now + prefill + max(r.output for r in batch) * step
        ids = {r.rid for r in batch}
        pending = [r for r in pending if r.rid not in ids]
    return reqs


def serve_continuous(
    requests: list[Request], policy: str, pm: PerfModel, quality: dict, max_batch: int = 32
) -> list[Request]:
    """Run ``requests`` through one instance with continuous batching under ``policy``
    (``"qos"`` or ``"fifo"``, see the module docstring); ``quality`` maps every available
    ``K`` to its perplexity.  Returns the requests with their times filled in."""
    _check(policy, CONTINUOUS_POLICIES, quality, max_batch)
    ks = sorted(quality)
    reqs = sorted(requests, key=lambda r: r.arrival)
    need = _min_ks(reqs, ks, quality)
    i, now = 0, 0.0
    pending: list[Request] = []
    running: list[Request] = []
    left: dict[int, int] = {}
    while i < len(reqs) or pending or running:
        if not pending and not running:
            now = max(now, reqs[i].arrival)
        while i < len(reqs) and reqs[i].arrival <= now:
            pending.append(reqs[i])
            i += 1
        new = pending[: max_batch - len(running)]
        pending = pending[len(new) :]
        for r in new:
            r.start, left[r.rid] = now, r.output
        running += new
        if policy == "qos":
            Ks = [need[r.rid] for r in running]
            prefill = sum(pm.prefill_s(need[r.rid], r.prompt) for r in new)
            step = pm.step_mixed_s(Ks)
            for r in new:
                r.K = need[r.rid]
        else:
            K = max(need[r.rid] for r in running)
            prefill = pm.prefill_s(K, sum(r.prompt for r in new))
            step = pm.step_s(K, len(running))
            for r in running:
                r.K = max(r.K or 0, K)
        now += prefill + step
        for r in running:
            left[r.rid] -= 1
            if r.first is None:
                r.first = now
            if left[r.rid] == 0:
                r.done = now
        running = [r for r in running if left[r.rid]]
    return reqs


def _check(policy: str, policies: tuple, quality: dict, max_batch: int) -> None:
    """The arguments of a serving run, refused with the bad value named."""
    if policy not in policies:
        raise ValueError(f"policy must be one of {policies}, not {policy!r}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, not {max_batch}")
    bad = [k for k in quality if not (isinstance(k, (int, np.integer)) and k >= 1)]
    if bad:
        raise ValueError(
            f"every K of quality must be a whole number of sub-experts >= 1, not {bad[0]!r}"
        )


def _min_ks(reqs, ks, quality) -> dict:
    """Per request id, the smallest ``K`` whose perplexity meets its floor (an error when
    none does)."""
    out = {}
    for r in reqs:
        if not any(quality[k] <= r.floor for k in ks):
            raise ValueError(f"request {r.rid}: no operating point meets its floor {r.floor}")
        out[r.rid] = _min_k(ks, quality, r.floor)
    return out


def _min_k(ks, quality, floor):
    return next(k for k in ks if quality[k] <= floor)


def _choose(policy, pending, now, ks, quality, pm, max_batch, timeout):
    if policy in ("fifo", "fullbatch"):
        if (
            policy == "fullbatch"
            and len(pending) < max_batch
            and now - pending[0].arrival < timeout - 1e-9
        ):
            return None
        batch = pending[:max_batch]
        return max(_min_k(ks, quality, r.floor) for r in batch), batch
    queues = {k: [r for r in pending if quality[k] <= r.floor][:max_batch] for k in ks}

    def utility(k):  # of a candidate, whose queue holds a request (the oldest at least)
        b = queues[k]
        prefill, step = _batch_time(pm, k, b)
        return sum(r.output for r in b) / (prefill + max(r.output for r in b) * step)

    oldest = pending[0]
    if now - oldest.arrival >= timeout - 1e-9:  # timeout trigger
        cands = [k for k in ks if quality[k] <= oldest.floor]
    else:
        full = [k for k in ks if len(queues[k]) >= max_batch]  # batch-full trigger
        cands = full or [k for k in ks if queues[k]]
    k = max(cands, key=lambda k: (utility(k), -k))
    return k, queues[k]


def _pct(v, q):
    return round(float(np.percentile(v, q)), 4) if len(v) else None


def metrics(reqs: list[Request], slo_e2e: float, duration: float) -> dict:
    done = [r for r in reqs if r.done is not None]
    ttft = np.array([r.first - r.arrival for r in done])
    e2e = np.array([r.done - r.arrival for r in done])
    tpot = np.array([(r.done - r.first) / max(1, r.output - 1) for r in done])
    end = max((r.done for r in done), default=duration)
    tokens = sum(r.output for r in done)
    ok = [r for r in done if r.done - r.arrival <= slo_e2e]
    out = {
        "requests": len(done),
        "throughput_req_s": round(len(done) / end, 3),
        "throughput_tok_s": round(tokens / end, 1),
        "slo_attainment": round(len(ok) / max(1, len(done)), 4),
        "goodput_tok_s": round(sum(r.output for r in ok) / end, 1),
        "mean_K": round(float(np.mean([r.K for r in done])), 3) if done else None,
    }
    for name, v in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        out[name] = {
            "mean": round(float(v.mean()), 4) if len(v) else None,
            "p50": _pct(v, 50),
            "p90": _pct(v, 90),
            "p99": _pct(v, 99),
        }
    return out
