"""Staging a unit's checked samples as chunks, one sample or a whole column batch at a time (part of ingest).

:func:`check_batch` accepts a batch only where the per-sample checks would accept every sample and
give the same arrays (else ingest reads it sample by sample, which reports the first wrong one);
:class:`ChunkStager` cuts chunks by one rule, so the chunks hold the same bytes either way
(docs/design.md, "Prepare in stages").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths
from shardload.formats.base import Columns, FieldData
from shardload.formats.origin import locator_origins
from shardload.prepare.guards import MAX_FIELD_VALUES
from shardload.schema.cast import CastError, cast_exact
from shardload.schema.fields import Field, Schema, dtype_name

__all__ = ["CheckedBatch", "ChunkStager", "check_batch"]


class CheckedBatch:
    """A batch that passed :func:`check_batch`: its columns as a chunk holds them, and each sample's size.

    Attributes:
        sizes: ``(n,)`` payload bytes of each sample.
        values: ``(n,)`` the most values any one field of each sample holds.
    """

    def __init__(self, columns: Columns, sizes: NDArray[np.int64], values: NDArray[np.int64]) -> None:
        self.columns, self.sizes, self.values = columns, sizes, values


def check_batch(
    columns: Columns, schema: Schema, dtypes: Mapping[str, str], reject_nonfinite: bool
) -> CheckedBatch | None:
    """``columns`` checked and cast as :class:`~shardload.prepare.ingest.SampleChecker` would check each
    sample, or None if any sample might fail or come out otherwise (then read the batch sample by sample)."""
    if len(columns.fields) != len(schema.fields) or any(f.name not in columns.fields for f in schema.fields):
        return None
    n = columns.num_samples
    fields: dict[str, FieldData] = {}
    sizes = np.zeros(n, dtype=np.int64)
    most = np.zeros(n, dtype=np.int64)
    for f in schema.fields:
        data = columns.fields[f.name]
        values = data.values
        if f.name in dtypes:
            try:
                values = cast_exact(values, dtypes[f.name])
            except CastError:
                return None
        if dtype_name(values.dtype) != f.dtype:
            return None
        staged = _as_field(f, values, data.offsets, n)
        if staged is None:
            return None
        if reject_nonfinite and values.dtype.kind == "f" and not np.isfinite(values).all():
            return None
        count = staged.lengths() * f.row_size if f.variable else np.full(n, f.row_size, dtype=np.int64)
        if n and int(count.max()) > MAX_FIELD_VALUES:
            return None
        fields[f.name] = staged
        sizes += count * values.dtype.itemsize
        np.maximum(most, count, out=most)
    return CheckedBatch(Columns(n, fields), sizes, most)


def _as_field(f: Field, values: np.ndarray, offsets: np.ndarray | None, n: int) -> FieldData | None:
    """One field of a batch as a chunk holds it, if every sample has the schema's shape; else None."""
    if offsets is None:  # sample i is values[i]
        shape = values.shape[1:]
        if not f.variable:
            return FieldData(values, None) if shape == f.shape else None
        if len(shape) != len(f.shape) or shape[1:] != f.shape[1:]:
            return None
        rows = shape[0]
        return FieldData(values.reshape(n * rows, *shape[1:]), np.arange(n + 1, dtype=np.int64) * rows)
    inner = values.shape[1:]  # sample i is values[offsets[i]:offsets[i + 1]]
    if f.variable:
        return FieldData(values, offsets) if (None, *inner) == f.shape else None
    lens = np.diff(offsets)
    if not f.shape or (None, *inner) != (None, *f.shape[1:]) or (n and (lens != f.shape[0]).any()):
        return None
    return FieldData(values[offsets[0] : offsets[-1]].reshape(n, *f.shape), None)


class ChunkStager:
    """Collects checked samples and column batches, and writes a chunk whenever one is full.

    The one rule of where a chunk ends: after the sample that brings it to ``chunk_bytes``, or before
    a sample that would bring one field past :data:`~shardload.prepare.guards.MAX_FIELD_VALUES`.
    ``write`` gets the chunk as the pieces it concatenates, in order, and their samples' origins.
    """

    def __init__(
        self,
        schema: Schema,
        chunk_bytes: int,
        files: Sequence[str],
        write: Callable[[list[Columns], list[pa.Table]], None],
    ) -> None:
        self.schema, self.chunk_bytes, self.files, self.write = schema, chunk_bytes, files, write
        self._samples: list[dict[str, np.ndarray]] = []
        self._wheres: list[str] = []
        self._pieces: list[Columns] = []
        self._origins: list[pa.Table] = []
        self._count = self._bytes = self._values = 0
        #: samples and payload bytes staged so far (whole chunks and pending ones)
        self.samples = 0
        self.nbytes = 0

    def add_sample(self, checked: dict[str, np.ndarray], where: str) -> None:
        """Stage one checked sample (see :class:`~shardload.prepare.ingest.SampleChecker`) read at ``where``."""
        size = sum(a.nbytes for a in checked.values())
        values = max(a.size for a in checked.values())
        if self._count and self._values + values > MAX_FIELD_VALUES:
            self.flush()
        self._samples.append(checked)
        self._wheres.append(where)
        self._add(1, size, values)
        if self._bytes >= self.chunk_bytes:
            self.flush()

    def add_batch(self, batch: CheckedBatch, origins: pa.Table) -> None:
        """Stage every sample of ``batch`` (``origins``: theirs, one row each), cutting chunks where
        :meth:`add_sample` would."""
        n, i = batch.columns.num_samples, 0
        while i < n:
            size = self._bytes + np.cumsum(batch.sizes[i:])
            over = self._values + np.cumsum(batch.values[i:]) > MAX_FIELD_VALUES
            if not self._count:
                over[0] = False  # a chunk takes its first sample whatever its size
            cut_before = _first(over)
            cut_after = _first(size >= self.chunk_bytes)
            take = cut_after + 1 if cut_after < cut_before else cut_before
            if take:
                self._move_samples()
                self._pieces.append(_slice(batch.columns, i, i + take))
                self._origins.append(origins.slice(i, take))
                self._add(take, int(size[take - 1]) - self._bytes, int(batch.values[i : i + take].sum()))
            if take < n - i or self._bytes >= self.chunk_bytes:
                self.flush()
            i += take

    def flush(self) -> None:
        """Write the pending samples as one chunk (nothing if none are pending)."""
        if not self._count:
            return
        self._move_samples()
        parts, origins = self._pieces, self._origins
        self._pieces, self._origins, self._count, self._bytes, self._values = [], [], 0, 0, 0
        self.write(parts if len(parts) > 1 else [_contiguous(parts[0])], origins)

    def _add(self, count: int, nbytes: int, values: int) -> None:
        self._count += count
        self._bytes += nbytes
        self._values += values
        self.samples += count
        self.nbytes += nbytes

    def _move_samples(self) -> None:
        if self._samples:
            self._pieces.append(Columns.from_samples(self.schema, self._samples))
            self._origins.append(locator_origins(self._wheres, self.files))
            self._samples, self._wheres = [], []


def _first(mask: NDArray[np.bool_]) -> int:
    """The index of the first True of ``mask``, or its length."""
    hit = int(np.argmax(mask)) if len(mask) else 0
    return hit if len(mask) and mask[hit] else len(mask)


def _slice(cols: Columns, a: int, b: int) -> Columns:
    """Samples ``a..b-1`` of ``cols`` (views, offsets from 0)."""
    fields = {}
    for name, data in cols.fields.items():
        if data.offsets is None:
            fields[name] = FieldData(data.values[a:b], None)
        else:
            off = data.offsets[a : b + 1]
            fields[name] = FieldData(data.values[int(off[0]) : int(off[-1])], off - off[0])
    return Columns(b - a, fields)


def _contiguous(cols: Columns) -> Columns:
    """``cols`` with contiguous values and int64 offsets, as :meth:`Columns.from_samples` makes them."""
    fields = {
        name: FieldData(
            np.ascontiguousarray(d.values), None if d.offsets is None else offsets_from_lengths(np.diff(d.offsets))
        )
        for name, d in cols.fields.items()
    }
    return Columns(cols.num_samples, fields)
