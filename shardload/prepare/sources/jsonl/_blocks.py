"""The fast path of the JSON Lines reader: a block of whole lines at a time, parsed by pyarrow's JSON reader.

:func:`json_batches` gives ingest (:func:`shardload.prepare.ingest.ingest`)
a block's columns only where they are provably what the exact reader
(:mod:`._lines`) gives under the rules of docs/format.md, "JSON Lines"; any other block is
read by that reader, which reports any error with its file, line and field.
What makes a block provably alike:

* every field is of integers (pyarrow's int64, which refuses a number with a
  fraction, an exponent or beyond 64 bits, where the rules make a float) or of
  booleans, scalars or one-level lists; a ``--dtype`` is applied by the same
  ``cast_exact``;
* every non-blank line starts with ``{`` and ends with ``}``, and pyarrow
  found one object per such line (it would join an object written across
  lines, or split two written on one); a byte-order mark fails this test;
* no null or missing field (pyarrow's null), no field beyond the schema's and
  no key twice (pyarrow refuses both), no empty list of booleans (its dtype
  comes from earlier lines);
* the block is no longer than ``max_record_bytes``, so no line in it is either.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

import shardload.prepare.sources.jsonl._simd as simd
from shardload.formats.arrow.arrays import numpy_of
from shardload.formats.base import Columns, FieldData
from shardload.prepare.sources.base import SampleBatch, SourceOptions
from shardload.prepare.sources.jsonl._lines import gzipped, read_lines
from shardload.prepare.sources.jsonl._values import DEFAULT_DTYPES
from shardload.schema.cast import CastError, cast_exact

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from shardload.schema.fields import Schema

#: bytes of whole lines parsed at once (a block that fails is read again line by line)
BLOCK_BYTES = 4 << 20

#: what ends a line besides its newline and still leaves it blank (the exact reader strips any whitespace;
#: a line blank by another space fails the ``{`` test and is read line by line)
_BLANK = b" \t\r"


def arrow_schema(schema: Schema, options: SourceOptions) -> pa.Schema | None:
    """The explicit schema pyarrow parses the samples of ``schema`` with, or None if a field has no such type."""
    fields = []
    for f in schema.fields:
        if len(f.shape) > 1:
            return None
        if options.dtypes.get(f.name, f.dtype) == DEFAULT_DTYPES["b"].name:  # JSON true/false, or 0/1 read line by line
            t = pa.bool_()
        elif f.name in options.dtypes or f.dtype == DEFAULT_DTYPES["i"].name:
            t = pa.int64()
        else:
            return None
        fields.append(pa.field(f.name, pa.list_(t) if f.shape else t))
    return pa.schema(fields)


def json_batches(
    path: str, part: tuple[int, int] | None, first: int, schema: Schema, options: SourceOptions
) -> Iterator[SampleBatch]:
    """The lines of the JSON Lines file at ``path`` (of its byte range ``part``, whose first line is
    ``first + 1``), a block at a time; a gzipped file, or a schema pyarrow cannot parse alike, line by line."""

    def exact(part: tuple[int, int] | None, first: int) -> SampleBatch:
        return SampleBatch(None, lambda: read_lines(path, options, part, first))

    if gzipped(path):
        yield exact(part, first)
        return
    start, stop = part or (0, os.stat(path).st_size)
    parse_schema = arrow_schema(schema, options)
    if parse_schema is None:
        yield exact((start, stop), first)
        return
    try:
        fh = open(path, "rb")  # noqa: SIM115  (closed below; the exact reader reports a file that cannot be read)
    except OSError:
        yield exact((start, stop), first)
        return
    with fh:
        fh.seek(start)
        tail = b""
        while start < stop:
            chunk = fh.read(min(BLOCK_BYTES, stop - start - len(tail)))
            data = tail + chunk
            if not chunk or len(data) > options.max_record_bytes:  # the file shrank, or a line too long
                yield exact((start, stop), first)
                return
            end = len(data) if start + len(data) >= stop else data.rfind(b"\n") + 1
            if end == 0:  # a line longer than a block: read on to its end
                tail = data
                continue
            block, tail = data[:end], data[end:]
            parsed = _parse(block, parse_schema, options)
            if parsed is None:
                yield exact((start, start + end), first)
            else:
                yield SampleBatch(
                    parsed[0], exact((start, start + end), first).samples, (path, "line", first + 1 + parsed[1])
                )
            start += end
            first += block.count(b"\n")


def _parse(block: bytes, parse_schema: pa.Schema, options: SourceOptions) -> tuple[Columns, NDArray[np.int64]] | None:
    """The columns of ``block`` if simdjson (:mod:`._simd`, where installed) or pyarrow reads it as the exact
    reader would, and which lines of the block (from 0) its samples are; else None."""
    lines = _object_lines(block)
    if lines is None:
        return None
    parsed = simd.parse_block(block, lines, parse_schema)
    if parsed is None:
        parsed = _parse_arrow(block, parse_schema, len(lines))
    if parsed is None:
        return None
    fields = {}
    for name, data in parsed.items():
        dtype = options.dtypes.get(name)
        if dtype is None:
            fields[name] = data
            continue
        try:
            fields[name] = FieldData(cast_exact(data.values, dtype), data.offsets)
        except CastError:
            return None
    return Columns(len(lines), fields), lines


def _parse_arrow(block: bytes, parse_schema: pa.Schema, rows: int) -> dict[str, FieldData] | None:
    """The fields of ``block`` (``rows`` objects, one a line) as pyarrow's JSON reader parses them, or None."""
    try:
        table = pa_json.read_json(
            pa.BufferReader(block),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(block) + 1),
            parse_options=pa_json.ParseOptions(explicit_schema=parse_schema, unexpected_field_behavior="error"),
        )
    except (pa.ArrowException, OSError):
        return None
    if table.num_rows != rows:
        return None
    fields = {}
    for f, column in zip(parse_schema, table.columns):
        arr = column.combine_chunks()
        if arr.null_count:
            return None
        offsets = None
        if pa.types.is_list(arr.type):
            offsets = np.asarray(numpy_of(arr.offsets), dtype=np.int64)
            arr = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
            offsets = offsets - offsets[0]
            if arr.null_count or (pa.types.is_boolean(arr.type) and (np.diff(offsets) == 0).any()):
                return None
        fields[f.name] = FieldData(numpy_of(arr), offsets)
    return fields


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
