"""The small interface every on-disk shard format implements.

A shard holds the samples of one contiguous range of global sample ids, stored
column by column. For each field, a shard has:

* a variable field: ``values`` of shape ``(total_rows, *inner_shape)`` and
  ``offsets`` of shape ``(num_samples + 1,)``; sample ``i`` is
  ``values[offsets[i]:offsets[i + 1]]``;
* a fixed field: ``values`` of shape ``(num_samples, *shape)`` and no offsets;
* a text field: ``values`` the ``uint8`` bytes of every sample end to end and
  ``offsets`` as for a variable field (:attr:`~shardload.schema.fields.Field.has_offsets`).

Writers take :class:`Columns`; readers give them back, zero-copy where the format allows. Each
format registers its writer, reader and :class:`FormatOptions` as a :class:`ShardFormat`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from shardload._base.checksum import file_checksum
from shardload._base.identity import ShardIdentity
from shardload._base.ranges import offsets_from_lengths, range_positions
from shardload.schema.fields import Field, Schema


class ChunkedValues(Protocol):
    """The ``values`` of a field a reader gives lazily (not as one ndarray), e.g. Zarr's decoded-on-demand chunks.

    Besides ndarray-style indexing, they tell the collate where a whole batch's rows are
    (:func:`shardload.load.collate.copy_slices`).
    """

    def slice_sources(
        self, starts: NDArray[np.int64], stops: NDArray[np.int64]
    ) -> tuple[Sequence[np.ndarray], list[int], list[int]]:
        """``(sources, los, his)``: rows ``starts[i]:stops[i]`` are ``sources[i][los[i]:his[i]]``."""
        ...


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

        The one rule of the loader and ``verify``: ``samples + 1`` offsets, from 0 to the number of
        value rows (that they never decrease is left to the lengths index they are compared with).
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

    @classmethod
    def from_samples(cls, schema: Schema, samples: Sequence[Mapping[str, np.ndarray]]) -> Columns:
        """Pack checked samples (see :meth:`Schema.check`) into columns."""
        fields = {f.name: _pack_field(f, [s[f.name] for s in samples]) for f in schema.fields}
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
        values = np.concatenate([d.values for d in datas]) if datas else _empty(f, 0)
        fields[f.name] = FieldData(values, concat_offsets(datas) if f.has_offsets else None)
    return Columns(num_samples=sum(p.num_samples for p in parts), fields=fields)


def concat_offsets(datas: Sequence[FieldData]) -> NDArray[np.int64]:
    """The offsets of one field of several chunks, concatenated sample-wise (int64, from 0)."""
    lens: np.ndarray = (
        np.concatenate([np.diff(d.offsets) for d in datas if d.offsets is not None])
        if datas
        else np.zeros(0, dtype=np.int64)
    )
    return offsets_from_lengths(lens)


def _empty(f: Field, n: int) -> np.ndarray:
    return np.empty((n, *f.inner_shape), dtype=f.value_dtype)


def _pack_field(f: Field, parts: Sequence[np.ndarray]) -> FieldData:
    if not f.has_offsets:
        values = np.stack(parts) if parts else _empty(f, 0)
        return FieldData(np.ascontiguousarray(values), None)
    lens = np.fromiter((p.shape[0] for p in parts), dtype=np.int64, count=len(parts))
    values = np.concatenate(parts) if parts else _empty(f, 0)
    return FieldData(np.ascontiguousarray(values), offsets_from_lengths(lens))


@dataclass(frozen=True)
class FormatOptions:
    """The options of one shard format: the base of each format's own frozen options class.

    A subclass resolves its defaults and checks itself when made (:class:`~shardload.errors.InputError`);
    ``prepare`` records :meth:`to_json` in the manifest's ``options``, where readers find it again.
    """

    def to_json(self) -> dict[str, Any]:
        """The options as the manifest's ``options`` records them: one key per field, defaults resolved."""
        return asdict(self)


OptionsT = TypeVar("OptionsT", bound=FormatOptions)


class ShardWriter(ABC, Generic[OptionsT]):
    """Writes one shard file (or store) from :class:`Columns`, with its format's options."""

    #: file-name suffix of a shard, e.g. ``".arrow"``
    suffix: ClassVar[str]
    #: whether a field of a shard is one Arrow array, whose length IPC bounds (prepare lays shards out within it)
    bounds_field_values: ClassVar[bool] = False

    def __init__(self, schema: Schema, options: OptionsT) -> None:
        self.check_schema(schema)
        self.schema = schema
        self.options = options

    @classmethod
    def check_schema(cls, schema: Schema) -> None:
        """Refuse a schema this format cannot store (``prepare`` asks on the first sample); none by default."""

    @abstractmethod
    def write(self, path: Path, columns: Columns, *, identity: ShardIdentity | None = None) -> None:
        """Write ``columns`` to ``path``; the caller renames it into place.

        ``identity`` (of a set's shard, not a staged chunk) goes into the file's own metadata
        (:attr:`ShardReader.stored_identity`).
        """

    def write_checksummed(self, path: Path, columns: Columns, *, identity: ShardIdentity | None = None) -> str:
        """:meth:`write`, and the file's :func:`~shardload._base.checksum.file_checksum` (here: read back)."""
        self.write(path, columns, identity=identity)
        return file_checksum(path)


class ShardReader(ABC):
    """Reads one shard back as :class:`Columns` (zero-copy where possible).

    Args:
        samples: the manifest's sample count, when known; a format whose sizes come from the file
            (Zarr) checks them against it before reading anything that large.
        options: the manifest's prepare options, which bound what a shard may declare.
    """

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

    @classmethod
    def plan_chunk_rows(cls, schema: Schema, options: Mapping[str, object]) -> int | None:
        """Value rows of the length field per stored chunk, before evening out per shard; ``None``: no chunks.

        For the planner's chunk windows (:attr:`shardload.plan.PlanInputs.chunk_rows`).
        """
        return None

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

        A mapped format (Arrow) checked every buffer at open already; Zarr decodes each chunk.
        """
        self.columns()

    def fileno(self) -> int | None:
        """The descriptor of the file this reader has open (for ``fstat``), or ``None`` if none is open."""
        return None

    def close(self) -> None:
        """Release the file mapping; the reader may be reopened by ``columns()``."""
        self._columns = None


@dataclass(frozen=True)
class OptionFlag:
    """A flag of ``shardload prepare`` that sets one field of a format's options.

    Attributes:
        field: the field of the format's options (``chunk_size``: ``--chunk-size``).
        kind: how its text is read: ``"text"``, ``"int"``, or ``"size"`` (``64KiB``, as ``--shard-size``).
        choices: the values a ``"text"`` flag accepts, when they are few.
    """

    field: str
    help: str
    kind: Literal["text", "int", "size"] = "text"
    choices: tuple[str, ...] = ()
    metavar: str | None = None

    @property
    def flag(self) -> str:
        """The flag as typed, e.g. ``--chunk-size``."""
        return "--" + self.field.replace("_", "-")


@dataclass(frozen=True)
class ShardFormat:
    """One on-disk shard format as registered in :data:`shardload.formats.FORMATS`.

    Attributes:
        name: ``--format``, ``shard_format="..."`` and the manifest's ``shard_format``.
        options: its :class:`FormatOptions` class (``shard_format=name`` means its defaults).
        summary: what it is, in a few words (the help of ``--format``).
    """

    name: str
    writer: type[ShardWriter[Any]]
    reader: type[ShardReader]
    options: type[FormatOptions]
    summary: str
    flags: tuple[OptionFlag, ...] = ()

    def option_names(self) -> tuple[str, ...]:
        """The fields of the format's options, in order."""
        return tuple(f.name for f in fields(self.options))
