"""Fingerprints of the source files, so that ``--resume`` never mixes old and new input.

Each file's :func:`shardload._base.identity.file_stamp` is recorded when a run starts and compared by
the one rule of :func:`shardload._base.identity.same_bytes`; small files (while a budget lasts) also
get a hash of their content.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Sequence
from typing import Any

from shardload._base.identity import FileStamp, describe_change, file_stamp, same_bytes
from shardload.prepare.sources import SourceUnit

#: files up to this size have their content hashed ...
HASH_MAX_FILE = 1 << 20
#: ... until this many bytes have been hashed in one run (the rest: their stamp only)
HASH_BUDGET = 64 << 20


def fingerprint_units(units: Sequence[SourceUnit]) -> list[list[list[Any]]]:
    """Per unit, ``[path, stamp, sha256 or None]`` of each of its files, in order.

    ``stamp`` is a :class:`~shardload._base.identity.FileStamp` as a JSON list, or the
    string ``"unreadable: ..."`` when the file could not be ``stat``-ed.
    """
    out: list[list[list[Any]]] = []
    budget = HASH_BUDGET
    for unit in units:
        files: list[list[Any]] = []
        for path in unit.paths:
            try:
                st = os.stat(path)
            except OSError as exc:
                files.append([path, f"unreadable: {exc.strerror}", None])
                continue
            digest = None
            if st.st_size <= min(HASH_MAX_FILE, budget) and stat.S_ISREG(st.st_mode):
                digest = _sha256(path)
                budget -= st.st_size
            # Without the device number: a resume may run on another machine of a cluster, where the same
            # network file system has another one (the inode and times are the server's, the same everywhere).
            stamp = file_stamp(st)._replace(dev=0)
            files.append([path, [*stamp[:5], list(stamp.meta)], digest])
        out.append(files)
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _entry(a: Any) -> tuple[str, FileStamp | str, str | None] | None:
    """One recorded file entry, checked for shape and types; None if damaged (or of an older layout)."""
    if not (isinstance(a, list) and len(a) == 3 and isinstance(a[0], str)):
        return None
    path, raw, digest = a
    if digest is not None and not isinstance(digest, str):
        return None
    if isinstance(raw, str):
        return path, raw, digest
    if not (isinstance(raw, list) and len(raw) == 6 and all(_is_int(v) for v in raw[:5])):
        return None
    meta = raw[5]
    if not (isinstance(meta, list) and len(meta) == 4 and all(_is_int(v) for v in meta)):
        return None
    return path, FileStamp(raw[0], raw[1], raw[2], raw[3], raw[4], (meta[0], meta[1], meta[2], meta[3])), digest


def changed_input(old: Any, new: Sequence[Sequence[Sequence[Any]]], units: Iterable[int]) -> str | None:
    """What changed in ``units`` between two :func:`fingerprint_units` results, naming a file; None if nothing.

    A damaged or foreign ``old`` proves nothing: reported as no fingerprint, so the resume is refused.
    """
    damaged = "the interrupted run recorded no fingerprint of these sources"
    if not isinstance(old, list) or len(old) != len(new):
        return damaged
    for k in units:
        was, now = old[k], new[k]
        if not isinstance(was, list) or len(was) != len(now):
            return (
                f"the files of source unit {k} ({now[0][0] if now else '?'}...) are not those the interrupted run read"
            )
        for a, b in zip(was, now):
            entry, current = _entry(a), _entry(list(b))
            if entry is None or current is None:
                return damaged
            path, stamp, digest = entry
            _, now_stamp, now_digest = current
            if path != b[0]:
                return f"{b[0]} is not the file the interrupted run read at that place"
            if isinstance(now_stamp, str) or isinstance(stamp, str):
                if stamp != now_stamp:
                    state = stamp if isinstance(stamp, str) else now_stamp
                    return f"{path} changed since the interrupted run (it was or is {state})"
                continue
            if not same_bytes(stamp, now_stamp):
                return f"{path} changed since the interrupted run ({describe_change(stamp, now_stamp)})"
            if digest != now_digest:
                return f"{path} changed since the interrupted run (its content differs)"
    return None


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read(HASH_MAX_FILE + 1)).hexdigest()
    except OSError:
        return None
