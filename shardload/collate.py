"""Turn the samples of one planned batch into padded numpy arrays.

The batch contract (what a training step receives, as torch tensors):

* for each variable field ``f``: ``batch[f]`` of shape ``[B, L_pad, *inner]``,
  padded with the field's pad value, and ``batch[f + "_lengths"]`` (int64 ``[B]``);
* for each fixed field ``f``: ``batch[f]`` of shape ``[B, *shape]``;
* ``batch["sample_id"]``: int64 ``[B]``, global sample ids;
* ``batch["weight"]``: float32 ``[B]``, 1.0 for a real sample, 0.0 for filler.

``L_pad`` is the longest sample of the batch, rounded up to ``pad_to_multiple_of``.
Each sample is copied once, as a slice, straight into the preallocated array.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from shardload.formats import Columns
from shardload.schema import Schema


@dataclass(frozen=True)
class PadSpec:
    """How to pad variable fields.

    Attributes:
        pad_values: pad value per field name (default 0 for every field).
        pad_to_multiple_of: round ``L_pad`` up to a multiple of this.
        fields: load only these fields (default: all).
    """

    pad_values: Mapping[str, float] = field(default_factory=dict)
    pad_to_multiple_of: int = 1
    fields: tuple[str, ...] | None = None


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple if multiple > 1 else n


def collate_batch(
    schema: Schema,
    columns_of: Callable[[int], Columns],
    shards: NDArray[np.int64],
    rows: NDArray[np.int64],
    sample_ids: NDArray[np.int64],
    weights: NDArray[np.float32],
    pad: PadSpec,
) -> dict[str, np.ndarray]:
    """Build one batch.

    Args:
        schema: the shard set's schema.
        columns_of: shard index -> its (memory-mapped) columns.
        shards, rows: ``(B,)`` where each sample lives.
        sample_ids, weights: ``(B,)`` global ids and weights from the plan.
        pad: padding options.
    """
    b = len(sample_ids)
    out: dict[str, np.ndarray] = {}
    # Group the rows by shard once (a batch usually touches one or two shards), so that
    # offsets and fixed fields are gathered with numpy, not sample by sample.
    groups = [(int(s), np.flatnonzero(shards == s)) for s in np.unique(shards)]
    cols = {s: columns_of(s) for s, _ in groups}
    shard_list = shards.tolist()
    names = pad.fields if pad.fields is not None else schema.names
    for name in names:
        f = schema.field(name)
        if not f.variable:
            arr = np.empty((b, *f.inner_shape), dtype=f.dtype)
            for s, pos in groups:
                arr[pos] = cols[s].fields[name].values[rows[pos]]
            out[name] = arr
            continue
        starts = np.empty(b, dtype=np.int64)
        ends = np.empty(b, dtype=np.int64)
        for s, pos in groups:
            offsets = cols[s].fields[name].offsets
            assert offsets is not None
            starts[pos] = offsets[rows[pos]]
            ends[pos] = offsets[rows[pos] + 1]
        lengths = ends - starts
        l_pad = round_up(int(lengths.max(initial=0)), pad.pad_to_multiple_of)
        pad_value = pad.pad_values.get(name, 0)
        # Uninitialised, then each row written once: its sample, then its padding tail. Zeroing the
        # whole array first (np.zeros/np.full) costs a second pass over it, which dominated
        # bucketed batches (little padding, large arrays).
        arr = np.empty((b, l_pad, *f.inner_shape), dtype=f.dtype)
        values_of = {s: cols[s].fields[name].values for s, _ in groups}
        for i, (s, st, en) in enumerate(zip(shard_list, starts.tolist(), ends.tolist())):
            n = en - st
            arr[i, :n] = values_of[s][st:en]
            if n < l_pad:
                arr[i, n:] = pad_value
        out[name] = arr
        out[f"{name}_lengths"] = lengths
    out["sample_id"] = np.array(sample_ids, dtype=np.int64)  # copies: plan arrays are read-only
    out["weight"] = np.array(weights, dtype=np.float32)
    return out
