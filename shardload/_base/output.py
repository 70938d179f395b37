"""Writing a directory safely: one writer at a time, atomic files, and the index written last.

Used by ``prepare`` (:class:`~shardload.prepare.workdir.WorkDir`) and ``export``
(:func:`~shardload.integrations.webdataset_export.to_webdataset`). The three rules, kept here once:

* **One writer**: :class:`OutputLock`, an ``flock`` that dies with its process and that no child keeps.
* **Whole files only**: :func:`atomic_file`; a reader sees the old file or the whole new one.
* **The index last**: a directory is complete exactly when its index file is there
  (:func:`withdraw_index` first, :func:`publish_index` last).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shardload.errors import OutputLockedError

__all__ = [
    "OutputLock",
    "atomic_file",
    "atomic_write_text",
    "fsync_dir",
    "fsync_file",
    "publish_index",
    "withdraw_index",
]

#: descriptors of the output locks this process holds, let go of by forked children (below)
_HELD_LOCKS: set[int] = set()


def _drop_inherited_locks() -> None:
    """In a forked child: let go of the parent's output locks (an ``flock`` lives while any copy of its fd does).

    The descriptor is pointed at ``/dev/null`` rather than closed, so its
    number is never reused while the copied file object still names it.
    """
    if not _HELD_LOCKS:
        return
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for fd in _HELD_LOCKS:
            os.dup2(devnull, fd, inheritable=False)
    finally:
        os.close(devnull)
    _HELD_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_locks)


class OutputLock:
    """An exclusive, non-blocking ``flock`` on the lock file ``path`` (created if needed) of an output directory.

    ``busy`` is the message of the :class:`~shardload.errors.OutputLockedError`
    raised when another process holds it.
    """

    def __init__(self, path: Path, *, busy: str) -> None:
        self.path = path
        self.busy = busy
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`~shardload.errors.OutputLockedError` (``OSError``: no lock file).

        The writer that held it may have removed the lock file (:meth:`release`),
        so the lock counts only once the locked file is the one at ``path``;
        otherwise two writers could each lock a file of their own.
        """
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise OutputLockedError(self.busy) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the writer that held it removed the file meanwhile: lock the new one
        self._fd = fd
        _HELD_LOCKS.add(fd)

    def release(self, *, remove: bool = True) -> None:
        """Let go of the lock; with ``remove``, delete the lock file first (while still holding it)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if remove:
                self.path.unlink(missing_ok=True)
        except OSError:
            pass  # best effort: a leftover lock file never blocks a later writer
        finally:
            _HELD_LOCKS.discard(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @staticmethod
    def held_by_another(path: Path) -> bool:
        """Whether another process holds the lock file ``path`` (looked at without creating it)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False  # no locking here (some network file systems): the check under the lock decides
        finally:
            os.close(fd)  # also lets go of the lock, if it was taken
        return False


@contextmanager
def atomic_file(path: Path, *, tmp: Path | None = None, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s new content to; on success it replaces ``path`` durably.

    If the block raises, the temporary file is removed and ``path`` is
    untouched. ``tmp`` (same directory) defaults to a hidden name holding the
    pid; a writer that resumes its own leftovers passes a fixed one, so a
    killed attempt's file is overwritten rather than left beside the new one.
    With ``durable=False`` nothing is fsynced: the replace is still atomic for
    every process, but only until the machine stops (for files whose readers
    check that it has not: prepare's staging, :mod:`shardload.prepare.bootmark`).
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}") if tmp is None else tmp
    try:
        yield tmp
        if durable:
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    """Write ``text`` to ``path`` (UTF-8) so that readers see the old file or the whole new one."""
    with atomic_file(path, durable=durable) as tmp:
        tmp.write_text(text, encoding="utf-8")


def fsync_file(path: Path) -> None:
    """Make the content of the file at ``path`` durable (whichever descriptor, or library, wrote it)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make the renames and removals inside ``directory`` durable (best effort where it cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def withdraw_index(index: Path) -> None:
    """The first step of replacing what a directory holds: its index goes, durably, before any old content."""
    index.unlink(missing_ok=True)
    fsync_dir(index.parent)


def publish_index(staged: Path, index: Path) -> None:
    """The last step: move the finished ``staged`` index (same file system) into place.

    Everything renamed into the directory before is made durable first, so
    after a crash the index never names a file that is not there.
    """
    fsync_file(staged)
    fsync_dir(index.parent)
    os.replace(staged, index)
    fsync_dir(index.parent)
