"""Putting a finished local shard set into object storage (``shardload upload SET URL``).

Beside the flow, after ``prepare`` into a local directory: the set is verified first (every byte, as
``shardload verify`` checks it), then uploaded by :class:`~shardload.remote.upload.SetUploader`, the
storage layer ``prepare -o URL`` uploads with: shards first, ``manifest.json`` last, each object compared
with its file before the manifest is put. Run again, it uploads only what is missing or differs. The rules
(what is skipped, what is refused, where the record of an upload lives): docs/remote.md, "Uploading a set".
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shardload._base.checks import check_bool, check_scalar
from shardload._base.output import OutputLock
from shardload._base.redact import redact
from shardload.errors import InputError, OutputError, OutputExistsError, ShardSetError
from shardload.formats.manifest import MANIFEST_NAME, Manifest, metadata_files
from shardload.formats.origin import ORDER_NAME, ORIGINS_NAME
from shardload.remote.options import RemoteOptions
from shardload.remote.retry import RetryPolicy
from shardload.remote.upload import SetUploader, UploadRecord
from shardload.remote.url import is_remote, local_path, normalize_url
from shardload.sets.verify import verify

__all__ = ["UploadResult", "set_files", "upload_set"]

#: how many of a damaged set's problems the refusal quotes
_QUOTED = 3


@dataclass(frozen=True)
class UploadResult:
    """The outcome of :func:`upload_set`.

    Attributes:
        path: the local shard set.
        url: where it is now (as shardload spells the URL, credentials masked).
        shards: shards of the set.
        samples: samples of the set.
        objects: objects of the set in storage (shards, indexes, origins, the manifest).
        bytes: their bytes.
        uploaded_objects: objects this run put (the others were there already, identical).
        uploaded_bytes: their bytes.
        replaced: whether another set was at the URL and was replaced (``force``).
        seconds: wall time, the verification of the local set included.
    """

    path: str
    url: str
    shards: int
    samples: int
    objects: int
    bytes: int
    uploaded_objects: int
    uploaded_bytes: int
    replaced: bool
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON object (``shardload upload --json``)."""
        return {**asdict(self), "seconds": round(self.seconds, 3)}


def upload_set(
    path: str | os.PathLike[str],
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    force: bool = False,
    workers: int = 1,
    progress: bool | None = None,
    retry: RetryPolicy | None = None,
) -> UploadResult:
    """Upload the finished shard set in ``path`` to ``url`` (``s3://``, ``gs://``, ``az://``), manifest last.

    In order: the URL is listed (a refused credential, a missing bucket or another set there stops it at
    once); the local set is verified as :func:`~shardload.sets.verify.verify` does (a damaged set is refused
    before anything is uploaded); the objects that are not in storage, or differ from their file, are put;
    every object is compared with its file (size, and MD5 where the store's ETag is one); ``manifest.json``
    is put last and read back. A run stopped midway (killed, or failing after every retry) is finished by
    running it again. ``shardload verify URL`` then checks every byte, and the set loads as the local one.

    Args:
        path: a shard set directory (or ``file://`` URL).
        url: where to put it; its own prefix (an empty one, an unfinished upload, or this very set).
        storage_options: fsspec's options (credentials, ``client_kwargs={"endpoint_url": ...}``); default: the
            environment (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...).
        force: replace another shard set at ``url`` (its manifest is deleted first, its objects this set
            lacks after the new manifest is in place).
        workers: shards verified in parallel (threads).
        progress: bars for the verification and the upload; ``None``: when stderr is a terminal.
        retry: the retry policy of every call to the store (default ``RetryPolicy()``).

    Raises:
        ShardSetError: ``path`` is not a shard set, is a URL, or is damaged (its problems named).
        OutputError: ``url`` is a local path, an HTTP(S) URL (read-only), a bucket that does not exist, or
            an object not matching its file after its upload.
        OutputExistsError: ``url`` holds another shard set (without ``force``), objects that are not a
            set's, or is an object itself.
        OutputLockedError: another upload to ``url`` runs on this machine.
        RemoteError: a call kept failing after every retry (run it again to go on), or the URL is of a form
            shardload does not take; ``RemoteAccessError``: the credentials were refused.

    >>> upload_set("out/", "s3://bucket/sets/train")   # doctest: +SKIP
    UploadResult(path='out', url='s3://bucket/sets/train', shards=7, ..., uploaded_objects=10, ...)
    """
    started = time.perf_counter()
    force = check_bool("force", force)
    workers = check_scalar("workers", workers, low=1, high=1024, error=InputError)
    if progress is not None:
        progress = check_bool("progress", progress)
    root = _local_set(path)
    url = _writable_url(url, root)
    manifest = Manifest.load(root)  # ManifestError (exit 5): "is not a shard set", with why
    files = set_files(root, manifest)
    uploader = SetUploader(url, storage_options=storage_options, policy=retry, progress=progress)
    objects = uploader.listing()  # credentials, bucket, endpoint: found before the long verification
    replaced = False
    if MANIFEST_NAME in objects and uploader.read_manifest() != (root / MANIFEST_NAME).read_bytes():
        if not force:
            raise OutputExistsError(
                f"{url}: already holds another shard set (its manifest.json is not {root / MANIFEST_NAME}). Pass "
                "--force (force=True) to replace it (its manifest is deleted when the upload starts), or choose "
                "another URL."
            )
        replaced = True
    uploader.check_target(objects, resume=True, overwrite=force, expected={name for name, _ in files})
    # The cache directory and the lock before the verification, which takes as long as reading the set: a bad
    # $SHARDLOAD_CACHE_DIR or a second upload to this URL is said at once.
    record_dir = _record_dir(url)
    lock = OutputLock(
        record_dir / ".lock",
        busy=f"{url}: another upload to this URL runs on this machine right now ({record_dir}); wait for it",
    )
    lock.acquire()
    try:
        before = _identities(files)  # taken before the verification: what is put is what was verified
        _refuse_damaged(root, workers, progress)
        # A record of this set's objects put to this URL (what a rerun skips where the store's ETag is no MD5:
        # multipart uploads); started afresh when another set is replaced, whose objects it cannot vouch for.
        record = UploadRecord(record_dir / "uploaded.log", root / MANIFEST_NAME, fresh=replaced, by_content=True)
        try:
            uploaded = uploader.upload_set(
                root, record, files=files, check=True, unchanged=lambda: _check_unchanged(root, url, files, before)
            )
        except FileNotFoundError:  # a local file removed while it was uploaded: said as the change it is
            _check_unchanged(root, url, files, before)
            raise
    finally:
        lock.release(remove=False)
    return UploadResult(
        path=str(root),
        url=redact(url),
        shards=len(manifest.shards),
        samples=manifest.total_samples,
        objects=len(files),
        bytes=sum(p.stat().st_size for _, p in files),
        uploaded_objects=len(record.uploaded),
        uploaded_bytes=uploaded,
        replaced=replaced,
        seconds=time.perf_counter() - started,
    )


def set_files(root: Path, manifest: Manifest) -> list[tuple[str, Path]]:
    """The files of the set in ``root`` as (object name, path): the shards in order, the indexes, the origins,
    ``manifest.json`` last. Only what a reader of the set opens: other files in the directory stay behind."""
    names = [info.file for info in manifest.shards]
    names += metadata_files(manifest)
    names += [name for name in (ORIGINS_NAME, ORDER_NAME) if (root / name).is_file()]
    return [*((name, root / name) for name in dict.fromkeys(names)), (MANIFEST_NAME, root / MANIFEST_NAME)]


def _local_set(path: str | os.PathLike[str]) -> Path:
    """The local directory ``path`` names, refusing a URL."""
    if is_remote(path):
        raise ShardSetError(
            f"{redact(os.fspath(path))}: is a URL; shardload upload copies a shard set on this machine's disk into "
            "object storage. Give the set's directory (the -o of prepare); a set in storage is copied with the "
            "store's own tools (aws s3 sync, gsutil rsync), then checked with `shardload verify URL`"
        )
    root = Path(local_path(path))
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise ShardSetError(f"{root}: {what}; give the directory of a shard set (the -o of shardload prepare)")
    return root


def _writable_url(url: str, root: Path) -> str:
    """``url`` as shardload spells it, refusing a local path and the read-only HTTP(S)."""
    if not is_remote(url):  # RemoteError for a malformed URL
        raise OutputError(
            f"{url}: is a local path, not a URL: shardload upload puts a set into object storage (s3://BUCKET/PREFIX, "
            f"gs://, az://). To copy a set on disk, copy its directory (cp -r {root} {url}), then check the copy with "
            "`shardload verify`"
        )
    url = normalize_url(url)
    if url.startswith(("http://", "https://")):
        raise OutputError(
            f"{redact(url)}: shardload reads sets over HTTP(S) but cannot write them: upload to the storage behind the "
            "server (s3://, gs://, az://), or copy the set's files to where the server serves them"
        )
    return url


def _refuse_damaged(root: Path, workers: int, progress: bool | None) -> None:
    """Verify the set in ``root`` (every byte) and refuse it, naming its problems, if anything is wrong.

    Raises:
        ShardSetError: the set is damaged; nothing has been uploaded.
    """
    report = verify(root, workers=workers, progress=progress)
    if report.ok:
        return
    quoted = "; ".join(str(p) for p in report.problems[:_QUOTED])
    more = f"; and {len(report.problems) - _QUOTED} more" if len(report.problems) > _QUOTED else ""
    raise ShardSetError(
        f"{root}: is damaged, nothing was uploaded: {len(report.problems)} problem(s) ({quoted}{more}). Run "
        f"`shardload verify {root}` for the list, and prepare the set again (with --overwrite)"
    )


def _identities(files: list[tuple[str, Path]]) -> list[tuple[int, int, int, int] | None]:
    """Each file's (device, inode, size, mtime), the manifest's included, or None when it is gone: a file
    replaced (a ``prepare --overwrite`` commits by renames) or rewritten in place changes it."""
    out: list[tuple[int, int, int, int] | None] = []
    for _, path in files:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return out


def _check_unchanged(root: Path, url: str, files: list[tuple[str, Path]], before: object) -> None:
    """Refuse to make the objects put a set when the local set changed since it was verified.

    Raises:
        OutputError: a file of the set was replaced, changed or removed (a prepare into the directory meanwhile).
    """
    if _identities(files) == before:
        return
    raise OutputError(
        f"{root}: changed while it was uploaded (its files are not those verified when the upload started: a "
        f"prepare --overwrite into it meanwhile?), so {redact(url)}/manifest.json was not put and no reader opens "
        "the objects put as a set. Let whatever writes the directory finish, then run the upload again"
    )


def _record_dir(url: str) -> Path:
    """Where uploads to ``url`` from this machine keep their record and lock: ``<cache dir>/uploads/<sha256(url)[:16]>``.

    Raises:
        InputError: the node cache directory (``$SHARDLOAD_CACHE_DIR``, ...) is a file or cannot be written.
    """
    cache = RemoteOptions()  # the node cache's own settings, and its check of them
    path = cache.directory / "uploads" / hashlib.sha256(url.encode()).hexdigest()[:16]
    cache.make_directory(path)
    return path
