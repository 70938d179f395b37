"""The one rule for changing a field's dtype: a cast may never change a value silently.

Every dtype change prepare makes goes through :func:`cast_exact` (``--dtype`` on
any source, JSON numbers, numbers in WebDataset text members). Allowed: casts
that hold every value of the source dtype; whole numbers within range to an
integer dtype; integers to a float that holds them exactly; floats to a narrower
float, rounded, unless a finite value would become ``inf`` or a nonzero one
``0``; 0 and 1 to bool. Anything else is refused (docs/cli.md, ``--dtype``).
A refusal is a :class:`CastError` naming the first value that would change and
where it is in the array; callers add the file, sample and field.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CastError", "cast_exact"]


class CastError(ValueError):
    """A cast that would change a value; the message names the value, without the location."""


def cast_exact(arr: np.ndarray, dtype: str | np.dtype[Any]) -> np.ndarray:
    """``arr`` as ``dtype``, or :class:`CastError` if any value would change (see the module doc).

    Checks cost a few vectorised passes, and only for casts that can lose values.

    >>> cast_exact(np.array([3.0]), "int32")
    array([3], dtype=int32)
    >>> cast_exact(np.array([2**24 + 1]), "float32")
    Traceback (most recent call last):
    ...
    shardload.schema.cast.CastError: values do not fit float32: 16777217 (int64 at index 0) would become 16777216.0; ...
    """
    target = np.dtype(dtype)
    src = arr.dtype
    if src == target:
        return arr
    if src.kind not in "biuf" or target.kind not in "biuf":
        raise CastError(f"{src} values cannot become {target}")
    if _always_exact(src, target):
        return arr.astype(target)
    if target.kind == "b":
        _refuse(arr, (arr != 0) & (arr != 1), f"only 0 and 1 can become {target}", "choose a numeric dtype")
        as_bool: np.ndarray = arr != 0
        return as_bool
    if target.kind in "iu":
        return _to_integer(arr, target)
    if src.kind in "iu":
        return _int_to_float(arr, target)
    return _float_to_float(arr, target)


def _always_exact(src: np.dtype[Any], target: np.dtype[Any]) -> bool:
    """Whether every value of ``src`` is a value of ``target`` (numpy's "safe" casts are not all exact)."""
    if src.kind == "b":
        return True
    if src.kind in "iu" and target.kind == "f":  # numpy calls int64 -> float64 safe; 2**53 + 1 says otherwise
        value_bits = 8 * src.itemsize - (src.kind == "i")
        return value_bits <= np.finfo(target).nmant + 1
    return bool(np.can_cast(src, target, casting="safe"))


def _to_integer(arr: np.ndarray, target: np.dtype[Any]) -> np.ndarray:
    if arr.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            fraction = ~np.isfinite(arr) | (arr != np.trunc(arr))
        _refuse(arr, fraction, f"values are not integers, which {target} cannot hold", "choose a float dtype")
    if arr.size:
        info = np.iinfo(target)
        # Python scalars compare exactly (an int64 against a float, a uint64 against a negative bound)
        lo, hi = arr.min().item(), arr.max().item()
        if lo < info.min or hi > info.max:
            if arr.dtype.kind == "f":  # the bounds as floats: powers of two, so exact (or inf) in any float dtype
                with np.errstate(over="ignore"):
                    outside = (arr < float(info.min)) | (arr >= float(info.max + 1))
            else:
                outside = _outside_int(arr, info)
            _refuse(
                arr,
                outside,
                f"values do not fit {target} (range [{info.min}, {info.max}])",
                "choose a dtype that holds them",
            )
    with np.errstate(invalid="ignore"):
        return arr.astype(target)


def _outside_int(arr: np.ndarray, info: np.iinfo) -> np.ndarray:
    """Which integers lie outside ``info``'s range, compared without rounding through a float."""
    # bounds clipped to the source's range, so that numpy compares them in the source dtype
    src = np.iinfo(arr.dtype)
    return ~((arr >= max(info.min, src.min)) & (arr <= min(info.max, src.max)))


def _int_to_float(arr: np.ndarray, target: np.dtype[Any]) -> np.ndarray:
    with np.errstate(over="ignore"):
        out = arr.astype(target)
    if not arr.size:
        return out
    exact = 2 ** (np.finfo(target).nmant + 1)  # every integer up to this magnitude is a float of target
    if -exact <= arr.min().item() and arr.max().item() <= exact:
        return out
    # Round trip through the source dtype, which is exact for finite floats within its range. The bounds are
    # powers of two, so they are floats of any dtype (or inf, when beyond it).
    bits = 8 * arr.dtype.itemsize
    lo, hi = (0.0, 2.0**bits) if arr.dtype.kind == "u" else (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1))
    with np.errstate(over="ignore"):  # a bound beyond a float16 is inf there, which is what is meant
        inside = np.isfinite(out) & (out >= lo) & (out < hi)
    changed = ~inside.reshape(-1)
    flat_in = inside.reshape(-1)
    changed[flat_in] = out.reshape(-1)[flat_in].astype(arr.dtype) != arr.reshape(-1)[flat_in]
    _refuse(arr, changed, f"values do not fit {target}", "choose an integer dtype or a wider float", out=out)
    return out


def _float_to_float(arr: np.ndarray, target: np.dtype[Any]) -> np.ndarray:
    with np.errstate(over="ignore"):
        out = arr.astype(target)
    # Cheap tests first: most arrays hold no inf, and zeros only where the source has them.
    overflow = np.isinf(out).any() and (np.isinf(out) & np.isfinite(arr)).any()
    underflow = (out == 0).any() and ((out == 0) & (arr != 0)).any()
    if overflow or underflow:
        info = np.finfo(target)
        why = f"values overflow {target} (its largest value is {info.max})"
        _refuse(arr, np.isinf(out) & np.isfinite(arr), why, "choose a wider dtype", out=out)
        why = f"values underflow {target} (its smallest nonzero value is {info.smallest_subnormal})"
        _refuse(arr, (out == 0) & (arr != 0), why, "choose a wider dtype", out=out)
    return out


def _refuse(arr: np.ndarray, bad: np.ndarray, why: str, hint: str, *, out: np.ndarray | None = None) -> None:
    """Raise :class:`CastError` naming the first value of ``arr`` flagged in ``bad``, if any."""
    if not bad.any():
        return
    first = int(np.flatnonzero(bad)[0])
    where = tuple(int(i) for i in np.unravel_index(first, arr.shape)) if arr.ndim > 1 else first
    value = arr.reshape(-1)[first].item()
    becomes = f" would become {out.reshape(-1)[first].item()!r}" if out is not None else ""
    count = int(np.count_nonzero(bad))
    more = f" ({count} values in all)" if count > 1 else ""
    raise CastError(f"{why}: {value!r} ({arr.dtype} at index {where}){becomes}{more}; {hint}")
