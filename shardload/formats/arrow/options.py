"""The options of Arrow shards: none, since a shard is stored uncompressed to be memory-mapped."""

from __future__ import annotations

from dataclasses import dataclass

from shardload.formats.base import FormatOptions


@dataclass(frozen=True)
class ArrowOptions(FormatOptions):
    """Arrow shards take no options: they are stored uncompressed, so that they can be memory-mapped.

    ``shard_format="arrow"`` (the default) and ``shard_format=ArrowOptions()`` are the same.
    """
