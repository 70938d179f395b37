"""Checks of the planner's inputs: bad input raises a PlanError saying what to do.

Kept apart from the algorithms so that they can assume clean input: a 1-D
integer lengths index with values in ``[0, MAX_LENGTH]``, shard sizes that add up to it,
and integer options in range.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from typing import ParamSpec, TypeVar

import numpy as np
from numpy.typing import NDArray

from shardload.errors import PlanError, ShardloadError

__all__ = [
    "MAX_EPOCH",
    "MAX_LENGTH",
    "MAX_SEED",
    "MAX_WORLD_SIZE",
    "check_arrays",
    "check_bool",
    "check_rank",
    "check_real",
    "check_scalar",
    "keywords_checked",
    "unknown_keywords",
    "with_shortcuts",
]

#: Largest world size: planning computes every rank's batch count, O(world size) per epoch
#: (about 8 s at 65,536 ranks, 100 s at 2^20), and a plan summary is one row per rank.
MAX_WORLD_SIZE = 1 << 20
#: Seeds and epochs are hashed as 64-bit values; larger ones are refused, not wrapped.
MAX_SEED = (1 << 64) - 1
MAX_EPOCH = (1 << 63) - 1
#: Longest sample length: far beyond any real sample, and small enough that rows x padded length and
#: the token sums of a plan stay in int64. A shard set's lengths index is bounded by the same value.
MAX_LENGTH = 1 << 40


def check_scalar(
    name: str, value: object, *, low: int, high: int, hint: str = "", error: type[ShardloadError] = PlanError
) -> int:
    """``value`` as a plain int in ``[low, high]``, else ``error`` (:class:`PlanError`) naming ``name``.

    Bools and floats are refused, even integral ones: ``batch_size=True`` or
    ``seed=1e20`` is a mistake, not a number to round.
    """
    tail = f"; {hint}" if hint else ""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise error(f"{name} must be an integer, got {value!r} ({type(value).__name__}){tail}")
    if value < low:
        raise error(f"{name} must be >= {low}, got {value}{tail}")
    if value > high:
        raise error(f"{name} must be at most {high:,}, got {value}{tail}")
    return int(value)


def check_real(
    name: str, value: object, *, low: float, high: float, hint: str = "", error: type[ShardloadError] = PlanError
) -> float:
    """``value`` as a float in ``[low, high]``, else ``error`` (:class:`PlanError`) naming ``name``.

    Ints and floats are accepted; bools, strings and NaN are refused.

    >>> check_real("jitter", 1, low=0.0, high=1.0)
    1.0
    """
    tail = f"; {hint}" if hint else ""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise error(f"{name} must be a number, got {value!r} ({type(value).__name__}){tail}")
    number = float(value)
    if math.isnan(number) or not low <= number <= high:
        raise error(f"{name} must be between {low:g} and {high:g}, got {value!r}{tail}")
    return number


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool, else :class:`PlanError` (``pin_memory="no"`` is true in Python)."""
    if not isinstance(value, (bool, np.bool_)):
        raise PlanError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_rank(rank: object, world_size: int) -> int:
    """``rank`` as an int in ``[0, world_size)``, else :class:`PlanError`."""
    value = check_scalar("rank", rank, low=0, high=MAX_WORLD_SIZE - 1)
    if value >= world_size:
        raise PlanError(f"rank={value} is out of range for world_size={world_size}: use 0 <= rank < world_size")
    return value


def check_arrays(lengths: object, shard_sizes: object) -> tuple[NDArray[np.integer], NDArray[np.int64], int]:
    """``(lengths, shard_sizes, max_length)`` checked against each other, else :class:`PlanError`.

    ``(N,)`` lengths, not copied (a memory map stays one; read once for min and
    max), ``(S,)`` sizes as int64, and the longest length (0 if ``N == 0``).
    """
    lens = lengths if isinstance(lengths, np.ndarray) else np.asarray(lengths)
    if lens.ndim != 1:
        raise PlanError(f"lengths must be a 1-D array (one length per sample), got shape {lens.shape}")
    if lens.size == 0:
        lens = lens.astype(np.int64)  # np.asarray([]) is float64
    if not np.issubdtype(lens.dtype, np.integer):
        raise PlanError(f"lengths must hold integers, got dtype {lens.dtype}: cast with .astype(np.int64)")
    sizes = np.asarray(shard_sizes)
    if sizes.size == 0:
        sizes = sizes.astype(np.int64)
    if sizes.ndim != 1 or not np.issubdtype(sizes.dtype, np.integer):
        raise PlanError(
            f"shard_sizes must be a 1-D integer array (samples per shard), got shape {sizes.shape} dtype {sizes.dtype}"
        )
    if sizes.dtype.kind == "u" and sizes.size and int(sizes.max()) > np.iinfo(np.int64).max:
        shard = int(np.argmax(sizes))
        raise PlanError(f"shard_sizes[{shard}] = {int(sizes[shard])} is too large: sizes count samples")
    sizes = sizes.astype(np.int64)
    if sizes.size and sizes.min() < 0:
        shard = int(np.argmin(sizes))
        raise PlanError(f"shard_sizes[{shard}] = {sizes[shard]} is negative: sizes count samples")
    if int(sizes.sum()) != len(lens):
        raise PlanError(
            f"shard_sizes add up to {int(sizes.sum())} samples but lengths has {len(lens)}: "
            "pass the lengths index and shard sizes of the same shard set"
        )
    if len(lens) == 0:
        return lens, sizes, 0
    if lens.min() < 0:
        sample = int(np.argmin(lens))
        raise PlanError(f"lengths[{sample}] = {lens[sample]} is negative: lengths must be >= 0")
    longest = lens.max()
    if longest > MAX_LENGTH:
        sample = int(np.argmax(lens))
        raise PlanError(
            f"lengths[{sample}] = {longest} is beyond the longest length a sample may have (2**40 = {MAX_LENGTH:,}): "
            "the lengths are not per-sample lengths (bytes? an uninitialised array?)"
        )
    return lens, sizes, int(longest)


T = TypeVar("T")


def with_shortcuts(
    given: T | None,
    cls: type[T],
    owner: str,
    *,
    defaults: Mapping[str, object] | None = None,
    open_fields: tuple[str, ...] = (),
    **shortcuts: object,
) -> T:
    """An option object from its keyword ``owner=`` (``given``) and its shortcut keywords, which must agree.

    ``None`` means not passed. Without an object, ``cls(**defaults, **shortcuts
    given)`` builds it. With one, a shortcut that differs from its field is a
    :class:`PlanError` (never silently ignored), and one that equals it is
    still checked as that field (``batch_size=True`` beside
    ``Batching(batch_size=1)`` is refused, as alone); so is a ``given`` that is
    not a ``cls``. A field named in ``open_fields`` that the object leaves
    ``None`` (where that means "the caller's default":
    ``LoaderOptions.num_workers``) takes the shortcut, else its ``defaults``
    value.
    """
    passed = {name: value for name, value in shortcuts.items() if value is not None}
    if given is None:
        return cls(**{**(defaults or {}), **passed})
    if not isinstance(given, cls):
        raise PlanError(
            f"{owner} must be a shardload.{cls.__name__}, got {type(given).__name__}: e.g. {owner}={cls.__name__}(...)"
        )
    unset = {
        name for name in open_fields if getattr(given, name) is None and (name in passed or name in (defaults or {}))
    }
    clash = [
        f"{name}={value!r}" for name, value in passed.items() if name not in unset and getattr(given, name) != value
    ]
    if clash:
        raise PlanError(
            f"{', '.join(clash)} disagrees with {owner}={given!r}: give each option once, in {owner}= or as a keyword"
        )
    filled = {name: passed.get(name, (defaults or {}).get(name)) for name in unset}
    checked = dataclasses.replace(given, **{**passed, **filled})  # type: ignore[type-var]  # the fields' own checks
    return checked if filled else given


def unknown_keywords(owner: str, given: Iterable[str], known: Iterable[str], homes: Mapping[str, type]) -> str | None:
    """What to say of keywords ``owner`` does not take, or ``None`` when it takes them all.

    A keyword that is a field of one of the option classes in ``homes`` (keyword -> class) moved into that
    object: the message shows the new spelling (``batching=Batching(bucketing=...)``); any other is named with
    the closest keywords ``owner`` does take.
    """
    known = list(known)
    lines = []
    for name in (n for n in given if n not in known):
        home = next((kw for kw, cls in homes.items() if name in {f.name for f in dataclasses.fields(cls)}), None)
        if home is not None:
            cls = homes[home].__name__
            lines.append(f"{name}= is a field of {cls} now: pass {home}={cls}({name}=...)")
        else:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            lines.append(f"{owner} takes no keyword {name}={hint}")
    return "; ".join(lines) or None


P = ParamSpec("P")
R = TypeVar("R")


def keywords_checked(owner: str, **homes: type) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Refuse a keyword the function does not take with a :class:`PlanError` that says what to write instead.

    Python's own refusal is a bare ``TypeError`` that cannot show where an option moved; this one names the
    option object a keyword belongs to now (``homes``: keyword -> option class, see :func:`unknown_keywords`).
    """

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        known = list(inspect.signature(fn).parameters)
        taken = set(known)

        @functools.wraps(fn)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            if not kwargs.keys() <= taken:
                raise PlanError(unknown_keywords(owner, kwargs, known, homes) or "")
            return fn(*args, **kwargs)

        return checked

    return wrap
