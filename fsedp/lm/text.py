"""Corpora and the tokenizer of the project's MoE LM.

The tokenizer is a byte-level BPE (Hugging Face ``tokenizers``) trained on the training
text only.  Corpora are read from the ``text/`` folder of a data folder the user names
(``--data DIR`` or ``$FSEDP_DATA``; the product assumes no location): WikiText-2
validation and the C4 sample to train on, WikiText-2 test held out.
"""

import os
from pathlib import Path

import numpy as np

from fsedp.errors import InputError
from fsedp.files import check_input_file, read_text

__all__ = [
    "data_dir",
    "TRAIN_FILES",
    "TEST_FILE",
    "read_text",
    "train_tokenizer",
    "load_tokenizer",
    "encode_file",
    "ASSETS",
]

ASSETS = Path(__file__).resolve().parent / "assets"
TRAIN_FILES = ("text/wikitext-2-valid.tokens", "text/c4-sample.txt")
TEST_FILE = "text/wikitext-2-test.tokens"


def data_dir(path=None) -> Path | None:
    """The data folder: ``path`` (``--data``), else ``$FSEDP_DATA``, else ``None``."""
    path = path or os.environ.get("FSEDP_DATA")
    return Path(path) if path else None


def train_tokenizer(texts: list[str], vocab: int):
    """Byte-level BPE with ``vocab`` entries (one special token, ``<|endoftext|>`` = 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(path=None):
    from tokenizers import Tokenizer

    path = Path(path) if path is not None else ASSETS / "tokenizer.json"
    check_input_file(path, "json")  # the read rule first: a FIFO would block the library
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception
        raise InputError(path, "<file>", f"not a tokenizer file ({e})") from None


def encode_file(tok, path, chunk_lines: int = 2000) -> np.ndarray:
    """Token ids of a text file (lines encoded in batches, joined as they are)."""
    lines = read_text(path, "text").splitlines(keepends=True)
    out = []
    for i in range(0, len(lines), chunk_lines):
        for enc in tok.encode_batch(["".join(lines[i : i + chunk_lines])]):
            out.extend(enc.ids)
    return np.asarray(out, dtype=np.int32)
