"""NumPy forward pass of the project's MoE LM, with routing hooks (no torch needed).

Weights are a ``.npz`` of float16 or float32 arrays (computed in float32):

=================  =========================  ==========================================
name               shape                      role
=================  =========================  ==========================================
``embed``          ``[vocab, d]``             token embedding, tied with the output
``pos``            ``[context, d]``           learned positions
``norm_f``         ``[d]``                    final RMSNorm gain
``l{i}.norm1/2``   ``[d]``                    RMSNorm gains before attention / MoE
``l{i}.wq/wk/wv``  ``[d, d]``                 attention projections (``x @ W``)
``l{i}.wo``        ``[d, d]``                 attention output
``l{i}.router``    ``[d, E]``                 router (gate) logits
``l{i}.w1/w3``     ``[E, d, F]``              SwiGLU gate / up projections of each expert
``l{i}.w2``        ``[E, F, d]``              SwiGLU down projection
``l{i}.s_w1/3/2``  ``[S, d, F]`` ...          shared experts (if any)
``config``         JSON string                :class:`~fsedp.lm.config.LMConfig`
=================  =========================  ==========================================

Routing (every layer): ``p = softmax(h @ router)`` over all experts, the ``top_k`` largest
are selected and their probabilities renormalised to sum to one; the MoE output is the
weighted sum of the selected experts' SwiGLU outputs ``(silu(h W1) * (h W3)) W2`` plus the
shared experts'.  A :class:`Hooks` object can change the selected experts and weights
(BuddyMoE substitution, dropping) and mask expert neurons (MoE-Prism sub-experts), and the
forward pass can record the routing.
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fsedp import jsondoc
from fsedp.errors import InputError
from fsedp.lm.config import LMConfig

__all__ = [
    "MoELM",
    "Hooks",
    "Routing",
    "EPS",
    "MAX_PARAMETERS",
    "weight_shapes",
    "parameter_count",
]

EPS = 1e-5
#: Most values a model file may hold, weights and ``prism.*`` arrays together (2**26: 18
#: times the shipped model); :meth:`MoELM.load` checks it on the config and on the arrays'
#: headers before any array is read.
MAX_PARAMETERS = 1 << 26
#: Longest ``config`` JSON of a model file, in characters.
MAX_CONFIG_CHARS = 1 << 16
#: Longest ``prism.finetune`` record (JSON text) of a model file, in characters.
MAX_NOTE_CHARS = 1 << 22


def _weights(c: LMConfig):
    """``(name, shape)`` of the weight arrays of a model of config ``c``, in order."""
    d, f = c.d_model, c.d_ffn
    yield from (("embed", (c.vocab, d)), ("pos", (c.context, d)), ("norm_f", (d,)))
    for i in range(c.layers):
        yield from (
            (f"l{i}.norm1", (d,)),
            (f"l{i}.norm2", (d,)),
            (f"l{i}.router", (d, c.experts)),
            (f"l{i}.w1", (c.experts, d, f)),
            (f"l{i}.w3", (c.experts, d, f)),
            (f"l{i}.w2", (c.experts, f, d)),
        )
        for n in ("wq", "wk", "wv", "wo"):
            yield f"l{i}.{n}", (d, d)
        if c.shared_experts:
            s = c.shared_experts
            yield from (
                (f"l{i}.s_w1", (s, d, f)),
                (f"l{i}.s_w3", (s, d, f)),
                (f"l{i}.s_w2", (s, f, d)),
            )


def weight_shapes(c: LMConfig) -> dict[str, tuple]:
    """The weight arrays a model of config ``c`` holds, and their shapes (the table above)."""
    return dict(_weights(c))


def parameter_count(c: LMConfig) -> int:
    """Values of all the weight arrays of config ``c`` (computed, not enumerated)."""
    d, f, e, s = c.d_model, c.d_ffn, c.experts, c.shared_experts
    layer = 2 * d + d * e + 3 * e * d * f + 4 * d * d + 3 * s * d * f
    return (c.vocab + c.context) * d + d + c.layers * layer


class Hooks:
    """Override to intervene in the MoE layers; the defaults change nothing.

    ``route`` sees, for the ``N`` tokens of a batch at MoE layer ``layer``, the router
    probabilities ``probs [N, E]``, the selected experts ``ids [N, k]`` and their weights
    ``weights [N, k]`` (renormalised), and the vocabulary ids ``tokens [N]``; it returns the
    experts and weights to use (a weight of 0 drops that expert for that token).
    ``neurons`` returns, for expert ``expert`` of ``layer`` applied to ``rows`` (indices into
    the ``N`` tokens) with intermediate activations ``act [len(rows), F]`` (the SwiGLU
    product before the down projection), a 0/1 mask or a scale over its ``d_ffn`` neurons
    (shape ``[F]`` or ``[len(rows), F]``; MoE-Prism's linear gate weights each sub-expert)
    or ``None`` for all neurons.  ``moe_input`` sees the
    layer's MoE input rows ``h [N, d]`` before routing.  ``after_layer`` is called when the
    layer's MoE output is complete.
    """

    def route(self, layer: int, probs, ids, weights, tokens):
        return ids, weights

    def neurons(self, layer: int, expert: int, rows, act):
        return None

    def moe_input(self, layer: int, h):
        pass

    def after_layer(self, layer: int):
        pass


@dataclass
class Routing:
    """Routing recorded by :meth:`MoELM.forward`: per layer ``ids [N, k]`` and
    ``weights [N, k]`` as used, and the router's ``probs [N, E]``."""

    ids: list = field(default_factory=list)
    weights: list = field(default_factory=list)
    probs: list = field(default_factory=list)


def _rms(x, g):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * g


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


class MoELM:
    """The model; ``weights`` maps the names above to arrays."""

    def __init__(self, cfg: LMConfig, weights: dict, name: str = "<weights>"):
        self.cfg = cfg
        self.name = name
        self.w = {}
        #: arrays of refactorings (``prism.*``: MoE-Prism gate neurons), kept as stored
        self.extra = {}
        for k, v in weights.items():
            if k.startswith("prism."):
                self.extra[k] = np.asarray(v)
            elif k != "config":
                self.w[k] = np.asarray(v, dtype=np.float32)
        self._check()

    def _check(self):
        for k, shape in weight_shapes(self.cfg).items():
            if k not in self.w:
                raise InputError(self.name, k, "missing array")
            if self.w[k].shape != shape:
                raise InputError(self.name, k, f"shape {self.w[k].shape}, expected {shape}")
            if not np.isfinite(self.w[k]).all():
                raise InputError(self.name, k, "holds a non-finite value")

    # -- files --------------------------------------------------------------------------
    @classmethod
    def load(cls, path=None) -> "MoELM":
        """A model file (the shipped model by default), read through
        :class:`~fsedp.trace.core.NpzReader`: no array is decompressed before the ``config``
        is read and checked, the parameters it declares are at most :data:`MAX_PARAMETERS`,
        and every array's header (dtype, shape against the config) is checked; an array
        the model does not use is refused unread."""
        from fsedp.lm.text import ASSETS
        from fsedp.trace.core import NpzReader

        path = Path(path) if path is not None else ASSETS / "moe_lm.npz"
        with NpzReader(path, 8 * MAX_PARAMETERS + (1 << 16), "an array of a model file") as z:
            cfg, want = _config(z)
            arrays = {
                k: z.array(k) for k in (*want, *(k for k in z.keys if k.startswith("prism.")))
            }
        return cls(cfg, arrays, str(path))

    def save(self, path, dtype=np.float16):
        from fsedp.files import atomic_path

        arrays = {k: v.astype(dtype) for k, v in self.w.items()}
        arrays.update(self.extra)
        arrays["config"] = np.asarray(jsondoc.dumps(self.cfg.as_dict()))
        with atomic_path(path, suffix=".npz") as tmp:
            np.savez_compressed(tmp, **arrays)

    @property
    def parameters(self) -> int:
        return sum(v.size for v in self.w.values())

    # -- forward ------------------------------------------------------------------------
    def forward(self, ids, hooks: Hooks | None = None, routing: Routing | None = None):
        """Logits ``[B, T, vocab]`` of token ids ``[B, T]`` (``T <= context``)."""
        c, w = self.cfg, self.w
        ids = np.asarray(ids)
        if ids.ndim == 1:
            ids = ids[None]
        b, t = ids.shape
        if t > c.context:
            raise ValueError(f"sequence of {t} tokens exceeds the context of {c.context}")
        x = w["embed"][ids] + w["pos"][:t]
        hd = c.d_model // c.heads
        mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1)
        flat_ids = ids.reshape(-1)
        for i in range(c.layers):
            h = _rms(x, w[f"l{i}.norm1"])
            q = (h @ w[f"l{i}.wq"]).reshape(b, t, c.heads, hd).transpose(0, 2, 1, 3)
            k = (h @ w[f"l{i}.wk"]).reshape(b, t, c.heads, hd).transpose(0, 2, 1, 3)
            v = (h @ w[f"l{i}.wv"]).reshape(b, t, c.heads, hd).transpose(0, 2, 1, 3)
            att = _softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + mask)
            o = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, c.d_model)
            x = x + o @ w[f"l{i}.wo"]
            h = _rms(x, w[f"l{i}.norm2"]).reshape(b * t, c.d_model)
            x = x + self.moe(i, h, flat_ids, hooks, routing).reshape(b, t, c.d_model)
        return _rms(x, w["norm_f"]) @ w["embed"].T

    def route(self, layer: int, h):
        """Router probabilities ``[N, E]``, top-k experts ``[N, k]`` and renormalised weights."""
        probs = _softmax(h @ self.w[f"l{layer}.router"])
        k = self.cfg.top_k
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        p = np.take_along_axis(probs, top, axis=-1)
        return probs, top, p / p.sum(axis=-1, keepdims=True)

    def activations(self, layer: int, e: int, h, prefix: str = ""):
        """Intermediate activations ``silu(h W1) * (h W3)`` of expert ``e`` on rows ``h``."""
        w = self.w
        return _silu(h @ w[f"l{layer}.{prefix}w1"][e]) * (h @ w[f"l{layer}.{prefix}w3"][e])

    def expert(self, layer: int, e: int, h, mask=None, prefix: str = "", hook=None, rows=None):
        """SwiGLU expert ``e`` of ``layer`` on rows ``h [n, d]`` (``mask`` over neurons, or
        the mask ``hook.neurons`` returns)."""
        a = self.activations(layer, e, h, prefix)
        if hook is not None:
            mask = hook.neurons(layer, e, rows, a)
        if mask is not None:
            a = a * mask
        return a @ self.w[f"l{layer}.{prefix}w2"][e]

    def moe(self, layer: int, h, tokens, hooks=None, routing=None):
        probs, ids, weights = self.route(layer, h)
        if hooks is not None:
            hooks.moe_input(layer, h)
            ids, weights = hooks.route(layer, probs, ids, weights, tokens)
            ids, weights = np.asarray(ids), np.asarray(weights, dtype=np.float32)
        if routing is not None:
            routing.ids.append(ids)
            routing.weights.append(weights)
            routing.probs.append(probs)
        out = np.zeros_like(h)
        for e in np.unique(ids):
            rows, slot = np.nonzero((ids == e) & (weights != 0))
            if not len(rows):
                continue
            out[rows] += weights[rows, slot, None] * self.expert(
                layer, int(e), h[rows], hook=hooks, rows=rows
            )
        for s in range(self.cfg.shared_experts):
            out += self.expert(layer, s, h, prefix="s_")
        if hooks is not None:
            hooks.after_layer(layer)
        return out

    # -- evaluation ---------------------------------------------------------------------
    def nll(self, ids, hooks: Hooks | None = None, batch: int = 16, routing: Routing | None = None):
        """Summed negative log-likelihood (nats) and the number of predicted tokens of a
        token stream cut into non-overlapping windows of ``context`` tokens."""
        ids = np.asarray(ids)
        t = self.cfg.context
        n = (len(ids) - 1) // t
        total, count = 0.0, 0
        for s in range(0, n, batch):
            rows = np.stack([ids[j * t : j * t + t + 1] for j in range(s, min(n, s + batch))])
            logits = self.forward(rows[:, :-1], hooks, routing)
            logits = logits - logits.max(axis=-1, keepdims=True)
            lse = np.log(np.exp(logits).sum(axis=-1))
            tgt = np.take_along_axis(logits, rows[:, 1:, None], axis=-1)[..., 0]
            total += float((lse - tgt).sum())
            count += tgt.size
        return total, count

    def perplexity(self, ids, hooks: Hooks | None = None, **kw) -> float:
        """exp of the mean next-token loss over the whole context windows of ``ids``; a
        ``ValueError`` when they hold none (a perplexity over no token is undefined, not 1;
        the commands refuse such inputs on one line first, :func:`fsedp.lm.build.perplexity`)."""
        total, count = self.nll(ids, hooks, **kw)
        if not count:
            raise ValueError(
                f"{len(ids)} tokens hold no window of {self.cfg.context} + 1 tokens to evaluate"
            )
        return float(np.exp(total / count))


def _config(z) -> tuple[LMConfig, dict]:
    """The config of the model file ``z`` (an open :class:`~fsedp.trace.core.NpzReader`)
    and the arrays to read, every one checked on its header first."""
    file = z.file
    if "config" not in z:
        raise InputError(file, "config", "missing array")
    text = z.small("config", 1, 4 * MAX_CONFIG_CHARS)
    if text.dtype.kind != "U":
        raise InputError(file, "config", f"must be a JSON string, not {text.dtype}")
    try:
        d = json.loads(str(text.reshape(())))
    except (ValueError, RecursionError) as e:
        raise InputError(file, "config", f"not a JSON model config ({e})") from None
    if not isinstance(d, dict):
        raise InputError(file, "config", "not a JSON model config (expected an object)")
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(file, f"config.{k}", f"must be an integer, not {str(v)[:40]!r}")
    try:
        cfg = LMConfig.from_dict(d, file)
    except InputError as e:
        raise InputError(file, f"config.{e.field}", e.reason) from None
    total = parameter_count(cfg)
    if total > MAX_PARAMETERS:
        raise InputError(
            file,
            "config",
            f"declares {total} parameters; a model file holds at most {MAX_PARAMETERS}",
        )
    if 3 + cfg.layers * (10 + 3 * bool(cfg.shared_experts)) > len(z.keys):
        for key, _ in _weights(cfg):  # stops at the first array the file lacks
            if key not in z:
                raise InputError(file, key, "missing array")
    want = weight_shapes(cfg)
    for key in z.keys:
        if key != "config" and key not in want and not key.startswith("prism."):
            raise InputError(
                file, key, "unknown array (a model file holds its weights, config and prism.*)"
            )
    for key, shape in want.items():
        if key not in z:
            raise InputError(file, key, "missing array")
        got, dtype = z.header(key)
        if got != shape:
            raise InputError(file, key, f"shape {got}, expected {shape}")
        if dtype.kind != "f" or dtype.itemsize > 4:
            raise InputError(file, key, f"must be float16 or float32, not {dtype}")
    c = cfg
    prism_kinds = {  # name: (dtype kinds, ndim, most values)
        "prism.gates": ("iu", 4, c.layers * c.experts * c.d_ffn),
        "prism.S": ("iu", 0, 1),
        "prism.router": ("f", 3, c.layers * c.d_model * c.experts * c.d_ffn),
        "prism.router_bias": ("f", 2, c.layers * c.experts * c.d_ffn),
        "prism.finetune": ("U", 0, 1),
    }
    for key in z.keys:
        if not key.startswith("prism."):
            continue
        shape, dtype = z.header(key)
        kinds, ndim, most = prism_kinds.get(key, ("biuf", None, MAX_PARAMETERS))
        if dtype.kind not in kinds or (ndim is not None and len(shape) != ndim):
            raise InputError(file, key, f"unexpected {dtype} array of shape {shape}")
        if key == "prism.finetune" and dtype.itemsize > 4 * MAX_NOTE_CHARS:
            raise InputError(file, key, f"longer than {MAX_NOTE_CHARS} characters")
        total += math.prod(shape)
        if math.prod(shape) > most or total > MAX_PARAMETERS:
            raise InputError(
                file,
                key,
                f"shape {shape} is larger than the model's config allows (or the file holds "
                f"more than {MAX_PARAMETERS} values)",
            )
    return cfg, want
