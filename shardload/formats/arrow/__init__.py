"""Arrow IPC shards: uncompressed, memory-mapped, read zero-copy."""

from shardload.formats.arrow.reader import ArrowShardReader
from shardload.formats.arrow.writer import ArrowShardWriter

__all__ = ["ArrowShardReader", "ArrowShardWriter"]
