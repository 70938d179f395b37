"""Greedy token fill (no bucketing): the vectorised fill equals the sequential one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.plan import Batching
from shardload.plan import greedy as greedy_module
from shardload.plan.assign import assign_shards, shard_order
from shardload.plan.greedy import GreedyTokenBatcher, greedy_rows

from .strategies import long_tailed, partition


def _reference_rows(costs: list[int], stop: list[int], budget: int, max_rows: int | None) -> list[int]:
    """The obvious O(n * k) fill from every position."""
    out = []
    for p in range(len(costs)):
        k, top = 1, costs[p]
        while p + k < stop[p] and (max_rows is None or k < max_rows):
            nxt = max(top, costs[p + k])
            if (k + 1) * nxt > budget:
                break
            k, top = k + 1, nxt
        out.append(k)
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 60), max_size=80),
    st.integers(1, 200),
    st.one_of(st.none(), st.integers(1, 10)),
    st.lists(st.integers(1, 30), max_size=4),
    st.sampled_from([None, 4, 7]),
)
def test_greedy_rows_matches_the_sequential_fill(
    costs: list[int], budget: int, max_rows: int | None, cuts: list[int], group: int | None
) -> None:
    bounds = sorted({min(c, len(costs)) for c in cuts} | {len(costs)})
    stop = [next(b for b in bounds if b > p) for p in range(len(costs))]
    expected = _reference_rows(costs, stop, budget, max_rows)
    saved = greedy_module._GROUP
    try:
        if group is not None:  # small windows exercise the look-ahead across windows
            greedy_module._GROUP = group
        got = greedy_rows(np.array(costs, dtype=np.int64), np.array(stop, dtype=np.int64), budget, max_rows)
    finally:
        greedy_module._GROUP = saved
    # Invariant: the binary-lifting fill equals the sequential greedy fill everywhere
    assert got.tolist() == expected


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("group", [1 << 20, 500])
def test_batcher_counts_what_it_builds(shuffle: bool, group: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(greedy_module, "_GROUP", group)  # small groups: many rank groups
    lengths = long_tailed(6000, seed=2)
    sizes = partition(6000, 11, seed=2, allow_empty=False)
    layout = assign_shards(sizes, 7, order=shard_order(11, seed=0, epoch=3, shuffle=shuffle))
    batching = Batching(max_tokens=2048, bucketing=False, pad_to_multiple_of=8)
    batcher = GreedyTokenBatcher(
        lengths, layout, batching, shuffle=shuffle, seed=0, epoch=3, max_length=int(lengths.max())
    )
    counts = batcher.count_batches()
    for rank in range(7):
        ids, offsets = batcher.build_batches(rank)
        # Invariant: counting all ranks in lockstep agrees with building one
        assert len(offsets) - 1 == counts[rank]
        if not shuffle:
            # Invariant: evaluation keeps the epoch order
            assert np.array_equal(ids, layout.rank_sample_ids(rank))
