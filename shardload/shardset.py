"""An opened shard set: manifest + lengths index, with shards mapped on demand.

``shardload.open(path)`` reads the manifest and memory-maps the lengths index;
no shard file is touched until a sample in it is asked for, so opening costs
the same whether a rank needs 3 shards of 100,000 or all of them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload.errors import CorruptShardError, ManifestError
from shardload.formats import Columns, ShardReader, get_format
from shardload.index import ShardIndex
from shardload.manifest import Manifest
from shardload.schema import Schema


class ShardSet:
    """A shard set on disk, opened for reading.

    Attributes:
        path: the shard set directory.
        manifest: the validated manifest.
        index: sample id <-> (shard, row).

    >>> ds = shardload.open("out/")          # doctest: +SKIP
    >>> len(ds), ds.lengths[:3], ds[0]["tokens"].dtype  # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.manifest = Manifest.load(self.path)
        self.index = ShardIndex([s.samples for s in self.manifest.shards])
        _, self._reader_cls = get_format(self.manifest.shard_format)
        self._readers: dict[int, ShardReader] = {}
        self._lengths: NDArray[np.integer] | None = None

    # -- metadata, no shard opened ---------------------------------------------------------
    @property
    def schema(self) -> Schema:
        return self.manifest.schema

    @property
    def shards(self) -> tuple[Any, ...]:
        return self.manifest.shards

    @property
    def fingerprint(self) -> str:
        return self.manifest.fingerprint

    def __len__(self) -> int:
        return self.manifest.total_samples

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}:{f.dtype}{list(f.shape)}" for f in self.schema.fields)
        return f"ShardSet({str(self.path)!r}, samples={len(self)}, shards={len(self.shards)}, fields=[{fields}])"

    @property
    def lengths(self) -> NDArray[np.integer]:
        """``(num_samples,)`` batching length of every sample, memory-mapped."""
        if self._lengths is None:
            self._lengths = self._load_lengths(self.manifest.lengths_file)
        return self._lengths

    def field_lengths(self, name: str) -> NDArray[np.integer]:
        """``(num_samples,)`` first-axis length of variable field ``name``."""
        f = self.schema.field(name)
        if not f.variable:
            raise KeyError(f"field {name!r} is fixed-shape; it has no lengths")
        file = self.manifest.field_lengths.get(name)
        if file is None:  # a single variable field: the main index is its lengths
            return self.lengths
        return self._load_lengths(file)

    def _load_lengths(self, file: str) -> NDArray[np.integer]:
        path = self.path / file
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise ManifestError(f"{path}: the lengths index is missing; re-run prepare") from None
        except ValueError as exc:
            raise ManifestError(f"{path}: the lengths index is unreadable ({exc}); re-run prepare") from None
        if arr.ndim != 1 or len(arr) != len(self) or arr.dtype.kind not in "iu":
            raise ManifestError(
                f"{path}: the lengths index holds {arr.shape} {arr.dtype}, expected {len(self)} integers; re-run prepare"
            )
        return arr

    # -- samples: opens shards lazily ----------------------------------------------------------
    def shard_columns(self, shard: int) -> Columns:
        """The columns of shard ``shard``, memory-mapped on first use."""
        reader = self._readers.get(shard)
        if reader is None:
            info = self.manifest.shards[shard]
            path = self.path / info.file
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise CorruptShardError(
                    f"shard {shard} ({path}) is missing; run `shardload verify {self.path}` and re-run prepare"
                ) from None
            if path.is_file() and size != info.bytes:
                raise CorruptShardError(
                    f"shard {shard} ({path}) has {size} bytes, the manifest says {info.bytes}: truncated or "
                    f"rewritten. Run `shardload verify {self.path}` and re-run prepare."
                )
            reader = self._reader_cls(path, self.schema)
            self._readers[shard] = reader
        cols = reader.columns()
        expected = self.manifest.shards[shard].samples
        if cols.num_samples != expected:
            raise CorruptShardError(
                f"shard {shard} ({reader.path}) holds {cols.num_samples} samples, the manifest says {expected}"
            )
        return cols

    @property
    def open_shards(self) -> list[int]:
        """Indices of the shards this process has opened so far (for locality checks)."""
        return sorted(self._readers)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        """Sample ``i`` as a dict of numpy arrays (zero-copy views for Arrow shards)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for a shard set of {n} samples")
        shard, row = self.index.locate(i % n)
        return self.shard_columns(int(shard)).sample(int(row))

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes reopen shards themselves: never ship mappings across a fork/pickle.
        state = self.__dict__.copy()
        state["_readers"] = {}
        state["_lengths"] = None
        return state


def open_shard_set(path: str | os.PathLike[str]) -> ShardSet:
    """Open a shard set directory written by ``prepare``/``write``."""
    return ShardSet(path)
