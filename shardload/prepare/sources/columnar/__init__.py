"""Parquet (``.parquet``, ``.pq``) and Arrow IPC / Feather v2 (``.arrow``, ``.feather``, ``.ipc``) tables.

This module splits files into units (runs of row groups or record batches of about
``SourceOptions.unit_bytes``, each knowing the number of its first row) and reads their record
batches, each fully validated before its rows are read; :mod:`._columns` turns columns into fields.

Column types, units and damage checks (input format): docs/format.md, "Parquet and Arrow".
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa

from shardload.errors import InputError
from shardload.prepare.sources.base import Sample, SampleBatch, SourceOptions, SourceReader, SourceUnit, register
from shardload.prepare.sources.columnar._columns import EarlierArrays, batch_samples, column_batches
from shardload.prepare.sources.columnar._decoded import (
    decoded_too_large,
    ipc_batch_sizes,
    max_decoded_bytes,
    out_of_memory,
    parquet_group_bytes,
)

if TYPE_CHECKING:
    import pyarrow.parquet as pq

    from shardload.schema.fields import Schema

__all__ = ["ArrowSource", "ParquetSource", "batch_samples", "column_batches"]

#: rows per Parquet read batch aim at about this many uncompressed bytes
BATCH_BYTES = 64 << 20

#: one file of a unit: its path, table schema, (checked) record batches and the column arrays before them
_Table = tuple[str, pa.Schema, Iterator[pa.RecordBatch], EarlierArrays | None]


def _guarded(path: str, what: str, batches: Iterator[pa.RecordBatch], state: list[int]) -> Iterator[pa.RecordBatch]:
    """Turn pyarrow's read errors into InputError naming the file and how far it got."""
    try:
        for batch in batches:
            # Full validation finds damage that reading lets through (list offsets that go backwards would
            # give some rows other rows' values); it costs one pass over the offsets.
            batch.validate(full=True)
            yield batch
            state[0] += batch.num_rows
    except MemoryError as exc:  # pyarrow's ArrowMemoryError too: the file is fine, memory is short
        raise out_of_memory(path, f"the {what} rows after row {state[0]}", exc) from None
    except (pa.ArrowException, OSError) as exc:
        raise InputError(
            f"{path}: corrupt or truncated {what} data after row {state[0]} ({exc}); re-create the file"
        ) from None


# -- units: runs of row groups or record batches -------------------------------------------------------
def split_runs(sizes: Sequence[int], rows: Sequence[int], unit_bytes: int) -> list[tuple[tuple[int, int], int]]:
    """``((start, stop), rows before start)`` per run of consecutive pieces (row groups, record batches), each run
    ending once it holds ``unit_bytes`` or more."""
    runs: list[tuple[tuple[int, int], int]] = []
    start, acc, before = 0, 0, 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= unit_bytes or i == len(sizes) - 1:
            runs.append(((start, i + 1), before))
            before += sum(rows[start : i + 1])
            start, acc = i + 1, 0
    return runs


def _split_files(
    kind: str, files: Sequence[str], options: SourceOptions, pieces: Callable[[str], tuple[list[int], list[int]]]
) -> list[SourceUnit]:
    """One unit per file, or per run of a larger file's ``pieces`` (bytes and rows of each piece, in order);
    a file whose pieces cannot be listed (damaged, an IPC stream) is one unit."""
    units = []
    for path in files:
        runs: list[tuple[tuple[int, int], int]] = []
        sizes: list[int] = []
        try:
            size = os.stat(path).st_size
            if size > options.unit_bytes:
                sizes, rows = pieces(path)
                runs = split_runs(sizes, rows, options.unit_bytes_for(size))
        except (InputError, pa.ArrowException, OSError, UnicodeEncodeError):
            runs = []
        if len(runs) <= 1:
            units.append(SourceUnit(kind, (path,)))
        else:
            units.extend(SourceUnit(kind, (path,), (a, b), first, sum(sizes[a:b])) for (a, b), first in runs)
    return units


def _record_batches(path: str) -> tuple[list[int], list[int]]:
    """Bytes and rows of each record batch of an IPC file (raises for a stream, which cannot be split)."""
    with pa.memory_map(path, "r") as source:
        reader = pa.ipc.open_file(source)
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        return [b.nbytes for b in batches], [b.num_rows for b in batches]


# -- readers -----------------------------------------------------------------------------------------
class _TableSource(SourceReader):
    """A kind whose files are tables read as Arrow record batches: row by row, or batch by batch."""

    @classmethod
    def read(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
        for path, schema, batches, earlier in cls._tables(unit, options):
            with _memory_named(path):
                yield from batch_samples(batches, path, schema, unit.first, earlier)

    @classmethod
    def read_batches(cls, unit: SourceUnit, options: SourceOptions, schema: Schema) -> Iterator[SampleBatch]:
        for path, table_schema, batches, earlier in cls._tables(unit, options):
            with _memory_named(path):
                yield from column_batches(batches, path, table_schema, unit.first, earlier)

    @classmethod
    @abstractmethod
    def _tables(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[_Table]:
        """Per file of ``unit``: its path, schema, the record batches of the unit and the arrays before them,
        with only the columns ``options`` selects (:func:`_project`)."""


@contextlib.contextmanager
def _memory_named(path: str) -> Iterator[None]:
    """Running out of memory while the columns of ``path`` become samples (a dictionary column expanded to
    its values) is named as that, never a bare MemoryError."""
    try:
        yield
    except MemoryError as exc:
        raise out_of_memory(path, "its columns into samples", exc) from None


def _project(
    path: str, schema: pa.Schema, batches: Iterator[pa.RecordBatch], earlier: EarlierArrays | None, names: list[str]
) -> _Table:
    """A file's table with only the columns ``names`` (see :meth:`SourceOptions.select`), in that order."""
    projected = pa.schema([schema.field(n) for n in names])
    return path, projected, (batch.select(names) for batch in batches), earlier


@register
class ParquetSource(_TableSource):
    kind: ClassVar[str] = "parquet"
    suffixes: ClassVar[tuple[str, ...]] = (".parquet", ".pq")
    selects_fields: ClassVar[bool] = True

    @classmethod
    def make_units(cls, files: Sequence[str], options: SourceOptions) -> list[SourceUnit]:
        """One unit per file, or per run of row groups of a file larger than ``options.unit_bytes``."""
        return _split_files(cls.kind, files, options, cls._row_groups)

    @classmethod
    def _row_groups(cls, path: str) -> tuple[list[int], list[int]]:
        with cls._open(path) as pf:  # closed at once: discovery may list many large files
            meta = pf.metadata
        groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
        sizes = [sum(g.column(c).total_compressed_size for c in range(g.num_columns)) for g in groups]
        return sizes, [g.num_rows for g in groups]

    @staticmethod
    def _open(path: str) -> pq.ParquetFile:
        import pyarrow.parquet as pq

        _check_utf8_name(path)
        try:
            # Pages written with a checksum (pyarrow: write_page_checksum=True) are checked as they are read.
            return pq.ParquetFile(path, page_checksum_verification=True)
        except FileNotFoundError:
            raise InputError(f"{path}: file not found (was it deleted while prepare ran?)") from None
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{path}: not a readable Parquet file ({exc}); re-create the file") from None

    @classmethod
    def _tables(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[_Table]:
        for path in unit.files():
            pf = cls._open(path)
            with pf:
                try:
                    schema = pf.schema_arrow
                except (pa.ArrowException, OSError) as exc:
                    raise InputError(f"{path}: not a readable Parquet file ({exc}); re-create the file") from None
                meta = pf.metadata
                groups = range(*unit.part) if unit.part is not None else range(meta.num_row_groups)
                names = options.select(schema.names, path)
                raw = _check_decoded_rows(path, meta, groups, names, unit.first)
                rows = max(1, sum(meta.row_group(g).num_rows for g in groups))
                batch_size = int(np.clip(BATCH_BYTES * rows // max(raw, 1), 1, 65536))
                batches = pf.iter_batches(
                    batch_size=batch_size, row_groups=list(groups), columns=names, use_threads=False
                )
                earlier = None
                if groups.start:

                    def earlier(name: str, pf: pq.ParquetFile = pf, stop: int = groups.start) -> Iterator[pa.Array]:
                        for g in reversed(range(stop)):
                            yield pf.read_row_group(g, columns=[name], use_threads=False).column(0).combine_chunks()

                guarded = _guarded(path, "Parquet", batches, [unit.first])
                yield _project(path, schema, guarded, earlier, names)


def _check_decoded_rows(path: str, meta: pq.FileMetaData, groups: range, names: list[str], first: int) -> int:
    """What row groups ``groups`` of columns ``names`` decode to in all, refusing a group whose rows would decode
    to more than :func:`max_decoded_bytes` each: a row cannot be split across read batches."""
    limit, total, row = max_decoded_bytes(), 0, first
    for g in groups:
        size, rows = parquet_group_bytes(meta, g, names), meta.row_group(g).num_rows
        per_row = -(-size // max(rows, 1))
        if per_row > limit:
            piece = (
                f"row {row} (row group {g})" if rows == 1 else f"each of rows {row}-{row + rows - 1} (row group {g})"
            )
            raise decoded_too_large(path, piece, per_row, limit)
        total, row = total + size, row + rows
    return total


@register
class ArrowSource(_TableSource):
    kind: ClassVar[str] = "arrow"
    suffixes: ClassVar[tuple[str, ...]] = (".arrow", ".feather", ".ipc")
    selects_fields: ClassVar[bool] = True

    @classmethod
    def make_units(cls, files: Sequence[str], options: SourceOptions) -> list[SourceUnit]:
        """One unit per file, or per run of record batches of an IPC file larger than ``options.unit_bytes``."""
        return _split_files(cls.kind, files, options, _record_batches)

    @classmethod
    def _tables(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[_Table]:
        for path in unit.files():
            _check_utf8_name(path)
            try:
                source = pa.memory_map(path, "r")
            except FileNotFoundError:
                raise InputError(f"{path}: file not found (was it deleted while prepare ran?)") from None
            except (pa.ArrowException, OSError) as exc:
                raise InputError(f"{path}: cannot open ({exc})") from None
            with source:
                schema, batches, earlier = _open_ipc(path, source, unit.part)
                names = options.select(schema.names, path)
                guarded = _guarded(path, "Arrow IPC", batches, [unit.first])
                yield _project(path, schema, guarded, earlier, names)


def _check_utf8_name(path: str) -> None:
    """pyarrow opens files by UTF-8 path: refuse another name by name instead of crashing on it."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"{path!r}: the file name is not valid UTF-8, and pyarrow cannot open such a path; rename the file"
        ) from None


def _batch_sizes(source: pa.MemoryMappedFile, start: int) -> list[int]:
    """What each record batch decodes to (:func:`ipc_batch_sizes`); none known for a stream that cannot be scanned
    (its damage is then reported where it is read)."""
    try:
        return ipc_batch_sizes(source, start)
    except (pa.ArrowException, OSError, ValueError, struct.error):
        return []


def _decoded_batches(
    path: str, source: pa.MemoryMappedFile, start: int, get_batch: Callable[[int], pa.RecordBatch]
) -> Callable[[int], pa.RecordBatch]:
    """``get_batch``, refusing a record batch that would decode to more than :func:`max_decoded_bytes` first."""
    sizes, limit = _batch_sizes(source, start), max_decoded_bytes()

    def checked(i: int) -> pa.RecordBatch:
        if i < len(sizes) and sizes[i] > limit:
            raise decoded_too_large(path, f"record batch {i}", sizes[i], limit)
        return get_batch(i)

    return checked


def _checked_stream(path: str, stream: pa.ipc.RecordBatchStreamReader, sizes: list[int]) -> Iterator[pa.RecordBatch]:
    """The batches of an IPC stream, each checked as :func:`_decoded_batches` checks them, before it is decoded."""
    limit = max_decoded_bytes()
    for i in itertools.count():
        if i < len(sizes) and sizes[i] > limit:
            raise decoded_too_large(path, f"record batch {i}", sizes[i], limit)
        try:
            batch = stream.read_next_batch()
        except StopIteration:
            return
        yield batch


def _open_ipc(
    path: str, source: pa.MemoryMappedFile, part: tuple[int, int] | None = None
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], EarlierArrays | None]:
    """The schema and batches (those of ``part`` if given) of an IPC file (random access) or stream,
    and the column arrays before ``part``."""
    try:
        reader = pa.ipc.open_file(source)
        start, stop = part if part is not None else (0, reader.num_record_batches)
        checked = _decoded_batches(path, source, 8, reader.get_batch)  # after the file's magic and padding

        def earlier(name: str) -> Iterator[pa.Array]:
            for i in reversed(range(start)):
                yield checked(i).column(name)

        return reader.schema, (checked(i) for i in range(start, stop)), earlier if start else None
    except (pa.ArrowException, OSError):
        if part is not None:
            raise InputError(f"{path}: no longer an Arrow IPC file (did it change while prepare ran?)") from None
    try:
        source.seek(0)
        stream = pa.ipc.open_stream(source)
        sizes = _batch_sizes(source, 0)
        source.seek(0)
        stream = pa.ipc.open_stream(source)
        return stream.schema, _checked_stream(path, stream, sizes), None
    except (pa.ArrowException, OSError) as exc:
        raise InputError(
            f"{path}: not an Arrow IPC file or stream ({exc}). Feather v1 files are not supported: "
            "rewrite with pyarrow.feather.write_feather(table, path) (version 2)."
        ) from None
