"""What the tests of prepare's maps share: a corpus of short texts and a small BPE trained on it at test time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

WORDS = [
    "the",
    "a",
    "shard",
    "loader",
    "packs",
    "tokens",
    "into",
    "batches",
    "of",
    "variable",
    "length",
    "across",
    "many",
    "ranks",
    "while",
    "the",
    "rest",
    "wait",
]


def corpus(n: int, seed: int) -> list[str]:
    """``n`` texts of 0 to 40 words (a few empty or blank)."""
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(0, 41)))) for _ in range(n)]
    texts[3] = "   "
    return texts


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus(200, 0), trainer=trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path
