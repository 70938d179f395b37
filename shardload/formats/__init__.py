"""On-disk shard formats, by name: a writer and a reader class for each.

``arrow`` (default): uncompressed Arrow IPC, memory-mapped, zero-copy reads.
``zarr``: Zarr v3 arrays in one zip file per shard, compressed (zstd or
blosc-lz4) and decoded chunk by chunk; needs ``pip install shardload[zarr]``
(the classes import without zarr, and say so when they are used).
"""

from __future__ import annotations

from shardload.errors import ManifestError
from shardload.formats.arrow import ArrowShardReader, ArrowShardWriter
from shardload.formats.base import Columns, FieldData, ShardReader, ShardWriter
from shardload.formats.zarr import ZarrShardReader, ZarrShardWriter

FORMATS: dict[str, tuple[type[ShardWriter], type[ShardReader]]] = {
    "arrow": (ArrowShardWriter, ArrowShardReader),
    "zarr": (ZarrShardWriter, ZarrShardReader),
}


def get_format(name: str) -> tuple[type[ShardWriter], type[ShardReader]]:
    """The (writer, reader) classes of format ``name``."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ManifestError(
            f"unknown shard format {name!r}; this version of shardload reads: {', '.join(sorted(FORMATS))}"
        ) from None


__all__ = ["FORMATS", "Columns", "FieldData", "ShardReader", "ShardWriter", "get_format"]
