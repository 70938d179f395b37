"""Chunk windows: a training order that reads each stored chunk about once per epoch.

With ``Batching(chunk_window=k)`` a rank's training order shuffles *chunks* (:func:`chunk_blocks`,
chunked by :func:`even_chunk_rows`, the rule the Zarr writer chunks by), cuts them into windows of
``k`` and shuffles the samples within each window (:func:`window_order`); batchers that reorder whole
batches order them by the window they complete in (:func:`window_batch_order`).

Guarantee: every sample of a chunk lies in one window, and the batcher still cuts the batches, so every
batching guarantee holds. The rule and its shuffle quality: docs/planning.md, "Chunk windows".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardload.errors import PlanError
from shardload.plan.options import Batching

__all__ = [
    "DEFAULT_CHUNK_WINDOW",
    "ChunkWindows",
    "chunk_blocks",
    "chunk_identity",
    "even_chunk_rows",
    "resolve_chunk_windows",
    "window_batch_order",
    "window_order",
]

#: Chunks per window when a set with chunks (Zarr) leaves ``Batching.chunk_window`` unset.
DEFAULT_CHUNK_WINDOW = 64


def even_chunk_rows(rows: int, per_chunk: int) -> int:
    """Rows per chunk of an array of ``rows`` rows chunked about every ``per_chunk`` rows.

    Zarr stores an edge chunk at full size, so the chunks are evened out to
    keep the padding of the last one below one row per chunk. The one rule
    for it: the Zarr writer chunks by it, the planner predicts chunks with it.

    >>> even_chunk_rows(10, 4), even_chunk_rows(3, 4), even_chunk_rows(0, 4)
    (4, 3, 1)
    """
    per_chunk = max(1, per_chunk)
    if rows <= per_chunk:
        return max(1, rows)
    return math.ceil(rows / math.ceil(rows / per_chunk))


@dataclass(frozen=True)
class ChunkWindows:
    """The resolved chunk-window option of one plan: ``rows`` per chunk (before evening out), ``window >= 1``."""

    rows: int
    window: int


def resolve_chunk_windows(batching: Batching, set_rows: int | None, *, shuffled: bool) -> ChunkWindows | None:
    """The chunk windows a plan uses, or ``None`` for a full shuffle.

    ``Batching.chunk_window`` ``0`` turns them off, ``k >= 1`` asks for
    windows of ``k`` chunks, ``None`` means the set's default: on
    (:data:`DEFAULT_CHUNK_WINDOW` chunks) for a set with chunks, off for
    others (``set_rows``: :attr:`PlanInputs.chunk_rows`). Only a shuffled
    stage uses them; packing never does.

    Raises:
        PlanError: windows asked for a set without chunks and no ``Batching.chunk_rows``.
    """
    window = batching.chunk_window
    rows = batching.chunk_rows if batching.chunk_rows is not None else set_rows
    if window is None:
        window = DEFAULT_CHUNK_WINDOW if set_rows is not None and not batching.packing else 0
    if not window or not shuffled:
        return None
    if rows is None:
        raise PlanError(
            f"Batching(chunk_window={window}) needs the rows per chunk, and this set has no chunks (Arrow): "
            "give Batching(chunk_rows=...) too, e.g. the value rows per chunk of the Zarr copy of the set"
        )
    return ChunkWindows(rows=rows, window=window)


def chunk_identity(windows: Sequence[ChunkWindows | None]) -> list[list[int] | None] | None:
    """``[rows, window]`` of each set's (each mixture source's) windows, ``None`` where it has none.

    What the plan fingerprint and a loader state's identity hold; ``None``
    when no set uses windows, so that such plans keep the digest they had
    before chunk windows existed.
    """
    if not any(windows):
        return None
    return [None if w is None else [w.rows, w.window] for w in windows]


def chunk_blocks(
    lengths: NDArray[np.integer],
    lens: NDArray[np.int64],
    shard_starts: NDArray[np.int64],
    segments: tuple[NDArray[np.int64], NDArray[np.int64]],
    rows: int,
) -> NDArray[np.int64]:
    """``(n,)`` the chunk of each of a rank's samples, numbered ``0, 1, ...`` in epoch order.

    Cost: one pass over the rank's lengths, plus the rest of the (at most two)
    shards the rank reads only part of. ``lens`` are the rank's lengths in
    epoch order, ``segments`` its runs
    (:meth:`~shardload.plan.assign.ShardLayout.rank_segments`), ``rows`` the
    value rows per chunk before evening out per shard.

    >>> lengths = np.array([2, 2, 2, 2, 1])  # one shard of 9 rows: chunks of 3 rows (9 // ceil(9 / 4))
    >>> chunk_blocks(lengths, lengths[1:], np.array([0, 5]), (np.array([1]), np.array([4])), 4).tolist()
    [0, 1, 2, 2]
    """
    starts, sizes = segments
    n = len(lens)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    ends = starts + sizes
    seg_first = np.concatenate([[0], np.cumsum(sizes)[:-1]])  # (k,) first sample of each run
    before_in_run = np.cumsum(lens) - lens  # (n,) rows before each sample, from the rank's first
    before_in_run -= np.repeat(before_in_run[seg_first], sizes)  # ... from its run's first
    shard = np.searchsorted(shard_starts, starts, side="right") - 1
    lo, hi = shard_starts[shard], shard_starts[shard + 1]
    before = np.zeros(len(starts), dtype=np.int64)  # rows of the shard before each run
    total = np.add.reduceat(lens, seg_first)  # rows of each run's shard
    for j in np.flatnonzero((starts != lo) | (ends != hi)).tolist():  # runs over part of a shard
        before[j] = int(np.sum(lengths[lo[j] : starts[j]], dtype=np.int64))
        total[j] += before[j] + int(np.sum(lengths[ends[j] : hi[j]], dtype=np.int64))
    grid = np.array([even_chunk_rows(int(t), rows) for t in total.tolist()], dtype=np.int64)
    chunk = (np.repeat(before, sizes) + before_in_run) // np.repeat(grid, sizes)
    new = np.ones(n, dtype=bool)  # a sample that starts another chunk, or another run
    new[1:] = chunk[1:] != chunk[:-1]
    new[seg_first] = True
    return np.cumsum(new, dtype=np.int64) - 1


def window_order(
    blocks: NDArray[np.int64], window: int, rng: np.random.Generator
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Shuffle chunks, cut them into windows of ``window``, shuffle samples within each window.

    Two draws from ``rng``: the chunk order, then the samples' keys. Returns
    ``(order, windows)``: ``(n,)`` positions into ``blocks``
    (:func:`chunk_blocks`) and ``(n,)`` the window of each, non-decreasing.
    """
    num_blocks = int(blocks[-1]) + 1 if len(blocks) else 0
    place = np.empty(num_blocks, dtype=np.int64)
    place[rng.permutation(num_blocks)] = np.arange(num_blocks, dtype=np.int64)  # each chunk's place in the order
    windows = place[blocks] // window  # (n,)
    order = np.lexsort((rng.random(len(blocks)), windows))
    return order.astype(np.int64), windows[order]


def window_batch_order(
    row_windows: NDArray[np.int64], offsets: NDArray[np.int64], rng: np.random.Generator
) -> NDArray[np.int64]:
    """``(num_batches,)`` an order of whole batches: by the window each completes in, shuffled within it.

    For batchers that gather a batch from all over the rank's order (length
    buckets): a batch is read once all its samples' windows have been
    reached. ``row_windows`` is ``(num_rows,)``, batch after batch; every batch is non-empty.

    >>> window_batch_order(np.array([0, 2, 1, 0]), np.array([0, 2, 3, 4]), np.random.default_rng(0)).tolist()
    [2, 1, 0]
    """
    num_batches = len(offsets) - 1
    if num_batches == 0:
        return np.zeros(0, dtype=np.int64)
    last = np.maximum.reduceat(row_windows, offsets[:-1])  # (num_batches,) the window each batch completes in
    return np.lexsort((rng.random(num_batches), last)).astype(np.int64)
