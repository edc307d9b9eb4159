"""Run configurations: one validated YAML schema for hardware, model, scheduler and scenario.

A *run config* is a YAML mapping with exactly four top-level keys::

    hardware: chip2x2              # a name in configs/hardware/, or an inline mapping
    model: qwen3-30b-a3b           # a name in configs/models/, or an inline mapping
    scheduler: default             # a name in configs/scheduler/, or an inline mapping
    scenario:                      # always an inline mapping
      tokens_per_iteration: 64
      ...

Named configs are looked up in :data:`CONFIG_DIR` (the repository's ``configs/`` folder,
``Path(__file__).resolve().parents[1] / "configs"``); a named file holds the fields of its
section at its top level.  Every problem -- unreadable file, YAML syntax error, unknown or
missing key, wrong type, out-of-range value, inconsistent sections -- raises
:class:`ConfigError`, whose ``str()`` is one line ``"{file}: {field}: {reason}"``.  ``field``
is a dotted path inside ``file`` (``scheduler.count_width``, ``model.top_k``; in a named
section file just ``top_k``), or one of the pseudo fields

* ``<file>`` -- the file cannot be read,
* ``<yaml>`` -- YAML syntax error or duplicate key (the reason gives line and column),
* ``<top>``  -- the document is empty or its top level is not a mapping.

Type rules: an ``int`` field takes a YAML integer only (``true``/``false`` are not integers);
a ``float`` field takes an integer or a float (stored as ``float``, must be finite); a
``str`` field takes a non-empty string.

:meth:`RunConfig.scheduler_params` turns a run config into the
:class:`~fsedp.sw.params.SchedulerParams` shared by the golden model and the RTL;
:func:`load_run` calls it once so that a config that loads is a config the scheduler accepts.
"""

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fsedp.errors import InputError
from fsedp.sw.params import DatapathParams, ParamError, SchedulerParams, max_hops

#: Routing of the project's MoE LM on held-out WikiText-2 test text (``scenario.trace:
#: model``): shipped with the package, so runs need no data folder.
EMBEDDED_TRACE = Path(__file__).resolve().parent / "lm" / "assets" / "routing-wikitext2-test.npz"

__all__ = [
    "CONFIG_DIR",
    "ConfigError",
    "HardwareConfig",
    "ModelConfig",
    "SchedulerConfig",
    "ScenarioConfig",
    "RunConfig",
    "load_run",
    "load_hardware",
    "load_model",
    "load_scheduler",
    "run_from_dict",
    "default_run",
    "config_to_dict",
    "named_configs",
]

#: Bytes per expert weight assumed when micro-slice sizes are derived (the paper does not
#: give the precision of its test chip; 8-bit weights).
WEIGHT_BYTES = 1
#: DDR access latency assumed for the datapath's DDR controller (not given in the paper).
DDR_LATENCY_NS = 100.0

#: The repository's ``configs/`` folder, where named hardware/model/scheduler configs live.
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


class ConfigError(InputError):
    """A configuration problem, reported on one line ``"{file}: {field}: {reason}"``;
    ``field`` is a dotted path inside ``file``, or ``<file>``, ``<yaml>``, ``<top>`` (see the
    module docstring)."""


# -- dataclasses ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HardwareConfig:
    """A multi-chiplet package: a ``rows x cols`` mesh of identical compute chiplets.

    Parameters
    ----------
    name : str
        Identifier (conventionally the file stem under ``configs/hardware/``).
    rows, cols : int
        Mesh shape; ``chiplets = rows * cols`` (the scheduler accepts 4..16).
    clock_mhz : float
        Chiplet and NoP clock.
    macs_per_chiplet : int
        MAC units of one compute die.
    onchip_buffer_kib : int
        On-chip SRAM of one chiplet available to weights and tokens, in KiB.
    d2d_bandwidth_gbps : float
        Bandwidth of one die-to-die link, GB/s.
    d2d_latency_ns : float
        Die-to-die (FDI-to-FDI) latency of one hop, ns (may be 0).
    ddr_channels : int
        Off-package DDR channels of the whole package.
    ddr_bandwidth_gbps_per_channel : float
        Bandwidth of one DDR channel, GB/s.
    microslices_per_expert : int
        Micro-slices an expert is partitioned into (Section IV-A).
    """

    name: str
    rows: int
    cols: int
    clock_mhz: float
    macs_per_chiplet: int
    onchip_buffer_kib: int
    d2d_bandwidth_gbps: float
    d2d_latency_ns: float
    ddr_channels: int
    ddr_bandwidth_gbps_per_channel: float
    microslices_per_expert: int

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
    """Shape of a Mixture-of-Experts transformer.

    Parameters
    ----------
    name : str
        Identifier (conventionally the file stem under ``configs/models/``).
    d_model : int
        Hidden size.
    d_ffn : int
        Intermediate size of one routed expert.
    experts : int
        Routed experts per MoE layer ``E``.
    top_k : int
        Routed experts activated per token (``<= experts``).
    shared_experts : int
        Always-active shared experts (not scheduled by the trajectory scheduler).
    layers : int
        Decoder layers (some models keep the first layer(s) dense; see the YAML comments).
    heads : int
        Attention (query) heads.
    params_b : float
        Total parameters, billions.
    """

    name: str
    d_model: int
    d_ffn: int
    experts: int
    top_k: int
    shared_experts: int
    layers: int
    heads: int
    params_b: float


@dataclass(frozen=True)
class SchedulerConfig:
    """Generics of the hardware scheduler that are not implied by hardware or model.

    Parameters
    ----------
    count_width : int
        EIT token-count width (see :class:`~fsedp.sw.params.SchedulerParams`).
    requests : int
        Request-table depth ``R``.
    theta_min : int
        Cold threshold of Algorithm 2.
    n_threshold : int
        ``N_threshold`` of Algorithm 2, in rounds.
    qos_width : int
        Width of the per-request QoS timer.
    t_qos_init : int
        Initial value of a request's QoS timer (``0 .. 2**qos_width - 1``).
    """

    count_width: int
    requests: int
    theta_min: int
    n_threshold: int
    qos_width: int
    t_qos_init: int


@dataclass(frozen=True)
class ScenarioConfig:
    """The workload of a run.

    Parameters
    ----------
    tokens_per_iteration : int
        Input tokens aggregated over the concurrent requests in one forward iteration.
    rounds : int
        Scheduling rounds to run (one per iteration window and MoE layer).
    seed : int
        Seed of every random choice (``>= 0``).
    trace : str
        ``"synthetic"`` for :func:`fsedp.trace.synthetic`, ``"model"`` for the routing of
        the project's MoE LM on held-out WikiText-2 (:data:`EMBEDDED_TRACE`, 16 experts,
        top-2, 4 layers), otherwise the path of a routing trace in any format
        :func:`fsedp.trace_io.load_any` reads; a relative path is relative to the run
        config's folder (:meth:`RunConfig.trace_path`).
    skew : float
        Zipf-like exponent of the synthetic expert popularity (``>= 0``; 0 is uniform).
    prefill_fraction : float
        Fraction of the tokens of an iteration that are prefill tokens (``0..1``).
    """

    tokens_per_iteration: int
    rounds: int
    seed: int
    trace: str
    skew: float
    prefill_fraction: float


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
        """The scheduler generics of this run.

        Returns
        -------
        SchedulerParams
            ``chiplets = hardware.rows * hardware.cols``, ``experts = model.experts``, the
            rest from :attr:`scheduler`.

        Raises
        ------
        ConfigError
            When :class:`SchedulerParams` rejects a value; the error names :attr:`source`
            and the run-config field (``hardware`` for the chiplet count, which is
            ``rows * cols``).
        """
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
        except ParamError as e:
            where = self._PARAM_FIELDS.get(e.field, e.field)
            reason = e.reason
            if e.field == "chiplets":
                reason = (f"rows x cols = {self.hardware.rows} x {self.hardware.cols} "
                          f"= {self.hardware.chiplets}, but the scheduler's chiplets {reason}")
            raise ConfigError(self.source, where, reason) from None

    def microslice_bytes(self) -> int:
        """Bytes of one micro-slice: the expert's three projections (``3 x d_model x d_ffn``
        weights of :data:`WEIGHT_BYTES`) over ``hardware.microslices_per_expert``."""
        m, h = self.model, self.hardware
        return math.ceil(3 * m.d_model * m.d_ffn * WEIGHT_BYTES / h.microslices_per_expert)

    def datapath_params(self, **overrides) -> DatapathParams:
        """Generics of the chiplet datapath RTL for this run, in clock cycles.

        ``slots`` = micro-slices that fit in ``onchip_buffer_kib`` (at most 64);
        ``link_cycles`` = micro-slice bytes over the link's bytes per cycle plus the D2D
        latency; ``ddr_interval`` = micro-slice bytes over the package's DDR bytes per cycle;
        ``ddr_latency`` = :data:`DDR_LATENCY_NS`; ``cycles_per_token`` = MACs of one token on
        one micro-slice over ``macs_per_chiplet``.

        Raises
        ------
        ConfigError
            Naming ``hardware.onchip_buffer_kib`` when the buffer holds fewer micro-slices
            than deadlock freedom needs on this mesh (``max_hops + 1``).
        """
        h, m = self.hardware, self.model
        sp = self.scheduler_params()
        ms = self.microslice_bytes()
        per_cycle = 1e6 * h.clock_mhz
        gen = {
            "slots": min(64, (h.onchip_buffer_kib * 1024) // ms),
            "micro_slices": h.microslices_per_expert,
            "link_cycles": math.ceil(ms / (h.d2d_bandwidth_gbps * 1e9 / per_cycle))
            + math.ceil(h.d2d_latency_ns * h.clock_mhz / 1000),
            "ddr_interval": math.ceil(ms / (h.ddr_bandwidth_gbps * 1e9 / per_cycle)),
            "ddr_latency": math.ceil(DDR_LATENCY_NS * h.clock_mhz / 1000),
            "cycles_per_token": math.ceil(3 * m.d_model * m.d_ffn / h.microslices_per_expert
                                          / h.macs_per_chiplet),
        }
        gen.update(overrides)
        need = max_hops(h.rows, h.cols) + 1
        if gen["slots"] < need:
            raise ConfigError(self.source, "hardware.onchip_buffer_kib",
                              f"{h.onchip_buffer_kib} KiB holds {gen['slots']} micro-slices "
                              f"of {ms / 1024:.0f} KiB, but a {h.rows}x{h.cols} mesh needs at "
                              f"least {need} for deadlock-free streaming (raise the buffer or "
                              f"hardware.microslices_per_expert)")
        try:
            return DatapathParams.for_scheduler(sp, h.rows, h.cols, **gen)
        except ParamError as e:
            raise ConfigError(self.source, f"<datapath>.{e.field}", e.reason) from None

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
        p = Path(t).expanduser()
        if not p.is_absolute() and not self.source.startswith("<"):
            p = Path(self.source).parent / p
        return p


# -- schema --------------------------------------------------------------------------------

# kind, lower bound, lower bound inclusive
_POS_INT = ("int", 1, True)
_NONNEG_INT = ("int", 0, True)
_POS_FLOAT = ("float", 0.0, False)
_NONNEG_FLOAT = ("float", 0.0, True)
_STR = ("str", None, None)

_SCHEMA = {
    HardwareConfig: {
        "name": _STR, "rows": _POS_INT, "cols": _POS_INT, "clock_mhz": _POS_FLOAT,
        "macs_per_chiplet": _POS_INT, "onchip_buffer_kib": _POS_INT,
        "d2d_bandwidth_gbps": _POS_FLOAT, "d2d_latency_ns": _NONNEG_FLOAT,
        "ddr_channels": _POS_INT, "ddr_bandwidth_gbps_per_channel": _POS_FLOAT,
        "microslices_per_expert": _POS_INT,
    },
    ModelConfig: {
        "name": _STR, "d_model": _POS_INT, "d_ffn": _POS_INT, "experts": _POS_INT,
        "top_k": _POS_INT, "shared_experts": _NONNEG_INT, "layers": _POS_INT,
        "heads": _POS_INT, "params_b": _POS_FLOAT,
    },
    SchedulerConfig: {
        "count_width": _POS_INT, "requests": _POS_INT, "theta_min": _NONNEG_INT,
        "n_threshold": _POS_INT, "qos_width": _POS_INT, "t_qos_init": _NONNEG_INT,
    },
    ScenarioConfig: {
        "tokens_per_iteration": _POS_INT, "rounds": _POS_INT, "seed": _NONNEG_INT,
        "trace": _STR, "skew": _NONNEG_FLOAT, "prefill_fraction": _NONNEG_FLOAT,
    },
}

_SECTIONS = {
    "hardware": (HardwareConfig, "hardware"),
    "model": (ModelConfig, "models"),
    "scheduler": (SchedulerConfig, "scheduler"),
    "scenario": (ScenarioConfig, None),
}


def _describe(v: Any) -> str:
    return f"{type(v).__name__} {v!r}"


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _check_value(file: str, path: str, spec, v: Any):
    kind, lo, inclusive = spec
    if kind == "str":
        if not isinstance(v, str):
            raise ConfigError(file, path, f"must be a string, not {_describe(v)}")
        if not v.strip():
            raise ConfigError(file, path, "must be a non-empty string")
        return v
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(file, path, f"must be an integer, not {_describe(v)}")
        if v < lo:
            what = "positive" if lo == 1 else f">= {lo}"
            raise ConfigError(file, path, f"must be {what}, not {v}")
        return v
    # float
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(file, path, f"must be a number, not {_describe(v)}")
    v = float(v)
    if not math.isfinite(v):
        raise ConfigError(file, path, f"must be finite, not {v}")
    if v < lo or (v == lo and not inclusive):
        what = f">= {lo:g}" if inclusive else "positive"
        raise ConfigError(file, path, f"must be {what}, not {v:g}")
    return v


def _build(cls, data: Any, file: str, prefix: str):
    """Validate the mapping ``data`` against the schema of ``cls`` and build it."""
    if not isinstance(data, dict):
        where = prefix or "<top>"
        raise ConfigError(file, where, f"must be a mapping of fields, not {_describe(data)}")
    schema = _SCHEMA[cls]
    for key in data:
        if key not in schema:
            raise ConfigError(file, _join(prefix, str(key)),
                              f"unknown key; allowed keys: {', '.join(schema)}")
    missing = [k for k in schema if k not in data]
    if missing:
        raise ConfigError(file, _join(prefix, missing[0]),
                          f"missing key (required keys: {', '.join(schema)})")
    values = {k: _check_value(file, _join(prefix, k), spec, data[k]) for k, spec in schema.items()}
    _cross_check(cls, values, file, prefix)
    return cls(**values)


def _cross_check(cls, v: dict, file: str, prefix: str):
    """Constraints between fields of one section."""
    if cls is ModelConfig and v["top_k"] > v["experts"]:
        raise ConfigError(file, _join(prefix, "top_k"),
                          f"top_k = {v['top_k']} exceeds experts = {v['experts']}")
    if cls is ScenarioConfig and v["prefill_fraction"] > 1.0:
        raise ConfigError(file, _join(prefix, "prefill_fraction"),
                          f"must be in 0..1, not {v['prefill_fraction']:g}")
    if cls is SchedulerConfig:
        qmax = 2 ** min(v["qos_width"], 64) - 1
        if v["t_qos_init"] > qmax:
            raise ConfigError(file, _join(prefix, "t_qos_init"),
                              f"must be in 0..2**qos_width - 1 = {qmax}, not {v['t_qos_init']}")
        # Range checks that do not depend on hardware or model: let SchedulerParams judge
        # with the smallest chiplet and expert counts it accepts.
        try:
            SchedulerParams(chiplets=4, experts=8, count_width=v["count_width"],
                            requests=v["requests"], theta_min=v["theta_min"],
                            n_threshold=v["n_threshold"], qos_width=v["qos_width"])
        except ParamError as e:
            raise ConfigError(file, _join(prefix, e.field), e.reason) from None


# -- YAML ----------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys in a mapping."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
        except TypeError:
            dup = False
        if dup:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"duplicate key {key!r}", key_node.start_mark)
        try:
            seen.add(key)
        except TypeError:
            pass
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _parse_yaml(text: str, file: str) -> dict:
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        if mark is not None:
            reason = f"YAML error at line {mark.line + 1}, column {mark.column + 1}: {problem}"
        else:
            reason = f"YAML error: {problem}"
        raise ConfigError(file, "<yaml>", reason) from None
    if data is None:
        raise ConfigError(file, "<top>", "the document is empty; expected a mapping")
    if not isinstance(data, dict):
        raise ConfigError(file, "<top>", f"the top level must be a mapping, not {_describe(data)}")
    return data


def _read_yaml(path) -> dict:
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(file, "<file>", f"cannot read: {reason}") from None
    return _parse_yaml(text, file)


def named_configs(kind: str) -> list[str]:
    """Names of the configs in ``CONFIG_DIR/<kind>/`` (``hardware``, ``models``, ``scheduler``).

    Returns an empty list when the folder does not exist.
    """
    folder = CONFIG_DIR / kind
    try:
        return sorted(p.stem for p in folder.glob("*.yaml") if p.is_file())
    except OSError:
        return []


def _resolve_named(kind: str, name: str, file: str, where: str) -> Path:
    known = named_configs(kind)
    ok = name and "/" not in name and "\\" not in name and not name.startswith(".")
    path = CONFIG_DIR / kind / f"{name}.yaml"
    if not ok or name not in known:
        listing = ", ".join(known) if known else f"none: {CONFIG_DIR / kind} is empty or absent"
        raise ConfigError(file, where, f"unknown {where} config {name!r}; known: {listing}")
    return path


def _load_section(cls, path) -> Any:
    file = str(path)
    return _build(cls, _read_yaml(path), file, "")


def load_hardware(path) -> HardwareConfig:
    """Load a hardware config file (fields at the top level).

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    HardwareConfig

    Raises
    ------
    ConfigError
    """
    return _load_section(HardwareConfig, path)


def load_model(path) -> ModelConfig:
    """Load a model config file (fields at the top level).

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    ModelConfig

    Raises
    ------
    ConfigError
    """
    return _load_section(ModelConfig, path)


def load_scheduler(path) -> SchedulerConfig:
    """Load a scheduler config file (fields at the top level).

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    SchedulerConfig

    Raises
    ------
    ConfigError
    """
    return _load_section(SchedulerConfig, path)


def run_from_dict(data: Any, source: str = "<memory>") -> RunConfig:
    """Build and validate a run config from an already parsed mapping.

    ``hardware``, ``model`` and ``scheduler`` may be mappings or names of configs under
    :data:`CONFIG_DIR`; ``scenario`` must be a mapping.  Cross-section checks: the EIT
    count must hold a whole iteration (``2**count_width - 1 >= tokens_per_iteration``) and
    :meth:`RunConfig.scheduler_params` must accept the result.

    Parameters
    ----------
    data : dict
        The four sections.
    source : str
        File name used in error messages.

    Returns
    -------
    RunConfig

    Raises
    ------
    ConfigError
    """
    if not isinstance(data, dict):
        raise ConfigError(source, "<top>", f"the top level must be a mapping, not {_describe(data)}")
    for key in data:
        if key not in _SECTIONS:
            raise ConfigError(source, str(key), f"unknown key; allowed keys: {', '.join(_SECTIONS)}")
    for key in _SECTIONS:
        if key not in data:
            raise ConfigError(source, key, f"missing key (required keys: {', '.join(_SECTIONS)})")
    built = {}
    for key, (cls, folder) in _SECTIONS.items():
        v = data[key]
        if isinstance(v, str) and folder is not None:
            built[key] = _load_section(cls, _resolve_named(folder, v, source, key))
        elif isinstance(v, dict):
            built[key] = _build(cls, v, source, key)
        else:
            what = f"a mapping of fields or the name of a config in configs/{folder}/" if folder else "a mapping of fields"
            raise ConfigError(source, key, f"must be {what}, not {_describe(v)}")
    run = RunConfig(source=source, **built)
    cw, tokens = run.scheduler.count_width, run.scenario.tokens_per_iteration
    if cw <= 16 and 2**cw - 1 < tokens:
        raise ConfigError(source, "scheduler.count_width",
                          f"too small: 2**{cw} - 1 = {2**cw - 1} < scenario.tokens_per_iteration "
                          f"= {tokens}, an expert's token count could saturate")
    run.scheduler_params()
    return run


def load_run(path) -> RunConfig:
    """Load and validate a run config file.

    Parameters
    ----------
    path : str or os.PathLike
        A YAML file with the top-level keys ``hardware``, ``model``, ``scheduler``,
        ``scenario`` (see the module docstring).

    Returns
    -------
    RunConfig
        With ``source = str(path)``.

    Raises
    ------
    ConfigError
    """
    file = str(path)
    return run_from_dict(_read_yaml(path), file)


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
  count_width: 10
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
"""


def default_run() -> RunConfig:
    """The embedded default run (no file access).

    The 2x2 test chip of Table I (800 MHz, 2048 MACs per chiplet, 288 GB/s / 4.02 ns UCIe,
    4 x 25.6 GB/s DDR) running Qwen3-30B-A3B (128 experts, top-8); scheduler
    ``count_width=10, requests=8, theta_min=2, n_threshold=4, qos_width=4, t_qos_init=0``;
    64 tokens per iteration, 4 rounds, seed 1, synthetic trace with skew 1.1, half prefill.

    Returns
    -------
    RunConfig
        With ``source = "<default>"``; equal to ``load_run("configs/run-2x2-qwen3.yaml")``.
    """
    return run_from_dict(_parse_yaml(_DEFAULT_RUN_YAML, "<default>"), "<default>")


def config_to_dict(cfg) -> dict:
    """Plain ``dict`` of a config, for JSON or YAML output.

    Parameters
    ----------
    cfg : RunConfig, HardwareConfig, ModelConfig, SchedulerConfig or ScenarioConfig

    Returns
    -------
    dict
        Field name -> value (nested for a :class:`RunConfig`; its ``source`` is left out).
        Feeding the result of a :class:`RunConfig` to :func:`run_from_dict` gives an equal
        config back.
    """
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"not a config dataclass: {cfg!r}")
    out = {}
    for f in dataclasses.fields(cfg):
        if f.name == "source":
            continue
        v = getattr(cfg, f.name)
        out[f.name] = config_to_dict(v) if dataclasses.is_dataclass(v) else v
    return out
