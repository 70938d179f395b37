"""Dry-run report of a plan over all ranks: balance, padding, locality.

:func:`summarize_plan` builds every rank's plan once (sharing the per-epoch
work) and reduces each to a few numbers, for ``shardload plan``-style reports
and for choosing options before a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload.plan.options import Batching, ShardAssignment, Stage, padded_length
from shardload.plan.planner import EpochPlanner, RankPlan

__all__ = ["PlanSummary", "summarize_plan"]


@dataclass(frozen=True, eq=False)
class PlanSummary:
    """Per-rank figures of one epoch's plan.

    Attributes:
        world_size: Number of ranks ``W``.
        stage: The stage planned.
        num_samples: ``N``.
        num_batches: Batches per rank after equalisation (same on all ranks).
        max_tokens: The token budget, if batching by tokens.
        fingerprint: The plan fingerprint shared by all ranks.
        rank_batch_counts: ``(W,)`` batches per rank before equalisation.
        samples: ``(W,)`` real rows per rank.
        filler: ``(W,)`` filler rows per rank.
        tokens: ``(W,)`` sum of real rows' lengths per rank.
        padded_tokens: ``(W,)`` sum over the rank's batches of ``rows *
            padded_length(longest row)``, filler rows included: what the
            model computes on.
        shards: ``(W,)`` distinct shards each rank's rows touch.
    """

    world_size: int
    stage: Stage
    num_samples: int
    num_batches: int
    max_tokens: int | None
    fingerprint: str
    rank_batch_counts: NDArray[np.int64]
    samples: NDArray[np.int64]
    filler: NDArray[np.int64]
    tokens: NDArray[np.int64]
    padded_tokens: NDArray[np.int64]
    shards: NDArray[np.int64]

    @property
    def padding_fraction(self) -> float:
        """``1 - tokens / padded_tokens`` over all ranks (0 when nothing is padded)."""
        padded = int(self.padded_tokens.sum())
        return 1.0 - int(self.tokens.sum()) / padded if padded else 0.0

    @property
    def spread(self) -> float:
        """Largest / smallest padded tokens of a rank: 1.0 is perfect balance."""
        low, high = int(self.padded_tokens.min()), int(self.padded_tokens.max())
        if high == 0:
            return 1.0
        return high / low if low else float("inf")

    @property
    def budget_fill(self) -> float | None:
        """Padded tokens / (batches * max_tokens): how full token batches are."""
        if self.max_tokens is None or self.num_batches == 0:
            return None
        return int(self.padded_tokens.sum()) / (self.num_batches * self.world_size * self.max_tokens)

    @property
    def added_batches(self) -> NDArray[np.int64]:
        """``(W,)`` batches each rank gained by splitting or filler."""
        return np.maximum(self.num_batches - self.rank_batch_counts, 0)

    @property
    def dropped_batches(self) -> NDArray[np.int64]:
        """``(W,)`` batches each rank dropped (``uneven="drop"`` only)."""
        return np.maximum(self.rank_batch_counts - self.num_batches, 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: scalars, plus per-rank lists."""
        scalars = {
            "world_size": self.world_size,
            "stage": self.stage,
            "num_samples": self.num_samples,
            "num_batches": self.num_batches,
            "max_tokens": self.max_tokens,
            "fingerprint": self.fingerprint,
            "padding_fraction": self.padding_fraction,
            "spread": self.spread,
            "budget_fill": self.budget_fill,
        }
        per_rank = {
            name: getattr(self, name).tolist()
            for name in (
                "rank_batch_counts",
                "samples",
                "filler",
                "tokens",
                "padded_tokens",
                "shards",
            )
        }
        return {**scalars, "per_rank": per_rank}

    def format(self) -> str:
        """A short human-readable report (min / max over ranks, not one line per rank)."""

        def span(values: NDArray[np.int64]) -> str:
            return f"{int(values.min()):,} .. {int(values.max()):,}" if len(values) else "-"

        fill = self.budget_fill
        lines = [
            f"stage {self.stage}: {self.num_samples:,} samples on {self.world_size} ranks, "
            f"{self.num_batches:,} batches per rank",
            f"  batches before equalising: {span(self.rank_batch_counts)} per rank; "
            f"added {int(self.added_batches.sum()):,}, dropped {int(self.dropped_batches.sum()):,}",
            f"  real rows per rank: {span(self.samples)}; filler rows: {int(self.filler.sum()):,}",
            f"  tokens: {int(self.tokens.sum()):,} real, {int(self.padded_tokens.sum()):,} padded "
            f"(padding {self.padding_fraction:.1%})"
            + (f", token budget filled {fill:.1%}" if fill is not None else ""),
            f"  padded tokens per rank: {span(self.padded_tokens)} (spread {self.spread:.3f})",
            f"  shards per rank: {span(self.shards)}",
            f"  fingerprint: {self.fingerprint}",
        ]
        return "\n".join(lines)


def _rank_figures(
    plan: RankPlan, lengths: NDArray[np.integer], shard_starts: NDArray[np.int64], multiple: int
) -> tuple[int, int, int, int, int]:
    """``(samples, filler, tokens, padded_tokens, shards)`` of one rank's plan."""
    lens = np.asarray(lengths[plan.sample_ids], dtype=np.int64)  # (rows,)
    real = plan.weights > 0
    padded = 0
    if len(plan):
        longest = np.maximum.reduceat(lens, plan.batch_offsets[:-1])  # (num_batches,)
        padded = int((np.diff(plan.batch_offsets) * padded_length(longest, multiple)).sum())
    shards = np.unique(np.searchsorted(shard_starts, plan.sample_ids, side="right") - 1)
    real_rows = int(real.sum())
    return real_rows, len(real) - real_rows, int(lens[real].sum()), padded, len(shards)


def summarize_plan(
    lengths: NDArray[np.integer],
    shard_sizes: NDArray[np.integer],
    *,
    world_size: int,
    batching: Batching,
    stage: Stage = "train",
    seed: int = 0,
    epoch: int = 0,
    shard_assignment: ShardAssignment = "rotate",
    lengths_digest: str | None = None,
) -> PlanSummary:
    """Plan every rank of one epoch and report balance, padding and locality.

    The per-epoch work (counting, fingerprint) is done once; each rank is then
    built as :func:`~shardload.plan.plan_rank` would. Cost: about the cost of
    one :func:`plan_rank` plus ``O(N log)`` to build every rank.

    Args:
        lengths: ``(N,)`` per-sample lengths.
        shard_sizes: ``(S,)`` samples per shard.
        world_size: Number of ranks.
        batching: Batching options.
        stage: The stage to plan.
        seed: Run seed.
        epoch: Epoch number.
        shard_assignment: ``"rotate"`` or ``"fixed"``.
        lengths_digest: Optional precomputed digest of ``lengths``.

    Returns:
        The :class:`PlanSummary`.

    Raises:
        PlanError: If an input or option is invalid.
    """
    planner = EpochPlanner(
        lengths,
        shard_sizes,
        world_size=world_size,
        batching=batching,
        stage=stage,
        seed=seed,
        epoch=epoch,
        shard_assignment=shard_assignment,
        lengths_digest=lengths_digest,
    )
    figures = np.array(
        [
            _rank_figures(
                planner.plan(rank),
                planner.lengths,
                planner.layout.shard_starts,
                batching.pad_to_multiple_of,
            )
            for rank in range(planner.world_size)
        ],
        dtype=np.int64,
    ).reshape(planner.world_size, 5)  # (W, 5) samples, filler, tokens, padded, shards
    return PlanSummary(
        world_size=planner.world_size,
        stage=stage,
        num_samples=planner.layout.num_samples,
        num_batches=planner.num_batches,
        max_tokens=batching.max_tokens,
        fingerprint=planner.fingerprint,
        rank_batch_counts=planner.rank_batch_counts,
        samples=figures[:, 0],
        filler=figures[:, 1],
        tokens=figures[:, 2],
        padded_tokens=figures[:, 3],
        shards=figures[:, 4],
    )
