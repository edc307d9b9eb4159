"""Speculative MoE (``003_3553eaf20638f0d2.txt``): predict each token's experts from its id
and its earlier layers, co-cluster tokens and experts onto devices, and shuffle tokens ahead
of the expert-parallel all-to-all so that less data moves (``docs/speculative.md``).

* **Token-to-expert confidence tables** (:class:`TokenTable`): per layer, expert counts per
  vocabulary id on the fitting tokens; the prediction is the ``k`` experts of highest
  confidence.  An unseen id falls back to the nearest seen id by embedding cosine (when
  embeddings are given, e.g. the project's LM's), else to the layer's popularity.
* **2-gram device model** (:class:`DeviceBigram`): the device of a token at layer ``l``
  (that of its top-1 expert) predicted from its devices at ``l - 2`` and ``l - 1``.
* **Co-clustering** (:func:`cem_placement`): experts onto ``D`` devices (equal counts) and
  vocabulary ids onto devices (token-load relaxation: each device takes at most ``(1 +
  slack)`` of an even share of the token occurrences) to maximise the local activation rate
  (LAR, the share of token-expert activations whose expert sits on the token's device).
  The cross-entropy method samples expert placements from a per-expert device distribution
  (balanced by a capacity-respecting Gumbel assignment), places the tokens by their best
  response (:func:`place_tokens`), keeps the ``elite`` fraction of samples and smooths the
  distribution towards their frequencies.  Baselines: METIS on the token-expert graph
  (:func:`metis_placement`, ``pymetis``; its expert parts rebalanced to equal counts) and
  two-stage balanced k-means (:func:`kmeans_placement`: experts by their normalised
  co-activation profiles, then tokens by best response).
* **Speculative shuffling**: a token is sent to the device its table lookup predicts
  (:func:`predicted_devices`); LAR counts the activations that are then local.
* **Volume model** (Section 3.2, :func:`comm_volume`): bytes per token of the dispatch and
  combine all-to-alls for DeepSpeed-MoE style EP (tokens stay where data parallelism put
  them) and for s-MoE (tokens first shuffled to their predicted device), each with and
  without de-duplication (one copy per remote device instead of one per remote expert).
"""

import numpy as np

__all__ = [
    "TokenTable",
    "DeviceBigram",
    "precision_f1",
    "lar",
    "place_tokens",
    "cem_placement",
    "metis_placement",
    "kmeans_placement",
    "predicted_devices",
    "comm_volume",
]


def precision_f1(pred: np.ndarray, true: np.ndarray) -> tuple[float, float]:
    """Mean precision and F1 of predicted expert sets ``[N, kp]`` against ``[N, k]``."""
    hits = (pred[:, :, None] == true[:, None, :]).any(2).sum(1)
    p = hits / pred.shape[1]
    r = hits / true.shape[1]
    f1 = np.where(p + r > 0, 2 * p * r / np.maximum(p + r, 1e-12), 0.0)
    return float(p.mean()), float(f1.mean())


class TokenTable:
    def __init__(
        self,
        token_ids: np.ndarray,
        experts: np.ndarray,
        num_experts: int,
        embeddings: np.ndarray | None = None,
    ):
        self.E = num_experts
        self.vocab, inv = np.unique(token_ids, return_inverse=True)
        k = experts.shape[2]
        self.counts = np.zeros((experts.shape[1], len(self.vocab), num_experts))
        for l in range(experts.shape[1]):
            np.add.at(self.counts[l], (np.repeat(inv, k), experts[:, l].reshape(-1)), 1)
        self.pop = self.counts.sum(1)
        self.emb = None
        if embeddings is not None:
            e = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
            self.emb, self.seen_emb = e, e[self.vocab]

    def rows(self, token_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Index of each token's table row (nearest seen id for unseen ones when embeddings
        are known, else -1) and whether the id was seen."""
        pos = np.searchsorted(self.vocab, token_ids)
        pos = np.minimum(pos, len(self.vocab) - 1)
        seen = self.vocab[pos] == token_ids
        idx = np.where(seen, pos, -1)
        if self.emb is not None and (~seen).any():
            unseen = np.nonzero(~seen)[0]
            sims = self.emb[token_ids[unseen]] @ self.seen_emb.T
            idx[unseen] = sims.argmax(1)
        return idx, seen

    def confidence(self, layer: int, token_ids: np.ndarray) -> np.ndarray:
        idx, _ = self.rows(token_ids)
        c = np.where(idx[:, None] >= 0, self.counts[layer][np.maximum(idx, 0)], 0.0)
        c = c + 1e-6 * self.pop[layer]  # popularity breaks ties / fills gaps
        return c / c.sum(1, keepdims=True)

    def predict(self, layer: int, token_ids: np.ndarray, k: int) -> np.ndarray:
        return np.argsort(-self.confidence(layer, token_ids), axis=1, kind="stable")[:, :k]


class DeviceBigram:
    """``P(d_l | d_{l-2}, d_{l-1})`` from device sequences ``[N, L]``."""

    def __init__(self, devices: np.ndarray, D: int):
        self.D = D
        L = devices.shape[1]
        self.c = np.ones((L, D, D, D)) * 1e-3
        for l in range(2, L):
            np.add.at(self.c[l], (devices[:, l - 2], devices[:, l - 1], devices[:, l]), 1)

    def predict(self, devices: np.ndarray, layer: int) -> np.ndarray:
        return self.c[layer][devices[:, layer - 2], devices[:, layer - 1]].argmax(1)

    def accuracy(self, devices: np.ndarray) -> list[float]:
        return [
            float((self.predict(devices, l) == devices[:, l]).mean())
            for l in range(2, devices.shape[1])
        ]


def lar(token_dev: np.ndarray, expert_dev: np.ndarray, experts: np.ndarray) -> float:
    """Local activation rate: ``token_dev [N]`` against the experts ``[N, k]`` of a layer."""
    return float((expert_dev[experts] == token_dev[:, None]).mean())


def _affinity(token_rows: np.ndarray, experts: np.ndarray, V: int, E: int) -> np.ndarray:
    """``[V, E]`` activation counts of vocabulary rows with experts (one layer)."""
    a = np.zeros((V, E))
    np.add.at(a, (np.repeat(token_rows, experts.shape[1]), experts.reshape(-1)), 1)
    return a


def place_tokens(aff: np.ndarray, expert_dev: np.ndarray, D: int, slack: float) -> np.ndarray:
    """Best response of the tokens: each vocabulary row to the device holding most of its
    activations, the heaviest rows first, a device full at ``(1 + slack)`` of an even share.
    A row is never left out: going down its devices by score, it takes the first that has
    room or the least-used one, whichever comes first (the latter may go over the share)."""
    load = aff.sum(1)
    cap = (1 + slack) * load.sum() / D
    score = np.stack([aff[:, expert_dev == d].sum(1) for d in range(D)], 1)
    dev = np.zeros(len(aff), dtype=np.int64)
    used = np.zeros(D)
    for v in np.argsort(-load, kind="stable"):
        for d in np.argsort(-score[v], kind="stable"):
            if used[d] + load[v] <= cap or d == np.argmin(used):
                dev[v] = d
                used[d] += load[v]
                break
    return dev


def _balanced(scores: np.ndarray, D: int) -> np.ndarray:
    """Experts to devices, ``E / D`` each, greedily by descending score."""
    E = len(scores)
    cap = -(-E // D)
    dev = np.full(E, -1)
    used = np.zeros(D, dtype=int)
    for flat in np.argsort(-scores, axis=None, kind="stable"):
        e, d = divmod(int(flat), D)
        if dev[e] < 0 and used[d] < cap:
            dev[e] = d
            used[d] += 1
    return dev


def _objective(aff, expert_dev, D, slack):
    tok = place_tokens(aff, expert_dev, D, slack)
    return float((aff * (expert_dev[None, :] == tok[:, None])).sum() / max(aff.sum(), 1)), tok


def _cem_step(P: np.ndarray, elite: list, smoothing: float) -> np.ndarray:
    """The cross-entropy update: each expert's device distribution ``P [E, D]`` moved
    ``smoothing`` of the way to the devices the ``elite`` placements give it."""
    freq = np.zeros_like(P)
    for dev in elite:
        freq[np.arange(len(P)), dev] += 1
    return smoothing * freq / len(elite) + (1 - smoothing) * P


def cem_placement(
    aff: np.ndarray,
    D: int,
    iters: int = 30,
    samples: int = 64,
    elite: float = 0.1,
    smoothing: float = 0.7,
    slack: float = 0.1,
    seed: int = 0,
):
    """Cross-entropy method over balanced expert placements (tokens by best response);
    returns ``(expert_dev, token_dev, lar, history)``."""
    rng = np.random.default_rng(seed)
    E = aff.shape[1]
    P = np.full((E, D), 1.0 / D)
    best = (-1.0, None, None)
    hist = []
    n_elite = max(1, int(round(elite * samples)))
    for _ in range(iters):
        cand = []
        for _ in range(samples):
            dev = _balanced(np.log(P + 1e-12) + rng.gumbel(size=P.shape), D)
            val, tok = _objective(aff, dev, D, slack)
            cand.append((val, dev, tok))
        cand.sort(key=lambda c: -c[0])
        if cand[0][0] > best[0]:
            best = cand[0]
        P = _cem_step(P, [dev for _, dev, _ in cand[:n_elite]], smoothing)
        hist.append(round(cand[0][0], 4))
    return best[1], best[2], best[0], hist


def metis_placement(aff: np.ndarray, D: int, slack: float = 0.1):
    """METIS (``pymetis``) on the bipartite token-expert graph; the expert side rebalanced to
    equal counts (METIS balances vertex weight, not expert counts), tokens by best response."""
    import pymetis

    V, E = aff.shape
    adj = [[] for _ in range(V + E)]
    wts = [[] for _ in range(V + E)]
    for v, e in zip(*np.nonzero(aff)):
        w = int(aff[v, e])
        adj[v].append(V + e), wts[v].append(w)
        adj[V + e].append(v), wts[V + e].append(w)
    xadj = np.cumsum([0] + [len(a) for a in adj])
    vw = np.concatenate(
        [np.maximum(1, aff.sum(1)).astype(int), np.full(E, int(max(1, aff.sum() / E)))]
    )
    adjncy = np.concatenate([a for a in adj if a] or [[]]).astype(int)
    eweights = np.concatenate([w for w in wts if w] or [[]]).astype(int)
    _, parts = pymetis.part_graph(
        D, pymetis.CSRAdjacency(xadj, adjncy), eweights=eweights, vweights=vw.tolist()
    )
    parts = np.asarray(parts)
    scores = np.zeros((E, D))
    scores[np.arange(E), parts[V:]] = 1.0
    scores += 1e-3 * np.stack([aff[parts[:V] == d].sum(0) for d in range(D)], 1) / max(aff.sum(), 1)
    dev = _balanced(scores, D)
    val, tok = _objective(aff, dev, D, slack)
    return dev, tok, val


def kmeans_placement(aff: np.ndarray, D: int, iters: int = 50, slack: float = 0.1, seed: int = 0):
    """Two-stage balanced k-means: experts clustered by their normalised token profiles into
    ``D`` equal groups, then tokens by best response."""
    rng = np.random.default_rng(seed)
    X = aff.T / np.maximum(np.linalg.norm(aff.T, axis=1, keepdims=True), 1e-12)
    C = X[rng.choice(len(X), D, replace=False)]
    dev = None
    for _ in range(iters):
        sim = X @ C.T
        new = _balanced(sim, D)
        if dev is not None and (new == dev).all():
            break
        dev = new
        C = np.stack([X[dev == d].mean(0) if (dev == d).any() else C[d] for d in range(D)])
    val, tok = _objective(aff, dev, D, slack)
    return dev, tok, val


def predicted_devices(
    table: TokenTable, token_dev_of_row: np.ndarray, token_ids: np.ndarray, D: int
) -> np.ndarray:
    """The device each token is shuffled to: its (nearest) table row's placement; rows that
    do not exist (unseen, no embeddings) keep their data-parallel device ``i mod D``."""
    idx, _ = table.rows(token_ids)
    return np.where(idx >= 0, token_dev_of_row[np.maximum(idx, 0)], np.arange(len(token_ids)) % D)


def comm_volume(
    experts: np.ndarray, expert_dev: np.ndarray, token_dev: np.ndarray, D: int, hidden_bytes: float
) -> dict:
    """Bytes per token of one MoE layer's dispatch + combine: tokens on ``token_dev``,
    experts on ``expert_dev``; ``home = i mod D`` is where data parallelism put token ``i``
    (s-MoE pays one shuffle from home to ``token_dev`` when they differ)."""
    n = len(experts)
    home = np.arange(n) % D
    dst = expert_dev[experts]  # [n, k]

    def a2a(src):
        remote = dst != src[:, None]
        per_expert = remote.sum()
        dedup = sum(len(set(d[r].tolist())) for d, r in zip(dst, remote))
        return 2 * per_expert * hidden_bytes / n, 2 * dedup * hidden_bytes / n

    ep, ep_dedup = a2a(home)
    sm, sm_dedup = a2a(token_dev)
    shuffle = (token_dev != home).sum() * hidden_bytes / n
    return {
        "ep": ep,
        "ep_dedup": ep_dedup,
        "smoe": sm + shuffle,
        "smoe_dedup": sm_dedup + shuffle,
        "shuffle": shuffle,
    }
