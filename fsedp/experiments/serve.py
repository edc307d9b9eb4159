"""``fsedp serve``: a Poisson workload through MoE-Prism's QoS scheduler and the FIFO and
FullBatch baselines (``docs/serving.md``)."""

import json
import math
from pathlib import Path

from fsedp.config import ModelConfig, config_path, load_section
from fsedp.errors import COMMAND_LINE, InputError
from fsedp.files import read_text
from fsedp.lm.text import ASSETS
from fsedp.sw.policies.device import DEFAULT_DEVICE, load_device
from fsedp.sw.policies.qos import PerfModel, metrics, serve, serve_continuous, workload

__all__ = [
    "LOADS",
    "load_curve",
    "perf_model",
    "capacity",
    "capacity_continuous",
    "run",
    "format_rows",
]

#: offered load as a share of the FIFO instance's capacity at full quality
LOADS = {"low": 0.4, "medium": 0.7, "high": 1.3}
#: quality floors as perplexity over the full model's, and their shares of the requests
FLOORS = ((1.05, 0.3), (1.2, 0.4), (1.5, 0.3))
CURVE = ASSETS / "prism-curve.json"


#: MoE-Prism's gates and their columns in a `fsedp prism curve` JSON
GATES = {"proxy": "refactored", "finetuned": "finetuned"}


def _show(v) -> str:
    """A JSON value as a reason quotes it (cut short)."""
    text = json.dumps(v) if not isinstance(v, float) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _perplexity(path, field: str, v, where: str = "") -> float:
    """A positive, finite perplexity (a JSON number, not a boolean)."""
    at = f" ({where})" if where else ""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(path, field, f"needs positive, finite perplexities{at}, not {_show(v)}")
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not (math.isfinite(x) and x > 0):
        raise InputError(path, field, f"needs positive, finite perplexities{at}, not {_show(v)}")
    return x


def _column(path, key: str, col, S: int) -> dict[int, float]:
    """A column of the curve: ``{"K": perplexity}`` with ``K`` a whole number of sub-experts
    from 1 (whole experts, multiples of ``S``, for the original model)."""
    field = f"curve.{key}"
    if not isinstance(col, dict) or not col:
        raise InputError(
            path, field, f"must map active sub-experts K to perplexities, not {_show(col)}"
        )
    out = {}
    for k, v in col.items():
        K = int(k) if k.isascii() and k.isdigit() and str(int(k)) == k else 0
        if K < 1:
            raise InputError(path, field, f"K must be a whole number from 1, not {_show(k)}")
        if key == "original" and K % S:
            raise InputError(
                path, field, f"the original model runs whole experts: K a multiple of S = {S}, "
                f"not {K}"
            )  # fmt: skip
        out[K] = _perplexity(path, field, v, f"K = {K}")
    return out


def load_curve(path=None, gate: str = "proxy") -> dict:
    """The quality curve of ``path`` (a `fsedp prism curve` JSON; default the committed
    model's): ``refactored`` is the column of MoE-Prism's ``gate`` (:data:`GATES`), which
    QoS serves with; ``original`` the whole-expert points.  Every field read is checked here,
    each refused on one line naming it: ``curve.S`` a whole number from 1, ``curve.full``
    and every point a positive, finite perplexity, ``K`` whole numbers from 1 (multiples of
    ``S`` for ``original``), and the best points meeting the strictest quality floor."""
    path = Path(path) if path else CURVE
    text = read_text(path, "json")  # the read rule: a bounded regular file, UTF-8
    try:
        d = json.loads(text)
    except RecursionError:
        raise InputError(path, "curve", "not a `fsedp prism curve` JSON (too deep)") from None
    except ValueError as e:
        raise InputError(path, "<file>", f"not JSON ({e})") from None
    c = d.get("curve") if isinstance(d, dict) else None
    if not isinstance(c, dict):
        raise InputError(path, "curve", "not a `fsedp prism curve` JSON (no curve mapping)")
    column = GATES[gate]
    for key in ("S", "full", "original", column):
        if key not in c:
            why = "missing"
            if key == column:
                why = (
                    f"no column of the {gate} gate: run `fsedp prism finetune`, then "
                    "`fsedp prism curve --refactored` on its output"
                )
            raise InputError(path, f"curve.{key}", why)
    S = c["S"]
    if isinstance(S, bool) or not isinstance(S, int) or S < 1:
        raise InputError(
            path, "curve.S", f"sub-experts per expert: a whole number from 1, not {_show(S)}"
        )
    out = {
        "full": _perplexity(path, "curve.full", c["full"]),
        "S": S,
        "refactored": _column(path, column, c[column], S),
        "original": _column(path, "original", c["original"], S),
    }
    tight = min(f for f, _ in FLOORS)
    for key, col in ((column, "refactored"), ("original", "original")):
        best = min(out[col].values())
        if best > tight * out["full"]:
            raise InputError(
                path,
                f"curve.{key}",
                f"best perplexity {best} misses the strictest quality floor "
                f"{tight * out['full']:.3f} ({tight}x the full model)",
            )
    return out


def perf_model(scale_to: str, S: int, device: str = DEFAULT_DEVICE, **kw) -> PerfModel:
    """The serving model of ``scale_to``'s sizes on ``device`` (a device profile's name or
    file); ``kw`` (``flops``, ``bandwidth``, ``launch_s``) override the device's."""
    import dataclasses

    m = load_section(ModelConfig, config_path("models", scale_to, COMMAND_LINE, "--scale-to"))
    pm = PerfModel.on(
        load_device(device),
        layers=m.layers,
        d_model=m.d_model,
        d_ffn=m.d_ffn,
        experts=m.experts,
        top_k=m.top_k,
        S=S,
    )
    return dataclasses.replace(pm, **{k: v for k, v in kw.items() if v is not None})


def _fits(path, c: dict, pm: PerfModel, scale_to: str, column: str):
    """Refuse a curve the deployment cannot run: a sub-expert of less than one of
    ``scale_to``'s neurons, or more sub-experts per token than its layer holds."""
    if c["S"] > pm.d_ffn:
        raise InputError(
            path,
            "curve.S",
            f"{c['S']} sub-experts per expert: {scale_to}'s experts hold {pm.d_ffn} neurons",
        )
    n = pm.experts * pm.S
    for key, col in ((column, "refactored"), ("original", "original")):
        top = max(c[col])
        if top > n:
            raise InputError(
                path,
                f"curve.{key}",
                f"K = {top} sub-experts per token: {scale_to} has {n} sub-experts per layer",
            )


def capacity(pm: PerfModel, K: int, max_batch: int, prompt=(64, 512), output=(32, 256)) -> float:
    """Requests per second of back-to-back full batches at ``K`` (mean lengths; a batch
    lasts until its longest output, about the range's top)."""
    mean_prompt = sum(prompt) / 2
    t = pm.prefill_s(K, int(max_batch * mean_prompt)) + output[1] * pm.step_s(K, max_batch)
    return max_batch / t


def capacity_continuous(
    pm: PerfModel, K: int, max_batch: int, prompt=(64, 512), output=(32, 256)
) -> float:
    """Requests per second of continuous batching kept full at ``K``: a request holds one of
    ``max_batch`` slots for its mean output of decode steps, and its prefill runs alone."""
    mean_prompt, mean_output = sum(prompt) / 2, sum(output) / 2
    per_request = mean_output * pm.step_s(K, max_batch) / max_batch + pm.prefill_s(
        K, int(mean_prompt)
    )
    return 1.0 / per_request


def run(
    policies,
    loads,
    duration=300.0,
    max_batch=32,
    timeout=2.0,
    slo=None,
    scale_to="mixtral-8x7b",
    curve_path=None,
    seed=0,
    batching="static",
    gate="proxy",
    **pm_kw,
) -> list[dict]:
    """Rows of :func:`metrics` per load and policy.  ``batching``: ``"static"`` (batches run
    to completion, :func:`serve`) or ``"continuous"`` (:func:`serve_continuous`; FullBatch
    has no continuous form); the loads are shares of FIFO's capacity at full quality under
    the same batching.  ``gate``: the MoE-Prism gate whose quality QoS serves with
    (:data:`GATES`)."""
    if batching not in ("static", "continuous"):
        raise ValueError(f"batching must be static or continuous, not {batching!r}")
    c = load_curve(curve_path, gate)
    pm = perf_model(scale_to, c["S"], **pm_kw)
    _fits(curve_path or CURVE, c, pm, scale_to, GATES[gate])
    kmax = max(c["original"])
    if batching == "continuous":
        cap = capacity_continuous(pm, kmax, max_batch)
    else:
        cap = capacity(pm, kmax, max_batch)
    floors = [f * c["full"] for f, _ in FLOORS]
    shares = [p for _, p in FLOORS]
    slo = (
        slo if slo is not None else 3 * (pm.prefill_s(kmax, 512) + 256 * pm.step_s(kmax, max_batch))
    )
    rows = []
    for load in loads:
        rate = LOADS[load] * cap
        for policy in policies:
            reqs = workload(rate, duration, floors, shares, seed=seed)
            if not reqs:  # latencies and throughput over no request are undefined
                raise InputError(
                    COMMAND_LINE,
                    "--duration",
                    f"no request arrives in {duration:g} s at the {load} load of {rate:.3g} "
                    f"requests/s (seed {seed}): serve for longer",
                )
            quality = c["refactored"] if policy == "qos" else c["original"]
            if batching == "continuous":
                done = serve_continuous(reqs, policy, pm, quality, max_batch=max_batch)
            else:
                done = serve(reqs, policy, pm, quality, max_batch=max_batch, timeout=timeout)
            rows.append(
                {
                    "policy": policy,
                    "batching": batching,
                    "load": load,
                    "rate_req_s": round(rate, 3),
                    "slo_e2e_s": round(slo, 3),
                    **metrics(done, slo, duration),
                }
            )
    return rows


def format_rows(rows) -> str:
    out = [
        "| load (req/s) | policy | req/s | tokens/s | mean K | TTFT mean / p99 (s) | TPOT mean "
        "(ms) "
        "| E2E mean / p50 / p90 / p99 (s) | SLO attainment | goodput (tok/s) |",
        "|---|---|---:|---:|---:|---|---:|---|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['load']} ({r['rate_req_s']}) | {r['policy']} | {r['throughput_req_s']} | "
            f"{r['throughput_tok_s']} | {r['mean_K']} | {r['ttft']['mean']} / {r['ttft']['p99']} | "
            f"{round(r['tpot']['mean'] * 1000, 2)} | {r['e2e']['mean']} / {r['e2e']['p50']} / "
            f"{r['e2e']['p90']} / {r['e2e']['p99']} | {r['slo_attainment']} | "
            f"{r['goodput_tok_s']} |"
        )
    return "\n".join(out)
