"""Uploading a finished local shard set to object storage: shards first, ``manifest.json`` last.

The last step of ``prepare -o s3://...`` (:mod:`shardload.prepare.remote`) and the work of ``shardload
upload SET URL`` (:mod:`shardload.sets.upload`); the rules are in docs/remote.md, "Preparing into object
storage" and "Uploading a set". Guarantees: no reader opens a mix of an old and a
new set (an old manifest is deleted before the first new object is put, old objects after the new
manifest is in place); a resume skips an object only when the :class:`UploadRecord` names it *and*
the store has it with the right size (and MD5, where the ETag is one); with ``by_content`` (an upload of a
finished set) an object whose ETag is the local file's MD5 is skipped too, and with ``check`` every object is
compared with its file (size, MD5 where known) before the manifest is put, the manifest read back after. Every
call goes through
:func:`~shardload.remote.retry.with_retries`; what retrying cannot help is an ``OutputError``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Collection, Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from shardload._base.faults import crash_point
from shardload._base.progress import Progress
from shardload._base.redact import get_logger
from shardload.errors import OutputError, OutputExistsError, ShardloadError
from shardload.formats.manifest import MANIFEST_NAME
from shardload.formats.origin import ORDER_NAME, ORIGINS_NAME
from shardload.formats.shardtable import SHARD_TABLE_NAME
from shardload.remote.retry import RetryPolicy, with_retries
from shardload.remote.url import join_url, normalize_url, open_filesystem

__all__ = ["AT_URL", "RemoteObject", "SetUploader", "UploadRecord", "is_owned"]

logger = get_logger("shardload.upload")  # (also the upload step of prepare -o URL)

T = TypeVar("T")

#: the name :meth:`SetUploader.listing` gives an object named as the set's URL itself (not under it)
AT_URL = ""
#: uploads in flight at once
UPLOAD_THREADS = 4
_MD5 = re.compile(r"^[0-9a-f]{32}$")
_LENGTHS = re.compile(r"^lengths(\.[^/]+)?\.npy$")
#: the shards of a set merged from parts (shardload merge) stay under their part's folder
_PART_SHARDS = re.compile(r"^parts/\d+-of-\d+/shards/")


def is_owned(name: str) -> bool:
    """Whether ``name`` (relative to a set's root) is an object a shard set owns and an overwrite replaces."""
    return (
        name in (MANIFEST_NAME, SHARD_TABLE_NAME, ORDER_NAME, ORIGINS_NAME)
        or name.startswith("shards/")
        or bool(_LENGTHS.match(name) or _PART_SHARDS.match(name))
    )


@dataclass(frozen=True)
class RemoteObject:
    """One object under the set's URL, as the store lists it."""

    size: int
    #: the plain MD5 of the content where the store's ETag is one (not for multipart uploads), else None
    md5: str | None = None


def _hint(exc: BaseException) -> str:
    # refused credentials never get here: with_retries raises RemoteAccessError for them (exit 8)
    if isinstance(exc, FileNotFoundError):
        return "the bucket (or container) does not exist: check its name and the endpoint (AWS_ENDPOINT_URL)"
    return "check the URL, the credentials and the endpoint"


class SetUploader:
    """Lists, uploads and deletes the objects of one shard set at ``url``.

    ``progress``: show an upload bar (``None``: when stderr is a terminal).
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        policy: RetryPolicy | None = None,
        progress: bool | None = None,
    ) -> None:
        self.url = normalize_url(url)
        self.policy = policy
        self.progress = progress
        self.fs, path = open_filesystem(self.url, dict(storage_options or {}))
        self.path = str(path).rstrip("/")

    # -- calls ------------------------------------------------------------------------------------
    def call(self, fn: Callable[[], T], name: str, what: str) -> T:
        """``fn()`` (one call to the store about object ``name``), retried; a permanent failure as OutputError."""
        url = join_url(self.url, name) if name else self.url
        try:
            return with_retries(fn, url=url, what=what, policy=self.policy)
        except ShardloadError:
            raise
        except Exception as exc:
            raise OutputError(f"{url}: {what} failed ({type(exc).__name__}: {exc}); {_hint(exc)}") from exc

    def listing(self) -> dict[str, RemoteObject]:
        """Every object under the set's URL, by name relative to it (``shards/shard-000000.arrow``).

        An object named as the URL itself is listed as :data:`AT_URL`.
        """

        def find() -> dict[str, Any]:
            self.fs.invalidate_cache(self.path)
            return dict(self.fs.find(self.path, detail=True))

        found = self.call(find, "", "listing the objects")
        out = {}
        prefix = self.path + "/"
        for key, info in found.items():
            if not (key.startswith(prefix) or key.rstrip("/") == self.path) or info.get("type", "file") != "file":
                continue
            etag = str(info.get("ETag") or info.get("etag") or "").strip('"').lower()
            out[key[len(prefix) :] if key.startswith(prefix) else AT_URL] = RemoteObject(
                int(info.get("size") or 0), etag if _MD5.match(etag) else None
            )
        return out

    def read_manifest(self) -> bytes:
        """The bytes of the set's ``manifest.json``."""
        data = self.call(lambda: self.fs.cat_file(self._key(MANIFEST_NAME)), MANIFEST_NAME, "reading the manifest")
        return bytes(data)

    def put_many(self, files: list[tuple[str, Path]]) -> None:
        """Upload each ``(name, local file)`` of ``files`` as object ``name``, concurrently (one retried call)."""
        names = [name for name, _ in files]
        what = f"uploading {', '.join(Path(n).name for n in names)}"
        self.call(
            lambda: self.fs.put([str(p) for _, p in files], [self._key(n) for n in names], batch_size=len(files)),
            names[0],
            what,
        )

    def delete(self, name: str) -> None:
        """Delete object ``name`` (gone already is fine)."""

        def rm() -> None:
            with suppress(FileNotFoundError):
                self.fs.rm_file(self._key(name))

        self.call(rm, name, "deleting an object of the old set")

    def _key(self, name: str) -> str:
        return f"{self.path}/{name}"

    def check_objects(self, files: list[tuple[str, Path]], record: UploadRecord) -> None:
        """Compare the object of each ``(name, local file)`` with the file: there, its size, and its MD5 where the ETag is one.

        Raises:
            OutputError: naming the objects that differ (the manifest is not put: a rerun uploads them again).
        """
        objects = self.listing()
        wrong = []
        for name, path in files:
            remote, size = objects.get(name), path.stat().st_size
            if remote is None:
                wrong.append(f"{name} is not there")
            elif remote.size != size:
                wrong.append(f"{name} has {remote.size:,} bytes, the file {size:,}")
            elif remote.md5 is not None and remote.md5 != record.md5_of(name, path):
                wrong.append(f"{name} has MD5 {remote.md5}, the file {record.md5_of(name, path)}")
        if wrong:
            raise OutputError(
                f"{self.url}: after the upload, {len(wrong)} object(s) do not match their local files "
                f"({'; '.join(wrong[:3])}{'; ...' if len(wrong) > 3 else ''}). The manifest was not uploaded, so no "
                "reader opens the set: run the upload again (objects that differ are uploaded again)"
            )

    # -- checks -----------------------------------------------------------------------------------
    def check_target(
        self, objects: Mapping[str, RemoteObject], *, resume: bool, overwrite: bool, expected: Collection[str] = ()
    ) -> None:
        """Refuse a URL that holds a set or an unfinished upload (as the options say), or other objects.

        With ``resume`` a set there is accepted (an old one not yet replaced, or this run's own). ``expected``:
        names of the set being uploaded that :func:`is_owned` does not cover.

        Raises:
            OutputExistsError: naming the URL and the option that goes on.
        """
        if AT_URL in objects:
            raise OutputExistsError(
                f"{self.url} is an object itself ({objects[AT_URL].size:,} bytes), not a prefix: a shard set is "
                "the objects under a prefix, and some stores cannot put objects under an object's name. Choose "
                "another URL (or delete that object)."
            )
        if MANIFEST_NAME in objects:
            if not (overwrite or resume):
                raise OutputExistsError(
                    f"{self.url}: already holds a shard set. Pass --overwrite to replace it (its manifest is "
                    "deleted when the new upload starts), or choose another URL."
                )
            return
        others = sorted(n for n in objects if not is_owned(n) and n not in expected)
        if others:
            raise OutputExistsError(
                f"{self.url}: holds objects that are not a shard set ({', '.join(others[:5])}...); refusing to "
                "write among them. Choose an empty prefix."
            )
        if objects and not (resume or overwrite):
            raise OutputExistsError(
                f"{self.url}: holds the objects of an upload that did not finish (no {MANIFEST_NAME}): pass --resume "
                "to finish it, or --overwrite to start over."
            )

    # -- the upload -------------------------------------------------------------------------------
    def upload_set(
        self,
        local: Path,
        record: UploadRecord,
        *,
        files: list[tuple[str, Path]] | None = None,
        check: bool = False,
        unchanged: Callable[[], None] | None = None,
    ) -> int:
        """Upload the finished set in ``local``, ``manifest.json`` last; return the bytes uploaded.

        Objects that ``record`` names and the store holds whole are skipped; an old set's manifest
        (not this set's own) is deleted first, its other objects the new one lacks at the end.
        ``files``: the set's files as (object name, path), the manifest last (default: every file in
        ``local`` not hidden). ``check``: compare every object with its file before the manifest is put
        (:meth:`check_objects`), and the manifest read back with the local one after. ``unchanged``: called once
        every other object is put, before the manifest is (it raises if the local files changed meanwhile).

        Raises:
            OutputError: with ``check``, an object that does not match its file after its upload.
        """
        objects = self.listing()
        if MANIFEST_NAME in objects and self.read_manifest() != (local / MANIFEST_NAME).read_bytes():
            self.delete(MANIFEST_NAME)  # from here no reader opens the old set
            crash_point("upload:old-invalidated")
        files = files or _set_files(local)
        todo = [(name, path) for name, path in files if not record.has(name, path, objects.get(name))]
        total = sum(path.stat().st_size for _, path in todo)
        bar = Progress("upload", total=total, unit="bytes", enabled=self.progress, log=logger.name)
        shards = [t for t in todo if _is_shard(t[0])]
        rest = [t for t in todo if not _is_shard(t[0]) and t[0] != MANIFEST_NAME]
        # the manifest last, and always unless the store holds this very manifest (an upload of a finished set
        # run again): it makes the objects a set
        manifest = [[(MANIFEST_NAME, local / MANIFEST_NAME)]] if any(n == MANIFEST_NAME for n, _ in todo) else []
        uploaded = 0
        try:
            # Shards go UPLOAD_THREADS at a time, concurrently inside the filesystem's own event loop (one
            # call, retried whole); the rest one by one.
            batches = [shards[i : i + UPLOAD_THREADS] for i in range(0, len(shards), UPLOAD_THREADS)]
            for batch in [*batches, *([t] for t in rest), *manifest]:
                if unchanged is not None and batch[0][0] == MANIFEST_NAME:
                    unchanged()
                if check and batch[0][0] == MANIFEST_NAME:
                    self.check_objects([t for t in files if t[0] != MANIFEST_NAME], record)
                self.put_many(batch)
                for name, path in batch:
                    size = path.stat().st_size
                    record.add(name, size)
                    bar.update(0, size)
                    uploaded += size
                    if _is_shard(name):
                        crash_point(f"upload:{len(record.sizes)}")
        finally:
            bar.close()
        if unchanged is not None and not manifest:
            unchanged()
        if check:
            if not manifest:
                self.check_objects([t for t in files if t[0] != MANIFEST_NAME], record)
            if self.read_manifest() != (local / MANIFEST_NAME).read_bytes():
                raise OutputError(
                    f"{join_url(self.url, MANIFEST_NAME)}: reads back other bytes than {local / MANIFEST_NAME} just "
                    "after its upload; something else writes under this URL: stop it, then run the upload again"
                )
        new = {name for name, _ in files}
        for name in sorted(n for n in objects if is_owned(n) and n not in new):
            self.delete(name)
        return uploaded


def _is_shard(name: str) -> bool:
    """Whether object ``name`` is a shard (``shards/...``, or ``parts/K/shards/...`` of a merged set)."""
    return name.startswith("shards/") or "/shards/" in name


def _set_files(local: Path) -> list[tuple[str, Path]]:
    """The files of the set in ``local`` as (object name, path): shards in order, then the rest, manifest last."""
    files = []
    for path in sorted(local.rglob("*")):
        name = path.relative_to(local).as_posix()
        if path.is_file() and not any(part.startswith(".") for part in name.split("/")) and name != MANIFEST_NAME:
            files.append((name, path))
    return [*files, (MANIFEST_NAME, local / MANIFEST_NAME)]


class UploadRecord:
    """The objects an upload of one staged set has finished, kept beside the staging for a resume.

    A header line with the digest of the staged ``manifest.json`` (a record of another staged set
    counts as empty), then one ``name size`` line per finished object (a line cut by a kill is ignored).
    ``by_content``: an object whose ETag is the local file's MD5 counts as uploaded, recorded or not
    (:meth:`has`); ``uploaded`` lists the objects put by this run.
    """

    def __init__(self, path: Path, manifest: Path, *, fresh: bool = False, by_content: bool = False) -> None:
        self.path = path
        self.by_content = by_content
        self.uploaded: list[str] = []
        self._md5s: dict[str, str] = {}
        self.header = f"shardload-upload {hashlib.sha256(manifest.read_bytes()).hexdigest()}"
        self.sizes: dict[str, int] = {} if fresh else self._read()
        with open(self.path, "w", encoding="utf-8") as fh:
            fh.write(self.header + "\n" + "".join(f"{n} {s}\n" for n, s in self.sizes.items()))

    def _read(self) -> dict[str, int]:
        try:
            lines = self.path.read_text(encoding="utf-8").split("\n")
        except (OSError, ValueError):
            return {}
        if not lines or lines[0] != self.header:
            return {}
        sizes = {}
        for line in lines[1:-1]:  # the last one is "" after a whole line, or a line cut short
            name, _, size = line.rpartition(" ")
            if name and size.isdigit():
                sizes[name] = int(size)
        return sizes

    def has(self, name: str, local: Path, remote: RemoteObject | None) -> bool:
        """Whether object ``name`` was uploaded whole from ``local`` and is still there (no need to put it again).

        With ``by_content``, also an object that is not recorded but has the file's size and MD5 (as its ETag).
        """
        size = local.stat().st_size
        if remote is None or remote.size != size:
            return False
        if self.by_content and remote.md5 is not None:
            return remote.md5 == self.md5_of(name, local)
        if name == MANIFEST_NAME or self.sizes.get(name) != size:
            return False
        return remote.md5 is None or remote.md5 == self.md5_of(name, local)

    def md5_of(self, name: str, local: Path) -> str:
        """The MD5 of ``local``, the file of object ``name`` (read once per run)."""
        if name not in self._md5s:
            self._md5s[name] = _md5(local)
        return self._md5s[name]

    def add(self, name: str, size: int) -> None:
        """Record object ``name`` as uploaded whole."""
        self.sizes[name] = size
        self.uploaded.append(name)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(f"{name} {size}\n")
            fh.flush()
            os.fsync(fh.fileno())


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()
