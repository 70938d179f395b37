"""Zarr v3 shards: the compressed format (zstd or blosc-lz4), one zip file per shard (docs/format.md).

Needs the optional ``zarr`` package only when used. :data:`ZARR` is its registration.
"""

from typing import TYPE_CHECKING

from shardload.formats.base import OptionFlag, ShardFormat
from shardload.formats.zarr.cache import CACHE_ENV, ChunkCache, chunk_cache, set_chunk_cache_bytes
from shardload.formats.zarr.compression import require_zarr
from shardload.formats.zarr.options import COMPRESSIONS, DEFAULT_CHUNK_SIZE, ZarrOptions
from shardload.formats.zarr.reader import ZarrShardReader, ZarrValues
from shardload.formats.zarr.writer import ZarrShardWriter

ZARR = ShardFormat(
    name="zarr",
    writer=ZarrShardWriter,
    reader=ZarrShardReader,
    options=ZarrOptions,
    summary="compressed, needs shardload[zarr]",
    flags=(
        OptionFlag("compression", "zarr only: codec of the chunks (default: blosc-lz4)", choices=COMPRESSIONS),
        OptionFlag(
            "compression_level", "zarr only: zstd 1-22 (default 3), blosc-lz4 0-9 (default 5)", "int", metavar="N"
        ),
        OptionFlag(
            "chunk_size",
            "zarr only: uncompressed bytes per chunk, the unit decompressed to read a sample (default: 256KiB)",
            "size",
            metavar="SIZE",
        ),
    ),
)

__all__ = [
    "CACHE_ENV",
    "COMPRESSIONS",
    "DEFAULT_CHUNK_SIZE",
    "ZARR",
    "ChunkCache",
    "ZarrOptions",
    "ZarrShardReader",
    "ZarrShardWriter",
    "ZarrValues",
    "chunk_cache",
    "require_zarr",
    "set_chunk_cache_bytes",
]


if not TYPE_CHECKING:  # hidden from type checkers, which would take any attribute as this one's

    def __getattr__(name: str) -> object:
        """A submodule of 0.1.0 that moved (``shardload.formats.zarr.codecs``), as before an attribute of this package."""
        from shardload._compat import moved_attribute

        return moved_attribute(__name__, name)
