"""How a decoded JSON value becomes an array: the rules of docs/format.md, "JSON Lines", implemented once.

Used by both paths of the JSON Lines reader and by WebDataset ``.json``/``.txt`` members.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from shardload.schema.cast import CastError, cast_exact

#: the dtype of each kind of JSON value when ``--dtype`` names none (an empty list counts as integers)
DEFAULT_DTYPES = {"b": np.dtype(bool), "i": np.dtype(np.int64), "u": np.dtype(np.int64), "f": np.dtype(np.float32)}


class Refused(ValueError):
    """A JSON value that is not numeric; the message says why (without the location)."""


class NumberRangeError(Refused):
    """A number written in text that a 64-bit float cannot hold (it would become inf, or 0)."""


#: 300 zeros in a row: part of a number that may be too small for a float64 (0.000...1)
_ZEROS = "0" * 300
_NONZERO_DIGIT = re.compile(r"[1-9]")


def loads(text: str) -> tuple[Any, bool]:
    """Decode JSON text as :func:`json.loads`, refusing a key given twice in an object (the last would win).

    Returns the value, and whether its numbers were checked one by one (only with ``Infinity`` in the
    text). When not, an ``inf`` in it is a number too large for a float64 (``1e400``), which
    :func:`json_to_array` refuses, and a ``0.0`` may be one too small, which :func:`check_tiny_numbers` refuses.

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

    Text is parsed again only when ``arrays`` (the fields decoded from it) hold a float 0 and the text
    a negative exponent or 300 zeros in a row.

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
        raise Refused(f"has the key {twice!r} twice in one object (the last would silently win); remove one")
    return obj


def may_mix_bools(text: str) -> bool:
    """Whether JSON ``text`` may hold a list mixing booleans with numbers: a ``true``/``false`` after ``[`` or ``,``."""
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
    """Convert a decoded JSON value (number, bool or nested lists of them) to an array, by the rules of
    docs/format.md, "JSON Lines" (``dtype`` is the field's ``--dtype``, if any).

    ``may_hold_bools=False`` skips looking for booleans in lists; ``infinity_written=False`` (see
    :func:`loads`) refuses an ``inf``.

    Raises:
        ValueError: not numeric, ragged, or not fitting ``dtype`` (the caller adds file and sample).

    >>> json_to_array([1, 2.5]).dtype
    dtype('float32')
    """
    try:
        arr = np.array(value)
    except ValueError:
        arr = np.empty(0, dtype=object)  # ragged: let _describe_object say where
    if arr.dtype.kind not in "biuf":
        raise Refused(_describe_object(value))
    kind = arr.dtype.kind
    if kind == "f" and not infinity_written and np.isinf(arr).any():
        raise NumberRangeError(
            "holds a number beyond the largest 64-bit float (such as 1e400), which would become inf; "
            "write it within range, or as Infinity if inf is meant"
        )
    if dtype is None:
        if kind != "b" and may_hold_bools and isinstance(value, list) and _holds_bool(value):
            raise Refused(
                "mixes true/false with numbers; JSON booleans are not numbers: write 0 and 1, or choose a dtype "
                "with --dtype (an integer or float dtype counts true as 1, bool takes 0 and 1)"
            )
        # numpy makes [] float64; JSON gave no hint, so it counts as integers
        kind = "i" if arr.size == 0 else kind
        target = DEFAULT_DTYPES[kind]
    else:
        target = np.dtype(dtype)
    try:
        if kind == "f" and isinstance(value, list):
            return _cast_mixed(value, arr, target)
        return cast_exact(arr, target)
    except CastError as exc:
        default = "" if dtype is not None else f" (the default dtype of JSON {_KIND_NAMES[kind]})"
        raise Refused(f"cannot be stored as {target}{default}: {exc} with --dtype") from None


def _cast_mixed(value: list[Any], arr: np.ndarray, target: np.dtype[Any]) -> np.ndarray:
    """``cast_exact(arr, target)`` for a list whose integers numpy put into float64 along with its fractions.

    An integer keeps the integer rule (it must fit ``target`` exactly: ``[16777217, 0.5]`` to float32 is
    refused), as in a list of integers. Only lists with integral values too large for ``target`` are
    looked at value by value.
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
        raise Refused(
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
