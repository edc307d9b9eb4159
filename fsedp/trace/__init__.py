"""Routing traces, the workload of every experiment: which experts each token of each layer
selects.

* :mod:`.core`: :class:`RoutingTrace`, the synthetic generator, iteration windows, sharding
  and gate records (re-exported here);
* :mod:`.io`: the trace formats (FLAME ``.npz``, NumPy, JSON lines, Hugging Face records);
* :mod:`.stats`: load skew, co-activation and predictability of a trace;
* :mod:`.synth`: a seeded generator fitted to a trace.
"""

from fsedp.trace.core import (
    RoutingTrace,
    dense_request_slots,
    expert_counts,
    gate_records,
    iteration_windows,
    load_flame,
    pair_counts,
    shard,
    subset,
    synthetic,
)

__all__ = [
    "RoutingTrace",
    "load_flame",
    "synthetic",
    "subset",
    "iteration_windows",
    "expert_counts",
    "shard",
    "dense_request_slots",
    "gate_records",
    "pair_counts",
]
