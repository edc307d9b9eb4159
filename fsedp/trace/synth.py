"""``fsedp trace synth --like FILE``: a seeded routing generator fitted to a real trace.

Fitted per MoE layer ``l`` (Laplace-smoothed counts of the source):

* popularity ``P_l(e)``;
* co-activation ``Q_l(j | i)`` (other experts chosen with ``i`` by the same token);
* layer-to-layer transitions ``T_l(j | i)`` (``i`` chosen at ``l - 1``, ``j`` at ``l``);
* token-to-expert affinity ``A_l(e | v)`` for vocabulary ids ``v`` seen in the source,
  shrunk towards ``P_l`` by ``kappa`` pseudo-counts;

the last three as lifts over popularity (``log Q - log P`` and so on), so that popularity
is counted once.

Generation: requests of the source's request length; vocabulary ids drawn from the source's
unigram distribution (when it has ids); at every layer a token's ``k`` experts are drawn one
by one without replacement from

    log P_l(e) + a * mean_i lift T_l(e | i over the token's experts at l - 1)
               + b * lift A_l(e | v) + c * mean_j lift Q_l(e | j over the experts drawn so far)

(a softmax over the experts not yet drawn).  The weights ``(a, b, c)`` are calibrated by
:func:`fit` with a small grid search that matches the source's inter-layer predictability,
co-activation concentration, token-id predictability and load skew
(``fsedp.trace.stats.summary``, :data:`MATCHED`).
"""

import copy
import itertools

import numpy as np

from fsedp import jsondoc
from fsedp.errors import InputError
from fsedp.trace.core import RoutingTrace, pair_counts
from fsedp.trace.stats import summary, trace_stats

__all__ = ["RoutingModel", "fit", "MATCHED", "MAX_MODEL_BYTES"]

#: Most bytes the fitted tables of a :class:`RoutingModel` (``[layers, E, E]`` lifts, token
#: affinities) or one :meth:`RoutingModel.sample` (``[tokens, E]`` scores) may take: the
#: size is computed from the source's shape and refused before anything is allocated
#: (4096 experts need 256 MiB a layer; the models of ``configs/models`` need a few MiB).
MAX_MODEL_BYTES = 1 << 28


def _budget(name: str, field: str, nbytes: int, what: str):
    if nbytes > MAX_MODEL_BYTES:
        raise InputError(
            name,
            field,
            f"{what} would take {nbytes / 2**20:.0f} MiB; at most {MAX_MODEL_BYTES >> 20} MiB "
            "(fewer experts, layers, tokens or vocabulary ids)",
        )


#: statistics the calibration matches, with the tolerance the tests hold the fit to
MATCHED = {
    "inter_layer": 0.05,
    "coact_top4": 0.05,
    "cold@16": 0.06,
    "cold@64": 0.06,
    "active@16": 0.05,
    "popularity": 0.03,
    "token_id": 0.05,
}


class RoutingModel:
    def __init__(
        self,
        source: RoutingTrace,
        kappa: float = 4.0,
        a: float = 1.0,
        b: float = 0.0,
        c: float = 0.5,
    ):
        self.ne, self.k, self.layers = source.num_experts, source.top_k, source.layers
        self.a, self.b, self.c = a, b, c
        ne, k = self.ne, self.k
        n_ids = 0 if source.token_ids is None else len(np.unique(source.token_ids))
        _budget(
            source.name,
            "num_experts",
            8 * (2 * self.layers + 3) * ne * ne + 8 * (self.layers + 2) * n_ids * ne,
            f"fitting {self.layers} layers of {ne} experts and {n_ids} vocabulary ids",
        )
        e = source.experts.astype(np.int64)
        self.logp = np.zeros((self.layers, ne))
        self.logq = np.zeros((self.layers, ne, ne))
        self.logt = np.zeros((self.layers, ne, ne))
        for l in range(self.layers):
            pop = np.bincount(e[:, l].reshape(-1), minlength=ne) + 1.0
            self.logp[l] = np.log(pop / pop.sum())
            q = 1.0 + pair_counts(e[:, l], e[:, l], ne, other_slots=True)
            self.logq[l] = np.log(q / q.sum(1, keepdims=True)) - self.logp[l]
            if l:
                t = 1.0 + pair_counts(e[:, l - 1], e[:, l], ne)
                self.logt[l] = np.log(t / t.sum(1, keepdims=True)) - self.logp[l]
        self.vocab = None
        if source.token_ids is not None:
            ids, inv, cnt = np.unique(source.token_ids, return_inverse=True, return_counts=True)
            self.vocab, self.vocab_p = ids, cnt / cnt.sum()
            self.loga = np.zeros((self.layers, len(ids), ne))
            for l in range(self.layers):
                tab = np.zeros((len(ids), ne))
                np.add.at(tab, (np.repeat(inv, k), e[:, l].reshape(-1)), 1)
                prior = np.exp(self.logp[l])
                self.loga[l] = (
                    np.log((tab + kappa * prior) / (tab.sum(1, keepdims=True) + kappa))
                    - self.logp[l]
                )
        lengths = np.unique(source.request, return_counts=True)[1]  # tokens per request
        self.req_len = int(np.median(lengths)) if len(lengths) else 64
        self.name = source.name

    def params(self) -> dict:
        return {"a": self.a, "b": self.b, "c": self.c}

    def check_sample(self, tokens: int):
        """Refuse a :meth:`sample` of ``tokens`` whose ``[tokens, E]`` scores would take more
        than :data:`MAX_MODEL_BYTES`."""
        _budget(
            f"synth-like:{self.name}",
            "tokens",
            8 * tokens * self.ne * (6 + self.k),
            f"sampling {tokens} tokens over {self.ne} experts",
        )

    def sample(self, tokens: int, seed: int = 0) -> RoutingTrace:
        ne, k, L = self.ne, self.k, self.layers
        self.check_sample(tokens)
        rng = np.random.default_rng(seed)
        out = np.zeros((tokens, L, k), dtype=np.int64)
        tok_idx = (
            rng.choice(len(self.vocab), size=tokens, p=self.vocab_p)
            if self.vocab is not None
            else None
        )
        for l in range(L):
            base = np.tile(self.logp[l], (tokens, 1))
            if l and self.a:
                base += self.a * self.logt[l][out[:, l - 1]].mean(1)
            if tok_idx is not None and self.b:
                base += self.b * self.loga[l][tok_idx]
            chosen = np.zeros((tokens, ne), dtype=bool)
            co = np.zeros((tokens, ne))
            for j in range(k):
                s = base + (self.c * co / j if j else 0.0)
                s = np.where(chosen, -np.inf, s)
                g = s + rng.gumbel(size=s.shape)  # Gumbel-max: a draw from softmax(s)
                pick = g.argmax(1)
                out[:, l, j] = pick
                chosen[np.arange(tokens), pick] = True
                co += self.logq[l][pick]
        request = np.arange(tokens) // self.req_len
        return RoutingTrace(
            experts=out,
            scores=None,
            token_ids=self.vocab[tok_idx] if tok_idx is not None else None,
            request=request,
            position=np.arange(tokens) % self.req_len,
            num_experts=ne,
            name=f"synth-like:{self.name}",
        )


def distance(a: dict, b: dict) -> float:
    return max(
        abs(a[key] - b[key]) / tol
        for key, tol in MATCHED.items()
        if a.get(key) is not None and b.get(key) is not None  # None: undefined on the trace
    )


def fit(source: RoutingTrace, seed: int = 0, grid=None, log=None) -> tuple[RoutingModel, dict]:
    """Calibrate ``(a, b, c)`` on a grid; returns the best model and the source and synthetic
    summaries (``"source"``, ``"synthetic"``, ``"distance"``: the largest deviation in units
    of :data:`MATCHED` tolerance)."""
    if source.tokens < 64:
        raise InputError(
            source.name, "experts", f"{source.tokens} tokens are too few to fit (>= 64)"
        )
    fitted = RoutingModel(source)  # the tables do not depend on (a, b, c): fitted once
    fitted.check_sample(source.tokens)  # before any work
    target = summary(trace_stats(source))
    grid = grid or list(itertools.product((1.0, 2.0, 3.0), (0.0, 0.5), (0.5, 1.0, 2.0)))
    best = None
    for a, b, c in grid:
        model = copy.copy(fitted)
        model.a, model.b, model.c = a, b, c
        got = summary(trace_stats(model.sample(source.tokens, seed)))
        d = distance(target, got)
        if log:
            log(jsondoc.dumps({"a": a, "b": b, "c": c, "distance": round(d, 3)}))
        if best is None or d < best[0]:
            best = (d, model, got)
    return best[1], {
        "source": target,
        "synthetic": best[2],
        "distance": best[0],
        "params": best[1].params(),
    }
