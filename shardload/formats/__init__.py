"""The on-disk format of a shard set: its metadata files and its shard encodings (docs/format.md).

The set's own files: :mod:`.manifest`, :mod:`.shardtable` and :mod:`.origin`. The shard encodings
are registered here by name as :class:`ShardFormat`: ``arrow`` (default, memory-mapped) and ``zarr``.
"""

from __future__ import annotations

from shardload.errors import InputError, ManifestError
from shardload.formats.arrow import ARROW
from shardload.formats.base import (
    Columns,
    FieldData,
    FormatOptions,
    OptionFlag,
    ShardFormat,
    ShardReader,
    ShardWriter,
)
from shardload.formats.zarr import ZARR

#: every format this version writes and reads, by name
FORMATS: dict[str, ShardFormat] = {f.name: f for f in (ARROW, ZARR)}


def get_format(name: str) -> ShardFormat:
    """The format a manifest names (``shard_format``); an unknown one is a :class:`ManifestError`."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ManifestError(
            f"unknown shard format {name!r}; this version of shardload reads: {', '.join(sorted(FORMATS))}"
        ) from None


def format_of(options: object) -> ShardFormat:
    """The registered format whose options ``options`` are; anything else is an :class:`InputError`."""
    for fmt in FORMATS.values():
        if type(options) is fmt.options:
            return fmt
    names = ", ".join(f"{f.name!r} or {f.options.__name__}(...)" for f in FORMATS.values())
    raise InputError(f"shard_format must name a format or give its options: {names}; got {options!r}")


__all__ = [
    "FORMATS",
    "Columns",
    "FieldData",
    "FormatOptions",
    "OptionFlag",
    "ShardFormat",
    "ShardReader",
    "ShardWriter",
    "format_of",
    "get_format",
]
