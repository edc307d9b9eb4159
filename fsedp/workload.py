"""The one path from a run config to scheduling rounds: config -> routing trace -> iteration
windows -> per-layer gate records.

Every consumer takes its gate records from here, so the same config schedules the same
records everywhere: the simulator (``fsedp run``, :func:`iterations`), the scheduler RTL on
the run config (``fsedp rtl rounds``, :func:`rounds`), the trace-driven cosimulations and
the tests.

* The trace is the file ``scenario.trace`` names, the project's embedded trace (``model``),
  or a seeded synthetic one with one popularity order per layer (:func:`scenario_trace`).
* An iteration is a window of ``scenario.tokens_per_iteration`` consecutive tokens; a short
  last window is left out (every iteration is a whole one).  A trace file must match the
  model: the same ``top_k`` and ``layers``, no expert id beyond ``experts``, and at least one
  whole iteration of tokens.
* ``scenario.sharding`` places the tokens of an iteration on chiplets: ``token`` spreads
  them evenly, token ``i`` on chiplet ``i mod C`` whatever its request (fully sharded data
  parallelism, Figure 3); ``request`` keeps every token of a request on one chiplet.
* Requests take the request-table slots in order of first appearance; a request's slot is
  admitted (``req_init`` with ``scheduler.t_qos_init``) in the first layer of each
  iteration.
"""

from dataclasses import dataclass, field

import numpy as np

from fsedp.config import RunConfig
from fsedp.errors import COMMAND_LINE, InputError
from fsedp.trace import (
    RoutingTrace,
    dense_request_slots,
    gate_records,
    iteration_windows,
    shard,
    synthetic,
)
from fsedp.trace.io import load_any

__all__ = ["Round", "Layer", "scenario_trace", "iterations", "rounds"]

#: Tokens per request of the synthetic trace.
SYNTHETIC_REQUEST_TOKENS = 16


@dataclass
class Round:
    """One scheduling round as the scheduler takes it: gate records and the request-table
    admissions that precede them."""

    records: list[tuple[int, int, int]]  # (request slot, chiplet, expert)
    req_inits: list[tuple[int, int]] = field(default_factory=list)  # (request slot, t_qos)


@dataclass
class Layer:
    """One MoE layer of one iteration."""

    iteration: int
    layer: int
    records: list[tuple[int, int, int]]  # (request slot, chiplet, expert)
    tokens: int
    req_inits: list[tuple[int, int]] = field(default_factory=list)
    #: request-table slot -> request id of the trace (the same request keeps its id across
    #: iterations; its slot may differ)
    requests: dict[int, int] = field(default_factory=dict)

    def round(self) -> Round:
        return Round(self.records, self.req_inits)

    def expert_counts(self, experts: int) -> np.ndarray:
        counts = np.zeros(experts, dtype=np.int64)
        for _, _, e in self.records:
            counts[e] += 1
        return counts

    def token_chiplets(self, chiplets: int) -> np.ndarray:
        """Tokens held per chiplet (each token appears ``top_k`` times in the records)."""
        per = np.zeros(chiplets, dtype=np.int64)
        for _, c, _ in self.records:
            per[c] += 1
        return per


def scenario_trace(
    cfg: RunConfig, count: int, layers: int, trace: RoutingTrace | None = None
) -> RoutingTrace:
    """The routing of ``count`` iterations: ``trace`` when given (a routing made in this
    process, e.g. the co-design's substituted one), else the scenario's trace file, else a
    seeded synthetic trace of ``layers`` layers with requests of
    :data:`SYNTHETIC_REQUEST_TOKENS` tokens (at most a request table's worth per
    iteration).  A given or read trace must fit the model."""
    sc, m = cfg.scenario, cfg.model
    path = cfg.trace_path()
    if trace is None and path is None:
        tokens = sc.tokens_per_iteration
        per_iter = max(1, min(cfg.scheduler.requests, tokens // SYNTHETIC_REQUEST_TOKENS))
        return synthetic(
            m.experts,
            m.top_k,
            tokens * count,
            layers=layers,
            seed=sc.seed,
            skew=sc.skew,
            requests=per_iter * count,
        )
    if trace is None:
        trace = load_any(path)
    if trace.num_experts > m.experts:
        raise InputError(
            cfg.source,
            "scenario.trace",
            f"trace {trace.name} routes to {trace.num_experts} experts but the "
            f"model has {m.experts}",
        )
    # a trace describes one model: another model's routing would run silently otherwise
    for what, have, want in (("top_k", trace.top_k, m.top_k), ("layers", trace.layers, m.layers)):
        if have != want:
            raise InputError(
                cfg.source,
                "scenario.trace",
                f"trace {trace.name} has {what} = {have} but the model "
                f"{m.name} has {what} = {want}",
            )
    if trace.tokens < sc.tokens_per_iteration:
        raise InputError(
            cfg.source,
            "scenario.tokens_per_iteration",
            f"{sc.tokens_per_iteration} exceeds the {trace.tokens} tokens of trace "
            f"{trace.name}: not one whole iteration",
        )
    return trace


def iterations(
    cfg: RunConfig,
    count: int,
    layers: int | None = None,
    strict: bool = True,
    trace: RoutingTrace | None = None,
) -> list[list[Layer]]:
    """``count`` iterations of ``scenario.tokens_per_iteration`` tokens, ``layers`` MoE
    layers each (default: the model's).  With ``strict`` a trace with fewer windows is an
    error; otherwise as many iterations as it holds."""
    sc, sp = cfg.scenario, cfg.scheduler_params()
    layers = layers or cfg.model.layers
    if layers > cfg.model.layers:
        raise InputError(
            COMMAND_LINE,
            "--layers",
            f"{layers} exceeds the {cfg.model.layers} layers of model {cfg.model.name}",
        )
    trace = scenario_trace(cfg, count, layers, trace)
    out = []
    # only whole iterations: a short last window would be simulated as if it were one
    for i, window in enumerate(iteration_windows(trace, sc.tokens_per_iteration, drop_last=True)):
        if i == count:
            break
        chip = shard(window, sp.chiplets, mode=sc.sharding)
        slots = dense_request_slots(window, sp.requests)
        inits = [(s, cfg.scheduler.t_qos_init) for s in sorted(set(slots.values()))]
        ids = {s: int(r) for r, s in slots.items()}
        out.append(
            [
                Layer(
                    i,
                    l,
                    gate_records(window, l, chip, slots, table_depth=sp.requests),
                    window.tokens,
                    inits if l == 0 else [],
                    ids,
                )
                for l in range(layers)
            ]
        )
    if strict and len(out) < count:
        raise InputError(
            cfg.source,
            "scenario.trace",
            f"the trace has {len(out)} iterations of {sc.tokens_per_iteration} "
            f"tokens, {count} requested",
        )
    return out


def rounds(cfg: RunConfig, limit: int | None = None) -> list[Round]:
    """The first ``limit`` (default ``scenario.rounds``) scheduling rounds of the run: the
    layers of :func:`iterations` in order, iteration by iteration."""
    limit = limit if limit is not None else cfg.scenario.rounds
    per = cfg.model.layers
    its = iterations(cfg, -(-limit // per), strict=False)
    return [layer.round() for it in its for layer in it][:limit]
