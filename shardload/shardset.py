"""An opened shard set: manifest + lengths index, with shards mapped on demand.

``shardload.open(path)`` reads the manifest and memory-maps the lengths index;
no shard file is touched until a sample in it is asked for, so opening costs
the same whether a rank needs 3 shards of 100,000 or all of them.
"""

from __future__ import annotations

import os
import stat
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload.errors import CorruptShardError, ManifestError, ShardSetChangedError, ShardSetError
from shardload.formats import Columns, ShardReader, get_format
from shardload.index import ShardIndex
from shardload.manifest import MANIFEST_NAME, Manifest, resolve_inside
from shardload.schema import Schema
from shardload.setfiles import (
    ENV_MAX_OPEN_SHARDS,
    MAX_OPEN_SHARDS,
    check_index_values,
    check_path_encoding,
    env_limit,
    open_index,
    reason_of,
    stat_regular,
)


class ShardSet:
    """A shard set on disk, opened for reading.

    Attributes:
        path: the shard set directory.
        manifest: the validated manifest.
        index: sample id <-> (shard, row).

    At most ``max_open_shards`` shards stay open (mapped, holding a file
    descriptor) in one process; opening another closes the least recently used
    one. Arrays handed out before stay valid: they keep their mapping alive.

    Examples:
        >>> ds = shardload.open("out/")          # doctest: +SKIP
        >>> len(ds), ds.lengths[:3], ds[0]["tokens"].dtype  # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike[str], *, max_open_shards: int | None = None) -> None:
        self.path = Path(path)
        #: shards kept open in this process (default: $SHARDLOAD_MAX_OPEN_SHARDS, else 128)
        self.max_open_shards = max_open_shards or env_limit(ENV_MAX_OPEN_SHARDS, MAX_OPEN_SHARDS)
        self._manifest_stat = self._stat_manifest()
        self.manifest = Manifest.load(self.path)
        self.index = ShardIndex([s.samples for s in self.manifest.shards])
        _, self._reader_cls = get_format(self.manifest.shard_format)
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()  # least recently used first
        self._opened: set[int] = set()  # every shard opened in this process, closed since or not
        self._checked_indexes: set[str] = set()  # lengths files whose values were checked (kept across pickling)
        self._lengths: NDArray[np.integer] | None = None
        self._field_lengths: dict[str, NDArray[np.integer]] = {}

    def _stat_manifest(self) -> tuple[int, int, int] | None:
        """Identity of ``manifest.json`` on disk (inode, size, mtime), to notice a re-prepare."""
        try:
            st = (self.path / MANIFEST_NAME).stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    # -- metadata, no shard opened ---------------------------------------------------------
    @property
    def schema(self) -> Schema:
        """The fields of every sample (from the manifest)."""
        return self.manifest.schema

    @property
    def shards(self) -> tuple[Any, ...]:
        """One manifest entry per shard: file, samples, bytes, checksum, first sample."""
        return self.manifest.shards

    @property
    def fingerprint(self) -> str:
        """Digest of the schema and every shard's checksum; changes when the set is re-prepared."""
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
            self._lengths = self._load_lengths(self.manifest.lengths_file, total=self.manifest.total_tokens)
        return self._lengths

    def field_lengths(self, name: str) -> NDArray[np.integer]:
        """``(num_samples,)`` first-axis length of variable field ``name``."""
        f = self.schema.field(name)
        if not f.variable:
            raise KeyError(f"field {name!r} is fixed-shape; it has no lengths")
        file = self.manifest.field_lengths.get(name)
        if file is None:  # a single variable field: the main index is its lengths
            return self.lengths
        if name not in self._field_lengths:
            self._field_lengths[name] = self._load_lengths(file)
        return self._field_lengths[name]

    def _load_lengths(self, file: str, total: int | None = None) -> NDArray[np.integer]:
        """Map one lengths index after checking its file, header and (once) its values."""
        path = resolve_inside(self.path, file, what="the lengths index")
        try:
            index: NDArray[np.integer] = open_index(
                path, what="the lengths index", samples=len(self), error=ManifestError
            )
            if file not in self._checked_indexes:
                check_index_values(index, path, what="the lengths index", total=total, error=ManifestError)
                self._checked_indexes.add(file)
        except ManifestError:
            self._check_unchanged()  # a re-prepared set explains another index better than damage does
            raise
        return index

    # -- samples: opens shards lazily ----------------------------------------------------------
    def shard_columns(self, shard: int) -> Columns:
        """The columns of shard ``shard``, memory-mapped on first use."""
        reader = self._readers.get(shard)
        if reader is None:
            return self._open_shard(shard)
        self._readers.move_to_end(shard)
        cols = reader.columns()
        expected = self.manifest.shards[shard].samples
        if cols.num_samples != expected:
            raise CorruptShardError(
                f"shard {shard} ({reader.path}) holds {cols.num_samples} samples, the manifest says {expected}"
            )
        return cols

    def _open_shard(self, shard: int) -> Columns:
        """Map shard ``shard`` and run the cheap checks, once per process.

        Cost: a few ``stat`` calls and O(samples in the shard) numpy over the
        offsets buffers and the lengths index; no sample data is read. A byte
        changed inside sample data is only found by ``shardload verify``.
        """
        info = self.manifest.shards[shard]
        path = resolve_inside(self.path, info.file, what=f"shard {shard}")
        self._evict(self.max_open_shards - 1)
        st = self._probe(shard, path)
        size = st.st_size
        if stat.S_ISREG(st.st_mode) and size != info.bytes:
            self._check_unchanged()  # a re-prepared set explains a new size better than damage does
            raise CorruptShardError(
                f"shard {shard} ({path}) has {size} bytes, the manifest says {info.bytes}: truncated or "
                f"rewritten. Run `shardload verify {self.path}` and re-run prepare."
            )
        check_path_encoding(path, what=f"shard {shard}", shard_format=self.manifest.shard_format)
        reader = self._reader_cls(path, self.schema)
        try:
            try:
                cols = reader.columns()
            except CorruptShardError:
                self._probe(shard, path)  # out of file descriptors, or made unreadable since: say that instead
                raise
            # Mapped first, checked second: if the manifest is still the one we opened, the
            # file we mapped was written with it (prepare removes the manifest before any shard).
            self._check_unchanged()
            if cols.num_samples != info.samples:
                raise CorruptShardError(
                    f"shard {shard} ({path}) holds {cols.num_samples} samples, the manifest says {info.samples}. "
                    f"Run `shardload verify {self.path}` and re-run prepare."
                )
            self._check_offsets(shard, cols)
        except BaseException:
            reader.close()
            raise
        self._readers[shard] = reader
        self._opened.add(shard)
        return cols

    def _probe(self, shard: int, path: Path) -> os.stat_result:
        """``fstat`` of shard ``shard``, refusing anything but a readable regular file.

        Raises:
            CorruptShardError: the file is missing.
            ShardSetError: not a regular file (a FIFO would hang the read), permission denied,
                out of file descriptors (after closing the shards opened least recently), ...
        """
        what = f"shard {shard}"
        missing = CorruptShardError(
            f"{what} ({path}) is missing; run `shardload verify {self.path}` and re-run prepare"
        )
        try:
            return stat_regular(path, what=what, missing=missing)
        except ShardSetError as exc:
            if reason_of(exc) != "fd_limit" or not self._readers:
                raise
        self._evict(len(self._readers) // 2)  # free descriptors of our own, then try once more
        return stat_regular(path, what=what, missing=missing)

    def _evict(self, keep: int) -> None:
        """Close the least recently used shards until at most ``keep`` stay open.

        Closing releases the file descriptor; arrays already handed out keep
        their memory mapping alive until they are freed, so they stay valid.
        """
        while len(self._readers) > max(keep, 0):
            _, reader = self._readers.popitem(last=False)
            reader.close()

    def _check_offsets(self, shard: int, cols: Columns) -> None:
        """Each variable field's offsets must agree with the lengths index, sample by sample.

        Raises:
            CorruptShardError: naming the shard, the field and the first bad sample.
        """
        info = self.manifest.shards[shard]
        lo, hi = info.first_sample, info.first_sample + info.samples
        for f in self.schema.variable_fields:
            data = cols.fields[f.name]
            offsets = data.offsets
            if offsets is None or len(offsets) != info.samples + 1:
                raise CorruptShardError(
                    f"shard {shard} ({self.path / info.file}): field {f.name!r} has no offsets for its "
                    f"{info.samples} samples. Run `shardload verify {self.path}` and re-run prepare."
                )
            found = np.diff(offsets)  # (samples,) rows of each sample, as the shard says
            expected = self.field_lengths(f.name)[lo:hi]  # (samples,) as the lengths index says
            bad = np.flatnonzero(found != expected)
            if offsets[0] != 0:
                problem, row = f"offsets start at {int(offsets[0])}, not 0", 0
            elif len(bad):
                row = int(bad[0])
                problem = f"sample {lo + row} (row {row}) has {int(found[row])} rows, the lengths index says {int(expected[row])}"
            elif int(offsets[-1]) != len(data.values):
                problem, row = (
                    f"offsets end at {int(offsets[-1])}, the values hold {len(data.values)} rows",
                    info.samples,
                )
            else:
                continue
            raise CorruptShardError(
                f"shard {shard} ({self.path / info.file}): field {f.name!r}: {problem}; the shard (or the lengths "
                f"index) is corrupt. Run `shardload verify {self.path}` and re-run prepare."
            )

    def _check_unchanged(self) -> None:
        """Raise if ``manifest.json`` is no longer the one this set was opened with."""
        now = self._stat_manifest()
        if now == self._manifest_stat:
            return
        fingerprint = None
        if now is not None:
            try:
                fingerprint = Manifest.load(self.path).fingerprint
            except ManifestError:
                pass
        if fingerprint != self.fingerprint:
            raise ShardSetChangedError(
                f"{self.path} was re-prepared (or is being re-prepared) since it was opened (fingerprint "
                f"{self.fingerprint} -> {fingerprint or 'none yet'}); its shards would mix old and new data. "
                "Restart the job once prepare has finished."
            )
        self._manifest_stat = now  # rewritten with the same content

    @property
    def open_shards(self) -> list[int]:
        """Indices of the shards this process has opened so far (for locality checks)."""
        return sorted(self._opened)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        """Sample ``i`` as a dict of numpy arrays (zero-copy views for Arrow shards)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for a shard set of {n} samples")
        shard, row = self.index.locate(i % n)
        return self.shard_columns(int(shard)).sample(int(row))

    def close(self) -> None:
        """Unmap every shard opened so far; later reads map them again."""
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes reopen shards themselves: never ship mappings across a fork/pickle.
        state = self.__dict__.copy()
        state["_readers"] = OrderedDict()
        state["_opened"] = set()
        state["_lengths"] = None
        state["_field_lengths"] = {}
        return state


def open_shard_set(path: str | os.PathLike[str]) -> ShardSet:
    """Open a shard set directory written by ``prepare``/``write``."""
    return ShardSet(path)
