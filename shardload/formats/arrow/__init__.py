"""Arrow IPC shards: uncompressed, memory-mapped, read zero-copy.

:data:`ARROW` is its registration: writer, reader and :class:`ArrowOptions` (none to set).
"""

from shardload.formats.arrow.options import ArrowOptions
from shardload.formats.arrow.reader import ArrowShardReader
from shardload.formats.arrow.writer import ArrowShardWriter
from shardload.formats.base import ShardFormat

ARROW = ShardFormat(
    name="arrow",
    writer=ArrowShardWriter,
    reader=ArrowShardReader,
    options=ArrowOptions,
    summary="uncompressed, memory-mapped",
)

__all__ = ["ARROW", "ArrowOptions", "ArrowShardReader", "ArrowShardWriter"]
