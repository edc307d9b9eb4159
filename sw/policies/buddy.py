"""BuddyMoE (``001_95ae8307b42d2a8d.txt``): substitute a resident *buddy* for an expert that
is not on chip, behind accuracy-preserving gates (``docs/offload.md``).

Offline (Section 3.3): co-activation counts ``M_l(i, j)`` from a profiling trace, binary or
probability-weighted (``min(p~(i|x), p~(j|x))``), warm-up tokens down-weighted, Laplace
smoothing ``eps``; ``q_l(j | i)`` = row-normalised ``M_l``; the buddy list of ``i`` is the
shortest prefix of its peers sorted by ``q`` whose cumulative ``q`` reaches ``alpha_l``
(the Cumulative Frequency Threshold), at most ``k_max`` long, at least one.

Online, per token and layer, in the paper's order (Section 3.1):

1. **TAE gate**: ``TAE = -sum p~ log p~ / log k`` over the token's top-k, ``p~`` the top-k
   probabilities renormalised (optionally at temperature ``T``: ``p^(1/T)`` renormalised);
   substitution is forbidden when ``TAE <= tau`` (``tau`` fixed, or the ``tau_pct``
   percentile of the layer's TAE on the profiling trace), or when the margin
   ``p~_max - p~_2nd >= gamma``;
2. **residency gate**: ``delta`` = share of the step's requested experts that are not
   resident; no substitution in the step when ``delta >= beta``; or, with a transfer budget
   ``budget_bytes`` per step and layer, no substitution when the step's misses fit it (the
   paper relates beta to such a budget without fixing the rule; ours fetches the originals
   whenever the budget allows and substitutes only beyond it);
3. **buddy score** ``Psi(j | i, x) = q(j | i) (1 + eta z^_j(x)) (1 - kappa hop(j))``, each
   factor clipped at 0 (a far or unlikely buddy scores 0, never below a near one), times
   ``diversity`` for every earlier use of ``j`` by the same token (``z^`` = the router
   logit of ``j`` standardised over the experts, here ``log p`` standardised).  Algorithm 1
   forbids an expert the token already uses (``unique``, the default), which makes the
   diversity factor moot; with ``unique=False`` reuse is allowed and the factor discourages
   it, as Section 3.1 describes;
4. **substitution** (Algorithm 1): the token's missing experts, from the smallest routing
   weight up (so that a budget ``rho < k`` replaces the least important ones first, a
   decision the paper leaves open); for each, the best-scored resident buddy among the
   first ``H`` of its list that the token does not already use; at most ``rho``
   substitutions per token.  The substitute inherits the missing expert's routing weight.

:func:`substitute` is vectorised over tokens; :func:`algorithm1_loop` is the paper's
Algorithm 1 as a plain Python loop (no gates, first resident buddy), the reference the
vectorised (:func:`algorithm1_vectorized`) and compiled (:func:`algorithm1_compiled`,
numba) versions are checked and timed against.
"""

from dataclasses import dataclass

import numpy as np

from fsedp.errors import InputError
from fsedp.params import PARAMS
from fsedp.trace import pair_counts

__all__ = [
    "BuddyConfig",
    "BuddyProfile",
    "coactivation",
    "conditional",
    "buddy_lists",
    "tae",
    "substitute",
    "substitute_cold",
    "algorithm1_loop",
    "algorithm1_vectorized",
    "algorithm1_compiled",
    "random_substitute",
]


def coactivation(
    ids: np.ndarray,
    num_experts: int,
    weights: np.ndarray | None = None,
    warmup: int = 0,
    warmup_weight: float = 1.0,
) -> np.ndarray:
    """``M [E, E]`` of one layer from ``ids [N, k]`` (and renormalised top-k ``weights``
    for the probability-weighted count); the first ``warmup`` tokens count
    ``warmup_weight``."""
    ids = np.asarray(ids)
    n, k = ids.shape
    tw = np.ones(n)
    tw[:warmup] = warmup_weight
    return pair_counts(
        ids,
        ids,
        num_experts,
        other_slots=True,
        weight=lambda a, b: (
            tw if weights is None else tw * np.minimum(weights[:, a], weights[:, b])
        ),
    )


def conditional(m: np.ndarray, eps: float = 1e-3) -> np.ndarray:
    """``q(j | i)``: Laplace-smoothed ``M`` normalised over ``j != i``."""
    q = np.asarray(m, dtype=np.float64) + eps
    np.fill_diagonal(q, 0.0)
    tot = q.sum(1, keepdims=True)
    return np.divide(q, tot, out=np.zeros_like(q), where=tot > 0)


def buddy_lists(q: np.ndarray, alpha: float, k_max: int) -> list[np.ndarray]:
    """CFT buddy list of every expert (best first)."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], not {alpha}")
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, not {k_max}")
    out = []
    for i in range(len(q)):
        order = np.argsort(-q[i], kind="stable")
        order = order[order != i]
        t = int(np.searchsorted(np.cumsum(q[i][order]), alpha - 1e-12) + 1)
        out.append(order[: max(1, min(t, k_max))])
    return out


def tae(weights: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Token Activating Entropy of renormalised top-k ``weights [N, k]`` in [0, 1]."""
    w = np.asarray(weights, dtype=np.float64)
    k = w.shape[1]
    if k == 1:
        return np.zeros(len(w))
    if temperature != 1.0:
        w = np.power(np.maximum(w, 1e-30), 1.0 / temperature)
    w = w / w.sum(1, keepdims=True)
    h = -(w * np.log(np.maximum(w, 1e-30))).sum(1)
    return h / np.log(k)


@dataclass(frozen=True)
class BuddyConfig:
    """Knobs of BuddyMoE (defaults: the paper's defaults where it gives one)."""

    alpha: float = 0.95  # CFT coverage of a buddy list
    k_max: int = 16  # longest buddy list
    weighted: bool = False  # probability-weighted co-activation counts
    eps: float = 1e-3  # Laplace smoothing
    warmup: int = 0  # profiling tokens down-weighted
    warmup_weight: float = 0.5
    tau: float | None = None  # TAE threshold (None: the tau_pct percentile)
    tau_pct: float = 15.0  # percentile of the layer's TAE used as tau
    temperature: float = 1.0
    gamma: float | None = None  # probability-margin gate (None: off)
    beta: float | None = None  # residency gate (None: off)
    budget_bytes: float | None = None  # derive beta from a per-step transfer budget
    eta: float = 0.0  # local router compatibility
    kappa: float = 0.0  # cross-link penalty
    diversity: float = 0.5  # factor per earlier use of the same expert by the token
    unique: bool = True  # Algorithm 1: never pick an expert the token already uses
    search: int = 16  # H: buddies searched per missing expert
    rho: int | None = None  # replacement budget per token (None: unlimited)
    random_choice: bool = False  # control: a uniformly random resident expert instead of Psi
    seed: int = 0  # of random_choice

    def __post_init__(self):
        checks = [
            ("alpha", 0 < self.alpha <= 1),
            ("k_max", self.k_max >= 1),
            ("eps", self.eps >= 0),
            ("warmup", self.warmup >= 0),
            ("warmup_weight", 0 <= self.warmup_weight <= 1),
            ("tau", self.tau is None or 0 <= self.tau <= 1),
            ("tau_pct", 0 <= self.tau_pct <= 100),
            ("temperature", self.temperature > 0),
            ("gamma", self.gamma is None or 0 <= self.gamma <= 1),
            ("beta", self.beta is None or 0 <= self.beta <= 1),
            ("budget_bytes", self.budget_bytes is None or self.budget_bytes >= 0),
            ("eta", self.eta >= 0),
            ("kappa", 0 <= self.kappa <= 1),
            ("diversity", 0 <= self.diversity <= 1),
            ("search", self.search >= 1),
            ("rho", self.rho is None or self.rho >= 0),
        ]
        for name, ok in checks:
            if not ok:
                raise InputError(PARAMS, name, f"out of range: {getattr(self, name)!r}")


class BuddyProfile:
    """Offline part: per layer ``q`` and buddy lists (padded ``[E, K_max]`` table, -1 =
    none) and the calibrated ``tau``, from profiling routing ``ids [N, L, k]`` with
    renormalised ``weights [N, L, k]``."""

    def __init__(self, ids: np.ndarray, weights: np.ndarray, num_experts: int, cfg: BuddyConfig):
        self.cfg = cfg
        self.E = num_experts
        self.layers = ids.shape[1]
        self.q, self.lists, self.table, self.tau = [], [], [], []
        for l in range(self.layers):
            m = coactivation(
                ids[:, l],
                num_experts,
                weights[:, l] if cfg.weighted else None,
                cfg.warmup,
                cfg.warmup_weight,
            )
            q = conditional(m, cfg.eps)
            lists = buddy_lists(q, cfg.alpha, cfg.k_max)
            tab = np.full((num_experts, cfg.k_max), -1, dtype=np.int64)
            for i, b in enumerate(lists):
                tab[i, : len(b)] = b
            self.q.append(q)
            self.lists.append(lists)
            self.table.append(tab)
            t = (
                cfg.tau
                if cfg.tau is not None
                else float(np.percentile(tae(weights[:, l], cfg.temperature), cfg.tau_pct))
            )
            self.tau.append(t)

    def list_sizes(self) -> list[float]:
        return [float(np.mean([len(b) for b in lists])) for lists in self.lists]


def _bypass(cfg: BuddyConfig, requested: int, missing: int, unit_bytes: float | None) -> bool:
    """The residency gate.  Fixed ``beta``: no substitution in a step whose share of
    requested experts off chip is ``>= beta`` (broad replacement compounds errors).  With a
    transfer budget: no substitution when the step's misses fit ``budget_bytes`` (fetching
    the originals is affordable), substitution only for the steps that would exceed it [D]."""
    if cfg.budget_bytes is not None and unit_bytes:
        return missing * unit_bytes <= cfg.budget_bytes
    return cfg.beta is not None and requested > 0 and missing / requested >= cfg.beta


def substitute(
    prof: BuddyProfile,
    layer: int,
    ids: np.ndarray,
    weights: np.ndarray,
    probs: np.ndarray,
    resident: np.ndarray,
    hop: np.ndarray | None = None,
    unit_bytes: float | None = None,
) -> tuple[np.ndarray, dict]:
    """Vectorised online BuddyMoE for one step at one layer; returns the new ids and counts
    of what each gate did."""
    cfg = prof.cfg
    ids = np.array(ids, dtype=np.int64, copy=True)
    n, k = ids.shape
    info = {
        "tokens": n,
        "missing": int((~resident[ids]).sum()),
        "tae_blocked": 0,
        "margin_blocked": 0,
        "residency_bypass": 0,
        "substituted": 0,
        "no_buddy": 0,
    }
    if info["missing"] == 0:
        return ids, info
    requested = np.unique(ids)
    if _bypass(cfg, len(requested), int((~resident[requested]).sum()), unit_bytes):
        info["residency_bypass"] = 1
        return ids, info
    t = tae(weights, cfg.temperature)
    allow = t > prof.tau[layer]
    info["tae_blocked"] = int((~allow & (~resident[ids]).any(1)).sum())
    if cfg.gamma is not None and k > 1:
        srt = -np.sort(-weights, axis=1)
        margin_ok = (srt[:, 0] - srt[:, 1]) < cfg.gamma
        info["margin_blocked"] = int((allow & ~margin_ok & (~resident[ids]).any(1)).sum())
        allow &= margin_ok
    q = prof.q[layer]
    table = prof.table[layer][:, : cfg.search]
    E = prof.E
    used = np.zeros((n, E), dtype=bool)
    used[np.arange(n)[:, None], ids] = True
    picks = used.astype(np.float64)
    budget = np.full(n, cfg.rho if cfg.rho is not None else k)
    z = None
    if cfg.eta:
        lp = np.log(np.maximum(probs, 1e-30))
        z = (lp - lp.mean(1, keepdims=True)) / (lp.std(1, keepdims=True) + 1e-9)
    rows = np.arange(n)
    if cfg.random_choice:  # every expert is a candidate, with a random score
        table = np.tile(np.arange(E), (E, 1))
        rng = np.random.default_rng(cfg.seed + layer * 7919 + int(ids.sum()))
    # missing experts are visited from the smallest routing weight up, so that a budget
    # rho < k is spent on the least important experts first [D]
    order = np.argsort(weights, axis=1, kind="stable")
    for j in range(k):
        r = order[:, j]
        e = ids[rows, r]
        want = allow & ~resident[e] & (budget > 0)
        if not want.any():
            continue
        cand = table[e]  # [n, H]
        valid = cand >= 0
        c = np.where(valid, cand, 0)
        ok = valid & resident[c]
        if cfg.unique:
            ok &= ~used[rows[:, None], c]
        if cfg.random_choice:  # the control: uniform over the candidates, no factor
            score = rng.random(c.shape)
        else:
            score = q[e[:, None], c]
            if z is not None:
                score = score * (1 + cfg.eta * np.clip(z[rows[:, None], c], -1 / cfg.eta, None))
            if hop is not None and cfg.kappa:
                score = score * np.maximum(1 - cfg.kappa * hop[c], 0.0)
            score = score * np.power(cfg.diversity, picks[rows[:, None], c])
        score = np.where(ok, score, -np.inf)
        best = score.argmax(1)
        found = want & np.isfinite(score[rows, best])
        info["no_buddy"] += int((want & ~found).sum())
        sel = c[rows, best]
        f = np.nonzero(found)[0]
        ids[f, r[f]] = sel[f]
        used[f, sel[f]] = True
        picks[f, sel[f]] += 1
        budget[f] -= 1
        info["substituted"] += len(f)
    return ids, info


def substitute_cold(
    prof: BuddyProfile,
    layer: int,
    ids: np.ndarray,
    weights: np.ndarray,
    probs: np.ndarray,
    theta: int,
    cap: int | None = None,
) -> tuple[np.ndarray, dict]:
    """BuddyMoE on the chip's DDR path, for the tokens of one iteration at one layer.

    The chip streams every expert its tokens select from DDR.  An expert with more than
    ``theta`` of the iteration's tokens is streamed anyway: it is *resident* for BuddyMoE.
    A *cold* one (``1..theta`` tokens) is a miss, and :func:`substitute` (with its TAE,
    margin and budget ``rho`` gates) may give its tokens a resident buddy instead.  A cold
    expert is only worth substituting when **all** its tokens move, because one token left
    on it loads the whole expert: those substitutions are undone [D].  ``cap`` (the
    iteration-level budget, [D]): at most ``cap`` cold experts are saved per iteration and
    layer, those whose moved tokens carry the least routing weight on them; the others are
    kept whole.  Returns the new ids and ``info``: the gate counts of :func:`substitute`,
    ``saved`` (cold experts no longer loaded), ``kept`` (cold experts still loaded) and
    ``substituted`` (token-expert pairs moved to a buddy)."""
    ids = np.asarray(ids, dtype=np.int64)
    counts = np.bincount(ids.ravel(), minlength=prof.E)
    resident = counts > theta
    new, info = substitute(prof, layer, ids, weights, probs, resident)
    left = np.bincount(new.ravel(), minlength=prof.E)  # tokens still on each expert
    cold = np.nonzero((counts > 0) & ~resident)[0]
    kept = cold[left[cold] > 0]
    if cap is not None:
        saved = cold[left[cold] == 0]
        if len(saved) > cap:
            w = np.asarray(weights, dtype=np.float64)
            cost = np.array([w[ids == e].sum() for e in saved])
            over = saved[np.argsort(cost, kind="stable")[cap:]]  # the dearest ones stay
            kept = np.sort(np.concatenate([kept, over]))
    if len(kept):  # a cold expert still loaded: its tokens keep it, no substitution
        undo = np.isin(ids, kept) & (new != ids)
        new[undo] = ids[undo]
    moved = new != ids
    info = dict(info)
    info["substituted"] = int(moved.sum())
    info["saved"] = int(len(cold) - len(kept))
    info["kept"] = int(len(kept))
    info["cold"] = int(len(cold))
    return new, info


def random_substitute(
    ids: np.ndarray, resident: np.ndarray, rng: np.random.Generator, rho: int | None = None
) -> tuple[np.ndarray, int]:
    """Replace each missing expert by a uniformly drawn resident expert the token does not
    use (the paper's random baseline), at most ``rho`` per token (vectorised over tokens)."""
    ids = np.array(ids, dtype=np.int64, copy=True)
    n, k = ids.shape
    rows = np.arange(n)
    used = np.zeros((n, len(resident)), dtype=bool)
    used[rows[:, None], ids] = True
    budget = np.full(n, rho if rho is not None else k)
    count = 0
    for r in range(k):
        want = ~resident[ids[:, r]] & (budget > 0)
        if not want.any():
            continue
        score = np.where(resident[None, :] & ~used, rng.random((n, len(resident))), -1.0)
        pick = score.argmax(1)
        f = np.nonzero(want & (score[rows, pick] >= 0))[0]
        ids[f, r] = pick[f]
        used[f, pick[f]] = True
        budget[f] -= 1
        count += len(f)
    return ids, count


def algorithm1_loop(S: np.ndarray, M: np.ndarray, B: np.ndarray, H: int) -> np.ndarray:
    """Algorithm 1 of the paper, literally: plain Python loops."""
    S2 = S.copy()
    T, K = S.shape
    for t in range(T):
        U = set(S2[t].tolist())
        for k in range(K):
            e = S2[t, k]
            if not M[e]:
                for r in range(min(H, B.shape[1])):
                    b = B[e, r]
                    if b >= 0 and M[b] and b not in U:
                        S2[t, k] = b
                        U.add(b)
                        break
    return S2


def algorithm1_vectorized(S: np.ndarray, M: np.ndarray, B: np.ndarray, H: int) -> np.ndarray:
    """Algorithm 1 vectorised over tokens (the same result as :func:`algorithm1_loop`)."""
    S2 = np.array(S, dtype=np.int64, copy=True)
    T, K = S2.shape
    E = len(M)
    rows = np.arange(T)
    used = np.zeros((T, E), dtype=bool)
    used[rows[:, None], S2] = True
    tab = B[:, :H]
    for k in range(K):
        e = S2[:, k]
        miss = ~M[e]
        if not miss.any():
            continue
        cand = tab[e]
        c = np.where(cand >= 0, cand, 0)
        ok = (cand >= 0) & M[c] & ~used[rows[:, None], c]
        first = ok.argmax(1)
        hit = miss & ok[rows, first]
        f = np.nonzero(hit)[0]
        S2[f, k] = c[f, first[f]]
        used[f, S2[f, k]] = True
    return S2


def algorithm1_compiled(S: np.ndarray, M: np.ndarray, B: np.ndarray, H: int) -> np.ndarray:
    """Algorithm 1 compiled with numba (:mod:`.buddy_kernel`; the same result as
    :func:`algorithm1_loop`): ``S [T, K]`` expert ids, ``M [E]`` residency, ``B [E, L]``
    buddy lists (-1 padded), the first ``H`` of each searched."""
    from fsedp.sw.policies.buddy_kernel import algorithm1

    S = np.ascontiguousarray(S, dtype=np.int64)
    M = np.ascontiguousarray(M, dtype=np.bool_)
    B = np.ascontiguousarray(B, dtype=np.int64)
    if S.ndim != 2 or B.ndim != 2 or M.ndim != 1 or len(B) != len(M):
        raise ValueError(f"shapes S {S.shape}, M {M.shape}, B {B.shape} do not fit")
    out = np.empty_like(S)
    made = algorithm1(S, M, B, int(H), out)
    if made == -1:
        raise ValueError(f"expert ids must be in 0..{len(M) - 1}")
    if made == -2:
        raise ValueError(f"buddy ids must be in -1..{len(M) - 1}")
    return out
