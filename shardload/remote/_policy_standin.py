"""Stand-in for :mod:`shardload.remote.policy` (victim choice by next use) until that module is merged.

Same API and rule: :func:`next_uses` gives each shard's next use in a read
sequence, :func:`choose_victims` the cached shards to evict, farthest next use
first, never a pinned one. Delete this file once ``shardload/remote/policy.py``
is in, and import from there (``shardload/remote/cache.py``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

NEVER: int = 2**62


def next_uses(sequence: NDArray[np.int64], position: int, num_shards: int) -> NDArray[np.int64]:
    """``(num_shards,)`` index in ``sequence`` of each shard's next use at or after ``position``; NEVER if none."""
    seq = np.asarray(sequence, dtype=np.int64)
    out = np.full(num_shards, NEVER, dtype=np.int64)
    np.minimum.at(out, seq[position:], np.arange(position, len(seq), dtype=np.int64))
    return out


def choose_victims(
    cached: NDArray[np.int64],
    sizes: NDArray[np.int64],
    next_use: NDArray[np.int64],
    need_bytes: int,
    pinned: NDArray[np.bool_] | None = None,
) -> NDArray[np.int64]:
    """Cached shard ids to evict, farthest next use first, until ``need_bytes`` are freed; never a pinned one."""
    cached = np.asarray(cached, dtype=np.int64)
    if need_bytes <= 0:
        return np.zeros(0, dtype=np.int64)
    if pinned is not None:
        cached = cached[~pinned[cached]]
    ranked = cached[np.lexsort((-cached, -sizes[cached], -next_use[cached]))]
    count = int(np.searchsorted(np.cumsum(sizes[ranked]), need_bytes, side="left")) + 1
    return ranked[:count]
