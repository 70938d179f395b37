"""JSON Lines (``.jsonl``, ``.ndjson``, gzipped ``.jsonl.gz``): one sample per line.

Each non-blank line is one JSON object; each of its entries is one field, in
the order they are written. Blank lines are skipped; line numbers in messages
count every physical line, from 1.

A plain file larger than ``SourceOptions.unit_bytes`` is read as several units,
byte ranges cut just after a newline (:func:`line_cuts`, one pass over the file
counting newlines, so that each unit knows the number of its first line). The
samples and their order are those of reading the file whole; a gzipped file
cannot be cut (its bytes can only be read from the start): it is one unit.
Prepare's ingest reads a plain file's blocks of lines with pyarrow's JSON
reader where that provably gives what the rules below give
(:mod:`~shardload.prepare.sources.jsonblocks`), and line by line otherwise.

How JSON values become arrays (JSON has no dtypes):

* a number becomes a 0-d array, a list of numbers a 1-D array, a list of
  equally long lists a 2-D array (``[[...], [...]]`` -> ``[rows, C]``), and so on;
* the dtype of a field named in ``--dtype FIELD=DTYPE`` (``SourceOptions.dtypes``)
  is that dtype, decoded directly (a float64 field is never rounded through
  float32);
* otherwise, integers become **int64** and floats **float32**; a list mixing
  integers and floats is float32, and its integers must fit float32 exactly
  as in a list of integers (``[16777217, 0.5]`` is refused, not rounded);
* either way the conversion follows :func:`shardload.schema.cast.cast_exact`: no value
  may change (``3.0`` may become an int32, ``3.5`` may not; ``300`` does not
  fit int8; ``16777217`` does not fit float32; a float may be rounded, but
  ``1e-50`` does not become ``0.0`` in float32, nor ``1e300`` ``inf``);
* ``true``/``false`` become **bool**; a list mixing booleans with numbers is
  refused unless ``--dtype`` names the field (then they count as 1/0);
* numbers a 64-bit float cannot hold (``1e400``, ``1e-400``: Python's parser
  makes them ``inf`` and ``0.0``) and a key given twice in one object (Python
  keeps the last) are refused;
* a line longer than ``SourceOptions.max_record_bytes`` (256 MiB) is refused
  before it is read whole;
* an empty list ``[]`` takes the dtype and inner shape of the same field on
  the last line of the same file where it was not empty (so ``[]`` in a
  ``[rows, 4]`` field is a ``[0, 4]`` array); before any such line, its dtype
  is ``--dtype`` or int64 and it is 1-D;
* ``null``, strings, objects and ragged nested lists are refused with an
  :class:`~shardload.errors.InputError` naming the file, line and field.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import mmap
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from shardload.errors import InputError
from shardload.prepare.sources.base import (
    Sample,
    SampleBatch,
    SourceOptions,
    SourceReader,
    SourceUnit,
    record_too_large,
    register,
)
from shardload.prepare.sources.jsonblocks import json_batches
from shardload.schema.cast import CastError, cast_exact
from shardload.schema.fields import Schema

__all__ = [
    "JsonlSource",
    "NumberRangeError",
    "check_tiny_numbers",
    "checked_float",
    "json_to_array",
    "line_cuts",
    "loads",
    "may_mix_bools",
]


class _Refused(ValueError):
    """A JSON value that is not numeric; the message says why (without the location)."""


class NumberRangeError(_Refused):
    """A number written in text that a 64-bit float cannot hold (it would become inf, or 0)."""


#: 300 zeros in a row: part of a number that may be too small for a float64 (0.000...1)
_ZEROS = "0" * 300
_NONZERO_DIGIT = re.compile(r"[1-9]")


def loads(text: str) -> tuple[Any, bool]:
    """Decode JSON text as :func:`json.loads`, refusing a key given twice in an object (the last would win).

    The common text takes the fast path of :func:`json.loads`; keys are
    compared only when one may repeat. With ``Infinity`` in the text, numbers
    are checked one by one (:func:`checked_float`), so that an ``inf`` in the
    value was written so.

    Returns:
        The value, and whether its numbers were checked. When not, an ``inf``
        in it is a number too large for a float64 (``1e400``) and a ``0.0`` may
        be one too small (``1e-400``): :func:`json_to_array` refuses the first,
        :func:`check_tiny_numbers` the second.

    Raises:
        json.JSONDecodeError, RecursionError: as :func:`json.loads`.
        ValueError: a key given twice, a number out of range (its message says which).
    """
    if "Infinity" in text:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_float=checked_float), True
    value = json.loads(text)
    # A sample's text holds quotes only around its keys (numbers need none), so a key written twice
    # shows as more quotes than the keys kept; an escaped quote or deeper strings take the exact path.
    if isinstance(value, dict) and ("\\" in text or text.count('"') != 2 * len(value)):
        json.loads(text, object_pairs_hook=_unique_keys)  # raises if a key repeats
    return value, False


def check_tiny_numbers(text: str, arrays: Iterable[np.ndarray]) -> None:
    """Refuse JSON ``text`` holding a nonzero number that a float64 made ``0.0`` (``1e-400``).

    ``arrays`` are the fields decoded from it: only a float 0 in them can be
    such a number, and only a negative exponent or 300 zeros in a row can write
    one, so most text is not parsed again.

    Raises:
        NumberRangeError: naming the number.
    """
    zero = any(a.dtype.kind == "f" and not a.all() for a in arrays)
    if zero and ("e-" in text or "E-" in text or _ZEROS in text):
        json.loads(text, parse_float=checked_float)


def checked_float(text: str) -> float:
    """``float(text)`` for a number written in JSON or a text member, refusing overflow to inf and underflow to 0.

    ``inf``, ``nan`` (any case and sign) are taken as written.
    """
    value = float(text)
    if math.isinf(value) and text.strip().lstrip("+-").lower() not in ("inf", "infinity"):
        raise NumberRangeError(f"holds the number {_short(text)}, beyond the largest 64-bit float: it would become inf")
    if value == 0.0 and _NONZERO_DIGIT.search(text.partition("e")[0].partition("E")[0]):
        raise NumberRangeError(f"holds the number {_short(text)}, too small for a 64-bit float: it would become 0")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Refused(f"has the key {twice!r} twice in one object (the last would silently win); remove one")
    return obj


def may_mix_bools(text: str) -> bool:
    """Whether JSON ``text`` may hold a list mixing booleans with numbers (most text cannot: no value is searched).

    True when a ``true``/``false`` follows ``[`` or ``,`` (an element of a list);
    found with substring searches, which cost far less than a regex that tries every comma.
    """
    for word in ("true", "false"):
        i = text.find(word)
        while i >= 0:
            j = i - 1
            while j >= 0 and text[j] in " \t\r\n":
                j -= 1
            if j >= 0 and text[j] in "[,":
                return True
            i = text.find(word, i + len(word))
    return False


def json_to_array(
    value: Any, dtype: str | np.dtype | None = None, *, may_hold_bools: bool = True, infinity_written: bool = True
) -> np.ndarray:
    """Convert a decoded JSON value (number, bool or nested lists of them) to an array.

    ``dtype`` forces the dtype; without it, integers are int64, floats float32,
    booleans bool and empty lists int64. Either way the conversion is
    :func:`~shardload.schema.cast.cast_exact`: it never changes a value silently. A
    list mixing ``true``/``false`` with numbers is refused without ``dtype``
    (JSON booleans are not numbers); with one, they count as 1/0.
    ``may_hold_bools=False`` (the JSON text holds no ``true``/``false`` in a
    list) skips looking for them; ``infinity_written=False`` (see :func:`loads`)
    refuses an ``inf``, which can then only come from a number too large.

    Raises:
        ValueError: the value is not numeric, is ragged, or does not fit ``dtype``;
            the message says which (the caller adds file and sample).

    >>> json_to_array([1, 2.5]).dtype
    dtype('float32')
    """
    try:
        arr = np.array(value)
    except ValueError:
        arr = np.empty(0, dtype=object)  # ragged: let _describe_object say where
    if arr.dtype.kind not in "biuf":
        raise _Refused(_describe_object(value))
    kind = arr.dtype.kind
    if kind == "f" and not infinity_written and np.isinf(arr).any():
        raise NumberRangeError(
            "holds a number beyond the largest 64-bit float (such as 1e400), which would become inf; "
            "write it within range, or as Infinity if inf is meant"
        )
    if dtype is None:
        if kind != "b" and may_hold_bools and isinstance(value, list) and _holds_bool(value):
            raise _Refused(
                "mixes true/false with numbers; JSON booleans are not numbers: write 0 and 1, or choose a dtype "
                "with --dtype (an integer or float dtype counts true as 1, bool takes 0 and 1)"
            )
        # numpy makes [] float64; JSON gave no hint, so it counts as integers
        kind = "i" if arr.size == 0 else kind
        target = {"b": np.dtype(bool), "i": np.dtype(np.int64), "u": np.dtype(np.int64), "f": np.dtype(np.float32)}[
            kind
        ]
    else:
        target = np.dtype(dtype)
    try:
        if kind == "f" and isinstance(value, list):
            return _cast_mixed(value, arr, target)
        return cast_exact(arr, target)
    except CastError as exc:
        default = "" if dtype is not None else f" (the default dtype of JSON {_KIND_NAMES[kind]})"
        raise _Refused(f"cannot be stored as {target}{default}: {exc} with --dtype") from None


def _cast_mixed(value: list[Any], arr: np.ndarray, target: np.dtype[Any]) -> np.ndarray:
    """``cast_exact(arr, target)`` for a list whose integers numpy put into float64 along with its fractions.

    In ``[16777217, 0.5]`` numpy makes the integer a float64 (and one beyond
    2**53 a rounded one), and a float may then be rounded to ``target``. An
    integer keeps the integer rule instead (it must fit ``target`` exactly), as
    it would in a list of integers. Only integral values too large for
    ``target`` to hold exactly can be such integers: lists without any (almost
    every list of fractions) are not looked at value by value.
    """
    bits = min(np.finfo(target).nmant + 1, 53) if target.kind == "f" else 53
    with np.errstate(invalid="ignore"):
        suspect = np.isfinite(arr) & (np.abs(arr) >= 2**bits) & (arr == np.trunc(arr))
    if not suspect.any():
        return cast_exact(arr, target)
    objects = np.array(value, dtype=object)
    is_int = np.frompyfunc(lambda v: type(v) is int, 1, 1)(objects).astype(bool)
    if not is_int.any():
        return cast_exact(arr, target)
    listed = objects[is_int].tolist()
    try:
        ints = np.array(listed)
    except OverflowError:
        ints = np.empty(0, dtype=object)
    if ints.dtype.kind not in "iu":  # beyond int64 and uint64, or both negative and beyond int64
        big = next((v for v in listed if not -(2**63) <= v < 2**63), listed[0])
        raise _Refused(
            f"holds the integer {big}, too large for 64 bits among numbers with a fraction; store it as a float"
        )
    whole = np.zeros(objects.shape, dtype=ints.dtype)
    whole[is_int] = ints
    exact = cast_exact(whole, target)  # names the first integer that does not fit, at its place in the list
    out = cast_exact(arr, target)
    out[is_int] = exact[is_int]
    return out


_KIND_NAMES = {"b": "booleans", "i": "integers", "u": "integers", "f": "numbers with a fraction or exponent"}


def _holds_bool(value: list[Any]) -> bool:
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if type(v) is bool:
            return True
        if isinstance(v, list):
            stack.extend(v)
    return False


def _describe_object(value: Any) -> str:
    """Why numpy could not make ``value`` into a numeric array, and what to do."""
    not_numeric = (
        "; a field holds numbers, or one string per sample (a text field): remove the field or encode it as numbers"
    )
    stack = [value]
    while stack:
        v = stack.pop()
        if v is None:
            return ("is null" if v is value else "holds a null") + "; fill in a value or drop the sample"
        if isinstance(v, (str, bytes)):
            inside = " inside a list" if v is not value else ""
            return f"holds text ({_short(v)}){inside}, which is not numeric" + not_numeric
        if isinstance(v, Mapping):
            return "holds a JSON object, not a number or a list of numbers" + not_numeric
        if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**64:
            return f"holds the integer {v}, too large for 64 bits; store it as a float"
        if isinstance(v, list):
            stack.extend(v)
    return "is a ragged nested list (inner lists differ in length); pad the inner lists to one length"


def _short(text: str | bytes) -> str:
    r = repr(text)
    return r if len(r) <= 40 else r[:37] + "..."


@register
class JsonlSource(SourceReader):
    kind: ClassVar[str] = "jsonl"
    suffixes: ClassVar[tuple[str, ...]] = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")

    @classmethod
    def make_units(cls, files: Sequence[str], options: SourceOptions) -> list[SourceUnit]:
        """One unit per file, or per byte range of a plain file larger than ``options.unit_bytes``."""
        units = []
        for path in files:
            try:
                size = os.stat(path).st_size
            except OSError:  # gone since it was listed: one unit, whose read reports it
                size = 0
            if path.lower().endswith(".gz") or size <= options.unit_bytes:
                units.append(SourceUnit(cls.kind, (path,)))
                continue
            units.extend(
                SourceUnit(cls.kind, (path,), (start, stop), lines, stop - start)
                for start, stop, lines in line_cuts(path, size, options.unit_bytes)
            )
        return units

    @classmethod
    def read(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
        for path in unit.files():
            yield from _read_file(path, options, unit.part, unit.first)

    @classmethod
    def read_batches(cls, unit: SourceUnit, options: SourceOptions, schema: Schema) -> Iterator[SampleBatch]:
        """Blocks of lines parsed by pyarrow where provably exact (:mod:`~shardload.prepare.sources.jsonblocks`);
        a gzipped file line by line."""
        for path in unit.files():

            def exact(part: tuple[int, int] | None, first: int, path: str = path) -> Iterator[tuple[str, Sample]]:
                return _read_file(path, options, part, first)

            if path.lower().endswith(".gz"):
                yield SampleBatch(None, lambda exact=exact: exact(unit.part, unit.first))  # type: ignore[misc]
            else:
                span = unit.part or (0, os.stat(path).st_size)
                yield from json_batches(path, span, unit.first, schema, options, exact)


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
    """Cut the file at ``path`` (``size`` bytes) into byte ranges of about ``unit_bytes``, just after newlines.

    Each cut is the first line boundary at least ``unit_bytes`` after the
    previous one (a line longer than that stays whole in one range); a last
    range of less than a quarter of ``unit_bytes`` joins the one before. The
    newlines are counted on the way (on the mapping, no line is decoded).

    Returns:
        ``(start, stop, lines before start)`` per range, covering the file.

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


def _open(path: str) -> io.BufferedIOBase:
    if path.lower().endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def _read_file(
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
                    raise InputError(
                        f"{where}: not valid UTF-8 (byte {exc.start + 1} of the line); "
                        "JSON Lines files must be UTF-8: re-encode the file"
                    ) from None
                if lineno == 1:
                    text = text.lstrip("\ufeff")
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
    in the lines before the range, last line first, so that ``[]`` becomes what it would in a whole-file read.

    The look-back happens only for an empty list of a field not yet seen in the range (rare: a field of
    empty lists right after a cut), and stops at the first line with a non-empty list of that field.
    """

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
        obj = json.loads(raw.decode("utf-8").lstrip("\ufeff"))
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
        raise InputError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno}); fix or remove the line") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply") from None
    except _Refused as exc:
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
