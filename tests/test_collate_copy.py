"""The collate's copy loop: byte copies give what numpy's slice assignments give, and the per-batch stamp check."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from shardload._base.identity import FileStamp, file_stamp, stamped
from shardload.formats import Columns, FieldData
from shardload.load.collate import byte_view, copy_slices, group_by_shard

DTYPES = ["int32", "int64", "uint8", "float16", "float32", "float64", "bool"]


def _reference(flat, values_of, shards, src, dst, pad_to, pad_value) -> None:  # type: ignore[no-untyped-def]
    """The copy as the contract states it, one sample at a time."""
    for i, s in enumerate(shards.tolist()):
        n = int(src[1][i] - src[0][i])
        flat[dst[i] : dst[i] + n] = values_of[s][src[0][i] : src[1][i]]
        if pad_to is not None:
            flat[dst[i] + n : pad_to[i]] = pad_value


def _case(dtype: str, inner: tuple[int, ...], shards_in_batch: int, seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    b, num_shards = 9, 3
    values_of = {}
    for s in range(num_shards):
        v = rng.integers(0, 2 if dtype == "bool" else 100, size=(200, *inner)).astype(dtype)
        values_of[s] = v
    shards = rng.integers(0, shards_in_batch, b).astype(np.int64)
    lengths = rng.integers(0, 12, b)
    lengths[0] = 0  # an empty sample copies nothing and is all padding
    starts = rng.integers(0, 180, b)
    l_pad = int(lengths.max()) + 2
    dst = np.arange(b, dtype=np.int64) * l_pad
    cols = {s: Columns(200, {"x": FieldData(v, None)}) for s, v in values_of.items()}
    return values_of, cols, shards, (starts, starts + lengths), dst, l_pad, b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inner", [(), (3,)])
@pytest.mark.parametrize("shards_in_batch", [1, 3])
@pytest.mark.parametrize("pad_after", [False, True])
def test_byte_copies_equal_numpy_slice_copies(
    dtype: str, inner: tuple[int, ...], shards_in_batch: int, pad_after: bool
) -> None:
    """Every dtype, inner shape, one or several shards, padding written after each sample or not."""
    values_of, cols, shards, src, dst, l_pad, b = _case(dtype, inner, shards_in_batch, seed=len(DTYPES) + len(inner))
    pad_value = {"bool": True, "float16": -1.5, "float32": float("nan")}.get(dtype, 7)
    pad_to = dst + l_pad if pad_after else None
    got = np.full((b * l_pad, *inner), 3, dtype=dtype)  # not zero: bytes the copy must leave alone stay 3
    want = got.copy()
    copy_slices(got, cols, group_by_shard(shards), "x", src, dst, pad_to, pad_value)
    _reference(want, values_of, shards, src, dst, pad_to, pad_value)
    assert got.tobytes() == want.tobytes()  # bytes: NaN padding compares equal too


def test_values_no_memoryview_can_copy_from_go_through_numpy() -> None:
    """Strided values, another dtype than the output (cast by numpy), datetime64: the numpy path, same result."""
    rng = np.random.default_rng(3)
    base = rng.integers(0, 100, size=400).astype(np.int32)
    cases = {
        "strided": (base[::2], np.int32),
        "other dtype": (base[:200].astype(np.int16), np.int32),
        "datetime64": (base[:200].astype("datetime64[s]"), "datetime64[s]"),
    }
    for what, (values, out_dtype) in cases.items():
        assert byte_view(values) is None or values.dtype != np.dtype(out_dtype), what
        cols = {0: Columns(200, {"x": FieldData(values, None)})}
        shards = np.zeros(5, np.int64)
        src = (np.array([0, 10, 20, 30, 40]), np.array([3, 10, 25, 31, 44]))
        dst = np.arange(5, dtype=np.int64) * 6
        got = np.zeros(30, dtype=out_dtype)
        want = got.copy()
        copy_slices(got, cols, group_by_shard(shards), "x", src, dst, dst + 6, 0)
        _reference(want, {0: values}, shards, src, dst, dst + 6, 0)
        assert np.array_equal(got, want), what


def test_byte_view_is_the_array_s_bytes_or_none() -> None:
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    view = byte_view(a)
    assert view is not None and view.tobytes() == a.tobytes() and len(view) == a.nbytes
    assert byte_view(a[:, :2]) is None  # not contiguous
    assert byte_view(np.array(["a", "b"], dtype=object)) is None
    assert byte_view(np.arange(3).astype("datetime64[D]")) is None
    assert byte_view(np.float32(1.0)) is None and byte_view([1, 2]) is None


def test_stamped_decides_what_comparing_a_new_stamp_decides(tmp_path: Path) -> None:
    """The per-batch check's shortcut agrees with ``file_stamp(st) == stamp`` for a change of any one field."""
    path = tmp_path / "shard"
    path.write_bytes(b"x" * 10)
    st = os.stat(path)
    stamp = file_stamp(st)
    assert stamped(st, stamp)
    changes: dict[str, object] = {
        "dev": stamp.dev + 1,
        "ino": stamp.ino + 1,
        "size": stamp.size - 1,
        "mtime_ns": stamp.mtime_ns + 1,
        "ctime_ns": stamp.ctime_ns + 1,
        "meta": (stamp.meta[0] ^ 0o100, *stamp.meta[1:]),
    }
    assert set(changes) == set(FileStamp._fields)  # a field added to the stamp must be added to the shortcut
    for name, value in changes.items():
        other = stamp._replace(**{name: value})
        assert stamped(st, other) is (file_stamp(st) == other) is False, name
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a write that moves mtime
    assert not stamped(os.stat(path), stamp)


@pytest.mark.parametrize("inner", [(), (3,)])
def test_a_batch_of_one_row_of_one_sample(inner: tuple[int, ...]) -> None:
    """An output of one row: its row size comes from its shape (a length-1 axis may carry any stride)."""
    values = np.arange(30 * int(np.prod(inner)), dtype=np.float32).reshape(30, *inner)
    cols = {0: Columns(30, {"x": FieldData(values, None)})}
    got = np.zeros((1, *inner), np.float32)
    copy_slices(
        got, cols, group_by_shard(np.zeros(1, np.int64)), "x", (np.array([7]), np.array([8])), np.zeros(1, np.int64)
    )
    assert got.tobytes() == values[7:8].tobytes()
