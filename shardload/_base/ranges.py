"""Offsets and row ranges: the two pieces of index arithmetic every layer shares.

Variable-length data is a flat buffer of rows plus ``offsets`` (sample ``i`` is
``values[offsets[i]:offsets[i + 1]]``), for samples in shards, shards in a set,
batches in a plan and chunks in a prepare run: :func:`offsets_from_lengths`
builds them, :func:`range_positions` gathers many ranges in one fancy-index.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["offsets_from_lengths", "range_positions"]


def offsets_from_lengths(lengths: ArrayLike) -> NDArray[np.int64]:
    """``(n + 1,)`` int64 offsets of ``n`` consecutive ranges: ``0``, then the running sum of ``lengths``.

    >>> offsets_from_lengths([3, 0, 2]).tolist()
    [0, 3, 3, 5]
    """
    lens = np.asarray(lengths)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return offsets


def range_positions(starts: NDArray[np.integer[Any]], lengths: NDArray[np.integer[Any]]) -> NDArray[np.int64]:
    """Every position of the ranges ``[starts[k], starts[k] + lengths[k])``, concatenated in order.

    ``starts`` and ``lengths`` (``>= 0``) are ``(k,)``; the result is
    ``(lengths.sum(),)`` int64. ``values[range_positions(starts, lengths)]``
    gathers those row ranges in one fancy-index; with ``starts`` all zero it
    gives each position's index within its own range.

    >>> range_positions(np.array([5, 0, 9]), np.array([2, 0, 3])).tolist()
    [5, 6, 9, 10, 11]
    """
    lens = np.asarray(lengths, dtype=np.int64)
    out_starts = offsets_from_lengths(lens)  # (k + 1,) where each range lands in the output
    positions = np.repeat(np.asarray(starts, dtype=np.int64) - out_starts[:-1], lens)
    positions += np.arange(int(out_starts[-1]), dtype=np.int64)
    return positions
