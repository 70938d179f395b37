"""The two index rules every layer shares: offsets from lengths, and the positions of row ranges."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardload._base.ranges import offsets_from_lengths, range_positions


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint16])
def test_offsets_from_lengths_start_at_zero_and_add_each_length(dtype: type[np.integer]) -> None:
    lengths = np.random.default_rng(1).integers(0, 50, size=200).astype(dtype)
    lengths[[0, 7, 8]] = 0  # empty ranges keep their place
    offsets = offsets_from_lengths(lengths)
    assert offsets.dtype == np.int64 and offsets.tolist() == [0, *itertools.accumulate(lengths.tolist())]
    assert offsets_from_lengths(np.zeros(0, dtype)).tolist() == [0]


def test_range_positions_concatenate_every_range_in_order() -> None:
    rng = np.random.default_rng(2)
    starts = rng.integers(0, 1000, size=100)
    lengths = rng.integers(0, 20, size=100)
    lengths[:3] = 0
    expected = [p for s, n in zip(starts.tolist(), lengths.tolist()) for p in range(s, s + n)]
    positions = range_positions(starts, lengths)
    assert positions.dtype == np.int64 and positions.tolist() == expected
    # with zero starts: each position's index within its range
    assert range_positions(np.zeros(3, np.int64), np.array([2, 0, 3])).tolist() == [0, 1, 0, 1, 2]
    assert range_positions(np.zeros(0, np.int64), np.zeros(0, np.int64)).tolist() == []
