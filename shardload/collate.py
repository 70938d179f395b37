"""Turn the samples of one planned batch into padded numpy arrays.

The batch contract (what a training step receives, as torch tensors):

* for each variable field ``f``: ``batch[f]`` of shape ``[B, L_pad, *inner]``,
  padded with the field's pad value, and ``batch[f + "_lengths"]`` (int64 ``[B]``);
* for each fixed field ``f``: ``batch[f]`` of shape ``[B, *shape]``;
* ``batch["sample_id"]``: int64 ``[B]``, global sample ids;
* ``batch["weight"]``: float32 ``[B]``, 1.0 for a real sample, 0.0 for filler.

``L_pad`` is the longest sample of the batch, rounded up to ``pad_to_multiple_of``.

The collate works in two steps: it first works out every output's shape (a
:data:`Layout`), then asks an :data:`Allocate` callable for the arrays and fills
them. Each sample is copied once, as a slice, straight into its row. The
allocator decides where the arrays live: separate numpy arrays by default, or
views of one shared-memory buffer per batch in a DataLoader worker (see
:mod:`shardload.dataset`), which the worker hands over as one piece instead of
one per array.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from shardload.formats import Columns
from shardload.schema import SAMPLE_ID_KEY, WEIGHT_KEY, Schema, lengths_key

#: ``(name, shape, dtype, zeroed)`` of each output array, in output order; ``zeroed``: it must start as zeros.
Layout = list[tuple[str, tuple[int, ...], np.dtype, bool]]
#: Makes writable arrays for a layout, keyed by name: zeros where asked, otherwise uninitialised.
Allocate = Callable[[Layout], dict[str, np.ndarray]]


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


def allocate_separately(layout: Layout) -> dict[str, np.ndarray]:
    """One ``np.zeros`` or ``np.empty`` per output (the default :data:`Allocate`)."""
    return {name: (np.zeros if zeroed else np.empty)(shape, dtype=dtype) for name, shape, dtype, zeroed in layout}


def group_by_shard(shards: NDArray[np.int64]) -> list[tuple[int, NDArray[np.int64] | None]]:
    """``(shard, positions)`` per distinct shard of a batch; ``positions`` is None when it is the only one.

    A batch usually touches one or two shards, so offsets and fixed fields are
    gathered per shard with numpy, not sample by sample.
    """
    if len(shards) == 0:
        return []
    lo, hi = int(shards.min()), int(shards.max())
    if lo == hi:
        return [(lo, None)]
    return [(int(s), np.flatnonzero(shards == s)) for s in np.unique(shards)]


def collate_batch(
    schema: Schema,
    columns_of: Callable[[int], Columns],
    shards: NDArray[np.int64],
    rows: NDArray[np.int64],
    sample_ids: NDArray[np.int64],
    weights: NDArray[np.float32],
    pad: PadSpec,
    allocate: Allocate = allocate_separately,
) -> dict[str, np.ndarray]:
    """Build one batch.

    Args:
        schema: the shard set's schema.
        columns_of: shard index -> its (memory-mapped) columns.
        shards, rows: ``(B,)`` where each sample lives.
        sample_ids, weights: ``(B,)`` global ids and weights from the plan.
        pad: padding options.
        allocate: makes the output arrays (default: one ``np.empty`` each).

    Returns:
        The arrays ``allocate`` made, filled, keyed by name in contract order.
    """
    b = len(sample_ids)
    groups = group_by_shard(shards)
    cols = {s: columns_of(s) for s, _ in groups}
    names = pad.fields if pad.fields is not None else schema.names
    layout: Layout = []
    bounds: dict[str, tuple[NDArray[np.int64], NDArray[np.int64]]] = {}
    fill_first: dict[str, bool] = {}
    for name in names:
        f = schema.field(name)
        if not f.variable:
            layout.append((name, (b, *f.inner_shape), np.dtype(f.dtype), False))
            continue
        starts, ends = _sample_bounds(cols, groups, name, rows)
        bounds[name] = starts, ends
        lengths = ends - starts
        l_pad = round_up(int(lengths.max(initial=0)), pad.pad_to_multiple_of)
        # Where padding is most of the array (random batches of long-tailed lengths), the whole array
        # is padded first and each sample copied over it: one numpy call per sample; zero padding then
        # comes from zeroed memory, which the kernel provides without a pass over it. Otherwise
        # (bucketed batches) each row's tail is padded after its sample, so no byte is written twice.
        fill_first[name] = b * l_pad - int(lengths.sum()) > int(lengths.sum())
        zeroed = fill_first[name] and pad.pad_values.get(name, 0) == 0
        layout.append((name, (b, l_pad, *f.inner_shape), np.dtype(f.dtype), zeroed))
        layout.append((lengths_key(name), (b,), np.dtype(np.int64), False))
    # the keys besides the fields: Schema.batch_keys() lists them, and no field may have one of their names
    layout.append((SAMPLE_ID_KEY, (b,), np.dtype(np.int64), False))
    layout.append((WEIGHT_KEY, (b,), np.dtype(np.float32), False))

    out = allocate(layout)
    for name in names:
        arr = out[name]
        if name not in bounds:
            for s, pos in groups:
                values = cols[s].fields[name].values
                if pos is None:
                    arr[:] = values[rows]  # values may be lazy (Zarr): index it, never np.take it
                else:
                    arr[pos] = values[rows[pos]]
            continue
        starts, ends = bounds[name]
        np.subtract(ends, starts, out=out[lengths_key(name)])
        pad_value = pad.pad_values.get(name, 0)
        if fill_first[name] and pad_value != 0:
            arr.fill(pad_value)
        _copy_rows(arr, cols, groups, name, starts, ends, None if fill_first[name] else pad_value)
    out[SAMPLE_ID_KEY][:] = sample_ids
    out[WEIGHT_KEY][:] = weights
    return out


def _sample_bounds(
    cols: Mapping[int, Columns],
    groups: list[tuple[int, NDArray[np.int64] | None]],
    name: str,
    rows: NDArray[np.int64],
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Start and end offset of each sample's values in its shard's values buffer."""
    if len(groups) == 1 and groups[0][1] is None:
        offsets = cols[groups[0][0]].fields[name].offsets
        assert offsets is not None
        return offsets[rows], offsets[rows + 1]
    starts = np.empty(len(rows), dtype=np.int64)
    ends = np.empty(len(rows), dtype=np.int64)
    for s, pos in groups:
        offsets = cols[s].fields[name].offsets
        assert offsets is not None and pos is not None
        r = rows[pos]
        starts[pos] = offsets[r]
        ends[pos] = offsets[r + 1]
    return starts, ends


def _copy_rows(
    arr: np.ndarray,
    cols: Mapping[int, Columns],
    groups: list[tuple[int, NDArray[np.int64] | None]],
    name: str,
    starts: NDArray[np.int64],
    ends: NDArray[np.int64],
    tail_pad: float | None,
) -> None:
    """Write each sample into its row of ``arr`` (``[B, L_pad, *inner]``), then ``tail_pad`` after it (if not None)."""
    b, l_pad = arr.shape[0], arr.shape[1]
    flat = arr.reshape(b * l_pad, *arr.shape[2:])  # a view: rows addressed by one slice each
    for s, pos in groups:
        values = cols[s].fields[name].values
        if pos is None:
            items = zip(range(b), starts.tolist(), ends.tolist())
        else:
            items = zip(pos.tolist(), starts[pos].tolist(), ends[pos].tolist())
        for i, st, en in items:
            lo = i * l_pad
            hi = lo + en - st
            flat[lo:hi] = values[st:en]
            if tail_pad is not None and hi < lo + l_pad:
                flat[hi : lo + l_pad] = tail_pad
