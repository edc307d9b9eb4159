"""MoE-Prism's low-cost router fine-tuning (``002_808375f33056e8fe.txt``, Section 4.3.2), in
torch (the optional ``model`` extra).

Only the linear gate of every layer (:class:`~fsedp.sw.policies.prism.LinearGate`, ``G [d,
E S]`` and ``b [E S]``, 33 k parameters on the committed model, under 1 % of it) is trained;
every other weight of the refactored model is frozen.  A step draws ``batch`` windows of the
training text, runs the model with every token computing the ``K`` sub-experts its gate
picks (the softmax renormalised over them to sum to ``min(K, S)``, as
:func:`~fsedp.sw.policies.prism.linear_gate_select`), and minimises next-token
cross-entropy.  The gradient reaches the gate through the weights of the chosen sub-experts.

The curriculum sets ``K`` per step (decided here, the paper names only its direction):

* ``increasing`` (the paper's): ``K`` rises from 1 to ``K_max = top_k x S`` in equal phases;
* ``random``: ``K`` drawn uniformly from ``1 .. K_max`` at every step;
* ``mixed``: the increasing schedule, but each step draws ``K`` uniformly from ``1 .. K_t``
  (the budgets already reached stay in training).

Our addition, ``distill`` (weight ``lambda``): the dense computation already has every
sub-expert's activations, so the oracle's scores (each sub-expert's activation norm times its
expert's original routing probability, normalised over the layer's ``E S`` sub-experts) are
free, and the loss adds ``lambda`` x the KL divergence of the gate's softmax from them.  The
end-to-end term alone teaches the gate only through the relative weights of the sub-experts
it already keeps (at ``K = 1`` not at all: a single kept weight is 1); the oracle term ranks
every sub-expert.  ``distill = 0`` is the paper's objective.

The module mirrors the NumPy forward pass with the gate
(:class:`~fsedp.sw.policies.prism.LinearGateHook`; ``tests/test_prism_finetune.py`` checks
them equal, ties included), computed densely: all ``E F`` neurons of a layer, scaled per
sub-expert, one matrix product each way.
"""

import time

import numpy as np

from fsedp import jsondoc
from fsedp.lm.train import (
    _torch,
    build_torch_model,
    check_finite,
    cosine_lr,
    from_numpy,
    sample_windows,
)

__all__ = ["FinetuneConfig", "SCHEDULES", "budget_at", "gated_module", "finetune_router"]

SCHEDULES = ("increasing", "random", "mixed")


class FinetuneConfig:
    """Settings of :func:`finetune_router` (defaults: the figures of ``docs/prism.md``)."""

    def __init__(
        self,
        steps=400,
        batch=16,
        lr=3e-3,
        schedule="mixed",
        distill=1.0,
        seed=0,
        threads=2,
        log_every=50,
    ):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, not {schedule!r}")
        if not distill >= 0:
            raise ValueError(f"distill must be >= 0, not {distill!r}")
        self.steps, self.batch, self.lr, self.schedule = steps, batch, lr, schedule
        self.distill = distill
        self.seed, self.threads, self.log_every = seed, threads, log_every

    def as_dict(self):
        return dict(vars(self))


def budget_at(step: int, steps: int, k_max: int, schedule: str, rng) -> int:
    """The sub-expert budget ``K`` of training step ``step`` of ``steps``."""
    if schedule == "random":
        return int(rng.integers(1, k_max + 1))
    reached = min(k_max, 1 + step * k_max // steps)
    if schedule == "increasing":
        return reached
    return int(rng.integers(1, reached + 1))


def gated_module(model, gate):
    """``(module, state)``: the torch module of the refactored ``model`` (frozen) whose
    routed feed-forward is the linear gate ``gate`` (trainable ``module.gate_G``,
    ``module.gate_b``); set ``state["K"]`` to the budget before a forward pass, and
    ``state["distill"]`` to have the module's second output be the mean (over layers and
    tokens) KL divergence of the gate from the oracle's sub-expert scores."""
    torch = _torch()
    F = torch.nn.functional
    c, S = model.cfg, gate.S
    f = c.d_ffn
    state = {"K": c.top_k * S, "distill": False}

    def moe(self, i, h):
        logits = h @ self.gate_G[i] + self.gate_b[i]
        p = torch.softmax(logits, dim=-1)
        # a stable sort, as linear_gate_select's: equal scores keep the lower index first
        order = torch.sort(p, dim=-1, descending=True, stable=True).indices
        keep = order[:, : state["K"]]
        vals = p.gather(1, keep)
        scale = min(state["K"], S)
        w = torch.zeros_like(p).scatter(1, keep, scale * vals / vals.sum(-1, keepdim=True))
        a = F.silu(h @ self.cat_w1[i]) * (h @ self.cat_w3[i])  # [N, E F]
        out = (a * w.repeat_interleave(f // S, dim=1)) @ self.cat_w2[i]
        aux = h.new_zeros(())
        if state["distill"]:
            # the oracle's scores: each sub-expert's activation norm times its expert's
            # original routing probability, as a distribution the gate's softmax should match
            with torch.no_grad():
                norms = a.view(len(h), c.experts, S, f // S).norm(dim=-1)
                prob = torch.softmax(h @ self.params[f"l{i}_router"], dim=-1)
                score = (norms * prob[:, :, None]).reshape(len(h), -1) + 1e-12
                target = score / score.sum(-1, keepdim=True)
            aux = (target * (target.log() - torch.log_softmax(logits, dim=-1))).sum(-1).mean()
        return self.shared(i, h, out), aux

    module = build_torch_model(c, moe=moe)
    from_numpy(module, model.w)
    for p in module.parameters():
        p.requires_grad_(False)
    # experts side by side: W1, W3 as [d, E F], W2 as [E F, d] (neuron e F + j = expert e's j)
    module.cat_w1 = [torch.from_numpy(_cat_in(model.w[f"l{i}.w1"])) for i in range(c.layers)]
    module.cat_w3 = [torch.from_numpy(_cat_in(model.w[f"l{i}.w3"])) for i in range(c.layers)]
    module.cat_w2 = [
        torch.from_numpy(np.ascontiguousarray(model.w[f"l{i}.w2"].reshape(-1, c.d_model)))
        for i in range(c.layers)
    ]
    module.gate_G = torch.nn.Parameter(torch.from_numpy(gate.G.copy()))
    module.gate_b = torch.nn.Parameter(torch.from_numpy(gate.b.copy()))
    return module, state


def _cat_in(w):
    e, d, f = w.shape
    return np.ascontiguousarray(w.transpose(1, 0, 2).reshape(d, e * f))


def finetune_router(model, gate, train_ids: np.ndarray, fc: FinetuneConfig, log=print):
    """Train ``gate`` (a :class:`~fsedp.sw.policies.prism.LinearGate`, e.g. the training-free
    :func:`~fsedp.sw.policies.prism.linear_gate_init`) of the refactored ``model`` on the
    token stream ``train_ids``; returns ``(trained gate, history)``."""
    torch = _torch()
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        torch.set_num_threads(fc.threads)
        torch.use_deterministic_algorithms(True)
        return _finetune(torch, model, gate, train_ids, fc, log)
    finally:  # the process's torch settings as they were
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _finetune(torch, model, gate, train_ids, fc, log):
    torch.manual_seed(fc.seed)
    module, state = gated_module(model, gate)
    state["distill"] = bool(fc.distill)
    params = [module.gate_G, module.gate_b]
    opt = torch.optim.Adam(params, lr=fc.lr)
    rng = np.random.default_rng(fc.seed)
    t, k_max = model.cfg.context, model.cfg.top_k * gate.S
    if len(train_ids) < t + 2:
        raise ValueError(f"{len(train_ids)} training tokens: fewer than one window of {t + 1}")
    data = torch.from_numpy(np.asarray(train_ids, dtype=np.int64))
    history, start, seen = [], time.time(), []
    for step in range(fc.steps):
        K = budget_at(step, fc.steps, k_max, fc.schedule, rng)
        state["K"] = K
        rows = sample_windows(torch, rng, data, t, fc.batch)
        logits, kl = module(rows[:, :-1])
        ce = torch.nn.functional.cross_entropy(
            logits.reshape(-1, model.cfg.vocab), rows[:, 1:].reshape(-1)
        )
        loss = ce + fc.distill * kl if fc.distill else ce
        for g in opt.param_groups:
            g["lr"] = cosine_lr(fc.lr, step, fc.steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        seen.append((ce.item(), float(kl.detach())))
        if (step + 1) % fc.log_every == 0 or step + 1 == fc.steps:
            rec = {
                "step": step + 1,
                "K": K,
                "train_ce": round(float(np.mean([x for x, _ in seen])), 4),
                **({"kl": round(float(np.mean([y for _, y in seen])), 4)} if fc.distill else {}),
                "seconds": round(time.time() - start, 1),
            }
            seen = []
            history.append(rec)
            log(jsondoc.dumps(check_finite(rec)))
    # a gate of the same class (this layer does not import the policies above it)
    out = type(gate)(
        module.gate_G.detach().numpy().copy(), module.gate_b.detach().numpy().copy(), gate.S
    )
    return out, history
