"""Decide which samples go to which shard: balanced counts, optionally tokens.

Pure numpy, no I/O. Input positions are sample positions in source order; the
output is the order in which they are written, cut into shards.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths


def count_shards(num_samples: int, total_bytes: int, *, shard_size: int, num_shards: int | None) -> int:
    """How many shards: ``num_shards`` if given, else enough for ``shard_size`` bytes each."""
    if num_samples == 0:
        return 0
    n = num_shards if num_shards is not None else max(1, math.ceil(total_bytes / shard_size))
    return min(n, num_samples)


def assign_samples(
    lengths: NDArray[np.integer],
    num_shards: int,
    *,
    balance: str = "samples",
    shuffle: bool = True,
    seed: int = 0,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Lay samples out in shards.

    Guarantee: shard sample counts differ by at most one. With ``balance="tokens"``, samples are dealt
    longest-first in a snake order (0..S-1, S-1..0, ...), so shard token totals differ by at most the
    longest sample.

    Returns:
        order: ``(num_samples,)`` source positions in output order.
        bounds: ``(num_shards + 1,)`` offsets into ``order`` of each shard.
    """
    n = len(lengths)
    rng = np.random.default_rng([seed, 0x5A4D])
    if balance == "tokens" and num_shards > 1:
        # Random tie-break keeps equal lengths from landing in source order.
        tiebreak = rng.permutation(n) if shuffle else np.arange(n)
        by_length = np.lexsort((tiebreak, -np.asarray(lengths, dtype=np.int64)))
        p = np.arange(n)
        rnd, j = np.divmod(p, num_shards)
        shard_of = np.where(rnd % 2 == 0, j, num_shards - 1 - j)
        shard_per_sample = np.empty(n, dtype=np.int64)
        shard_per_sample[by_length] = shard_of
        # Within a shard: random order if shuffling, source order otherwise.
        within = rng.permutation(n) if shuffle else np.arange(n)
        order = np.lexsort((within, shard_per_sample)).astype(np.int64)
        counts = np.bincount(shard_per_sample, minlength=num_shards)
    else:
        order = rng.permutation(n).astype(np.int64) if shuffle else np.arange(n, dtype=np.int64)
        k = np.arange(num_shards + 1, dtype=np.int64)
        bounds = (k * n) // max(num_shards, 1)
        return order, bounds
    return order, offsets_from_lengths(counts)
