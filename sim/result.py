"""Per-layer results shared by every strategy."""

from dataclasses import dataclass, field

__all__ = ["LayerResult"]


@dataclass
class LayerResult:
    """One MoE layer under one strategy (cycles and bytes).

    ``busy`` is each chiplet's compute-busy cycles; ``timeline`` the number of computing
    chiplets as ``(cycle, count)`` steps; ``bound`` the hardware lower bound of the layer
    (the larger of the DDR time, every active expert loaded once over all channels, and the
    compute time, all MACs spread evenly); ``link_bound`` the lower bound that sees the
    die-to-die links as well (:func:`fsedp.sim.baselines.link_bound`, never below ``bound``);
    ``stream_bound`` the same for strategies that leave every token where it is (FSE-DP;
    never below ``link_bound``; 0 for the baselines, which move tokens).
    """

    strategy: str
    cycles: int
    bound: int
    busy: list[int]
    ddr_bytes: int
    d2d_bytes: int
    peak_weight_bytes: int  # largest over chiplets
    peak_token_bytes: int  # largest over chiplets
    ddr_cycles: int  # bound components, for the breakdown
    compute_cycles: int
    link_bound: int
    stream_bound: int
    timeline: list[tuple[int, int]] = field(default_factory=list)
    decisions: int = 0
    link_bytes: dict = field(default_factory=dict)
    ddr_per_chiplet: list = field(default_factory=list)  # bytes loaded into each chiplet
    script: list = field(default_factory=list)  # FSE-DP: completion masks, in order
    beats: list = field(default_factory=list)  # FSE-DP: [kind, expert, entry, traj] decisions
    steps: int = 0  # golden-model steps simulated
    events: int = 0  # micro-slice DDR loads, D2D transfers, computations
    defer: int = 0  # requests deferred by Algorithm 2
    activity: list = field(default_factory=list)  # (chiplet, kind, start, end) when traced
    #: idle unit-cycles by cause, ``{"ddr": {cause: cycles}, "compute": {cause: cycles}}``,
    #: summed over the DDR channels and over the compute units (see :meth:`lost`)
    idle: dict = field(default_factory=dict)
    #: every micro-slice event when asked for (``fsedp_layer(log=True)``)
    log: list = field(default_factory=list)
    #: A8: the layer's gathering into regions (:func:`fsedp.sim.fsedp.add_gather`)
    gather: dict = field(default_factory=dict)

    @property
    def utilization(self) -> float:
        n = len(self.busy)
        return sum(self.busy) / (n * self.cycles) if self.cycles else 0.0

    @property
    def bounding(self) -> str:
        """The resource whose time is the lower bound: ``"ddr"`` or ``"compute"``."""
        return "ddr" if self.ddr_cycles >= self.compute_cycles else "compute"

    def lost(self) -> dict:
        """The gap to the bound by cause: the bounding resource's idle cycles per unit.
        Its busy time per unit is the bound (every micro-slice is loaded once; all MACs
        spread evenly), so the causes add up to ``cycles - bound`` up to the bound's
        rounding."""
        units = len(self.busy) or 1
        return {k: v / units for k, v in self.idle.get(self.bounding, {}).items()}

    @property
    def x_bound(self) -> float:
        return self.cycles / self.bound if self.bound else float("nan")

    @property
    def x_link_bound(self) -> float:
        return self.cycles / self.link_bound if self.link_bound else float("nan")
