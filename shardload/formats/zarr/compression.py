"""The zarr codecs of Zarr shards, and the check that zarr is installed.

zarr is imported on use only, so ``shardload`` works without the optional ``[zarr]`` extra.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from shardload.errors import MissingDependencyError

INSTALL_HINT = "pip install shardload[zarr]"


def require_zarr() -> ModuleType:
    """The ``zarr`` module, or a :class:`MissingDependencyError` saying how to install it."""
    try:
        import zarr
    except ImportError:
        raise MissingDependencyError(
            f"zarr shards need the zarr package (version 3 or newer): {INSTALL_HINT}", name="zarr"
        ) from None
    if int(zarr.__version__.split(".")[0]) < 3:
        raise MissingDependencyError(
            f"zarr shards need zarr 3 or newer, found zarr {zarr.__version__}: {INSTALL_HINT}", name="zarr"
        )
    return zarr


def compressors_for(compression: str, level: int | None, itemsize: int) -> list[Any] | None:
    """The zarr v3 bytes-to-bytes codecs for ``compression`` at the resolved ``level`` (``None``: stored raw)."""
    zarr = require_zarr()
    if compression == "none":
        return None
    if compression == "zstd":
        return [zarr.codecs.ZstdCodec(level=level)]
    # Blosc's byte shuffle groups the bytes of each value by significance first, which is
    # what makes float and wide-integer data compress; typesize tells it the value width.
    return [
        zarr.codecs.BloscCodec(
            cname="lz4", clevel=level, shuffle=zarr.codecs.BloscShuffle.shuffle, typesize=max(1, itemsize)
        )
    ]
