"""Compression choices of Zarr shards, and the check that zarr is installed.

Nothing here imports zarr at module level, so ``shardload`` (and the Arrow
format) keeps working without the optional ``[zarr]`` extra; asking for a
Zarr shard without it raises :class:`~shardload.errors.InputError` with the
install command.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from shardload.errors import InputError

#: compression names accepted by ``--compression`` / ``PrepareOptions.compression``
COMPRESSIONS = ("zstd", "blosc-lz4", "none")
DEFAULT_COMPRESSION = "zstd"
#: default level per compression (zstd's own default; blosc's usual middle ground)
DEFAULT_LEVELS = {"zstd": 3, "blosc-lz4": 5}
#: accepted levels per compression, inclusive
LEVEL_RANGES = {"zstd": (1, 22), "blosc-lz4": (0, 9)}
#: default uncompressed bytes per chunk of a ``values`` array (see docs/format.md for the trade-off)
DEFAULT_CHUNK_SIZE = 64 << 10
INSTALL_HINT = "pip install shardload[zarr]"


def require_zarr() -> ModuleType:
    """The ``zarr`` module, or an :class:`InputError` saying how to install it."""
    try:
        import zarr
    except ImportError:
        raise InputError(f"zarr shards need the zarr package (version 3 or newer): {INSTALL_HINT}") from None
    if int(zarr.__version__.split(".")[0]) < 3:
        raise InputError(f"zarr shards need zarr 3 or newer, found zarr {zarr.__version__}: {INSTALL_HINT}")
    return zarr


def check_zarr_options(compression: str, compression_level: int | None, chunk_size: int) -> None:
    """Refuse an unknown compression, a level out of its range, or a non-positive chunk size."""
    if compression not in COMPRESSIONS:
        raise InputError(f"compression must be one of {', '.join(COMPRESSIONS)}; got {compression!r}")
    if compression_level is not None:
        if compression == "none":
            raise InputError("a compression level needs a compression (zstd or blosc-lz4), not 'none'")
        lo, hi = LEVEL_RANGES[compression]
        if (
            isinstance(compression_level, bool)
            or not isinstance(compression_level, int)
            or not lo <= compression_level <= hi
        ):
            raise InputError(
                f"{compression} compression level must be an integer in [{lo}, {hi}], got {compression_level!r}"
            )
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise InputError(f"chunk size must be a positive number of bytes, got {chunk_size!r}")


def compressors_for(compression: str, level: int | None, itemsize: int) -> list[Any] | None:
    """The zarr v3 bytes-to-bytes codecs for ``compression`` (``None``: stored raw)."""
    zarr = require_zarr()
    if compression == "none":
        return None
    if level is None:
        level = DEFAULT_LEVELS[compression]
    if compression == "zstd":
        return [zarr.codecs.ZstdCodec(level=level)]
    # Blosc's byte shuffle groups the bytes of each value by significance first, which is
    # what makes float and wide-integer data compress; typesize tells it the value width.
    return [
        zarr.codecs.BloscCodec(
            cname="lz4", clevel=level, shuffle=zarr.codecs.BloscShuffle.shuffle, typesize=max(1, itemsize)
        )
    ]
