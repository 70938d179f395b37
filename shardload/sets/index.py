"""Sample id <-> (shard, row) arithmetic, from the shard sample counts alone.

No shard is opened here. ``ShardSet.index`` serves ``ds[i]`` and the loader's workers; the planner only takes
its ``sizes`` and lays out its own offsets per epoch (``shardload/plan/assign.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths


class ShardIndex:
    """Where each global sample id lives.

    Args:
        shard_sizes: ``(num_shards,)`` sample count of each shard, in id order.
    """

    def __init__(self, shard_sizes: Sequence[int] | NDArray[np.integer]) -> None:
        sizes = np.asarray(shard_sizes, dtype=np.int64)
        # starts: (num_shards + 1,) first global id of each shard, then the total
        self.starts: NDArray[np.int64] = offsets_from_lengths(sizes)
        self.sizes: NDArray[np.int64] = sizes

    @property
    def num_shards(self) -> int:
        return len(self.sizes)

    @property
    def num_samples(self) -> int:
        return int(self.starts[-1])

    def locate(self, ids: NDArray[np.integer] | int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(shard, row)`` arrays for global sample ids (vectorised)."""
        a: NDArray[np.int64] = np.asarray(ids, dtype=np.int64)
        n = int(self.starts[-1])
        # one pass for both bounds: a negative id is above every valid one as uint64
        if a.size and int(a.view(np.uint64).max()) >= n:
            bad = a[(a < 0) | (a >= n)][0]
            raise IndexError(f"sample id {int(bad)} out of range for a shard set of {n} samples")
        if len(self.sizes) == 1:
            return np.zeros(a.shape, dtype=np.int64), a.copy()
        shard: NDArray[np.int64] = self.starts.searchsorted(a, side="right") - 1
        return shard, a - self.starts[shard]

    def shards_of(self, ids: NDArray[np.integer]) -> NDArray[np.int64]:
        """Sorted distinct shard indices that hold ``ids``."""
        if len(ids) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.unique(self.locate(ids)[0])
