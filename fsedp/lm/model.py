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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fsedp.errors import InputError
from fsedp.lm.config import LMConfig

__all__ = ["MoELM", "Hooks", "Routing", "EPS"]

EPS = 1e-5


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
        c, d, f = self.cfg, self.cfg.d_model, self.cfg.d_ffn
        want = {"embed": (c.vocab, d), "pos": (c.context, d), "norm_f": (d,)}
        for i in range(c.layers):
            want.update(
                {
                    f"l{i}.norm1": (d,),
                    f"l{i}.norm2": (d,),
                    f"l{i}.router": (d, c.experts),
                    f"l{i}.w1": (c.experts, d, f),
                    f"l{i}.w3": (c.experts, d, f),
                    f"l{i}.w2": (c.experts, f, d),
                }
            )
            for n in ("wq", "wk", "wv", "wo"):
                want[f"l{i}.{n}"] = (d, d)
            if c.shared_experts:
                s = c.shared_experts
                want.update(
                    {f"l{i}.s_w1": (s, d, f), f"l{i}.s_w3": (s, d, f), f"l{i}.s_w2": (s, f, d)}
                )
        for k, shape in want.items():
            if k not in self.w:
                raise InputError(self.name, k, "missing array")
            if self.w[k].shape != shape:
                raise InputError(self.name, k, f"shape {self.w[k].shape}, expected {shape}")
            if not np.isfinite(self.w[k]).all():
                raise InputError(self.name, k, "holds a non-finite value")

    # -- files --------------------------------------------------------------------------
    @classmethod
    def load(cls, path=None) -> "MoELM":
        from fsedp.lm.text import ASSETS

        path = Path(path) if path is not None else ASSETS / "moe_lm.npz"
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except FileNotFoundError:
            raise InputError(path, "<file>", "no such file") from None
        except Exception as e:
            raise InputError(path, "<file>", f"not a weights .npz ({e})") from None
        if "config" not in arrays:
            raise InputError(path, "config", "missing array")
        try:
            cfg = LMConfig.from_dict(json.loads(str(arrays["config"])), str(path))
        except (ValueError, TypeError) as e:
            raise InputError(path, "config", f"not a JSON model config ({e})") from None
        return cls(cfg, arrays, str(path))

    def save(self, path, dtype=np.float16):
        from fsedp.files import atomic_path

        arrays = {k: v.astype(dtype) for k, v in self.w.items()}
        arrays.update(self.extra)
        arrays["config"] = np.asarray(json.dumps(self.cfg.as_dict()))
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
        total, count = self.nll(ids, hooks, **kw)
        return float(np.exp(total / max(1, count)))
