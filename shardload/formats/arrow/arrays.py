"""numpy arrays to pyarrow arrays and back, without pyarrow's own conversions, which import pandas.

``pa.array(...)``, ``Array.to_numpy()`` and ``np.asarray(array)`` import pandas on their first call in a
process (0.2-0.7 s of CPU time, paid again by every worker of a prepare). Prepare only ever converts
primitive arrays without nulls, whose values buffer these functions wrap or map directly: the same
dtype, values and buffers as pyarrow's conversion.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["arrow_of", "numpy_of", "one_string", "strings"]


def arrow_of(values: np.ndarray) -> pa.Array:
    """``pa.array(values)`` for a 1-d array: its buffer wrapped (no copy) where it is contiguous, native numeric."""
    if values.ndim == 1 and values.dtype.kind in "iuf" and values.dtype.isnative and values.flags.c_contiguous:
        return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])
    out: pa.Array = pa.array(values)
    return out


def strings(values: Sequence[str], *, large: bool) -> pa.Array:
    """``pa.array(values, pa.large_string() if large else pa.string())``, built from its buffers."""
    data = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(data) + 1, dtype=np.int64 if large else np.int32)
    np.cumsum([len(d) for d in data], out=offsets[1:])
    cls = pa.LargeStringArray if large else pa.StringArray
    out: pa.Array = cls.from_buffers(len(data), pa.py_buffer(offsets), pa.py_buffer(b"".join(data)))
    return out


def one_string(text: str, *, large: bool) -> pa.Array:
    """``pa.array([text], pa.large_string() if large else pa.string())``."""
    return strings([text], large=large)


def numpy_of(arr: pa.Array) -> np.ndarray:
    """``arr.to_numpy(zero_copy_only=False)``, for an array without nulls: the same dtype and values.

    Integers and floats are a read-only view of the values buffer; booleans are unpacked from their bits;
    any other type goes through pyarrow's conversion.
    """
    t = arr.type
    if arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        kind = "f" if pa.types.is_floating(t) else "i" if pa.types.is_signed_integer(t) else "u"
        dtype = np.dtype(f"{kind}{t.bit_width // 8}")
        data = arr.buffers()[1]
        if data is None:
            return np.zeros(0, dtype=dtype)
        return np.frombuffer(data, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    if arr.null_count == 0 and pa.types.is_boolean(t):
        data = arr.buffers()[1]
        if data is None or not len(arr):
            return np.zeros(0, dtype=np.bool_)
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        return bits[arr.offset : arr.offset + len(arr)].astype(np.bool_)
    out: np.ndarray = arr.to_numpy(zero_copy_only=False)
    return out
