"""Bring every rank to the same batch count, so no rank waits in a collective.

Every rank knows every rank's count, so each reaches the same target alone,
by ``Batching.uneven``: ``"split"`` (the largest count; a rank below it splits
its largest batches, nothing dropped or repeated, filler only for a rank with
fewer samples than the target), ``"pad"`` (the largest count; filler batches
of one row) or ``"drop"`` (the smallest count; trailing batches dropped,
training only). A filler row repeats a real sample id with weight 0; no batch
is ever empty. Costs: docs/planning.md ("Equalising batch counts").
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import range_positions
from shardload.plan.options import Uneven

__all__ = ["equalize_batches", "split_batches"]


def split_batches(offsets: NDArray[np.int64], target: int) -> NDArray[np.int64]:
    """Split the largest batches so that there are exactly ``target`` of them.

    Guarantee: each batch ``i`` is cut into ``m_i >= 1`` consecutive pieces of
    near-equal rows, choosing the ``m_i`` so that the largest piece is as
    small as possible, larger batches first (a batch is never cut into fewer
    pieces than a smaller one). When a rank is a few batches short (the usual
    case) this cuts its few largest batches in two. Rows, their order and
    every token budget are kept (a piece of a batch never pads more than the
    batch). Cost: ``target - count`` extra, smaller steps on this rank; no
    sample is dropped or repeated. Every batch is non-empty and
    ``count <= target <= offsets[-1]`` (rows); returns ``(target + 1,)`` offsets.

    >>> split_batches(np.array([0, 10, 13]), 4).tolist()
    [0, 3, 6, 10, 13]
    """
    sizes = np.diff(offsets)  # (count,) rows per batch
    assert len(sizes) <= target <= int(sizes.sum())

    def pieces(cap: int) -> int:
        return int((-(-sizes // cap)).sum())

    lo, hi = 1, int(sizes.max()) if len(sizes) else 1  # smallest cap with pieces(cap) <= target
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if pieces(mid) <= target else (mid + 1, hi)
    parts = -(-sizes // lo)  # (count,) pieces per batch
    short = target - int(parts.sum())
    if short > 0:  # pieces(lo - 1) > target: hand out the difference, largest batches first
        room = -(-sizes // (lo - 1)) - parts
        largest = np.argsort(-sizes, kind="stable")
        before = np.cumsum(room[largest]) - room[largest]
        parts[largest] += np.clip(short - before, 0, room[largest])
    batch = np.repeat(np.arange(len(sizes)), parts)  # (target,) batch of each piece
    piece = range_positions(np.zeros_like(parts), parts)  # (target,) index of each piece in its batch
    starts = offsets[:-1][batch] + piece * sizes[batch] // parts[batch]
    return np.append(starts, offsets[-1]).astype(np.int64)


def equalize_batches(
    sample_ids: NDArray[np.int64],
    offsets: NDArray[np.int64],
    *,
    target: int,
    uneven: Uneven,
    filler_id: int,
) -> tuple[NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]:
    """Give one rank's batches exactly ``target`` batches, by ``uneven`` (see the module docstring).

    ``target`` is the largest count of all ranks for ``"split"``/``"pad"``, the
    smallest for ``"drop"``. Returns ``(sample_ids, weights, offsets)``: ids
    with filler rows (``filler_id``, weight 0.0) appended.
    """
    count = len(offsets) - 1
    if uneven == "drop":
        assert target <= count
        rows = int(offsets[target])
        return sample_ids[:rows], np.ones(rows, dtype=np.float32), offsets[: target + 1]
    assert target >= count
    real = len(sample_ids)
    if uneven == "split":
        if real >= target:
            new_offsets = split_batches(offsets, target) if target > count else offsets
            return sample_ids, np.ones(real, dtype=np.float32), new_offsets
        offsets = np.arange(real + 1, dtype=np.int64)  # every row its own batch, then filler
    filler = target - (len(offsets) - 1)
    ids = np.concatenate([sample_ids, np.full(filler, filler_id, dtype=np.int64)])
    weights = np.concatenate([np.ones(real, np.float32), np.zeros(filler, np.float32)])
    new_offsets = np.concatenate([offsets, real + np.arange(1, filler + 1, dtype=np.int64)])
    return ids, weights, new_offsets
