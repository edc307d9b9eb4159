"""Device profiles of the software-side models: the link expert weights cross from host
memory and the cost of running one expert, for the offload model
(:mod:`fsedp.sw.policies.offload`), and the accelerator of the serving model
(:class:`fsedp.sw.policies.qos.PerfModel`).

A profile is a YAML file of :class:`DeviceProfile` fields, named under ``configs/devices/``
(``pcie4-default``: the constants both models assumed before profiles existed;
``h100-pcie5``: figures measured on an H100 on PCIe Gen5) or given as a path
(``fsedp offload --profile-device OUT.yaml`` writes one fitted on the current device).
Every field is checked on loading; a bad one is refused on one line ``file: field:
reason`` (:class:`~fsedp.errors.InputError`).  ``docs/configs.md`` lists the fields.
"""

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from fsedp.errors import COMMAND_LINE, InputError
from fsedp.fields import build, describe, spec

__all__ = ["DeviceProfile", "DEFAULT_DEVICE", "load_device", "profile_yaml", "TABLE_MAX"]

#: the profile both models use unless told otherwise
DEFAULT_DEVICE = "pcie4-default"
#: most entries of an ``expert_table_us``
TABLE_MAX = 64


@dataclass(frozen=True)
class DeviceProfile:
    name: str = spec(str, doc="identifier (the file stem under configs/devices/)")
    link_gbs: float = spec(
        float, 1e-3, 1e5, unit="GB/s", doc="host-to-device bandwidth of one transfer"
    )
    link_latency_us: float = spec(float, 0.0, 1e6, unit="us", doc="fixed cost of a transfer")
    pinned: bool = spec(
        bool, doc="the host copy of the experts is pinned (page-locked) memory; as measured"
    )
    expert_launch_us: float = spec(
        float, 0.0, 1e6, unit="us", doc="offload model: fixed cost of running one expert"
    )
    expert_tflops: float = spec(
        float,
        1e-6,
        1e5,
        unit="TFLOP/s",
        doc="offload model: rate of an expert's FLOPs beyond its fixed cost, and of the "
        "dense FLOPs of a layer",
    )
    tflops: float = spec(
        float, 1e-6, 1e5, unit="TFLOP/s", doc="serving model: compute rate of a batch"
    )
    memory_gbs: float = spec(
        float, 1e-3, 1e6, unit="GB/s", doc="serving model: device memory bandwidth"
    )
    step_launch_us: float = spec(
        float, 0.0, 1e8, unit="us", doc="serving model: fixed cost of one decode step"
    )
    link_issue_us: float = spec(
        float,
        0.0,
        1e6,
        unit="us",
        doc="host time to issue one transfer; under issue async it occupies the host clock "
        "(under sync the host waits anyway)",
        default=0.0,
    )
    expert_device_us: float | None = spec(
        float,
        0.0,
        1e6,
        unit="us",
        doc="under issue async: the device's own time for one expert run (its kernels back "
        "to back, weights read, no host in between); the device then takes the larger of it "
        "and the expert's FLOPs at expert_tflops (absent: the FLOPs alone)",
        default=None,
    )
    issue: str = spec(
        str,
        doc="offload model: how the runtime issues a layer's work. sync: the host waits for "
        "the layer's weights, then runs its experts (each expert's time on the critical "
        "path; a CPU, a blocking runtime); async: the host enqueues copies and kernels ahead "
        "(CUDA streams and events), so an expert's time (launch, table) is host time that "
        "overlaps the copies, and the device runs the layer (its FLOPs at expert_tflops) "
        "once its weights are in and the host has issued it",
        choices=("sync", "async"),
        default="sync",
    )
    expert_table_us: dict | None = spec(
        dict,
        doc="offload model, instead of expert_launch_us and expert_tflops for the experts: "
        f"tokens (1..2**20) -> us of one expert at that many tokens, 1..{TABLE_MAX} entries; "
        "linear between entries, flat below the first, the rate beyond the last; valid "
        "for the expert size it was measured at",
        default=None,
    )
    source: str | None = spec(str, doc="where the figures come from", default=None)

    def link(self):
        """The link of the offload model."""
        from fsedp.sw.policies.offload import Link

        return Link(self.name, self.link_gbs, self.link_latency_us)

    def table(self) -> tuple | None:
        """``expert_table_us`` as sorted ``(tokens, seconds)`` pairs, or None."""
        if self.expert_table_us is None:
            return None
        return tuple((int(k), float(v) * 1e-6) for k, v in sorted(self.expert_table_us.items()))

    def as_dict(self) -> dict:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }


def _check_table(file: str, v) -> dict:
    where = "expert_table_us"
    if len(v) > TABLE_MAX:
        raise InputError(file, where, f"must hold 1..{TABLE_MAX} entries, not {len(v)}")
    out = {}
    for k, us in v.items():
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 2**20:
            raise InputError(
                file, f"{where}.{str(k)[:40]}", f"tokens must be an integer in 1..2**20, not "
                f"{describe(k)}"
            )  # fmt: skip
        at = f"{where}.{k}"
        if isinstance(us, bool) or not isinstance(us, (int, float)):
            raise InputError(file, at, f"must be a number of us, not {describe(us)}")
        if not (math.isfinite(float(us)) and 0 <= us <= 1e8):
            raise InputError(file, at, f"must be in 0..1e+08 us, not {us}")
        out[k] = float(us)
    return out


def profile_from_dict(data, file: str) -> DeviceProfile:
    """A profile from a mapping, every field checked (``file`` names it in errors)."""
    values = build(DeviceProfile, data, file)
    if values.get("expert_table_us") is not None:
        values["expert_table_us"] = _check_table(file, values["expert_table_us"])
    return DeviceProfile(**values)


def load_device(name: str = DEFAULT_DEVICE, file: str = COMMAND_LINE, where: str = "--device"):
    """The profile ``name``: a shipped one (``configs/devices/NAME.yaml``) or, ending in
    ``.yaml``/``.yml`` or holding a ``/``, a file.  Unknown names and bad files are refused
    on one line."""
    from fsedp.config import config_path

    path = config_path("devices", name, file, where)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = 0
    return _load_stamped(str(path), stamp)


@functools.lru_cache(maxsize=32)
def _load_stamped(path: str, stamp: int) -> DeviceProfile:
    """A profile file, read again when it changed (``stamp``: its modification time)."""
    from fsedp.files import read_yaml

    return profile_from_dict(read_yaml(path), path)


def interpolate(table: tuple, n: float, rate: float, unit_flops: float) -> float:
    """Seconds of one expert at ``n`` tokens from a ``(tokens, seconds)`` table: linear
    between entries, flat below the first, the last plus the rate beyond it."""
    ks = [k for k, _ in table]
    ts = [t for _, t in table]
    if n <= ks[-1]:
        return float(np.interp(n, ks, ts))
    return ts[-1] + (n - ks[-1]) * unit_flops / rate


def profile_yaml(p: DeviceProfile, comment: str = "") -> str:
    """``p`` as the YAML text of a profile file (loads back equal)."""
    lines = [f"# {c}" for c in comment.splitlines()] if comment else []
    for k, v in p.as_dict().items():
        if k == "expert_table_us":
            lines.append(f"{k}:")
            lines += [f"  {t}: {us!r}" for t, us in sorted(v.items())]
        elif isinstance(v, bool):
            lines.append(f"{k}: {'true' if v else 'false'}")
        elif isinstance(v, str):
            lines.append(f"{k}: {_quote(v)}")
        else:
            lines.append(f"{k}: {float(v)!r}")
    return "\n".join(lines) + "\n"


def _quote(s: str) -> str:
    import json

    return json.dumps(s)
