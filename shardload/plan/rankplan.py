"""A rank's plan for one epoch (:class:`RankPlan`): what the planner returns and the loader reads.

Its own module so that what reads a plan (the per-source report of a mixture,
the loader) does not import the planner that makes it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardload.errors import PlanError
from shardload.plan.options import Stage
from shardload.plan.request import EpochSpec

__all__ = ["RankPlan"]


@dataclass(frozen=True, eq=False, repr=False)
class RankPlan:
    """One rank's ordered batches for one epoch of one stage.

    Every rank's plan for the same inputs has the same number of batches and
    the same :attr:`fingerprint`. Arrays are read-only.

    Attributes:
        rank: The rank this plan is for.
        spec: The epoch planned (world size, stage, seed, epoch, shard assignment).
        sample_ids: ``(num_rows,)`` global sample ids in yield order, filler
            rows included.
        weights: ``(num_rows,)`` 1.0 for a real row, 0.0 for filler.
        batch_offsets: ``(num_batches + 1,)`` offsets of batches into
            ``sample_ids``; every batch has at least one row.
        rank_batch_counts: ``(world_size,)`` every rank's batch count before
            equalisation (for reports); one array shared by the plans of an epoch.
        fingerprint: Hex digest of the inputs and the final batch count,
            identical on all ranks; compare it across ranks to catch a rank
            that planned from different inputs.
        rows: Packed plans only (``Batching.packing``): ``(num_rows,)`` the
            row of each entry within its batch (``0 .. rows_per_batch - 1``,
            non-decreasing in a batch); ``None`` otherwise.
        starts: Packed plans only: ``(num_rows,)`` the first token of the
            sample each entry holds (0 unless ``pack_split`` cut it into
            pieces of at most ``pack_length`` tokens); ``None`` otherwise.
    """

    rank: int
    spec: EpochSpec
    sample_ids: NDArray[np.int64]
    weights: NDArray[np.float32]
    batch_offsets: NDArray[np.int64]
    rank_batch_counts: NDArray[np.int64]
    fingerprint: str
    rows: NDArray[np.int32] | None = None
    starts: NDArray[np.int64] | None = None

    def __post_init__(self) -> None:
        for array in (
            self.sample_ids,
            self.weights,
            self.batch_offsets,
            self.rank_batch_counts,
            self.rows,
            self.starts,
        ):
            if array is not None:
                array.setflags(write=False)

    def __len__(self) -> int:
        return len(self.batch_offsets) - 1

    def __iter__(self) -> Iterator[tuple[NDArray[np.int64], NDArray[np.float32]]]:
        return (self.batch(i) for i in range(len(self)))

    def __repr__(self) -> str:
        return (
            f"RankPlan(rank={self.rank}, world_size={self.world_size}, stage={self.stage!r}, "
            f"epoch={self.epoch}, seed={self.seed}, num_batches={self.num_batches}, "
            f"num_real={self.num_real}, num_filler={self.num_filler}, "
            f"fingerprint={self.fingerprint[:12]!r})"
        )

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self.spec.world_size

    @property
    def stage(self) -> Stage:
        """``"train"``, ``"val"``, ``"test"`` or ``"predict"``."""
        return self.spec.stage

    @property
    def epoch(self) -> int:
        """Epoch number."""
        return self.spec.epoch

    @property
    def seed(self) -> int:
        """Run seed."""
        return self.spec.seed

    @property
    def num_batches(self) -> int:
        """Number of batches (the same on every rank)."""
        return len(self)

    @property
    def num_real(self) -> int:
        """Number of real rows (weight > 0)."""
        return int(np.count_nonzero(self.weights > 0))

    @property
    def num_filler(self) -> int:
        """Number of filler rows (weight 0)."""
        return len(self.weights) - self.num_real

    def batch(self, i: int) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
        """Batch ``i`` (negative counts from the end) as views.

        Returns:
            ``(sample_ids, weights)``, each ``(rows,)``.

        Raises:
            IndexError: If ``i`` is out of range.
        """
        i = operator.index(i)
        if not -len(self) <= i < len(self):
            raise IndexError(f"batch {i} out of range for a plan of {len(self)} batches")
        i %= len(self)
        lo, hi = int(self.batch_offsets[i]), int(self.batch_offsets[i + 1])
        return self.sample_ids[lo:hi], self.weights[lo:hi]

    def packed_batch(
        self, i: int
    ) -> tuple[NDArray[np.int64], NDArray[np.float32], NDArray[np.int32], NDArray[np.int64]]:
        """Batch ``i`` of a packed plan as views: ``(sample_ids, weights, rows, starts)``, each ``(entries,)``.

        Raises:
            IndexError: If ``i`` is out of range.
            PlanError: If the plan is not packed.
        """
        if self.rows is None or self.starts is None:
            raise PlanError("packed_batch() needs a packed plan (Batching(packing=True, ...))")
        ids, weights = self.batch(i)
        lo = int(self.batch_offsets[i % len(self)])
        return ids, weights, self.rows[lo : lo + len(ids)], self.starts[lo : lo + len(ids)]
