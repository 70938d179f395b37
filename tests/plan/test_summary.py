"""summarize_plan: per-rank figures for dry runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardload.errors import PlanError
from shardload.plan import Batching, EpochSpec, PlanInputs, padded_length, summarize_plan

from .strategies import long_tailed, partition, plan_of


def test_summary_figures_match_the_plans() -> None:
    lengths = long_tailed(3000, seed=8)
    sizes = partition(3000, 17, seed=8, allow_empty=True)
    batching = Batching(max_tokens=2048, pad_to_multiple_of=8, uneven="pad")
    summary = summarize_plan(PlanInputs(lengths, sizes), EpochSpec(world_size=5, seed=3, epoch=1), batching)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for rank in range(5):
        plan = plan_of(lengths, sizes, rank=rank, world_size=5, batching=batching, seed=3, epoch=1)
        real = plan.sample_ids[plan.weights > 0]
        padded = sum(len(ids) * padded_length(int(lengths[ids].max()), 8) for ids, _ in plan)
        shards = np.unique(np.searchsorted(starts, plan.sample_ids, side="right") - 1)
        # Invariant: the report's per-rank figures are those of plan_rank's plan
        assert summary.samples[rank] == len(real) and summary.filler[rank] == plan.num_filler
        assert summary.tokens[rank] == lengths[real].sum()
        assert summary.padded_tokens[rank] == padded
        assert summary.shards[rank] == len(shards)
        assert summary.fingerprint == plan.fingerprint
    assert summary.num_batches == len(plan)
    expected = 1 - summary.tokens.sum() / summary.padded_tokens.sum()
    assert abs(summary.padding_fraction - expected) < 1e-12
    assert summary.spread == summary.padded_tokens.max() / summary.padded_tokens.min()
    assert summary.added_batches.sum() == (summary.num_batches - summary.rank_batch_counts).sum()
    assert 0 < summary.budget_fill <= 1


def test_summary_reports_render() -> None:
    summary = summarize_plan(
        PlanInputs(np.arange(100), np.array([60, 40])), EpochSpec(world_size=3, stage="val"), Batching(batch_size=8)
    )
    text = summary.format()
    # the epoch first, then the set's totals, labelled (lengths 0..99: 4,950 tokens)
    assert "stage val: the epoch holds 100 samples, 4,950 tokens, on 3 ranks: " in text and "padding" in text
    assert "\nset:      100 samples, 4,950 tokens in all" in text
    data = json.loads(json.dumps(summary.to_dict()))
    assert [row["samples"] for row in data["ranks"]] == [33, 33, 34]
    assert data["budget_fill"] is None


def test_empty_summary() -> None:
    summary = summarize_plan(
        PlanInputs(np.zeros(0, np.int64), np.array([0])), EpochSpec(world_size=4), Batching(max_tokens=64)
    )
    assert summary.num_batches == 0 and summary.padding_fraction == 0.0 and summary.spread == 1.0
    assert "0 samples" in summary.format()


def test_cache_sizes_are_the_bytes_of_the_shards_the_plans_read() -> None:
    lengths = long_tailed(2000, seed=4)
    sizes = partition(2000, 23, seed=4, allow_empty=True)
    shard_bytes = np.random.default_rng(4).integers(1_000, 9_000, len(sizes))
    batching = Batching(batch_size=16, uneven="pad")
    spec = EpochSpec(world_size=7, seed=2, epoch=1)
    summary = summarize_plan(PlanInputs(lengths, sizes), spec, batching, shard_bytes=shard_bytes, ranks_per_node=3)
    bounds = np.cumsum(sizes).tolist()  # the end of each shard along sample ids

    def shard(sample: int) -> int:
        return next(k for k, end in enumerate(bounds) if sample < end)

    node_shards: list[set[int]] = [set(), set(), set()]  # ranks 0-2, 3-5, 6
    for rank in range(7):
        plan = plan_of(lengths, sizes, rank=rank, world_size=7, batching=batching, seed=2, epoch=1)
        read = {shard(int(i)) for i in plan.sample_ids}  # filler rows are read too
        assert summary.cache_bytes[rank] == sum(int(shard_bytes[k]) for k in read)
        per_batch = [sum(int(shard_bytes[k]) for k in {shard(int(i)) for i in ids}) for ids, _ in plan]
        assert summary.step_bytes[rank] == max(per_batch)
        node_shards[rank // 3] |= read
    assert summary.node_cache_bytes.tolist() == [sum(int(shard_bytes[k]) for k in s) for s in node_shards]
    data = summary.to_dict()
    assert data["ranks_per_node"] == 3 and data["ranks"][4]["cache_bytes"] == summary.cache_bytes[4]
    text = summary.format()
    assert "cache:" in text and "per node of 3 ranks" in text
    assert summarize_plan(PlanInputs(lengths, sizes), spec, batching).cache_bytes is None  # not asked: not sized


def test_cache_sizing_refuses_bad_shard_bytes() -> None:
    inputs = PlanInputs(np.arange(10), np.array([6, 4]))
    spec, batching = EpochSpec(world_size=2), Batching(batch_size=2)
    with pytest.raises(PlanError, match="expected 2 integer byte sizes"):
        summarize_plan(inputs, spec, batching, shard_bytes=[5, 6, 7])
    with pytest.raises(PlanError, match="shard 1 has a negative size"):
        summarize_plan(inputs, spec, batching, shard_bytes=[5, -6])
    with pytest.raises(PlanError, match="ranks_per_node must be at most 2"):
        summarize_plan(inputs, spec, batching, shard_bytes=[5, 6], ranks_per_node=3)
