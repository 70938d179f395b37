"""Limits that an environment variable may change, read by one rule.

Where it sits: beside the flow. Bounds that protect a process (the size of
``manifest.json``, of one source record, the shards kept open, the Zarr chunk
cache) have a default and an environment variable to change it; each is read
here, so a bad value gets the same message whatever the variable.
"""

from __future__ import annotations

import os
import re

from shardload.errors import ShardloadError

__all__ = ["env_int", "parse_size_text"]

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
    """The value of environment variable ``name`` (unset or empty: ``default``).

    Args:
        minimum: the smallest value accepted.
        maximum: the largest (256 TiB by default: beyond any real limit, within what buffers can index).
        size: accept byte sizes with units (``4GiB``, ``500MB``) besides plain integers.
        error: the error class to raise for a bad value (the caller's branch of the tree).

    Raises:
        error: naming the variable, its value and an example of a good one.
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
