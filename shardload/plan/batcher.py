"""The contract every batching strategy fills: count all ranks, build one.

Guarantee: :meth:`Batcher.count_batches` (every rank's count, vectorised,
since every rank computes all of them to agree on the target) and
:meth:`Batcher.build_batches` (one rank's batches) agree exactly; the tests
check it for every strategy. The base class owns what every strategy shares:
a rank's samples in epoch order, shuffled by the rank's generator when
training (:meth:`Batcher.rank_order`: a full shuffle, or chunk windows,
:mod:`shardload.plan.chunks`), and the shuffle of whole batches afterwards.
Subclasses fill :meth:`Batcher._count` and :meth:`Batcher._cut` (and may set
up shared state in :meth:`Batcher._prepare`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import range_positions
from shardload.plan.assign import ShardLayout
from shardload.plan.chunks import ChunkWindows, chunk_blocks, window_batch_order, window_order
from shardload.plan.options import Batching
from shardload.plan.shuffle import permute_batches, rank_rng

__all__ = ["Batcher", "Batches", "chunk_offsets"]

#: ``(sample_ids, offsets)``: ``(n,)`` sample ids in yield order, and ``(num_batches + 1,)`` batch offsets into them.
Batches = tuple[NDArray[np.int64], NDArray[np.int64]]


def chunk_offsets(num_rows: int, size: int) -> NDArray[np.int64]:
    """``(ceil(num_rows / size) + 1,)`` offsets of consecutive chunks of ``size`` rows.

    >>> chunk_offsets(5, 2).tolist()
    [0, 2, 4, 5]
    """
    offsets = np.arange(0, num_rows + size, size, dtype=np.int64)
    offsets[-1] = num_rows
    return offsets


class Batcher(ABC):
    """Groups each rank's samples into batches for one epoch of one stage.

    ``lengths`` may be any integer dtype or a memmap; ``max_length`` is its
    largest (``0`` if empty). ``shuffle`` (training) draws from
    ``(seed, epoch, rank)``; ``chunks`` are its chunk windows (``None``: a full shuffle).
    """

    #: Whether training shuffles the order of batches after building them
    #: (needed when building groups similar lengths together).
    shuffles_batch_order: bool = False

    def __init__(
        self,
        lengths: NDArray[np.integer],
        layout: ShardLayout,
        batching: Batching,
        *,
        shuffle: bool,
        seed: int,
        epoch: int,
        max_length: int,
        chunks: ChunkWindows | None = None,
    ) -> None:
        self.lengths = lengths
        self.layout = layout
        self.batching = batching
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = epoch
        self.max_length = max_length
        self.chunks = chunks if shuffle else None
        self._prepare()

    def _prepare(self) -> None:  # noqa: B027 (an optional hook, not abstract)
        """Hook: set up what both counting and building need (default: nothing)."""

    def count_batches(self) -> NDArray[np.int64]:
        """``(W,)`` number of batches each rank's :meth:`build_batches` returns."""
        counts = self._count()
        assert counts.shape == (self.layout.world_size,)
        return counts.astype(np.int64, copy=False)

    def build_batches(self, rank: int) -> Batches:
        """One rank's batches: its sample ids, each once, in yield order; every batch non-empty."""
        ids, lens, rng, windows = self._order(rank)
        sample_ids, offsets = self._cut(ids, lens)
        if rng is not None and self.shuffles_batch_order:
            if windows is None:
                perm = rng.permutation(len(offsets) - 1)
            else:  # each batch after the window it completes in: the window's chunks are still at hand
                sorter = np.argsort(ids, kind="stable")
                row_windows = windows[sorter[np.searchsorted(ids, sample_ids, sorter=sorter)]]
                perm = window_batch_order(row_windows, offsets, rng)
            sample_ids, offsets = permute_batches(sample_ids, offsets, perm)
        return sample_ids, offsets

    def rank_order(self, rank: int) -> tuple[NDArray[np.int64], NDArray[np.int64], np.random.Generator | None]:
        """``(ids, lens, rng)``: a rank's samples and their lengths, ``(n_r,)``, in the order its batches are cut from.

        Epoch order, or when shuffling the first draw of ``rng``, the rank's
        generator returned after that draw (``None`` when not shuffling).
        """
        ids, lens, rng, _ = self._order(rank)
        return ids, lens, rng

    def _order(
        self, rank: int
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], np.random.Generator | None, NDArray[np.int64] | None]:
        """:meth:`rank_order`, and ``(n_r,)`` the window of each sample with chunk windows (else ``None``)."""
        segments = self.layout.rank_segments(rank)
        ids = range_positions(*segments)  # (n_r,) epoch order
        lens = np.asarray(self.lengths[ids], dtype=np.int64)  # (n_r,)
        if not self.shuffle:
            return ids, lens, None, None
        rng = rank_rng(self.seed, self.epoch, rank)
        if self.chunks is None:
            perm = rng.permutation(len(ids))
            return ids[perm], lens[perm], rng, None
        blocks = chunk_blocks(self.lengths, lens, self.layout.shard_starts, segments, self.chunks.rows)
        perm, windows = window_order(blocks, self.chunks.window, rng)
        return ids[perm], lens[perm], rng, windows

    @abstractmethod
    def _count(self) -> NDArray[np.int64]:
        """``(W,)`` every rank's batch count, without materialising batches."""

    @abstractmethod
    def _cut(self, ids: NDArray[np.int64], lens: NDArray[np.int64]) -> Batches:
        """Cut one rank's samples, as :meth:`rank_order` gives them, into batches (reordering them if needed)."""
