"""Routing workload of a simulation: iterations x MoE layers of gate records."""

from dataclasses import dataclass

import numpy as np

from ..config import ConfigError, RunConfig
from ..trace import (dense_request_slots, gate_records, iteration_windows,
                     shard, synthetic)
from ..trace_io import load_any

__all__ = ["Layer", "iterations"]


@dataclass
class Layer:
    """One MoE layer of one iteration."""

    iteration: int
    layer: int
    records: list[tuple[int, int, int]]       # (request slot, chiplet, expert)
    tokens: int

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


def iterations(cfg: RunConfig, count: int, layers: int | None = None) -> list[list[Layer]]:
    """``count`` iterations of ``tokens_per_iteration`` tokens, ``layers`` MoE layers each
    (default: the model's).  Synthetic traces get one popularity order per layer; a trace
    file is cycled over its own layers.  Token ``i`` of an iteration is held by chiplet
    ``i mod C`` (the even sharding of Figure 3)."""
    sc, m = cfg.scenario, cfg.model
    layers = layers or m.layers
    tokens = sc.tokens_per_iteration
    path = cfg.trace_path()
    sp = cfg.scheduler_params()
    if path is None:
        # requests of 16 tokens, at most a request table's worth per iteration
        per_iter = max(1, min(sp.requests, tokens // 16))
        trace = synthetic(m.experts, m.top_k, tokens * count, layers=layers, seed=sc.seed,
                          skew=sc.skew, requests=per_iter * count)
    else:
        trace = load_any(path)
        if trace.num_experts > m.experts:
            raise ConfigError(cfg.source, "scenario.trace",
                              f"trace {trace.name} routes to {trace.num_experts} experts but "
                              f"the model has {m.experts}")
    out = []
    for i, window in enumerate(iteration_windows(trace, tokens)):
        if i == count:
            break
        # Fully sharded data parallelism: the tokens of an iteration are spread evenly over
        # the chiplets (Figure 3), whatever request they belong to
        chip = shard(window, sp.chiplets, mode="token")
        slots = dense_request_slots(window, sp.requests)
        out.append([Layer(i, l, gate_records(window, l % window.layers, chip, slots,
                                             table_depth=sp.requests), window.tokens)
                    for l in range(layers)])
    if len(out) < count:
        raise ConfigError(cfg.source, "scenario.trace",
                          f"the trace has {len(out)} iterations of {tokens} tokens, "
                          f"{count} requested")
    return out
