"""The output directory of a prepare run: lock, resumable state, atomic commit.

Layout while a run is in progress::

    OUT/.prepare.lock        flock'd by the running prepare (an OutputLock: freed by the kernel on kill -9,
                             never held by a child process)
    OUT/.prepare/state.json  options + units + schema, to check that --resume continues the same run
    OUT/.prepare/staging/    intermediate chunks, one group per source unit, each renamed when complete
    OUT/.prepare/shards/     finished shards, each renamed into place when complete
    OUT/.prepare/done/       one small JSON per finished shard (size, checksum), written after its rename
    OUT/.prepare/COMMIT      present once the old set (if any) has been removed and the new one is moving in
    OUT/.prepare/OLD_PARTS   present when the set being replaced was merged from parts: OUT/parts/ goes with it
    OUT/.prepare/FAILED      the message of the bad input the run stopped on, if it did (after staging some)
    OUT/.prepare.done/       the work dir once the set is committed, until removed (a stop then: the next run's)

``manifest.json`` is moved into ``OUT`` last, so a directory is a valid shard
set exactly when it has one, and an interrupted run never looks complete (the
lock, the atomic writes and the index-last commit are the rules of
:mod:`shardload._base.output`, shared with ``export``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shardload._base.faults import crash_point
from shardload._base.output import OutputLock, atomic_write_text, fsync_dir, publish_index, withdraw_index
from shardload.errors import InputError, OutputError, OutputExistsError, OutputLockedError
from shardload.formats.manifest import MANIFEST_NAME
from shardload.formats.shardtable import SHARD_TABLE_NAME
from shardload.prepare.bootmark import MARK as STAGING_MARK
from shardload.prepare.bootmark import mark_staging
from shardload.prepare.mapconfig import map_files_change

WORK = ".prepare"
LOCK = ".prepare.lock"
#: the work dir of a finished run, renamed before it is removed (removed again by the next run if a stop left it)
RETIRED = ".prepare.done"
#: in the work dir: the message of the bad input a run stopped on (for the next run's and open's message)
FAILED = "FAILED"
#: the folder of OUT that holds the parts of ``prepare --part`` (:mod:`shardload.prepare.parts`)
PARTS_DIR = "parts"
#: the names a shard set owns inside OUT (removed when it is overwritten)
OWNED = ("shards", "origin.npy", "origins.arrow", SHARD_TABLE_NAME)
#: in the work dir: present when the set being replaced was merged from parts (its ``parts/`` go with it)
OLD_PARTS = "OLD_PARTS"

#: outputs whose set a run of this process committed (see WorkDir.committed)
_COMMITTED: set[str] = set()


class WorkDir:
    """Owns ``OUT`` for the duration of one prepare run (use as a context manager).

    The checks that can refuse the run pass before anything is created (and again under the lock).
    A run that ends with no work dir removes the lock file, and ``OUT`` if it created it and it is
    empty: a refused run leaves no trace. A failed run keeps its work dir for ``--resume``, with the
    bad input it stopped on, if any, in ``FAILED``.
    """

    def __init__(self, out: str | os.PathLike[str], *, resume: bool, overwrite: bool) -> None:
        self.out = Path(out)
        self.resume = resume
        self.overwrite = overwrite
        self.work = self.out / WORK
        self._lock = OutputLock(self.out / LOCK, busy=_busy_message(self.out))
        #: folders this run created for OUT, outermost first (removed again if the run leaves them empty)
        self._created: list[Path] = []

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
        _check_output_path(out)
        if not out.is_dir():
            self._make_out()
        elif not _is_retired_work(out / RETIRED):  # refused now, nothing created; again under the lock (a leftover:
            # a finished run's work dir goes first, under the lock, even if this run is then refused)
            try:
                with output_errors(out, "checking the output directory", started=False):
                    self._check_existing(dry=True)
            except OutputExistsError:
                if OutputLock.held_by_another(out / LOCK):  # what is there is a run in progress: say that
                    raise OutputLockedError(_busy_message(out)) from None
                raise
        try:
            self._take_lock()
            with output_errors(out, "preparing the output directory", started=False):
                self._check_existing()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: object = None, exc: object = None, tb: object = None) -> None:
        limit = isinstance(exc, Exception) and "ulimit -n" not in str(exc) and fd_limit_reached(exc)
        try:
            if isinstance(exc, InputError) and not limit and self._lock.held:
                self._record_failure(exc)
        finally:
            # A failed run keeps its work dir, even one with nothing staged (the next run removes that one):
            # `open` then says why it stopped and that --resume continues (or starts afresh).
            self._leave(clean=exc is None)
        if limit:
            # Whatever step met the limit (a reader, a worker, pyarrow), it is not bad data: say what it is.
            raise OutputError(f"{self.out}: prepare ran out of file descriptors ({exc}). {fd_limit_hint()}") from None

    def _leave(self, clean: bool = True) -> None:
        """Let go of the lock; with ``clean``, remove what a run that leaves nothing to resume created."""
        if not self._lock.held:
            return
        try:
            if clean and self.work.exists() and not _holds_work(self.work):
                shutil.rmtree(self.work, ignore_errors=True)
        except OSError:
            pass  # best effort: an empty work dir never blocks a later run
        finally:
            # With nothing to resume, the lock file would only be litter.
            self._lock.release(remove=not self.work.exists())
        for d in reversed(self._created):
            try:
                d.rmdir()  # only if empty: whatever the run left in it stays
            except OSError:
                break
        self._created = []

    def _make_out(self) -> None:
        """Create OUT (and missing parents), remembering which folders this run made."""
        out = self.out
        missing = [p for p in (out, *out.parents) if not (p.exists() or p.is_symlink())]
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(
                f"{out}: cannot create the output directory ({exc.strerror or exc}). {_create_hint(exc)}"
            ) from None
        self._created = list(reversed(missing))

    def _take_lock(self) -> None:
        """Lock ``OUT/.prepare.lock`` (see :class:`~shardload._base.output.OutputLock`)."""
        try:
            self._lock.acquire()
        except OutputLockedError:
            raise
        except OSError as exc:
            raise OutputError(
                f"{self.out}: cannot write into the output directory ({exc.strerror or exc}). {_create_hint(exc)}"
            ) from None

    @staticmethod
    def committed(out: str | os.PathLike[str]) -> bool:
        """Whether a run of this process committed its set into ``out`` (so a later stop leaves nothing to resume)."""
        return os.path.abspath(out) in _COMMITTED

    @staticmethod
    def was_committing(out: str | os.PathLike[str]) -> bool:
        """Whether a run into ``out`` was killed during its commit (checked before taking the lock)."""
        return (Path(out) / WORK / "COMMIT").exists()

    def _record_failure(self, exc: InputError) -> None:
        """Keep the bad input the run stopped on next to its work, for the next run's and ``open``'s message."""
        if self.work.is_dir():
            try:
                atomic_write_text(self.work / FAILED, str(exc)[:2000] + "\n")
            except OSError:
                pass

    def _check_existing(self, dry: bool = False) -> None:
        """Refuse an output that holds a set, an interrupted run or other files (as the options say).

        With ``dry``, only look; otherwise also replace a work dir with nothing to resume by a fresh one.
        """
        out = self.out
        retired = out / RETIRED  # a finished run's work dir, if a stop came while it was removed (up to a set's size)
        if _is_retired_work(retired) and not dry:  # no run resumes it: removed even when this run is then refused
            _remove(retired)
        elif not _is_retired_work(retired) and (retired.exists() or retired.is_symlink()):
            raise OutputExistsError(
                f"{out}: {retired} is not a folder prepare made, and prepare uses that name; move it out of the "
                "output directory, then run again"
            )
        has_set = (out / MANIFEST_NAME).exists()
        if self.work.exists() and not _holds_work(self.work) and not dry:
            # A run refused or killed before it staged anything: nothing to resume, nothing to lose.
            shutil.rmtree(self.work)
        interrupted = self.work.exists() and _holds_work(self.work)
        others = [p.name for p in out.iterdir() if p.name not in (LOCK, WORK, RETIRED, MANIFEST_NAME)]
        if interrupted and not (self.resume or self.overwrite):
            raise OutputExistsError(f"{out}: {interrupted_hint(self.work)}")
        if has_set and not (self.overwrite or (self.resume and interrupted)):
            # With --resume: the run being resumed got as far as its commit (stopped right after it).
            done = " and no interrupted run to resume: the run finished" if self.resume else ""
            raise OutputExistsError(
                f"{out}: already holds a shard set{done}. Pass --overwrite to replace it (the old set stays intact "
                "until the new one is complete), or choose another output."
            )
        if not has_set and not interrupted and others and not _looks_like_owned(others):
            raise OutputExistsError(
                f"{out}: the directory is not empty and is not a shard set ({', '.join(sorted(others)[:5])}"
                "...); refusing to write into it. Choose an empty or new directory."
            )
        if dry:
            return
        if self.overwrite and self.work.exists():
            shutil.rmtree(self.work)
        if self.committing:
            # Everything is built and partly moved in: commit() finishes it. Creating the work dirs
            # again would give it an empty shards/ to move over the set's real one.
            return
        (self.work / FAILED).unlink(missing_ok=True)  # a resumed run starts with a clean record
        # With resume and nothing interrupted, this simply starts afresh: --resume is safe to pass always.
        for d in (self.work, self.staging, self.shards, self.done):
            d.mkdir(parents=True, exist_ok=True)
        mark_staging(self.staging)  # before anything is staged: what another boot staged is not trusted

    # -- resumable state --------------------------------------------------------------------------
    def check_state(self, state: dict[str, Any]) -> None:
        """Record the run's identity, or check that a resumed run is the same run."""
        path = self.work / "state.json"
        if path.exists():
            try:
                old = json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, RecursionError):  # JSON and UTF-8 errors are ValueErrors
                old = None
            if not isinstance(old, dict):
                raise OutputError(
                    f"{self.out}: the interrupted prepare's record ({path}) is damaged, so this run cannot tell "
                    "whether it is the same run; rerun with --overwrite to start over"
                )
            new = json.loads(json.dumps(state))
            if old != new:
                diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                raise OutputError(
                    f"{self.out}: the interrupted prepare used different sources or options ({', '.join(diff)} "
                    f"differ{_first_difference(old.get('units'), new.get('units'))}{_option_changes(old, new)}); "
                    "rerun it exactly as before with --resume (an option whose default changed since: give the "
                    "interrupted run's value), or use --overwrite to start over"
                )
        else:
            atomic_write_text(path, json.dumps(state, indent=1, sort_keys=True))

    # -- commit -----------------------------------------------------------------------------------
    def commit(self, files: list[str]) -> None:
        """Replace any old set by the new one (``shards/`` and ``files``, names in the work dir); the manifest last.

        Idempotent: an interrupted commit is finished by calling it again.
        """
        marker = self.work / "COMMIT"
        if not marker.exists():
            old_parts = self.work / OLD_PARTS
            if (self.out / MANIFEST_NAME).exists() and (self.out / PARTS_DIR).is_dir():
                # A set merged from parts keeps its shards in them: they go with it. Recorded before the old
                # manifest goes, as a commit stopped after that could no longer tell whose parts they were.
                atomic_write_text(old_parts, "the old set was merged from parts/: remove them\n")
            # The old set stops being valid before any of its parts is removed.
            withdraw_index(self.out / MANIFEST_NAME)
            crash_point("commit:old-invalidated")
            for name in OWNED:
                _remove(self.out / name)
            if old_parts.exists():
                _remove(self.out / PARTS_DIR)
            for p in self.out.glob("lengths*.npy"):
                p.unlink()
            atomic_write_text(marker, "committing\n")
        # A set has at least one shard: an empty shards/ here was made after the real one moved in,
        # and must never replace it.
        if self.shards.is_dir() and any(self.shards.iterdir()):
            _remove(self.out / "shards")
            os.replace(self.shards, self.out / "shards")
            crash_point("commit:shards-moved")
        for name in files:
            src = self.work / name
            if src.exists():
                os.replace(src, self.out / name)
        manifest = self.work / MANIFEST_NAME
        if manifest.exists():
            crash_point("commit:before-manifest")
            publish_index(manifest, self.out / MANIFEST_NAME)
            crash_point("commit:manifest-moved")
        # From here the set is complete and the work dir goes: a run stopped now has nothing left to resume.
        # It is renamed first (atomic), so that a stop during its removal leaves no half work dir that a
        # later run would take for an interrupted one.
        _COMMITTED.add(os.path.abspath(self.out))
        if self.work.exists():
            _remove(self.out / RETIRED)
            os.replace(self.work, self.out / RETIRED)
            fsync_dir(self.out)
        crash_point("commit:work-retired")
        shutil.rmtree(self.out / RETIRED, ignore_errors=True)
        (self.out / LOCK).unlink(missing_ok=True)

    @property
    def committing(self) -> bool:
        return (self.work / "COMMIT").exists()


def _first_difference(old: Any, new: Any) -> str:
    """``": the run had 'a.jsonl' where this one has 'b.jsonl'"`` for two lists of source units, or ``""``."""
    if not isinstance(old, list) or not isinstance(new, list) or old == new:
        return ""
    for k, (a, b) in enumerate(zip(old, new)):
        if a != b:
            return f": source unit {k} was {a!r} in the interrupted run, {b!r} now"
    return f": the interrupted run had {len(old)} source units, this one {len(new)}"


def _option_changes(old: dict[str, Any], new: dict[str, Any], limit: int = 4) -> str:
    """``": compression was 'zstd', now 'blosc-lz4'"`` for the recorded options that differ, or ``""``."""
    found = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if key == "units" or a == b or not (isinstance(a, dict) and isinstance(b, dict)):
            continue
        found += [
            map_files_change(a.get(name), b.get(name))
            if name == "map_files"
            else f"{name} was {a.get(name)!r}, now {b.get(name)!r}"
            for name in sorted(set(a) | set(b))
            if a.get(name) != b.get(name)
        ]
    return f": {'; '.join(found[:limit])}" if found else ""


def _check_output_path(out: Path) -> None:
    """Refuse an output path that cannot become a directory, before anything is created."""
    if out.is_symlink() and not out.exists():
        try:
            os.stat(out)
            why = "which cannot be followed"
        except OSError as exc:
            why = "a loop of links" if exc.errno == errno.ELOOP else "which does not exist"
        raise OutputError(
            f"{out}: is a symbolic link to {os.readlink(out)!r}, {why}; point it at a directory, remove it, or "
            "choose another output path"
        )
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a directory; choose another output path")


def _busy_message(out: Path) -> str:
    return (
        f"{out}: another prepare is writing into this directory right now; wait for it to finish or choose "
        "another output"
    )


def recorded_failure(work: Path) -> str:
    """The bad input an interrupted run whose work dir is ``work`` stopped on (one line), or ``""``."""
    try:
        with open(work / FAILED, encoding="utf-8", errors="replace") as fh:
            return " ".join(fh.read(2000).split())
    except OSError:
        return ""


def interrupted_hint(work: Path) -> str:
    """What to say about an interrupted run whose work dir is ``work``: how it ended, and what to do."""
    failure = recorded_failure(work)
    if failure:
        return (
            f"an earlier prepare into this directory stopped on bad input ({failure}). Fix the input, then rerun "
            "with --resume to continue where it stopped, or with --overwrite to start over."
        )
    return (
        "an earlier prepare into this directory was interrupted. Rerun with --resume to finish it, or with "
        "--overwrite to start over."
    )


def fd_limit_reached(exc: BaseException) -> bool:
    """Whether ``exc`` or any exception in its chain (``from None`` included) is the open-files limit.

    Also matches the text, for errors from a worker process or pyarrow, which keep only the message.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.EMFILE, errno.ENFILE):
            return True
        if "Too many open files" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def fd_limit_hint(*, resume: bool = True) -> str:
    """What to do when prepare hits the open-files limit (names the limit, and the command that raises it)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        soft = hard = -1
    limit = f" is {soft}" if soft >= 0 else ""
    if 0 <= hard <= soft:  # RLIM_INFINITY is -1
        how = (
            f"raise it (its hard limit is {hard} too: that needs root, e.g. /etc/security/limits.conf or the "
            "container's settings)"
        )
    else:
        how = f"raise it (e.g. `ulimit -n {65536 if hard < 0 else min(hard, 65536)}` in the shell that runs prepare)"
    return (
        f"This is the limit on open files of the process (`ulimit -n`{limit}), or of the system, not damaged "
        f"data: {how}, then rerun the same command"
        + (" with --resume to continue where it stopped." if resume else ".")
    )


@contextmanager
def output_errors(out: Path, what: str, *, partial: Path | None = None, started: bool = True) -> Iterator[None]:
    """Turn an ``OSError`` while writing into ``out`` into an :class:`OutputError` that says what to do.

    ``what`` names the step (``"writing shard 3"``). ``partial``: a half-written file (or a directory of
    ``*.tmp`` files) removed on failure, so a full disk gets its space back. ``started=False``: nothing to resume.
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
        if not started:
            raise OutputError(f"{out}: {what} failed: {exc.strerror or exc}{where}. {_create_hint(exc)}") from None
        raise OutputError(
            f"{out}: {what} failed: {exc.strerror or exc}{where}. {_hint(exc)} Nothing in {out} looks like a "
            "complete shard set until a run finishes."
        ) from None


def _create_hint(exc: OSError) -> str:
    """What to do about an OSError before anything was written (there is nothing to resume)."""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "The output directory is not writable: fix its permissions or choose another output."
    if exc.errno == errno.ENOTDIR:
        return "A part of the path is a file, not a directory: choose another output path."
    if exc.errno == errno.ENOENT:
        return "A directory on the way cannot be created there: choose another output path."
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return fd_limit_hint(resume=False)
    return "Fix the cause or choose another output path, then run the same command again."


def _hint(exc: OSError) -> str:
    """What to do about an OSError while writing the output."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return fd_limit_hint()
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "The disk is full: free some space, then rerun with --resume to continue where it stopped."
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "The output directory is not writable: fix its permissions or choose another output."
    return "Fix the cause, then rerun with --resume to continue where it stopped."


def _holds_work(work: Path) -> bool:
    """Whether a work dir holds anything a resume would reuse (staged samples, shards, a commit)."""
    if (work / "COMMIT").exists():
        return True
    dirs = [work / d for d in ("staging", "shards", "done") if (work / d).is_dir()]
    return any(p.name != STAGING_MARK for d in dirs for p in d.iterdir())  # the boot mark alone is no work


def _is_retired_work(path: Path) -> bool:
    """Whether ``path`` (``OUT/.prepare.done``) is a work dir a prepare run renamed there: a folder holding the run's
    record or its staging mark (a user's file or folder of that name is not prepare's to remove)."""
    ours = (path / "state.json").is_file() or (path / "staging" / STAGING_MARK).is_file()
    return ours and path.is_dir() and not path.is_symlink()


def _looks_like_owned(names: list[str]) -> bool:
    return all(n in OWNED or (n.startswith("lengths") and n.endswith(".npy")) for n in names)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
