"""What a field value that is not an array is, in the words of a message (``None``, a dict, a list holding None).

Where it sits: :func:`shardload.schema.fields.as_array` names what it could not convert with
:func:`describe_object_array`; the map step (:mod:`shardload.prepare.mapping`) refuses a returned
value with :func:`describe_non_array` before any conversion, so the message blames the map.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["FIELD_HOLDS", "describe_non_array", "describe_object_array", "describe_ragged"]

#: what a field may hold, for messages
FIELD_HOLDS = (
    "a field holds an array (a list of numbers, a numpy array or a torch tensor; a number for a fixed field) "
    "or text (one str or bytes per sample)"
)

#: values taken as they are, or converted, by ``as_array``: never refused by their type alone
_ARRAY_LIKE = (str, bytes, bytearray, memoryview, numbers.Number, np.ndarray, np.generic, list, tuple)


def describe_non_array(value: Any) -> str | None:
    """What ``value`` is when its type alone says no field can hold it, else ``None``; a type test, no conversion.

    >>> describe_non_array(None), describe_non_array({"a": 1}), describe_non_array([1, 2])
    ('None', 'a dict', None)
    """
    if value is None:
        return "None"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__}"
    if isinstance(value, (set, frozenset)):
        return f"a {type(value).__name__} (which has no order)"
    if isinstance(value, _ARRAY_LIKE):
        return None
    # what numpy converts as data: a tensor, a pyarrow or JAX array, any sequence
    if any(hasattr(value, a) for a in ("__array__", "__array_interface__", "__array_struct__", "__len__")):
        return None
    return f"an object of type {type(value).__qualname__}"


def describe_object_array(value: Any, arr: np.ndarray) -> str:
    """What ``value`` is, given that numpy made it ``arr`` of dtype object: ``None``, ``a list holding None (at
    index 1)``, ... (the first item that is not a number is named)."""
    if arr.ndim == 0:
        return describe_non_array(value) or f"an object of type {type(value).__qualname__}"
    container = type(value).__name__
    for i, item in enumerate(arr.flat):
        if isinstance(item, (numbers.Number, np.generic)) and not isinstance(item, (str, bytes)):
            continue
        what = describe_non_array(item) or (f"text ({item!r:.40})" if isinstance(item, (str, bytes)) else None)
        if what is None:
            what = f"a {type(item).__name__} inside"
        return f"a {container} holding {what} (at index {i})"
    return f"a {container} of Python objects"


def describe_ragged(value: Any) -> str:
    """What a nested list numpy could not make one array of is."""
    return (
        f"a ragged nested {type(value).__name__} (its inner lists differ in length): pad them to one length, or "
        "make it one flat list"
    )
