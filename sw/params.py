"""Scheduler parameters: the one source of truth shared by the golden model and the RTL.

``configs/*.yaml`` -> :func:`fsedp.config.load` -> :class:`SchedulerParams` -> both
``fsedp.sw`` (golden model) and ``fsedp.hw`` (Amaranth generics).  Nothing else defines a
width or a depth.
"""

from dataclasses import dataclass

__all__ = ["SchedulerParams", "ParamError", "bits_for", "next_pow2"]


class ParamError(ValueError):
    """A parameter is out of its range.  ``field`` names it, the message shows the bad value."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def bits_for(n: int) -> int:
    """Bits needed to encode the values ``0 .. n-1`` (at least 1)."""
    return max(1, (n - 1).bit_length())


def next_pow2(n: int) -> int:
    return 1 << bits_for(n) if n > 1 else 1


@dataclass(frozen=True)
class SchedulerParams:
    """Generics of the FSE-DP hardware scheduler.

    Parameters
    ----------
    chiplets : int
        Number of compute chiplets ``C`` (4..16); the ICV, trajectory masks and completion
        masks are ``C`` bits wide.
    experts : int
        Routed experts per MoE layer ``E`` (8..256).  The bitonic sorter is padded to the next
        power of two.
    count_width : int
        Width of a token count in the EIT (1..16).  Counts saturate at ``2**count_width - 1``
        and raise the sticky ``overflow`` flag (see ``docs/blocks/eit.md``).
    requests : int
        Depth of the request table ``R`` (1..64): request ids are ``0 .. R-1``.
    theta_min : int
        Cold threshold: an expert with ``0 < n_e < theta_min`` is cold (Algorithm 2).
        ``0`` disables token buffering.
    n_threshold : int
        ``N_threshold`` of Algorithm 2, counted in rounds (one round = one MoE layer of one
        iteration) during which the request was not deferred (1..2**cfw_width-1).
    qos_width : int
        Width of the per-request QoS timer ``T_QoS`` (1..16); it saturates.
    """

    chiplets: int = 4
    experts: int = 16
    count_width: int = 8
    requests: int = 8
    theta_min: int = 2
    n_threshold: int = 4
    qos_width: int = 4

    def __post_init__(self):
        def check(field, lo, hi):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ParamError(field, f"must be an integer, not {v!r}")
            if not lo <= v <= hi:
                raise ParamError(field, f"must be in {lo}..{hi}, not {v}")

        check("chiplets", 4, 16)
        check("experts", 8, 256)
        check("count_width", 1, 16)
        check("requests", 1, 64)
        check("qos_width", 1, 16)
        check("theta_min", 0, 2**self.count_width - 1)
        check("n_threshold", 1, 2**16 - 1)

    # -- derived widths, used by RTL and golden model alike ------------------------------
    @property
    def chiplet_bits(self) -> int:
        return bits_for(self.chiplets)

    @property
    def expert_bits(self) -> int:
        return bits_for(self.experts)

    @property
    def request_bits(self) -> int:
        return bits_for(self.requests)

    @property
    def sorter_lanes(self) -> int:
        """Lanes of the bitonic sorter: ``E`` padded to a power of two."""
        return next_pow2(self.experts)

    @property
    def lane_id_bits(self) -> int:
        return bits_for(self.sorter_lanes)

    @property
    def count_max(self) -> int:
        return 2**self.count_width - 1

    @property
    def qos_max(self) -> int:
        return 2**self.qos_width - 1

    @property
    def cfw_width(self) -> int:
        return self.n_threshold.bit_length()

    @property
    def cfw_max(self) -> int:
        return 2**self.cfw_width - 1

    @property
    def position_bits(self) -> int:
        """Bits of a position in the paired-load order (0..E, E meaning "end")."""
        return bits_for(self.experts + 1)
