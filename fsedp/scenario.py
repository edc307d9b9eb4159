"""Scheduling rounds from a run config: routing trace -> iteration windows -> per-layer
gate records, with tokens sharded over chiplets and requests mapped onto request-table
slots.  Shared by ``fsedp run`` and the trace-driven testbenches."""

from .config import ConfigError, RunConfig
from .sw.cosim import Round
from .trace import (RoutingTrace, dense_request_slots, gate_records, iteration_windows,
                    shard, synthetic)
from .trace_io import load_any

__all__ = ["scenario_trace", "build_rounds"]


def scenario_trace(cfg: RunConfig) -> RoutingTrace:
    """The scenario's trace: the file it names (FLAME ``.npz`` format) or a seeded synthetic
    trace with the model's experts and top-k, ``tokens_per_iteration * rounds`` tokens."""
    path = cfg.trace_path()
    if path is not None:
        return load_any(path)
    sc = cfg.scenario
    return synthetic(cfg.model.experts, cfg.model.top_k, sc.tokens_per_iteration * sc.rounds,
                     layers=1, seed=sc.seed, skew=sc.skew)


def build_rounds(cfg: RunConfig, trace: RoutingTrace | None = None,
                 max_rounds: int | None = None) -> list[Round]:
    """One round per (iteration window, MoE layer), at most ``scenario.rounds`` rounds.

    A request's slot is admitted (``req_init`` with ``t_qos_init``) in the first round of
    each window; tokens stay on their request's chiplet (``shard(mode="request")``).
    """
    p = cfg.scheduler_params()
    trace = trace if trace is not None else scenario_trace(cfg)
    if trace.num_experts > p.experts:
        raise ConfigError(cfg.source, "scenario.trace",
                          f"trace {trace.name} routes to {trace.num_experts} experts but the "
                          f"model has {p.experts}")
    limit = max_rounds if max_rounds is not None else cfg.scenario.rounds
    rounds = []
    for window in iteration_windows(trace, cfg.scenario.tokens_per_iteration):
        chiplet = shard(window, p.chiplets)
        slots = dense_request_slots(window, p.requests)
        inits = [(s, cfg.scheduler.t_qos_init) for s in sorted(set(slots.values()))]
        for layer in range(window.layers):
            records = gate_records(window, layer, chiplet, slots, table_depth=p.requests)
            rounds.append(Round(records, inits if layer == 0 else []))
            if len(rounds) == limit:
                return rounds
    return rounds
