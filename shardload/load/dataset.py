"""A map-style dataset whose items are whole planned batches.

The sampler (main process) yields one :class:`BatchKey` per batch; a worker turns it into tensors, mapping on
first use only the shards it touches. Workers never hold the plan, so they need no update between epochs and
batches do not depend on ``num_workers``. A batch under :data:`SHARED_FROM_BYTES` goes back by value, a larger
one as one shared-memory buffer (why: docs/benchmarks.md, "Worker hand-off").
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import Dataset, get_worker_info

from shardload.errors import PlanError, ShardSetChangedError
from shardload.formats import Columns
from shardload.load.collate import Allocate, Layout, PadSpec, allocate_separately, collate_batch
from shardload.load.collate_packed import PackSpec, collate_packed
from shardload.remote.url import is_remote, local_path
from shardload.sets.mixture import SOURCE_KEY, MixedSets
from shardload.sets.shardset import ShardSet


@dataclass(frozen=True)
class BatchKey:
    """One planned batch, as sent to a worker.

    Attributes:
        index: position of the batch in this rank's epoch plan.
        sample_ids: ``(B,)`` int64 global ids (filler rows included); packed: ``(E,)``, one per document.
        weights: ``(B,)`` float32, 0.0 for filler.
        rows: packed batches only (:mod:`shardload.load.collate_packed`): ``(E,)`` int32 row of each document,
            ordered by row, then by position in the row.
        starts: packed batches only: ``(E,)`` int64 first token of each document's sample; None means all 0.
    """

    index: int
    sample_ids: NDArray[np.int64]
    weights: NDArray[np.float32]
    rows: NDArray[np.int32] | None = None
    starts: NDArray[np.int64] | None = None


ALIGN = 64  # bytes; every array in a shared batch buffer starts at a multiple of this
#: A worker's batch of at least this many bytes is sent as one shared-memory buffer, a smaller one by value.
SHARED_FROM_BYTES = 640 << 10


@functools.cache
def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype that ``torch.from_numpy`` gives an array of ``dtype``."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class WorkerBatch:
    """A batch on its way from a worker: numpy arrays (sent by value) or torch views of one shared buffer."""

    __slots__ = ("arrays", "shared")

    def __init__(self, arrays: dict[str, Any], shared: bool) -> None:
        self.arrays = arrays
        self.shared = shared

    def tensors(self) -> dict[str, Any]:
        """The batch dict; small tensors of a shared buffer are copied out (:func:`own_small_tensors`)."""
        if not self.shared:
            return as_tensors(self.arrays)
        return own_small_tensors(self.arrays)

    def pin_memory(self) -> dict[str, Any]:
        """The batch dict in pinned memory (one pinned copy per tensor; text lists as they are)."""
        out = as_tensors(self.arrays) if not self.shared else self.arrays
        return {k: t.pin_memory() if isinstance(t, torch.Tensor) else t for k, t in out.items()}


def as_tensors(arrays: dict[str, Any]) -> dict[str, Any]:
    """A batch of numpy arrays as tensors (shared memory, no copy); a text field's list stays a list."""
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}


class BatchArena:
    """The :data:`~shardload.load.collate.Allocate` of a worker: one shared buffer from ``shared_from`` bytes.

    After the call, :meth:`batch` wraps the arrays for sending.
    """

    def __init__(self, shared_from: int | None = None) -> None:
        self.shared_from = SHARED_FROM_BYTES if shared_from is None else shared_from
        self.tensors: dict[str, torch.Tensor] | None = None
        self.arrays: dict[str, np.ndarray] = {}

    def __call__(self, layout: Layout) -> dict[str, np.ndarray]:
        spans, total = [], 0
        for _, shape, dtype, _zeroed in layout:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            spans.append((total, nbytes))
            total += -(-nbytes // ALIGN) * ALIGN
        new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
        if total < self.shared_from or new_shared is None:
            self.arrays = allocate_separately(layout)
            return self.arrays
        buf = torch.empty(0, dtype=torch.uint8).set_(new_shared(total))  # new shared memory reads as zeros
        raw = buf.numpy()
        self.tensors = {}
        for (name, shape, dtype, _zeroed), (start, nbytes) in zip(layout, spans):
            self.arrays[name] = raw[start : start + nbytes].view(dtype).reshape(shape)
            self.tensors[name] = buf[start : start + nbytes].view(torch_dtype(dtype)).view(shape)
        return self.arrays

    def batch(self, lists: dict[str, Any] | None = None) -> WorkerBatch:
        """What the worker returns; ``lists``: the batch's text fields (lists), sent with it by value."""
        if self.tensors is not None:
            return WorkerBatch({**self.tensors, **(lists or {})}, shared=True)
        return WorkerBatch({**self.arrays, **(lists or {})}, shared=False)


def own_small_tensors(batch: dict[str, Any]) -> dict[str, Any]:
    """Copy out of a shared batch buffer every tensor under 1/8 of its size.

    A view keeps its whole buffer alive: a loop that keeps ``batch["sample_id"]`` would keep every batch.
    """
    tensors = [t for t in batch.values() if isinstance(t, torch.Tensor)]
    if not tensors:
        return batch
    size = max(t.untyped_storage().nbytes() for t in tensors)
    return {k: t.clone() if isinstance(t, torch.Tensor) and t.nbytes * 8 < size else t for k, t in batch.items()}


class ShardBatchDataset(Dataset[Any]):
    """Fetches and pads planned batches from one shard set, or from a mixture of sets.

    Args:
        path: the shard set directory, or an opened :class:`ShardSet` or mixture
            (:class:`~shardload.sets.mixture.MixedSets`) to reuse; workers get a copy without mappings. A
            mixture's batches also hold ``batch["source"]``.
        pad: checked against the set's schema (:meth:`PadSpec.for_schema`) when the set is opened, here if
            an opened set is given.
        fingerprint: the manifest fingerprint the plan was made from; a worker that finds a different one
            raises :class:`ShardSetChangedError` instead of mixing old and new data.
        pack: build packed batches of this shape; checked against the set (:meth:`PackSpec.check_set`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | ShardSet | MixedSets,
        pad: PadSpec | None = None,
        *,
        fingerprint: str | None = None,
        pack: PackSpec | None = None,
    ):
        self._shard_set: ShardSet | MixedSets | None = None
        self.path: Path | str
        self.pad = pad or PadSpec()
        if pack is not None and not isinstance(pack, PackSpec):
            raise PlanError(f"pack must be a PackSpec or None, got {type(pack).__name__}")
        self.pack = pack
        self._pad_checked = False
        if isinstance(path, (ShardSet, MixedSets)):
            self._shard_set, self.path = path, path.path
            self._check_pad(path)  # a typo in pad_values fails here, not in a worker
        else:
            self.path = str(path) if is_remote(path) else Path(local_path(path))
        self.fingerprint = fingerprint

    def _check_pad(self, shard_set: ShardSet | MixedSets) -> None:
        if not self._pad_checked:
            self.pad = self.pad.for_schema(shard_set.schema, str(shard_set.path))
            if self.pack is not None:
                sets = zip(shard_set.names, shard_set.sets) if isinstance(shard_set, MixedSets) else [("", shard_set)]
                for name, one in sets:
                    where = f"source {name!r} ({one.path})" if name else str(one.path)
                    self.pack.check_set(one.schema, self.pad, one.lengths, one.field_lengths, where)
            self._pad_checked = True

    @property
    def shard_set(self) -> ShardSet | MixedSets:
        """Opened lazily in each process (after the worker fork), manifest only."""
        if self._shard_set is None:
            shard_set = ShardSet(self.path)
            if self.fingerprint is not None and shard_set.fingerprint != self.fingerprint:
                raise ShardSetChangedError(
                    f"{self.path} changed since this job planned its epoch (fingerprint {self.fingerprint} -> "
                    f"{shard_set.fingerprint}); it was re-prepared while the job ran. Restart the job."
                )
            self._check_pad(shard_set)
            self._shard_set = shard_set
        return self._shard_set

    def __len__(self) -> int:
        return len(self.shard_set)

    def fetch(
        self,
        sample_ids: NDArray[np.int64],
        weights: NDArray[np.float32],
        allocate: Allocate = allocate_separately,
        *,
        rows: NDArray[np.integer] | None = None,
        starts: NDArray[np.integer] | None = None,
    ) -> dict[str, Any]:
        """The batch as numpy arrays (a list per text field): padded, or packed when ``rows`` is given.

        Raises:
            PlanError: a packed key for a dataset without a :class:`PackSpec`, or the reverse.
        """
        if (rows is None) != (self.pack is None):
            raise PlanError(
                "a packed batch (a BatchKey with rows) needs a dataset built with pack=PackSpec(...)"
                if rows is not None
                else f"this dataset packs batches ({self.pack}), and the batch has no rows: the plan is not packed; "
                "build loader and plan from the same Batching"
            )
        ss = self.shard_set
        if isinstance(ss, MixedSets):  # one more per-sample key, in the same allocation as the rest
            allocate = _with_source(allocate, len(sample_ids))
        shards, where = ss.index.locate(sample_ids)
        touched: list[int] = []

        def columns_of(shard: int) -> Columns:
            cols = ss.shard_columns(shard)  # checks the file's stamp before its pages are read
            touched.append(shard)
            return cols

        if rows is None or self.pack is None:
            out = collate_batch(ss.schema, columns_of, shards, where, sample_ids, weights, self.pad, allocate)
        else:
            at = np.zeros(len(sample_ids), np.int64) if starts is None else starts
            out = collate_packed(
                ss.schema, columns_of, shards, where, sample_ids, weights, rows, at, self.pad, self.pack, allocate
            )
        # Again after the copy: a shard rewritten while this batch was read must not go out as data.
        ss.check_shards_unchanged(touched)
        ss.release_others(touched)  # a remote set in a bounded cache: only this batch's shards stay held
        if isinstance(ss, MixedSets):
            out[SOURCE_KEY][:] = ss.source_of(sample_ids)
        return out

    def __getitem__(self, key: BatchKey) -> dict[str, Any] | WorkerBatch:
        """The batch dict in the main process; in a worker, a :class:`WorkerBatch` that the loader unpacks."""
        if not isinstance(key, BatchKey):
            raise TypeError(
                "ShardBatchDataset is indexed by BatchKey objects from shardload's sampler, got "
                f"{type(key).__name__}. Was the DataLoader's sampler replaced (e.g. by a DistributedSampler)?"
            )
        if get_worker_info() is None:  # the main process: nothing to send, plain arrays are cheapest
            return as_tensors(self.fetch(key.sample_ids, key.weights, rows=key.rows, starts=key.starts))
        arena = BatchArena()
        out = self.fetch(key.sample_ids, key.weights, arena, rows=key.rows, starts=key.starts)
        return arena.batch({k: v for k, v in out.items() if isinstance(v, list)})

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if not isinstance(self._shard_set, MixedSets):  # a mixture travels whole: its sets pickle without mappings
            state["_shard_set"] = None  # each worker maps shards itself
        return state


def _with_source(allocate: Allocate, b: int) -> Allocate:
    """``allocate``, asked for one more array: ``batch["source"]``, int64 ``(b,)`` (filled after the collate)."""

    def allocate_with_source(layout: Layout) -> dict[str, np.ndarray]:
        return allocate([*layout, (SOURCE_KEY, (b,), np.dtype(np.int64), False)])

    return allocate_with_source
