"""Which shards a plan reads, in which order, and the cache that takes.

:func:`read_sequence` turns a plan into its read sequence: batch by batch, the
distinct shards it touches, in order of first touch (filler rows count: the
loader reads them too). A node-local cache of a remote set looks ahead in it
(:mod:`shardload.remote.policy`); :func:`cache_bytes` and :func:`step_bytes`
size that cache. Pure numpy, no I/O.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from shardload.errors import PlanError

__all__ = ["cache_bytes", "read_sequence", "shards_of", "step_bytes"]


def shards_of(sample_ids: NDArray[np.int64], shard_starts: NDArray[np.int64]) -> NDArray[np.int64]:
    """``(n,)`` the shard of each sample id, given ``(S + 1,)`` shard offsets along sample ids."""
    out: NDArray[np.int64] = (np.searchsorted(shard_starts, sample_ids, side="right") - 1).astype(np.int64)
    return out


def read_sequence(
    sample_ids: NDArray[np.int64], batch_offsets: NDArray[np.int64], shard_starts: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The shards a plan reads: per batch, its distinct shards in order of first touch.

    Args:
        sample_ids: ``(rows,)`` the plan's sample ids (``RankPlan.sample_ids``).
        batch_offsets: ``(T + 1,)`` offsets of its batches (``RankPlan.batch_offsets``).
        shard_starts: ``(S + 1,)`` offsets of the shards along sample ids
            (``offsets_from_lengths(inputs.shard_sizes)``).

    Returns:
        ``(sequence, step_offsets)``: ``(n,)`` shard ids, and ``(T + 1,)``
        offsets of each batch's shards in ``sequence``. ``O(rows log rows)``.

    >>> seq, offs = read_sequence(np.array([5, 0, 6, 1, 9]), np.array([0, 3, 5]), np.array([0, 4, 8, 12]))
    >>> seq.tolist(), offs.tolist()  # batch 0 reads shards 1 then 0, batch 1 reads 0 then 2
    ([1, 0, 0, 2], [0, 2, 4])
    """
    shards = shards_of(np.asarray(sample_ids, dtype=np.int64), shard_starts)
    num_batches = len(batch_offsets) - 1
    batch = np.repeat(np.arange(num_batches, dtype=np.int64), np.diff(batch_offsets))  # (rows,) batch of each row
    num_shards = max(len(shard_starts) - 1, 1)
    _, first = np.unique(batch * num_shards + shards, return_index=True)  # first row of each (batch, shard)
    first.sort()  # rows are batch-major: row order is batch order, then first touch within the batch
    step_offsets = np.zeros(num_batches + 1, dtype=np.int64)
    np.cumsum(np.bincount(batch[first], minlength=num_batches), out=step_offsets[1:])
    return shards[first], step_offsets


def _checked_bytes(shard_bytes: NDArray[np.int64], sequence: NDArray[np.int64]) -> NDArray[np.int64]:
    sizes = np.asarray(shard_bytes, dtype=np.int64)
    if len(sequence) and int(sequence.max()) >= len(sizes):
        raise PlanError(
            f"shard_bytes has {len(sizes)} entries but the plan reads shard {int(sequence.max())}: give one "
            "size per shard of the set (or of the mixture, source after source)"
        )
    return sizes


def cache_bytes(sequence: NDArray[np.int64], shard_bytes: NDArray[np.int64]) -> int:
    """Bytes of the distinct shards in ``sequence``: the cache with which no shard is fetched twice."""
    sizes = _checked_bytes(shard_bytes, sequence)
    return int(sizes[np.unique(sequence)].sum())


def step_bytes(sequence: NDArray[np.int64], step_offsets: NDArray[np.int64], shard_bytes: NDArray[np.int64]) -> int:
    """The most bytes one batch reads: over batches, the bytes of the distinct shards it touches.

    A cache smaller than this cannot hold the shards of one batch of the rank
    at once (0 for a plan without batches).

    >>> step_bytes(np.array([1, 0, 2]), np.array([0, 2, 3]), np.array([10, 20, 40]))
    40
    """
    sizes = _checked_bytes(shard_bytes, sequence)
    if len(step_offsets) < 2:
        return 0
    per_read = np.concatenate([[0], np.cumsum(sizes[sequence])])  # (n + 1,) bytes before each read
    return int(np.diff(per_read[step_offsets]).max())
