"""Length buckets: bounds, counting every rank in one pass, remainders, padding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.plan import Batching, EpochSpec, PlanInputs, padded_length, summarize_plan
from shardload.plan.assign import assign_shards, shard_order
from shardload.plan.buckets import (
    BucketBatcher,
    bucket_bounds,
    bucket_ids,
    chunk_remainders,
    count_rank_buckets,
    length_table,
)

from .strategies import batchings, long_tailed, partition


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200_000), batchings())
def test_bucket_bounds_keep_the_budget(max_length: int, batching: Batching) -> None:
    upper, rows = bucket_bounds(max_length, batching)
    step = batching.pad_to_multiple_of
    # Invariant: bounds increase from one pad multiple, all multiples of it
    assert upper[0] == step and (np.diff(upper) > 0).all() and (upper % step == 0).all()
    # Invariant: the longest padded length is covered, or a 1-row bucket takes the rest
    assert upper[-1] >= padded_length(max_length, step) or rows[-1] == 1
    if batching.max_tokens is None:
        # Invariant: fixed batches take batch_size rows from every bucket
        assert (rows == batching.batch_size).all()
    else:
        # Invariant: a full batch of bucket j keeps the budget (or has one row)
        assert ((rows * upper <= batching.max_tokens) | (rows == 1)).all()
        assert (rows >= 1).all() and (rows <= (batching.max_rows or rows.max())).all()


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 5000), batchings())
def test_bucket_ids_agree_with_the_bounds(max_length: int, batching: Batching) -> None:
    upper, _ = bucket_bounds(max_length, batching)
    lens = np.arange(max_length + 1)
    table = length_table(upper, max_length)
    by_table, by_search = bucket_ids(lens, upper, table), bucket_ids(lens, upper, None)
    # Invariant: the lookup table and the search give the same buckets
    assert np.array_equal(by_table, by_search)
    padded = -(-lens // batching.pad_to_multiple_of) * batching.pad_to_multiple_of
    inside = by_table < len(upper) - 1
    # Invariant: a length lies in its bucket: above the previous bound, within its own
    assert (padded[inside] <= upper[by_table[inside]]).all()
    assert (padded[by_table > 0] > upper[by_table[by_table > 0] - 1]).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 30), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_count_rank_buckets_matches_a_direct_count(num: int, parts: int, world: int, seed: int) -> None:
    lengths = long_tailed(num, seed)
    sizes = partition(num, parts, seed, allow_empty=True)
    layout = assign_shards(sizes, world, order=shard_order(parts, seed=seed, epoch=0, shuffle=True))
    upper, _ = bucket_bounds(int(lengths.max()) if num else 0, Batching(max_tokens=4096))
    counts = count_rank_buckets(lengths, layout, upper, length_table(upper, 4096))
    for rank in range(world):
        ids = layout.rank_sample_ids(rank)
        direct = np.bincount(bucket_ids(lengths[ids], upper, None), minlength=len(upper))
        # Invariant: the one-pass table equals counting each rank's own samples
        assert np.array_equal(counts[rank], direct)


def _remainder_batches(left: list[int], rows: list[int]) -> list[int]:
    """Reference: batch starts of one rank's remainder sequence, one sample at a time."""
    bucket_of = [b for b, n in enumerate(left) for _ in range(n)]
    starts, pos = [], 0
    while pos < len(bucket_of):
        starts.append(pos)
        pos += rows[bucket_of[pos]]
    return starts


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=8), st.data())
def test_chunk_remainders_matches_the_reference(rows: list[int], data: st.DataObject) -> None:
    ranks = data.draw(st.integers(1, 5))
    left = np.array([[data.draw(st.integers(0, r - 1)) for r in rows] for _ in range(ranks)], dtype=np.int64)
    counts, starts = chunk_remainders(left, np.asarray(rows, dtype=np.int64))
    for rank in range(ranks):
        expected = _remainder_batches(left[rank].tolist(), rows)
        got = [int(s[rank]) for s in starts if s[rank] >= 0]
        # Invariant: the vectorised cut equals the sample-by-sample reference
        assert got == expected and counts[rank] == len(expected)
        # Invariant: every remainder batch empties at least one bucket
        assert counts[rank] <= int((left[rank] > 0).sum())


@pytest.mark.parametrize("shuffle", [True, False])
def test_batcher_counts_what_it_builds(shuffle: bool) -> None:
    lengths = long_tailed(20_000, seed=5)
    sizes = partition(20_000, 37, seed=5, allow_empty=True)
    layout = assign_shards(sizes, 13, order=shard_order(37, seed=1, epoch=0, shuffle=shuffle))
    for batching in (Batching(max_tokens=3000, pad_to_multiple_of=8), Batching(batch_size=17)):
        batcher = BucketBatcher(
            lengths,
            layout,
            batching,
            shuffle=shuffle,
            seed=1,
            epoch=0,
            max_length=int(lengths.max()),
        )
        counts = batcher.count_batches()
        for rank in range(13):
            ids, offsets = batcher.build_batches(rank)
            # Invariant: the count every rank computes is the number of batches built
            assert len(offsets) - 1 == counts[rank]
            # Invariant: each of the rank's samples appears once
            assert np.array_equal(np.sort(ids), np.sort(layout.rank_sample_ids(rank)))


@pytest.mark.parametrize(
    "batching",
    [
        Batching(batch_size=32),
        Batching(batch_size=32, pad_to_multiple_of=8),
        Batching(max_tokens=16384),
        Batching(max_tokens=16384, pad_to_multiple_of=8),
    ],
    ids=str,
)
def test_bucketing_pads_a_few_percent_of_long_tailed_lengths(batching: Batching) -> None:
    lengths = long_tailed(400_000, seed=0)  # lognormal, median 256, clipped [8, 4096]
    sizes = np.full(400, 1000)
    inputs, spec = PlanInputs(lengths, sizes), EpochSpec(world_size=8)
    bucketed = summarize_plan(inputs, spec, batching)
    # Invariant: bucketing keeps padding within 5% of the computed tokens
    assert bucketed.padding_fraction <= 0.05
    unbucketed = summarize_plan(inputs, spec, Batching(**{**batching.__dict__, "bucketing": False}))
    # Invariant: random batches of the same lengths pad far more (the baseline)
    assert unbucketed.padding_fraction >= 0.5
