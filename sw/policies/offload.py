"""Expert offloading runtime model: an expert cache of configurable capacity, a transfer link,
a compute cost model, prefetchers and miss policies (BuddyMoE Section 3, MoE-Prism Section
5.2; ``docs/offload.md``).

The model runs per MoE layer over *steps* (micro-batches of consecutive tokens).  Each layer
has its own cache of ``capacity`` units (experts, or sub-experts with MoE-Prism), LRU, first
filled with the most popular units of a profiling trace.  In a step at layer ``l``:

1. the prefetcher, which saw the step's routing at layer ``l - 1``, has issued transfers of
   its predicted units when layer ``l - 1`` started, behind that layer's demand fetches;
   transfers queue on the link one after the other (``latency + bytes / bandwidth`` each);
2. the miss policy turns the router's choice into the units to run: fetch on demand
   (``demand``), drop missing experts (``drop``), substitute a random resident expert
   (``random``) or a buddy (``buddy``, :mod:`fsedp.sw.policies.buddy`);
3. units still missing are fetched on demand behind the queued prefetches;
4. the layer computes once all its units are on chip: ``time = wait + compute``, compute =
   ``dense_s`` per token (attention and the rest of the layer) plus, per unit, its tokens x
   ``unit_flops`` / ``flops`` and a launch ``overhead_s``;
5. fetched and prefetched units enter the cache (LRU; a unit used in the step is not
   evicted by the step's own insertions).

The time of a step through all layers adds up; modelled tokens per second = tokens / time.
"""

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Link",
    "Cost",
    "CHIP_LINK",
    "links",
    "LRUCache",
    "Prefetcher",
    "TransitionPrefetcher",
    "FrequencyPrefetcher",
    "OraclePrefetcher",
    "OffloadStats",
    "OffloadRuntime",
    "popularity_order",
]


@dataclass(frozen=True)
class Link:
    """Transfer link from off-chip memory: ``bandwidth_gbs`` (GB/s), ``latency_us`` per
    transfer."""

    name: str
    bandwidth_gbs: float
    latency_us: float

    def seconds(self, nbytes: float) -> float:
        return self.latency_us * 1e-6 + nbytes / (self.bandwidth_gbs * 1e9)


#: DDR to the FSE-DP package (Table I: 4 x 25.6 GB/s, 100 ns).  Host links come from device
#: profiles (:mod:`fsedp.sw.policies.device`, ``configs/devices/``).
CHIP_LINK = Link("ddr-chip", 102.4, 0.1)


def links() -> dict:
    """Links ``--link`` names: ``pcie4`` (the default device profile's) and ``ddr-chip``."""
    from fsedp.sw.policies.device import DEFAULT_DEVICE, load_device

    pcie = load_device(DEFAULT_DEVICE).link()
    return {"pcie4": Link("pcie4", pcie.bandwidth_gbs, pcie.latency_us), "ddr-chip": CHIP_LINK}


@dataclass(frozen=True)
class Cost:
    """Sizes and speeds of the modelled deployment: bytes and FLOPs per token of one unit
    (expert or sub-expert), dense FLOPs per token and layer, compute rate, launch overhead
    per unit, and optionally a table of one unit's time by its tokens (``(tokens, seconds)``
    pairs, sorted; it replaces overhead and rate for the units)."""

    unit_bytes: float
    unit_flops: float
    dense_flops: float
    flops: float
    overhead_s: float
    table: tuple | None = None
    #: the device profile's ``issue``: "sync" or "async" (:meth:`OffloadRuntime.timing`)
    issue: str = "sync"
    #: host seconds to issue one transfer (``issue`` async)
    issue_s: float = 0.0
    #: the device's own seconds for one unit run (``issue`` async; 0: its FLOPs alone)
    device_unit_s: float = 0.0

    @classmethod
    def of(cls, device, unit_bytes: float, unit_flops: float, dense_flops: float) -> "Cost":
        """The cost of units of these sizes on ``device`` (a
        :class:`~fsedp.sw.policies.device.DeviceProfile`)."""
        return cls(
            unit_bytes,
            unit_flops,
            dense_flops,
            flops=device.expert_tflops * 1e12,
            overhead_s=device.expert_launch_us * 1e-6,
            table=device.table(),
            issue=device.issue,
            issue_s=device.link_issue_us * 1e-6,
            device_unit_s=(device.expert_device_us or 0.0) * 1e-6,
        )

    def unit_s(self, tokens: float) -> float:
        """One unit run on ``tokens`` tokens."""
        if self.table is not None:
            from fsedp.sw.policies.device import interpolate

            return interpolate(self.table, tokens, self.flops, self.unit_flops)
        return tokens * self.unit_flops / self.flops + self.overhead_s

    def compute_s(self, tokens_per_unit: np.ndarray, tokens: int) -> float:
        n = np.asarray(tokens_per_unit)
        if self.table is not None:
            return tokens * self.dense_flops / self.flops + sum(self.unit_s(float(x)) for x in n)
        return (tokens * self.dense_flops + float(n.sum()) * self.unit_flops) / self.flops + len(
            n
        ) * self.overhead_s

    def device_s(self, tokens_per_unit: np.ndarray, tokens: int) -> float:
        """The device's own time for a layer under asynchronous issue: its dense FLOPs at
        the rate and, per unit, the larger of ``device_unit_s`` and its FLOPs at the rate; no
        host time (:meth:`compute_s`, which overlaps it)."""
        n = np.asarray(tokens_per_unit, dtype=float)
        units = np.maximum(n * self.unit_flops / self.flops, self.device_unit_s)
        return tokens * self.dense_flops / self.flops + float(units.sum())


class LRUCache:
    """Units resident on chip, least recently used first, each in a slot of the cache
    (``d``: unit -> slot; ``slot``: where the last :meth:`insert` put its unit, ``None``
    when it found no room)."""

    def __init__(self, capacity: int, initial=()):
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, not {capacity}")
        self.capacity = capacity
        self.d: OrderedDict = OrderedDict()
        for u in list(initial)[:capacity]:
            if int(u) not in self.d:
                self.d[int(u)] = len(self.d)
        self.free = list(range(len(self.d), capacity))
        self.slot: int | None = None

    def __contains__(self, u) -> bool:
        return int(u) in self.d

    def resident(self, n: int) -> np.ndarray:
        m = np.zeros(n, dtype=bool)
        if self.d:
            m[list(self.d)] = True
        return m

    def touch(self, u):
        self.d.move_to_end(int(u))

    def insert(self, u, keep=frozenset()) -> bool:
        """Insert ``u`` evicting the least recently used unit not in ``keep`` (into its
        slot); False when there is no room (capacity 0, or everything resident is kept)."""
        u = int(u)
        self.slot = None
        if u in self.d:
            self.d.move_to_end(u)
            self.slot = self.d[u]
            return True
        if self.capacity == 0:
            return False
        if len(self.d) >= self.capacity:
            victim = next((v for v in self.d if v not in keep), None)
            if victim is None:
                return False
            slot = self.d.pop(victim)
        else:
            slot = self.free.pop(0)
        self.d[u] = slot
        self.slot = slot
        return True


def popularity_order(ids: np.ndarray, n: int) -> np.ndarray:
    """Units by descending use in ``ids`` (any shape), ties to the lower id."""
    counts = np.bincount(np.asarray(ids).reshape(-1), minlength=n)
    return np.argsort(-counts, kind="stable")


class Prefetcher:
    """Predicts, for layer ``l``, the units to fetch while layer ``l - 1`` runs."""

    name = "none"

    def predict(self, layer: int, prev_ids, tokens, count: int) -> list:
        return []


class FrequencyPrefetcher(Prefetcher):
    """The ``count`` most popular units of the layer in the profiling trace."""

    name = "frequency"

    def __init__(self, orders: list):
        self.orders = orders

    def predict(self, layer, prev_ids, tokens, count):
        return [int(u) for u in self.orders[layer][:count]]


class TransitionPrefetcher(Prefetcher):
    """Previous-layer transition: units of layer ``l`` scored by the transition counts from
    the step's units at layer ``l - 1`` (profiling trace), popularity as tie-break."""

    name = "transition"

    def __init__(self, trans: list, orders: list):
        self.trans, self.orders = trans, orders

    def predict(self, layer, prev_ids, tokens, count):
        if layer == 0 or prev_ids is None:
            return [int(u) for u in self.orders[layer][:count]]
        t = self.trans[layer]
        score = t[np.asarray(prev_ids).reshape(-1)].sum(0).astype(np.float64)
        rank = np.empty(len(score))
        rank[self.orders[layer]] = np.arange(len(score))
        order = np.lexsort((rank, -score))
        return [int(u) for u in order[:count]]


class OraclePrefetcher(Prefetcher):
    """Knows the units the step will use (a bound); resolved by
    :meth:`OffloadRuntime.layer_step` when the step reaches the layer."""

    name = "oracle"


@dataclass
class OffloadStats:
    steps: int = 0
    tokens: int = 0
    requested: int = 0  # units requested (per step and layer, distinct)
    hits: int = 0  # resident when the layer started
    prefetch_hits: int = 0  # brought by a prefetch
    demand: int = 0  # fetched on demand
    prefetched: int = 0  # prefetch transfers issued
    prefetch_useful: int = 0  # prefetched units the step used
    substituted: int = 0  # (token, expert) slots replaced by a resident expert
    dropped: int = 0  # (token, expert) slots dropped
    bytes: float = 0.0
    wait_s: float = 0.0
    compute_s: float = 0.0
    per_layer: dict = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        return self.wait_s + self.compute_s

    def as_dict(self) -> dict:
        req = max(1, self.requested)
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "hit_rate": round((self.hits + self.prefetch_hits) / req, 4),
            "resident_hit_rate": round(self.hits / req, 4),
            "prefetch_accuracy": round(self.prefetch_useful / self.prefetched, 4)
            if self.prefetched
            else None,
            "demand_fetches": self.demand,
            "prefetches": self.prefetched,
            "substituted": self.substituted,
            "dropped": self.dropped,
            "bytes_moved_mb": round(self.bytes / 1e6, 3),
            "stall_s": round(self.wait_s, 6),
            "compute_s": round(self.compute_s, 6),
            "tokens_per_s": round(self.tokens / self.time_s, 2) if self.time_s else None,
            "per_layer": {
                l: {
                    "hit_rate": round(v["hit"] / max(1, v["req"]), 4),
                    "stall_s": round(v["wait"], 6),
                }
                for l, v in sorted(self.per_layer.items())
            },
        }


class OffloadRuntime:
    """Per-layer caches, link and prefetcher.

    :meth:`layer_step` is called once per (step, layer) with the units the step runs there:
    in step order within a layer, and for a step at layer ``l`` after that step at ``l - 1``
    (so layer by layer over a batch of steps, as a forward pass with hooks calls it, or step
    by step).  Residency evolves per layer's cache, so it is decided at once; the link and
    clock are replayed in (step, layer) order by :meth:`timing`.
    """

    def __init__(
        self,
        layers: int,
        units: int,
        capacity: int,
        link: Link,
        cost: Cost,
        prefetcher: Prefetcher | None = None,
        initial: list | None = None,
        prefetch_count: int | None = None,
    ):
        self.layers, self.units, self.link, self.cost = layers, units, link, cost
        self.capacity = capacity
        self.caches = [
            LRUCache(capacity, initial[l] if initial is not None else ()) for l in range(layers)
        ]
        #: units resident at the start, per layer, in slot order
        self.initial = [list(c.d) for c in self.caches]
        self.prefetcher = prefetcher or Prefetcher()
        self.prefetch_count = (
            prefetch_count if prefetch_count is not None else max(1, capacity // 4)
        )
        self.stats = OffloadStats()
        self._pending: dict = {}  # (layer, step) -> prefetched units, in issue order
        # (step, layer, tokens, demand, prefetched-used, issued, counts, placed, run_at, units):
        # placed: (unit, slot or -1) of every fetched unit inserted at this step and layer, in
        # insertion order; run_at: the slot (or -1: no room, a scratch buffer) of every unit run
        self.log: list = []
        self._logidx: dict = {}

    def resident(self, layer: int) -> np.ndarray:
        return self.caches[layer].resident(self.units)

    def layer_step(
        self,
        step: int,
        layer: int,
        units: np.ndarray,
        tokens_per_unit: np.ndarray,
        tokens: int,
        token_ids=None,
    ):
        """Run ``units`` (distinct ids, with their token counts) at ``layer`` in ``step``, then
        let the prefetcher predict layer ``layer + 1`` from them.  The oracle prefetcher is
        resolved here for ``layer`` itself: it fetched, when layer ``layer - 1`` started,
        exactly the units of this step that are not resident (at most ``prefetch_count``)."""
        st = self.stats
        cache = self.caches[layer]
        if self.prefetcher.name == "oracle" and layer > 0:
            # the oracle knows this step's units when the previous layer started
            pend = [u for u in units.tolist() if u not in cache][: self.prefetch_count]
            prev = self._logidx.get((step, layer - 1))
            if prev is not None:
                self.log[prev] = self.log[prev][:5] + (pend,) + self.log[prev][6:]
            st.prefetched += len(pend)
            st.bytes += len(pend) * self.cost.unit_bytes
        else:
            pend = self._pending.pop((layer, step), [])
        pend_set = set(pend)
        demand, used_pref = [], []
        hit = 0
        for u in units.tolist():
            if u in cache:
                hit += 1
                cache.touch(u)
            elif u in pend_set:
                used_pref.append(u)
            else:
                demand.append(u)
        st.hits += hit
        st.prefetch_hits += len(used_pref)
        st.prefetch_useful += len(used_pref)
        st.demand += len(demand)
        st.bytes += len(demand) * self.cost.unit_bytes
        st.requested += len(units)
        pl = st.per_layer.setdefault(layer, {"hit": 0, "req": 0, "wait": 0.0})
        pl["hit"] += hit
        pl["req"] += len(units)
        keep = frozenset(units.tolist())
        placed = []
        for u in pend + demand:
            ok = cache.insert(u, keep)
            placed.append((u, cache.slot if ok else -1))
        run_at = [cache.d.get(u, -1) for u in units.tolist()]
        issued = []
        if layer + 1 < self.layers and self.prefetcher.name not in ("none", "oracle"):
            nxt = self.caches[layer + 1]
            for u in self.prefetcher.predict(layer + 1, units, token_ids, self.prefetch_count):
                if u not in nxt and u not in issued:
                    issued.append(u)
            self._pending[(layer + 1, step)] = issued
            st.prefetched += len(issued)
            st.bytes += len(issued) * self.cost.unit_bytes
        self._logidx[(step, layer)] = len(self.log)
        self.log.append(
            (
                step,
                layer,
                tokens,
                demand,
                used_pref,
                issued,
                np.asarray(tokens_per_unit),
                placed,
                run_at,
                [int(u) for u in units.tolist()],
            )
        )
        if layer == 0:
            st.steps += 1
            st.tokens += tokens

    def timing(self) -> OffloadStats:
        """Replay the link and the clock in (step, layer) order: a layer waits for its demand
        fetches (queued behind earlier transfers) and for the prefetches it uses; prefetches
        for layer ``l + 1`` are issued when layer ``l`` starts, behind its demand fetches.

        The cost's ``issue`` says who waits (``docs/offload.md``).  ``sync``: the layer's
        compute (:meth:`Cost.compute_s`, launches included) starts when its weights are in.
        ``async``: a host clock issues every layer's copies and then its experts, taking
        :meth:`Cost.compute_s` of host time per layer and never waiting for the device; a
        layer's copies start once the host has issued them and the previous layer's compute
        has ended, and its compute ends at the later of its weights' arrival (or the previous
        compute) plus the device's own time (:meth:`Cost.device_s`) and the host's issue of
        it.  ``wait_s`` is then the time the device idles between layers' compute."""
        st = self.stats
        st.wait_s = st.compute_s = 0.0
        for v in st.per_layer.values():
            v["wait"] = 0.0
        clock = link_free = host = 0.0
        asynchronous = self.cost.issue == "async"
        issue_s = self.cost.issue_s
        arrival: dict = {}
        xfer = self.link.seconds(self.cost.unit_bytes)
        for step, layer, tokens, demand, used_pref, issued, counts, *_ in sorted(
            self.log, key=lambda r: (r[0], r[1])
        ):
            start = clock
            ready = start
            for u in used_pref:
                ready = max(ready, arrival.get((layer, step, u), start))
            for k, u in enumerate(demand + issued):
                # a copy starts after the compute before it and, asynchronously, once the host
                # has issued it (the layer's copies first, then its experts)
                go = max(start, host + (k + 1) * issue_s) if asynchronous else start
                link_free = max(link_free, go) + xfer
                if k < len(demand):
                    ready = max(ready, link_free)
                else:
                    arrival[(layer + 1, step, u)] = link_free
            if asynchronous:
                host += (len(demand) + len(issued)) * issue_s
            compute = self.cost.compute_s(counts, tokens)
            if asynchronous:
                host += compute
                compute = self.cost.device_s(counts, tokens)
                end = max(ready + compute, host)
                wait = end - start - compute
            else:
                wait = ready - start
                end = start + wait + compute
            st.wait_s += wait
            st.compute_s += compute
            st.per_layer[layer]["wait"] += wait
            clock = end
        return st

    def decisions(self) -> list[dict]:
        """The model's decisions in the order :meth:`timing` replays them, for a replay on
        real hardware (:mod:`fsedp.experiments.replay`).  Per (step, layer), when the layer
        starts: its demand fetches, then the prefetches it issues for the next layer, each
        ``{"op": "fetch", "kind": "demand" | "prefetch", "step", "layer" (where the unit is
        used), "unit", "slot" (of that layer's cache; -1: no room, a buffer of its own),
        "bytes"}``; then the layer's ``{"op": "run", "step", "layer", "tokens", "units",
        "counts" (tokens per unit), "slots", "waits" (the fetched units it waits for: its
        demand fetches and the prefetches it uses)}``."""
        rows = sorted(self.log, key=lambda r: (r[0], r[1]))
        placed = {(r[0], r[1]): dict(r[7]) for r in rows}
        b = self.cost.unit_bytes
        out = []
        for step, layer, tokens, demand, used_pref, issued, counts, _, run_at, units in rows:
            here = placed[(step, layer)]
            for u in demand:
                out.append(dict(op="fetch", kind="demand", step=step, layer=layer, unit=u,
                                slot=here.get(u, -1), bytes=b))  # fmt: skip
            nxt = placed.get((step, layer + 1), {})
            for u in issued:
                out.append(dict(op="fetch", kind="prefetch", step=step, layer=layer + 1, unit=u,
                                slot=nxt.get(u, -1), bytes=b))  # fmt: skip
            out.append(dict(op="run", step=step, layer=layer, tokens=tokens, units=list(units),
                            counts=[int(c) for c in counts], slots=list(run_at),
                            waits=list(demand) + list(used_pref)))  # fmt: skip
        return out
