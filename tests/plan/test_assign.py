"""Shards -> ranks: contiguous, near-equal rank ranges over the epoch's shard order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.plan.assign import assign_shards, shard_order

from .strategies import partition


def test_shard_order_is_seeded_and_shared() -> None:
    order = shard_order(50, seed=3, epoch=1, shuffle=True)
    # Invariant: a permutation, the same for the same (seed, epoch) on every rank
    assert sorted(order.tolist()) == list(range(50))
    assert np.array_equal(order, shard_order(50, seed=3, epoch=1, shuffle=True))
    assert not np.array_equal(order, shard_order(50, seed=3, epoch=2, shuffle=True))
    assert not np.array_equal(order, shard_order(50, seed=4, epoch=1, shuffle=True))
    # Invariant: without shuffling, the natural order
    assert shard_order(5, seed=3, epoch=1, shuffle=False).tolist() == [0, 1, 2, 3, 4]


@settings(max_examples=200, deadline=None)
@given(
    num=st.integers(0, 3000),
    parts=st.integers(1, 40),
    world=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
    allow_empty=st.booleans(),
    shuffle=st.booleans(),
)
def test_rank_ranges_tile_the_epoch(
    num: int, parts: int, world: int, seed: int, allow_empty: bool, shuffle: bool
) -> None:
    sizes = partition(num, parts, seed, allow_empty=allow_empty)
    order = shard_order(parts, seed=seed, epoch=0, shuffle=shuffle)
    layout = assign_shards(sizes, world, order=order)
    rank_sizes = layout.rank_sizes
    # Invariant: rank range sizes differ by at most one and add up to N
    assert rank_sizes.sum() == num and rank_sizes.max() - rank_sizes.min() <= 1
    epoch_sequence = np.concatenate(
        [np.arange(sizes[:s].sum(), sizes[: s + 1].sum()) for s in order] or [np.zeros(0)]
    ).astype(np.int64)
    touched_total = 0
    for rank in range(world):
        ids = layout.rank_sample_ids(rank)
        lo, hi = layout.rank_starts[rank], layout.rank_starts[rank + 1]
        # Invariant: a rank's samples are one contiguous run of the epoch's sequence
        assert np.array_equal(ids, epoch_sequence[lo:hi])
        shards = layout.rank_shards(rank)
        # Invariant: its shards are non-empty and consecutive among the epoch's
        # non-empty shards, each listed once
        nonempty_order = order[sizes[order] > 0]
        position = np.argsort(nonempty_order)[np.searchsorted(np.sort(nonempty_order), shards)]
        assert (sizes[shards] > 0).all() and (np.diff(position) == 1).all()
        touched_total += len(shards)
    # Invariant: each cut between ranks splits at most one shard
    assert touched_total <= int((sizes > 0).sum()) + world - 1
    starts, run_sizes, ranks = layout.pieces()
    # Invariant: pieces tile [0, N) in sample-id order, each inside one rank's range
    assert np.array_equal(starts, np.cumsum(run_sizes) - run_sizes)
    assert run_sizes.sum() == num and (run_sizes > 0).all()
    for start, size, rank in zip(starts, run_sizes, ranks, strict=True):
        assert set(range(start, start + size)) <= set(layout.rank_sample_ids(rank).tolist())
    if num:
        # Invariant: epoch_sample_id maps epoch positions to the same ids
        probe = [0, num // 2, num - 1]
        assert [layout.epoch_sample_id(p) for p in probe] == epoch_sequence[probe].tolist()


def test_small_example() -> None:
    layout = assign_shards(np.array([2, 0, 5, 3]), 3, order=np.array([2, 0, 3, 1]))
    # epoch sequence: shard 2 = ids 2..6, shard 0 = 0..1, shard 3 = 7..9
    assert [layout.rank_sample_ids(r).tolist() for r in range(3)] == [
        [2, 3, 4],
        [5, 6, 0],
        [1, 7, 8, 9],
    ]
    assert [layout.rank_shards(r).tolist() for r in range(3)] == [[2], [2, 0], [0, 3]]


def test_with_equal_shards_a_rank_touches_at_most_ceil_s_over_w_plus_one() -> None:
    worst = 0
    for parts in range(1, 25):
        for world in range(1, 30):
            for per_shard in (1, 2, 3, 7):
                sizes = np.full(parts, per_shard, dtype=np.int64)
                layout = assign_shards(sizes, world, order=shard_order(parts, seed=parts, epoch=world, shuffle=True))
                excess = max(len(layout.rank_shards(rank)) for rank in range(world)) - -(-parts // world)
                # Invariant: a range of at most ceil(N / W) = ceil(S / W) shards' worth of samples, cut at
                # any offset, overlaps at most one shard more (docs/planning.md, "locality")
                assert excess <= 1, (parts, world, per_shard)
                worst = max(worst, excess)
    assert worst == 1  # the bound is reached: one more is not a loose allowance
