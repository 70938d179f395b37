"""Room and locks in the node cache of a remote set: which shards stay, and who may delete one.

The eviction and locking half of :class:`~shardload.remote.cache.RemoteSet` (docs/remote.md, "The
node cache"). A process that maps a shard holds a shared ``flock`` on it; eviction removes only a
file it can lock exclusively, so never one in use on the node. With a ``cache_limit``, room is made
and reserved (as the ``.part`` file) under ``.space.lock``, farthest next use first
(:mod:`shardload.remote.policy`); a reader that finds the room held by other readers goes past the
limit rather than wait for them (:meth:`CacheSpace._reserve`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from shardload.errors import ShardSetError
from shardload.formats.manifest import Manifest
from shardload.remote.options import RemoteOptions
from shardload.remote.policy import NEVER, choose_victims, next_uses
from shardload.remote.url import join_url

_POLL = 0.05  # seconds between two tries of a busy lock
#: in a mirror: the most bytes its cache held at once; present while the cache is past its limit
PEAK_NAME, OVER_NAME = ".peak", ".over-limit"

logger = logging.getLogger("shardload.remote")
_WARNED: set[tuple[int, str]] = set()  # (pid, mirror) that said the cache went past its limit


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def locked(path: Path, *, timeout: float, what: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if need be), waiting at most ``timeout`` seconds."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ShardSetError(
                        f"{what}: another process of this node has held {path} for more than {timeout:g} s. "
                        "If it is stuck, stop it; else raise RemoteOptions(wait_timeout=...)."
                    ) from None
                time.sleep(_POLL)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class CacheSpace:
    """The shard paths, room, eviction and published read orders of one set's mirror (a base of ``RemoteSet``)."""

    url: str
    options: RemoteOptions
    mirror: Path
    manifest: Manifest | None
    _sizes: NDArray[np.int64]
    _names: dict[tuple[str, str], int]  # (directory, file name) -> shard
    _reader: int  # with the pid, the name of this set's published read order

    # -- shards ----------------------------------------------------------------------------------------
    def _path(self, shard: int) -> Path:
        assert self.manifest is not None
        return self.mirror / self.manifest.shards[shard].file

    def shard_url(self, shard: int) -> str:
        assert self.manifest is not None
        return join_url(self.url, self.manifest.shards[shard].file)

    @staticmethod
    def _lock_shared(path: Path) -> int | None:
        """A descriptor of ``path`` holding a shared lock, or ``None`` if it is absent (or was just evicted)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_nlink == 0:  # evicted between open and lock
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            return None
        return fd

    # -- room in a bounded cache -------------------------------------------------------------------------
    def _reserve(self, shard: int, urgent: bool) -> Path | None:
        """Create shard ``shard``'s ``.part`` file once the cache has room for it (evicting if need be).

        A prefetch (not ``urgent``) gets room only within the limit, or ``None``. A reader always gets
        it: when evicting every shard no process holds does not make room, it waits only for the
        downloads already under way when it asked (they end, and may then be evicted), and once none
        is left it goes past the limit (:meth:`_went_past`). So the cache holds at most the limit, plus
        what the readers of the node hold at once when they hold more than the limit; and no set of
        readers waits on each other for room.
        """
        path = self._path(shard)
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        limit = self.options.limit
        if limit is None:
            part.touch()
            return part
        size = int(self._sizes[shard])
        deadline = time.monotonic() + self.options.wait_timeout
        awaited: NDArray[np.bool_] | None = None  # the downloads under way when this reader first found no room
        while True:
            with locked(self.mirror / ".space.lock", timeout=self.options.wait_timeout, what=f"caching {self.url}"):
                present, partial = self._scan()
                need = int(self._sizes[present | partial].sum()) + size - limit
                room = need <= 0 or self._evict(need, present, None if urgent else shard) >= need
                if urgent and not room:
                    awaited = partial if awaited is None else awaited & partial
                if room or (urgent and awaited is not None and not awaited.any()):
                    part.touch()  # counted as reserved by every process's scan from now on
                    used = int(self._sizes[present | partial].sum()) + size
                    self._record_peak(used)
                    if used > limit:
                        self._went_past(shard, used, limit)
                    return part
            if not urgent:
                return None
            if time.monotonic() > deadline:
                raise ShardSetError(
                    f"shard {shard} ({self.shard_url(shard)}): the cache {self.mirror} is full ({limit:,} bytes) "
                    f"and the downloads into it that shard {shard} waits for (other processes of this node, or "
                    f"this one's prefetch) did not end within {self.options.wait_timeout:g} s. If a process is "
                    "stuck, stop it; else raise RemoteOptions(wait_timeout=...) or cache_limit."
                )
            time.sleep(_POLL * 4)

    def _record_peak(self, used: int) -> None:
        """Keep in ``.peak`` the most bytes the cache held or reserved so far (the space lock held)."""
        peak = self.mirror / PEAK_NAME
        if used > self.peak_bytes():
            tmp = peak.with_name(f"{PEAK_NAME}.{os.getpid()}.tmp")
            tmp.write_text(str(used))
            os.replace(tmp, peak)

    def peak_bytes(self) -> int:
        """The most bytes of shards (cached or being downloaded) this set's cache held at once; 0 if unknown.

        Recorded only with a ``cache_limit``, by every process of the node, since the mirror was made.
        """
        try:
            return int((self.mirror / PEAK_NAME).read_text() or 0)
        except (OSError, ValueError):
            return 0

    def _went_past(self, shard: int, used: int, limit: int) -> None:
        """Mark the cache as past its limit (the space lock held) and say so, once per process and set."""
        (self.mirror / OVER_NAME).touch()  # releases trim the cache back while this exists
        key = (os.getpid(), str(self.mirror))
        if key in _WARNED:
            return
        _WARNED.add(key)
        logger.warning(
            "%s: the node cache %s went past cache_limit (%s bytes) to %s bytes for shard %d: the shards that "
            "the readers of this node hold at once (every process and loader worker reading this set) take "
            "more than the limit. Reading on; each shard past the limit is evicted once no reader holds it. "
            "To stay under the limit, raise cache_limit or read with fewer processes or workers on this node.",
            self.url,
            self.mirror,
            f"{limit:,}",
            f"{used:,}",
            shard,
        )

    def _trim_past_limit(self) -> None:
        """After a release: if the cache went past its limit, evict shards no process holds until it is back under."""
        limit = self.options.limit
        over = self.mirror / OVER_NAME
        if limit is None or not over.exists():
            return
        with locked(self.mirror / ".space.lock", timeout=self.options.wait_timeout, what=f"caching {self.url}"):
            present, partial = self._scan()
            need = int(self._sizes[present | partial].sum()) - limit
            if need <= 0 or self._evict(need, present, None) >= need:
                with contextlib.suppress(FileNotFoundError):
                    over.unlink()

    def _scan(self) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        """``(present, partial)`` per shard: its file is cached; a live process is downloading it."""
        n = len(self._sizes)
        present, partial = np.zeros(n, bool), np.zeros(n, bool)
        for directory in {d for d, _ in self._names}:
            try:
                entries = list(os.scandir(directory))
            except FileNotFoundError:
                continue
            for e in entries:
                k = self._names.get((directory, e.name))
                if k is not None:
                    present[k] = True
                elif e.name.startswith(".") and e.name.endswith(".part"):
                    name, _, pid = e.name[1:-5].rpartition(".")
                    k = self._names.get((directory, name))
                    if k is None or not pid.isdigit():
                        continue
                    if pid_alive(int(pid)):
                        partial[k] = True
                    else:  # left by a process that died mid-download
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(e.path)
        return present, partial

    def _evict(self, need: int, present: NDArray[np.bool_], before: int | None) -> int:
        """Remove cached shards not in use, farthest next use first, until ``need`` bytes are freed.

        ``before``: a shard being prefetched; only shards whose next use comes after its own may go.
        """
        next_use = self.next_use()
        pinned = np.zeros(len(self._sizes), bool)
        if before is not None:
            pinned |= next_use <= next_use[before]
        freed = 0
        while freed < need:
            victims = choose_victims(np.flatnonzero(present & ~pinned), self._sizes, next_use, need - freed, pinned)
            if not len(victims):
                break
            for v in victims:
                if self._remove_unused(int(v)):
                    freed += int(self._sizes[v])
                    present[v] = False
                else:
                    pinned[v] = True
                if freed >= need:
                    break
        return freed

    def _remove_unused(self, shard: int) -> bool:
        """Delete shard ``shard``'s file if no process holds it (non-blocking exclusive lock)."""
        path = self._path(shard)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        try:
            os.unlink(path)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        return True

    # -- every rank's read order, for the eviction rule ----------------------------------------------------
    @property
    def readers_dir(self) -> Path:
        return self.mirror / ".readers"

    def _published(self, suffix: str) -> Path:
        """This reader's file in ``.readers``: ``<pid>.<n>`` (two loaders of one set in a process: two files)."""
        return self.readers_dir / f"{os.getpid()}.{self._reader}{suffix}"

    def publish_sequence(self, sequence: NDArray[np.int64]) -> None:
        """Publish this process's shard read order for the epoch (and position 0)."""
        self.readers_dir.mkdir(exist_ok=True)
        path = self._published(".npy")
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            np.save(fh, np.asarray(sequence, dtype=np.int64))
        os.replace(tmp, path)
        self.publish_position(0)

    def publish_position(self, position: int) -> None:
        """Publish how far this process has read in its published order."""
        path = self._published(".pos")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(str(int(position)))
        os.replace(tmp, path)

    def unpublish(self) -> None:
        for suffix in (".npy", ".pos"):
            with contextlib.suppress(FileNotFoundError):
                self._published(suffix).unlink()

    def next_use(self) -> NDArray[np.int64]:
        """``(num_shards,)`` reads until each shard's next use, the nearest over every live reader; NEVER if none."""
        out = np.full(len(self._sizes), NEVER, dtype=np.int64)
        try:
            files = list(self.readers_dir.glob("*.npy"))
        except OSError:
            return out
        for f in files:
            pid = f.stem.split(".", 1)[0]
            if not pid.isdigit() or not pid_alive(int(pid)):
                for stale in (f, f.with_suffix(".pos")):
                    with contextlib.suppress(FileNotFoundError):
                        stale.unlink()
                continue
            try:
                seq = np.load(f, allow_pickle=False)  # written by another process of the node: data only
                pos = min(int(f.with_suffix(".pos").read_text() or 0), len(seq))
            except (OSError, ValueError):
                continue
            nu = next_uses(seq, pos, len(out))
            np.minimum(out, np.where(nu == NEVER, NEVER, nu - pos), out=out)
        return out
