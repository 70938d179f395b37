"""Fingerprints of the source files, so that ``--resume`` never mixes old and new input.

A resumed run reuses the samples staged by the interrupted one. If a source
file changed in between, the result would hold some samples of the old file
and some of the new one, without a word. Each file's identity is recorded in
the run's state when it starts: size, modification time (ns) and inode, and
for small files (while a budget lasts) a hash of the content, which catches a
same-size rewrite that kept the time stamp (``cp -p``, ``rsync -t``).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from typing import Any

from shardload.prepare.sources import SourceUnit

#: files up to this size have their content hashed ...
HASH_MAX_FILE = 1 << 20
#: ... until this many bytes have been hashed in one run (the rest: size, time and inode only)
HASH_BUDGET = 64 << 20


def fingerprint_units(units: Sequence[SourceUnit]) -> list[list[Any]]:
    """``[path, size, mtime_ns, inode, sha256 or None]`` of every file of every unit, in order."""
    out: list[list[Any]] = []
    budget = HASH_BUDGET
    for unit in units:
        for path in unit.paths:
            try:
                st = os.stat(path)
            except OSError as exc:
                out.append([path, None, None, None, f"unreadable: {exc.strerror}"])
                continue
            digest = None
            if st.st_size <= min(HASH_MAX_FILE, budget) and stat.S_ISREG(st.st_mode):
                digest = _sha256(path)
                budget -= st.st_size
            out.append([path, st.st_size, st.st_mtime_ns, st.st_ino, digest])
    return out


def changed_input(old: Any, new: Sequence[Sequence[Any]]) -> str | None:
    """What changed between two :func:`fingerprint_units` results, naming the file; None if nothing."""
    if not isinstance(old, list):
        return "the interrupted run recorded no fingerprint of its sources"
    for was, now in zip(old, new):
        if list(was) != list(now):
            if not isinstance(was, list) or len(was) != 5 or was[0] != now[0]:
                return f"{now[0]} is not the file the interrupted run read at that place"
            what = [
                w for w, i in (("size", 1), ("modification time", 2), ("inode", 3), ("content", 4)) if was[i] != now[i]
            ]
            return f"{now[0]} changed since the interrupted run ({', '.join(what)} differ)"
    if len(old) != len(new):
        return f"the sources are {len(new)} files, the interrupted run read {len(old)}"
    return None


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read(HASH_MAX_FILE + 1)).hexdigest()
    except OSError:
        return None
