"""Write a shard set as WebDataset tar shards, the reverse of prepare's WebDataset source.

Where it sits: beside the flow, after ``prepare``: an export is a copy for
pipelines that stream tars (``webdataset.WebDataset``), and ``shardload prepare``
reads it back into the same samples. Guarantees: byte-identical tars for the
same set (fixed member metadata); one export at a time per ``DEST``, which must
be empty or hold only an earlier export (``overwrite``); and an interrupted
export never looks complete (tars staged under hidden names, the index written
last: the rules of :mod:`shardload._base.output`, shared with ``prepare``).
Layout, member naming and the index: docs/format.md, "Writing tars".
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardload._base.checksum import file_checksum
from shardload._base.output import OutputLock, fsync_file, publish_index, withdraw_index
from shardload._base.progress import Progress
from shardload._base.ranges import offsets_from_lengths
from shardload._base.version import VERSION
from shardload.errors import InputError, OutputError, OutputExistsError, OutputLockedError
from shardload.prepare.sources import EXPORT_INDEX_NAME
from shardload.prepare.sources.webdataset import split_member_name
from shardload.schema.fields import Schema
from shardload.sets.shardset import ShardSet, open_shard_set

__all__ = ["INDEX_NAME", "WebDatasetExport", "to_webdataset"]

#: the file describing an export; its leading underscore keeps it out of `shardload prepare DEST/`
INDEX_NAME = EXPORT_INDEX_NAME
INDEX_FORMAT = "shardload-webdataset-export"
INDEX_VERSION = 1
#: minimum widths of the zero-padded sample key and tar number
KEY_DIGITS = 9
TAR_DIGITS = 6

_LOCK = ".export.lock"
_TAR_RE = re.compile(r"shard-\d+\.tar")
#: temporary names of an unfinished export (tars, and the index being written)
_STAGED_RE = re.compile(r"\.shard-\d+\.tar\.new|\._shardload_export\.json\.tmp-\d+")
_PROGRESS_EVERY = 1024  # samples between progress updates


@dataclass(frozen=True)
class WebDatasetExport:
    """What :func:`to_webdataset` wrote (also the CLI's ``--json`` summary).

    ``tars`` are file names inside ``dest``, in sample order; ``prepare_options``
    are the ``shardload prepare`` options that turn them back into a set with
    the same schema (``--fixed-field``, ...).
    """

    path: str
    dest: str
    tars: tuple[str, ...]
    samples: int
    bytes: int
    seconds: float
    prepare_options: tuple[str, ...]

    @property
    def pattern(self) -> str:
        """The tars as one brace pattern, e.g. ``DEST/shard-{000000..000003}.tar``."""
        return os.path.join(self.dest, tar_pattern(self.tars))

    def to_json(self) -> dict[str, Any]:
        """The result as a plain dict (what ``shardload export --json`` prints)."""
        return {
            "path": self.path,
            "dest": self.dest,
            "format": "webdataset",
            "tars": list(self.tars),
            "pattern": self.pattern,
            "samples": self.samples,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "prepare_options": list(self.prepare_options),
        }


def to_webdataset(
    set_path: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    samples_per_tar: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
) -> WebDatasetExport:
    """Write the shard set at ``set_path`` as WebDataset tars in ``dest``.

    ``dest`` is created if missing and must be empty, or with ``overwrite``
    hold only an earlier export (which stays intact until the new one is
    complete). ``samples_per_tar=None`` writes one tar per shard (the last tar
    may hold fewer); ``progress=None`` shows a bar if stderr is a terminal.
    ``result.pattern`` is the brace pattern to give ``webdataset.WebDataset``
    or ``shardload prepare``.

    Raises:
        ShardSetError: ``set_path`` is not a usable shard set.
        OutputExistsError: ``dest`` is not empty (and not ``overwrite``), or
            holds files that are not an export.
        OutputLockedError: another export is writing into ``dest``.
        InputError: ``samples_per_tar`` is not a positive integer, or a field
            name of the set would not survive WebDataset's member naming.
        OutputError: ``dest`` cannot be written.

    >>> from shardload.integrations.webdataset_export import to_webdataset
    >>> result = to_webdataset("out/", "wds/", samples_per_tar=10_000)  # doctest: +SKIP
    >>> import webdataset                                                # doctest: +SKIP
    >>> dataset = webdataset.WebDataset(result.pattern).decode()         # doctest: +SKIP
    """
    if samples_per_tar is not None and (
        isinstance(samples_per_tar, bool) or not isinstance(samples_per_tar, int) or samples_per_tar < 1
    ):
        raise InputError(
            f"samples_per_tar must be a positive integer (the samples in each tar), got {samples_per_tar!r}; "
            "pass at least 1, or None for one tar per shard of the set"
        )
    started = time.perf_counter()
    ds = open_shard_set(set_path)
    check_field_names(ds.schema, where=str(set_path))
    members = member_kinds(ds.schema)
    sizes = _tar_sizes(ds, samples_per_tar)
    key_digits = max(KEY_DIGITS, len(str(max(len(ds) - 1, 0))))
    tar_digits = max(TAR_DIGITS, len(str(max(len(sizes) - 1, 0))))
    names = [f"shard-{t:0{tar_digits}d}.tar" for t in range(len(sizes))]
    out = Path(dest)
    with _DestLock(out, overwrite=overwrite) as lock:
        staged: list[Path] = []
        bar = Progress("export", total=len(ds), enabled=progress, log="shardload.export")
        try:
            samples = _iter_samples(ds)
            records: list[dict[str, Any]] = []
            for name, size, first in zip(names, sizes, offsets_from_lengths(sizes).tolist()):
                tmp = out / f".{name}.new"
                staged.append(tmp)
                keys = (f"{i:0{key_digits}d}" for i in itertools.count(first))
                _write_tar(tmp, zip(keys, itertools.islice(samples, size)), members, bar)
                records.append(_tar_record(name, tmp, size, first))
            prepare_options = prepare_options_for(ds.schema)
            index = _index_json(ds, records, key_digits, prepare_options)
            lock.commit(staged, names, index)
        except BaseException:
            for tmp in staged:
                tmp.unlink(missing_ok=True)
            raise
        finally:
            bar.close()
            ds.close()
    return WebDatasetExport(
        path=str(set_path),
        dest=str(out),
        tars=tuple(names),
        samples=len(ds),
        bytes=sum(r["bytes"] for r in records),
        seconds=time.perf_counter() - started,
        prepare_options=tuple(prepare_options),
    )


def check_field_names(schema: Schema, *, where: str) -> None:
    """Refuse (:class:`InputError`: the names are the export's input) field names WebDataset naming would change.

    A member ``<key>.<field>.npy`` is split at the first dot of its base name
    and its suffix is lower-cased (by WebDataset and ``prepare`` alike): a
    field ``inputIds`` would come back as ``inputids``, one with ``/`` would
    change the key.
    """
    key = "0" * KEY_DIGITS
    for f in schema.fields:
        if split_member_name(f"{key}.{f.name}.npy") != (key, f.name, "npy", False):
            raise InputError(
                f"{where}: field {f.name!r} cannot be exported to WebDataset: member names are split at the "
                "first dot and their suffix is lower-cased, so it would come back under another name. "
                "Field names for WebDataset must be lower case, non-empty and without '/'; re-prepare the set "
                "with renamed fields."
            )


def prepare_options_for(schema: Schema) -> list[str]:
    """The ``shardload prepare`` options that rebuild ``schema`` from exported tars.

    dtypes and shapes travel in the ``.npy`` members; what they cannot say is
    which fields are fixed (scalars are fixed anyway), which field sets the
    batching length, and the sample order (``--no-shuffle`` keeps the ids).
    """
    options = ["--no-shuffle"]
    for f in schema.fields:
        if not f.variable and f.shape:
            options += ["--fixed-field", f.name]
    if schema.length_field is not None:
        options += ["--length-field", schema.length_field]
    return options


def tar_pattern(names: Sequence[str]) -> str:
    """``shard-{000000..000003}.tar`` for consecutive names (the name itself for one)."""
    if len(names) <= 1:
        return names[0] if names else ""
    first, last = names[0][len("shard-") : -len(".tar")], names[-1][len("shard-") : -len(".tar")]
    return f"shard-{{{first}..{last}}}.tar"


# -- reading the set ----------------------------------------------------------------------------------


def _tar_sizes(ds: ShardSet, samples_per_tar: int | None) -> list[int]:
    """Samples in each tar: one tar per non-empty shard, or ``samples_per_tar`` each."""
    if samples_per_tar is None:
        return [s.samples for s in ds.shards if s.samples > 0]
    full, rest = divmod(len(ds), samples_per_tar)
    return [samples_per_tar] * full + ([rest] if rest else [])


def _iter_samples(ds: ShardSet) -> Iterator[Mapping[str, np.ndarray]]:
    """Every sample in global id order, mapping one shard at a time."""
    for k, info in enumerate(ds.shards):
        if info.samples == 0:
            continue
        cols = ds.shard_columns(k)
        for row in range(cols.num_samples):
            yield cols.sample(row)
        # the caller has written the last sample before asking for the next one
        ds.close()


# -- writing tars --------------------------------------------------------------------------------------


def _npy_bytes(value: np.ndarray) -> bytes:
    """``value`` in ``.npy`` format, as ``np.save`` writes it (half its cost: no pickle checks to run)."""
    arr = np.asarray(value, order="C")  # (not ascontiguousarray: it turns a 0-d array into 1-d)
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(arr))
    buf.write(arr.tobytes())
    return buf.getvalue()


_BLOCK = tarfile.BLOCKSIZE  # 512
_RECORD = tarfile.RECORDSIZE  # 20 blocks: tar files are padded to a whole record
_MAX_OCTAL_SIZE = 8**11  # a larger member needs a PAX size record
# The parts of a ustar header that are the same for every member we write:
# mode 0644, uid 0, gid 0 | mtime 0 | type, no link, magic, no user/group/device/prefix, padding to 512.
_MODE_IDS = b"0000644\x000000000\x000000000\x00"
_MTIME = b"00000000000\x00"
_AFTER_CHECKSUM = tarfile.REGTYPE + b"\x00" * 100 + tarfile.POSIX_MAGIC + b"\x00" * (64 + 16 + 155 + 12)


def member_header(name: str, size: int) -> bytes:
    """The tar header of a regular member with our fixed metadata.

    Built directly (many times faster than ``TarInfo.tobuf``) as plain ustar for
    an ASCII name of up to 100 bytes under 8 GiB; else ``tarfile``'s PAX header.
    """
    raw = name.encode("utf-8")
    if len(raw) > 100 or not name.isascii() or size >= _MAX_OCTAL_SIZE:
        info = tarfile.TarInfo(name)  # its defaults are the fixed metadata: mode 0644, uid/gid 0, mtime 0, no names
        info.size = size
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    head = raw.ljust(100, b"\x00") + _MODE_IDS + b"%011o\x00" % size + _MTIME
    checksum = sum(head) + 8 * 0x20 + sum(_AFTER_CHECKSUM)  # the checksum field counts as 8 spaces
    return head + b"%06o\x00 " % checksum + _AFTER_CHECKSUM


def member_kinds(schema: Schema) -> list[tuple[str, str]]:
    """``(field, member extension)`` of each field, in schema order: ``npy``, or ``txt``/``bin`` for text."""
    return [(f.name, ("txt" if f.dtype == "str" else "bin") if f.text else "npy") for f in schema.fields]


def _write_tar(
    path: Path,
    samples: Iterator[tuple[str, Mapping[str, np.ndarray]]],
    fields: Sequence[tuple[str, str]],
    bar: Progress,
) -> None:
    """Write ``(key, sample)`` pairs as one tar: a ``<key>.<field>.<ext>`` member per ``(field, ext)``, in order.

    A text field's stored values are its bytes already (UTF-8 for ``str``): they are the member.
    """
    pending_samples = pending_bytes = 0
    offset = 0
    with open(path, "wb", buffering=1 << 20) as fh:
        for key, sample in samples:
            for name, ext in fields:
                data = _npy_bytes(sample[name]) if ext == "npy" else sample[name].tobytes()
                header = member_header(f"{key}.{name}.{ext}", len(data))
                padding = -len(data) % _BLOCK
                fh.write(header)
                fh.write(data)
                fh.write(b"\x00" * padding)
                offset += len(header) + len(data) + padding
                pending_bytes += len(data)
            pending_samples += 1
            if pending_samples >= _PROGRESS_EVERY:
                bar.update(pending_samples, pending_bytes)
                pending_samples = pending_bytes = 0
        # end of archive: two zero blocks, then zeros up to a whole record (as tarfile does)
        offset += 2 * _BLOCK
        fh.write(b"\x00" * (2 * _BLOCK + (-offset % _RECORD)))
    fsync_file(path)
    bar.update(pending_samples, pending_bytes)


def _tar_record(name: str, path: Path, samples: int, first: int) -> dict[str, Any]:
    size, checksum = path.stat().st_size, file_checksum(path)
    return {"file": name, "samples": samples, "bytes": size, "checksum": checksum, "first_sample": first}


def _index_json(ds: ShardSet, records: list[dict[str, Any]], key_digits: int, prepare_options: list[str]) -> str:
    index = {
        "format": INDEX_FORMAT,
        "format_version": INDEX_VERSION,
        "shardload_version": VERSION,
        "source_fingerprint": ds.fingerprint,
        "schema": ds.schema.to_json(),
        "samples": len(ds),
        "key": f"sample id, zero-padded to {key_digits} digits",
        "member": "<key>.<field>.npy" + (" (.txt / .bin for str / bytes fields)" if ds.schema.has_text else ""),
        "pattern": tar_pattern([r["file"] for r in records]),
        "prepare_options": prepare_options,
        "tars": records,
    }
    return json.dumps(index, indent=1) + "\n"


# -- the destination directory -------------------------------------------------------------------------


class _DestLock:
    """Owns ``DEST`` for one export: checks it may be written, locks it, commits the new tars."""

    def __init__(self, dest: Path, *, overwrite: bool) -> None:
        self.dest = dest
        self.overwrite = overwrite
        self._lock = OutputLock(
            dest / _LOCK,
            busy=f"{dest}: another export is writing into this directory right now; wait for it or choose "
            "another destination",
        )
        self._old: list[Path] = []

    def __enter__(self) -> _DestLock:
        dest = self.dest
        if dest.exists() and not dest.is_dir():
            raise OutputError(f"{dest} exists and is not a directory; choose another destination")
        self._check()  # before locking: a refused directory gets no lock file
        try:
            dest.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        except OutputLockedError:
            raise
        except OSError as exc:
            raise OutputError(f"{dest}: cannot create the destination ({exc.strerror or exc})") from None
        try:
            existing = self._check()  # again, now that no other export can change it
        except BaseException:
            self._lock.release()
            raise
        for p in existing:
            if _STAGED_RE.fullmatch(p.name):  # left by an interrupted export
                p.unlink(missing_ok=True)
        self._old = [p for p in existing if p.exists()]
        return self

    def _check(self) -> list[Path]:
        """What ``DEST`` holds besides the lock, after checking that it may be written."""
        dest = self.dest
        existing = [p for p in dest.iterdir() if p.name != _LOCK] if dest.is_dir() else []
        if existing and not self.overwrite:
            raise OutputExistsError(
                f"{dest}: the directory is not empty ({_some(existing)}). Pass --overwrite to replace an earlier "
                "export (it stays intact until the new one is complete), or choose an empty directory."
            )
        foreign = [p for p in existing if not _is_export_file(p)]
        if foreign:
            raise OutputExistsError(
                f"{dest}: holds files that are not a WebDataset export ({_some(foreign)}); --overwrite only "
                "replaces an earlier export. Choose an empty directory."
            )
        return existing

    def __exit__(self, *exc: object) -> None:
        self._lock.release()  # leaves only the export's own files

    def commit(self, staged: Sequence[Path], names: Sequence[str], index: str) -> None:
        """Move the finished tars into place, the old index withdrawn first and the new one written last."""
        staged_index = self.dest / f".{INDEX_NAME}.tmp-{os.getpid()}"
        try:
            staged_index.write_text(index, encoding="utf-8")
            withdraw_index(self.dest / INDEX_NAME)
            for tmp, name in zip(staged, names):
                os.replace(tmp, self.dest / name)
            keep = set(names)
            for p in self._old:
                if p.name not in keep and p.name != INDEX_NAME:
                    p.unlink(missing_ok=True)
            publish_index(staged_index, self.dest / INDEX_NAME)
        finally:
            staged_index.unlink(missing_ok=True)


def _is_export_file(p: Path) -> bool:
    return p.is_file() and (
        p.name == INDEX_NAME or bool(_TAR_RE.fullmatch(p.name)) or bool(_STAGED_RE.fullmatch(p.name))
    )


def _some(paths: Sequence[Path], limit: int = 5) -> str:
    names = sorted(p.name for p in paths)
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
