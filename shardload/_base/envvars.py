"""Every environment variable shardload reads, by name, and the one rule that reads a number from one.

Bounds that protect a process (the size of ``manifest.json``, of one source
record, the shards kept open, the Zarr chunk cache) have a default and a
variable to change it; :func:`env_int` reads each, so a bad value gets the
same message whatever the variable. The names below are the only place a
variable's name is written in the package; the modules that read them import
them from here.
"""

from __future__ import annotations

import os
import re

from shardload.errors import ShardloadError

__all__ = [
    "AWS_MAX_ATTEMPTS",
    "CACHE_DIR",
    "CACHE_LIMIT",
    "KILL_AT",
    "LOCAL_WORLD_SIZE",
    "MAX_DECODED_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_OPEN_SHARDS",
    "MAX_RECORD_BYTES",
    "PAUSE_AT",
    "RANK_VARIABLES",
    "XDG_CACHE_HOME",
    "ZARR_CACHE_BYTES",
    "env_int",
    "parse_size_text",
]

# shardload's own (docs/remote.md, docs/loading.md, docs/format.md, docs/reliability.md)
#: the node cache of remote sets (remote/options.py)
CACHE_DIR = "SHARDLOAD_CACHE_DIR"
#: the most bytes of shards one remote set keeps in the node cache (remote/options.py)
CACHE_LIMIT = "SHARDLOAD_CACHE_LIMIT"
#: the most bytes one piece of a Parquet or Arrow source decodes to at once (prepare/sources/columnar/_decoded.py)
MAX_DECODED_BYTES = "SHARDLOAD_MAX_DECODED_BYTES"
#: the largest ``manifest.json`` read (_base/setfiles.py)
MAX_MANIFEST_BYTES = "SHARDLOAD_MAX_MANIFEST_BYTES"
#: the shards one process keeps open (_base/setfiles.py)
MAX_OPEN_SHARDS = "SHARDLOAD_MAX_OPEN_SHARDS"
#: the largest source record prepare reads (prepare/sources/base.py)
MAX_RECORD_BYTES = "SHARDLOAD_MAX_RECORD_BYTES"
#: the decoded-chunk cache of Zarr shards (formats/zarr/cache.py)
ZARR_CACHE_BYTES = "SHARDLOAD_ZARR_CACHE_BYTES"
#: fault injection for the tests: stop at a named point (_base/faults.py)
KILL_AT = "SHARDLOAD_KILL_AT"
PAUSE_AT = "SHARDLOAD_PAUSE_AT"

# other systems' (read, never set)
#: (rank, world size) pairs in the order load/world.py tries them: torchrun, then SLURM
RANK_VARIABLES = (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"))
#: ranks of the job on this node, set by torchrun (load/prefetch.py)
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
#: the user's cache folder (XDG base directories)
XDG_CACHE_HOME = "XDG_CACHE_HOME"
#: botocore's retry count: when set, the storage client's own retries are left to it (remote/url.py)
AWS_MAX_ATTEMPTS = "AWS_MAX_ATTEMPTS"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_size_text(text: str) -> int | None:
    """A byte size: ``"256MB"`` (10^6), ``"1GiB"`` (2^30), ``"512k"``/``"512K"`` (2^10), ``"1000"``; ``None`` if not one.

    As in GNU coreutils, a unit with ``B`` after a letter is decimal (``kB``,
    ``MB``), with ``iB`` or a bare letter it is binary (``KiB``, ``M``).

    >>> parse_size_text("256MB"), parse_size_text("1GiB"), parse_size_text("4k"), parse_size_text("x")
    (256000000, 1073741824, 4096, None)
    """
    m = _SIZE.match(text)
    if not m or (m.group(3) and not m.group(2)):
        return None
    number, letter, binary, b = m.groups()
    power = "kmgtp".find(letter.lower()) + 1 if letter else 0
    base = 1000 if (letter and b and not binary) else 1024
    value = float(number) * base**power
    return int(value) if value.is_integer() else None  # "1.5" bytes is no size; "1.5k" is 1536


def env_int(
    name: str,
    default: int,
    *,
    minimum: int = 1,
    maximum: int = 1 << 48,
    size: bool = False,
    error: type[ShardloadError],
) -> int:
    """The value of environment variable ``name`` in ``[minimum, maximum]`` (unset or empty: ``default``).

    The default ``maximum``, 256 TiB, is beyond any real limit and within what
    buffers can index; ``size`` also accepts units (``4GiB``, ``500MB``). A bad
    value raises ``error`` (the caller's branch of the tree) naming the
    variable, its value and an example of a good one.
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    value = parse_size_text(text) if size else (int(text) if re.fullmatch(r"[+-]?\d+", text) else None)
    if value is None or not minimum <= value <= maximum:
        which = {0: "a non-negative", 1: "a positive"}.get(minimum, f"an at least {minimum}")
        kind = "size (e.g. 1GiB, 500MB or a number of bytes)" if size else "integer"
        # the default as the example, unless it is a sentinel outside the range (0: no limit)
        example = str(default) if minimum <= default <= maximum else ("100GiB" if size else str(minimum))
        raise error(
            f"{name}={text!r} is not {which} {kind} of at most {maximum:,}; unset it or set e.g. {name}={example}"
        )
    return value
