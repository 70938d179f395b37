"""Check an Arrow IPC file's layout before pyarrow reads a record batch from it.

pyarrow acts on the metadata while reading a batch (decompresses, byte-swaps, decodes
dictionaries), so a 14 KB file could make it allocate gigabytes. :func:`check_ipc_layout` reads the
footer's and batch message's flatbuffers first (Arrow's ``File.fbs`` / ``Message.fbs`` /
``Schema.fbs``, every read bounds-checked) and refuses anything the writer never produces.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_MAGIC = b"ARROW1"
_CONTINUATION = 0xFFFFFFFF
_RECORD_BATCH = 3  # MessageHeader union: NONE, Schema, DictionaryBatch, RecordBatch, ...
_BIG_ENDIAN = 1  # Schema.endianness: Little = 0, Big = 1


class LayoutError(ValueError):
    """The file's IPC metadata is damaged or asks for something a shard never holds."""


@dataclass(frozen=True)
class BatchBlock:
    """Where the one record batch of a shard lies in the file.

    Attributes:
        offset: file position of the message (its length prefix).
        metadata_length: bytes of the prefix and the flatbuffer, padding included; the body follows.
    """

    offset: int
    metadata_length: int
    body_length: int
    rows: int


class Flatbuffer:
    """Bounds-checked reads of flatbuffer tables, vectors and scalars in ``data[start:end]``."""

    def __init__(self, data: memoryview, start: int, end: int) -> None:
        self.data, self.start, self.end = data, start, end

    def _unpack(self, fmt: str, pos: int) -> int:
        size = struct.calcsize(fmt)
        if not self.start <= pos <= self.end - size:
            raise LayoutError(f"metadata points outside itself (position {pos})")
        value: int = struct.unpack_from(fmt, self.data, pos)[0]
        return value

    def root(self) -> int:
        return self.deref(self.start)

    def deref(self, pos: int) -> int:
        """The position an offset stored at ``pos`` points to."""
        return pos + self._unpack("<I", pos)

    def field(self, table: int, index: int) -> int | None:
        """Position of field ``index`` of the table at ``table``, or ``None`` when absent."""
        vtable = table - self._unpack("<i", table)
        vtable_size = self._unpack("<H", vtable)
        slot = 4 + 2 * index
        if slot + 2 > vtable_size:
            return None
        rel = self._unpack("<H", vtable + slot)
        return table + rel if rel else None

    def scalar(self, table: int, index: int, fmt: str, default: int = 0) -> int:
        pos = self.field(table, index)
        return default if pos is None else self._unpack(fmt, pos)

    def table(self, table: int, index: int) -> int | None:
        pos = self.field(table, index)
        return None if pos is None else self.deref(pos)

    def vector(self, table: int, index: int, item_size: int) -> tuple[int, int]:
        """``(position of the first item, number of items)`` of a vector field; ``(0, 0)`` when absent."""
        pos = self.field(table, index)
        if pos is None:
            return 0, 0
        vec = self.deref(pos)
        count = self._unpack("<I", vec)
        if count * item_size > self.end - vec - 4:
            raise LayoutError(f"a vector of {count} items does not fit in the metadata")
        return vec + 4, count

    def i64(self, pos: int) -> int:
        return self._unpack("<q", pos)

    def i32(self, pos: int) -> int:
        return self._unpack("<i", pos)


def check_ipc_layout(data: memoryview) -> BatchBlock:
    """Check the whole IPC file ``data`` holds one uncompressed, little-endian batch and no dictionaries.

    Returns:
        The block of the record batch, checked to lie inside the file.

    Raises:
        LayoutError: saying what is wrong, for the caller to wrap with the shard's name.
    """
    size = len(data)
    if size < 2 * len(_MAGIC) + 6 or bytes(data[:6]) != _MAGIC or bytes(data[size - 6 :]) != _MAGIC:
        raise LayoutError("not an Arrow IPC file (the ARROW1 magic is missing at its start or end)")
    footer_len = struct.unpack_from("<i", data, size - 10)[0]
    footer_start = size - 10 - footer_len
    if footer_len <= 0 or footer_start < 8:
        raise LayoutError(f"its footer length ({footer_len}) does not fit in the file")
    fb = Flatbuffer(data, footer_start, size - 10)
    footer = fb.root()
    schema = fb.table(footer, 1)
    if schema is None:
        raise LayoutError("its footer has no schema")
    if fb.scalar(schema, 0, "<h") == _BIG_ENDIAN:
        raise LayoutError("it is big-endian; pyarrow would convert (copy) every buffer instead of mapping it")
    _, dictionaries = fb.vector(footer, 2, 24)
    if dictionaries:
        raise LayoutError(f"it holds {dictionaries} dictionary batch(es); shard columns are never dictionary-encoded")
    blocks, count = fb.vector(footer, 3, 24)
    if count != 1:
        raise LayoutError(f"expected one record batch, found {count}")
    offset, meta_len, body_len = fb.i64(blocks), fb.i32(blocks + 8), fb.i64(blocks + 16)
    if offset < 8 or meta_len < 8 or body_len < 0 or offset + meta_len + body_len > footer_start:
        raise LayoutError(
            f"its record batch block (offset {offset}, metadata {meta_len} B, body {body_len} B) lies outside the file"
        )
    return _check_batch_message(data, offset, meta_len, body_len)


def _check_batch_message(data: memoryview, offset: int, meta_len: int, body_len: int) -> BatchBlock:
    """Decode the record batch message's flatbuffer: no body compression, every buffer inside the body."""
    prefix = struct.unpack_from("<I", data, offset)[0]
    start = offset + 8 if prefix == _CONTINUATION else offset + 4  # pre-1.0 files have no continuation marker
    fb = Flatbuffer(data, start, offset + meta_len)
    message = fb.root()
    if fb.scalar(message, 1, "<B") != _RECORD_BATCH:
        raise LayoutError("its record batch block does not hold a record batch message")
    if fb.scalar(message, 3, "<q") != body_len:
        raise LayoutError("its record batch message and the footer disagree on the body length")
    batch = fb.table(message, 2)
    if batch is None:
        raise LayoutError("its record batch message has no header")
    if fb.field(batch, 3) is not None:
        raise LayoutError(
            "its record batch body is compressed (zstd or lz4); a shard must be uncompressed Arrow, "
            "which is read by mapping the file, never by decompressing it"
        )
    rows = fb.scalar(batch, 0, "<q")
    buffers, count = fb.vector(batch, 2, 16)
    for i in range(count):
        buf_offset, buf_len = fb.i64(buffers + 16 * i), fb.i64(buffers + 16 * i + 8)
        if buf_offset < 0 or buf_len < 0 or buf_offset + buf_len > body_len:
            raise LayoutError(f"buffer {i} ({buf_len} B at {buf_offset}) lies outside the batch body")
    return BatchBlock(offset=offset, metadata_length=meta_len, body_length=body_len, rows=rows)
