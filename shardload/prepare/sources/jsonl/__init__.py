"""JSON Lines (``.jsonl``, ``.ndjson``, gzipped ``.jsonl.gz``): one sample per line.

Each non-blank line is one JSON object; each of its entries is one field, in
the order they are written. Blank lines are skipped; line numbers in messages
count every physical line, from 1.

A plain file larger than ``SourceOptions.unit_bytes`` is read as several units,
byte ranges cut just after a newline (:func:`line_cuts`), each knowing the
number of its first line; the samples and their order are those of reading
the file whole. A gzipped file cannot be cut: it is one unit.

One reader, two paths: the exact reader (:mod:`._lines`) reads line by line;
for ingest, a plain file's blocks of lines are parsed by pyarrow
(:mod:`._blocks`) where that provably gives what the exact reader gives, and
read by the exact reader otherwise. Both follow the rules below, which
:mod:`._values` implements.

How JSON values become arrays (JSON has no dtypes):

* a number becomes a 0-d array, a list of numbers a 1-D array, a list of
  equally long lists a 2-D array (``[[...], [...]]`` -> ``[rows, C]``), and so on;
* the dtype of a field named in ``--dtype FIELD=DTYPE`` (``SourceOptions.dtypes``)
  is that dtype, decoded directly (a float64 field is never rounded through
  float32);
* otherwise, integers become **int64** and floats **float32**; a list mixing
  integers and floats is float32, and its integers must fit float32 exactly
  as in a list of integers (``[16777217, 0.5]`` is refused, not rounded);
* either way the conversion follows :func:`shardload.schema.cast.cast_exact`: no value
  may change (``3.0`` may become an int32, ``3.5`` may not; ``300`` does not
  fit int8; ``16777217`` does not fit float32; a float may be rounded, but
  ``1e-50`` does not become ``0.0`` in float32, nor ``1e300`` ``inf``);
* ``true``/``false`` become **bool**; a list mixing booleans with numbers is
  refused unless ``--dtype`` names the field (then they count as 1/0);
* numbers a 64-bit float cannot hold (``1e400``, ``1e-400``: Python's parser
  makes them ``inf`` and ``0.0``) and a key given twice in one object (Python
  keeps the last) are refused;
* a line longer than ``SourceOptions.max_record_bytes`` (256 MiB) is refused
  before it is read whole;
* an empty list ``[]`` takes the dtype and inner shape of the same field on
  the last line of the same file where it was not empty (so ``[]`` in a
  ``[rows, 4]`` field is a ``[0, 4]`` array); before any such line, its dtype
  is ``--dtype`` or int64 and it is 1-D;
* ``null``, strings, objects and ragged nested lists are refused with an
  :class:`~shardload.errors.InputError` naming the file, line and field.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import ClassVar

from shardload.prepare.sources.base import (
    Sample,
    SampleBatch,
    SourceOptions,
    SourceReader,
    SourceUnit,
    register,
)
from shardload.prepare.sources.jsonl._blocks import json_batches
from shardload.prepare.sources.jsonl._lines import gzipped, line_cuts, read_lines
from shardload.prepare.sources.jsonl._values import (
    NumberRangeError,
    check_tiny_numbers,
    checked_float,
    json_to_array,
    loads,
    may_mix_bools,
)
from shardload.schema.fields import Schema

__all__ = [
    "JsonlSource",
    "NumberRangeError",
    "check_tiny_numbers",
    "checked_float",
    "json_to_array",
    "line_cuts",
    "loads",
    "may_mix_bools",
]


@register
class JsonlSource(SourceReader):
    kind: ClassVar[str] = "jsonl"
    suffixes: ClassVar[tuple[str, ...]] = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")

    @classmethod
    def make_units(cls, files: Sequence[str], options: SourceOptions) -> list[SourceUnit]:
        """One unit per file, or per byte range of a plain file larger than ``options.unit_bytes``."""
        units = []
        for path in files:
            try:
                size = os.stat(path).st_size
            except OSError:  # gone since it was listed: one unit, whose read reports it
                size = 0
            if gzipped(path) or size <= options.unit_bytes:
                units.append(SourceUnit(cls.kind, (path,)))
                continue
            units.extend(
                SourceUnit(cls.kind, (path,), (start, stop), lines, stop - start)
                for start, stop, lines in line_cuts(path, size, options.unit_bytes)
            )
        return units

    @classmethod
    def read(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
        for path in unit.files():
            yield from read_lines(path, options, unit.part, unit.first)

    @classmethod
    def read_batches(cls, unit: SourceUnit, options: SourceOptions, schema: Schema) -> Iterator[SampleBatch]:
        """Blocks of lines parsed by pyarrow where provably exact, else line by line (:mod:`._blocks`)."""
        for path in unit.files():
            yield from json_batches(path, unit.part, unit.first, schema, options)
