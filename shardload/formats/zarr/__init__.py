"""Zarr v3 shards: the compressed format (zstd or blosc-lz4), one zip file per shard.

Same logical layout as the Arrow shards (per field, flat ``values`` plus
``offsets``), decoded chunk by chunk through a bounded per-process cache.
Needs the optional ``zarr`` package (``pip install shardload[zarr]``); this
package imports without it.
"""

from shardload.formats.zarr.cache import CACHE_ENV, ChunkCache, chunk_cache, set_chunk_cache_bytes
from shardload.formats.zarr.codecs import COMPRESSIONS, DEFAULT_CHUNK_SIZE, require_zarr
from shardload.formats.zarr.reader import ZarrShardReader, ZarrValues
from shardload.formats.zarr.writer import ZarrShardWriter

__all__ = [
    "CACHE_ENV",
    "COMPRESSIONS",
    "DEFAULT_CHUNK_SIZE",
    "ChunkCache",
    "ZarrShardReader",
    "ZarrShardWriter",
    "ZarrValues",
    "chunk_cache",
    "require_zarr",
    "set_chunk_cache_bytes",
]
