"""Staged chunks are written without fsync; a resume trusts them only on the boot of the machine that wrote them.

A staged chunk (and its origins, and its unit's ``.done`` record) is renamed into place complete, so
every process sees either no file or the whole file. What a rename without ``fsync`` does not promise
is the file's content after the *machine* stops (power loss, kernel crash): the rename can be on disk
before the data. Killing prepare (Ctrl-C, ``kill -9``, running out of memory) loses nothing: the data
is in the kernel's page cache, which outlives the process. Only a stop of the kernel loses it, and the
kernel then starts with a new boot id (``/proc/sys/kernel/random/boot_id``).

So the staging folder holds the boot id of the run that staged into it (:data:`MARK`, written durably
before any chunk), and a run that finds another boot's mark removes what was staged and stages it
again (the same bytes: the shards already written, fsynced each, are kept as their records say). A
staging folder with no mark was staged by an older shardload, which fsynced every file. Where the
boot id cannot be read (not Linux), every staged file is fsynced, as before.

Nothing a set is made of depends on this: shards, their records, the indexes and the manifest are
fsynced as before the commit (docs/design.md, "Crash safety of staging"). What it saves is writing
the staged data to disk at all: it is read back from the page cache and removed at the commit, usually
before the kernel would have written it out.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

from shardload._base.output import atomic_write_text, fsync_dir
from shardload._base.redact import get_logger

__all__ = ["BOOT_ID", "MARK", "boot_id", "mark_staging", "staged_durably"]

#: where Linux gives a random id that is new at every boot
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
#: in the staging folder: the boot id of the runs that staged into it without fsync
MARK = "BOOT"

logger = get_logger("shardload.prepare")


@functools.cache
def boot_id() -> str | None:
    """This boot's id, or None where it cannot be read."""
    try:
        text = BOOT_ID.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def staged_durably() -> bool:
    """Whether staged files must be fsynced: only where this boot cannot be told from another."""
    return boot_id() is None


def mark_staging(staging: Path) -> None:
    """Before anything is staged into ``staging``: remove what another boot staged, and mark it with this boot."""
    current = boot_id()
    mark = staging / MARK
    try:
        old: str | None = mark.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        old = None  # a new folder, or one staged by an older shardload (every file fsynced): all kept
    except (OSError, UnicodeDecodeError):
        old = ""  # unreadable: nothing proves it was this boot
    if old is not None and old != current:
        # The mark goes last, so a stop in between leaves it to remove the rest again.
        names = sorted(p.name for p in staging.iterdir() if p.name != MARK)
        if names:
            logger.info("%s: the machine restarted since these samples were staged; staging them again", staging)
        for name in names:
            path = staging / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        fsync_dir(staging)
        mark.unlink(missing_ok=True)
        fsync_dir(staging)
    if current is not None and old != current:
        atomic_write_text(mark, current + "\n")
