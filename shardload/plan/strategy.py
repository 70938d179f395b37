"""Which batcher a :class:`~shardload.plan.Batching` asks for, and the memo key of a layout.

Shared by the planner (one shard set) and the mixture's batcher (one batcher
per source, :mod:`shardload.plan.mix.batcher`), so that both choose the strategy
by the same rule.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numpy.typing import NDArray

from shardload.plan.assign import ShardLayout
from shardload.plan.batcher import Batcher
from shardload.plan.buckets import BucketBatcher
from shardload.plan.chunks import ChunkWindows
from shardload.plan.fixed import FixedSizeBatcher
from shardload.plan.greedy import GreedyTokenBatcher
from shardload.plan.options import Batching
from shardload.plan.packing.pack import PackBatcher

__all__ = ["layout_key", "make_batcher"]


def layout_key(layout: ShardLayout) -> str:
    """Digest of an epoch's shard order and rank ranges (what a rank's samples are)."""
    digest = hashlib.sha1(layout.order.astype("<i8").tobytes(), usedforsecurity=False)
    digest.update(layout.rank_starts.astype("<i8").tobytes())
    return digest.hexdigest()


def make_batcher(
    batching: Batching,
    *,
    lengths: NDArray[np.integer],
    layout: ShardLayout,
    shuffle: bool,
    seed: int,
    epoch: int,
    max_length: int,
    chunks: ChunkWindows | None = None,
) -> Batcher:
    """The strategy for these options: packing, length buckets, fixed chunks or greedy fill.

    ``chunks``: the training order's chunk windows (:func:`~shardload.plan.chunks.resolve_chunk_windows`).
    """
    if batching.packing:
        cls: type[Batcher] = PackBatcher
    elif batching.bucketing:
        cls = BucketBatcher
    elif batching.batch_size is not None:
        cls = FixedSizeBatcher
    else:
        cls = GreedyTokenBatcher
    return cls(lengths, layout, batching, shuffle=shuffle, seed=seed, epoch=epoch, max_length=max_length, chunks=chunks)
