"""The exact JSON Lines reader: line by line, every value rule (docs/format.md, "JSON Lines") with its
file, line and field.

Also where a file is cut into units (:func:`line_cuts`) and what the block reader
(:mod:`._blocks`) falls back to for any block it cannot prove it reads alike.
"""

from __future__ import annotations

import gzip
import io
import json
import mmap
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardload.errors import InputError
from shardload.prepare.sources.base import Sample, SourceOptions, record_too_large
from shardload.prepare.sources.jsonl._values import (
    NumberRangeError,
    Refused,
    check_tiny_numbers,
    json_to_array,
    loads,
    may_mix_bools,
)

#: a byte-order mark, dropped from a file's first line
BOM = "\ufeff"


#: the first bytes of a gzip stream
GZIP_MAGIC = b"\x1f\x8b"
#: the first bytes of compressed streams, and the tool that undoes each (a file that is not UTF-8 is looked up here)
COMPRESSED_MAGIC = (
    (GZIP_MAGIC, "gzip", "gunzip"),
    (b"BZh", "bzip2", "bunzip2"),
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
)


def gzipped(path: str) -> bool:
    """Whether the file at ``path`` is read through gzip (then it is one unit, read line by line)."""
    return path.lower().endswith(".gz")


#: per field, what an empty list becomes: the dtype and inner shape of the field's last non-empty list
#: (None: there was none)
_Seen = dict[str, tuple[np.dtype, tuple[int, ...]] | None]

#: bytes scanned per step when counting newlines (the step's mask of newlines stays in the CPU's cache)
_SCAN_BYTES = 1 << 20


def _count_newlines(mm: mmap.mmap, start: int, stop: int) -> int:
    """Newlines in ``mm[start:stop]``, counted on the mapping (no copy of the bytes)."""
    data = np.frombuffer(mm, dtype=np.uint8, count=stop - start, offset=start)
    try:
        return sum(int(np.count_nonzero(data[a : a + _SCAN_BYTES] == 10)) for a in range(0, len(data), _SCAN_BYTES))
    finally:
        del data  # the mapping can close, also after an interrupt (a live view would make it a BufferError)


def line_cuts(path: str, size: int, unit_bytes: int) -> list[tuple[int, int, int]]:
    """``(start, stop, lines before start)`` per byte range of about ``unit_bytes`` of the file, covering it.

    Each cut is the first line boundary at least ``unit_bytes`` after the previous one; a last range
    of less than a quarter of ``unit_bytes`` joins the one before.

    Raises:
        InputError: the file cannot be read.
    """
    cuts: list[tuple[int, int, int]] = []
    start, lines = 0, 0
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            while size - start > unit_bytes + unit_bytes // 4:
                nl = mm.find(b"\n", start + unit_bytes - 1)
                if nl < 0 or size - (nl + 1) < unit_bytes // 4:
                    break
                stop = nl + 1
                cuts.append((start, stop, lines))
                lines += _count_newlines(mm, start, stop)
                start = stop
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    cuts.append((start, size, lines))
    return cuts


def compressed_hint(path: str) -> str | None:
    """The message for a file that is not UTF-8 because it is compressed (``None``: its bytes are no known
    compressed stream). A ``.gz`` file is looked into: gzip read as text gives the stream inside it."""
    try:
        with _open(path) as fh:
            head = fh.read(8)
    except (OSError, EOFError, zlib.error):  # (unreadable now: the caller's own message stands)
        return None
    for magic, name, undo in COMPRESSED_MAGIC:
        if not head.startswith(magic):
            continue
        if gzipped(path):
            return (
                f"{path}: the file is compressed twice (gzip, then {name} inside it); gunzip it, then {undo} what "
                "that gives (gzip it again, named .jsonl.gz, to keep it compressed)"
            )
        if magic == GZIP_MAGIC:
            return (
                f"{path}: the file is gzip-compressed but its name does not end in .gz; rename it to end in .jsonl.gz "
                "(read through gzip) or gunzip it"
            )
        return (
            f"{path}: the file is {name}-compressed, and JSON Lines are read as plain text or gzip; {undo} it "
            "(then gzip it, named .jsonl.gz, to keep it compressed)"
        )
    return None


def _open(path: str) -> io.BufferedIOBase:
    if gzipped(path):
        return gzip.open(path, "rb")
    return open(path, "rb")


def read_lines(
    path: str, options: SourceOptions, part: tuple[int, int] | None = None, first: int = 0
) -> Iterator[tuple[str, Sample]]:
    """The samples of the file at ``path``, or of its byte range ``part`` (whose first line is ``first + 1``)."""
    # field -> (dtype, inner shape) of its last non-empty list, for empty lists
    seen: _Seen = {}
    lineno = first
    limit = options.max_record_bytes
    start, stop = part if part is not None else (0, -1)
    try:
        with _open(path) as fh:
            if start:
                fh.seek(start)
                seen = _SeenBefore(path, start, options)
            pos = start
            # readline with a bound: one line never takes more memory than the bound, however it is padded
            for lineno, raw in enumerate(iter(lambda: fh.readline(limit + 1), b""), first + 1):
                where = f"{path}: line {lineno}"
                if len(raw) > limit and not raw.endswith(b"\n"):
                    raise record_too_large(where, "the line", None, limit)
                pos += len(raw)
                if stop >= 0 and (pos > stop or (pos < stop and not raw.endswith(b"\n"))):
                    raise InputError(f"{where}: the file changed while prepare read it; run prepare again")
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    hint = compressed_hint(path)
                    if hint is not None:
                        raise InputError(hint) from None
                    raise InputError(
                        f"{where}: not valid UTF-8 (byte {exc.start + 1} of the line); "
                        "JSON Lines files must be UTF-8: re-encode the file"
                    ) from None
                if lineno == 1:
                    text = text.lstrip(BOM)
                if text.strip():
                    yield where, _decode_line(text, where, options, seen)
                if pos == stop:
                    break
            if stop >= 0 and pos < stop:  # the range ends early: the file shrank since it was cut
                raise InputError(f"{path}: line {lineno}: the file changed while prepare read it; run prepare again")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found (was it deleted while prepare ran?)") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise InputError(
            f"{path}: corrupt or truncated gzip data after line {lineno} ({exc}); re-create the file"
        ) from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a JSON Lines file") from None
    except OSError as exc:  # e.g. permission denied; the input is the user's to fix
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc}) after line {lineno}") from None


class _SeenBefore(_Seen):
    """The ``seen`` record of a byte range that does not start the file: a field missing from it is looked up
    in the lines before the range, last line first, so that ``[]`` becomes what it would in a whole-file read."""

    def __init__(self, path: str, start: int, options: SourceOptions) -> None:
        super().__init__()
        self.path, self.start, self.options = path, start, options

    def __missing__(self, name: str) -> tuple[np.dtype, tuple[int, ...]] | None:
        found = _last_nonempty(self.path, self.start, name, self.options)
        self[name] = found
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self[name] is not None


def _last_nonempty(path: str, end: int, name: str, options: SourceOptions) -> tuple[np.dtype, tuple[int, ...]] | None:
    """The dtype and inner shape of field ``name``'s last non-empty list in the lines before byte ``end``."""
    dtype = options.dtypes.get(name)
    tail = b""
    with open(path, "rb") as fh:
        pos = end
        while pos > 0:
            step = min(pos, 1 << 20)
            pos -= step
            fh.seek(pos)
            block = fh.read(step) + tail
            lines = block.split(b"\n")
            tail = lines[0] if pos else b""
            for raw in reversed(lines[1:] if pos else lines):
                found = _nonempty_list(raw, name, dtype)
                if found is not None:
                    return found
    return None


def _nonempty_list(raw: bytes, name: str, dtype: str | None) -> tuple[np.dtype, tuple[int, ...]] | None:
    """What a non-empty list of field ``name`` on line ``raw`` sets the field's ``seen`` record to, if any."""
    if f'"{name}"'.encode() not in raw and b"\\" not in raw:
        return None
    try:
        obj = json.loads(raw.decode("utf-8").lstrip(BOM))
        value = obj.get(name) if isinstance(obj, dict) else None
        if not isinstance(value, list) or not value:
            return None
        arr = json_to_array(value, dtype)
    except (ValueError, RecursionError):  # a bad line is reported by the unit that holds it
        return None
    return (arr.dtype, arr.shape[1:]) if arr.ndim and arr.shape[0] else None


def _decode_line(text: str, where: str, options: SourceOptions, seen: _Seen) -> dict[str, np.ndarray]:
    try:
        obj, checked = loads(text)
    except json.JSONDecodeError as exc:
        what = exc.msg.removesuffix(" at")  # ("Invalid control character at": json's own message ends in "at")
        raise InputError(f"{where}: invalid JSON ({what} at column {exc.colno}); fix or remove the line") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply") from None
    except Refused as exc:
        raise InputError(f"{where}: the JSON object {exc}") from None
    if not isinstance(obj, dict):
        raise InputError(
            f'{where}: expected a JSON object ({{"field": [...], ...}}), found {type(obj).__name__}; '
            "each line must be one sample"
        )
    if options.fields is not None or options.drop_fields:
        options.select(list(obj), where)  # a named field missing is told before any value is converted
    sample: dict[str, Any] = {}
    bools = may_mix_bools(text)
    for name, value in obj.items():
        if not options.keeps(name):
            sample[name] = None  # left out by read_unit; kept here so that an absent named field is told apart
            continue
        if isinstance(value, str):
            sample[name] = value  # a text field
            continue
        dtype = options.dtypes.get(name)
        if isinstance(value, list) and not value and name in seen:
            known = seen[name]
            assert known is not None
            sample[name] = np.empty((0, *known[1]), dtype=known[0])
            continue
        try:
            arr = json_to_array(value, dtype, may_hold_bools=bools, infinity_written=checked)
        except ValueError as exc:
            raise InputError(f"{where}: field {name!r} {exc}") from None
        if arr.ndim and arr.shape[0]:
            seen[name] = (arr.dtype, arr.shape[1:])
        sample[name] = arr
    if not checked:
        try:
            check_tiny_numbers(text, (v for v in sample.values() if isinstance(v, np.ndarray)))
        except NumberRangeError as exc:
            raise InputError(f"{where}: the JSON object {exc}") from None
    return sample
