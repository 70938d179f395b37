"""JSON Lines read a block of lines at a time by pyarrow's JSON reader (the columnar ingest path).

:meth:`JsonlSource.read_batches <shardload.prepare.sources.jsonl.JsonlSource.read_batches>`
cuts a unit's byte range into blocks of whole lines and parses each with
``pyarrow.json.read_json`` against an explicit schema, for
:func:`shardload.prepare.pipeline.ingest` to check and stage whole columns.
A block's columns are given only where they are provably what the exact
per-line reader (:mod:`shardload.prepare.sources.jsonl`, whose rules this
follows) gives; otherwise the block is read line by line by that reader, which
then reports any error with its file, line and field as always. Taken as
columns only:

* fields of integers (int64, or the ``--dtype`` that ``cast_exact`` makes of
  int64 without changing a value) or of booleans (bool, by default or by
  ``--dtype``), as scalars or one-level lists: pyarrow's int64 refuses any
  number written with a fraction, an exponent, or beyond 64 bits, where the
  exact reader would make a float (so float fields are always read line by line);
* blocks where every non-blank line starts with ``{`` and ends with ``}``
  and pyarrow found exactly one object per non-blank line (it would join an
  object written across lines, or split two written on one); with values
  that may not be objects, no object can then span lines;
* no null at any level and no field missing (pyarrow's null), no field
  other than the schema's (refused by pyarrow), and no key twice (refused by
  pyarrow);
* lists of booleans with no empty list (``[]`` is int64 before any non-empty
  list of the file);
* blocks no longer than ``max_record_bytes``, so no line in them is either.

Blank lines (empty, or spaces, tabs and a carriage return) are skipped by both
readers alike; a byte-order mark fails the ``{`` test and takes the exact path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from shardload.formats.base import Columns, FieldData
from shardload.prepare.sources.base import Sample, SampleBatch, SourceOptions
from shardload.schema.cast import CastError, cast_exact

if TYPE_CHECKING:
    from collections.abc import Callable

    from numpy.typing import NDArray

    from shardload.formats.origin import OriginKind
    from shardload.schema.fields import Schema

__all__ = ["BLOCK_BYTES", "json_batches"]

#: bytes of whole lines parsed at once (a block that fails is read again line by line)
BLOCK_BYTES = 4 << 20

_BLANK = b" \t\r"


def arrow_schema(schema: Schema, options: SourceOptions) -> pa.Schema | None:
    """The explicit schema pyarrow parses the samples of ``schema`` with, or None if a field has no such type."""
    fields = []
    for f in schema.fields:
        if len(f.shape) > 1:
            return None
        if options.dtypes.get(f.name, f.dtype) == "bool":  # JSON true/false, or 0/1 read line by line
            t = pa.bool_()
        elif f.name in options.dtypes or f.dtype == "int64":
            t = pa.int64()
        else:
            return None
        fields.append(pa.field(f.name, pa.list_(t) if f.shape else t))
    return pa.schema(fields)


def json_batches(
    path: str,
    span: tuple[int, int],
    first: int,
    schema: Schema,
    options: SourceOptions,
    exact: Callable[[tuple[int, int], int], Iterator[tuple[str, Sample]]],
) -> Iterator[SampleBatch]:
    """The lines of bytes ``span`` of the plain JSON Lines file at ``path`` (line ``first + 1`` first), a block
    at a time; ``exact(part, lines_before)`` reads a part of the file line by line."""
    parse_schema = arrow_schema(schema, options)
    if parse_schema is None:
        yield SampleBatch(None, lambda: exact(span, first))
        return
    start, stop = span
    try:
        fh = open(path, "rb")  # noqa: SIM115  (closed below; the exact reader reports a file that cannot be read)
    except OSError:
        yield SampleBatch(None, lambda: exact(span, first))
        return
    with fh:
        fh.seek(start)
        tail = b""
        while start < stop:
            chunk = fh.read(min(BLOCK_BYTES, stop - start - len(tail)))
            data = tail + chunk
            if not chunk or len(data) > options.max_record_bytes:  # the file shrank, or a line too long
                yield SampleBatch(None, lambda start=start, first=first: exact((start, stop), first))  # type: ignore[misc]
                return
            end = len(data) if start + len(data) >= stop else data.rfind(b"\n") + 1
            if end == 0:  # a line longer than a block: read on to its end
                tail = data
                continue
            block, tail = data[:end], data[end:]
            part = (start, start + end)
            parsed = _parse(block, parse_schema, options)
            lines: tuple[str, OriginKind, NDArray[np.int64]] | None = None
            if parsed is not None:
                lines = (path, "line", first + 1 + parsed[1])  # the line numbers the locators name
            yield SampleBatch(
                None if parsed is None else parsed[0],
                lambda part=part, first=first: exact(part, first),  # type: ignore[misc]
                lines,
            )
            start += end
            first += block.count(b"\n")


def _parse(block: bytes, parse_schema: pa.Schema, options: SourceOptions) -> tuple[Columns, NDArray[np.int64]] | None:
    """The columns of ``block`` if pyarrow reads it as the exact reader would, and which lines of the block
    (from 0) its samples are; else None."""
    lines = _object_lines(block)
    if lines is None:
        return None
    try:
        table = pa_json.read_json(
            pa.BufferReader(block),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(block) + 1),
            parse_options=pa_json.ParseOptions(explicit_schema=parse_schema, unexpected_field_behavior="error"),
        )
    except (pa.ArrowException, OSError):
        return None
    if table.num_rows != len(lines):
        return None
    fields = {}
    for f, column in zip(parse_schema, table.columns):
        arr = column.combine_chunks()
        if arr.null_count:
            return None
        offsets = None
        if pa.types.is_list(arr.type):
            offsets = np.asarray(arr.offsets, dtype=np.int64)
            arr = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
            offsets = offsets - offsets[0]
            if arr.null_count or (pa.types.is_boolean(arr.type) and (np.diff(offsets) == 0).any()):
                return None
        values: np.ndarray = arr.to_numpy(zero_copy_only=False)
        dtype = options.dtypes.get(f.name)
        if dtype is not None:
            try:
                values = cast_exact(values, dtype)
            except CastError:
                return None
        fields[f.name] = FieldData(values, offsets)
    return Columns(table.num_rows, fields), lines


def _object_lines(block: bytes) -> NDArray[np.int64] | None:
    """The lines of ``block`` (from 0) that are not blank, if each starts with ``{`` and ends with ``}``; else None."""
    buf = np.frombuffer(block, dtype=np.uint8)
    newlines = np.flatnonzero(buf == ord("\n"))
    ends = newlines if block.endswith(b"\n") else np.append(newlines, len(block))
    starts = np.concatenate(([0], ends[:-1] + 1))
    # strip trailing blanks of each line (at most a few: a carriage return, spaces)
    last = ends - 1
    for _ in range(4):
        blank = (last >= starts) & np.isin(buf[np.maximum(last, 0)], np.frombuffer(_BLANK, np.uint8))
        if not blank.any():
            break
        last = np.where(blank, last - 1, last)
    else:
        return None
    nonblank = last >= starts
    if (buf[starts[nonblank]] != ord("{")).any() or (buf[last[nonblank]] != ord("}")).any():
        return None
    return np.flatnonzero(nonblank).astype(np.int64)
