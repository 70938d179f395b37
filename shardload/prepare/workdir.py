"""The output directory of a prepare run: lock, resumable state, atomic commit.

Layout while a run is in progress::

    OUT/.prepare.lock        flock'd by the running prepare (freed by the kernel on kill -9; never
                             inherited: forked children let go of it, exec'd ones never get it)
    OUT/.prepare/state.json  options + units + schema, to check that --resume continues the same run
    OUT/.prepare/staging/    intermediate chunks, one group per source unit, each renamed when complete
    OUT/.prepare/shards/     finished shards, each renamed into place when complete
    OUT/.prepare/done/       one small JSON per finished shard (size, checksum), written after its rename
    OUT/.prepare/COMMIT      present once the old set (if any) has been removed and the new one is moving in

``manifest.json`` is moved into ``OUT`` last, so a directory is a valid shard
set exactly when it has one, and an interrupted run never looks complete.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from shardload.errors import OutputError, OutputExistsError, OutputLockedError
from shardload.manifest import MANIFEST_NAME, atomic_write_text, fsync_dir
from shardload.prepare.faults import crash_point

WORK = ".prepare"
LOCK = ".prepare.lock"
#: the names a shard set owns inside OUT (removed when it is overwritten)
OWNED = ("shards", "origin.npy")

#: fds of the output locks this process holds, let go of by forked children (below)
_HELD_LOCKS: set[int] = set()


def _drop_inherited_locks() -> None:
    """In a forked child: let go of the parent's output locks.

    An ``flock`` lives as long as any descriptor of its open file, and a forked
    child (a pool worker, or any process a user's code forks) shares the
    parent's: a child that outlived its parent would hold the lock for ever, and
    every ``--resume`` would be refused. The descriptor is pointed at
    ``/dev/null`` rather than closed, so its number is never reused while the
    copied file object still names it.
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


class WorkDir:
    """Owns ``OUT`` for the duration of one prepare run (use as a context manager)."""

    def __init__(self, out: str | os.PathLike[str], *, resume: bool, overwrite: bool) -> None:
        self.out = Path(out)
        self.resume = resume
        self.overwrite = overwrite
        self.work = self.out / WORK
        self._lock: TextIO | None = None

    # -- paths ------------------------------------------------------------------------------------
    @property
    def staging(self) -> Path:
        return self.work / "staging"

    @property
    def shards(self) -> Path:
        return self.work / "shards"

    @property
    def done(self) -> Path:
        return self.work / "done"

    # -- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> WorkDir:
        out = self.out
        if out.exists() and not out.is_dir():
            raise OutputError(f"{out} exists and is not a directory; choose another output path")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{out}: cannot create the output directory ({exc.strerror}). {_hint(exc)}") from None
        try:
            self._lock = open(out / LOCK, "a+")
        except OSError as exc:
            raise OutputError(f"{out}: cannot write into the output directory ({exc.strerror}). {_hint(exc)}") from None
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise OutputLockedError(
                f"{out}: another prepare is writing into this directory right now; wait for it to finish "
                "or choose another output"
            ) from None
        # Python opens files non-inheritable (O_CLOEXEC): exec'd children never get the lock.
        _HELD_LOCKS.add(self._lock.fileno())
        try:
            with output_errors(out, "preparing the output directory"):
                self._check_existing()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            _HELD_LOCKS.discard(self._lock.fileno())
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    @staticmethod
    def was_committing(out: str | os.PathLike[str]) -> bool:
        """Whether a run into ``out`` was killed during its commit (checked before taking the lock)."""
        return (Path(out) / WORK / "COMMIT").exists()

    def _check_existing(self) -> None:
        out = self.out
        has_set = (out / MANIFEST_NAME).exists()
        if self.work.exists() and not _holds_work(self.work):
            # A run refused or killed before it staged anything: nothing to resume, nothing to lose.
            shutil.rmtree(self.work)
        interrupted = self.work.exists()
        others = [p.name for p in out.iterdir() if p.name not in (LOCK, WORK, MANIFEST_NAME)]
        if interrupted and not (self.resume or self.overwrite):
            raise OutputExistsError(
                f"{out}: an earlier prepare into this directory was interrupted. Rerun with --resume to finish "
                "it, or with --overwrite to start over."
            )
        if has_set and not (self.overwrite or (self.resume and interrupted)):
            raise OutputExistsError(
                f"{out}: already holds a shard set. Pass --overwrite to replace it (the old set stays intact "
                "until the new one is complete), or choose another output."
            )
        if not has_set and not interrupted and others and not _looks_like_owned(others):
            raise OutputExistsError(
                f"{out}: the directory is not empty and is not a shard set ({', '.join(sorted(others)[:5])}"
                "...); refusing to write into it. Choose an empty or new directory."
            )
        if self.overwrite and interrupted:
            shutil.rmtree(self.work)
        # With resume and nothing interrupted, this simply starts afresh: --resume is safe to pass always.
        for d in (self.work, self.staging, self.shards, self.done):
            d.mkdir(parents=True, exist_ok=True)

    # -- resumable state --------------------------------------------------------------------------
    def check_state(self, state: dict[str, Any]) -> None:
        """Record the run's identity, or check that a resumed run is the same run."""
        path = self.work / "state.json"
        if path.exists():
            old = json.loads(path.read_text())
            if old != json.loads(json.dumps(state)):
                diff = sorted(k for k in set(old) | set(state) if old.get(k) != json.loads(json.dumps(state)).get(k))
                raise OutputError(
                    f"{self.out}: the interrupted prepare used different sources or options ({', '.join(diff)} "
                    "differ); rerun it exactly as before with --resume, or use --overwrite to start over"
                )
        else:
            atomic_write_text(path, json.dumps(state, indent=1, sort_keys=True))

    # -- commit -----------------------------------------------------------------------------------
    def commit(self, files: list[str]) -> None:
        """Replace any old set by the new one; ``manifest.json`` goes last.

        ``files`` are names inside the work dir (besides ``shards/``) to move
        into ``OUT``, e.g. the lengths index. Idempotent: an interrupted commit
        is finished by calling it again.
        """
        marker = self.work / "COMMIT"
        if not marker.exists():
            # The old set stops being valid before any of its parts is removed.
            (self.out / MANIFEST_NAME).unlink(missing_ok=True)
            fsync_dir(self.out)
            crash_point("commit:old-invalidated")
            for name in OWNED:
                _remove(self.out / name)
            for p in self.out.glob("lengths*.npy"):
                p.unlink()
            atomic_write_text(marker, "committing\n")
        if self.shards.exists():
            _remove(self.out / "shards")
            os.replace(self.shards, self.out / "shards")
            crash_point("commit:shards-moved")
        for name in files:
            src = self.work / name
            if src.exists():
                os.replace(src, self.out / name)
        manifest = self.work / MANIFEST_NAME
        if manifest.exists():
            fsync_dir(self.out)
            crash_point("commit:before-manifest")
            os.replace(manifest, self.out / MANIFEST_NAME)
            fsync_dir(self.out)
            crash_point("commit:manifest-moved")
        shutil.rmtree(self.work, ignore_errors=True)
        (self.out / LOCK).unlink(missing_ok=True)

    @property
    def committing(self) -> bool:
        return (self.work / "COMMIT").exists()


@contextmanager
def output_errors(out: Path, what: str, *, partial: Path | None = None) -> Iterator[None]:
    """Turn an ``OSError`` while writing into ``out`` into an :class:`OutputError` that says what to do.

    Args:
        out: the output directory (named in the message).
        what: the step that failed, e.g. ``"writing shard 3"``.
        partial: a half-written file to remove on failure (or a directory whose
            ``*.tmp`` files are removed), so a full disk gets its space back.
    """
    try:
        yield
    except OutputError:
        raise
    except OSError as exc:
        if partial is not None:
            for tmp in partial.glob("*.tmp") if partial.is_dir() else [partial]:
                tmp.unlink(missing_ok=True)
        where = f" ({exc.filename})" if exc.filename else ""
        raise OutputError(
            f"{out}: {what} failed: {exc.strerror or exc}{where}. {_hint(exc)} Nothing in {out} looks like a "
            "complete shard set until a run finishes."
        ) from None


def _hint(exc: OSError) -> str:
    """What to do about an OSError while writing the output."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "The disk is full: free some space, then rerun with --resume to continue where it stopped."
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "The output directory is not writable: fix its permissions or choose another output."
    return "Fix the cause, then rerun with --resume to continue where it stopped."


def _holds_work(work: Path) -> bool:
    """Whether a work dir holds anything a resume would reuse (staged samples, shards, a commit)."""
    if (work / "COMMIT").exists():
        return True
    return any(any((work / d).iterdir()) for d in ("staging", "shards", "done") if (work / d).is_dir())


def _looks_like_owned(names: list[str]) -> bool:
    return all(n in OWNED or (n.startswith("lengths") and n.endswith(".npy")) for n in names)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
