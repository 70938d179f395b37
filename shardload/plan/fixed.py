"""Fixed-size batches without bucketing (``batch_size``, ``bucketing=False``).

Batches are consecutive chunks of ``batch_size`` samples of the rank's range,
in random order (training) or epoch order (evaluation); only the rank's last
batch can be short. The count is a formula, ``ceil(n_r / batch_size)``, so
counting every rank costs nothing. (Bucketed fixed-size batches live in
:mod:`shardload.plan.buckets`.)
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from shardload.plan.batcher import Batcher, Batches, chunk_offsets

__all__ = ["FixedSizeBatcher"]


class FixedSizeBatcher(Batcher):
    """Consecutive chunks of ``batch_size`` rows (the last one of a rank may be smaller)."""

    @property
    def _size(self) -> int:
        assert self.batching.batch_size is not None
        return self.batching.batch_size

    def _count(self) -> NDArray[np.int64]:
        return -(-self.layout.rank_sizes // self._size)

    def _cut(self, ids: NDArray[np.int64], lens: NDArray[np.int64]) -> Batches:
        return ids, chunk_offsets(len(ids), self._size)
