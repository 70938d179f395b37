"""Fixed-size batches without bucketing."""

from __future__ import annotations

import numpy as np
import pytest

from shardload.plan import Batching
from shardload.plan.assign import assign_shards, shard_order
from shardload.plan.fixed import FixedSizeBatcher

from .strategies import long_tailed, partition


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_chunks_of_batch_size(shuffle: bool, batch_size: int) -> None:
    lengths = long_tailed(1000, seed=1)
    sizes = partition(1000, 9, seed=1, allow_empty=True)
    layout = assign_shards(sizes, 6, order=shard_order(9, seed=2, epoch=0, shuffle=shuffle))
    batcher = FixedSizeBatcher(
        lengths,
        layout,
        Batching(batch_size=batch_size, bucketing=False),
        shuffle=shuffle,
        seed=2,
        epoch=0,
        max_length=int(lengths.max()),
    )
    counts = batcher.count_batches()
    for rank in range(6):
        ids, offsets = batcher.build_batches(rank)
        rows = np.diff(offsets)
        # Invariant: full batches, only the last may be short; the count is ceil(n / size)
        assert (rows[:-1] == batch_size).all() and 1 <= rows[-1] <= batch_size
        assert len(rows) == counts[rank] == -(-layout.rank_sizes[rank] // batch_size)
        expected = layout.rank_sample_ids(rank)
        if shuffle:
            # Invariant: training shuffles the rank's samples, keeping each once
            assert np.array_equal(np.sort(ids), np.sort(expected))
            assert not np.array_equal(ids, expected)
        else:
            # Invariant: evaluation keeps the epoch order
            assert np.array_equal(ids, expected)
