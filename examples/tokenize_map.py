"""The configured map of ``examples/text_lm.py``: a tokenizer loaded once per worker, records cut into pieces.

``shardload prepare`` calls :func:`make_encoder` once in each worker process
with the ``--map-arg`` / ``--map-file`` arguments, and applies the function it
returns to every JSON Lines record::

    shardload prepare web.jsonl -o sets/web-train --workers 2 \\
        --map-factory examples/tokenize_map.py:make_encoder --map-file tokenizer=tokenizer.json \\
        --map-arg max_tokens=128 --map-arg split=train --map-arg val_percent=10

(in Python: ``shardload.prepare("web.jsonl", "sets/web-train", workers=2,
map_factory=tokenize_map.make_encoder, map_files={"tokenizer": "tokenizer.json"},
map_args={"max_tokens": 128, "split": "train", "val_percent": 10})``, the same set).
The run records the factory, the arguments and the tokenizer file's sha256 in
the manifest (``options.map_factory``, ``options.map_args``,
``options.map_files``), so ``--resume`` refuses a changed tokenizer, and
``examples/text_lm.py`` reuses a set only when they match. Only the token ids
are kept: a record's text, stored beside its tokens, would be stored again
in every piece.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

Sample = dict[str, Any]

#: the token that ends every record, so that the model learns where a document ends
END_OF_TEXT = "<|endoftext|>"


def in_validation(text: str, val_percent: int) -> bool:
    """Whether a record belongs to the held-out validation split: a hash of its text, so the same on every run."""
    return zlib.crc32(text.encode("utf-8")) % 100 < val_percent


def make_encoder(
    tokenizer: str, max_tokens: int = 128, split: str = "train", val_percent: int = 10
) -> Callable[[Sample], list[Sample] | None]:
    """Make the map: load ``tokenizer`` (a ``tokenizer.json``) once, return the function applied to each record.

    Args:
        tokenizer: a Hugging Face ``tokenizers`` file (given with ``--map-file``, so its sha256 is recorded).
        max_tokens: the longest piece; a longer record becomes several samples of at most this many tokens
            (``ShardSet.origin(i)`` names the record and the piece: ``web.jsonl: line 7, piece 2 of 3``).
        split: ``"train"`` keeps the records outside the held-out share, ``"val"`` the records inside it.
        val_percent: the share of records held out for validation, by a hash of their text.
    """
    from tokenizers import Tokenizer

    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    tok = Tokenizer.from_file(tokenizer)
    end = tok.token_to_id(END_OF_TEXT)
    if end is None:
        raise ValueError(f"{tokenizer}: the tokenizer has no {END_OF_TEXT!r} token")

    def encode(record: Sample) -> list[Sample] | None:
        text = record["text"]
        if not text.strip() or in_validation(text, val_percent) != (split == "val"):
            return None  # dropped: counted in the prepare summary, not an error
        ids = np.asarray([*tok.encode(text).ids, end], dtype=np.int32)
        return [{"input_ids": ids[i : i + max_tokens]} for i in range(0, len(ids), max_tokens)]

    return encode
