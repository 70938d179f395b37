"""Bad input to prepare, one row per fault: a precise InputError naming the sample, and no shard set.

The table complements the per-source tests in tests/prepare/test_sources.py
(which cover nulls, ragged JSON, odd Parquet types and WebDataset members).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardload


def tok(n: int, dtype: Any = np.int32) -> np.ndarray:
    return np.arange(n, dtype=dtype)


# name, samples for shardload.write, write options, fragments of the message
SAMPLE_FAULTS: list[tuple[str, list[Any], dict[str, Any], list[str]]] = [
    (
        "ragged inner shape",
        [{"f": np.zeros((3, 4), np.float32)}, {"f": np.zeros((2, 5), np.float32)}],
        {},
        ["sample 1", "'f'", "shape [2, 5]", "[L, 4]", "Only the first axis may vary"],
    ),
    (
        "mixed dtypes",
        [{"t": tok(3)}, {"t": tok(3, np.int64)}],
        {},
        ["sample 1", "'t'", "dtype int64", "earlier samples have int32", "--dtype t=int32"],
    ),
    (
        "missing field",
        [{"t": tok(3), "y": np.int64(1)}, {"t": tok(2)}],
        {},
        ["sample 1", "missing ['y']", "same fields"],
    ),
    ("unexpected field", [{"t": tok(3)}, {"t": tok(2), "z": tok(1)}], {}, ["sample 1", "unexpected ['z']"]),
    (
        "NaN with reject_nonfinite",
        [{"x": np.ones(3, np.float32)}, {"x": np.array([1, np.nan], np.float32)}],
        {"reject_nonfinite": True},
        ["sample 1", "'x'", "NaN or inf", "--reject-nonfinite"],
    ),
    (
        "inf with reject_nonfinite",
        [{"x": np.ones(3, np.float64)}, {"x": np.array([np.inf])}],
        {"reject_nonfinite": True},
        ["sample 1", "'x'", "NaN or inf"],
    ),
    (
        "object dtype",
        [{"t": tok(3)}, {"t": np.array([1, "a", None], dtype=object)}],
        {},
        ["sample 1", "'t'", "unsupported dtype object"],
    ),
    (
        "strings in a numeric field",
        [{"t": tok(3)}, {"t": np.array(["1", "2"])}],
        {},
        ["sample 1", "'t'", "unsupported dtype <U1"],
    ),
    ("complex numbers", [{"t": np.ones(2, np.complex64)}], {}, ["sample 0", "'t'", "unsupported dtype complex64"]),
    ("ragged nested list", [{"t": [[1, 2], [3]]}], {}, ["sample 0", "'t'"]),
    ("not a dict", [{"t": tok(3)}, [1, 2, 3]], {}, ["sample 1", "must be a dict", "list"]),
    ("empty dict", [{}], {}, ["sample 0", "non-empty dict"]),
    (
        "cast that overflows",
        [{"t": np.array([300], np.int64)}],
        {"dtypes": {"t": "int8"}},
        ["sample 0", "'t'", "cannot be cast to int8", "do not fit"],
    ),
    ("zero samples", [], {}, ["no samples"]),
]


@pytest.mark.parametrize(
    ("samples", "options", "fragments"), [row[1:] for row in SAMPLE_FAULTS], ids=[row[0] for row in SAMPLE_FAULTS]
)
def test_bad_samples_are_refused_by_name(
    tmp_path: Path, samples: list[Any], options: dict[str, Any], fragments: list[str]
) -> None:
    out = tmp_path / "out"
    with pytest.raises(shardload.InputError) as info:
        shardload.write(samples, out, progress=False, **options)
    msg = str(info.value)
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    # Invariant: a refused run leaves nothing that looks like a shard set
    assert not (out / "manifest.json").exists()


def test_empty_samples_are_allowed(tmp_path: Path) -> None:
    samples = [{"t": tok(0), "f": np.zeros((0, 3), np.float32)}, {"t": tok(2), "f": np.ones((1, 3), np.float32)}]
    shardload.write(samples, tmp_path / "out", shuffle=False, progress=False)
    ds = shardload.open(tmp_path / "out")
    assert ds[0]["t"].shape == (0,) and ds[0]["f"].shape == (0, 3)
    assert list(ds.lengths) == [0, 2]


def test_huge_single_sample_is_kept_whole(tmp_path: Path) -> None:
    # One sample far larger than a staging chunk and than the shard size target.
    big = np.arange(3_000_000, dtype=np.int64)  # 24 MB
    samples = [{"t": tok(5, np.int64)}, {"t": big}, {"t": tok(7, np.int64)}]
    shardload.write(samples, tmp_path / "out", shuffle=False, chunk_bytes=1 << 16, shard_size=1 << 20, progress=False)
    ds = shardload.open(tmp_path / "out")
    np.testing.assert_array_equal(ds[1]["t"], big)
    assert list(ds.lengths) == [5, 3_000_000, 7]


# -- files: zero samples, corrupt files ----------------------------------------------------------------
def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def parquet_bytes() -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"t": pa.array([np.arange(i + 1) for i in range(50)])}), buf)
    return buf.getvalue()


def tar_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(3):
            data = npy_bytes(np.arange(i + 1))
            info = tarfile.TarInfo(f"k{i}.t.npy")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def flip_middle(data: bytes) -> bytes:
    b = bytearray(data)
    for k in range(len(b) // 3, len(b) // 3 + 64):
        b[k] ^= 0xA5
    return bytes(b)


# name, file name, contents, fragments
FILE_FAULTS: list[tuple[str, str, Callable[[], bytes], list[str]]] = [
    ("empty jsonl", "a.jsonl", lambda: b"", ["no samples"]),
    ("blank-line jsonl", "a.jsonl", lambda: b"\n\n  \n", ["no samples"]),
    ("empty parquet", "a.parquet", lambda: _empty_parquet(), ["no samples"]),
    ("empty tar", "a.tar", lambda: _empty_tar(), ["no samples"]),
    ("non-UTF-8 jsonl", "a.jsonl", lambda: b'{"t": [1]}\n{"t": [2], "\xff": 1}\n', ["a.jsonl: line 2", "UTF-8"]),
    ("truncated npy", "a.npy", lambda: npy_bytes(np.arange(100))[:90], ["a.npy", "not a readable .npy"]),
    ("garbage npy", "a.npy", lambda: b"\x93NUMPY garbage", ["a.npy", "not a readable .npy"]),
    (
        "npy object array",
        "a.npy",
        lambda: npy_bytes(np.array([{"a": 1}], dtype=object)),
        ["a.npy", "pickled object array", "--allow-pickle"],
    ),
    ("truncated parquet", "a.parquet", lambda: parquet_bytes()[:-30], ["a.parquet", "Parquet"]),
    ("corrupt parquet page", "a.parquet", lambda: flip_middle(parquet_bytes()), ["a.parquet"]),
    ("truncated tar", "a.tar", lambda: tar_bytes()[:700], ["a.tar", "truncated"]),
    ("corrupt tar header", "a.tar", lambda: flip_middle(tar_bytes()), ["a.tar"]),
]


def _empty_parquet() -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"t": pa.array([], type=pa.list_(pa.int64()))}), buf)
    return buf.getvalue()


def _empty_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w"):
        pass
    return buf.getvalue()


@pytest.mark.parametrize(
    ("name", "make", "fragments"), [row[1:] for row in FILE_FAULTS], ids=[row[0] for row in FILE_FAULTS]
)
def test_bad_files_are_refused_by_name(
    tmp_path: Path, name: str, make: Callable[[], bytes], fragments: list[str]
) -> None:
    src = tmp_path / name
    src.write_bytes(make())
    before = src.read_bytes()
    out = tmp_path / "out"
    with pytest.raises(shardload.InputError) as info:
        shardload.prepare(src, out, progress=False)
    msg = str(info.value)
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    assert not (out / "manifest.json").exists()
    assert src.read_bytes() == before  # the input is never modified
