"""The small interface every on-disk shard format implements.

A shard holds the samples of one contiguous range of global sample ids, stored
column by column. For each field, a shard has:

* a variable field: ``values`` of shape ``(total_rows, *inner_shape)`` and
  ``offsets`` of shape ``(num_samples + 1,)``; sample ``i`` is
  ``values[offsets[i]:offsets[i + 1]]``;
* a fixed field: ``values`` of shape ``(num_samples, *shape)`` and no offsets.

Writers take :class:`Columns`; readers give the same :class:`Columns` back,
as zero-copy views where the format allows it. Formats register themselves by
name in :mod:`shardload.formats`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from shardload.identity import ShardIdentity
from shardload.plan.ranges import offsets_from_lengths, range_positions
from shardload.schema import Field, Schema


@dataclass(frozen=True)
class FieldData:
    """One field of a shard (or chunk) in columnar form.

    Attributes:
        values: ``(total_rows, *inner)`` for variable fields, ``(n, *shape)`` for fixed.
        offsets: ``(n + 1,)`` int64 row offsets for variable fields, else ``None``.
    """

    values: np.ndarray
    offsets: np.ndarray | None

    def item(self, i: int) -> np.ndarray:
        """Sample ``i`` of this field (a view)."""
        if self.offsets is None:
            out: np.ndarray = self.values[i]
        else:
            out = self.values[self.offsets[i] : self.offsets[i + 1]]
        return out

    def offsets_problem(self, samples: int) -> str | None:
        """What is wrong with a variable field's offsets for ``samples`` samples, or ``None``.

        The one rule the loader (on a shard's first open) and ``verify`` apply:
        ``samples + 1`` offsets, from 0 to the number of value rows. (Whether they
        never decrease is left to the lengths index they are compared with.)
        """
        offsets = self.offsets
        if offsets is None or len(offsets) != samples + 1:
            return f"no offsets for its {samples} samples"
        if offsets[0] != 0:
            return f"offsets start at {int(offsets[0])}, not 0"
        if int(offsets[-1]) != len(self.values):
            return f"offsets end at {int(offsets[-1])}, the values hold {len(self.values)} rows"
        return None

    def lengths(self) -> np.ndarray:
        """Per-sample first-axis lengths, ``(n,)`` int64 (1 for fixed fields)."""
        if self.offsets is None:
            return np.ones(len(self.values), dtype=np.int64)
        return np.diff(self.offsets)


@dataclass(frozen=True)
class Columns:
    """A shard's content: ``num_samples`` samples, one :class:`FieldData` per field."""

    num_samples: int
    fields: Mapping[str, FieldData]

    def sample(self, i: int) -> dict[str, np.ndarray]:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} out of range for a shard of {self.num_samples}")
        return {name: data.item(i) for name, data in self.fields.items()}

    @property
    def nbytes(self) -> int:
        total = 0
        for data in self.fields.values():
            total += data.values.nbytes + (0 if data.offsets is None else data.offsets.nbytes)
        return total

    @classmethod
    def from_samples(cls, schema: Schema, samples: Sequence[Mapping[str, np.ndarray]]) -> Columns:
        """Pack checked samples (see :meth:`Schema.check`) into columns."""
        fields = {}
        for f in schema.fields:
            parts = [s[f.name] for s in samples]
            fields[f.name] = _pack_field(f, parts)
        return cls(num_samples=len(samples), fields=fields)

    def take(self, rows: np.ndarray) -> Columns:
        """A new :class:`Columns` holding samples ``rows`` (in that order), copied."""
        rows = np.asarray(rows, dtype=np.int64)
        fields = {}
        for name, data in self.fields.items():
            if data.offsets is None:
                fields[name] = FieldData(np.ascontiguousarray(data.values[rows]), None)
                continue
            starts = data.offsets[rows]
            lens = data.offsets[rows + 1] - starts
            # the rows of every selected sample in one fancy-index
            values = data.values[range_positions(starts, lens)]
            fields[name] = FieldData(np.ascontiguousarray(values), offsets_from_lengths(lens))
        return Columns(num_samples=len(rows), fields=fields)


def concat_columns(schema: Schema, parts: Sequence[Columns]) -> Columns:
    """Concatenate chunks sample-wise (copies)."""
    fields = {}
    for f in schema.fields:
        datas = [p.fields[f.name] for p in parts]
        if not f.variable:
            values = np.concatenate([d.values for d in datas]) if datas else _empty(f, 0)
            fields[f.name] = FieldData(values, None)
            continue
        values = np.concatenate([d.values for d in datas]) if datas else _empty(f, 0)
        lens: np.ndarray = (
            np.concatenate([np.diff(d.offsets) for d in datas if d.offsets is not None])
            if datas
            else np.zeros(0, dtype=np.int64)
        )
        fields[f.name] = FieldData(values, offsets_from_lengths(lens))
    return Columns(num_samples=sum(p.num_samples for p in parts), fields=fields)


def _empty(f: Field, n: int) -> np.ndarray:
    return np.empty((n, *f.inner_shape), dtype=f.dtype)


def _pack_field(f: Field, parts: Sequence[np.ndarray]) -> FieldData:
    if not f.variable:
        values = np.stack(parts) if parts else _empty(f, 0)
        return FieldData(np.ascontiguousarray(values), None)
    lens = np.fromiter((p.shape[0] for p in parts), dtype=np.int64, count=len(parts))
    values = np.concatenate(parts) if parts else _empty(f, 0)
    return FieldData(np.ascontiguousarray(values), offsets_from_lengths(lens))


class ShardWriter(ABC):
    """Writes one shard file (or store) from :class:`Columns`."""

    #: the format's name in the registry and the manifest
    name: ClassVar[str]
    #: file-name suffix of a shard, e.g. ``".arrow"``
    suffix: ClassVar[str]

    def __init__(self, schema: Schema, **options: object) -> None:
        self.schema = schema
        self.options = options

    @abstractmethod
    def write(self, path: Path, columns: Columns, *, identity: ShardIdentity | None = None) -> None:
        """Write ``columns`` to ``path``; the caller renames it into place.

        ``identity`` (set by ``prepare`` for the shards of a set, not for staged
        chunks) goes into the file's own metadata, where readers give it back as
        :attr:`ShardReader.stored_identity`.
        """


class ShardReader(ABC):
    """Reads one shard back as :class:`Columns` (zero-copy where possible).

    Args:
        path: the shard file.
        schema: the shard set's schema (from the manifest).
        samples: the samples the manifest gives this shard, when known; a
            format whose sizes come from the file (Zarr) checks them against
            it before reading anything that large.
        options: the manifest's prepare options (e.g. Zarr's ``chunk_size``),
            which bound what a shard may declare.
    """

    name: ClassVar[str]

    def __init__(
        self, path: Path, schema: Schema, *, samples: int | None = None, options: Mapping[str, object] | None = None
    ) -> None:
        self.path = Path(path)
        self.schema = schema
        self.samples = samples
        self.options: Mapping[str, object] = dict(options or {})
        self._columns: Columns | None = None
        #: the identity record found in the shard's metadata by ``_open`` (raw; ``None`` when there is none)
        self.stored_identity: Any = None

    def columns(self) -> Columns:
        """The whole shard, opened lazily on first call and cached."""
        if self._columns is None:
            self._columns = self._open()
        return self._columns

    @abstractmethod
    def _open(self) -> Columns:
        """Open the shard (called by :meth:`columns` once, and again after :meth:`close`)."""

    def check_data(self) -> None:
        """Decode everything the shard holds once, for ``shardload verify``; raise on the first failure.

        Formats that read by mapping (Arrow) have checked every buffer when the
        shard was opened and do nothing more; formats that decode (Zarr) decode
        each chunk, one at a time, within the bounds they check at open.
        """
        self.columns()

    def fileno(self) -> int | None:
        """The descriptor of the file this reader has open (for ``fstat``), or ``None`` if none is open."""
        return None

    def close(self) -> None:
        """Release the file mapping; the reader may be reopened by ``columns()``.

        Formats that hold more than the columns release it after calling this.
        """
        self._columns = None
