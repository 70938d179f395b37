"""The node-local cache of a remote shard set: a local mirror that a plain ShardSet reads.

For a URL, ``ShardSet`` asks :meth:`RemoteSet.open` for a local directory and reads it exactly as a
local set (every check unchanged), calling :meth:`RemoteSet.acquire` before mapping a shard and
:meth:`RemoteSet.release` after closing it. Layout and rules: docs/remote.md, "The node cache".
Between the processes of a node, by ``fcntl.flock``: the manifest and lengths indexes are fetched
once per fingerprint, under ``.lock``; a shard once, under its ``.<name>.lock``, into a ``.part``
file renamed into place after its sha256 matched the manifest's (a partial download never has the
final name). Room, eviction and the locks of shards in use: :mod:`shardload.remote._space`. A cached copy that
fails a check later was damaged in the cache: :meth:`RemoteSet.refetch` replaces it. The metadata is checked at
each open against what the cache wrote, and anything else in the mirror is removed: :mod:`shardload.remote._mirror`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from shardload._base.checksum import file_checksum
from shardload._base.setfiles import (
    ENV_MAX_MANIFEST_BYTES,
    MAX_MANIFEST_BYTES,
    env_limit,
    reason_of,
    tagged,
)
from shardload.errors import CorruptShardError, ManifestError, ShardSetChangedError, ShardSetError
from shardload.formats.manifest import MANIFEST_NAME, Manifest, metadata_files
from shardload.formats.origin import ORDER_NAME, ORIGINS_NAME
from shardload.remote._mirror import (
    check_fetched_indexes,
    clear_way,
    current_mirror,
    install_mirror,
    shard_table_file,
    sound,
)
from shardload.remote._space import CacheSpace, locked
from shardload.remote.download import fetch_to
from shardload.remote.options import RemoteOptions
from shardload.remote.retry import with_retries
from shardload.remote.url import join_url, normalize_url, open_filesystem

__all__ = ["RemoteSet"]

logger = logging.getLogger("shardload.remote")

_READERS = itertools.count()  # tells apart the RemoteSets of one process in the published read orders


class RemoteSet(CacheSpace):
    """The node-local mirror of one remote shard set, shared by every process of the node.

    Picklable: a worker gets the URL and options and opens its own filesystem (s3fs event loops do
    not survive a fork); locks held by the process that pickled it stay with that process.
    """

    def __init__(self, url: str, options: RemoteOptions) -> None:
        self.url = normalize_url(url)
        self.options = options
        self.set_dir = options.directory / "sets" / hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.mirror = self.set_dir  # the fingerprint's directory, once open() ran
        self.manifest: Manifest | None = None
        self.stamp = ""  # what the server said of manifest.json when this set was opened
        self._fs: Any = None
        self._root = ""
        self._pid = os.getpid()
        self._held: dict[int, int] = {}  # shard -> descriptor holding a shared lock on its file
        self._sizes = np.zeros(0, np.int64)
        self._names: dict[tuple[str, str], int] = {}  # (directory, file name) -> shard
        self._reader = next(_READERS)  # with the pid, the name of this set's published read order

    # -- the filesystem, one per process ---------------------------------------------------------------
    def forget_inherited(self) -> None:
        """In a forked process: close, without unlocking, the lock descriptors inherited from the parent.

        ``flock`` locks belong to the open file: unlocking the copy would release the parent's lock.
        """
        if os.getpid() == self._pid:
            return
        held, self._pid, self._fs, self._held = self._held, os.getpid(), None, {}
        for fd in held.values():
            with contextlib.suppress(OSError):  # already closed in this process
                os.close(fd)

    def _filesystem(self) -> tuple[Any, str]:
        self.forget_inherited()
        if self._fs is None:
            opts = {"skip_instance_cache": True, **(self.options.storage_options or {})}
            self._fs, self._root = open_filesystem(self.url, opts)
        return self._fs, self._root.rstrip("/")

    def _call(self, what: str, rel: str, call: Any) -> Any:
        """``call(fs, remote_path)`` through :func:`with_retries`, naming the object's URL."""
        fs, root = self._filesystem()
        return with_retries(
            lambda: call(fs, f"{root}/{rel}"), url=join_url(self.url, rel), what=what, policy=self.options.policy
        )

    def _stamp(self) -> str:
        """What the server says of ``manifest.json`` (ETag, size, mtime): one ``info()`` call."""
        try:
            info = self._call("reading the manifest's metadata", MANIFEST_NAME, lambda fs, p: fs.info(p))
        except FileNotFoundError:
            raise ManifestError(
                f"{self.url} is not a shard set: it has no {MANIFEST_NAME} (or these credentials cannot see it)"
            ) from None
        etag = info.get("ETag") or info.get("etag") or ""
        mtime = info.get("LastModified") or info.get("Last-Modified") or info.get("mtime") or ""
        return json.dumps([str(etag), info.get("size"), str(mtime)])

    # -- open: manifest and lengths indexes, once per node -----------------------------------------------
    def open(self, *, full: bool = False) -> Path:
        """The local mirror holding this set's manifest and lengths indexes (fetched if new, changed or damaged).

        ``full``: hash every metadata file against the cache's record (``verify``), not only those whose ``stat``
        changed.
        """
        self.options.make_directory(self.set_dir)
        stamp = self.stamp = self._stamp()
        mirror, manifest, _ = current_mirror(self.set_dir, stamp, full=full)
        if mirror is None:
            with locked(self.set_dir / ".lock", timeout=self.options.wait_timeout, what=f"opening {self.url}"):
                # again under the lock: another process may have fetched or repaired it meanwhile
                mirror, manifest, damage = current_mirror(self.set_dir, stamp, full=full)
                if mirror is None:
                    if damage:
                        logger.warning(
                            "%s: the metadata of its copy in the node cache (%s) is damaged, downloading it again: %s",
                            self.url,
                            self.set_dir,
                            damage,
                        )
                    mirror = self._fetch_metadata(stamp)
                    manifest = Manifest.load(mirror)
        assert manifest is not None
        self._use(mirror, manifest)
        return mirror

    def _fetch_metadata(self, stamp: str) -> Path:
        """Fetch the manifest and the metadata files, check them, and install them in the mirror (``.lock`` held)."""
        limit = env_limit(ENV_MAX_MANIFEST_BYTES, MAX_MANIFEST_BYTES)
        # Under the lock no other process is here: any other .incoming.<pid> is a killed process's.
        for stale in self.set_dir.glob(".incoming.*"):
            shutil.rmtree(stale, ignore_errors=True)
        incoming = self.set_dir / f".incoming.{os.getpid()}"
        incoming.mkdir(exist_ok=True)
        try:

            def read(fs: Any, p: str) -> bytes:
                with fs.open(p, "rb", block_size=0) if self._is_http() else fs.open(p, "rb") as fh:
                    data: bytes = fh.read(limit + 1)
                return data

            raw = self._call("downloading the manifest", MANIFEST_NAME, read)
            if len(raw) > limit:
                raise ManifestError(
                    f"{join_url(self.url, MANIFEST_NAME)} is larger than {limit:,} bytes; raise "
                    f"{ENV_MAX_MANIFEST_BYTES} if the set is that large"
                )
            (incoming / MANIFEST_NAME).write_bytes(raw)
            try:
                table = shard_table_file(raw, join_url(self.url, MANIFEST_NAME))
                if table:  # format 3: the manifest is parsed with its shard table beside it
                    self._download_to(table, incoming / table, f"downloading {table}")
                manifest = Manifest.load(incoming)
            except ManifestError as exc:
                raise ManifestError(f"{join_url(self.url, MANIFEST_NAME)}: {exc}") from None
            for rel in metadata_files(manifest):
                if not (incoming / rel).is_file():
                    self._download_to(rel, incoming / rel, f"downloading {rel}")
            check_fetched_indexes(incoming, manifest, self.url)
            mirror = install_mirror(self.set_dir, incoming, manifest, stamp)
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
        return mirror

    def _is_http(self) -> bool:
        return self.url.split("://", 1)[0].lower() in ("http", "https")

    def _download_to(self, rel: str, dest: Path, what: str) -> None:
        """``rel`` of the set, whole, to ``dest`` through a ``.part`` file renamed into place.

        Raises:
            ShardSetError: storage has no such object (reason ``missing``).
        """
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        try:
            try:
                self._call(what, rel, lambda fs, p: fs.get_file(p, str(part)))
            except FileNotFoundError:
                raise tagged(
                    ShardSetError,
                    f"{join_url(self.url, rel)}: the manifest of {self.url} names {rel}, and storage has no such "
                    "object: the set is incomplete (objects deleted, or copied without it). Upload the set again "
                    "(shardload upload SET URL --force, or prepare -o URL --overwrite).",
                    "missing",
                ) from None
            os.replace(part, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()

    def _use(self, mirror: Path, manifest: Manifest) -> None:
        self.mirror = mirror
        self.manifest = manifest
        self._sizes = np.array([s.bytes for s in self.manifest.shards], dtype=np.int64)
        self._names = {}
        for k, s in enumerate(self.manifest.shards):
            p = mirror / s.file
            self._names[(str(p.parent), p.name)] = k
        limit = self.options.limit
        if limit is not None and len(self._sizes) and int(self._sizes.max()) > limit:
            big = int(np.argmax(self._sizes))
            raise ShardSetError(
                f"{self.url}: the cache limit ({limit:,} bytes) is smaller than shard {big} "
                f"({int(self._sizes[big]):,} bytes); a shard is cached whole: raise cache_limit "
                "(or $SHARDLOAD_CACHE_LIMIT) to at least the largest shard"
            )

    def fetch_origins(self, *, order: bool = False) -> None:
        """Download ``origins.arrow`` (and, with ``order``, ``origin.npy``) on first use; a set without one: none."""
        names = [ORIGINS_NAME, *([ORDER_NAME] if order else [])]
        if all((self.mirror / name).is_file() for name in names):
            return
        with locked(self.set_dir / ".lock", timeout=self.options.wait_timeout, what=f"opening {self.url}"):
            for name in names:
                if (self.mirror / name).is_file():
                    continue
                try:
                    self._download_to(name, self.mirror / name, f"downloading {name}")
                except ShardSetError as exc:
                    if reason_of(exc) != "missing":
                        raise

    def stored_size(self, shard: int) -> int | None:
        """The size of shard ``shard``'s object in storage (one ``info()``); -1 when storage gives none (HTTP
        without Content-Length); None when there is no such object."""
        rel = self._path(shard).relative_to(self.mirror).as_posix()
        try:
            info = self._call("reading a shard's metadata", rel, lambda fs, p: fs.info(p))
        except FileNotFoundError:
            return None
        return -1 if info.get("size") is None else int(info["size"])

    def cached(self, shard: int) -> bool:
        path = self._path(shard)
        return path.is_file() and not path.is_symlink()

    def _clear_foreign(self, shard: int) -> None:
        """Remove what the cache did not write where shard ``shard``'s file belongs (:func:`_mirror.clear_way`): a
        link, a directory where the shard belongs, a file where its folder belongs (cache damage, after which the
        shard is downloaded again). Nothing outside the mirror is removed, and no link is followed."""
        assert self.manifest is not None
        rel = self.manifest.shards[shard].file
        if sound(self.mirror, rel):
            return
        with locked(self.set_dir / ".lock", timeout=self.options.wait_timeout, what=f"opening {self.url}"):
            for entry in clear_way(self.mirror, rel):
                logger.warning(
                    "shard %d (%s): the node cache (%s) held %s in its place, not a file the cache wrote; removed it, "
                    "downloading the shard again",
                    shard,
                    self.shard_url(shard),
                    self.mirror,
                    entry,
                )

    def acquire(self, shard: int) -> Path:
        """Shard ``shard`` in the cache, checked, and held (shared lock) until :meth:`release`."""
        self.forget_inherited()
        path = self._path(shard)
        if shard in self._held:
            return path
        self._clear_foreign(shard)
        for _ in range(8):  # evicted between our download and our lock: fetch again
            fd = self._lock_shared(path)
            if fd is not None:
                self._held[shard] = fd
                return path
            if self.download(shard, urgent=True, hold=True) and shard in self._held:
                return path
        raise ShardSetError(
            f"shard {shard} ({self.shard_url(shard)}) was evicted from the cache {self.mirror} each time it was "
            "downloaded: the cache is too small for the processes reading it; raise cache_limit"
        )

    def refetch(self, shard: int, problem: BaseException) -> Path:
        """Shard ``shard``, held by this process, failed a check (``problem``): download it again and hold the new copy.

        A copy is renamed into the cache only after its sha256 matched the manifest's, so one that fails a check
        later was damaged in the cache (a disk fault, a stray write, a user's edit), not in storage. That very file
        is removed, by its identity and under the shard's download lock: a process that found the same damage
        first and fetched a good copy keeps it. A process that has the damaged file mapped keeps its mapping
        (``unlink`` leaves an open file intact, and :meth:`_lock_shared` refuses an unlinked one), so this needs
        no exclusive lock.

        Raises:
            CorruptShardError: the new download does not match the manifest (the object in storage is damaged),
                or is missing from storage.
        """
        self.forget_inherited()
        path = self._path(shard)
        fd = self._held.get(shard)
        try:
            bad = os.fstat(fd) if fd is not None else os.stat(path)
        except OSError:
            bad = None
        self.release(shard)
        logger.warning(
            "shard %d (%s): its copy in the node cache (%s) is damaged, downloading it again: %s",
            shard,
            self.shard_url(shard),
            path,
            diagnosis(problem),
        )
        if bad is not None:
            lock = path.parent / f".{path.name}.lock"
            what = f"shard {shard} ({self.shard_url(shard)})"
            with locked(lock, timeout=self.options.wait_timeout, what=what), contextlib.suppress(FileNotFoundError):
                now = os.stat(path)
                if (now.st_dev, now.st_ino) == (bad.st_dev, bad.st_ino):
                    os.unlink(path)
        return self.acquire(shard)

    def damaged_in_storage(self, shard: int, problem: BaseException) -> ShardSetError:
        """The error for shard ``shard`` when a fresh copy, matching the manifest's sha256, fails a check too."""
        return tagged(
            CorruptShardError,
            f"shard {shard} ({self.shard_url(shard)}) is damaged in storage: its copy in the node cache failed "
            f"the check on first open, and so does a fresh download, which matches the manifest's size and sha256 "
            f"(the manifest was written for, or edited to agree with, the damaged object): {diagnosis(problem)}. Run "
            f"`shardload verify {self.url}`, and upload the set again (shardload upload SET URL).",
            reason_of(problem),
        )

    def release(self, shard: int) -> None:
        """Drop this process's hold on shard ``shard``: the cache may evict it now."""
        self.forget_inherited()
        fd = self._held.pop(shard, None)
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            self._trim_past_limit()

    def download(self, shard: int, *, urgent: bool, hold: bool = False) -> bool:
        """Make sure shard ``shard`` is in the cache; ``False`` if a prefetch found no room or it is busy.

        ``urgent`` (a reader needs it now): wait up to ``wait_timeout`` for another process's download
        and for room. Else (prefetch): skip a busy shard, evict only shards needed later than this one.
        ``hold``: a shard this call downloads is held (as :meth:`acquire` holds it) from before it has its
        name, so that no eviction takes it between the download and the reader.
        """
        path = self._path(shard)
        self._clear_foreign(shard)
        if self.cached(shard):
            return True
        lock = path.parent / f".{path.name}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        timeout = self.options.wait_timeout if urgent else 0.0
        try:
            with locked(lock, timeout=timeout, what=f"shard {shard} ({self.shard_url(shard)})"):
                if self.cached(shard):  # another process downloaded it while we waited
                    return True
                for stale in path.parent.glob(f".{path.name}.*.part"):  # left by a process killed mid-download
                    with contextlib.suppress(FileNotFoundError):
                        stale.unlink()  # only the holder of this shard's lock writes its .part file
                part = self._reserve(shard, urgent)
                if part is None:
                    return False
                fd = self._lock_shared(part) if hold else None  # the lock stays with the file through the rename
                try:
                    self._fetch_checked(shard, part, path)
                    if fd is not None and _same_file(fd, path):
                        self._held[shard], fd = fd, None
                finally:
                    if fd is not None:
                        os.close(fd)
                    with contextlib.suppress(FileNotFoundError):
                        part.unlink()
        except ShardSetError:
            if urgent:
                raise
            return False
        return True

    def _fetch_checked(self, shard: int, part: Path, path: Path) -> None:
        """Download into ``part``, compare size and sha256 with the manifest (one more try), rename to ``path``.

        The check here decides; a mismatch is downloaded again whole, asking for no range (ranges that
        were answered wrongly are not trusted twice).
        """
        assert self.manifest is not None
        info, url = self.manifest.shards[shard], self.shard_url(shard)
        found, size = "", 0
        fs, root = self._filesystem()
        for second in (False, True):  # the second download starts again from byte 0, and asks for no range
            try:
                fetch_to(
                    fs,
                    f"{root}/{info.file}",
                    part,
                    info.bytes,
                    url=url,
                    what=f"downloading shard {shard}",
                    policy=self.options.policy,
                    ranges=not second,
                )
            except FileNotFoundError:
                self._check_stamp(shard, url)
                raise tagged(
                    CorruptShardError,
                    f"shard {shard} ({url}) is missing from storage though the manifest names it: run "
                    f"`shardload verify {self.url}`, and upload the set again (shardload upload SET URL).",
                    "missing",
                ) from None
            size = part.stat().st_size
            found = file_checksum(part) if size == info.bytes else f"{size} bytes"
            if found == info.checksum:
                os.replace(part, path)
                with open(self.mirror / ".downloads", "a") as log:
                    log.write(f"{shard} {os.getpid()} {info.bytes}\n")
                return
        self._check_stamp(shard, url)
        hashed = found.startswith("sha256:")
        want = info.checksum if hashed else f"{info.bytes} bytes"
        raise tagged(
            CorruptShardError,
            f"shard {shard} ({url}) does not match the manifest, twice: it is {found}, the manifest says {want}. "
            f"The object in storage is damaged or was replaced: run `shardload verify {self.url}`, and upload "
            "the set again (shardload upload SET URL, or prepare -o URL).",
            "checksum_mismatch" if hashed else "truncated" if size < info.bytes else "size_mismatch",
        )

    def _changed(self) -> bool:
        """One HEAD of ``manifest.json``: whether it is no longer the one this set was opened from."""
        try:
            return self._stamp() != self.stamp
        except ManifestError:  # the manifest itself is gone: a prepare is rewriting the set
            return True

    def _check_stamp(self, shard: int, url: str) -> None:
        """Raise :class:`ShardSetChangedError` if the remote manifest changed since this set was opened."""
        if self._changed():
            raise ShardSetChangedError(
                f"{self.url} was re-prepared since it was opened: shard {shard} ({url}) no longer matches the "
                "manifest this job read. Restart the job once prepare has finished."
            )

    def check_unchanged(self) -> None:
        """Raise :class:`ShardSetChangedError` if the set was re-prepared since it was opened (one HEAD).

        Called at the start of every pass: a job whose shards are all cached would otherwise read the
        old set's copies without a word.
        """
        if self._changed():
            raise ShardSetChangedError(
                f"{self.url} was re-prepared since this job opened it (its manifest.json changed on the server); "
                "the cached shards are the old set's. Restart the job once prepare has finished."
            )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"] = None  # each process opens its own filesystem
        state["_held"] = {}  # locks stay with the process that took them
        state["_pid"] = -1
        return state


def diagnosis(problem: BaseException | str) -> str:
    """What a check found wrong with a shard, without the advice that follows it (made for a local set).

    The advice of every shard check names ``shardload verify``; it starts the sentence or clause cut here.
    """
    text = str(problem)
    at = text.find("shardload verify")
    if at < 0:
        return text
    end = max(text.rfind(". ", 0, at), text.rfind("; ", 0, at))
    return text[:end] if end > 0 else text


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` names the file open as ``fd``."""
    try:
        return os.path.samestat(os.fstat(fd), path.stat())
    except FileNotFoundError:
        return False
