"""Length-bucketed batches (``bucketing=True``, with batch_size or max_tokens).

Bucket ``j`` takes ``rows_j`` rows a batch (:func:`bucket_bounds`), so any
batch drawn from it keeps the budget; the remainders, longest first, are cut
greedily (:func:`chunk_remainders`), which keeps it too because all later ones
are shorter. A rank's count depends only on how many of its samples fall in
each bucket: :func:`count_rank_buckets` gets that table for every rank in one
pass. The rule in full: docs/planning.md ("Length buckets").
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths, range_positions
from shardload.plan.assign import ShardLayout
from shardload.plan.batcher import Batcher, Batches, chunk_offsets
from shardload.plan.options import Batching, padded_length

__all__ = [
    "BucketBatcher",
    "bucket_bounds",
    "bucket_ids",
    "chunk_remainders",
    "count_rank_buckets",
]

_CHUNK = 1 << 18  # samples per pass step: temporaries stay in cache (measured best)
_LUT_LIMIT = 1 << 22  # longest length for which a length -> bucket table is built


def bucket_bounds(max_length: int, batching: Batching) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(upper, rows)``, each ``(B,)``: bucket upper bounds and rows per batch.

    ``upper[j]`` is the largest padded length of bucket ``j``, increasing,
    multiples of ``pad_to_multiple_of``; the last is the longest padded length
    (``max_length``: of the whole index), unless the budget stops the bounds
    first at a one-row bucket that takes everything longer.

    >>> upper, rows = bucket_bounds(40, Batching(max_tokens=64, pad_to_multiple_of=8))
    >>> upper.tolist(), rows.tolist()
    ([8, 16, 24, 32, 40], [8, 4, 2, 2, 1])
    """
    budget, step = batching.max_tokens, batching.pad_to_multiple_of
    top = max(padded_length(max_length, step), step)
    upper = [step]
    while upper[-1] < top and (budget is None or budget // upper[-1] > 1):
        grown = int(upper[-1] * batching.bucket_ratio) // step * step
        # the last bound is exactly the longest padded length: equal lengths fill the budget
        upper.append(min(max(upper[-1] + step, grown), top))
    bounds = np.asarray(upper, dtype=np.int64)  # (B,)
    if budget is None:
        assert batching.batch_size is not None
        return bounds, np.full(len(bounds), batching.batch_size, dtype=np.int64)
    rows = np.maximum(budget // bounds, 1)  # (B,)
    if batching.max_rows is not None:
        rows = np.minimum(rows, batching.max_rows)
    return bounds, rows


def length_table(upper: NDArray[np.int64], max_length: int) -> NDArray[np.int64] | None:
    """``(max_length + 1,)`` bucket of every length, or ``None`` if too long to tabulate."""
    if max_length > _LUT_LIMIT:
        return None
    return bucket_ids(np.arange(max_length + 1, dtype=np.int64), upper, None)


def bucket_ids(
    lens: NDArray[np.integer], upper: NDArray[np.int64], table: NDArray[np.int64] | None
) -> NDArray[np.int64]:
    """``(n,)`` bucket of each length in ``lens`` (``(n,)``).

    A raw length ``l`` pads to at most ``u`` exactly when ``l <= u``, because
    every bound is a multiple of ``pad_to_multiple_of``.
    """
    if table is not None:
        found: NDArray[np.int64] = table[lens]
        return found
    return np.minimum(np.searchsorted(upper, lens, side="left"), len(upper) - 1).astype(np.int64)


def count_rank_buckets(
    lengths: NDArray[np.integer],
    layout: ShardLayout,
    upper: NDArray[np.int64],
    table: NDArray[np.int64] | None,
) -> NDArray[np.int64]:
    """``(W, B)`` how many samples of each rank fall in each bucket, in one pass.

    Cost: O(N) vectorised, in cache-sized chunks read in sample-id order
    (sequential reads of a memory-mapped index), plus O(S + W).
    """
    world, num_buckets = layout.world_size, len(upper)
    starts, sizes, ranks = layout.pieces()  # (P,) runs of one rank, in sample-id order
    ends = starts + sizes
    counts = np.zeros(world * num_buckets, dtype=np.int64)
    chunk = max(_CHUNK, 4 * world * num_buckets)  # keep adding up `counts` a small cost
    for lo in range(0, layout.num_samples, chunk):
        hi = min(layout.num_samples, lo + chunk)
        first = int(np.searchsorted(ends, lo, side="right"))
        stop = int(np.searchsorted(starts, hi, side="left"))
        run = np.minimum(ends[first:stop], hi) - np.maximum(starts[first:stop], lo)
        key = np.repeat(ranks[first:stop] * num_buckets, run)  # (hi - lo,) rank * B + bucket
        key += bucket_ids(lengths[lo:hi], upper, table)
        counts += np.bincount(key, minlength=world * num_buckets)
    return counts.reshape(world, num_buckets)


def chunk_remainders(
    left: NDArray[np.int64], rows: NDArray[np.int64]
) -> tuple[NDArray[np.int64], list[NDArray[np.int64]]]:
    """Cut bucket remainders into batches, for many ranks at once.

    Each rank's remainders are laid out bucket after bucket in the order
    given (longest first). A batch starting at a sample of bucket ``j`` takes
    ``rows[j]`` samples (fewer at the end). Since each remainder is smaller
    than its ``rows``, every batch finishes at least one bucket: the loop runs
    at most ``B`` times, each step vectorised over ranks. ``left`` is
    ``(R, B)``, ``rows`` ``(B,)``, both longest bucket first.

    Returns:
        ``(counts, starts)``: ``(R,)`` batches per rank, and one ``(R,)``
        array per step with each rank's batch start (position in its
        remainder sequence), ``-1`` once the rank is done.
    """
    ends = np.cumsum(left, axis=1)  # (R, B) end of each bucket's remainder in the sequence
    total = ends[:, -1] if left.shape[1] else np.zeros(len(left), dtype=np.int64)
    pos = np.zeros(len(left), dtype=np.int64)  # (R,) start of the next batch
    counts = np.zeros(len(left), dtype=np.int64)
    starts: list[NDArray[np.int64]] = []
    active = pos < total
    while active.any():
        bucket = np.minimum((ends <= pos[:, None]).sum(axis=1), left.shape[1] - 1)
        starts.append(np.where(active, pos, -1))
        counts += active
        pos = np.where(active, np.minimum(pos + rows[bucket], total), pos)
        active = pos < total
    return counts, starts


class BucketBatcher(Batcher):
    """Batches cut from length buckets (see the module docstring)."""

    shuffles_batch_order = True

    def _prepare(self) -> None:
        self.upper, self.rows = bucket_bounds(self.max_length, self.batching)  # (B,), (B,)
        self.table = length_table(self.upper, self.max_length)

    def _count(self) -> NDArray[np.int64]:
        if self.batching.batch_size is not None:  # equal rows: remainders chunk like the rest
            counts: NDArray[np.int64] = -(-self.layout.rank_sizes // self.batching.batch_size)
            return counts
        per_bucket = count_rank_buckets(self.lengths, self.layout, self.upper, self.table)
        full = (per_bucket // self.rows).sum(axis=1)  # (W,)
        left = (per_bucket % self.rows)[:, ::-1]  # (W, B) longest bucket first
        merged, _ = chunk_remainders(left, self.rows[::-1].copy())
        total: NDArray[np.int64] = full + merged
        return total

    def _cut(self, ids: NDArray[np.int64], lens: NDArray[np.int64]) -> Batches:
        if not self.shuffle and self.batching.batch_size is not None:
            # evaluation, fixed size: chunks of the sorted range pad least, same count
            ids = ids[np.argsort(-lens, kind="stable")]
            return ids, chunk_offsets(len(ids), self.batching.batch_size)
        num_buckets = len(self.upper)
        bucket = bucket_ids(lens, self.upper, self.table)  # (n,)
        if self.shuffle:  # ids come shuffled: random within a bucket, longest bucket first
            order = np.argsort(num_buckets - 1 - bucket, kind="stable")
        else:
            order = np.argsort(-lens, kind="stable")  # decreasing length, then epoch order
        ids = ids[order]
        rows = self.rows[::-1]  # (B,) longest bucket first from here on
        count = np.bincount(bucket, minlength=num_buckets)[::-1]  # (B,)
        full = count // rows  # (B,) full batches per bucket
        rank_in_bucket = range_positions(np.zeros_like(count), count)  # (n,) index within its bucket
        is_left = rank_in_bucket >= np.repeat(full * rows, count)  # (n,) remainder rows
        full_ids, left_ids = ids[~is_left], ids[is_left]
        # longest first, by length rather than by bucket: the same per-bucket
        # runs (so the same count) with tighter lengths inside mixed batches
        left_ids = left_ids[np.argsort(-lens[order][is_left], kind="stable")]
        offsets = offsets_from_lengths(np.repeat(rows, full))
        if len(left_ids):
            _, starts = chunk_remainders((count - full * rows)[None, :], rows)
            left_offsets = np.array([s[0] for s in starts[1:]] + [len(left_ids)], dtype=np.int64)
            offsets = np.concatenate([offsets, len(full_ids) + left_offsets])
        return np.concatenate([full_ids, left_ids]), offsets
