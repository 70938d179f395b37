"""The checks of a shard set's files against its manifest, for :class:`~shardload.sets.shardset.ShardSet`.

Cheap by design (a few ``stat`` calls and O(samples) numpy per shard opened, no
sample data read); ``shardload verify`` is the thorough counterpart. The faults
they catch, and what each raises, are docs/reliability.md, "A shard set on disk".
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import numpy as np
from numpy.typing import NDArray

from shardload._base.identity import FileStamp, ShardIdentity, describe_change, file_stamp, identity_problem, same_bytes
from shardload._base.setfiles import check_index_values, check_path_encoding, open_index_stat, stat_regular
from shardload.errors import CorruptShardError, ManifestError, ShardSetChangedError
from shardload.formats import Columns, ShardReader, get_format
from shardload.formats.manifest import MANIFEST_NAME, Manifest, resolve_inside

T = TypeVar("T")
#: ``room_for(attempt)``: ``attempt()``, retried once after closing shards if it ran out of file descriptors
RoomFor = Callable[[Callable[[], T]], T]


def identity_problem_of(manifest: Manifest, shard: int, reader: ShardReader) -> str | None:
    """What is wrong with shard ``shard``'s place by its own identity record (``None``: this set, this position).

    Raises:
        CorruptShardError: the record cannot be read.
    """
    found = ShardIdentity.parse(reader.stored_identity, where=f"{shard} ({reader.path})")
    set_id, index, first = manifest.identity_of(shard)
    return identity_problem(found, index, first, manifest.shards[shard].samples, set_id)


def _stat_manifest(path: Path) -> tuple[int, int, int] | None:
    """Identity of ``manifest.json`` on disk (inode, size, mtime), to notice a re-prepare."""
    try:
        st = (path / MANIFEST_NAME).stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class FileChecks:
    """The manifest of the set at ``path``, and the checks of the set's files against it.

    It knows the identity of ``manifest.json`` (a re-prepare under a live job is named as such, never reported as
    damage) and the stamp of each lengths index when first mapped, and checks a shard at its first open in a
    process (size, identity record, sample count, offsets) and at each later use (its stamp).

    Kept across pickling (a worker must find the lengths files whose values were checked and the plan was made
    from), except on another machine, where a ``stat`` of the same file differs.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._manifest_stat = _stat_manifest(path)
        self.manifest = Manifest.load(path)
        self.reader_cls = get_format(self.manifest.shard_format).reader
        self._checked_indexes: set[str] = set()  # lengths files whose values were checked
        self._index_stamps: dict[str, FileStamp] = {}  # stamp of each lengths file when first mapped
        self._host = socket.gethostname()
        self._mapped: dict[str, NDArray[np.integer]] = {}  # each lengths index mapped in this process

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_mapped": {}}  # a worker maps each index afresh

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if state.get("_host") != socket.gethostname():
            self._host = socket.gethostname()
            self._index_stamps = {}
            self._checked_indexes = set()

    def check_unchanged(self) -> None:
        """Raise if ``manifest.json`` is no longer the one this set was opened with."""
        now = _stat_manifest(self.path)
        if now == self._manifest_stat:
            return
        fingerprint = None
        if now is not None:
            try:
                fingerprint = Manifest.load(self.path).fingerprint
            except ManifestError:
                pass
        if fingerprint != self.manifest.fingerprint:
            raise ShardSetChangedError(
                f"{self.path} was re-prepared (or is being re-prepared) since it was opened (fingerprint "
                f"{self.manifest.fingerprint} -> {fingerprint or 'none yet'}); its shards would mix old and new "
                "data. Restart the job once prepare has finished."
            )
        self._manifest_stat = now  # rewritten with the same content

    # -- the lengths indexes -------------------------------------------------------------------------------
    def index(self, file: str, total: int | None = None) -> NDArray[np.integer]:
        """Lengths index ``file``, mapped on first use; each use checks (one ``stat``) that it is unchanged."""
        if file not in self._mapped:
            self._mapped[file] = self._load_index(file, total)
        else:
            self.check_index_unchanged(file)
        return self._mapped[file]

    def _load_index(self, file: str, total: int | None) -> NDArray[np.integer]:
        """Map one lengths index after checking its file, header and (once) its values."""
        path = resolve_inside(self.path, file, what="the lengths index")
        try:
            samples = self.manifest.total_samples
            index, st = open_index_stat(path, what="the lengths index", samples=samples, error=ManifestError)
            old = self._index_stamps.setdefault(file, file_stamp(st))
            if not same_bytes(old, file_stamp(st)):
                self._index_changed(file, old, file_stamp(st))
            if file not in self._checked_indexes:
                check_index_values(index, path, what="the lengths index", total=total, error=ManifestError)
                self._checked_indexes.add(file)
        except ManifestError:
            self.check_unchanged()  # a re-prepared set explains another index better than damage does
            raise
        return index

    def check_index_unchanged(self, file: str) -> None:
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
        self.check_unchanged()  # a re-prepared set says more than one changed file
        raise ShardSetChangedError(
            f"the lengths index {file} ({self.path / file}) changed on disk after this shard set was opened: "
            f"{describe_change(old, new)}. Batches planned from it could break the token budget or differ "
            f"between ranks. Do not modify a shard set while a job reads it; run `shardload verify {self.path}`, "
            "then restart the job."
        )

    # -- a shard -----------------------------------------------------------------------------------------
    def open_shard(self, shard: int, room_for: RoomFor[Any]) -> tuple[ShardReader, Columns, FileStamp]:
        """Map shard ``shard`` and run the cheap checks; its reader, columns and the stamp of its file.

        No sample data is read (a few ``stat`` calls, O(samples) numpy): a byte changed inside it is only found
        by ``shardload verify``.
        """
        info = self.manifest.shards[shard]
        path = resolve_inside(self.path, info.file, what=f"shard {shard}")
        try:
            st = self._probe(shard, path, room_for)
        except CorruptShardError:  # missing
            self.check_unchanged()  # removed by a re-prepare: say so, not damage
            raise
        size = st.st_size
        if stat.S_ISREG(st.st_mode) and size != info.bytes:
            self.check_unchanged()  # a re-prepared set explains a new size better than damage does
            why = self._misplaced(shard, path) or "truncated or rewritten"
            raise CorruptShardError(
                f"shard {shard} ({path}) has {size} bytes, the manifest says {info.bytes}: {why}. "
                f"Run `shardload verify {self.path}` and re-run prepare."
            )
        check_path_encoding(path, what=f"shard {shard}", shard_format=self.manifest.shard_format)
        reader = self.reader_cls(path, self.manifest.schema, samples=info.samples, options=self.manifest.options)
        try:
            try:
                cols = room_for(reader.columns)  # a Zarr shard takes more descriptors than the probe
            except CorruptShardError:
                self._probe(shard, path, room_for)  # out of file descriptors, or made unreadable since: say that
                raise
            # the file mapped is the one whose size was checked, unchanged
            stamp = self.check_stamp(shard, reader, file_stamp(st))
            # Mapped first, checked second: if the manifest is still the one we opened, the
            # file we mapped was written with it (prepare removes the manifest before any shard).
            self.check_unchanged()
            problem = identity_problem_of(self.manifest, shard, reader)
            if problem is not None:
                raise CorruptShardError(
                    f"shard {shard} ({reader.path}): {problem}. Put the right file back (`shardload verify "
                    f"{self.path}` lists every misplaced shard) or re-run prepare."
                )
            if cols.num_samples != info.samples:
                raise CorruptShardError(
                    f"shard {shard} ({path}) holds {cols.num_samples} samples, the manifest says {info.samples}. "
                    f"Run `shardload verify {self.path}` and re-run prepare."
                )
            self._check_offsets(shard, cols)
        except BaseException:
            reader.close()
            raise
        return reader, cols, stamp

    def _probe(self, shard: int, path: Path, room_for: RoomFor[os.stat_result]) -> os.stat_result:
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
        return room_for(lambda: stat_regular(path, what=what, missing=missing))

    def _misplaced(self, shard: int, path: Path) -> str | None:
        """Why a shard of the wrong size is there, if its own record says (best effort, for the message).

        The file is untrusted: it is opened with the manifest's bounds, as any shard is, so that a Zarr shard
        cannot size what is read from its own sample count.
        """
        info = self.manifest.shards[shard]
        reader = self.reader_cls(path, self.manifest.schema, samples=info.samples, options=self.manifest.options)
        try:
            reader.columns()
            return identity_problem_of(self.manifest, shard, reader)
        except Exception:  # noqa: BLE001  unreadable: the caller reports the size
            return None
        finally:
            reader.close()

    def check_stamp(self, shard: int, reader: ShardReader, old: FileStamp) -> FileStamp:
        """The stamp to keep for open shard ``shard``, stamped ``old``; raise if its file changed since.

        One ``fstat`` of the reader's descriptor (1-2 us): a write or truncation changes size, mtime or ctime
        (:func:`~shardload._base.identity.same_bytes`). A file replaced by a rename leaves the mapped one intact
        and is not an error here (a re-prepare is caught through the manifest, a foreign file by its identity
        when next opened).

        Raises:
            ShardSetChangedError: naming the shard and how its file changed.
        """
        fd = reader.fileno()
        try:
            new: FileStamp | None = file_stamp(os.fstat(fd) if fd is not None else os.stat(reader.path))
        except OSError:
            new = None
        if new == old:  # the common case: nothing changed, decided without the rule below
            return old
        if same_bytes(old, new):
            return old if new is None else new  # a chmod or a link since: compare with the file as it is now
        self.check_unchanged()  # a re-prepared set says more than one changed file
        raise ShardSetChangedError(
            f"shard {shard} ({reader.path}) changed on disk while this process had it open: "
            f"{describe_change(old, new)}. Data read from it can no longer be trusted. Do not modify a shard set "
            f"while a job reads it; run `shardload verify {self.path}`, then restart the job."
        )

    def _check_offsets(self, shard: int, cols: Columns) -> None:
        """Each variable field's offsets must agree with the lengths indexes, sample by sample.

        Every index a reader uses: each per-field one, and ``lengths.npy`` recomputed from the offsets with
        :meth:`Schema.batching_lengths`, the rule ``prepare`` used.

        Raises:
            CorruptShardError: naming the shard, the field (or index) and the first bad sample.
        """
        m, schema, info = self.manifest, self.manifest.schema, self.manifest.shards[shard]
        lo, hi = info.first_sample, info.first_sample + info.samples
        # Each index is fetched (and its file checked unchanged: one stat) once per open, then used as an array.
        main = self.index(m.lengths_file, total=m.total_tokens)
        index = {
            f.name: main if f.name not in m.field_lengths else self.index(m.field_lengths[f.name])
            for f in schema.variable_fields
        }
        found: dict[str, NDArray[np.int64]] = {}
        for f in schema.variable_fields:
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
        batching = schema.batching_lengths(found, info.samples)
        expected = main[lo:hi]
        bad = np.flatnonzero(batching != expected)
        if len(bad):
            row = int(bad[0])
            given = f"{self.manifest.lengths_file} gives sample {lo + row} (row {row}) a batching length of {int(expected[row])}"
            if not found:
                self._corrupt_offsets(shard, f"{given}, but no field varies in length, so it must be 1")
            rule = (
                f"the length of {schema.length_field!r}"
                if schema.length_field is not None
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
