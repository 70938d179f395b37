"""JSON Lines (``.jsonl``, ``.ndjson``, gzipped ``.jsonl.gz``): one sample per line.

A plain file larger than ``SourceOptions.unit_bytes`` is read as several units, byte ranges cut
just after a newline (:func:`line_cuts`); a gzipped file is one unit. Either way the samples, their
order and the line numbers in messages are those of reading the file whole.

One reader, two paths: the exact reader (:mod:`._lines`) reads line by line; for ingest, a plain
file's blocks of lines are parsed by pyarrow (:mod:`._blocks`) where that provably gives what the
exact reader gives. Both follow one set of value rules, implemented once in :mod:`._values`.

Value rules (input format): docs/format.md, "JSON Lines".
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
                for start, stop, lines in line_cuts(path, size, options.unit_bytes_for(size))
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
