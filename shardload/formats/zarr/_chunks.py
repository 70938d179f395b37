"""Decoding one chunk of a Zarr shard straight from the mapped zip file (no zarr event loop).

Below :class:`~shardload.formats.zarr.reader.ZarrShardReader`; every member's CRC-32 is checked.
docs/format.md, "How shardload reads a Zarr shard".
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from shardload.formats.zarr.bounds import BoundsError, check_encoded, check_stored_size, codec_chain

try:  # the same CRC-32, computed with SIMD instructions: ~12x faster per chunk (the zarr extra installs it)
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover
    from zlib import crc32

#: a zip local file header: signature, versions, flags, method, time, date, CRC, sizes, name and extra lengths
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")


def map_read_only(path: Path, fd: int) -> memoryview | None:
    """The shard file mapped read-only, if it is still the file open as ``fd``; else ``None`` (zipfile reads it).

    A pyarrow mapping, not ``mmap.mmap``: it lets go of its descriptor and stays mapped while a slice
    lives, so a chunk cached after its shard was closed holds memory, never a descriptor.
    """
    try:
        mapped = pa.memory_map(str(path), "r")
    except (OSError, pa.ArrowException):  # no descriptor or address space left, a path pyarrow cannot encode
        return None
    try:
        st, own = os.fstat(mapped.fileno()), os.fstat(fd)
        if (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino):  # replaced since the zip was opened
            return None
        return memoryview(mapped.read_buffer()).cast("B")
    finally:
        mapped.close()


class ChunkDecoder:
    """Decodes one chunk of an array written by :class:`ZarrShardWriter` without zarr's event loop.

    zarr's read path (an event-loop thread, then a thread pool) costs several times the
    decompression of one small chunk. For the writer's codec chains the stored bytes are a slice of
    the mapping, decompressed with numcodecs; any other layout gets ``None`` from :meth:`for_array`
    (and is refused at open, :mod:`.bounds`) and is read through zarr.
    """

    def __init__(
        self,
        prefix: str,
        chunks: tuple[int, ...],
        dtype: np.dtype[Any],
        decompress: Callable[..., Any] | None,
        compressor: str = "",
    ):
        self.prefix = prefix  # e.g. "tokens/values/c/"; chunk c of an n-d array is prefix + "c/0/.../0"
        self.suffix = "/0" * (len(chunks) - 1)
        self.chunks = chunks
        self.dtype = dtype
        self.nbytes = math.prod(chunks) * dtype.itemsize
        self.decompress = decompress  # None: stored raw
        self.compressor = compressor
        self._data_at: dict[str, int] = {}  # member name -> offset of its data in the zip file

    @classmethod
    def for_array(cls, arr: Any) -> ChunkDecoder | None:
        import numcodecs

        try:
            path = arr.path
            compressor = codec_chain(arr.metadata.to_dict(), path)
        except (BoundsError, AttributeError, KeyError, TypeError):
            return None
        decompress: Callable[..., Any] | None = None
        if compressor:
            decompress = (numcodecs.Zstd() if compressor == "zstd" else numcodecs.Blosc()).decode
        chunks = tuple(int(c) for c in arr.chunks)
        return cls(f"{path}/c/", chunks, np.dtype(arr.dtype).newbyteorder("<"), decompress, compressor)

    def _read(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, mapped: memoryview | None) -> Any:
        """The stored bytes of member ``info``, its CRC-32 checked.

        A member stored uncompressed is a slice of ``mapped`` (no copy), found through its local
        header, whose name must be the member's; anything else goes through ``zf.read``.
        """
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1 or mapped is None:
            return zf.read(info)  # checks the member's CRC-32
        at = self._data_at.get(info.filename)
        if at is None:
            name = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
            head = bytes(mapped[info.header_offset : info.header_offset + _LOCAL_HEADER.size])
            if len(head) != _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
                raise ValueError(f"member {info.filename!r} has no local header at offset {info.header_offset}")
            name_len, extra_len = _LOCAL_HEADER.unpack(head)[-2:]
            named = info.header_offset + _LOCAL_HEADER.size
            if bytes(mapped[named : named + name_len]) != name:
                raise ValueError(f"the local header of member {info.filename!r} names another file")
            at = named + name_len + extra_len
            self._data_at[info.filename] = at
        return self._checked(info, mapped[at : at + info.file_size])

    @staticmethod
    def _checked(info: zipfile.ZipInfo, raw: Any) -> Any:
        """``raw`` if it is member ``info``'s whole data with its CRC-32, else ValueError."""
        if len(raw) != info.file_size or crc32(raw) != info.CRC:
            raise ValueError(f"member {info.filename!r} is short or fails its CRC-32 check")
        return raw

    def decode(self, zf: zipfile.ZipFile, c: int, mapped: memoryview | None = None) -> np.ndarray:
        member = f"{self.prefix}{c}{self.suffix}"
        try:
            info = zf.getinfo(member)
        except KeyError:
            raise ValueError(f"the zip has no member {member!r}") from None
        try:
            check_stored_size(info.file_size, self.compressor, self.nbytes)
            raw = self._read(zf, info, mapped)
            # The frame's declared size must be the chunk's, and it is decoded into exactly that much memory,
            # so a frame that claims (or holds) more fails instead of allocating it.
            check_encoded(raw, self.compressor, self.nbytes)
        except BoundsError as exc:
            raise ValueError(str(exc)) from None
        data: Any = raw  # stored raw: a slice of the read-only mapping
        if self.decompress is not None:
            # Read-only below its array too: a cached chunk is shared by every reader of the process,
            # and the writeable flag of a view of a writable buffer can be set back.
            data = memoryview(self.decompress(raw, out=np.empty(self.nbytes, dtype=np.uint8))).toreadonly()
        return (
            np.frombuffer(data, dtype=self.dtype).reshape(self.chunks).astype(self.dtype.newbyteorder("="), copy=False)
        )
