"""Per-step balance: the order of a rank's batches, so that a step costs about the same on every rank.

The planner cannot move batches between ranks, but it chooses the order of
each rank's batches (after equalising). Guarantee: in training every rank
sorts its batches heaviest first by padded tokens (``rows *
padded_length(longest row)``, filler included; ties in the batcher's order)
and takes the batch *positions* from one permutation seeded by ``(seed,
epoch)`` only, so step ``s`` holds the ``k``-th heaviest batch of every rank
for the same ``k``. Evaluation, chunk windows (their batches must come window
after window) and mixtures (their interleave holds the shares) keep their
order; packed plans rank their rows themselves and take their positions from
:func:`step_positions`. Why and the figures: docs/planning.md ("Per-step balance").
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from shardload.plan.options import padded_length
from shardload.plan.shuffle import permute_batches, position_rng

__all__ = ["batch_costs", "heaviest_first", "order_steps", "step_positions"]


def batch_costs(lens: NDArray[np.int64], offsets: NDArray[np.int64], multiple: int) -> NDArray[np.int64]:
    """``(num_batches,)`` padded tokens of each batch: rows times the padded length of its longest row.

    ``lens`` is ``(rows,)``, batch after batch; every batch non-empty; ``multiple``: ``pad_to_multiple_of``.

    >>> batch_costs(np.array([5, 3, 9, 2]), np.array([0, 2, 4]), 4).tolist()
    [16, 24]
    """
    if len(offsets) < 2:
        return np.zeros(0, dtype=np.int64)
    longest = np.maximum.reduceat(lens, offsets[:-1])  # (num_batches,)
    costs: NDArray[np.int64] = np.diff(offsets) * padded_length(longest, multiple)
    return costs


def heaviest_first(costs: NDArray[np.int64]) -> NDArray[np.int64]:
    """``(num_batches,)`` the batches by decreasing cost, ties in their given order (a stable sort)."""
    order: NDArray[np.int64] = np.argsort(-costs, kind="stable")
    return order


def step_positions(target: int, *, shuffle: bool, seed: int, epoch: int) -> NDArray[np.int64]:
    """``(target,)`` the step at which each rank's ``k``-th heaviest batch comes.

    The same on every rank: training draws one permutation from
    :func:`~shardload.plan.shuffle.position_rng` ``(seed, epoch)``;
    evaluation keeps the heaviest-first order.
    """
    if shuffle and target:
        return position_rng(seed, epoch).permutation(target).astype(np.int64)
    return np.arange(target, dtype=np.int64)


def order_steps(
    sample_ids: NDArray[np.int64],
    weights: NDArray[np.float32],
    offsets: NDArray[np.int64],
    lens: NDArray[np.int64],
    *,
    multiple: int,
    seed: int,
    epoch: int,
) -> tuple[NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]:
    """Put one rank's equalised training batches in their steps: heaviest first, at the shared positions.

    Rows stay in their batches and in their order within a batch; only whole
    batches move, so every count, budget and the set of samples are kept.

    >>> ids, w, off = order_steps(
    ...     np.array([0, 1, 2]), np.ones(3, np.float32), np.array([0, 1, 3]), np.array([4, 4, 4]), multiple=1, seed=0, epoch=0)
    >>> sorted(ids[off[i]:off[i + 1]].tolist() for i in range(2))
    [[0], [1, 2]]
    """
    target = len(offsets) - 1
    ranked = heaviest_first(batch_costs(lens, offsets, multiple))  # (T,) k-th heaviest batch
    position = step_positions(target, shuffle=True, seed=seed, epoch=epoch)  # (T,) step of the k-th heaviest
    at_step = np.empty(target, dtype=np.int64)
    at_step[position] = ranked  # (T,) the batch each step takes
    rows, new_offsets = permute_batches(np.arange(len(sample_ids), dtype=np.int64), offsets, at_step)
    return sample_ids[rows], weights[rows], new_offsets
