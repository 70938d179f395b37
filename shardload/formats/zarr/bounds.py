"""What a Zarr shard may declare, checked before anything in it is read or decompressed.

The sizes a shard declares (zip members, array and chunk shapes, frame headers) are tied to what
the writer produces and to the manifest, so a damaged or crafted shard is refused while it is a few
kilobytes of metadata, before the allocation it asks for. docs/format.md, "Zarr shards", **Bounds**.
"""

from __future__ import annotations

import math
import struct
import zipfile
from collections.abc import Mapping
from typing import Any

#: the largest ``zarr.json`` member read; the writer's are a few kilobytes (the root's holds the schema)
MAX_METADATA_BYTES = 16 << 20
#: compressors of the codec chains the writer produces (after the ``bytes`` serializer)
CODEC_CHAINS = ((), ("zstd",), ("blosc",))
_ZSTD_MAGIC = 0xFD2FB528
_BLOSC_HEADER = 16


class BoundsError(ValueError):
    """A shard declares something outside the format's bounds; the caller names the shard."""


#: the chunk size bound of a shard that records none (see :func:`manifest_chunk_size`)
UNRECORDED_CHUNK_SIZE = 64 << 10


def check_zip(zf: zipfile.ZipFile, file_size: int) -> None:
    """Every member must be stored uncompressed, with honest sizes, inside a file of ``file_size`` bytes."""
    for info in zf.infolist():
        name = info.filename
        if info.compress_type != zipfile.ZIP_STORED:
            raise BoundsError(
                f"zip member {name!r} is compressed (zip method {info.compress_type}); the format stores members "
                "uncompressed, the chunks inside are compressed by zarr's codecs"
            )
        if info.flag_bits & 0x1:
            raise BoundsError(f"zip member {name!r} is encrypted")
        if info.file_size != info.compress_size:
            raise BoundsError(
                f"zip member {name!r} declares {info.file_size} bytes uncompressed but stores {info.compress_size}"
            )
        # 30 bytes of local header and the name precede the data (an extra field only moves it further).
        if info.header_offset < 0 or info.header_offset + 30 + len(info.orig_filename) + info.compress_size > file_size:
            raise BoundsError(
                f"zip member {name!r} declares {info.compress_size} bytes at offset {info.header_offset}, past the "
                f"end of the {file_size}-byte file"
            )
        if name.endswith("zarr.json") and info.file_size > MAX_METADATA_BYTES:
            raise BoundsError(
                f"zip member {name!r} holds {info.file_size} bytes of metadata, over the {MAX_METADATA_BYTES}-byte "
                "bound (the writer's are a few kilobytes)"
            )


def manifest_chunk_size(options: Mapping[str, Any] | None, attrs: Mapping[str, Any]) -> int:
    """The ``chunk_size`` the shard was written with: the manifest's, else the shard's own, else 64 KiB.

    64 KiB was the default when chunk sizes were not yet recorded (not today's, which may grow).
    """
    for source in (options or {}, attrs):
        value = source.get("chunk_size")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return UNRECORDED_CHUNK_SIZE


def max_chunk_bytes(chunk_size: int, row_bytes: int) -> int:
    """The largest decoded chunk the writer produces: ``chunk_size`` bytes, or one row when a row is larger."""
    return max(chunk_size, row_bytes)


def codec_chain(meta: Mapping[str, Any], key: str) -> str:
    """The compressor (``""``: none) of the writer's codec chain and chunk key encoding in ``meta``; else BoundsError.

    ``meta`` is the array's ``zarr.json`` as a dict, ``key`` its path (for messages).
    """
    try:
        codecs = [(c["name"], c.get("configuration", {})) for c in meta["codecs"]]
        encoding = meta["chunk_key_encoding"]
    except (KeyError, TypeError, AttributeError):
        raise BoundsError(f"array {key!r} has no valid codec list or chunk key encoding") from None
    names = tuple(name for name, _ in codecs[1:])
    if (
        not codecs
        or codecs[0][0] != "bytes"
        or codecs[0][1].get("endian", "little") != "little"
        or names not in CODEC_CHAINS
    ):
        raise BoundsError(
            f"array {key!r} uses codecs {[name for name, _ in codecs]}; the format's are 'bytes' (little-endian) "
            "followed by at most one of zstd or blosc"
        )
    if encoding.get("name") != "default" or encoding.get("configuration", {}).get("separator", "/") != "/":
        raise BoundsError(f"array {key!r} uses chunk key encoding {encoding!r}; the format's is 'default' with '/'")
    return names[0] if names else ""


def check_array(
    meta: Mapping[str, Any], *, key: str, shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int, bound: int
) -> str:
    """Check one array's metadata against the writer's layout; returns its compressor (``""``: none).

    ``shape`` and ``chunks`` are as declared (trailing axes already checked against the schema);
    ``bound`` is the largest decoded chunk allowed, in bytes.
    """
    compressor = codec_chain(meta, key)
    if len(chunks) != len(shape) or chunks[0] < 1 or tuple(chunks[1:]) != tuple(max(1, d) for d in shape[1:]):
        raise BoundsError(
            f"array {key!r} of shape {list(shape)} has chunks {list(chunks)}; the format chunks the first axis only"
        )
    nbytes = math.prod(chunks) * itemsize
    if nbytes > bound:
        raise BoundsError(
            f"array {key!r} declares chunks of {nbytes} bytes decoded, over the {bound}-byte bound that the "
            "manifest's chunk_size allows"
        )
    return compressor


def check_chunk_members(zf: zipfile.ZipFile, prefix: str, suffix: str, rows: int, chunk_rows: int) -> None:
    """Every chunk the array declares must be in the zip (the writer stores all of them, even empty ones).

    This bounds the declared shape by the file: no more chunks than it has members.
    """
    count = math.ceil(rows / chunk_rows) if rows else 0
    members = zf.NameToInfo
    if count > len(members):
        raise BoundsError(
            f"array {prefix.removesuffix('/c/')!r} declares {rows} rows in {count} chunks, but the zip holds only "
            f"{len(members)} members"
        )
    for c in range(count):
        if f"{prefix}{c}{suffix}" not in members:
            raise BoundsError(f"chunk {c} of array {prefix.removesuffix('/c/')!r} is missing from the zip")


def max_stored_bytes(compressor: str, nbytes: int) -> int:
    """The most bytes a stored chunk of ``nbytes`` decoded can take: a compressor's worst case on random data.

    zstd's ``ZSTD_COMPRESSBOUND`` is ``n + n/256 + (128 KiB - n)/2048`` for
    ``n`` under 128 KiB; blosc adds a 16-byte header and a few bytes per
    block. ``n/128 + 4 KiB`` covers both with room to spare.
    """
    return nbytes if compressor == "" else nbytes + nbytes // 128 + 4096


def check_stored_size(stored: int, compressor: str, nbytes: int) -> None:
    """A chunk's zip member must not be larger than its compressor could make ``nbytes`` (checked before reading)."""
    limit = max_stored_bytes(compressor, nbytes)
    if stored > limit:
        raise BoundsError(
            f"the chunk stores {stored} bytes, more than {compressor or 'no compression'} can make of a "
            f"{nbytes}-byte chunk ({limit} at most)"
        )


def check_encoded(raw: bytes, compressor: str, nbytes: int) -> None:
    """The size a stored chunk declares (its frame header) must be the chunk's exact decoded size.

    Decoding then goes into exactly ``nbytes``: a lying frame fails instead of allocating its claim.
    """
    if compressor == "":
        declared = len(raw)
    elif compressor == "zstd":
        declared = _zstd_content_size(raw)
    else:
        if len(raw) < _BLOSC_HEADER:
            raise BoundsError(f"blosc frame of {len(raw)} bytes is shorter than its header")
        declared, cbytes = struct.unpack_from("<I", raw, 4)[0], struct.unpack_from("<I", raw, 12)[0]
        if cbytes != len(raw):
            raise BoundsError(f"blosc frame declares {cbytes} compressed bytes, the chunk holds {len(raw)}")
    if declared != nbytes:
        raise BoundsError(f"the chunk declares {declared} bytes decoded, its array's chunks hold {nbytes}")


def _zstd_content_size(raw: bytes) -> int:
    """The content size in the header of the zstd frame starting ``raw`` (RFC 8878, section 3.1.1.1)."""
    if len(raw) < 6 or struct.unpack_from("<I", raw, 0)[0] != _ZSTD_MAGIC:
        raise BoundsError("the chunk is not a zstd frame")
    descriptor = raw[4]
    fcs_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if width == 0:
        raise BoundsError("the zstd frame does not declare its decoded size (the writer's frames always do)")
    if len(raw) < pos + width:
        raise BoundsError("the zstd frame header is truncated")
    size = int.from_bytes(raw[pos : pos + width], "little")
    return size + 256 if width == 2 else size
