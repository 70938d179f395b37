"""Batch planning: lengths index -> one rank's ordered batches, same count on every rank.

Pure numpy: no torch, no file I/O, no global state. Every rank plans on its own
from the lengths index and gets the same number of batches as every other
rank::

    PlanInputs (lengths (N,), shard_sizes (S,), digest)   the shard set's index
      or MixInputs (one PlanInputs per source, weights)    a mixture of shard sets (plan/mix/)
      or ResumeInputs (base inputs, history)             the rest of an epoch after other world sizes (plan/resume.py)
    EpochSpec (world_size, stage, seed, epoch, ...)       the epoch asked for
    Batching (batch_size | max_tokens, bucketing, ...)    how rows become batches
       |  assign     shards -> contiguous rank ranges  (locality)
       |  batcher    fixed | buckets | greedy | pack   (count all ranks, build one)
       |  length     training: the run's steps per epoch (the same every epoch)
       |  equalize   split | pad | drop                (equal batch counts)
       v
    RankPlan: sample_ids, weights, batch_offsets, fingerprint

>>> import numpy as np
>>> inputs = PlanInputs(np.array([3, 8, 5, 1]), np.array([4]))
>>> plan = plan_rank(inputs, EpochSpec(world_size=2), Batching(batch_size=2), rank=0)
>>> len(plan), plan.num_real
(1, 2)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardload.plan.length import EpochLengthWarning
from shardload.plan.mix.inputs import MixInputs
from shardload.plan.options import Batching, ShardAssignment, Stage, Uneven, padded_length
from shardload.plan.planner import EpochPlanner, RankPlan, plan_rank
from shardload.plan.request import EpochSpec, PlanInputs, digest_lengths
from shardload.plan.resume import ResumeInputs
from shardload.plan.summary import PlanSummary, summarize_plan

__all__ = [
    "Batching",
    "EpochLengthWarning",
    "EpochPlanner",
    "EpochSpec",
    "MixInputs",
    "PlanInputs",
    "PlanSummary",
    "RankPlan",
    "ResumeInputs",
    "ShardAssignment",
    "Stage",
    "Uneven",
    "digest_lengths",
    "padded_length",
    "plan_rank",
    "summarize_plan",
]


if not TYPE_CHECKING:  # hidden from type checkers, which would take any attribute as this one's

    def __getattr__(name: str) -> object:
        """A submodule of 0.1.0 that moved (``shardload.plan.pack``), as before an attribute of this package."""
        from shardload._compat import moved_attribute

        return moved_attribute(__name__, name)
