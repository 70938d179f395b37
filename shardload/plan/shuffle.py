"""Seeded randomness of a plan, and reordering of whole batches.

Every generator of a plan is a pure function of its key (never of global
state, call order or the rank asking): :func:`epoch_rng` and
:func:`position_rng` ``(seed, epoch)`` are shared by all ranks (the shard
order, the step positions), :func:`rank_rng` ``(seed, epoch, rank)`` is one
rank's (its sample and batch order). A stream tag keeps each family apart.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths, range_positions

__all__ = ["epoch_rng", "permute_batches", "position_rng", "rank_rng"]

_EPOCH_STREAM = 0x5348  # tags: distinct entropy for the shared and the per-rank streams
_RANK_STREAM = 0x524B
_POSITION_STREAM = 0x5053  # step positions of batches: not the stream of the shard order


def position_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator of an epoch's step positions of batches (plan/steps.py), the same on every rank."""
    return np.random.default_rng([seed, epoch, _POSITION_STREAM])


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """Generator shared by every rank for ``(seed, epoch)``."""
    return np.random.default_rng([seed, epoch, _EPOCH_STREAM])


def rank_rng(seed: int, epoch: int, rank: int) -> np.random.Generator:
    """Generator private to one rank for ``(seed, epoch)``."""
    return np.random.default_rng([seed, epoch, rank, _RANK_STREAM])


def permute_batches(
    sample_ids: NDArray[np.int64], offsets: NDArray[np.int64], perm: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Reorder whole batches (output batch ``i`` is input batch ``perm[i]``), each batch's rows together and in order.

    >>> ids, off = permute_batches(np.arange(5), np.array([0, 2, 5]), np.array([1, 0]))
    >>> ids.tolist(), off.tolist()
    ([2, 3, 4, 0, 1], [0, 3, 5])
    """
    sizes = np.diff(offsets)[perm]  # (num_batches,) rows of each output batch
    # row j of output batch i is row offsets[perm[i]] + j of the input
    return sample_ids[range_positions(offsets[:-1][perm], sizes)], offsets_from_lengths(sizes)
