"""Options of ``prepare``/``write``, grouped in one frozen object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from shardload.errors import InputError
from shardload.formats import FORMATS
from shardload.formats.zarr.codecs import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_COMPRESSION,
    DEFAULT_LEVELS,
    check_zarr_options,
    require_zarr,
)
from shardload.schema import SUPPORTED_DTYPES

DEFAULT_SHARD_SIZE = 256 << 20


@dataclass(frozen=True)
class PrepareOptions:
    """How to lay a dataset out as a shard set.

    Attributes:
        shard_format: ``"arrow"`` (memory-mapped, zero-copy) or ``"zarr"``
            (compressed, decoded chunk by chunk; needs ``shardload[zarr]``).
        shard_size: target bytes of sample data per shard (default 256 MB).
        num_shards: exact number of shards; overrides ``shard_size``.
        balance: ``"samples"``: shards differ by at most one sample;
            ``"tokens"``: that, and total length per shard evened out too.
        shuffle: shuffle samples across shards once (seeded), so that each
            rank's contiguous group of shards is an unbiased sample.
        seed: seed of that shuffle.
        workers: parallel processes for reading sources and writing shards.
        resume: finish an interrupted run into the same output.
        overwrite: replace an existing shard set (only once the new one is complete).
        fixed_fields: fields whose shape never varies (stacked, not padded).
        length_field: field whose length is the batching length (default: the
            longest variable field of each sample).
        dtypes: cast these fields on ingest, e.g. ``{"tokens": "int32"}``.
        reject_nonfinite: refuse NaN/inf in float fields.
        progress: show a progress bar (``None``: when stderr is a terminal).
        chunk_bytes: size of the intermediate chunks prepare stages on disk.
        compression: zarr only: ``"zstd"`` (default), ``"blosc-lz4"`` or ``"none"``.
        compression_level: zarr only: zstd 1-22 (default 3), blosc 0-9 (default 5).
        chunk_size: zarr only: uncompressed bytes per chunk of a field's values
            (default 64 KiB); the unit that is decompressed to read a sample.
    """

    shard_format: str = "arrow"
    shard_size: int = DEFAULT_SHARD_SIZE
    num_shards: int | None = None
    balance: Literal["samples", "tokens"] = "samples"
    shuffle: bool = True
    seed: int = 0
    workers: int = 1
    resume: bool = False
    overwrite: bool = False
    fixed_fields: tuple[str, ...] = ()
    length_field: str | None = None
    dtypes: Mapping[str, str] = field(default_factory=dict)
    reject_nonfinite: bool = False
    progress: bool | None = None
    chunk_bytes: int = 64 << 20
    compression: str | None = None
    compression_level: int | None = None
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("shard_size", "num_shards", "seed", "workers", "chunk_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                raise InputError(f"{name} must be an integer, got {value!r}")
            if value is not None:
                object.__setattr__(self, name, int(value))  # numpy integers too; the manifest stores plain ints
        for name in ("shuffle", "resume", "overwrite", "reject_nonfinite"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise InputError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not 0 <= self.seed < 2**64:
            raise InputError(f"seed must be an integer in [0, 2**64), got {self.seed}")
        if not isinstance(self.dtypes, Mapping):
            raise InputError(f"dtypes must map field names to dtype names, got {self.dtypes!r}")
        if self.shard_format not in FORMATS:
            raise InputError(f"unknown shard format {self.shard_format!r}; choose one of {sorted(FORMATS)}")
        if self.shard_size <= 0:
            raise InputError(f"shard_size must be positive, got {self.shard_size}")
        if self.num_shards is not None and self.num_shards < 1:
            raise InputError(f"num_shards must be at least 1, got {self.num_shards}")
        if self.balance not in ("samples", "tokens"):
            raise InputError(f"balance must be 'samples' or 'tokens', got {self.balance!r}")
        if self.workers < 1:
            raise InputError(f"workers must be at least 1, got {self.workers}")
        if self.resume and self.overwrite:
            raise InputError("resume and overwrite exclude each other: resume finishes a run, overwrite starts over")
        for name, dtype in self.dtypes.items():
            if dtype not in SUPPORTED_DTYPES:
                raise InputError(f"dtype of {name!r}: {dtype!r} is not one of {', '.join(SUPPORTED_DTYPES)}")
        if self.chunk_bytes <= 0:
            raise InputError(f"chunk_bytes must be positive, got {self.chunk_bytes}")
        if self.shard_format == "zarr":
            require_zarr()
            check_zarr_options(
                self.compression or DEFAULT_COMPRESSION,
                self.compression_level,
                DEFAULT_CHUNK_SIZE if self.chunk_size is None else self.chunk_size,
            )
        elif (
            self.compression not in (None, "none") or self.compression_level is not None or self.chunk_size is not None
        ):
            raise InputError(
                f"compression, compression level and chunk size apply to zarr shards; {self.shard_format} shards "
                "are stored uncompressed so that they can be memory-mapped. Choose shard_format='zarr' (--format zarr)."
            )

    def writer_options(self) -> dict[str, Any]:
        """Keyword arguments of the shard writer, with the format's defaults filled in."""
        if self.shard_format != "zarr":
            return {}
        compression = self.compression or DEFAULT_COMPRESSION
        level = self.compression_level
        if level is None and compression != "none":
            level = DEFAULT_LEVELS[compression]
        chunk_size = DEFAULT_CHUNK_SIZE if self.chunk_size is None else self.chunk_size
        return {"compression": compression, "compression_level": level, "chunk_size": chunk_size}

    def layout_key(self) -> dict[str, Any]:
        """The options that decide the output bytes (compared on ``resume``)."""
        d = asdict(self)
        for k in ("workers", "resume", "overwrite", "progress"):
            d.pop(k)
        d["fixed_fields"] = list(self.fixed_fields)
        d["dtypes"] = dict(sorted(self.dtypes.items()))
        for k in ("compression", "compression_level", "chunk_size"):
            d.pop(k)
        d.update(self.writer_options())  # resolved defaults: the manifest records what was written
        return d
