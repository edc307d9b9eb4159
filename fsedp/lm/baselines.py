"""N-gram baselines on the same tokens as the MoE LM: an add-one unigram and a Witten-Bell
interpolated bigram, both estimated on the training stream."""

import numpy as np

from fsedp.errors import InputError

__all__ = ["unigram_perplexity", "bigram_perplexity"]


def _need_pairs(test: np.ndarray):
    """A perplexity over no predicted token is undefined: refused, not 1 or NaN."""
    if len(test) < 2:
        raise InputError("<held-out tokens>", "<file>", f"{len(test)} tokens: no token to evaluate")


def _unigram(train: np.ndarray, vocab: int) -> np.ndarray:
    counts = np.bincount(train, minlength=vocab).astype(np.float64)
    return (counts + 1) / (counts.sum() + vocab)


def unigram_perplexity(train: np.ndarray, test: np.ndarray, vocab: int) -> float:
    _need_pairs(test)
    p = _unigram(train, vocab)
    return float(np.exp(-np.log(p[test[1:]]).mean()))


def bigram_perplexity(train: np.ndarray, test: np.ndarray, vocab: int) -> float:
    """P(w | v) = (c(v, w) + T(v) P_uni(w)) / (c(v) + T(v)), ``T(v)`` = distinct successors."""
    _need_pairs(test)
    uni = _unigram(train, vocab)
    pair = train[:-1].astype(np.int64) * vocab + train[1:]
    keys, counts = np.unique(pair, return_counts=True)
    ctx = np.bincount(train[:-1], minlength=vocab).astype(np.float64)
    types = np.bincount(keys // vocab, minlength=vocab).astype(np.float64)
    q = test[:-1].astype(np.int64) * vocab + test[1:]
    pos = np.searchsorted(keys, q)
    pos[pos == len(keys)] = 0
    c = np.where(keys[pos] == q, counts[pos], 0).astype(np.float64)
    v, w = test[:-1], test[1:]
    denom = ctx[v] + types[v]
    p = np.where(denom > 0, (c + types[v] * uni[w]) / np.maximum(denom, 1), uni[w])
    return float(np.exp(-np.log(p).mean()))
