"""Hardware and model timing of a simulation, all derived from one :class:`RunConfig`."""

import dataclasses
import math
from dataclasses import dataclass

from fsedp.config import ACT_BYTES, WEIGHT_BYTES, RunConfig
from fsedp.errors import InputError
from fsedp.params import DatapathParams, SchedulerParams

__all__ = ["Setup", "make_setup", "ACT_BYTES"]


@dataclass(frozen=True)
class Setup:
    """Everything a strategy needs, in clock cycles and bytes.

    ``dp`` are the FSE-DP datapath generics with one DDR channel per chiplet (Table I: four
    DDR channels on the 2x2 chip), so that every strategy sees the same DDR, D2D, compute and
    on-chip memory.
    """

    cfg: RunConfig
    sp: SchedulerParams
    dp: DatapathParams
    microslice_bytes: int
    expert_bytes: int
    buffer_bytes: int  # on-chip memory per chiplet
    act_bytes: int  # one token's activation vector
    link_bytes_per_cycle: float
    link_latency_cycles: int
    attention_weight_bytes: int  # per layer, all heads

    @property
    def ddr_access_cycles(self) -> int:
        """DDR access latency without the streaming of the micro-slice (``dp.ddr_latency``
        includes the ``ddr_interval`` a micro-slice streams for)."""
        return self.dp.ddr_latency - self.dp.ddr_interval

    @property
    def chiplets(self) -> int:
        return self.dp.chiplets

    @property
    def ns_per_cycle(self) -> float:
        return 1000.0 / self.cfg.hardware.clock_mhz

    def expert_load_cycles(self) -> int:
        """Cycles one DDR channel needs for a whole expert (``micro_slices`` loads)."""
        return self.dp.micro_slices * self.dp.ddr_interval

    def expert_compute_cycles(self, tokens: int) -> int:
        """Cycles one chiplet needs to run ``tokens`` tokens through a whole expert."""
        return self.dp.micro_slices * max(1, tokens) * self.dp.cycles_per_token

    def _phases(self, macs_per_chiplet: float, weight_bytes: int) -> tuple[int, int]:
        """``(compute, load)`` cycles: ``macs_per_chiplet`` MACs on one chiplet, and
        ``weight_bytes`` loaded over every DDR channel."""
        n, hw = self.chiplets, self.cfg.hardware
        compute = math.ceil(macs_per_chiplet / hw.macs_per_chiplet)
        load = math.ceil(weight_bytes / self.microslice_bytes / n) * self.dp.ddr_interval
        return compute, load

    def _overlapped(self, macs_per_chiplet: float, weight_bytes: int) -> int:
        """Compute of ``macs_per_chiplet`` MACs against loading ``weight_bytes`` over all DDR
        channels, overlapped, plus one DDR access."""
        return max(self._phases(macs_per_chiplet, weight_bytes)) + self.ddr_access_cycles

    def _attention_macs(self, tokens: int) -> float:
        m = self.cfg.model
        share = math.ceil(m.heads / self.chiplets) / m.heads
        return tokens * 4 * m.d_model * m.d_model * share

    def attention_ddr_idle_cycles(self, tokens: int) -> int:
        """Cycles each DDR channel idles during one attention block: its compute beyond the
        loading of its weights (0 when the block is DDR-bound), the window in which weights
        of the next MoE layer could be pre-loaded."""
        compute, load = self._phases(self._attention_macs(tokens), self.attention_weight_bytes)
        return max(0, compute - load)

    def attention_cycles(self, tokens: int) -> int:
        """One attention block with its ``heads`` split over the chiplets (head parallelism:
        the busiest chiplet has ``ceil(heads / C)`` of them): the Q/K/V/O projections
        (``4 d_model^2`` MACs per token; the score part, which depends on the context length,
        is left out) against the loading of their weights over all DDR channels.  The same
        for every strategy."""
        return self._overlapped(self._attention_macs(tokens), self.attention_weight_bytes)

    def shared_expert_cycles(self, tokens: int) -> int:
        """The model's ``shared_experts`` (as large as a routed expert; every token goes
        through them), split over the chiplets like a dense layer: their MACs against loading
        their weights over all DDR channels.  The same for every strategy; 0 without them."""
        m = self.cfg.model
        if not m.shared_experts:
            return 0
        macs = tokens * m.shared_experts * 3 * m.d_model * m.d_ffn / self.chiplets
        return self._overlapped(macs, m.shared_experts * m.expert_bytes)

    def dense_cycles(self, tokens: int) -> int:
        """The part of a decoder layer outside the routed experts: attention and the shared
        experts, one after the other."""
        return self.attention_cycles(tokens) + self.shared_expert_cycles(tokens)


def make_setup(cfg: RunConfig, **overrides) -> Setup:
    """Setup of a run; ``overrides`` replace ``DatapathParams`` fields (e.g. ``rule5``)."""
    hw, m = cfg.hardware, cfg.model
    if hw.ddr_channels % hw.chiplets:
        raise InputError(
            cfg.source,
            "hardware.ddr_channels",
            f"{hw.ddr_channels} channels cannot be split evenly over {hw.chiplets} chiplets",
        )
    per_channel = hw.ddr_bandwidth_gbps_per_channel * (hw.ddr_channels // hw.chiplets)
    ms = cfg.microslice_bytes()
    interval = math.ceil(ms / (per_channel * 1e9 / (hw.clock_mhz * 1e6)))
    # a micro-slice is usable once its last byte is on chip: the access latency plus the
    # interval its channel streams it for (the same arrival time as the baselines')
    access = cfg.datapath_params().ddr_latency
    dp = cfg.datapath_params(
        ddr_channels=hw.chiplets, ddr_interval=interval, ddr_latency=access + interval
    )
    if overrides:
        dp = dataclasses.replace(dp, **overrides)
    # token buffering (Algorithm 2, ablation A5) defers work to later iterations, which this
    # simulator does not carry over: it is switched off (theta_min = 0) for A1-A4
    sp = dataclasses.replace(cfg.scheduler_params(), theta_min=0)
    return Setup(
        cfg=cfg,
        sp=sp,
        dp=dp,
        microslice_bytes=ms,
        expert_bytes=ms * hw.microslices_per_expert,
        buffer_bytes=cfg.weight_kib * 1024,
        act_bytes=m.d_model * ACT_BYTES,
        link_bytes_per_cycle=hw.d2d_bandwidth_gbps * 1e9 / (hw.clock_mhz * 1e6),
        link_latency_cycles=math.ceil(hw.d2d_latency_ns * hw.clock_mhz / 1000),
        attention_weight_bytes=4 * m.d_model * m.d_model * WEIGHT_BYTES,
    )
