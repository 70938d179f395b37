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
from collections.abc import Iterable, Sequence
from typing import Any

from shardload.prepare.sources import SourceUnit

#: files up to this size have their content hashed ...
HASH_MAX_FILE = 1 << 20
#: ... until this many bytes have been hashed in one run (the rest: size, time and inode only)
HASH_BUDGET = 64 << 20


def fingerprint_units(units: Sequence[SourceUnit]) -> list[list[list[Any]]]:
    """Per unit, ``[path, size, mtime_ns, inode, sha256 or None]`` of each of its files, in order."""
    out: list[list[list[Any]]] = []
    budget = HASH_BUDGET
    for unit in units:
        files: list[list[Any]] = []
        for path in unit.paths:
            try:
                st = os.stat(path)
            except OSError as exc:
                files.append([path, None, None, None, f"unreadable: {exc.strerror}"])
                continue
            digest = None
            if st.st_size <= min(HASH_MAX_FILE, budget) and stat.S_ISREG(st.st_mode):
                digest = _sha256(path)
                budget -= st.st_size
            files.append([path, st.st_size, st.st_mtime_ns, st.st_ino, digest])
        out.append(files)
    return out


def changed_input(old: Any, new: Sequence[Sequence[Sequence[Any]]], units: Iterable[int]) -> str | None:
    """What changed in ``units`` between two :func:`fingerprint_units` results, naming a file; None if nothing."""
    if not isinstance(old, list) or len(old) != len(new):
        return "the interrupted run recorded no fingerprint of these sources"
    for k in units:
        was, now = old[k], new[k]
        if not isinstance(was, list) or len(was) != len(now):
            return (
                f"the files of source unit {k} ({now[0][0] if now else '?'}...) are not those the interrupted run read"
            )
        for a, b in zip(was, now):
            if list(a) != list(b):
                if not isinstance(a, list) or len(a) != 5 or a[0] != b[0]:
                    return f"{b[0]} is not the file the interrupted run read at that place"
                fields = (("size", 1), ("modification time", 2), ("inode", 3), ("content", 4))
                what = [name for name, i in fields if a[i] != b[i]]
                return f"{b[0]} changed since the interrupted run ({', '.join(what)} differ)"
    return None


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read(HASH_MAX_FILE + 1)).hexdigest()
    except OSError:
        return None
