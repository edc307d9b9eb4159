"""Run configurations: one validated YAML schema for hardware, model, scheduler and scenario.

A *run config* is a YAML mapping with exactly four top-level keys::

    hardware: chip2x2              # a named config, a file path, or an inline mapping
    model: qwen3-30b-a3b           # a named config, a file path, or an inline mapping
    scheduler: default             # a named config, a file path, or an inline mapping
    scenario:                      # always an inline mapping
      tokens_per_iteration: 64
      ...

Named configs are package data of ``fsedp.configs`` (the repository's ``configs/`` folder),
read through :mod:`importlib.resources`, so an installed wheel finds them.  A section given
as a string that ends in ``.yaml``/``.yml`` or holds a ``/`` is a file path, relative to the
run config's folder.  A named or path section file holds the fields of its section at its
top level.

Every field is declared once, in the dataclasses below, with its type and physical range
(:func:`fsedp.fields.spec`; ``docs/configs.md`` lists them).  Every problem -- unreadable
file, YAML syntax error, alias, deep nesting, unknown or missing key, wrong type, value out
of range, inconsistent sections -- raises :class:`~fsedp.errors.InputError`, whose ``str()``
is one line ``"{file}: {field}: {reason}"``.  ``field`` is a dotted path inside ``file``
(``scheduler.count_width``, ``model.top_k``; in a section file just ``top_k``) or one of the
pseudo fields ``<file>`` (cannot be read), ``<yaml>`` (YAML error, with line and column) and
``<top>`` (empty, or not a mapping).

:meth:`RunConfig.scheduler_params` and :meth:`RunConfig.datapath_params` turn a run config
into the generics shared by the golden models and the RTL; :func:`load_run` calls the first
so that a config that loads is a config the scheduler accepts.
"""

import dataclasses
import math
import os
import stat
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fsedp.errors import InputError
from fsedp.fields import build, describe, same_as, spec, specs
from fsedp.files import kind_of, parse_yaml, read_yaml
from fsedp.params import (
    MAX_CHIPLETS,
    DatapathParams,
    SchedulerParams,
    check_ring_orders,
    max_hops,
)

__all__ = [
    "CONFIG_DIR",
    "EMBEDDED_TRACE",
    "WEIGHT_BYTES",
    "HardwareConfig",
    "ModelConfig",
    "SchedulerConfig",
    "ScenarioConfig",
    "RunConfig",
    "load_run",
    "load_hardware",
    "load_model",
    "load_scheduler",
    "load_section",
    "run_from_dict",
    "default_run",
    "config_to_dict",
    "config_path",
    "named_configs",
    "derived_microslices",
    "derived_count_width",
    "MAX_TOKENS_PER_ITERATION",
    "mesh_slots",
    "buffer_slots",
    "smallest_buffer_kib",
    "smallest_microslices",
    "SYNTHETIC_ONLY",
]

#: Routing of the project's MoE LM on held-out WikiText-2 test text (``scenario.trace:
#: model``): shipped with the package, so runs need no data folder.
EMBEDDED_TRACE = Path(__file__).resolve().parent / "lm" / "assets" / "routing-wikitext2-test.npz"

#: Bytes per expert weight assumed when micro-slice sizes are derived (the paper does not
#: give the precision of its test chip; 8-bit weights).
WEIGHT_BYTES = 1
#: Bytes per activation value (16-bit): a token's hidden vector on a chiplet is
#: ``d_model * ACT_BYTES`` (the all-to-all's payload, and with ``hardware.token_storage`` the
#: buffer its inputs and outputs take).
ACT_BYTES = 2


def token_kib(h, m, tokens_per_iteration: int) -> int:
    """KiB of one chiplet's buffer its tokens take with ``hardware.token_storage`` (else 0):
    the data-parallel share ``ceil(T / chiplets)`` of an iteration's tokens, each an input
    vector and an output vector of ``d_model`` activations kept for the whole MoE layer
    (every expert a token selects reads the same input and adds into the same output)."""
    if not h.token_storage:
        return 0
    share = -(-tokens_per_iteration // h.chiplets)
    return -(-(2 * share * m.d_model * ACT_BYTES) // 1024)


def weight_kib(h, m, tokens_per_iteration: int) -> int:
    """KiB of one chiplet's buffer left for micro-slices: ``onchip_buffer_kib`` less
    :func:`token_kib` (0 or less: the tokens fill it)."""
    return h.onchip_buffer_kib - token_kib(h, m, tokens_per_iteration)


#: DDR access latency assumed for the datapath's DDR controller (not given in the paper).
DDR_LATENCY_NS = 100.0

#: The named configs (package data ``fsedp.configs``; ``configs/`` in the repository).
CONFIG_DIR = Path(str(resources.files("fsedp.configs")))

#: Micro-slices an expert is cut into when a config leaves ``microslices_per_expert`` out:
#: at least :data:`MICROSLICES_FLOOR`, and enough that a chiplet's buffer holds
#: :data:`MICROSLICES_SLOTS` of them (the default run's 7), at most 256.
MICROSLICES_FLOOR = 8
MICROSLICES_SLOTS = 7


def mesh_slots(rows: int, cols: int) -> int:
    """Slots a derived micro-slice count aims for on a ``rows x cols`` mesh:
    :data:`MICROSLICES_SLOTS`, or deadlock freedom's ``max_hops + 1`` with a spare slot for
    pre-loads where that is more (3x3: 13, 4x4: 19)."""
    return max(MICROSLICES_SLOTS, max_hops(rows, cols) + 2)


def derived_microslices(
    expert_bytes: int,
    buffer_kib: int,
    floor: int = MICROSLICES_FLOOR,
    slots: int = MICROSLICES_SLOTS,
) -> int:
    """The smallest micro-slice count, at least ``floor``, for which a ``buffer_kib`` buffer
    holds ``slots`` micro-slices of an ``expert_bytes`` expert (capped at 256), each of
    ``ceil(expert_bytes / count)`` bytes as :func:`buffer_slots` counts them: the bytes'
    quotient alone can leave one slot short where a micro-slice's bytes round up."""
    m = min(256, max(floor, math.ceil(expert_bytes * slots / (buffer_kib * 1024))))
    while m < 256 and buffer_slots(expert_bytes, buffer_kib, m, slots) < slots:
        m += 1
    return m


#: Slots a chiplet's slot table gets at most (its index width and occupancy logic grow with
#: it), unless the mesh needs more for deadlock freedom (:func:`slot_cap`).
SLOT_CAP = 64


def slot_cap(rows: int, cols: int) -> int:
    """The most slots a ``rows x cols`` mesh's chiplets get from their buffer:
    :data:`SLOT_CAP`, or deadlock freedom's ``max_hops + 1`` and one spare for pre-loads
    where that is more (:func:`mesh_slots`; meshes beyond 6x6: 71 on 8x8)."""
    return max(SLOT_CAP, mesh_slots(rows, cols))


def buffer_slots(expert_bytes: int, buffer_kib: int, microslices: int, cap: int = SLOT_CAP) -> int:
    """Micro-slice slots of a ``buffer_kib`` buffer when an ``expert_bytes`` expert is cut
    into ``microslices``: what :meth:`RunConfig.datapath_params` gives ``slots`` (at most
    ``cap``, the mesh's :func:`slot_cap`)."""
    return min(cap, (buffer_kib * 1024) // math.ceil(expert_bytes / microslices))


def _smallest(lo: int, hi: int, fits) -> int | None:
    """The smallest ``x`` in ``lo..hi`` with ``fits(x)``, for a ``fits`` false below some
    point and true from it on; ``None`` when ``fits(hi)`` is false."""
    if not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


def smallest_buffer_kib(
    expert_bytes: int, rows: int, cols: int, microslices: int | None = None
) -> int | None:
    """The smallest ``hardware.onchip_buffer_kib`` whose :func:`buffer_slots` meet deadlock
    freedom's ``max_hops + 1`` on a ``rows x cols`` mesh: with ``microslices`` micro-slices
    per expert, or, with ``None``, with the count :func:`run_from_dict` derives for each
    buffer.  ``None`` when no buffer in the field's range does.

    The slots grow with the buffer (a derived count fails only at its cap, 256, where they
    do), so the search is a bisection; ``tests/test_config.py`` checks that the result is
    accepted and one KiB less refused."""
    need, cap = max_hops(rows, cols) + 1, slot_cap(rows, cols)
    hi = specs(HardwareConfig)["onchip_buffer_kib"].hi

    def fits(kib: int) -> bool:
        m = microslices or derived_microslices(expert_bytes, kib, slots=mesh_slots(rows, cols))
        return buffer_slots(expert_bytes, kib, m, cap) >= need

    return _smallest(1, hi, fits)


def smallest_microslices(expert_bytes: int, buffer_kib: int, rows: int, cols: int) -> int | None:
    """The smallest ``hardware.microslices_per_expert`` for which a ``buffer_kib`` buffer
    holds deadlock freedom's ``max_hops + 1`` micro-slices on a ``rows x cols`` mesh;
    ``None`` when no count in the field's range does."""
    need, cap = max_hops(rows, cols) + 1, slot_cap(rows, cols)
    hi = specs(HardwareConfig)["microslices_per_expert"].hi
    return _smallest(1, hi, lambda m: buffer_slots(expert_bytes, buffer_kib, m, cap) >= need)


#: Most tokens of one iteration: an expert's EIT count must hold a whole iteration
#: (``2**count_width - 1 >= tokens_per_iteration``), and the widest count the scheduler
#: takes (``count_width`` 16 bits) holds ``2**16 - 1``.
MAX_TOKENS_PER_ITERATION = 2 ** specs(SchedulerParams)["count_width"].hi - 1


def derived_count_width(tokens_per_iteration: int) -> int:
    """The EIT count width a config gets when it leaves ``scheduler.count_width`` out: the
    smallest that holds a whole iteration's tokens (``2**w - 1 >= tokens_per_iteration``), at
    least 4 bits."""
    return max(4, int(tokens_per_iteration).bit_length())


# -- sections ------------------------------------------------------------------------------


@dataclass(frozen=True)
class HardwareConfig:
    """A multi-chiplet package: a ``rows x cols`` mesh of identical compute chiplets
    (2..64 chiplets; the scheduler takes 4..64)."""

    name: str = spec(str, doc="identifier (the file stem under configs/hardware/)")
    rows: int = spec(int, 1, 16, doc="mesh rows")
    cols: int = spec(int, 1, 16, doc="mesh columns")
    clock_mhz: float = spec(float, 1.0, 10_000.0, unit="MHz", doc="chiplet and NoP clock")
    macs_per_chiplet: int = spec(int, 1, 2**20, doc="MAC units of one compute die")
    onchip_buffer_kib: int = spec(
        int, 1, 2**20, unit="KiB", doc="on-chip SRAM of one chiplet for weights and tokens"
    )
    d2d_bandwidth_gbps: float = spec(
        float, 0.1, 10_000.0, unit="GB/s", doc="bandwidth of one die-to-die link"
    )
    d2d_latency_ns: float = spec(
        float, 0.0, 10_000.0, unit="ns", doc="die-to-die latency of one hop (may be 0)"
    )
    ddr_channels: int = spec(int, 1, 256, doc="off-package DDR channels of the package")
    ddr_bandwidth_gbps_per_channel: float = spec(
        float, 0.1, 10_000.0, unit="GB/s", doc="bandwidth of one DDR channel"
    )
    token_storage: bool = spec(
        bool,
        default=False,
        doc="count each chiplet's tokens (inputs and outputs, its share of an iteration) "
        "against onchip_buffer_kib, beside the weight slots",
    )
    microslices_per_expert: int | None = spec(
        int,
        1,
        256,
        default=None,
        doc="micro-slices an expert is cut into (Section IV-A); left out: derived per model, "
        "at least 8 and enough for the buffer to hold max(7, max_hops + 2) (2x2: 7, 3x3: 13, "
        "4x4: 19)",
    )

    @property
    def chiplets(self) -> int:
        """Number of compute chiplets, ``rows * cols``."""
        return self.rows * self.cols

    @property
    def ddr_bandwidth_gbps(self) -> float:
        """Aggregate DDR bandwidth of the package, GB/s."""
        return self.ddr_channels * self.ddr_bandwidth_gbps_per_channel


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Mixture-of-Experts transformer."""

    name: str = spec(str, doc="identifier (the file stem under configs/models/)")
    d_model: int = spec(int, 1, 65_536, doc="hidden size")
    d_ffn: int = spec(int, 1, 262_144, doc="intermediate size of one routed expert")
    experts: int = spec(int, 1, 4096, doc="routed experts per MoE layer E")
    top_k: int = spec(int, 1, 64, doc="routed experts per token (at most experts)")
    shared_experts: int = spec(int, 0, 64, doc="always-active shared experts (not scheduled)")
    layers: int = spec(int, 1, 1024, doc="decoder layers")
    heads: int = spec(int, 1, 1024, doc="attention (query) heads")
    params_b: float = spec(float, 0.001, 100_000.0, unit="billion", doc="total parameters")

    @property
    def expert_bytes(self) -> int:
        """Bytes of one routed expert: three ``d_model x d_ffn`` projections of
        :data:`WEIGHT_BYTES` weights."""
        return 3 * self.d_model * self.d_ffn * WEIGHT_BYTES


@dataclass(frozen=True)
class SchedulerConfig:
    """Generics of the hardware scheduler that are not implied by hardware or model
    (declared by :class:`~fsedp.params.SchedulerParams`)."""

    requests: int = same_as(SchedulerParams, "requests")
    theta_min: int = same_as(SchedulerParams, "theta_min")
    n_threshold: int = same_as(SchedulerParams, "n_threshold")
    qos_width: int = same_as(SchedulerParams, "qos_width")
    t_qos_init: int = spec(
        int, 0, 2**16 - 1, doc="initial QoS timer of a request (at most 2**qos_width - 1)"
    )
    #: left out: :func:`derived_count_width` of the run's ``scenario.tokens_per_iteration``
    count_width: int | None = same_as(SchedulerParams, "count_width", default=None)
    #: left out: each strategy's own; A7 and A8 (the link-aware ones, the only ones that read
    #: it) take 8 on the cycle path, 4 on the snake, 2 where the other embeddings' paths are
    #: longer (:func:`fsedp.sim.fsedp.a7_ring_orders`)
    ring_orders: int | None = same_as(SchedulerParams, "ring_orders", default=None)
    #: left out: each strategy's own; A7 and A8 (the only ones that read it) lay their rings
    #: on the ``cycle`` path (:data:`fsedp.params.RING_PATHS`) where a side of the mesh is
    #: even (:func:`fsedp.sim.fsedp.a7_ring_path`), the others on the snake
    ring_path: str | None = same_as(SchedulerParams, "ring_path", default=None)


#: Scenario fields that describe the synthetic workload only: required with
#: ``trace: synthetic``, refused with a trace (a file or ``model``), where nothing reads them.
SYNTHETIC_ONLY = ("skew", "prefill_fraction")


@dataclass(frozen=True, kw_only=True)
class ScenarioConfig:
    """The workload of a run (:mod:`fsedp.workload` turns it into gate records).

    The :data:`SYNTHETIC_ONLY` fields are ``None`` in a scenario that replays a trace."""

    tokens_per_iteration: int = spec(
        int,
        1,
        MAX_TOKENS_PER_ITERATION,
        doc="tokens of one forward iteration; the EIT's token count (scheduler.count_width, "
        "at most 16 bits) holds them",
    )
    #: left out: one iteration, ``model.layers`` rounds
    rounds: int | None = spec(
        int,
        1,
        1_000_000,
        default=None,
        doc="scheduling rounds (iteration x MoE layer) of fsedp rtl rounds; left out: one "
        "iteration (model.layers)",
    )
    seed: int = spec(int, 0, 2**32 - 1, doc="seed of every random choice")
    trace: str = spec(
        str,
        doc="synthetic, model (the project's LM on WikiText-2), or a "
        "trace file, relative to the config's folder",
    )
    skew: float | None = spec(
        float,
        0.0,
        10.0,
        default=None,
        doc="Zipf-like exponent of synthetic popularity (synthetic only: required there, "
        "refused with a trace)",
    )
    prefill_fraction: float | None = spec(
        float,
        0.0,
        1.0,
        default=None,
        doc="share of prefill tokens (synthetic only: required there, refused with a trace)",
    )
    sharding: str = spec(
        str,
        choices=("token", "request"),
        default="token",
        doc="token: token i on chiplet i mod C; request: a request's tokens on one chiplet",
    )


@dataclass(frozen=True)
class RunConfig:
    """A complete run: hardware, model, scheduler and scenario.

    ``source`` is the file it came from (``<default>`` for :func:`default_run`); it is used
    in error messages and to resolve a relative trace path, and is ignored by ``==``.
    """

    hardware: HardwareConfig
    model: ModelConfig
    scheduler: SchedulerConfig
    scenario: ScenarioConfig
    source: str = field(default="<memory>", compare=False, repr=False)

    #: SchedulerParams field -> dotted field of the run config that sets it.
    _PARAM_FIELDS = {
        "chiplets": "hardware",
        "experts": "model.experts",
        "count_width": "scheduler.count_width",
        "requests": "scheduler.requests",
        "theta_min": "scheduler.theta_min",
        "n_threshold": "scheduler.n_threshold",
        "qos_width": "scheduler.qos_width",
    }

    def scheduler_params(self) -> SchedulerParams:
        """The scheduler generics of this run: ``chiplets = rows * cols``,
        ``experts = model.experts``, the rest from :attr:`scheduler`.  A value the scheduler
        rejects raises :class:`~fsedp.errors.InputError` naming :attr:`source` and the
        run-config field."""
        s = self.scheduler
        try:
            return SchedulerParams(
                chiplets=self.hardware.chiplets,
                experts=self.model.experts,
                count_width=s.count_width,
                requests=s.requests,
                theta_min=s.theta_min,
                n_threshold=s.n_threshold,
                qos_width=s.qos_width,
            )
        except InputError as e:
            reason = e.reason
            if e.field == "chiplets":
                reason = (
                    f"rows x cols = {self.hardware.rows} x {self.hardware.cols} "
                    f"= {self.hardware.chiplets}, but the scheduler's chiplets {reason}"
                )
            raise e.at(self.source, self._PARAM_FIELDS.get(e.field, e.field), reason) from None

    @property
    def token_kib(self) -> int:
        """KiB of each chiplet's buffer its tokens take (:func:`token_kib`; 0 without
        ``hardware.token_storage``)."""
        return token_kib(self.hardware, self.model, self.scenario.tokens_per_iteration)

    @property
    def weight_kib(self) -> int:
        """KiB of each chiplet's buffer left for micro-slices: ``onchip_buffer_kib`` less
        :attr:`token_kib`."""
        return weight_kib(self.hardware, self.model, self.scenario.tokens_per_iteration)

    def microslice_bytes(self) -> int:
        """Bytes of one micro-slice: the expert over ``hardware.microslices_per_expert``."""
        return math.ceil(self.model.expert_bytes / self.hardware.microslices_per_expert)

    def check_buffer(self, derived: bool = False) -> None:
        """Deadlock freedom's room: the buffer must hold ``max_hops + 1`` micro-slices
        (:func:`buffer_slots`), else an :class:`~fsedp.errors.InputError` at
        ``hardware.onchip_buffer_kib`` names the smallest buffer that would
        (:func:`smallest_buffer_kib`) and, for a micro-slice count set by hand, the smallest
        count that would (:func:`smallest_microslices`).  ``derived``: the count was derived
        from the buffer (:func:`run_from_dict`), so the buffer named is the smallest with the
        count derived for it."""
        h, m = self.hardware, self.model
        size, buf, count = m.expert_bytes, self.weight_kib, h.microslices_per_expert
        tok = self.token_kib
        if buf < 1:
            raise InputError(
                self.source,
                "hardware.onchip_buffer_kib",
                f"{h.onchip_buffer_kib} KiB is taken by the tokens alone "
                f"(hardware.token_storage: {tok} KiB for "
                f"{self.scenario.tokens_per_iteration} tokens per iteration)",
            )
        slots = buffer_slots(size, buf, count, slot_cap(h.rows, h.cols))
        need = max_hops(h.rows, h.cols) + 1
        if slots >= need:
            return
        top_kib = specs(HardwareConfig)["onchip_buffer_kib"].hi
        top_count = specs(HardwareConfig)["microslices_per_expert"].hi
        rows, cols = h.rows, h.cols
        none_fits = f"no hardware.onchip_buffer_kib up to {top_kib} fits this model on this mesh"
        if derived:
            cut = f"derived microslices_per_expert {count}" + (
                ", the most" if count == top_count else ""
            )
            kib = smallest_buffer_kib(size, rows, cols)
            hint = f"hardware.onchip_buffer_kib >= {kib + tok} would fit" if kib else none_fits
        else:
            cut = f"microslices_per_expert {count}"
            kib = smallest_buffer_kib(size, rows, cols, count)
            more = smallest_microslices(size, buf, rows, cols)
            if kib and more:
                hint = (
                    f"hardware.onchip_buffer_kib >= {kib + tok} or "
                    f"hardware.microslices_per_expert >= {more} would fit"
                )
            elif kib:
                # no count fits this buffer: a smaller one may do with the count derived
                least = smallest_buffer_kib(size, rows, cols)
                hint = (
                    f"hardware.onchip_buffer_kib >= {kib + tok} would fit (no "
                    f"microslices_per_expert up to {top_count} does"
                    + (
                        f"; >= {least + tok} with microslices_per_expert left out)"
                        if least and least < kib
                        else ")"
                    )
                )
            elif more:
                hint = (
                    f"hardware.microslices_per_expert >= {more} would fit (no "
                    f"onchip_buffer_kib up to {top_kib} does)"
                )
            else:  # neither alone: a larger buffer with the count derived for it
                kib = smallest_buffer_kib(size, rows, cols)
                hint = (
                    f"hardware.onchip_buffer_kib >= {kib + tok} with microslices_per_expert left "
                    "out would fit (neither alone does)"
                    if kib
                    else none_fits
                )
        raise InputError(
            self.source,
            "hardware.onchip_buffer_kib",
            (f"{buf} KiB left by {tok} KiB of tokens" if tok else f"{buf} KiB")
            + f" holds {slots} micro-slices of {self.microslice_bytes() / 1024:.0f} KiB "
            f"({cut}), but a {h.rows}x{h.cols} mesh needs at least {need} per chiplet for "
            f"deadlock-free streaming; {hint}",
        )

    def datapath_params(self, **overrides) -> DatapathParams:
        """Generics of the chiplet datapath RTL for this run, in clock cycles.

        ``slots`` = micro-slices that fit in ``onchip_buffer_kib`` (at most :func:`slot_cap`:
        64, more on meshes that need more);
        ``link_cycles`` = micro-slice bytes over the link's bytes per cycle plus the D2D
        latency; ``ddr_interval`` = micro-slice bytes over the package's DDR bytes per cycle;
        ``ddr_latency`` = :data:`DDR_LATENCY_NS`; ``cycles_per_token`` = MACs of one token on
        one micro-slice over ``macs_per_chiplet``.  A buffer that holds fewer micro-slices
        than deadlock freedom needs (``max_hops + 1``) is an error naming
        ``hardware.onchip_buffer_kib`` and a buffer that would do (:meth:`check_buffer`); a
        derived generic out of the RTL's range names ``<datapath>.<generic>``.
        """
        h, m = self.hardware, self.model
        sp = self.scheduler_params()
        ms = self.microslice_bytes()
        per_cycle = 1e6 * h.clock_mhz
        self.check_buffer()
        gen = {
            "slots": buffer_slots(
                m.expert_bytes,
                self.weight_kib,
                h.microslices_per_expert,
                slot_cap(h.rows, h.cols),
            ),
            "micro_slices": h.microslices_per_expert,
            "link_cycles": math.ceil(ms / (h.d2d_bandwidth_gbps * 1e9 / per_cycle))
            + math.ceil(h.d2d_latency_ns * h.clock_mhz / 1000),
            "ddr_interval": math.ceil(ms / (h.ddr_bandwidth_gbps * 1e9 / per_cycle)),
            "ddr_latency": math.ceil(DDR_LATENCY_NS * h.clock_mhz / 1000),
            "cycles_per_token": math.ceil(
                3 * m.d_model * m.d_ffn / h.microslices_per_expert / h.macs_per_chiplet
            ),
        }
        gen.update(overrides)
        try:
            return DatapathParams.for_scheduler(sp, h.rows, h.cols, **gen)
        except InputError as e:
            raise e.at(self.source, f"<datapath>.{e.field}") from None

    def trace_path(self) -> Path | None:
        """Path of the scenario's routing trace, or ``None`` for a synthetic trace.

        A relative path is resolved against the folder of :attr:`source` (against the
        current directory when the config did not come from a file).
        """
        t = self.scenario.trace
        if t == "synthetic":
            return None
        if t == "model":
            return EMBEDDED_TRACE
        return _relative(t, self.source)


# -- reading -------------------------------------------------------------------------------

_SECTIONS = {
    "hardware": (HardwareConfig, "hardware"),
    "model": (ModelConfig, "models"),
    "scheduler": (SchedulerConfig, "scheduler"),
    "scenario": (ScenarioConfig, None),
}


def _relative(name: str, source: str) -> Path:
    p = Path(name).expanduser()
    if not p.is_absolute() and not source.startswith("<"):
        p = Path(source).parent / p
    return p


def _cross_check(cls, v: dict, file: str, prefix: str):
    """Constraints between fields of one section."""

    def where(name):
        return f"{prefix}.{name}" if prefix else name

    if cls is HardwareConfig and not 2 <= v["rows"] * v["cols"] <= MAX_CHIPLETS:
        raise InputError(
            file,
            where("rows"),
            f"rows x cols = {v['rows']} x {v['cols']} = "
            f"{v['rows'] * v['cols']}; a package has 2..{MAX_CHIPLETS} "
            f"chiplets",
        )
    if cls is ModelConfig and v["top_k"] > v["experts"]:
        raise InputError(
            file, where("top_k"), f"top_k = {v['top_k']} exceeds experts = {v['experts']}"
        )
    if cls is SchedulerConfig:
        if v["t_qos_init"] > 2 ** v["qos_width"] - 1:
            raise InputError(
                file,
                where("t_qos_init"),
                f"must be in 0..2**qos_width - 1 = {2 ** v['qos_width'] - 1}, "
                f"not {v['t_qos_init']}",
            )
        if v.get("ring_orders") is not None:
            try:
                check_ring_orders(v["ring_orders"])
            except InputError as e:
                raise e.at(file, where("ring_orders")) from None
        # the joint ranges of the other fields are SchedulerParams' own check (ring_orders is
        # the link-aware strategies' choice, not a generic of the scheduler every run builds)
        skip = ("t_qos_init", "ring_orders", "ring_path")
        fields = {k: x for k, x in v.items() if k not in skip and x is not None}
        try:
            SchedulerParams(**fields)
        except InputError as e:
            raise e.at(file, where(e.field)) from None
    if cls is ScenarioConfig:
        # the synthetic workload's own fields: needed to make it, read by nothing else
        given = [name for name in SYNTHETIC_ONLY if v.get(name) is not None]
        if v["trace"] == "synthetic":
            for name in SYNTHETIC_ONLY:
                if name not in given:
                    raise InputError(
                        file,
                        where(name),
                        f"missing key (trace: synthetic needs {' and '.join(SYNTHETIC_ONLY)})",
                    )
        elif given:
            trace = v["trace"] if len(v["trace"]) <= 80 else v["trace"][:77] + "..."
            raise InputError(
                file,
                where(given[0]),
                f"applies to synthetic scenarios only; this scenario replays trace: {trace}",
            )


def _section(cls, data: Any, file: str, prefix: str = ""):
    values = build(cls, data, file, prefix)
    _cross_check(cls, values, file, prefix)
    return cls(**values)


def named_configs(kind: str) -> list[str]:
    """Names of the configs in ``CONFIG_DIR/<kind>/`` (``hardware``, ``models``,
    ``scheduler``, ``experiments``); an empty list when the folder does not exist."""
    try:
        return sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml") if p.is_file())
    except OSError:
        return []


def config_path(kind: str, name: str, file: str = "<memory>", where: str | None = None) -> Path:
    """The file of a section given as ``name``: a named config of ``CONFIG_DIR/<kind>/``, or,
    when ``name`` ends in ``.yaml``/``.yml`` or holds a ``/``, a file path relative to the
    folder of ``file``.  An unknown name raises :class:`~fsedp.errors.InputError` at
    ``file: where`` listing the known ones."""
    where = where or kind
    if name.endswith((".yaml", ".yml")) or "/" in name or "\\" in name:
        path = _relative(name, file)
        try:
            mode = os.stat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            raise InputError(file, where, f"no config file {str(path)[:200]}") from None
        except (OSError, ValueError) as e:  # ValueError: a NUL in the name
            why = e.strerror if isinstance(e, OSError) else "not a usable path"
            raise InputError(file, where, f"cannot look at {str(path)[:200]}: {why}") from None
        if not stat.S_ISREG(mode):  # a FIFO would block the reader, a folder is not a config
            raise InputError(
                file, where, f"{str(path)[:200]} is {kind_of(mode)}, not a regular file"
            )
        return path
    known = named_configs(kind)
    if name not in known:
        listing = ", ".join(known) if known else f"none: {CONFIG_DIR / kind} is empty or absent"
        raise InputError(
            file,
            where,
            f"unknown {where} config {name[:60]!r}; known: {listing} "
            f"(or give a file path ending in .yaml)",
        )
    return CONFIG_DIR / kind / f"{name}.yaml"


def load_section(cls, path):
    """A section file (fields at its top level) as ``cls``."""
    return _section(cls, read_yaml(path), str(path))


def load_hardware(path) -> HardwareConfig:
    """A hardware config file."""
    return load_section(HardwareConfig, path)


def load_model(path) -> ModelConfig:
    """A model config file."""
    return load_section(ModelConfig, path)


def load_scheduler(path) -> SchedulerConfig:
    """A scheduler config file."""
    return load_section(SchedulerConfig, path)


def run_from_dict(data: Any, source: str = "<memory>") -> RunConfig:
    """A validated run config from an already parsed mapping.

    ``hardware``, ``model`` and ``scheduler`` may be mappings, names of configs under
    :data:`CONFIG_DIR` or file paths; ``scenario`` must be a mapping.  A hardware section
    without ``microslices_per_expert`` gets :func:`derived_microslices`, a scenario without
    ``rounds`` one iteration (``model.layers`` rounds).  Cross-section
    checks: the EIT count must hold a whole iteration (``2**count_width - 1 >=
    tokens_per_iteration``), :meth:`RunConfig.scheduler_params` must accept the result, and
    so must :meth:`RunConfig.datapath_params` (micro-slices, buffer, link and DDR timing).
    """
    if not isinstance(data, dict):
        raise InputError(source, "<top>", f"the top level must be a mapping, not {describe(data)}")
    for key in data:
        if key not in _SECTIONS:
            raise InputError(
                source, str(key)[:60], f"unknown key; allowed keys: {', '.join(_SECTIONS)}"
            )
    for key in _SECTIONS:
        if key not in data:
            raise InputError(source, key, f"missing key (required keys: {', '.join(_SECTIONS)})")
    built = {}
    for key, (cls, folder) in _SECTIONS.items():
        v = data[key]
        if isinstance(v, str) and folder is not None:
            built[key] = load_section(cls, config_path(folder, v, source, key))
        elif isinstance(v, dict):
            built[key] = _section(cls, v, source, key)
        else:
            what = (
                f"a mapping of fields, the name of a config in configs/{folder}/ or a file path"
                if folder
                else "a mapping of fields"
            )
            raise InputError(source, key, f"must be {what}, not {describe(v)}")
    h, m, scen = built["hardware"], built["model"], built["scenario"]
    derived = h.microslices_per_expert is None
    if derived:
        built["hardware"] = dataclasses.replace(
            h,
            microslices_per_expert=derived_microslices(
                m.expert_bytes,
                max(1, weight_kib(h, m, scen.tokens_per_iteration)),
                slots=mesh_slots(h.rows, h.cols),
            ),
        )
    s, tokens = built["scheduler"], built["scenario"].tokens_per_iteration
    if s.count_width is None:
        built["scheduler"] = dataclasses.replace(s, count_width=derived_count_width(tokens))
    if built["scenario"].rounds is None:
        built["scenario"] = dataclasses.replace(built["scenario"], rounds=m.layers)
    run = RunConfig(source=source, **built)
    cw, tokens = run.scheduler.count_width, run.scenario.tokens_per_iteration
    if 2**cw - 1 < tokens:
        raise InputError(
            source,
            "scheduler.count_width",
            f"too small: 2**{cw} - 1 = {2**cw - 1} < scenario.tokens_per_iteration "
            f"= {tokens}, an expert's token count could saturate",
        )
    run.scheduler_params()
    run.check_buffer(derived)
    run.datapath_params()
    return run


def load_run(path) -> RunConfig:
    """A validated run config file (the four sections at its top level), with
    ``source = str(path)``."""
    return run_from_dict(read_yaml(path), str(path))


_DEFAULT_RUN_YAML = """
# The embedded default run: the 2x2 test chip of Table I running Qwen3-30B-A3B.
# Same content as configs/run-2x2-qwen3.yaml, but needs no file.
hardware:
  name: chip2x2
  rows: 2
  cols: 2
  clock_mhz: 800
  macs_per_chiplet: 2048
  onchip_buffer_kib: 4096
  d2d_bandwidth_gbps: 288
  d2d_latency_ns: 4.02
  ddr_channels: 4
  ddr_bandwidth_gbps_per_channel: 25.6
  microslices_per_expert: 8
model:
  name: qwen3-30b-a3b
  d_model: 2048
  d_ffn: 768
  experts: 128
  top_k: 8
  shared_experts: 0
  layers: 48
  heads: 32
  params_b: 30
scheduler:
  requests: 8
  theta_min: 2
  n_threshold: 4
  qos_width: 4
  t_qos_init: 0
scenario:
  tokens_per_iteration: 64
  rounds: 4
  seed: 1
  trace: synthetic
  skew: 1.1
  prefill_fraction: 0.5
  sharding: token
"""


def default_run() -> RunConfig:
    """The embedded default run (no file access).

    The 2x2 test chip of Table I (800 MHz, 2048 MACs per chiplet, 288 GB/s / 4.02 ns UCIe,
    4 x 25.6 GB/s DDR) running Qwen3-30B-A3B (128 experts, top-8); scheduler
    ``requests=8, theta_min=2, n_threshold=4, qos_width=4, t_qos_init=0`` and the count
    width derived from the tokens (7 bits);
    64 tokens per iteration, 4 rounds, seed 1, synthetic trace with skew 1.1, half prefill.

    Returns
    -------
    RunConfig
        With ``source = "<default>"``; equal to ``load_run("configs/run-2x2-qwen3.yaml")``.
    """
    return run_from_dict(parse_yaml(_DEFAULT_RUN_YAML, "<default>"), "<default>")


def config_to_dict(cfg) -> dict:
    """Plain ``dict`` of a config, for JSON or YAML output.

    Parameters
    ----------
    cfg : RunConfig, HardwareConfig, ModelConfig, SchedulerConfig or ScenarioConfig

    Returns
    -------
    dict
        Field name -> value (nested for a :class:`RunConfig`; its ``source`` is left out, and
        so is a field that is ``None``: a scenario's :data:`SYNTHETIC_ONLY` fields when it
        replays a trace, a derived field of a section loaded on its own).  Feeding the
        result of a :class:`RunConfig` to :func:`run_from_dict` gives an equal config back.
    """
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"not a config dataclass: {cfg!r}")
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if f.name == "source" or v is None:
            continue
        out[f.name] = config_to_dict(v) if dataclasses.is_dataclass(v) else v
    return out
