"""Which set and which position a shard file belongs to, and whether it changed since it was mapped.

Two cheap checks, reading no sample, keep a loader from returning data the
manifest does not describe: the **shard identity** record in each shard's
metadata, compared with the manifest at first open (docs/format.md, "Shard
identity"), and **file stamps** (``stat`` when mapped, checked again at each
use), so a file changed in place is a :class:`~shardload.errors.ShardSetChangedError`
instead of garbage or a ``SIGBUS`` (docs/reliability.md).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from shardload.errors import CorruptShardError

#: key of a shard's identity record: Arrow schema metadata (bytes) and the Zarr ``shardload`` attribute
IDENTITY_KEY = "shard"
ARROW_IDENTITY_KEY = b"shardload.shard"
#: a set id is lowercase hex, this many characters
SET_ID_CHARS = 32
_SET_ID = re.compile(rf"[0-9a-f]{{{SET_ID_CHARS}}}")


@dataclass(frozen=True)
class ShardIdentity:
    """What a shard says about itself: the set it was written for (:func:`set_id_of`) and where in it."""

    set_id: str
    shard: int
    first_sample: int
    samples: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, raw: Any, *, where: str) -> ShardIdentity | None:
        """Parse a stored record (a dict, or JSON bytes from Arrow metadata); ``None`` if there is none.

        Raises:
            CorruptShardError: the record is there but malformed.
        """
        if raw is None:
            return None
        try:
            obj = json.loads(raw) if isinstance(raw, (bytes, str)) else raw
            ints = [obj[k] for k in ("shard", "first_sample", "samples")]
            if not is_set_id(obj["set_id"]) or any(isinstance(v, bool) or not isinstance(v, int) for v in ints):
                raise ValueError("wrong types")
        except (ValueError, TypeError, KeyError, UnicodeDecodeError):
            raise CorruptShardError(
                f"shard {where} has a malformed identity record ({str(raw)[:100]!r}); it is damaged. "
                "Run `shardload verify` and re-run prepare."
            ) from None
        return cls(obj["set_id"], *ints)


def is_set_id(value: Any) -> bool:
    return isinstance(value, str) and _SET_ID.fullmatch(value) is not None


def set_id_of(description: Mapping[str, Any], staged_files: Iterable[Path]) -> str:
    """The id of the set that ``prepare`` builds from ``description`` and the staged samples.

    ``description`` is what ``--resume`` compares (options, schema, sources);
    the staged chunks' bytes are summed in source order, so two runs get the
    same id exactly when their shards are the same bytes. CRC-32 rather than
    sha256: this guards against accidents, not forgery, at 2% of a prepare's
    time instead of 5%.
    """
    h = hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode())
    for path in staged_files:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            crc = 0
            if size:  # summed through a mapping: no copy of the bytes
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    crc = zlib.crc32(data)
        h.update(f"{path.name}:{size}:{crc:08x};".encode())
    return h.hexdigest()[:SET_ID_CHARS]


def identity_problem(
    found: ShardIdentity | None, shard: int, first_sample: int, samples: int, set_id: str
) -> str | None:
    """What is wrong with shard ``shard``'s own record, in words, or ``None`` if it is where it belongs.

    A set without a ``set_id`` (prepared before shards carried identities)
    has shards without records; a shard with a record in such a set is refused
    (the manifest lost its ``set_id``, or the shard came from a newer set).
    """
    here = f"shard {shard} (samples {first_sample}-{first_sample + samples - 1})"
    if found is None:
        if not set_id:
            return None
        return (
            f"it carries no identity record, but every shard of this set does: it was copied in from another "
            f"set (one prepared by an older shardload, or written outside prepare), not written as {here}"
        )
    there = f"shard {found.shard} (samples {found.first_sample}-{found.first_sample + found.samples - 1})"
    if not set_id:
        # Shards carry a record only in sets whose manifest has a set_id: one of the two was tampered with.
        return (
            f"it carries the identity record of {there} of set {found.set_id}, but the manifest has no set_id, "
            "which every set whose shards carry one has: the manifest was edited (set_id removed) or the shard was "
            "copied in from another set; its data cannot be tied to this set"
        )
    if found.set_id != set_id:
        return (
            f"it is {there} of another shard set (set id {found.set_id}), not {here} of this one "
            f"(set id {set_id}): it was copied in from another set"
        )
    # The sample count is left to the count check, which reads it from the data itself.
    if (found.shard, found.first_sample) != (shard, first_sample):
        return f"it is {there} of this set, not {here}: shard files were swapped, renamed or copied over each other"
    return None


class FileStamp(NamedTuple):
    """What a ``stat`` of a file says about whether its bytes changed."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int
    #: mode, link count, owner and group: what a ``chmod``, ``chown`` or ``ln`` changes along with the ctime
    meta: tuple[int, int, int, int]


def file_stamp(st: os.stat_result) -> FileStamp:
    """The parts of a ``stat`` that change when a file's bytes are replaced."""
    meta = (st.st_mode, st.st_nlink, st.st_uid, st.st_gid)
    return FileStamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, meta)


def same_bytes(old: FileStamp, new: FileStamp | None) -> bool:
    """Whether a file stamped ``old`` then ``new`` still holds the same bytes, as far as ``stat`` tells.

    Same file, size and mtime, and either the same ctime or a ctime explained by
    a change of mode, link count or owner (``chmod``, ``ln``, ``chown``: a
    backup tool's hard links, a permission fix). A ctime that moved with
    nothing else is a write whose mtime was put back, or a ``touch``: reported.
    """
    if new is None or old[:4] != new[:4]:
        return False
    return old.ctime_ns == new.ctime_ns or old.meta != new.meta


def describe_change(old: FileStamp, new: FileStamp | None) -> str:
    """How a file changed, in words (for an error message)."""
    if new is None:
        return "it was deleted"
    if old[:2] != new[:2]:
        return "it was replaced by another file"
    if new.size < old.size:
        return f"it was truncated from {old.size} to {new.size} bytes"
    if new.size != old.size:
        return f"it was rewritten ({old.size} -> {new.size} bytes)"
    if new.mtime_ns != old.mtime_ns:
        return "it was rewritten in place (same size, new modification time)"
    return (
        "it was written in place with its modification time put back (same size and modification time, new "
        "change time; `touch -r`, `rsync --inplace -t` or `os.utime` do that)"
    )
