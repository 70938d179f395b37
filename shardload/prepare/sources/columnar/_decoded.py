"""How many bytes a piece of a Parquet or Arrow IPC file decodes to, known from its metadata before decoding it.

A compressed column of one repeated value is tiny on disk and any size in memory: a 1 KB zstd Parquet
file or a 22 KB zstd Feather file can decode to gigabytes. A piece that must be decoded whole (one
Parquet row, whose values cannot be split across read batches; one compressed IPC record batch) is
therefore refused by name when it would decode to more than :func:`max_decoded_bytes`, and Parquet
read batches are sized from these figures, not from the encoded size (a dictionary-encoded column
of one value encodes to a few bytes for millions of rows).

Parquet: per column chunk, the number of leaf values times the width of its physical type (byte
arrays: their uncompressed size, a lower bound). Arrow IPC: a compressed buffer starts with its
decoded length (Arrow's ``BodyCompression``), read through the record batch's flatbuffer header;
an uncompressed buffer of a memory-mapped file is used where it lies and costs no memory.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from shardload._base import envvars
from shardload._base.envvars import env_int
from shardload._base.messages import format_bytes
from shardload.errors import InputError
from shardload.formats.arrow.ipc import Flatbuffer

if TYPE_CHECKING:
    import pyarrow.parquet as pq

__all__ = [
    "MAX_DECODED_BYTES",
    "decoded_too_large",
    "ipc_batch_bytes",
    "max_decoded_bytes",
    "out_of_memory",
    "parquet_group_bytes",
]

#: the most bytes one piece of a source (a Parquet row, a compressed IPC record batch) may decode to; a read
#: batch takes several times its decoded size while it becomes samples, so this stays well below memory
MAX_DECODED_BYTES = 1 << 30

#: bytes per value of each Parquet physical type (BOOLEAN: numpy keeps a byte per value)
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


def max_decoded_bytes() -> int:
    """:data:`MAX_DECODED_BYTES`, or the value of ``SHARDLOAD_MAX_DECODED_BYTES`` (``8GiB``, ``500MB``, bytes)."""
    return env_int(envvars.MAX_DECODED_BYTES, MAX_DECODED_BYTES, size=True, error=InputError)


def decoded_too_large(path: str, piece: str, size: int, limit: int) -> InputError:
    """The error for a piece of ``path`` that would decode to ``size`` bytes, over ``limit``."""
    return InputError(
        f"{path}: {piece} decodes to {size:,} bytes ({format_bytes(size)}), more than the {limit:,} bytes prepare "
        f"decodes at once (a guard against files that decompress to huge sizes: this file is "
        f"{format_bytes(_file_size(path))} on disk). If the data is right and memory allows, raise the bound: "
        f"{envvars.MAX_DECODED_BYTES}={format_bytes(2 * size).replace(' ', '')}; or write the file with smaller "
        "row groups or record batches."
    )


def out_of_memory(path: str, piece: str, exc: BaseException) -> InputError:
    """The error for running out of memory while decoding ``piece`` of ``path`` (never "corrupt")."""
    return InputError(
        f"{path}: ran out of memory decoding {piece} ({exc}): the file decompresses to more than this process "
        f"may hold. Lower {envvars.MAX_DECODED_BYTES} (now {max_decoded_bytes():,} bytes) to refuse such pieces "
        "before decoding them, run fewer --workers, or give prepare more memory."
    )


def _file_size(path: str) -> int:
    try:
        import os

        return os.stat(path).st_size
    except OSError:
        return 0


# -- Parquet -----------------------------------------------------------------------------------------
def parquet_group_bytes(meta: pq.FileMetaData, group: int, columns: Sequence[str]) -> int:
    """What the ``columns`` (top-level names) of row group ``group`` decode to, about; from the file metadata."""
    rg = meta.row_group(group)
    wanted = set(columns)
    total = 0
    for c in range(rg.num_columns):
        chunk = rg.column(c)
        if chunk.path_in_schema.split(".", 1)[0] not in wanted:
            continue
        physical = chunk.physical_type
        width = meta.schema.column(c).length if physical == "FIXED_LEN_BYTE_ARRAY" else _WIDTH.get(physical, 0)
        # list offsets add 4-8 bytes per row; the values dominate a bomb
        total += max(chunk.num_values * width, chunk.total_uncompressed_size)
    return total


# -- Arrow IPC: the flatbuffer header of a record batch message ----------------------------------------
_RECORD_BATCH, _DICTIONARY_BATCH = 3, 2  # Arrow's MessageHeader union


def ipc_batch_bytes(message: pa.ipc.Message) -> int:
    """The bytes that decoding ``message`` (a record or dictionary batch) allocates: its compressed buffers' decoded
    lengths; 0 for a message without compressed buffers (or of another kind).

    Raises:
        LayoutError: the message's flatbuffer points outside itself (every read is bounds-checked).
    """
    meta = memoryview(message.metadata)
    fb = Flatbuffer(meta, 0, len(meta))
    root = fb.root()
    kind, header = fb.scalar(root, 1, "<B"), fb.table(root, 2)
    if header is not None and kind == _DICTIONARY_BATCH:
        header = fb.table(header, 1)
    elif kind != _RECORD_BATCH:
        return 0
    if header is None or fb.field(header, 3) is None:  # no BodyCompression: buffers are used where they lie
        return 0
    buffers, count = fb.vector(header, 2, 16)
    body = memoryview(message.body)
    total = 0
    for i in range(count):
        offset, length = fb.i64(buffers + 16 * i), fb.i64(buffers + 16 * i + 8)
        if length >= 8 and offset >= 0 and offset + 8 <= len(body):
            decoded = struct.unpack_from("<q", body, offset)[0]
            total += max(decoded, 0)  # -1: stored uncompressed, used where it lies
    return total


def ipc_batch_sizes(source: pa.MemoryMappedFile, start: int) -> list[int]:
    """:func:`ipc_batch_bytes` of each record batch of the IPC stream at byte ``start`` of ``source``, in order.

    A dictionary batch counts with the record batch after it (both are decoded when that batch is read).
    """
    source.seek(start)
    reader = pa.ipc.MessageReader.open_stream(source)
    sizes: list[int] = []
    pending = 0
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        if message.type == "record batch":
            sizes.append(pending + ipc_batch_bytes(message))
            pending = 0
        elif message.type == "dictionary batch":
            pending += ipc_batch_bytes(message)
    return sizes
