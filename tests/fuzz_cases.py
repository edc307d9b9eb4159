"""Malformed inputs for the ``fsedp`` command line, generated deterministically.

:func:`cases` returns a list of :class:`Case`: an argument list for ``fsedp`` and the files
to write into a fresh folder first (``{dir}`` in an argument stands for that folder).  Every
case is invalid for certain -- a value of the wrong type, out of any physical range, a file
that is not what it claims to be -- so ``fsedp`` must refuse each of them with exit status 2
and one line ``fsedp: FILE: FIELD: REASON``; ``tests/test_fuzz.py`` runs them.

Categories (the first part of a case name):

* ``config``: run configs (YAML) for ``fsedp run``, ``fsedp rtl rounds|verilog|report``:
  the embedded default run with one field mutated, and broken files as a whole;
* ``trace``: routing traces (``.npz`` fsedp and FLAME, ``.npy``, ``.jsonl``) for
  ``fsedp trace stats|convert|synth``, ``fsedp shuffle``, ``fsedp offload --trace`` and a
  run config's ``scenario.trace``;
* ``experiment``: experiment files (``experiment: sweep|grid``) for ``fsedp run --config``;
* ``cli``: bad option values of every command;
* ``output``: output places that must not be used: the current folder and those above it,
  folders holding files fsedp did not write (also listed in a forged marker without a
  stamp), symbolic links (dangling, or onto a user's file: the file must survive), FIFOs
  and sockets named as outputs (the write rule: only regular files are replaced), a file in
  the way of a multi-file output, unwritable report paths (each refused before any work);
* ``read``: inputs that are not bounded regular files (the read rule): FIFOs (which must
  not block), devices such as ``/dev/zero`` (which never end), folders named as files, for
  configs, traces, results pages, experiment files and Liberty libraries; invalid
  experiment files under ``results --check``.

Cases are cheap: a command whose bad value were accepted would still only run a short job
(one layer, one strategy, a few tokens), so a missed check costs seconds, not minutes.
Randomness (garbage bytes, unknown key names, routing ids) comes from one seeded
:class:`random.Random`, so the list is the same on every run.
"""

import copy
import dataclasses
import io
import itertools
import json
import os
import pickle
import random
import zipfile
from dataclasses import dataclass, field

import numpy as np
import yaml

__all__ = ["Case", "cases"]

SEED = 20250611

#: Run-config fields for which 0 is a meaningful value (every other number must be positive).
ZERO_OK = {
    "hardware.d2d_latency_ns",
    "model.shared_experts",
    "scheduler.theta_min",
    "scheduler.t_qos_init",
    "scenario.seed",
    "scenario.skew",
    "scenario.prefill_fraction",
}

HUGE = str(10**400)  # a YAML/JSON integer no float or int64 holds
HUGE_CLI = str(10**30)  # an absurd count on the command line

_SLOT = "__FUZZ_SLOT__"
_DROP = object()  # a key to leave out of a JSON record


@dataclass(frozen=True)
class Case:
    """One malformed invocation of ``fsedp``.

    Parameters
    ----------
    name : str
        Unique and readable, ``category/what/variant``.
    argv : list of str
        Arguments of ``fsedp``; ``{dir}`` stands for the case's folder.
    files : dict
        Path relative to the case's folder -> bytes, written before the run (``d/keep``
        makes the folder ``d``).
    links : dict
        Path relative to the case's folder -> the target of a symbolic link made there
        (written as given: relative to the link's folder, or absolute).
    specials : dict
        Path relative to the case's folder -> ``"fifo"`` or ``"socket"``: a special file
        made there.
    """

    name: str
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    specials: dict[str, str] = field(default_factory=dict)

    @property
    def category(self) -> str:
        """``config``, ``trace``, ``experiment``, ``cli``, ``output`` or ``read``."""
        return self.name.split("/", 1)[0]


class _Cases:
    """The list being built; refuses a name given twice."""

    def __init__(self):
        self.items: list[Case] = []
        self.names: set[str] = set()

    def add(
        self,
        name: str,
        argv: list[str],
        files: dict[str, bytes] | None = None,
        links: dict[str, str] | None = None,
        specials: dict[str, str] | None = None,
    ):
        if name in self.names:
            raise ValueError(f"duplicate fuzz case name {name!r}")
        self.names.add(name)
        self.items.append(
            Case(name, list(argv), dict(files or {}), dict(links or {}), dict(specials or {}))
        )


def _billion_laughs(levels: int = 9, width: int = 9) -> str:
    """A flow sequence whose last element expands to ``width ** levels`` strings."""
    names = [f"l{i}" for i in range(levels)]
    parts = [f"&{names[0]} [{', '.join(['lol'] * width)}]"]
    for prev, cur in itertools.pairwise(names):
        parts.append(f"&{cur} [{', '.join([f'*{prev}'] * width)}]")
    return "[" + ", ".join(parts) + "]"


def _deep(depth: int, closed: bool = True) -> str:
    return "[" * depth + ("]" * depth if closed else "")


# -- run configs -----------------------------------------------------------------------------

CONFIG = "{dir}/c.yaml"
CONFIG_COMMANDS = {
    "run": ["run", "--config", CONFIG, "--layers", "1", "--strategies", "EP", "--out", "{dir}/out"],
    "rounds": ["rtl", "rounds", "--config", CONFIG],
    "verilog": ["rtl", "verilog", "--config", CONFIG, "--out", "{dir}/v"],
    "report": ["rtl", "report", "--config", CONFIG, "--no-latency", "--no-cells"],
}

_COMMON_BAD = {
    "list": "[1, 2]",
    "empty-list": "[]",
    "mapping": "{value: 1}",
    "true": "true",
    "false": "false",
    "null": "null",
    "timestamp": "2001-12-14",
    "binary": "!!binary aGVsbG8=",
}
_NUMBER_BAD = {
    "string": "'twelve'",
    "numeric-string": "'12'",
    "nan": ".nan",
    "inf": ".inf",
    "neg-inf": "-.inf",
    "huge-int": HUGE,
    "negative": "-1",
}
_INT_BAD = {
    "int-2p63": str(2**63),
    "int-2p64": str(2**64),
    "float-1e308": "1.0e+308",
    "tiny-float": "1.0e-300",
    "fraction": "2.5",
}
_FLOAT_BAD = {"float-1e308": "1.0e+308", "int-2p63": str(2**63), "negative-float": "-0.5"}
_STR_BAD = {
    "int": "42",
    "float": "1.5",
    "empty": "''",
    "blank": "'   '",
    "long-string": "'" + "x" * 100_000 + "'",
}
#: type-correct but physically absurd hardware
_ABSURD = {
    "hardware.clock_mhz": {"absurd-1e-9": "1.0e-9", "absurd-1e12": "1.0e+12"},
    "hardware.d2d_bandwidth_gbps": {"absurd-1e-9": "1.0e-9"},
    "hardware.ddr_bandwidth_gbps_per_channel": {"absurd-1e-9": "1.0e-9"},
    "hardware.macs_per_chiplet": {"absurd-2p62": str(2**62)},
    "hardware.onchip_buffer_kib": {"absurd-2p62": str(2**62)},
    "model.d_model": {"absurd-2p40": str(2**40)},
    "model.d_ffn": {"absurd-2p40": str(2**40)},
}
#: values outside a range that depends on another field of the default run
_CROSS = {
    "model.top_k": {"above-experts": "200"},
    "model.experts": {"above-256": "300", "below-top-k": "4"},
    "hardware.rows": {"two-chiplets": "1", "twenty-chiplets": "10"},
    "hardware.cols": {"twenty-five-chiplets": "25"},
    "scheduler.count_width": {"below-tokens": "2", "above-16": "17"},
    "scheduler.t_qos_init": {"above-qos-width": "16"},
    "scheduler.theta_min": {"above-count": "5000"},
    "scheduler.requests": {"above-64": "65"},
    "scenario.tokens_per_iteration": {"above-count": "5000"},
    "scenario.prefill_fraction": {"above-one": "1.5"},
    "hardware.onchip_buffer_kib": {"deadlock": "4"},
}
#: variants invalid only for commands that stream experts (the run, the datapath Verilog)
STREAMING_ONLY = {"deadlock"}


def _default_config() -> tuple[dict, set[str]]:
    """The embedded default run as a plain mapping, and its required dotted fields."""
    from fsedp.config import SYNTHETIC_ONLY, config_to_dict, default_run

    run = default_run()
    required = set()
    for section in ("hardware", "model", "scheduler", "scenario"):
        for f in dataclasses.fields(getattr(run, section)):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.add(f"{section}.{f.name}")
    # the synthetic generator's keys: required by the default's synthetic scenario
    required |= {f"scenario.{k}" for k in SYNTHETIC_ONLY}
    return config_to_dict(run), required


def _dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=10_000)


def _with(cfg: dict, dotted: str, raw: str) -> bytes:
    """``cfg`` as YAML with the field ``dotted`` (``section.name``) replaced by ``raw``."""
    doc = copy.deepcopy(cfg)
    section, _, name = dotted.partition(".")
    if name:
        doc[section][name] = _SLOT
    else:
        doc[section] = _SLOT
    return _dump(doc).replace(_SLOT, raw).encode()


def _without(cfg: dict, dotted: str) -> bytes:
    doc = copy.deepcopy(cfg)
    section, _, name = dotted.partition(".")
    if name:
        del doc[section][name]
    else:
        del doc[section]
    return _dump(doc).encode()


def _field_values(dotted: str, value) -> dict[str, str]:
    """Certainly invalid YAML values for one field of the default run."""
    bad = dict(_COMMON_BAD)
    if isinstance(value, bool):  # a flag: everything but true and false
        for k in ("true", "false"):
            bad.pop(k)
        bad.update({"int": "1", "string": "'yes'", "float": "1.5"})
        return bad
    if isinstance(value, str):
        bad.update(_STR_BAD)
        return bad
    bad.update(_NUMBER_BAD)
    bad.update(_INT_BAD if isinstance(value, int) else _FLOAT_BAD)
    if dotted not in ZERO_OK:
        bad["zero"] = "0"
        bad["tiny-float"] = "1.0e-300"
    elif isinstance(value, float):
        bad.pop("tiny-float", None)
    if dotted == "scenario.seed":  # any size of seed might be meaningful but 10**400
        for k in ("int-2p63", "int-2p64"):
            bad.pop(k)
    bad.update(_ABSURD.get(dotted, {}))
    bad.update(_CROSS.get(dotted, {}))
    return bad


def _config_cases(out: _Cases, rng: random.Random, bad_traces: dict[str, bytes]):
    cfg, required = _default_config()
    commands = list(CONFIG_COMMANDS)
    n = 0

    def add(what: str, variant: str, data: bytes | None, cmds=None, extra=None):
        """One file for ``fsedp run`` and, in turn, one other command (or ``cmds``)."""
        nonlocal n
        files = {"c.yaml": data} if data is not None else {}
        files.update(extra or {})
        if cmds is None:
            cmds = ["run", commands[1 + n % 3]]
        n += 1
        for cmd in cmds:
            out.add(f"config/{what}/{variant}/{cmd}", CONFIG_COMMANDS[cmd], files)

    # one field at a time
    for section, fields in cfg.items():
        for name, value in fields.items():
            dotted = f"{section}.{name}"
            for variant, raw in _field_values(dotted, value).items():
                cmds = ["run", "verilog"] if variant in STREAMING_ONLY else None
                add(dotted, variant, _with(cfg, dotted, raw), cmds=cmds)
            if dotted in required:
                add(dotted, "missing", _without(cfg, dotted))
            add(
                dotted,
                "duplicate",
                _with(
                    cfg,
                    dotted,
                    f"{value!r}\n  {name}: {value!r}"
                    if not isinstance(value, str)
                    else f"{value}\n  {name}: {value}",
                ),
            )
        unknown = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(12))
        add(f"{section}.{unknown}", "unknown-key", _with(cfg, f"{section}.{unknown}", "1"))
        add(
            f"{section}.{next(iter(fields)).upper()}",
            "near-miss-key",
            _with(cfg, f"{section}.{next(iter(fields)).upper()}", "1"),
        )
        add(section, "missing", _without(cfg, section))
        for variant, raw in {
            "int": "5",
            "float": "1.5",
            "list": "[]",
            "true": "true",
            "null": "null",
            "empty-mapping": "{}",
            "deep-5000": _deep(5000),
        }.items():
            add(section, variant, _with(cfg, section, raw))
    for section in ("hardware", "model", "scheduler"):
        for variant, raw in {
            "nosuch": "nosuch",
            "dotdot-passwd": "../../etc/passwd",
            "abs-passwd": "/etc/passwd",
            "dot": "'.'",
            "empty": "''",
            "trailing-space": "'chip2x2 '",
            "nosuch-yaml": "nosuch.yaml",
            "dev-null": "/dev/null",
            "dev-zero": "/dev/zero",
            "folder": "'./'",
        }.items():
            add(section, f"named-{variant}", _with(cfg, section, raw))
    add("scenario", "named-synthetic", _with(cfg, "scenario", "synthetic"))
    add("<top>", "unknown-key", _with(cfg, "experimentz", "1"))

    # hostile structure inside a field
    for dotted in ("hardware.name", "scenario.seed", "hardware.clock_mhz"):
        add(dotted, "billion-laughs", _with(cfg, dotted, _billion_laughs()), cmds=[commands[n % 4]])
        add(dotted, "deep-5000", _with(cfg, dotted, _deep(5000)))
        add(dotted, "deep-5000-unclosed", _with(cfg, dotted, _deep(5000, closed=False)))
        add(dotted, "deep-mapping-5000", _with(cfg, dotted, "{a: " * 5000 + "1" + "}" * 5000))
    for variant, raw in {
        "python-apply": "!!python/object/apply:os.system ['true']",
        "python-name": "!!python/name:os.system",
        "custom-tag": "!fuzz 1",
        "set": "!!set {a, b}",
        "omap": "!!omap [{a: 1}]",
    }.items():
        add("hardware.rows", f"tag-{variant}", _with(cfg, "hardware.rows", raw))
    trace_files = list(bad_traces.items())
    # a scenario that replays a trace takes none of the synthetic generator's keys
    from fsedp.config import SYNTHETIC_ONLY

    replay = copy.deepcopy(cfg)
    for key in SYNTHETIC_ONLY:
        del replay["scenario"][key]
    for variant, raw in {
        "missing-file": "nosuch.npz",
        "directory": "'.'",
        "etc-passwd": "/etc/passwd",
        "dev-null": "/dev/null",
        "nul-byte": '"t\\0.npz"',
        "unknown-ext": "c.yaml",
    }.items():
        add("scenario.trace", variant, _with(replay, "scenario.trace", raw), cmds=["run", "rounds"])
    for i, (fname, data) in enumerate(trace_files[::3]):
        add(
            "scenario.trace",
            f"bad-{fname}",
            _with(replay, "scenario.trace", fname),
            cmds=[("run", "rounds")[i % 2]],
            extra={fname: data},
        )

    # the file as a whole
    text = _dump(cfg).encode()
    big = "".join(f"unknown_{i:07d}: {i}\n" for i in range(270_000)).encode()
    big_scenario = "".join(f"  unknown_{i:07d}: {i}\n" for i in range(400_000)).encode()
    whole = {
        "empty": b"",
        "whitespace": b"  \n\n \n",
        "comments-only": b"# nothing\n",
        "null-document": b"~\n",
        "top-list": b"- hardware\n- model\n",
        "top-int": b"42\n",
        "top-string": b"hello\n",
        "multi-document": text + b"---\n" + text,
        "non-utf8-comment": b"# caf\xe9\xff\n" + text,
        "utf16": text.decode().encode("utf-16"),
        "binary-garbage": bytes(rng.getrandbits(8) for _ in range(4096)),
        "nul-bytes": b"\x00" * 256,
        "duplicate-section": text + b"hardware: chip2x2\n",
        "unhashable-key": text + b"? [a, b]\n: 1\n",
        "int-key": text + b"1: x\n",
        "null-key": text + b"~: x\n",
        "deep-5000": _deep(5000).encode(),
        "deep-5000-unclosed": _deep(5000, closed=False).encode(),
        "unclosed-flow": text + b"extra: [unclosed\n",
        "tab-indent": text + b"\tindented: 1\n",
        "truncated": text[: len(text) // 2] + b"  rows: [",
    }
    for variant, data in whole.items():
        add("<file>", variant, data, cmds=commands)
    add("<file>", "unknown-keys-5mb", text + big, cmds=["run"])
    add("<file>", "scenario-unknown-keys-8mb", text + big_scenario, cmds=["report"])
    add("<file>", "directory", None, cmds=commands, extra={"c.yaml/keep": b""})
    add("<file>", "missing", None, cmds=commands)


# -- traces ----------------------------------------------------------------------------------

TRACE_COMMANDS = {
    "stats": ["trace", "stats", "{dir}/{f}"],
    "convert": ["trace", "convert", "{dir}/{f}", "{dir}/o.npz"],
    "synth": ["trace", "synth", "--like", "{dir}/{f}", "--out", "{dir}/o.npz"],
    "shuffle": [
        "shuffle",
        "{dir}/{f}",
        "--cem-iters",
        "1",
        "--cem-samples",
        "2",
        "--methods",
        "kmeans",
    ],
    "offload": ["offload", "--trace", "{dir}/{f}"],
}


class _MakeDir:
    """Unpickling this creates the folder ``pwned``: a pickle must never be loaded."""

    def __reduce__(self):
        return os.mkdir, ("pwned",)


def _npy(a, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=allow_pickle)
    return buf.getvalue()


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _pickle_npy() -> bytes:
    """An object ``.npy`` whose pickle creates ``pwned`` when loaded."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "|O", "fortran_order": False, "shape": (1,)}
    )
    buf.write(pickle.dumps(_MakeDir(), protocol=2))
    return buf.getvalue()


def _zip(**members: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _routing(rng: random.Random, tokens: int = 8, layers: int = 2, k: int = 2, experts: int = 4):
    """Valid top-k ids ``[tokens, layers, k]`` (distinct per token and layer) and scores."""
    ids = [[rng.sample(range(experts), k) for _ in range(layers)] for _ in range(tokens)]
    e = np.asarray(ids, dtype=np.int16)
    s = np.asarray(
        [[[0.6, 0.4][:k] for _ in range(layers)] for _ in range(tokens)], dtype=np.float32
    )
    return e, s


def _jsonl(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _valid_jsonl(rng: random.Random) -> bytes:
    """A small valid ``.jsonl`` trace (8 tokens, 2 layers, top-2 of 4, with token ids)."""
    e, s = _routing(rng)
    return _jsonl(
        {
            "token": t,
            "layer": l,
            "experts": e[t, l].tolist(),
            "probs": s[t, l].tolist(),
            "request": 0,
            "position": t,
            "token_id": 10 + t,
        }
        for t in range(8)
        for l in range(2)
    )


def _bad_traces(rng: random.Random) -> dict[str, bytes]:
    """File name -> certainly invalid trace content (the extension picks the format)."""
    e, s = _routing(rng)
    tokens = np.arange(10, 18, dtype=np.int32)
    base = {
        "format": np.asarray("fsedp-trace"),
        "version": np.asarray(1),
        "num_experts": np.asarray(4),
        "experts": e,
        "scores": s,
        "token_ids": tokens,
        "request": np.zeros(8, np.int32),
        "position": np.arange(8, dtype=np.int32),
        "name": np.asarray("fuzz"),
    }

    def fsedp(**change):
        arrays = {**base, **change}
        return _npz(**{k: v for k, v in arrays.items() if v is not None})

    good = fsedp()
    obj = np.empty(2, dtype=object)
    obj[:] = [{"a": 1}, [1, 2]]
    out = {
        "npz-truncated-half.npz": good[: len(good) // 2],
        "npz-truncated-100.npz": good[:100],
        "npz-empty-file.npz": b"",
        "npz-garbage.npz": bytes(rng.getrandbits(8) for _ in range(2048)),
        "npz-zip-of-text.npz": _zip(**{"a.txt": b"hello"}),
        "npz-corrupt-member.npz": _zip(**{"experts.npy": b"\x93NUMPY garbage"}),
        "npz-pickled-experts.npz": fsedp(experts=obj),
        "npz-pickle-payload.npz": _zip(
            **{"format.npy": _npy(np.asarray("fsedp-trace")), "experts.npy": _pickle_npy()}
        ),
        "npz-format-wrong.npz": fsedp(format=np.asarray("nope")),
        "npz-format-int.npz": fsedp(format=np.asarray(7)),
        "npz-format-missing.npz": fsedp(format=None),
        "npz-version-2.npz": fsedp(version=np.asarray(2)),
        "npz-version-string.npz": fsedp(version=np.asarray("1")),
        "npz-version-vector.npz": fsedp(version=np.asarray([1, 1])),
        "npz-version-missing.npz": fsedp(version=None),
        "npz-num-experts-missing.npz": fsedp(num_experts=None),
        "npz-experts-missing.npz": fsedp(experts=None),
        "npz-request-missing.npz": fsedp(request=None),
    }
    for variant, ne in {
        "zero": 0,
        "negative": -1,
        "2p40": 2**40,
        "40000": 40000,
        "float": 4.0,
        "string": "4",
        "bool": True,
        "vector": [4, 4],
        "below-ids": 2,
        "nan": float("nan"),
    }.items():
        out[f"npz-num-experts-{variant}.npz"] = fsedp(num_experts=np.asarray(ne))
    experts_bad = {
        "float": e.astype(np.float64),
        "complex": e.astype(np.complex128),
        "bool": e.astype(bool),
        "string": e.astype(str),
        "0d": np.asarray(3),
        "1d": e.reshape(-1),
        "2d": e.reshape(8, 4),
        "4d": e.reshape(8, 2, 2, 1),
        "empty-tokens": np.zeros((0, 2, 2), np.int16),
        "no-layers": np.zeros((8, 0, 2), np.int16),
        "no-k": np.zeros((8, 2, 0), np.int16),
        "id-equals-num-experts": np.where(e == 0, 4, e).astype(np.int16),
        "id-32767": np.where(e == 0, 32767, e).astype(np.int16),
        "id-2p40": np.where(e == 0, 2**40, e.astype(np.int64)),
        "id-uint64-max": np.where(e == 0, np.iinfo(np.uint64).max, e.astype(np.uint64)),
        "negative": np.where(e == 0, -1, e).astype(np.int16),
        "int16-min": np.where(e == 0, -32768, e).astype(np.int16),
        "repeated-id": np.repeat(e[..., :1], 2, axis=-1),
        "k-above-experts": np.tile(np.arange(5, dtype=np.int16), (8, 2, 1)),
    }
    for variant, a in experts_bad.items():
        out[f"npz-experts-{variant}.npz"] = fsedp(experts=a)
    for variant, a in {
        "nan": np.where(s > 0.5, np.nan, s),
        "inf": np.where(s > 0.5, np.inf, s),
        "shape": np.zeros((8, 2, 3), np.float32),
        "string": s.astype(str),
        "complex": s.astype(np.complex64),
        "1d": s.reshape(-1),
    }.items():
        out[f"npz-scores-{variant}.npz"] = fsedp(scores=a)
    vectors = {
        "request-negative": {"request": -np.ones(8, np.int32)},
        "request-short": {"request": np.zeros(7, np.int32)},
        "request-float": {"request": np.zeros(8)},
        "request-2d": {"request": np.zeros((8, 1), np.int32)},
        "position-negative": {"position": -np.arange(1, 9, dtype=np.int32)},
        "position-long": {"position": np.arange(9, dtype=np.int32)},
        "position-string": {"position": np.arange(8).astype(str)},
        "token-ids-short": {"token_ids": tokens[:3]},
        "token-ids-2p40": {"token_ids": tokens.astype(np.int64) + 2**40},
        "token-ids-float": {"token_ids": tokens.astype(np.float64) + 0.5},
        "mismatched-shapes": {
            "request": np.zeros(5, np.int32),
            "position": np.arange(6, dtype=np.int32),
        },
        "all-empty": {
            "experts": np.zeros((0, 2, 2), np.int16),
            "scores": None,
            "token_ids": None,
            "request": np.zeros(0, np.int32),
            "position": np.zeros(0, np.int32),
        },
    }
    for variant, change in vectors.items():
        out[f"npz-{variant}.npz"] = fsedp(**change)

    flame = {
        "num_experts": np.asarray(4),
        "prefill_topk_experts": e,
        "prefill_topk_scores": s,
        "prefill_token_ids": tokens,
        "prefill_sequence_length": np.asarray(4),
        "top_k": np.asarray(2),
    }

    def flame_npz(**change):
        arrays = {**flame, **change}
        return _npz(**{k: v for k, v in arrays.items() if v is not None})

    for variant, change in {
        "scores-missing": {"prefill_topk_scores": None},
        "token-ids-missing": {"prefill_token_ids": None},
        "num-experts-missing": {"num_experts": None},
        "num-experts-zero": {"num_experts": np.asarray(0)},
        "seq-len-zero": {"prefill_sequence_length": np.asarray(0)},
        "seq-len-not-dividing": {"prefill_sequence_length": np.asarray(3)},
        "seq-len-negative": {"prefill_sequence_length": np.asarray(-4)},
        "seq-len-float": {"prefill_sequence_length": np.asarray(4.0)},
        "top-k-mismatch": {"top_k": np.asarray(3)},
        "token-ids-shape": {"prefill_token_ids": tokens[:7]},
        "scores-nan": {"prefill_topk_scores": np.full_like(s, np.nan)},
        "scores-shape": {"prefill_topk_scores": s[:, :1]},
        "experts-2d": {"prefill_topk_experts": e.reshape(8, 4)},
        "experts-out-of-range": {"prefill_topk_experts": e + 4},
        "experts-pickled": {"prefill_topk_experts": obj},
    }.items():
        out[f"flame-{variant}.npz"] = flame_npz(**change)

    npy_bad = {
        "truncated-half": _npy(e)[: len(_npy(e)) // 2],
        "header-only": _npy(e)[:128],
        "garbage": bytes(rng.getrandbits(8) for _ in range(1024)),
        "pickle-payload": _pickle_npy(),
        "object-array": _npy(obj, allow_pickle=True),
        "float": _npy(e.astype(np.float32)),
        "complex": _npy(e.astype(np.complex64)),
        "bool": _npy(e.astype(bool)),
        "string": _npy(e.astype("U3")),
        "0d": _npy(np.asarray(1)),
        "1d": _npy(e.reshape(-1)),
        "2d": _npy(e.reshape(8, 4)),
        "4d": _npy(e[None]),
        "negative": _npy(np.where(e == 0, -1, e)),
        "empty": _npy(np.zeros((0, 2, 2), np.int64)),
        "id-2p40": _npy(np.where(e == 0, 2**40, e.astype(np.int64))),
        "id-uint64-max": _npy(np.where(e == 0, np.iinfo(np.uint64).max, e.astype(np.uint64))),
        "repeated-id": _npy(np.repeat(e[..., :1], 2, axis=-1)),
        "is-npz": good,
        "is-text": b"1 2 3\n4 5 6\n",
    }
    for variant, data in npy_bad.items():
        out[f"npy-{variant}.npy"] = data

    rec = [
        {
            "token": t,
            "layer": l,
            "experts": e[t, l].tolist(),
            "probs": [0.6, 0.4],
            "request": 0,
            "position": t,
            "token_id": 10 + t,
        }
        for t in range(8)
        for l in range(2)
    ]
    good_jsonl = _jsonl(rec)

    def jsonl(i: int, **change):
        """The valid records with record ``i`` changed (a value ``_DROP`` drops the key)."""
        r = copy.deepcopy(rec)
        r[i].update(change)
        r[i] = {k: v for k, v in r[i].items() if v is not _DROP}
        return _jsonl(r)

    jsonl_raw = {
        "not-json": good_jsonl + b"{token: 0, layer: 0}\n",
        "truncated-line": good_jsonl[:-20],
        "trailing-comma": good_jsonl + b'{"token": 8, "layer": 0, "experts": [1, 2],}\n',
        "deep-10000": good_jsonl + _deep(10_000).encode() + b"\n",
        "deep-10000-unclosed": _deep(10_000, closed=False).encode() + b"\n",
        "deep-in-experts": good_jsonl
        + ('{"token": 8, "layer": 0, "experts": ' + _deep(10_000) + "}\n").encode(),
        "huge-int-line": HUGE.encode() + b"\n",
        "non-utf8": good_jsonl.replace(b'"token"', b'"tok\xe9\xffen"', 1),
        "utf16": good_jsonl.decode().encode("utf-16"),
        "binary-garbage": bytes(rng.getrandbits(8) for _ in range(2048)),
        "nul-bytes": b"\x00" * 64 + b"\n",
        "array-lines": b"[0, 0, [1, 2]]\n",
        "number-lines": b"1\n2\n",
        "null-line": b"null\n",
        "empty-file": b"",
        "whitespace-only": b"\n  \n\t\n",
        "empty-object": b"{}\n",
    }
    jsonl_changed = {
        "huge-expert-id": (3, {"experts": [int(HUGE), 1]}),
        "huge-token": (3, {"token": int(HUGE)}),
        "huge-layer": (3, {"layer": int(HUGE)}),
        "huge-token-id": (3, {"token_id": int(HUGE)}),
        "huge-request": (3, {"request": int(HUGE)}),
        "huge-position": (3, {"position": 2**40}),
        "huge-prob": (3, {"probs": [float("inf"), 0.4]}),
        "nan-prob": (3, {"probs": [float("nan"), 0.4]}),
        "wrong-key": (3, {"token": _DROP, "tok": 1}),
        "no-experts": (3, {"experts": _DROP}),
        "no-layer": (3, {"layer": _DROP}),
        "token-string": (3, {"token": "1"}),
        "token-float": (3, {"token": 1.5}),
        "token-bool": (3, {"token": True}),
        "layer-null": (3, {"layer": None}),
        "negative-token": (3, {"token": -1}),
        "experts-string": (3, {"experts": "1,2"}),
        "experts-empty": (3, {"experts": []}),
        "experts-float": (3, {"experts": [1.5, 2]}),
        "experts-bool": (3, {"experts": [True, False]}),
        "experts-nested": (3, {"experts": [[1], [2]]}),
        "experts-negative": (3, {"experts": [-1, 2]}),
        "experts-repeated": (3, {"experts": [1, 1]}),
        "experts-k-differs": (3, {"experts": [0, 1, 2]}),
        "probs-string": (3, {"probs": "x"}),
        "probs-short": (3, {"probs": [0.5]}),
        "probs-bool": (3, {"probs": [True, False]}),
        "request-negative": (3, {"request": -1}),
        "request-string": (3, {"request": "a"}),
        "position-negative": (3, {"position": -1}),
        "position-float": (3, {"position": 1.5}),
        "token-id-negative": (3, {"token_id": -5}),
        "duplicate-record": (3, {"token": 0, "layer": 0}),
        "token-gap": (15, {"token": 9}),
        "meta-differs": (3, {"request": 1}),
    }
    for variant, raw in jsonl_raw.items():
        out[f"jsonl-{variant}.jsonl"] = raw
    for variant, (i, change) in jsonl_changed.items():
        out[f"jsonl-{variant}.jsonl"] = jsonl(i, **change)
    out["json-not-json.json"] = b"{not json\n"
    out["no-extension"] = good
    out["unknown-extension.txt"] = good_jsonl
    out["csv-extension.csv"] = b"token,layer,expert\n0,0,1\n"
    return out


def _trace_cases(out: _Cases, rng: random.Random, traces: dict[str, bytes]):
    extra = ["synth", "shuffle", "offload"]
    for i, (fname, data) in enumerate(traces.items()):
        for cmd in ("stats", "convert", extra[i % 3]):
            argv = [a.replace("{f}", fname) for a in TRACE_COMMANDS[cmd]]
            out.add(f"trace/{fname}/{cmd}", argv, {fname: data})
    good = _valid_jsonl(rng)
    forced = {  # a file read with the wrong --format
        "jsonl-as-npy": ("t.jsonl", good, "npy"),
        "jsonl-as-fsedp": ("t.jsonl", good, "fsedp"),
        "jsonl-as-flame": ("t.jsonl", good, "flame"),
        "npz-as-jsonl": ("t.npz", traces["npy-is-npz.npy"], "jsonl"),
        "npy-as-jsonl": ("t.npy", traces["npy-float.npy"], "jsonl"),
        "text-as-npy": ("t.txt", b"hello\n", "npy"),
    }
    for variant, (fname, data, fmt) in forced.items():
        for cmd in ("stats", "convert"):
            argv = [a.replace("{f}", fname) for a in TRACE_COMMANDS[cmd]] + ["--format", fmt]
            out.add(f"trace/format-{variant}/{cmd}", argv, {fname: data})
    for variant, value in {"below-ids": "2", "one": "1"}.items():
        for cmd in ("stats", "convert"):
            argv = [a.replace("{f}", "t.jsonl") for a in TRACE_COMMANDS[cmd]]
            out.add(
                f"trace/num-experts-{variant}/{cmd}",
                argv + ["--num-experts", value],
                {"t.jsonl": good},
            )
    for variant, (fname, files) in {
        "missing": ("nosuch.npz", {}),
        "directory": ("d.npz", {"d.npz/keep": b""}),
        "dev-null": ("/dev/null", {}),
    }.items():
        for cmd, template in TRACE_COMMANDS.items():
            argv = [
                a.replace("{dir}/{f}", fname) if fname.startswith("/") else a.replace("{f}", fname)
                for a in template
            ]
            out.add(f"trace/{variant}/{cmd}", argv, files)


# -- experiment files ------------------------------------------------------------------------

SWEEP = {
    "experiment": "sweep",
    "figure": "9",
    "table": "latency",
    "hardware": "chip2x2",
    "models": ["qwen3-30b-a3b"],
    "tokens": [16],
    "iterations": 1,
    "layers": 1,
    "strategies": ["EP"],
    "seed": 1,
}
GRID = {
    "experiment": "grid",
    "figure": "16a",
    "hardware": "chip2x2",
    "model": "qwen3-30b-a3b",
    "tokens": 16,
    "layers": 1,
    "strategies": ["EP"],
    "seed": 1,
    "vary": {"onchip_buffer_kib": [4096]},
}
EXPERIMENT_ARGV = ["run", "--config", "{dir}/e.yaml", "--out", "{dir}/table.md"]


def _experiment_cases(out: _Cases):
    def add(kind, what, variant, doc, raw=None):
        text = _dump(doc)
        if raw is not None:
            text = text.replace(_SLOT, raw)
        out.add(f"experiment/{kind}.{what}/{variant}", EXPERIMENT_ARGV, {"e.yaml": text.encode()})

    def mutate(kind, base, key, variant, raw):
        doc = copy.deepcopy(base)
        if "." in key:
            outer, inner = key.split(".", 1)
            doc[outer] = {inner: _SLOT}
        else:
            doc[key] = _SLOT
        add(kind, key, variant, doc, raw)

    shared = {
        "experiment": {
            "nosuch": "nosuch",
            "int": "1",
            "null": "null",
            "list": "[sweep]",
            "empty": "''",
            "deep": _deep(5000),
        },
        "figure": {"null": "null", "list": "[9]", "mapping": "{a: 9}"},
        "hardware": {
            "nosuch": "nosuch",
            "dotdot-passwd": "../../etc/passwd",
            "int": "4",
            "list": "[chip2x2]",
            "alias-bomb": _billion_laughs(),
        },
        "strategies": {
            "empty": "[]",
            "unknown": "[XX]",
            "string": "EP",
            "lowercase": "[ep]",
            "nested": "[[EP]]",
            "null": "null",
        },
        "seed": {"negative": "-1", "string": "x", "fraction": "1.5", "huge": HUGE, "true": "true"},
        "layers": {
            "zero": "0",
            "negative": "-1",
            "huge": str(2**63),
            "float": "1.5",
            "string": "'1'",
            "null": "null",
        },
    }
    sweep_only = {
        "table": {"nosuch": "nosuch", "int": "1", "null": "null"},
        "models": {
            "nosuch": "[nosuch]",
            "dotdot": "['../models/qwen3-30b-a3b']",
            "empty": "[]",
            "string": "qwen3-30b-a3b",
            "int": "[1]",
            "nested": "[[qwen3-30b-a3b]]",
            "mapping": "{a: 1}",
        },
        "tokens": {
            "zero": "[0]",
            "negative": "[-1]",
            "too-many": "[5000]",
            "fraction": "[1.5]",
            "string": "['16']",
            "bool": "[true]",
            "empty": "[]",
            "huge": f"[{HUGE}]",
            "scalar": "16",
            "nan": "[.nan]",
        },
        "iterations": {"zero": "0", "negative": "-1", "huge": str(2**63), "string": "x"},
        "a5_slack": {
            "zero": "[0]",
            "negative": "[-0.1]",
            "over-one": "[2]",
            "string": "[x]",
            "scalar": "0.2",
            "nan": "[.nan]",
            "nested": "[[0.1]]",
        },
    }
    grid_only = {
        "model": {"nosuch": "nosuch", "list": "[qwen3-30b-a3b]", "null": "null"},
        "tokens": {"zero": "0", "negative": "-1", "huge": HUGE, "string": "'16'"},
        "vary": {
            "empty": "{}",
            "list": "[onchip_buffer_kib]",
            "null": "null",
            "three-fields": "{rows: [2], cols: [2], clock_mhz: [800]}",
            "unknown-field": "{nosuch: [1]}",
        },
        "vary.onchip_buffer_kib": {
            "empty": "[]",
            "scalar": "4096",
            "string": "[x]",
            "negative": "[-1]",
            "zero": "[0]",
            "huge": f"[{HUGE}]",
            "float-1e308": "[1.0e+308]",
            "nan": "[.nan]",
            "null": "[null]",
        },
        "vary.hardware": {"nosuch": "[nosuch]", "empty": "[]", "dotdot": "['../../etc/passwd']"},
        "fixed": {
            "unknown-field": "{nosuch: 1}",
            "list": "[onchip_buffer_kib]",
            "varied-too": "{onchip_buffer_kib: 4096}",
            "negative": "{clock_mhz: -1}",
            "string": "{clock_mhz: x}",
            "hardware": "{hardware: chip2x2}",
        },
        "vary.clock_mhz": {"zero": "[0]", "negative": "[-800]", "inf": "[.inf]"},
    }
    for kind, base, table in (
        ("sweep", SWEEP, {**shared, **sweep_only}),
        ("grid", GRID, {**shared, **grid_only}),
    ):
        for key, variants in table.items():
            for variant, raw in variants.items():
                mutate(kind, base, key, variant, raw)
        for key in base:
            doc = copy.deepcopy(base)
            del doc[key]
            # (a sweep without ``layers`` simulates all the model's: not an error)
            if key != "experiment" and not (kind == "sweep" and key == "layers"):
                add(kind, key, "missing", doc)
        add(kind, "nosuch", "unknown-key", {**base, "nosuch": 1})
        add(kind, "hardware", "inline-mapping", {**base, "hardware": {"rows": 2}})
        add(kind, "<top>", "with-run-sections", {**base, "scenario": {"seed": 1}})
    add("sweep", "experiment", "top-list", [SWEEP])


# -- command-line values ---------------------------------------------------------------------

_DASH = ["-x", "--json"]  # a value that begins with a dash
#: an output path may legally begin with one dash (``--out -x`` is the folder ``-x``)
OUT_DASH = ["--json"]
POS_INT = ["0", "-1", HUGE_CLI, "x", "", "nan", "1.5", *_DASH]
CAP_INT = ["0", "-1", "x", "", "nan", "1.5", *_DASH]  # "at most N": huge may be fine
NONNEG_INT = ["-1", HUGE_CLI, "x", "", "nan", "1.5", *_DASH]
SEED_BAD = ["-1", "x", "", "1.5", *_DASH]
PROB = ["-0.1", "1.5", "nan", "inf", "x", "", *_DASH]
POS_FLOAT = ["0", "-1", "nan", "inf", "-inf", "x", "", *_DASH]
NONNEG_FLOAT = ["-1", "nan", "inf", "x", "", *_DASH]
CHOICE = ["bogus", "", *_DASH]
INT_LIST = ["", "x", "16,x", "0", "-16", "16,,32", "1e3", "nan", HUGE_CLI, *_DASH]

#: command -> (cheap base arguments, files, {option: bad values})
#: ``--device``: unknown names, missing or non-YAML files, profiles with a bad field (the
#: ``dev-*.yaml`` files every CLI case gets), an empty value
DEVICE_BAD = [
    "nosuch",
    "{dir}/nosuch.yaml",
    "{dir}/f",
    "{dir}/dev-neg.yaml",
    "{dir}/dev-type.yaml",
    "{dir}/dev-key.yaml",
    "{dir}/dev-list.yaml",
    "",
]

CLI = {
    "run": (
        ["run", "--layers", "1", "--strategies", "EP", "--out", "{dir}/out"],
        {},
        {
            "--iterations": POS_INT,
            "--layers": POS_INT,
            "--workers": POS_INT,
            "--strategies": ["", ",", "XX", "ep", "EP,,XX", "EP;Hydra", *_DASH],
            "--scheduler": CHOICE,
            "--config": ["", "{dir}", "{dir}/nosuch.yaml", *_DASH],
            "--out": ["{dir}/f", "/proc/x/out", *OUT_DASH],
        },
    ),
    "sweep": (
        [
            "sweep",
            "figure9",
            "--layers",
            "1",
            "--tokens",
            "16",
            "--models",
            "qwen3-30b-a3b",
            "--out",
            "{dir}/s.md",
        ],
        {},
        {
            "--tokens": ["0", "-1", HUGE_CLI, "x", "", "16,", "nan", "1e3", *_DASH],
            "--layers": POS_INT,
            "--models": ["nosuch", "", ",", "../../etc/passwd", "qwen3-30b-a3b,nosuch", *_DASH],
            "--out": ["{dir}/d", "/proc/x/s.md", *OUT_DASH],
            "--workers": POS_INT,
            "--engine": ["spark", "", "RAY", *_DASH],
            "--address": ["auto", "", *_DASH],
            "--cache": ["/proc/x/c", "/dev/null/x", "", *OUT_DASH],
        },
    ),
    "bench": (["bench"], {}, {"--layers": POS_INT}),
    "rtl-rounds": (
        ["rtl", "rounds"],
        {},
        {
            "--show-rounds": ["-1", "x", "", "1.5", *_DASH],
            "--sim": CHOICE,
            "--config": ["", "{dir}", "{dir}/nosuch.yaml", *_DASH],
        },
    ),
    "rtl-verilog": (
        ["rtl", "verilog", "--out", "{dir}/v", "--block", "eit"],
        {},
        {
            "--experts": ["0", "-1", "7", "257", HUGE_CLI, "x", "", *_DASH],
            "--chiplets": ["0", "-1", "3", "65", HUGE_CLI, "x", "", *_DASH],
            "--block": CHOICE,
            "--out": ["{dir}/f", "/proc/x/v", "", *OUT_DASH],
            "--config": ["", "{dir}", *_DASH],
        },
    ),
    "rtl-cosim": (
        ["rtl", "cosim", "--rounds", "1"],
        {},
        {
            "--experts": ["0", "7", "257", HUGE_CLI, "x", *_DASH],
            "--chiplets": ["0", "3", "65", HUGE_CLI, "x", *_DASH],
            "--rounds": POS_INT,
            "--seed": SEED_BAD,
            "--stall": ["2", "-1", *PROB],
            "--reset-every": ["-1", "x", "", "1.5", *_DASH],
            "--tokens": POS_INT,
            "--top-k": ["0", "-1", "200", HUGE_CLI, "x", "", *_DASH],
            "--build-opt": ["-O3", "", "bogus"],
            "--sim": CHOICE,
        },
    ),
    "rtl-report": (
        ["rtl", "report", "--no-latency", "--no-cells"],
        {},
        {
            "--experts": [*INT_LIST, "7", "300"],
            "--chiplets": [*INT_LIST, "3", "65"],
            "--sim": CHOICE,
            "--out": ["{dir}/d", "/proc/x/r.md", "", *OUT_DASH],
            "--liberty": ["{dir}/missing.lib", "{dir}", "", "/proc/x/y.lib"],
            "--clock-mhz": ["0", "-5", "1e9", "nan", "x", ""],
        },
    ),
    "rtl-report-latency": (
        ["rtl", "report", "--no-cells", "--experts", "16", "--chiplets", "4"],
        {},
        {"--rounds": POS_INT},
    ),
    "rtl-datapath": (
        ["rtl", "datapath", "--no-ring", "--no-cells", "--mesh", "2x2:1"],
        {},
        {
            "--mesh": [
                "",
                "x",
                "2",
                "2x",
                "x2",
                "2x2x2",
                "0x0",
                "0x4",
                "-2x2",
                "2x-2",
                "2x2:0",
                "2x2:-1",
                "2x2:x",
                "2x2:1.5",
                "1x1",
                "5x5",
                "4x5",
                "1000000x1000000",
                f"{HUGE_CLI}x2",
                f"2x2:{HUGE_CLI}",
                "nanxnan",
                *_DASH,
            ],
            "--seed": SEED_BAD,
            "--stall": ["2", "-1", *PROB],
            "--reset-every": ["-1", "x", *_DASH],
            "--slots": POS_INT,
            "--micro-slices": POS_INT,
            "--link-cycles": POS_INT,
            "--ddr-interval": POS_INT,
            "--ddr-latency": NONNEG_INT,
            "--preload": NONNEG_INT,
            "--hot-window": NONNEG_INT,
            "--cycles-per-token": POS_INT,
            "--build-opt": ["-O3", "bogus"],
            "--sim": CHOICE,
        },
    ),
    "rtl-datapath-layers": (
        ["rtl", "datapath", "--no-ring", "--no-cells", "--mesh", "2x2"],
        {},
        {"--layers": POS_INT},
    ),
    "rtl-datapath-out": (
        ["rtl", "datapath", "--no-ring", "--no-cells"],
        {},
        {"--out": ["{dir}/d", "/proc/x/d.md", *OUT_DASH]},
    ),
    "trace-convert": (
        ["trace", "convert", "{dir}/t.jsonl", "{dir}/o.npz"],
        {},
        {"--format": CHOICE, "--num-experts": ["0", "-1", "2", HUGE_CLI, "x", "", *_DASH]},
    ),
    "trace-stats": (
        ["trace", "stats", "{dir}/t.jsonl"],
        {},
        {
            "--fit": ["0", "1", "-1", "nan", "inf", "x", "", *_DASH],
            "--format": CHOICE,
            "--num-experts": ["0", "2", HUGE_CLI, "x", *_DASH],
            "--out": ["{dir}/f", "/proc/x/st", "", *OUT_DASH],
        },
    ),
    "trace-synth": (
        ["trace", "synth", "--like", "{dir}/t.jsonl", "--out", "{dir}/o.npz"],
        {},
        {
            "--tokens": POS_INT,
            "--seed": SEED_BAD,
            "--format": CHOICE,
            "--like": ["", "{dir}/nosuch.npz", "{dir}", *_DASH],
            "--out": ["{dir}/o.txt", "{dir}/d.npz", "/proc/x/o.npz", "", *_DASH],
        },
    ),
    "trace-record": (
        ["trace", "record", "--model", "{dir}/m", "--text", "{dir}/t.txt", "--out", "{dir}/o.npz"],
        {"m/keep": b"", "t.txt": b"hello world\n"},
        {
            "--max-tokens": ["0", "x"],
            "--seq-len": ["0", "x"],
            "--out": ["{dir}/o.txt"],
            "--model": ["{dir}/nosuch"],
            "--text": ["{dir}/nosuch.txt"],
        },
    ),
    "lm-train": (
        ["lm", "train", "--out", "{dir}/lm"],
        {},
        {
            "--steps": POS_INT,
            "--batch": POS_INT,
            "--lr": ["-1", "2", "nan", "x", *_DASH],
            "--aux": ["-1", "11", "nan", "x"],
            "--seed": SEED_BAD,
            "--layers": POS_INT,
            "--experts": POS_INT,
            "--top-k": ["0", "-1", "32", "x"],
            "--d-model": POS_INT,
            "--d-ffn": POS_INT,
            "--shared-experts": ["-1", "x", HUGE_CLI],
            "--vocab": POS_INT,
            "--data": ["{dir}/nosuch", "", "{dir}/f"],
            "--out": ["{dir}/f", "/proc/x/lm"],
        },
    ),
    "lm-eval": (
        ["lm", "eval"],
        {},
        {
            "--weights": ["{dir}/nosuch.npz", "{dir}/f", "{dir}"],
            "--tokenizer": ["{dir}/nosuch.json", "{dir}/f"],
            "--max-tokens": CAP_INT,
            "--data": ["{dir}/nosuch", "{dir}/f"],
        },
    ),
    "lm-trace": (
        ["lm", "trace", "--out", "{dir}/o.npz"],
        {},
        {
            "--max-tokens": CAP_INT,
            "--out": ["{dir}/o.txt", "", "/proc/x/o.npz"],
            "--weights": ["{dir}/f", "{dir}/nosuch.npz"],
            "--tokenizer": ["{dir}/f"],
        },
    ),
    "offload": (
        ["offload", "--max-tokens", "128"],
        {},
        {
            "--policy": CHOICE,
            "--cache-rate": PROB,
            "--prefetch": CHOICE,
            "--prefetch-count": CAP_INT,
            "--batch": POS_INT,
            "--max-tokens": CAP_INT,
            "--seed": SEED_BAD,
            "--link": CHOICE,
            "--bandwidth": POS_FLOAT,
            "--latency-us": NONNEG_FLOAT,
            "--scale-to": ["nosuch", "../../etc/passwd", "", "-x"],
            "--tflops": POS_FLOAT,
            "--overhead-us": NONNEG_FLOAT,
            "--device": DEVICE_BAD,
            "--alpha": ["0", *PROB],
            "--k-max": CAP_INT,
            "--eps": NONNEG_FLOAT,
            "--warmup": ["-1", "x"],
            "--warmup-weight": PROB,
            "--tau": ["nan", "-1", "2", "x"],
            "--tau-pct": ["-1", "101", "nan", "x"],
            "--temperature": POS_FLOAT,
            "--gamma": ["nan", "-1", "2"],
            "--beta": ["nan", "2"],
            "--budget-mb": ["-1", "nan", "x"],
            "--eta": ["-1", "nan", "inf"],
            "--kappa": ["-1", "2", "nan"],
            "--diversity": ["-1", "2", "nan"],
            "--search": CAP_INT,
            "--rho": ["-1", "x", "nan"],
            "--sub-experts": ["0", "3", "-1"],
            "--active": ["0", "-1", "100"],
            "--model": ["{dir}/nosuch.npz", "{dir}/f"],
            "--data": ["{dir}/nosuch", "{dir}/f"],
            "--trace": ["", "{dir}/nosuch.npz", "{dir}"],
        },
    ),
    "offload-trace": (
        ["offload", "--trace", "model"],
        {},
        {
            "--cache-rates": ["x", "2", "", ",", "0.5,nan", "-0.5", *_DASH],
            "--prefetches": ["bogus", "", ",", "none,bogus"],
        },
    ),
    "offload-grid": (
        ["offload", "--grid", "--max-tokens", "128"],
        {},
        {"--out": ["{dir}/f", "/proc/x/g"]},
    ),
    "prism-refactor": (
        ["prism", "refactor", "--out", "{dir}/r.npz", "--iters", "0", "--profile-tokens", "128"],
        {},
        {
            "--out": ["{dir}/r.txt", "{dir}/d.npz", "/proc/x/r.npz", "", *_DASH],
            "--sub-experts": ["0", "3", "-1", HUGE_CLI, "x"],
            "--objective-k": ["0", "4", "9", "x"],
            "--gates": ["0", "-1", HUGE_CLI, "x"],
            "--top-p": ["0", "2", "nan", "-1", "x"],
            "--t0": ["-1", "nan", "inf", "x"],
            "--cooling": ["0", "2", "nan", "x"],
            "--iters": ["-1", HUGE_CLI, "x"],
            "--profile-tokens": ["0", "-1", "x"],
            "--seed": SEED_BAD,
            "--model": ["{dir}/nosuch.npz", "{dir}/f"],
            "--data": ["{dir}/nosuch", "{dir}/f"],
        },
    ),
    "prism-finetune": (
        ["prism", "finetune", "--refactored", "{dir}/nosuch.npz", "--out", "{dir}/t.npz"],
        {},
        {
            "--refactored": ["{dir}/f", "{dir}", ""],
            "--out": ["{dir}/r.txt", "/proc/x/r.npz", "", *_DASH],
            "--steps": ["0", "-1", HUGE_CLI, "x"],
            "--batch": ["0", "-1", "x"],
            "--lr": ["0", "2", "nan", "-1", "x"],
            "--schedule": ["down", "", *_DASH],
            "--distill": ["-1", "nan", "inf", "x"],
            "--seed": SEED_BAD,
            "--data": ["{dir}/nosuch", "{dir}/f"],
        },
    ),
    "prism-curve": (
        ["prism", "curve", "--iters", "0", "--max-tokens", "128", "--profile-tokens", "128"],
        {},
        {
            "--sub-experts": ["0", "3", HUGE_CLI, "x"],
            "--iters": ["-1", HUGE_CLI, "x"],
            "--max-tokens": CAP_INT,
            "--profile-tokens": ["0", "x"],
            "--stable": ["x", "", "nan", "-1", "0", "1.5,x", "inf", *_DASH],
            "--out": ["{dir}/f", "/proc/x/c"],
            "--data": ["{dir}/nosuch"],
        },
    ),
    "prism-curve-refactored": (
        # --sub-experts and --iters are for refactoring: refused beside --refactored
        ["prism", "curve", "--max-tokens", "128", "--profile-tokens", "128"],
        {},
        {"--refactored": ["{dir}/nosuch.npz", "{dir}/f", "{dir}"]},
    ),
    "serve": (
        ["serve", "--policy", "fifo", "--load", "low", "--duration", "20"],
        {},
        {
            "--policy": CHOICE,
            "--load": CHOICE,
            "--duration": ["0", "-1", "nan", "inf", HUGE_CLI, "x", "", *_DASH],
            "--max-batch": POS_INT,
            "--timeout": ["-1", "nan", "x"],
            "--slo": ["-1", "nan", "x"],
            "--scale-to": ["nosuch", "../../etc/passwd", ""],
            "--tflops": POS_FLOAT,
            "--bandwidth": POS_FLOAT,
            "--device": DEVICE_BAD,
            "--seed": SEED_BAD,
            "--curve": ["{dir}/nosuch.json", "{dir}/f", "{dir}/bad.json", "{dir}"],
            "--gate": [*CHOICE, "finetuned"],
            "--out": ["{dir}/f", "/proc/x/s", *OUT_DASH],
        },
    ),
    "shuffle": (
        [
            "shuffle",
            "{dir}/t.jsonl",
            "--cem-iters",
            "1",
            "--cem-samples",
            "2",
            "--methods",
            "kmeans",
        ],
        {},
        {
            "--format": CHOICE,
            "--devices": POS_INT,
            "--fit": ["0", "1", "nan", "-1", "x"],
            "--slack": ["-1", "nan", "inf", "11", "x"],
            "--cem-iters": POS_INT,
            "--cem-samples": POS_INT,
            "--elite": ["0", "2", "nan", "x"],
            "--methods": ["", ",", "bogus", "cem,bogus", *_DASH],
            "--seed": SEED_BAD,
            "--out": ["{dir}/f", "/proc/x/sh", *OUT_DASH],
        },
    ),
}

GLOBAL = {
    "no-arguments": [],
    "unknown-command": ["bogus"],
    "rtl-alone": ["rtl"],
    "trace-alone": ["trace"],
    "lm-alone": ["lm"],
    "prism-alone": ["prism"],
    "unknown-option": ["--bogus"],
    "run-extra-positional": ["run", "extra"],
    "rtl-unknown": ["rtl", "bogus"],
    "trace-unknown": ["trace", "bogus"],
    "lm-unknown": ["lm", "bogus"],
    "prism-unknown": ["prism", "bogus"],
    "run-unknown-option": ["run", "--bogus", "1"],
    "sweep-unknown": ["sweep", "figure10"],
    "shuffle-two-traces": ["shuffle", "a", "b"],
    "empty-command": [""],
    "dash-command": ["-x"],
    "nul-in-argument": ["run", "--config", "c\x00.yaml"],
}


def _replace_option(base: list[str], option: str, value: str) -> list[str]:
    """``base`` with ``option value`` set (an existing ``option`` and its value dropped)."""
    argv = list(base)
    if option in argv:
        i = argv.index(option)
        del argv[i : i + 2]
    return argv + [option, value]


def _cli_cases(out: _Cases, rng: random.Random):
    jsonl = _valid_jsonl(rng)
    common = {
        "f": b"not a folder\n",
        "d/keep": b"",
        "d.npz/keep": b"",
        "bad.json": b"{not json",
        "t.jsonl": jsonl,
        # device profiles (configs/devices/): a field out of range, a wrong type, an unknown
        # key, not a mapping
        "dev-neg.yaml": b"link_gbs: -3\n",
        "dev-type.yaml": b"expert_tflops: fast\n",
        "dev-key.yaml": b"link_gbps: 25\n",
        "dev-list.yaml": b"- 1\n- 2\n",
    }
    for command, (base, files, options) in CLI.items():
        files = {**common, **files}
        for option, values in options.items():
            for value in values:
                variant = value.replace("{dir}", "DIR").replace("/", "|") or "empty"
                if value == HUGE_CLI:
                    variant = "huge"
                elif HUGE_CLI in value:
                    variant = value.replace(HUGE_CLI, "HUGE")
                out.add(
                    f"cli/{command}/{option}/{variant}", _replace_option(base, option, value), files
                )
        out.add(f"cli/{command}/--bogus/unknown-option", base + ["--bogus", "1"], files)
    for variant, argv in GLOBAL.items():
        out.add(f"cli/global/{variant}", argv)
    # a few seeded random combinations of two bad values of one command
    for i in range(40):
        command = rng.choice(sorted(CLI))
        base, files, options = CLI[command]
        argv = list(base)
        picked = rng.sample(sorted(options), min(2, len(options)))
        for option in picked:
            argv = _replace_option(argv, option, rng.choice(options[option]))
        out.add(f"cli/{command}/random-pair-{i:02d}", argv, {**common, **files})


#: Commands whose ``--out`` is a report folder: (argv before ``--out``, files they read).
REPORT_FOLDERS = {
    "run": ["run", "--layers", "1", "--strategies", "EP"],
    "stats": ["trace", "stats", "{dir}/t.jsonl"],
    "verilog": ["rtl", "verilog"],
    "formal": ["rtl", "formal"],
    "serve": ["serve", "--policy", "fifo", "--load", "low"],
    "shuffle": ["shuffle", "{dir}/t.jsonl", "--seeds", "1"],
    "codesign": ["codesign", "--tokens", "16"],
    "offload-grid": ["offload", "--grid"],
    "prism-curve": ["prism", "curve"],
    "lm-train": ["lm", "train", "--data", "{dir}", "--steps", "1"],
}
#: Commands whose output is one file: (argv with ``OUT`` where the file goes).
OUTPUT_FILES = {
    "convert": ["trace", "convert", "{dir}/t.jsonl", "OUT"],
    "synth": ["trace", "synth", "--like", "{dir}/t.jsonl", "--out", "OUT"],
    "sweep": ["sweep", "figure9", "--layers", "1", "--out", "OUT"],
    "rtl-report": ["rtl", "report", "--no-latency", "--no-cells", "--out", "OUT"],
    "rtl-datapath": ["rtl", "datapath", "--out", "OUT"],
    "cosim-report": [
        *("rtl", "cosim", "--driver", "native", "--experts", "16", "--rounds", "1"),
        *("--report", "OUT"),
    ],
    "prism-finetune": [
        *("prism", "finetune", "--refactored", "{dir}/r.npz", "--data", "{dir}"),
        *("--out", "OUT"),
    ],
    "prism-refactor": ["prism", "refactor", "--out", "OUT"],
    "lm-trace": ["lm", "trace", "--data", "{dir}", "--out", "OUT"],
}


def _output_cases(out: _Cases, rng: random.Random):
    files = {"t.jsonl": _valid_jsonl(rng), "d/keep": b"a user's file\n"}
    for name, argv in REPORT_FOLDERS.items():
        places = {
            "current-folder": (".", {}),
            "current-folder-absolute": ("{dir}", {}),
            "parent-folder": ("..", {}),
            "foreign-folder": ("{dir}/d", {}),
            "dangling-link": ("{dir}/ln", {"ln": "nowhere"}),
            "link-to-folder": ("{dir}/ln", {"ln": "d"}),
        }
        for variant, (place, links) in places.items():
            out.add(f"output/{name}/{variant}", [*argv, "--out", place], files, links)
        for kind in ("fifo", "socket"):
            out.add(f"output/{name}/{kind}", [*argv, "--out", "{dir}/s"], files, None, {"s": kind})
        forged = json.dumps(
            {"tool": "fsedp", "version": 2, "files": ["keep", ".fsedp-output.json"], "stamps": {}}
        ).encode()
        out.add(
            f"output/{name}/forged-marker",
            [*argv, "--out", "{dir}/d"],
            {**files, "d/.fsedp-output.json": forged},
        )
    out.add(
        "output/verilog/file-in-the-way",
        ["rtl", "verilog", "--out", "{dir}/v"],
        {**files, "v/fsedp_matcher.v/keep": b""},
    )
    for name, argv in OUTPUT_FILES.items():
        npz = ("convert", "synth", "prism-finetune", "prism-refactor", "lm-trace")
        ext = ".npz" if name in npz else ".md"
        ext = ".json" if name == "cosim-report" else ext
        target = {f"mine{ext}": b"a user's file\n"}
        for variant, (place, links) in {
            "link-onto-file": (f"{{dir}}/o{ext}", {f"o{ext}": f"mine{ext}"}),
            "dangling-link": (f"{{dir}}/o{ext}", {f"o{ext}": "nowhere"}),
            "folder": ("{dir}/d", {}),
            "unwritable": (f"/proc/fsedp-x{ext}", {}),
        }.items():
            argv2 = [place if a == "OUT" else a for a in argv]
            out.add(f"output/{name}/{variant}", argv2, {**files, **target}, links)
        for kind in ("fifo", "socket"):
            argv2 = [f"{{dir}}/s{ext}" if a == "OUT" else a for a in argv]
            out.add(f"output/{name}/{kind}", argv2, {**files, **target}, None, {f"s{ext}": kind})
    out.add(
        "output/trace-events/fifo",
        ["run", "--layers", "1", "--strategies", "EP", "--trace-events", "{dir}/f.json"],
        files,
        None,
        {"f.json": "fifo"},
    )


#: Commands that read one input file: (argv with ``IN`` where the file goes).
INPUT_FILES = {
    "run-config": ["run", "--config", "IN"],
    "rtl-rounds-config": ["rtl", "rounds", "--config", "IN"],
    "trace-stats": ["trace", "stats", "IN"],
    "trace-stats-jsonl": ["trace", "stats", "IN", "--format", "jsonl"],
    "trace-stats-npy": ["trace", "stats", "IN", "--format", "npy"],
    "results-check": ["results", "IN", "--check"],
    "results": ["results", "IN"],
    "synth-liberty": ["rtl", "synth", "--liberty", "IN"],
}


def _read_cases(out: _Cases):
    for name, argv in INPUT_FILES.items():
        for variant, (place, specials, files) in {
            "fifo": ("{dir}/p.in", {"p.in": "fifo"}, {}),
            "socket": ("{dir}/p.in", {"p.in": "socket"}, {}),
            "dev-zero": ("/dev/zero", {}, {}),
            "folder": ("{dir}/d", {}, {"d/keep": b"x"}),
        }.items():
            argv2 = [place if a == "IN" else a for a in argv]
            out.add(f"read/{name}/{variant}", argv2, files, None, specials)
    # a special file or folder as a named section file or device profile
    for variant, (files, specials) in {
        "fifo": ({}, {"dev.yaml": "fifo"}),
        "folder": ({"dev.yaml/keep": b"x"}, {}),
    }.items():
        out.add(
            f"read/offload-device/{variant}",
            ["offload", "--device", "{dir}/dev.yaml"],
            files,
            None,
            specials,
        )
        out.add(
            f"read/config-section/{variant}",
            ["run", "--config", "{dir}/c.yaml"],
            {**files, "c.yaml": b"hardware: dev.yaml\n"},
            None,
            specials,
        )
    # the profiling options, refused before anything is measured
    for variant, argv in {
        "empty-name": ["--profile-device", "{dir}/p.yaml", "--profile-name", ""],
        "blank-name": ["--profile-device", "{dir}/p.yaml", "--profile-name", "   "],
        "long-name": ["--profile-device", "{dir}/p.yaml", "--profile-name", "n" * 5000],
        "name-alone": ["--profile-name", "mine"],
        "empty-file": ["--profile-device", ""],
        "not-yaml": ["--profile-device", "{dir}/p.txt"],
        "fifo": ["--profile-device", "{dir}/p.yaml"],
    }.items():
        specials = {"p.yaml": "fifo"} if variant == "fifo" else {}
        out.add(f"cli/offload-profile/{variant}", ["offload", *argv], {}, None, specials)
    page = b"<!-- fsedp results: e -->\n| a |\n<!-- end fsedp results -->\n"
    for variant, (files, specials) in {
        "experiment-fifo": ({"p.md": page}, {"x/e.yaml": "fifo"}),
        "experiment-folder": ({"p.md": page, "x/e.yaml/keep": b"x"}, {}),
        "experiment-invalid": ({"p.md": page, "x/e.yaml": b"experiment: sweep\nvary: 3\n"}, {}),
        "experiment-not-yaml": ({"p.md": page, "x/e.yaml": b"\x00\xff: ["}, {}),
    }.items():
        argv = ["results", "{dir}/p.md", "--check", "--experiments", "{dir}/x"]
        out.add(f"read/results-check/{variant}", argv, files, None, specials)


def cases() -> list[Case]:
    """Every fuzz case, in a fixed order (config, trace, experiment, cli, output, read)."""
    rng = random.Random(SEED)
    out = _Cases()
    traces = _bad_traces(rng)
    _config_cases(out, rng, traces)
    _trace_cases(out, rng, traces)
    _experiment_cases(out)
    _cli_cases(out, rng)
    _output_cases(out, rng)
    _read_cases(out)
    return out.items
