"""The options of Zarr shards, their defaults and their checks: the one place that holds them.

The manifest's ``options`` record them with every default resolved; the reader bounds its chunks by them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardload.errors import InputError
from shardload.formats.base import FormatOptions
from shardload.formats.zarr.compression import require_zarr

#: compression names accepted by ``--compression`` / ``ZarrOptions.compression``
COMPRESSIONS = ("zstd", "blosc-lz4", "none")
#: default level per compression (zstd's own default; blosc's usual middle ground)
DEFAULT_LEVELS = {"zstd": 3, "blosc-lz4": 5}
#: accepted levels per compression, inclusive
LEVEL_RANGES = {"zstd": (1, 22), "blosc-lz4": (0, 9)}
#: default uncompressed bytes per chunk of a ``values`` array (see docs/format.md for the trade-off)
DEFAULT_CHUNK_SIZE = 256 << 10


@dataclass(frozen=True)
class ZarrOptions(FormatOptions):
    """How Zarr shards are compressed and chunked (``shard_format=ZarrOptions(...)``).

    Making one checks that zarr is installed (``pip install shardload[zarr]``)
    and that the values are in range.

    Attributes:
        compression: ``"blosc-lz4"`` (default; lz4 inside blosc, byte
            shuffle), ``"zstd"`` (smaller on skewed data, 3-7x slower to
            decode) or ``"none"``.
        compression_level: zstd 1-22 (default 3), blosc-lz4 0-9 (default 5);
            ``None`` means the compression's default (and is the only level of ``"none"``).
        chunk_size: uncompressed bytes per chunk of a field's values (default
            256 KiB): the unit that is decompressed to read a sample. A set
            read fully shuffled (``Batching(chunk_window=0)``) reads faster
            with ``64 << 10``; docs/format.md, "Arrow or Zarr".

    Raises:
        InputError: a value out of range.
        MissingDependencyError: zarr (version 3 or newer) is not installed.

    Examples:
        >>> shardload.write(samples, "out/", shard_format=shardload.ZarrOptions(compression="zstd"))  # doctest: +SKIP
    """

    compression: str = "blosc-lz4"
    compression_level: int | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE

    def __post_init__(self) -> None:
        require_zarr()
        compression, level, chunk_size = self.compression, self.compression_level, self.chunk_size
        if compression not in COMPRESSIONS:
            raise InputError(f"compression must be one of {', '.join(COMPRESSIONS)}; got {compression!r}")
        if level is not None:
            if compression == "none":
                raise InputError("a compression level needs a compression (zstd or blosc-lz4), not 'none'")
            lo, hi = LEVEL_RANGES[compression]
            if not _is_int(level) or not lo <= level <= hi:
                raise InputError(f"{compression} compression level must be an integer in [{lo}, {hi}], got {level!r}")
            object.__setattr__(self, "compression_level", int(level))  # numpy integers too: the manifest stores ints
        elif compression != "none":
            object.__setattr__(self, "compression_level", DEFAULT_LEVELS[compression])
        if not _is_int(chunk_size) or chunk_size <= 0:
            raise InputError(f"chunk size must be a positive number of bytes, got {chunk_size!r}")
        object.__setattr__(self, "chunk_size", int(chunk_size))


def _is_int(value: object) -> bool:
    """An integer (numpy's too), but not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
