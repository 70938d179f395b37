"""Turn the documents of one packed batch into fixed-shape, padding-free numpy arrays.

A packed plan gives, per batch, which samples ("documents") go into which row (a
:class:`~shardload.load.dataset.BatchKey` with ``rows`` and ``starts``); given a :class:`PackSpec`, the dataset
calls :func:`collate_packed` instead of :func:`~shardload.load.collate.collate_batch`, sharing its allocator and
copy loop. Contract: docs/loading.md, "Packed batches". A document is sample ``sample_ids[i]`` from token
``starts[i]``: ``[start, min(start + P, length))`` of every variable field (which share the batching length).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload.errors import PlanError
from shardload.formats import Columns
from shardload.load.collate import (
    Allocate,
    Layout,
    PadSpec,
    allocate_separately,
    copy_slices,
    fill_plan_keys,
    gather_fixed,
    group_by_shard,
    plan_layout,
    sample_bounds,
    text_lists,
)
from shardload.plan.options import MAX_COUNT, MAX_PACKED_TOKENS, check_packed_tokens
from shardload.schema.fields import (
    CU_SEQLENS_KEY,
    DOCUMENT_IDS_KEY,
    MAX_SEQLEN_KEY,
    POSITION_IDS_KEY,
    SAMPLE_START_KEY,
    Schema,
    lengths_key,
)


@dataclass(frozen=True)
class PackSpec:
    """The shape of packed batches: ``rows_per_batch`` rows of ``pack_length`` tokens.

    Construction checks the numbers; :meth:`check_set` checks a shard set can be packed. Both raise
    :class:`~shardload.errors.PlanError`.

    Attributes:
        pack_length: tokens per row (``P``).
        rows_per_batch: rows per batch (``R``).
        position_start: the first ``position_ids`` value of every document (0 or 1, as the model expects).
    """

    pack_length: int
    rows_per_batch: int
    position_start: int = 0

    def __post_init__(self) -> None:
        from shardload._base.checks import check_scalar

        check_scalar("pack_length", self.pack_length, low=1, high=MAX_PACKED_TOKENS)
        check_scalar("rows_per_batch", self.rows_per_batch, low=1, high=MAX_PACKED_TOKENS)
        check_scalar("position_start", self.position_start, low=0, high=MAX_COUNT)
        check_packed_tokens(self.pack_length, self.rows_per_batch)
        for name in ("pack_length", "rows_per_batch", "position_start"):
            object.__setattr__(self, name, int(getattr(self, name)))

    def check_set(
        self,
        schema: Schema,
        pad: PadSpec,
        lengths: NDArray[np.integer],
        field_lengths: Callable[[str], NDArray[np.integer]],
        where: str,
    ) -> None:
        """Refuse a shard set that packed batches cannot be built from.

        ``lengths`` is the ``(N,)`` batching length of every sample; ``field_lengths`` gives a field's ``(N,)``
        first-axis lengths.

        Raises:
            PlanError: no variable field is loaded; a loaded field has the name
                of a key of packed batches; a loaded variable field's length
                differs from the batching length of some sample (its tokens
                would not line up with the other fields' in a row).
        """
        loaded = pad.fields if pad.fields is not None else schema.names
        variable = [schema.field(n) for n in loaded if schema.field(n).variable]
        if not variable:
            raise PlanError(
                f"packing needs a variable-length field, and the loaded fields of {where} ({', '.join(loaded)}) all "
                "have a fixed shape; load batches with batch_size or max_tokens instead"
            )
        reserved = schema.batch_keys(packed=True)
        clash = [n for n in loaded if n in reserved]
        if clash:
            raise PlanError(
                f"field {clash[0]!r} of {where} has the name of a key packed batches add ({reserved[clash[0]]}); "
                "rename the field, or leave it out with fields=..."
            )
        for f in variable:
            per_field = field_lengths(f.name)
            if per_field is lengths:
                continue
            bad = np.flatnonzero(np.asarray(per_field) != np.asarray(lengths))
            if len(bad):
                i = int(bad[0])
                others = ", ".join(repr(v.name) for v in variable if v is not f)
                todo = (
                    f"compared with {others}); load only fields of equal lengths (fields=...)"
                    if others
                    else "the batching length is the set's length_field, else its longest variable field); load "
                    "the field that gives it, or prepare the set with length_field=" + repr(f.name)
                )
                raise PlanError(
                    f"packing needs every loaded variable field to have the batching length of each sample, but in "
                    f"{where} field {f.name!r} of sample {i} has {int(per_field[i])} rows and its batching length "
                    f"is {int(lengths[i])} ({len(bad)} samples differ; {todo}"
                )


def collate_packed(
    schema: Schema,
    columns_of: Callable[[int], Columns],
    shards: NDArray[np.int64],
    shard_rows: NDArray[np.int64],
    sample_ids: NDArray[np.int64],
    weights: NDArray[np.float32],
    rows: NDArray[np.integer],
    starts: NDArray[np.integer],
    pad: PadSpec,
    pack: PackSpec,
    allocate: Allocate = allocate_separately,
) -> dict[str, Any]:
    """Build one packed batch: the arrays ``allocate`` made, filled, then a list per text field (one per document).

    All arrays are ``(E,)``, one entry per document: ``shards``, ``shard_rows`` say where its sample lives,
    ``rows`` its row in the batch (non-decreasing), ``starts`` its first token (0 unless the sample was cut).
    The schema was checked with :meth:`PackSpec.check_set`.

    Raises:
        PlanError: the documents do not fit the spec (a row out of range or
            over ``pack_length`` tokens, rows out of order, a start beyond its
            sample); a plan made for other options.
    """
    e, r, p = len(sample_ids), pack.rows_per_batch, pack.pack_length
    rows64 = np.asarray(rows, dtype=np.int64)
    starts64 = np.asarray(starts, dtype=np.int64)
    if not len(weights) == len(rows64) == len(starts64) == e:
        raise PlanError(
            f"a packed batch needs one row and one start per document: {e} sample ids, {len(weights)} weights, "
            f"{len(rows64)} rows, {len(starts64)} starts"
        )
    groups = group_by_shard(shards)
    cols = {s: columns_of(s) for s, _ in groups}
    names = pad.fields if pad.fields is not None else schema.names
    variable = [n for n in names if schema.field(n).variable]
    bounds = {name: sample_bounds(cols, groups, name, shard_rows) for name in variable}
    first = bounds[variable[0]]
    n, dst = _place(sample_ids, first[1] - first[0], rows64, starts64, pack)
    fill = np.bincount(rows64, weights=n, minlength=r).astype(np.int64) if e else np.zeros(r, np.int64)
    row_end = (rows64 + 1) * p
    last_in_row = np.ones(e, dtype=bool)
    last_in_row[:-1] = rows64[1:] != rows64[:-1]
    pad_to = np.where(last_in_row, row_end, dst + n)
    empty_rows = np.flatnonzero(fill == 0)
    tails = np.flatnonzero(fill < p)
    num_seqs = e + len(tails)

    layout: Layout = []
    for name in names:
        f = schema.field(name)
        if f.text:
            continue  # a list (text_lists)
        if f.variable:
            layout.append((name, (r, p, *f.inner_shape), np.dtype(f.dtype), False))
            layout.append((lengths_key(name), (e,), np.dtype(np.int64), False))
        else:
            layout.append((name, (e, *f.inner_shape), np.dtype(f.dtype), False))
    layout.append((POSITION_IDS_KEY, (r, p), np.dtype(np.int64), False))
    layout.append((DOCUMENT_IDS_KEY, (r, p), np.dtype(np.int32), False))
    layout.append((CU_SEQLENS_KEY, (num_seqs + 1,), np.dtype(np.int32), False))
    layout.append((MAX_SEQLEN_KEY, (), np.dtype(np.int32), False))
    layout.append((SAMPLE_START_KEY, (e,), np.dtype(np.int64), False))
    layout += plan_layout(e)

    out: dict[str, Any] = allocate(layout)
    for name in names:
        if schema.field(name).text:
            continue
        arr = out[name]
        if name not in bounds:
            gather_fixed(arr, cols, groups, name, shard_rows)
            continue
        pad_value = pad.pad_values.get(name, 0)
        lo = bounds[name][0] + starts64
        copy_slices(arr.reshape(r * p, *arr.shape[2:]), cols, groups, name, (lo, lo + n), dst, pad_to, pad_value)
        arr[empty_rows] = pad_value
        out[lengths_key(name)][:] = n
    _token_maps(out, n, fill, pack)
    seq_starts = np.concatenate([dst, tails * p + fill[tails], [r * p]])
    cu = out[CU_SEQLENS_KEY]
    cu[:] = np.sort(seq_starts, kind="stable")
    out[MAX_SEQLEN_KEY][...] = np.diff(cu).max()
    out[SAMPLE_START_KEY][:] = starts64
    fill_plan_keys(out, sample_ids, weights)
    out.update(text_lists(schema, names, cols, groups, shard_rows))
    return out


def _place(
    sample_ids: NDArray[np.int64],
    lengths: NDArray[np.int64],
    rows: NDArray[np.int64],
    starts: NDArray[np.int64],
    pack: PackSpec,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(E,)`` tokens of each document and its first position in the flattened batch; PlanError if they do not fit."""
    e, r, p = len(rows), pack.rows_per_batch, pack.pack_length
    if e == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if rows.min() < 0 or rows.max() >= r:
        bad = int(np.flatnonzero((rows < 0) | (rows >= r))[0])
        raise PlanError(
            f"a packed batch puts sample {int(sample_ids[bad])} in row {int(rows[bad])}, outside the "
            f"{r} rows_per_batch of the loader's PackSpec; the plan was made with other options"
        )
    if np.any(rows[1:] < rows[:-1]):
        raise PlanError("a packed batch must list its documents by row (rows non-decreasing); the plan is not ordered")
    bad_start = (starts < 0) | ((starts >= lengths) & (starts > 0))
    if bad_start.any():
        i = int(np.flatnonzero(bad_start)[0])
        raise PlanError(
            f"a packed batch starts sample {int(sample_ids[i])} at token {int(starts[i])}, outside its "
            f"{int(lengths[i])} tokens; the plan was made from another shard set"
        )
    n = np.minimum(lengths - starts, p)
    ends = np.cumsum(n)
    first_of_row = np.ones(e, dtype=bool)
    first_of_row[1:] = rows[1:] != rows[:-1]
    # tokens before each document in its row: the running total, less the total before its row began
    row_base = np.maximum.accumulate(np.where(first_of_row, ends - n, 0))
    offset = ends - n - row_base
    over = offset + n > p
    if over.any():
        row = int(rows[np.flatnonzero(over)[0]])
        raise PlanError(
            f"a packed batch puts {int(n[rows == row].sum())} tokens in row {row}, more than pack_length={p}; "
            "the plan was made with other options"
        )
    return n, rows * p + offset


def _token_maps(out: dict[str, np.ndarray], n: NDArray[np.int64], fill: NDArray[np.int64], pack: PackSpec) -> None:
    """Write ``position_ids`` and ``document_ids``: each row's documents fill its first ``fill[row]`` tokens."""
    p = pack.pack_length
    real = np.arange(p, dtype=np.int64) < fill[:, None]  # [R, P], in row-major order: entry order
    total = int(n.sum())
    doc = out[DOCUMENT_IDS_KEY]
    pos = out[POSITION_IDS_KEY]
    doc.fill(-1)
    pos.fill(0)
    doc[real] = np.repeat(np.arange(len(n), dtype=np.int32), n)
    pos[real] = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n) + pack.position_start
