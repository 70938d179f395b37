"""A map-style dataset whose items are whole planned batches.

The sampler (:mod:`shardload.loader`) runs in the main process and yields one
:class:`BatchKey` per batch: the global sample ids and weights the plan chose.
A worker turns a key into tensors with :meth:`ShardBatchDataset.__getitem__`,
memory-mapping on first use only the shards those ids live in. Workers never
hold the plan, so they need no update between epochs, and the batches are the
same whatever ``num_workers`` is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import Dataset

from shardload.collate import PadSpec, collate_batch
from shardload.errors import ShardSetChangedError
from shardload.shardset import ShardSet


@dataclass(frozen=True)
class BatchKey:
    """One planned batch, as sent to a worker.

    Attributes:
        index: position of the batch in this rank's epoch plan.
        sample_ids: ``(B,)`` int64 global ids (filler rows included).
        weights: ``(B,)`` float32, 0.0 for filler.
    """

    index: int
    sample_ids: NDArray[np.int64]
    weights: NDArray[np.float32]


class ShardBatchDataset(Dataset[dict[str, torch.Tensor]]):
    """Fetches and pads planned batches from one shard set.

    Args:
        path: the shard set directory, or an opened :class:`ShardSet` to reuse
            (saves parsing the manifest again in the main process; worker
            processes get a copy without mappings and map their own shards).
        pad: padding options (pad values, multiple, fields to load).
        fingerprint: the manifest fingerprint the plan was made from; a worker
            that finds a different one (the set was re-prepared) raises
            :class:`ShardSetChangedError` instead of mixing old and new data.
    """

    def __init__(
        self, path: str | os.PathLike[str] | ShardSet, pad: PadSpec | None = None, *, fingerprint: str | None = None
    ):
        self._shard_set: ShardSet | None = None
        if isinstance(path, ShardSet):
            self._shard_set, self.path = path, path.path
        else:
            self.path = Path(path)
        self.pad = pad or PadSpec()
        self.fingerprint = fingerprint

    @property
    def shard_set(self) -> ShardSet:
        """Opened lazily in each process (after the worker fork), manifest only."""
        if self._shard_set is None:
            shard_set = ShardSet(self.path)
            if self.fingerprint is not None and shard_set.fingerprint != self.fingerprint:
                raise ShardSetChangedError(
                    f"{self.path} changed since this job planned its epoch (fingerprint {self.fingerprint} -> "
                    f"{shard_set.fingerprint}); it was re-prepared while the job ran. Restart the job."
                )
            self._shard_set = shard_set
        return self._shard_set

    def __len__(self) -> int:
        return len(self.shard_set)

    def fetch(self, sample_ids: NDArray[np.int64], weights: NDArray[np.float32]) -> dict[str, np.ndarray]:
        """The padded batch as numpy arrays (see :mod:`shardload.collate` for the contract)."""
        ss = self.shard_set
        shards, rows = ss.index.locate(sample_ids)
        return collate_batch(ss.schema, ss.shard_columns, shards, rows, sample_ids, weights, self.pad)

    def __getitem__(self, key: BatchKey) -> dict[str, torch.Tensor]:
        if not isinstance(key, BatchKey):
            raise TypeError(
                "ShardBatchDataset is indexed by BatchKey objects from shardload's sampler, got "
                f"{type(key).__name__}. Was the DataLoader's sampler replaced (e.g. by a DistributedSampler)?"
            )
        arrays = self.fetch(key.sample_ids, key.weights)
        return {k: torch.from_numpy(v) for k, v in arrays.items()}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_shard_set"] = None  # each worker maps shards itself
        return state
