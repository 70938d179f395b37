"""An opened shard set: manifest + lengths index, with shards mapped on demand.

``shardload.open(path)`` reads the manifest and memory-maps the lengths index;
no shard file is touched until a sample in it is asked for, so opening costs
the same whether a rank needs 3 shards of 100,000 or all of them.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import numpy as np
from numpy.typing import NDArray

from shardload._base.checks import check_scalar, with_shortcuts
from shardload._base.identity import (
    FileStamp,
    ShardIdentity,
    describe_change,
    file_stamp,
    identity_problem,
    same_bytes,
)
from shardload._base.setfiles import (
    ENV_MAX_OPEN_SHARDS,
    MAX_OPEN_SHARDS,
    check_index_values,
    check_path_encoding,
    env_limit,
    open_index_stat,
    reason_of,
    stat_regular,
)
from shardload.errors import CorruptShardError, ManifestError, ShardSetChangedError, ShardSetError
from shardload.formats import Columns, ShardReader, get_format
from shardload.formats.manifest import MANIFEST_NAME, Manifest, ShardInfo, resolve_inside
from shardload.formats.origin import SampleOrigin, read_origin
from shardload.plan.request import PlanInputs
from shardload.remote.options import RemoteOptions
from shardload.remote.url import is_remote
from shardload.schema.fields import Schema
from shardload.schema.text import decode_text
from shardload.sets.index import ShardIndex

if TYPE_CHECKING:
    from shardload.remote.cache import RemoteSet

T = TypeVar("T")


class ShardSet:
    """A shard set on disk, opened for reading.

    Attributes:
        path: the shard set directory; for a remote set, its mirror in the node cache.
        url: the URL of a remote set (``None`` for a local one): what messages name.
        manifest: the validated manifest.
        index: sample id <-> (shard, row).

    At most ``max_open_shards`` shards stay open (mapped, holding a file
    descriptor) in one process; opening another closes the least recently used
    one. Arrays handed out before stay valid: they keep their mapping alive.

    Examples:
        >>> ds = shardload.open("out/")          # doctest: +SKIP
        >>> len(ds), ds.lengths[:3], ds[0]["tokens"].dtype  # doctest: +SKIP
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_open_shards: int | None = None, remote: RemoteOptions | None = None
    ) -> None:
        self.url: str | None = None
        # a remote set: manifest and lengths in a local mirror (shardload.remote.cache); shards fetched on first use
        self._remote: RemoteSet | None = None
        if is_remote(path):
            from shardload.remote.cache import RemoteSet

            self._remote = RemoteSet(str(path), remote or RemoteOptions())
            self.url = self._remote.url
            path = self._remote.open()
        self.path = Path(path)
        #: shards kept open in this process (default: $SHARDLOAD_MAX_OPEN_SHARDS, else 128)
        # 0 once meant the default and a negative number closed every shard at each open: both are refused
        self.max_open_shards = (
            env_limit(ENV_MAX_OPEN_SHARDS, MAX_OPEN_SHARDS)
            if max_open_shards is None
            else check_scalar(
                "max_open_shards",
                max_open_shards,
                low=1,
                high=sys.maxsize,
                hint=f"the shards kept open per process; None for ${ENV_MAX_OPEN_SHARDS}, else {MAX_OPEN_SHARDS}",
            )
        )
        self._manifest_stat = self._stat_manifest()
        self.manifest = Manifest.load(self.path)
        self.index = ShardIndex(self.manifest.table.samples)
        self._reader_cls = get_format(self.manifest.shard_format).reader
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()  # least recently used first
        self._pid = os.getpid()  # the process the open readers belong to (see _forget_inherited)
        self._opened: set[int] = set()  # every shard opened in this process, closed since or not
        self._checked_indexes: set[str] = set()  # lengths files whose values were checked (kept across pickling)
        # stamp of each lengths file when first mapped (kept across pickling: a worker maps the file afresh and
        # must find the one whose values were checked, and that the plan was made from)
        self._index_stamps: dict[str, FileStamp] = {}
        self._host = socket.gethostname()  # stamps mean nothing on another machine (other device numbers)
        self._lengths: NDArray[np.integer] | None = None
        self._plan_inputs: PlanInputs | None = None
        self._field_lengths: dict[str, NDArray[np.integer]] = {}
        # stamp of each open shard when it was mapped
        self._stamps: dict[int, FileStamp] = {}

    @property
    def remote(self) -> RemoteSet | None:
        """The node cache of a remote set (``None`` for a local one)."""
        return self._remote

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
    def shards(self) -> Sequence[ShardInfo]:
        """One manifest entry per shard: file, samples, bytes, checksum, first sample (columns: ``manifest.table``)."""
        return self.manifest.shards

    @property
    def fingerprint(self) -> str:
        """Digest of the schema and every shard's checksum; changes when the set is re-prepared."""
        return self.manifest.fingerprint

    def __len__(self) -> int:
        return self.manifest.total_samples

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}:{f.dtype}{list(f.shape)}" for f in self.schema.fields)
        return f"ShardSet({self.url or str(self.path)!r}, samples={len(self)}, shards={len(self.shards)}, fields=[{fields}])"

    @property
    def lengths(self) -> NDArray[np.integer]:
        """``(num_samples,)`` batching length of every sample, memory-mapped.

        Each access checks (one ``stat``) that the file is still the one mapped:
        a lengths index rewritten or truncated under a live loader is a
        :class:`~shardload.errors.ShardSetChangedError`, never a plan from other
        values or a ``SIGBUS``.
        """
        if self._lengths is None:
            self._lengths = self._load_lengths(self.manifest.lengths_file, total=self.manifest.total_tokens)
        else:
            self._check_index_unchanged(self.manifest.lengths_file)
        return self._lengths

    def plan_inputs(self) -> PlanInputs:
        """What the planner needs of this set: lengths, samples per shard and a digest of them.

        Built once (the lengths are checked once) and reused; each call checks,
        as :attr:`lengths` does, that the lengths index has not changed on disk.
        The digest is the manifest fingerprint, which covers every shard's
        checksum and so the lengths too: the index is never hashed.

        >>> plan = plan_rank(ds.plan_inputs(), EpochSpec(world_size=8), Batching(max_tokens=16384), rank=0)  # doctest: +SKIP
        """
        lengths = self.lengths
        if self._plan_inputs is None or self._plan_inputs.lengths is not lengths:
            chunk_rows = self._reader_cls.plan_chunk_rows(self.schema, self.manifest.options)
            self._plan_inputs = PlanInputs(lengths, self.index.sizes, digest=self.fingerprint, chunk_rows=chunk_rows)
        return self._plan_inputs

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
        else:
            self._check_index_unchanged(file)
        return self._field_lengths[name]

    def _load_lengths(self, file: str, total: int | None = None) -> NDArray[np.integer]:
        """Map one lengths index after checking its file, header and (once) its values."""
        path = resolve_inside(self.path, file, what="the lengths index")
        try:
            index, st = open_index_stat(path, what="the lengths index", samples=len(self), error=ManifestError)
            old = self._index_stamps.setdefault(file, file_stamp(st))
            if not same_bytes(old, file_stamp(st)):
                self._index_changed(file, old, file_stamp(st))
            if file not in self._checked_indexes:
                check_index_values(index, path, what="the lengths index", total=total, error=ManifestError)
                self._checked_indexes.add(file)
        except ManifestError:
            self._check_unchanged()  # a re-prepared set explains another index better than damage does
            raise
        return index

    def _check_index_unchanged(self, file: str) -> None:
        """Raise if lengths file ``file`` changed since it was first mapped (one ``stat`` of its path).

        By path, not by the mapping: a worker process or another rank would map
        the file now at the path, so a file replaced there is a change too.
        """
        old = self._index_stamps.get(file)
        if old is None:
            return
        try:
            new: FileStamp | None = file_stamp(os.stat(self.path / file))
        except OSError:
            new = None
        if not same_bytes(old, new):
            self._index_changed(file, old, new)
        elif new is not None:
            self._index_stamps[file] = new  # a chmod or a link since: compare with the file as it is now

    def _index_changed(self, file: str, old: FileStamp, new: FileStamp | None) -> NoReturn:
        self._check_unchanged()  # a re-prepared set says more than one changed file
        raise ShardSetChangedError(
            f"the lengths index {file} ({self.path / file}) changed on disk after this shard set was opened: "
            f"{describe_change(old, new)}. Batches planned from it could break the token budget or differ "
            f"between ranks. Do not modify a shard set while a job reads it; run `shardload verify {self.path}`, "
            "then restart the job."
        )

    # -- samples: opens shards lazily ----------------------------------------------------------
    def shard_columns(self, shard: int) -> Columns:
        """The columns of shard ``shard``, memory-mapped on first use."""
        if self._remote is not None and self._pid != os.getpid():
            self._forget_inherited()
        reader = self._readers.get(shard)
        if reader is None:
            return self._open_shard(shard)
        self._check_stamp(shard, reader)  # before any page of a possibly truncated file is touched
        self._readers.move_to_end(shard)
        cols = reader.columns()
        expected = self.manifest.shards[shard].samples
        if cols.num_samples != expected:
            raise CorruptShardError(
                f"shard {shard} ({reader.path}) holds {cols.num_samples} samples, the manifest says {expected}"
            )
        return cols

    def _forget_inherited(self) -> None:
        """In a process forked from the one that mapped shards (a loader worker): let go of its copies.

        Of a remote set only: the node cache deletes a shard once no process holds it, but the worker's
        copies of its parent's mappings and descriptors would keep the deleted file's space in use for as
        long as the worker lives. The worker closes its copies (the parent's locks and mappings stay as they
        are) and maps what it reads under locks of its own.
        """
        self._pid = os.getpid()
        readers, self._readers = self._readers, OrderedDict()
        self._stamps = {}
        for reader in readers.values():
            reader.close()
        if self._remote is not None:
            self._remote.forget_inherited()

    def _open_shard(self, shard: int) -> Columns:
        """Map shard ``shard``: a remote set's is fetched into the node cache first, and held there while mapped."""
        if self._remote is None:
            return self._map_shard(shard)
        self._evict(self.max_open_shards - 1)
        self._fit_limit(shard)
        self._remote.acquire(shard)
        try:
            return self._map_shard(shard)
        except BaseException as exc:
            self._remote.release(shard)
            if isinstance(exc, ShardSetError) and self.url is not None and self.url not in str(exc):
                raise type(exc)(f"{self.url}: {exc}") from exc
            raise

    def _fit_limit(self, shard: int) -> None:
        """Bounded cache: close this process's least recently used shards until they and ``shard`` fit the limit.

        Without this, random access (``ds[i]`` over every shard) would keep shards open that only this
        process holds and then wait ``wait_timeout`` for room that it alone keeps taken.
        """
        assert self._remote is not None
        limit = self._remote.options.limit
        if limit is None:
            return
        shards = self.manifest.shards
        held = sum(shards[k].bytes for k in self._readers)
        while self._readers and held + shards[shard].bytes > limit:
            oldest = next(iter(self._readers))
            held -= shards[oldest].bytes
            self._close_shard(oldest)

    def _map_shard(self, shard: int) -> Columns:
        """Map shard ``shard`` and run the cheap checks, once per process.

        Cost: a few ``stat`` calls and O(samples in the shard) numpy over the
        offsets buffers and the lengths index; no sample data is read. A byte
        changed inside sample data is only found by ``shardload verify``.
        """
        info = self.manifest.shards[shard]
        path = resolve_inside(self.path, info.file, what=f"shard {shard}")
        self._evict(self.max_open_shards - 1)
        try:
            st = self._probe(shard, path)
        except CorruptShardError:  # missing
            self._check_unchanged()  # removed by a re-prepare: say so, not damage
            raise
        size = st.st_size
        if stat.S_ISREG(st.st_mode) and size != info.bytes:
            self._check_unchanged()  # a re-prepared set explains a new size better than damage does
            why = self._misplaced(shard, path) or "truncated or rewritten"
            raise CorruptShardError(
                f"shard {shard} ({path}) has {size} bytes, the manifest says {info.bytes}: {why}. "
                f"Run `shardload verify {self.path}` and re-run prepare."
            )
        check_path_encoding(path, what=f"shard {shard}", shard_format=self.manifest.shard_format)
        reader = self._reader_cls(path, self.schema, samples=info.samples, options=self.manifest.options)
        try:
            try:
                cols = self._room_for(reader.columns)  # a Zarr shard takes more descriptors than the probe
            except CorruptShardError:
                self._probe(shard, path)  # out of file descriptors, or made unreadable since: say that instead
                raise
            self._stamps[shard] = file_stamp(st)
            self._check_stamp(shard, reader)  # the file mapped is the one whose size was checked, unchanged
            # Mapped first, checked second: if the manifest is still the one we opened, the
            # file we mapped was written with it (prepare removes the manifest before any shard).
            self._check_unchanged()
            self._check_identity(shard, reader)
            if cols.num_samples != info.samples:
                raise CorruptShardError(
                    f"shard {shard} ({path}) holds {cols.num_samples} samples, the manifest says {info.samples}. "
                    f"Run `shardload verify {self.path}` and re-run prepare."
                )
            self._check_offsets(shard, cols)
        except BaseException:
            self._stamps.pop(shard, None)
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
        return self._room_for(lambda: stat_regular(path, what=what, missing=missing))

    def _room_for(self, attempt: Callable[[], T]) -> T:
        """``attempt()``; if it runs out of file descriptors, close the older half of the open shards and retry once."""
        try:
            return attempt()
        except ShardSetError as exc:
            if reason_of(exc) != "fd_limit" or not self._readers:
                raise
        self._evict(len(self._readers) // 2)  # free descriptors of our own, then try once more
        return attempt()

    def _evict(self, keep: int) -> None:
        """Close the least recently used shards until at most ``keep`` stay open.

        Closing releases the file descriptor; arrays already handed out keep
        their memory mapping alive until they are freed, so they stay valid.
        """
        while len(self._readers) > max(keep, 0):
            self._close_shard(next(iter(self._readers)))

    def _close_shard(self, shard: int) -> None:
        reader = self._readers.pop(shard)
        self._stamps.pop(shard, None)  # a reopen stamps (and checks) the file afresh
        reader.close()
        if self._remote is not None:
            self._remote.release(shard)  # the node cache may evict it now

    def release_others(self, shards: Iterable[int]) -> None:
        """Close every open shard but ``shards`` when this remote set's cache is bounded (else nothing).

        Called after each batch: a process then holds only the shards of the batch it reads, so the
        cache can evict the rest (see docs/remote.md, "Cache sizing").
        """
        if self._remote is None or self._remote.options.limit is None:
            return
        keep = set(shards)
        for shard in [s for s in self._readers if s not in keep]:
            self._close_shard(shard)

    def _check_offsets(self, shard: int, cols: Columns) -> None:
        """Each variable field's offsets must agree with the lengths indexes, sample by sample.

        Checks every index a reader uses: each per-field index, and the batching
        index the planner reads (``lengths.npy``), recomputed from the offsets
        with the rule ``prepare`` used (:meth:`Schema.batching_lengths`).

        Raises:
            CorruptShardError: naming the shard, the field (or index) and the first bad sample.
        """
        info = self.manifest.shards[shard]
        lo, hi = info.first_sample, info.first_sample + info.samples
        # Each index is fetched (and its file checked unchanged: one stat) once per open, then used as an array.
        main = self.lengths
        index = {
            f.name: main if f.name not in self.manifest.field_lengths else self.field_lengths(f.name)
            for f in self.schema.variable_fields
        }
        found: dict[str, NDArray[np.int64]] = {}
        for f in self.schema.variable_fields:
            found[f.name] = self._field_rows(shard, f.name, cols)
            expected = index[f.name][lo:hi]  # (samples,) as the lengths index says
            bad = np.flatnonzero(found[f.name] != expected)
            if len(bad):
                row = int(bad[0])
                self._corrupt_offsets(
                    shard,
                    f"field {f.name!r}: sample {lo + row} (row {row}) has {int(found[f.name][row])} rows, the "
                    f"lengths index says {int(expected[row])}",
                )
        if any(index[name] is main for name in found):
            return  # one variable field: its index is the batching index, checked above
        batching = self.schema.batching_lengths(found, info.samples)
        expected = main[lo:hi]
        bad = np.flatnonzero(batching != expected)
        if len(bad):
            row = int(bad[0])
            given = f"{self.manifest.lengths_file} gives sample {lo + row} (row {row}) a batching length of {int(expected[row])}"
            if not found:
                self._corrupt_offsets(shard, f"{given}, but no field varies in length, so it must be 1")
            rule = (
                f"the length of {self.schema.length_field!r}"
                if self.schema.length_field is not None
                else f"the longest of {', '.join(map(repr, found))}"
            )
            self._corrupt_offsets(shard, f"{given}, its offsets give {int(batching[row])} ({rule})")

    def _field_rows(self, shard: int, name: str, cols: Columns) -> NDArray[np.int64]:
        """``(samples,)`` rows of each sample of field ``name``, from offsets checked against the values."""
        data = cols.fields[name]
        problem = data.offsets_problem(self.manifest.shards[shard].samples)
        if problem is not None or data.offsets is None:  # (no offsets is a problem; the test is for mypy)
            self._corrupt_offsets(shard, f"field {name!r}: {problem}")
        rows: NDArray[np.int64] = np.diff(data.offsets).astype(np.int64, copy=False)
        return rows

    def _corrupt_offsets(self, shard: int, problem: str) -> NoReturn:
        raise CorruptShardError(
            f"shard {shard} ({self.path / self.manifest.shards[shard].file}): {problem}; the shard (or the lengths "
            f"index) is corrupt. Run `shardload verify {self.path}` and re-run prepare."
        )

    # -- where a shard belongs, and whether it changed while mapped (see shardload._base.identity) ---------
    def _identity_problem(self, shard: int, reader: ShardReader) -> str | None:
        found = ShardIdentity.parse(reader.stored_identity, where=f"{shard} ({reader.path})")
        set_id, index, first = self.manifest.identity_of(shard)
        return identity_problem(found, index, first, self.manifest.shards[shard].samples, set_id)

    def _check_identity(self, shard: int, reader: ShardReader) -> None:
        """The shard's own record must name this set and this position.

        Raises:
            CorruptShardError: naming the position the file claims and the one it is in.
        """
        problem = self._identity_problem(shard, reader)
        if problem is not None:
            raise CorruptShardError(
                f"shard {shard} ({reader.path}): {problem}. Put the right file back (`shardload verify {self.path}` "
                "lists every misplaced shard) or re-run prepare."
            )

    def _misplaced(self, shard: int, path: Path) -> str | None:
        """Why a shard of the wrong size is there, if its own record says (best effort, for the message).

        The file is untrusted: it is opened with the manifest's bounds, as any shard is, so that a Zarr shard
        cannot size what is read from its own sample count.
        """
        info = self.manifest.shards[shard]
        reader = self._reader_cls(path, self.schema, samples=info.samples, options=self.manifest.options)
        try:
            reader.columns()
            return self._identity_problem(shard, reader)
        except Exception:  # noqa: BLE001  unreadable: the caller reports the size
            return None
        finally:
            reader.close()

    def _check_stamp(self, shard: int, reader: ShardReader) -> None:
        """Raise if the file that open shard ``shard`` reads from changed since it was mapped.

        One ``fstat`` of the reader's own descriptor (about 1-2 us in all): a write into
        the mapped file, or a truncation, changes its size, mtime or ctime (see
        :func:`~shardload._base.identity.same_bytes`). A file
        replaced by a rename leaves the mapped one intact and is not an error
        here (a re-prepare is caught through the manifest, a foreign file by its
        identity when it is next opened). The dataset checks every shard a
        batch touches, before reading and again after the batch is built.

        Raises:
            ShardSetChangedError: naming the shard and how its file changed.
        """
        old = self._stamps.get(shard)
        if old is None:
            return
        fd = reader.fileno()
        try:
            new: FileStamp | None = file_stamp(os.fstat(fd) if fd is not None else os.stat(reader.path))
        except OSError:
            new = None
        if new == old:  # the common case: nothing changed, decided without the rule below
            return
        if same_bytes(old, new):
            if new is not None:
                self._stamps[shard] = new  # a chmod or a link since: compare with the file as it is now
            return
        self._check_unchanged()  # a re-prepared set says more than one changed file
        raise ShardSetChangedError(
            f"shard {shard} ({reader.path}) changed on disk while this process had it open: "
            f"{describe_change(old, new)}. Data read from it can no longer be trusted. Do not modify a shard set "
            f"while a job reads it; run `shardload verify {self.path}`, then restart the job."
        )

    def check_shards_unchanged(self, shards: Iterable[int]) -> None:
        """Raise :class:`ShardSetChangedError` if any of these open shards changed since it was mapped."""
        for shard in shards:
            reader = self._readers.get(shard)
            if reader is not None:
                self._check_stamp(shard, reader)

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

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Sample ``i`` as a dict of numpy arrays (zero-copy views for Arrow shards), ``str``/``bytes`` for text."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for a shard set of {n} samples")
        shard, row = self.index.locate(i % n)
        sample: dict[str, Any] = self.shard_columns(int(shard)).sample(int(row))
        for f in self.schema.text_fields:
            sample[f.name] = decode_text(f, sample[f.name], f"{self.path}: sample {i % n}")
        return sample

    def origin(self, sample_id: int) -> SampleOrigin:
        """Where sample ``sample_id`` came from: its source file and the row, line or member in it.

        For a set written by ``write()`` from an iterable, the sample's index in
        the iterable (``kind == "index"``, ``file`` is ``None``).

        Raises:
            TypeError: ``sample_id`` is not an integer (a bool, float or str).
            IndexError: ``sample_id`` is not in ``[0, len(self))``.
            ShardSetError: the set records no origins (prepared by an older shardload).
        """
        if self._remote is not None:
            self._remote.fetch_origins()  # on first use only
        return read_origin(self.path, sample_id, len(self))

    def close(self) -> None:
        """Unmap every shard opened so far; later reads map them again."""
        for shard in list(self._readers):
            self._close_shard(shard)

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes reopen shards themselves: never ship mappings across a fork/pickle.
        state = self.__dict__.copy()
        state["_readers"] = OrderedDict()
        state["_stamps"] = {}
        state["_opened"] = set()
        state["_lengths"] = None
        state["_field_lengths"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if state.get("_host") != socket.gethostname():  # another machine: its stat of the same file differs
            self._host = socket.gethostname()
            self._index_stamps = {}
            self._checked_indexes = set()


def open_shard_set(
    path: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
    remote: RemoteOptions | None = None,
) -> ShardSet:
    """Open a shard set written by ``prepare``/``write``: a directory, or a URL (``s3://``, ``gs://``, ``https://``).

    A remote set's manifest and lengths indexes are fetched into the node cache; each shard is
    downloaded whole on first use, checked against the manifest's sha256, and memory-mapped from
    there (docs/remote.md). A local set is read where it is and no cache is made.

    Args:
        path: the shard set directory or URL.
        storage_options: keywords of the fsspec filesystem (credentials, ``client_kwargs``); default:
            the standard environment variables.
        cache_dir: the node cache (default ``$SHARDLOAD_CACHE_DIR``, else ``~/.cache/shardload``).
        cache_limit: the most bytes of shards the set keeps in the cache (default no limit).
        remote: all remote settings at once (:class:`~shardload.remote.RemoteOptions`); the keywords
            above are shortcuts for its fields and must agree with it.
    """
    options = with_shortcuts(
        remote,
        RemoteOptions,
        "remote",
        storage_options=storage_options,
        cache_dir=cache_dir,
        cache_limit=cache_limit,
    )
    return ShardSet(path, remote=options)
