"""Check a shard set on disk against its manifest, byte for byte (``shardload verify OUT``).

The slow, thorough counterpart of the checks :func:`shardload.open` makes lazily
(:mod:`shardload.sets._integrity`): every shard is read in full, by the checks docs/cli.md ("shardload
verify") lists. Damage is *reported* (:class:`Problem`), never raised, so one run lists everything wrong:

>>> report = verify("out/")                # doctest: +SKIP
>>> for p in report.problems:              # doctest: +SKIP
...     print(p)
shard 3 (shards/shard-000003.arrow): checksum_mismatch: ...
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from shardload._base.checksum import file_checksum
from shardload._base.messages import one_line
from shardload._base.pool import map_in_workers
from shardload._base.progress import Progress
from shardload._base.redact import redact
from shardload._base.setfiles import check_index_values, check_path_encoding, open_index, open_regular, reason_of
from shardload.errors import CorruptShardError, MissingDependencyError, ShardSetError
from shardload.formats import Columns, get_format
from shardload.formats.arrow.writer import to_arrow
from shardload.formats.manifest import Manifest, ShardInfo, resolve_inside
from shardload.formats.origin import ORDER_NAME, ORIGINS_NAME, check_order, read_origins
from shardload.remote.options import RemoteOptions
from shardload.remote.url import is_remote, local_path
from shardload.schema.fields import Field, Schema
from shardload.sets._integrity import identity_problem_of

if TYPE_CHECKING:
    from shardload.remote.cache import RemoteSet

__all__ = ["REASONS", "Problem", "VerifyReport", "verify"]

#: reason codes of a :class:`Problem`, from the most to the least fundamental
REASONS = (
    "missing",  # the file is not there
    "outside_set",  # a symbolic link leads out of the shard set; not read
    "truncated",  # smaller than the manifest says
    "size_mismatch",  # larger than the manifest says (rewritten, appended to)
    "checksum_mismatch",  # right size, different bytes
    "unreadable",  # the format's reader refuses it (or the lengths index is not a valid .npy)
    "misplaced",  # its own identity record names another position, or another set
    "wrong_count",  # readable, but holds another number of samples
    "lengths_mismatch",  # the lengths index disagrees with the shard's offsets
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a shard set.

    Attributes:
        shard: index of the shard in the manifest, or ``None`` for a problem of
            the set as a whole (the lengths index).
        file: the file concerned, relative to the shard set.
        reason: one of :data:`REASONS`.
        detail: what was found, in words.
    """

    shard: int | None
    file: str
    reason: str
    detail: str

    def __str__(self) -> str:
        where = self.file if self.shard is None else f"shard {self.shard} ({self.file})"
        return f"{where}: {self.reason}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify`.

    Attributes:
        path: the shard set directory.
        shards: number of shards in the manifest.
        samples: number of samples in the manifest.
        bytes: bytes of shard data read and checksummed.
        seconds: wall time of the check.
        problems: everything found wrong, ordered by shard, then set-level problems. Of a URL: the set in
            storage's (a copy found damaged in the node cache is downloaded again first, see ``refetched``).
        refetched: of a URL, the shards whose copy in the node cache was damaged (what was wrong with it), and
            which were downloaded again and found good: the set in storage is fine, the cache is repaired.
    """

    path: str
    shards: int
    samples: int
    bytes: int
    seconds: float
    problems: tuple[Problem, ...]
    refetched: tuple[Problem, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def damaged_shards(self) -> list[int]:
        """Sorted indices of the shards with at least one problem."""
        return sorted({p.shard for p in self.problems if p.shard is not None})

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "shards": self.shards,
            "samples": self.samples,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "damaged_shards": self.damaged_shards,
            "problems": [p.to_json() for p in self.problems],
            "refetched": [p.to_json() for p in self.refetched],
        }


def verify(
    path: str | os.PathLike[str],
    *,
    workers: int = 1,
    progress: bool | None = None,
    remote: RemoteOptions | None = None,
) -> VerifyReport:
    """Check every shard of the set at ``path`` against its manifest.

    A remote set is checked through the node cache: each shard is downloaded (its sha256 compared with the
    manifest's), then checked as a local one; with a ``cache_limit``, checked shards make room for the next. An
    object not in storage is ``missing``; one that does not match after a second download is
    ``checksum_mismatch`` (or ``truncated``/``size_mismatch`` by its size); each names its URL. A copy that was
    in the cache already and has problems is downloaded again and checked afresh: good, it is listed in
    ``refetched`` (the cache was damaged, not the set); bad, its problems are the stored object's.

    Args:
        path: a shard set directory, or a URL.
        workers: shards checked in parallel (threads: hashing and page-ins release the GIL).
        progress: show a progress bar; ``None`` means "if stderr is a terminal" (else a log line every few seconds).
        remote: credentials and node cache of a URL.

    Raises:
        ManifestError: the manifest is missing, unreadable or inconsistent, so
            there is nothing to verify against.

    >>> report = verify("out/")                         # doctest: +SKIP
    >>> report.ok, [str(p) for p in report.problems]    # doctest: +SKIP
    (True, [])
    """
    cache: RemoteSet | None = None
    if is_remote(path):
        from shardload.remote.cache import RemoteSet

        cache = RemoteSet(str(path), remote or RemoteOptions())
        root = cache.open(full=True)  # every metadata file hashed against what the cache wrote
    else:
        root = Path(local_path(path))
    manifest = Manifest.load(root)  # ManifestError propagates: nothing to check against
    started = time.perf_counter()
    index_problems: list[Problem] = []
    indexes = {"": _load_index(root, manifest.lengths_file, manifest.total_samples, index_problems)}
    for name, file in sorted(manifest.field_lengths.items()):
        indexes[name] = _load_index(root, file, manifest.total_samples, index_problems)
    if indexes[""] is not None:
        total = int(_chunked_sum(indexes[""]))
        if total != manifest.total_tokens:
            index_problems.append(
                Problem(
                    None,
                    manifest.lengths_file,
                    "lengths_mismatch",
                    f"the index sums to {total} tokens, the manifest says {manifest.total_tokens}",
                )
            )
    checker = _ShardChecker(root, manifest, indexes, cache)
    problems: list[Problem] = []
    refetched: list[Problem] = []
    nbytes = 0
    bar = Progress(
        "verify",
        total=int(manifest.table.bytes.sum()),
        unit="bytes",
        enabled=progress,
        every=10.0,
        log="shardload.verify",
    )
    try:
        shards = range(len(manifest.shards))
        for k, (found, repaired, read) in enumerate(map_in_workers(checker, shards, workers, threads=True)):
            problems.extend(found)
            refetched.extend(repaired)
            nbytes += read
            info = manifest.shards[k]
            bar.update(info.samples, info.bytes)  # progress through the set, read or not
    finally:
        bar.close()
    problems.extend(index_problems)
    if cache is not None:
        cache.fetch_origins(order=True)
    if (root / ORIGINS_NAME).exists():  # a set of an older shardload has none
        try:
            read_origins(root, manifest.total_samples, every_row=True)
        except ShardSetError as exc:
            problems.append(Problem(None, ORIGINS_NAME, "unreadable", str(exc)))
    try:  # what origin(i) reads for the pieces of a record; a set copied without it passes
        check_order(root, manifest.total_samples, [(p.first_sample, p.samples) for p in manifest.parts])
    except ShardSetError as exc:
        problems.append(Problem(None, ORDER_NAME, "unreadable", str(exc)))
    return VerifyReport(
        path=redact(str(path)) if cache is not None else str(root),
        shards=len(manifest.shards),
        samples=manifest.total_samples,
        bytes=nbytes,
        seconds=time.perf_counter() - started,
        problems=tuple(problems),
        refetched=tuple(refetched),
    )


# -- the lengths index ---------------------------------------------------------------------------------
def _load_index(root: Path, file: str, total: int, problems: list[Problem]) -> NDArray[np.integer] | None:
    """Memory-map one lengths index, or record why it cannot be used (and return ``None``).

    The same rules as the loader's: inside the set, a regular file, a plain
    ``.npy`` of ``total`` integers, every value in range.
    """
    try:
        path = resolve_inside(root, file, what="the lengths index")
        index: NDArray[np.integer] = open_index(path, what="the lengths index", samples=total)
        check_index_values(index, path, what="the lengths index")  # the sum is compared by the caller
    except ShardSetError as exc:
        problems.append(Problem(None, file, _reason(exc), str(exc)))
        return None
    return index


def _reason(exc: BaseException) -> str:
    reason = reason_of(exc)
    return reason if reason in REASONS else "unreadable"


def _chunked_sum(arr: NDArray[np.integer], chunk: int = 1 << 24) -> int:
    # Chunks keep a billion-entry index from being summed through one giant temporary.
    return sum(int(arr[i : i + chunk].sum(dtype=np.int64)) for i in range(0, len(arr), chunk))


def utf8_problem(f: Field, cols: Columns) -> str:
    """What is wrong with the text of ``str`` field ``f`` (a value that is not UTF-8), or ``""``."""
    if f.dtype != "str":
        return ""
    data = cols.fields[f.name]
    try:
        to_arrow(f, data.values, data.offsets)  # checks every value is UTF-8, as when it was written
    except pa.ArrowException as exc:
        return f"its text is not valid UTF-8 ({one_line(exc)})"
    return ""


def recompute_lengths(schema: Schema, cols: Columns) -> dict[str, NDArray[np.int64]]:
    """Lengths a shard's offsets imply: ``""`` -> batching length, plus one entry per variable field.

    The batching length comes from :meth:`Schema.batching_lengths`, the rule
    ``prepare`` wrote the index with.
    """
    per_field = {f.name: cols.fields[f.name].lengths().astype(np.int64) for f in schema.variable_fields}
    return {"": schema.batching_lengths(per_field, cols.num_samples), **per_field}


# -- one shard -----------------------------------------------------------------------------------------
class _ShardChecker:
    def __init__(
        self,
        root: Path,
        manifest: Manifest,
        indexes: dict[str, NDArray[np.integer] | None],
        cache: RemoteSet | None = None,
    ) -> None:
        self.cache = cache
        self.root = root
        self.manifest = manifest
        self.indexes = indexes
        self.reader_cls = get_format(manifest.shard_format).reader

    def __call__(self, k: int) -> tuple[list[Problem], list[Problem], int]:
        """Problems of shard ``k``, its cache copy's if that was damaged and replaced, and the bytes read.

        A remote shard is fetched into the cache first. A copy found there with problems may have been damaged
        in the cache (it matched the manifest's sha256 when downloaded): it is downloaded again, once, and the
        fresh copy decides whether the stored object is bad.
        """
        if self.cache is None:
            problems, read = self._check(k)
            return problems, [], read
        file, url = self.manifest.shards[k].file, self.cache.shard_url(k)
        was_cached = self.cache.cached(k)
        again: list[Problem] = []
        try:
            self.cache.acquire(k)
            problems, read = self._check(k)
            if problems and was_cached:
                self.cache.refetch(k, CorruptShardError(problems[0].detail))
                again, more = self._check(k)
                read += more
        except CorruptShardError as exc:  # missing from storage, or not matching it after a second download
            return [Problem(k, file, _reason(exc), str(exc))], [], 0
        finally:
            self.cache.release(k)
        if not problems and was_cached:  # a good copy says nothing of the object: is it still in storage?
            return self._stored(k, file, url), [], read
        if not problems:
            return [], [], read
        if was_cached and not again:
            # The first problem is the size or checksum one (checked first), which any damage to a copy changes.
            wrong = f"{problems[0].reason}: {problems[0].detail}"
            if len(problems) > 1:
                wrong += f"; also {', '.join(sorted({p.reason for p in problems[1:]}))}"
            note = (
                f"its copy in the node cache was damaged ({wrong}); downloaded again from {url}, the new copy is good"
            )
            return [], [Problem(k, file, problems[0].reason, note)], read
        from shardload.remote.cache import diagnosis

        # A fresh copy, which matched the manifest's sha256: the problems are the stored object's.
        return (
            [Problem(k, file, p.reason, f"{diagnosis(p.detail)} (in storage: {url})") for p in again or problems],
            [],
            read,
        )

    def _stored(self, k: int, file: str, url: str) -> list[Problem]:
        """The problem of shard ``k``'s object in storage (one ``info()``) when its copy in the node cache is good."""
        assert self.cache is not None
        size, want = self.cache.stored_size(k), self.manifest.shards[k].bytes
        if size == want or size == -1:  # -1: storage does not say, and the cached copy was checked whole
            return []
        found = (
            "is missing from storage" if size is None else f"has {size:,} bytes in storage, the manifest says {want:,}"
        )
        return [
            Problem(
                k,
                file,
                "missing" if size is None else "size_mismatch",
                f"shard {k} ({url}) {found} (its copy in the node cache is good): upload the set again "
                "(shardload upload SET URL)",
            )
        ]

    def _check(self, k: int) -> tuple[list[Problem], int]:
        info = self.manifest.shards[k]
        path = self.root / info.file
        problems: list[Problem] = []

        def report(reason: str, detail: str) -> None:
            problems.append(Problem(k, info.file, reason, detail))

        read = 0
        try:
            path = resolve_inside(self.root, info.file, what=f"shard {k}")
            # regular files only (a FIFO would hang the read), opened once for the size and the checksum
            fd, st = open_regular(path, what=f"shard {k}")
        except ShardSetError as exc:
            report(_reason(exc), "the file does not exist" if reason_of(exc) == "missing" else str(exc))
            return problems, read
        with open(fd, "rb") as fh:
            size = st.st_size
            if size != info.bytes:
                reason = "truncated" if size < info.bytes else "size_mismatch"
                report(reason, f"{size} bytes on disk, the manifest says {info.bytes}")
            else:
                try:
                    digest = file_checksum(fh)
                except OSError as exc:
                    report("unreadable", f"cannot be read ({exc})")
                    return problems, read
                read = size
                if digest != info.checksum:
                    report("checksum_mismatch", f"content is {digest}, the manifest says {info.checksum}")
        try:
            check_path_encoding(path, what=f"shard {k}", shard_format=self.manifest.shard_format)
        except ShardSetError as exc:
            report("unreadable", str(exc))
            return problems, read
        self._check_content(k, info, path, report)
        return problems, read

    def _check_content(self, k: int, info: ShardInfo, path: Path, report: Callable[[str, str], None]) -> None:
        reader = self.reader_cls(path, self.manifest.schema, samples=info.samples, options=self.manifest.options)
        try:
            try:
                cols = reader.columns()
            except MissingDependencyError:
                raise  # not damage: no shard of the format can be read here (exit status 2, with the install hint)
            except Exception as exc:  # noqa: BLE001  any failure to decode is damage to report, not to raise
                report("unreadable", f"the {self.manifest.shard_format} reader refuses it: {one_line(exc)}")
                return
            try:
                misplaced = identity_problem_of(self.manifest, k, reader)
            except CorruptShardError as exc:
                misplaced = str(exc)
            if misplaced is not None:
                report("misplaced", misplaced)
            if cols.num_samples != info.samples:
                report("wrong_count", f"holds {cols.num_samples} samples, the manifest says {info.samples}")
                return
            try:
                reader.check_data()  # Zarr: every chunk decoded once, within the bounds checked at open
            except Exception as exc:  # noqa: BLE001
                report("unreadable", f"its data cannot be decoded: {one_line(exc)}")
                return
            bad = [
                f"field {f.name!r}: {problem}"
                for f in self.manifest.schema.fields
                if f.has_offsets and (problem := cols.fields[f.name].offsets_problem(info.samples)) is not None
            ]
            bad += [
                f"field {f.name!r}: {problem}"
                for f in self.manifest.schema.text_fields
                if (problem := utf8_problem(f, cols))
            ]
            if bad:  # the loader refuses such a shard at its first open (the same rule)
                report("unreadable", f"its offsets do not fit its values: {'; '.join(bad)}")
                return
            try:
                lengths = recompute_lengths(self.manifest.schema, cols)
            except Exception as exc:  # noqa: BLE001
                report("unreadable", f"its offsets cannot be read: {one_line(exc)}")
                return
            if int(lengths[""].sum()) != info.tokens:
                report(
                    "lengths_mismatch",
                    f"its samples hold {int(lengths[''].sum())} tokens, the manifest says {info.tokens}",
                )
            for key, index in self.indexes.items():
                if index is None or key not in lengths:
                    continue
                expected = np.asarray(index[info.first_sample : info.first_sample + info.samples], dtype=np.int64)
                diff = np.flatnonzero(expected != lengths[key])
                if len(diff):
                    row = int(diff[0])
                    name = self.manifest.lengths_file if key == "" else self.manifest.field_lengths[key]
                    report(
                        "lengths_mismatch",
                        f"{name} disagrees with the shard for {len(diff)} of {info.samples} samples; first: sample "
                        f"{info.first_sample + row} (row {row}) has length {int(lengths[key][row])}, the index says "
                        f"{int(expected[row])}",
                    )
        finally:
            reader.close()
