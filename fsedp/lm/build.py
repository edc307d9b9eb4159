"""``fsedp lm train`` / ``fsedp lm eval``: the reproducible build of the committed model and
its measurement (held-out WikiText-2 test perplexity against the n-gram baselines)."""

import time
from pathlib import Path

import numpy as np

from fsedp import jsondoc
from fsedp.errors import InputError
from fsedp.files import atomic_path
from fsedp.lm.baselines import bigram_perplexity, unigram_perplexity
from fsedp.lm.config import LMConfig
from fsedp.lm.model import MoELM
from fsedp.lm.text import (
    TEST_FILE,
    TRAIN_FILES,
    data_dir,
    encode_file,
    load_tokenizer,
    read_text,
    train_tokenizer,
)

__all__ = ["train_command", "evaluate", "need_window", "perplexity", "record_routing"]


def need_window(model: MoELM, option: str, tokens: int | None, what: str = "test tokens"):
    """Refuse a count of tokens (an option's value; ``None``: all) holding no window of the
    LM's context: every evaluation and profile runs whole windows, so it would use none."""
    c = model.cfg.context
    if tokens is not None and tokens < c:
        raise InputError(
            "<command line>",
            option,
            f"{tokens} {what} hold no window of the LM's context of {c} tokens, so none would "
            f"be used: at least {c}",
        )


def _need_tokens(ids: np.ndarray, model: MoELM, source, what: str = "held-out tokens"):
    """Refuse token ids (of the file ``source``) holding no whole window to predict: none,
    or fewer than the LM's context and the token after it."""
    c = model.cfg.context
    if not len(ids):
        raise InputError(source, "<file>", f"no {what} (empty): nothing to evaluate")
    if len(ids) < c + 1:
        raise InputError(
            source,
            "<file>",
            f"{len(ids)} {what}: fewer than one window of the LM's context of {c} tokens and "
            "the token after it, so nothing would be evaluated",
        )


def _need_vocab(tok, model: MoELM, option: str):
    """Refuse a tokenizer whose ids the model cannot embed."""
    n = tok.get_vocab_size()
    if n > model.cfg.vocab:
        raise InputError(
            "<command line>",
            option,
            f"the tokenizer has {n} entries, more than the {model.cfg.vocab} of the model's "
            "vocabulary",
        )


def perplexity(model: MoELM, ids, hooks=None, source="<held-out tokens>") -> float:
    """``model``'s perplexity on ``ids`` (whole windows of its context), refused on one line
    when they hold no window: a perplexity over no token is not 1, it is undefined."""
    total, count = model.nll(ids, hooks)
    if not count:
        _need_tokens(np.asarray(ids), model, source)
    return float(np.exp(total / count))


def _need_data(root: Path | None, rel: str) -> Path:
    if root is None:
        raise InputError(
            "<command line>",
            "--data",
            "this command reads text corpora: name "
            "their folder with --data DIR or FSEDP_DATA (the folder holding text/)",
        )
    p = root / rel
    if not p.exists():
        raise InputError(p, "<file>", "missing: the corpora are read from the --data folder")
    return p


def train_stream(tok, root: Path) -> np.ndarray:
    eot = tok.token_to_id("<|endoftext|>")
    parts = []
    for rel in TRAIN_FILES:
        parts.append(encode_file(tok, _need_data(root, rel)))
        parts.append(np.asarray([eot], dtype=np.int32))
    return np.concatenate(parts)


def train_command(out: Path, cfg: LMConfig, tc, log=print, data=None) -> dict:
    from fsedp.lm.train import train

    root = data_dir(data)
    t0 = time.time()
    tok = train_tokenizer([read_text(_need_data(root, r), "text") for r in TRAIN_FILES], cfg.vocab)
    ids = train_stream(tok, root)
    log(
        f"tokenizer: {tok.get_vocab_size()} entries; training stream {len(ids)} tokens "
        f"({time.time() - t0:.0f} s)"
    )
    weights, history = train(cfg, tc, ids, log=log)
    model = MoELM(cfg, weights)
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "moe_lm.npz")
    with atomic_path(out / "tokenizer.json") as tmp:
        tok.save(str(tmp))
    info = {
        "config": cfg.as_dict(),
        "train": tc.as_dict(),
        "history": history,
        "train_tokens": int(len(ids)),
        "seconds": round(time.time() - t0, 1),
    }
    with atomic_path(out / "training.json") as tmp:
        tmp.write_text(jsondoc.dumps(info, indent=1) + "\n")
    return info


def evaluate(weights=None, tokenizer=None, max_tokens: int | None = None, data=None) -> dict:
    """Held-out WikiText-2 test perplexity of the model (fp16 weights as committed) and of
    the unigram and bigram baselines estimated on the training stream."""
    root = data_dir(data)
    test_file = _need_data(root, TEST_FILE)  # the corpora are named before anything loads
    for rel in TRAIN_FILES:
        _need_data(root, rel)
    model = MoELM.load(weights)
    need_window(model, "--max-tokens", max_tokens)
    tok = load_tokenizer(tokenizer)
    _need_vocab(tok, model, "--tokenizer" if tokenizer else "--weights")
    test = encode_file(tok, test_file)
    if max_tokens:
        test = test[: max_tokens + 1]
    _need_tokens(test, model, test_file)
    train = train_stream(tok, root)
    t0 = time.time()
    ppl = perplexity(model, test, source=test_file)
    return {
        "tokens": int(len(test) - 1),
        "moe_lm": round(ppl, 3),
        "unigram": round(unigram_perplexity(train, test, model.cfg.vocab), 3),
        "bigram": round(bigram_perplexity(train, test, model.cfg.vocab), 3),
        "eval_seconds": round(time.time() - t0, 1),
        "parameters": model.parameters,
    }


def record_routing(max_tokens: int = 8192, weights=None, tokenizer=None, data=None):
    """The model's routing on the first ``max_tokens`` held-out WikiText-2 test tokens,
    windows of ``context`` tokens as requests (probabilities of the chosen experts from
    the router's softmax over all experts)."""
    from fsedp.trace import RoutingTrace

    root = data_dir(data)
    test_file = _need_data(root, TEST_FILE)  # the corpus is named before anything loads
    model = MoELM.load(weights)
    n = model.cfg.context
    need_window(model, "--max-tokens", max_tokens)
    tok = load_tokenizer(tokenizer)
    _need_vocab(tok, model, "--tokenizer" if tokenizer else "--weights")
    test = encode_file(tok, test_file)
    if len(test) < n:
        raise InputError(
            test_file,
            "<file>",
            f"{len(test)} held-out tokens: fewer than one window of the LM's context of {n} "
            "tokens, so no routing would be recorded",
        )
    windows = min(max_tokens // n, len(test) // n)
    ids = test[: windows * n].reshape(windows, n)
    experts, scores = [], []
    for s in range(0, windows, 16):
        from fsedp.lm.model import Routing

        rec = Routing()
        model.forward(ids[s : s + 16], routing=rec)
        experts.append(np.stack(rec.ids, 1))
        scores.append(
            np.stack([np.take_along_axis(p, i, 1) for p, i in zip(rec.probs, rec.ids)], 1)
        )
    flat = windows * n
    return RoutingTrace(
        experts=np.concatenate(experts),
        scores=np.concatenate(scores),
        token_ids=ids.reshape(-1),
        request=np.arange(flat) // n,
        position=np.arange(flat) % n,
        num_experts=model.cfg.experts,
        name="moe-lm:wikitext-2-test",
    )
