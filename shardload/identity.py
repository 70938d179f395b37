"""Which set and which position a shard file belongs to, and whether it changed since it was mapped.

Two cheap mechanisms keep a loader from returning data that is not the data
the manifest describes, without reading any sample:

* **Shard identity.** ``prepare`` writes a small record into every shard's own
  metadata (Arrow schema metadata, Zarr root attributes): the set id, the
  shard's index, its first sample and its sample count. The set id is a digest
  of the prepare options, the schema, the sources' description and the staged
  sample bytes, so the same input and options always give the same id (and
  ``--resume`` the same shard bytes), and different data a different one. When
  a shard is first opened the record is compared with the manifest: a shard
  swapped with another of the same set, or copied in from another set, is a
  :class:`~shardload.errors.CorruptShardError` naming both positions.
* **File stamps.** ``(device, inode, size, mtime)`` of a shard when it is
  mapped; checked again each time a batch is read from it (before its pages are
  touched, and once more after the batch is built). A shard rewritten in place
  (``cp`` over it, ``rsync --inplace``), truncated or replaced while mapped is a
  :class:`~shardload.errors.ShardSetChangedError` instead of garbage or a
  ``SIGBUS``. ``ctime`` is left out on purpose: ``chmod`` or a new hard link
  change it without changing a byte.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardload.errors import CorruptShardError

#: key of a shard's identity record: Arrow schema metadata (bytes) and the Zarr ``shardload`` attribute
IDENTITY_KEY = "shard"
ARROW_IDENTITY_KEY = b"shardload.shard"
#: a set id is lowercase hex, this many characters
SET_ID_CHARS = 32
_SET_ID = re.compile(rf"[0-9a-f]{{{SET_ID_CHARS}}}")


@dataclass(frozen=True)
class ShardIdentity:
    """What a shard says about itself: the set it was written for and where in it.

    Attributes:
        set_id: the set's id (see :func:`set_id_of`).
        shard: index of the shard in the set.
        first_sample: global id of the shard's first sample.
        samples: number of samples in the shard.
    """

    set_id: str
    shard: int
    first_sample: int
    samples: int

    def to_json(self) -> dict[str, Any]:
        return {"set_id": self.set_id, "shard": self.shard, "first_sample": self.first_sample, "samples": self.samples}

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

    Args:
        description: the run's options, schema and sources (what ``--resume`` compares).
        staged_files: the staged sample chunks, in source order. Their bytes are
            summed (CRC-32, from the page cache: they were just written): two
            runs get the same id when options, sources and every sample are the
            same, which is when their shards are the same bytes. CRC-32 rather
            than sha256: this guards against accidents, not forgery, and costs
            about 2% of a prepare's time instead of 5%.
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
    checks only the position of shards that carry one.
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
    if set_id and found.set_id != set_id:
        return (
            f"it is {there} of another shard set (set id {found.set_id}), not {here} of this one "
            f"(set id {set_id}): it was copied in from another set"
        )
    # The sample count is left to the count check, which reads it from the data itself.
    if (found.shard, found.first_sample) != (shard, first_sample):
        return f"it is {there} of this set, not {here}: shard files were swapped, renamed or copied over each other"
    return None


#: ``(device, inode, size, mtime_ns)`` of a file
FileStamp = tuple[int, int, int, int]


def file_stamp(st: os.stat_result) -> FileStamp:
    """The parts of a ``stat`` that change when a file's bytes are replaced."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def describe_change(old: FileStamp, new: FileStamp | None) -> str:
    """How a file changed, in words (for an error message)."""
    if new is None:
        return "it was deleted"
    if old[:2] != new[:2]:
        return "it was replaced by another file"
    if new[2] < old[2]:
        return f"it was truncated from {old[2]} to {new[2]} bytes"
    if new[2] != old[2]:
        return f"it was rewritten ({old[2]} -> {new[2]} bytes)"
    return "it was rewritten in place (same size, new modification time)"
