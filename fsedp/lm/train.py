"""Training of the project's MoE LM (torch, an optional extra: ``pip install -e '.[model]'``).

``fsedp lm train`` runs :func:`train`: a byte-level BPE tokenizer and the model of
:class:`~fsedp.lm.config.LMConfig` trained on WikiText-2 validation + the C4 sample, seeded
(data order, initialisation, dropout-free), on the CPU with a fixed thread count, so that
the same command reproduces the same weights up to floating-point reordering.  The loss is
next-token cross-entropy plus a Switch-Transformer load-balancing term (``aux`` x E x
sum_e f_e P_e) that keeps the experts from collapsing.  The torch module mirrors
:class:`~fsedp.lm.model.MoELM` array for array; :func:`to_numpy` exports it.
"""

import math
import time

import numpy as np

from fsedp import jsondoc
from fsedp.errors import COMMAND_LINE, InputError
from fsedp.lm.config import LMConfig
from fsedp.lm.model import EPS

__all__ = ["TrainConfig", "build_torch_model", "to_numpy", "from_numpy", "train"]


def check_finite(rec: dict) -> dict:
    """``rec``, a training log record, when every figure in it is finite; a loss that is
    ``NaN`` or infinite means training diverged: one line naming ``--lr`` (the option that
    decides it), never a ``NaN`` in a log line."""
    for key, value in rec.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(
                COMMAND_LINE,
                "--lr",
                f"training diverged at step {rec.get('step')}: {key} is {value}; lower the "
                "learning rate",
            )
    return rec


def _torch():
    """The torch module; refused on one line when the ``model`` extra is not installed."""
    try:
        import torch
    except ImportError:
        raise InputError(
            COMMAND_LINE, "torch", "not installed: the 'model' extra, pip install 'fsedp[model]'"
        ) from None
    return torch


def build_torch_model(cfg: LMConfig, seed: int = 0, moe=None):
    """The torch module of ``cfg`` (seeded initialisation).  ``moe(module, layer, h)``, if
    given, replaces the routed feed-forward of every layer and returns ``(out, aux)``
    (MoE-Prism's sub-expert gate, :mod:`fsedp.lm.finetune`)."""
    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional

    class TorchMoELM(nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            d, f, e = cfg.d_model, cfg.d_ffn, cfg.experts

            def p(*shape, std):
                return nn.Parameter(torch.randn(*shape, generator=g) * std)

            def ones(*shape):
                return nn.Parameter(torch.ones(*shape))

            out_std = 0.02 / math.sqrt(2 * cfg.layers)
            self.params = nn.ParameterDict()
            P = self.params
            P["embed"] = p(cfg.vocab, d, std=0.02)
            P["pos"] = p(cfg.context, d, std=0.01)
            P["norm_f"] = ones(d)
            for i in range(cfg.layers):
                P[f"l{i}_norm1"], P[f"l{i}_norm2"] = ones(d), ones(d)
                for n in ("wq", "wk", "wv"):
                    P[f"l{i}_{n}"] = p(d, d, std=0.02)
                P[f"l{i}_wo"] = p(d, d, std=out_std)
                P[f"l{i}_router"] = p(d, e, std=0.02)
                P[f"l{i}_w1"], P[f"l{i}_w3"] = p(e, d, f, std=0.02), p(e, d, f, std=0.02)
                P[f"l{i}_w2"] = p(e, f, d, std=out_std)
                if cfg.shared_experts:
                    s = cfg.shared_experts
                    P[f"l{i}_s_w1"], P[f"l{i}_s_w3"] = p(s, d, f, std=0.02), p(s, d, f, std=0.02)
                    P[f"l{i}_s_w2"] = p(s, f, d, std=out_std)

        @staticmethod
        def rms(x, g):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * g

        def forward(self, ids):
            P = self.params
            b, t = ids.shape
            x = P["embed"][ids] + P["pos"][:t]
            hd = cfg.d_model // cfg.heads
            aux = x.new_zeros(())
            for i in range(cfg.layers):
                h = self.rms(x, P[f"l{i}_norm1"])
                q, k, v = (
                    (h @ P[f"l{i}_{n}"]).view(b, t, cfg.heads, hd).transpose(1, 2)
                    for n in ("wq", "wk", "wv")
                )
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + o.transpose(1, 2).reshape(b, t, cfg.d_model) @ P[f"l{i}_wo"]
                h = self.rms(x, P[f"l{i}_norm2"]).reshape(b * t, cfg.d_model)
                out, a = moe(self, i, h) if moe is not None else self.moe(i, h)
                aux = aux + a
                x = x + out.view(b, t, cfg.d_model)
            return self.rms(x, P["norm_f"]) @ P["embed"].T, aux / cfg.layers

        def shared(self, i, h, out):
            """``out`` plus the shared experts' outputs on rows ``h`` of layer ``i``."""
            P = self.params
            for s in range(cfg.shared_experts):
                out = (
                    out
                    + (F.silu(h @ P[f"l{i}_s_w1"][s]) * (h @ P[f"l{i}_s_w3"][s]))
                    @ P[f"l{i}_s_w2"][s]
                )
            return out

        def moe(self, i, h):
            P = self.params
            probs = torch.softmax(h @ P[f"l{i}_router"], dim=-1)
            top_p, top = probs.topk(cfg.top_k, dim=-1)
            wts = top_p / top_p.sum(-1, keepdim=True)
            out = torch.zeros_like(h)
            for e in range(cfg.experts):
                rows, slot = torch.nonzero(top == e, as_tuple=True)
                if rows.numel() == 0:
                    continue
                x = h[rows]
                y = (F.silu(x @ P[f"l{i}_w1"][e]) * (x @ P[f"l{i}_w3"][e])) @ P[f"l{i}_w2"][e]
                out.index_add_(0, rows, wts[rows, slot, None] * y)
            out = self.shared(i, h, out)
            # Switch load balancing: fraction of routed slots per expert x mean probability
            frac = torch.bincount(top.reshape(-1), minlength=cfg.experts).float() / top.numel()
            return out, cfg.experts * (frac * probs.mean(0)).sum()

    return TorchMoELM()


def to_numpy(module) -> dict:
    """The module's parameters under :class:`~fsedp.lm.model.MoELM`'s names."""
    out = {}
    for k, v in module.params.items():
        name = k.replace("_", ".", 1) if k.startswith("l") and k[1].isdigit() else k
        out[name] = v.detach().cpu().numpy().astype(np.float32)
    return out


def from_numpy(module, weights: dict):
    """Load :class:`~fsedp.lm.model.MoELM` arrays (``weights``, its names) into ``module``."""
    torch = _torch()
    with torch.no_grad():
        for k, v in module.params.items():
            name = k.replace("_", ".", 1) if k.startswith("l") and k[1].isdigit() else k
            v.copy_(torch.from_numpy(np.asarray(weights[name], dtype=np.float32)))
    return module


def cosine_lr(peak: float, step: int, steps: int, warmup: int = 0) -> float:
    """Learning rate of ``step``: linear warm-up over ``warmup`` steps, then a cosine decay
    from ``peak`` to 10 % of it at ``steps``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def sample_windows(torch, rng, data, t: int, batch: int):
    """``batch`` windows of ``t + 1`` tokens of the token tensor ``data`` at ``rng``'s
    random starts (the inputs are ``[:, :-1]``, the targets ``[:, 1:]``)."""
    starts = rng.integers(0, len(data) - t - 1, size=batch)
    return torch.stack([data[s : s + t + 1] for s in starts])


class TrainConfig:
    """Optimisation settings (defaults: the committed model)."""

    def __init__(
        self,
        steps=3200,
        batch=24,
        lr=3e-3,
        warmup=60,
        weight_decay=0.1,
        aux=0.03,
        seed=0,
        threads=2,
        val_fraction=0.02,
        log_every=50,
    ):
        self.steps, self.batch, self.lr, self.warmup = steps, batch, lr, warmup
        self.weight_decay, self.aux, self.seed, self.threads = weight_decay, aux, seed, threads
        self.val_fraction, self.log_every = val_fraction, log_every

    def as_dict(self):
        return dict(vars(self))


def train(cfg: LMConfig, tc: TrainConfig, train_ids: np.ndarray, log=print):
    """Train and return ``(weights dict, history)``; ``train_ids`` is the token stream."""
    torch = _torch()
    torch.manual_seed(tc.seed)
    torch.set_num_threads(tc.threads)
    torch.use_deterministic_algorithms(True)
    n_val = int(len(train_ids) * tc.val_fraction)
    data = torch.from_numpy(train_ids[: len(train_ids) - n_val].astype(np.int64))
    val = torch.from_numpy(train_ids[len(train_ids) - n_val :].astype(np.int64))
    model = build_torch_model(cfg, tc.seed)
    decay = [p for n, p in model.params.items() if p.dim() >= 2 and n not in ("embed", "pos")]
    rest = [p for n, p in model.params.items() if not (p.dim() >= 2 and n not in ("embed", "pos"))]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=tc.lr,
        betas=(0.9, 0.95),
    )
    rng = np.random.default_rng(tc.seed)
    t = cfg.context
    history = []
    start = time.time()

    def val_loss():
        model.eval()
        with torch.no_grad():
            n = (len(val) - 1) // t
            rows = torch.stack([val[j * t : j * t + t + 1] for j in range(n)])
            logits, _ = model(rows[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, cfg.vocab), rows[:, 1:].reshape(-1)
            )
        model.train()
        return float(loss)

    for step in range(tc.steps):
        rows = sample_windows(torch, rng, data, t, tc.batch)
        logits, aux = model(rows[:, :-1])
        ce = torch.nn.functional.cross_entropy(
            logits.reshape(-1, cfg.vocab), rows[:, 1:].reshape(-1)
        )
        loss = ce + tc.aux * aux
        for g in opt.param_groups:
            g["lr"] = cosine_lr(tc.lr, step, tc.steps, tc.warmup)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % tc.log_every == 0 or step + 1 == tc.steps:
            rec = {
                "step": step + 1,
                "train_ce": round(ce.item(), 4),
                "aux": round(aux.item(), 4),
                "val_ce": round(val_loss(), 4),
                "seconds": round(time.time() - start, 1),
            }
            history.append(rec)
            log(jsondoc.dumps(check_finite(rec)))
    return to_numpy(model), history
