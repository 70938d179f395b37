"""numpy <-> pyarrow without pyarrow's conversions: the same arrays as theirs, and no import of pandas by prepare."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shardload.formats.arrow.arrays import arrow_of, numpy_of, one_string

REPO = Path(__file__).resolve().parents[2]

ARRAYS = [
    pa.array(np.arange(-5, 20, dtype=np.int64)),
    pa.array(np.arange(10, dtype=np.uint8)),
    pa.array(np.arange(10, dtype=np.int16)).slice(3, 4),
    pa.array(np.linspace(-1, 1, 9, dtype=np.float32)),
    pa.array(np.linspace(-1, 1, 9, dtype=np.float16)),
    pa.array(np.linspace(-1, 1, 9)).slice(2),
    pa.array([True, False, True, True, False, False, True, False, True, True, False]),
    pa.array([True, False, True, True, False, False, True, False, True, True, False]).slice(3, 6),
    pa.array(np.zeros(0, dtype=np.int32)),
    pa.array([], pa.bool_()),
    pa.array([[1, 2], [3]]).offsets,
    pa.array([[1, 2], [3], [4, 5, 6]], pa.large_list(pa.int64())).slice(1).offsets,
    pa.array([1, None, 3]),  # nulls: pyarrow's conversion
    pa.array(["a", "b"]),  # another type: pyarrow's conversion
]


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: f"{a.type}[{a.offset}:{a.offset + len(a)}]")
def test_numpy_of_is_to_numpy(arr: pa.Array) -> None:
    got, want = numpy_of(arr), arr.to_numpy(zero_copy_only=False)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "values",
    [
        np.arange(7, dtype=np.int64),
        np.arange(7, dtype=np.uint16),
        np.ones(3, np.float16),
        np.arange(9)[::2],
        np.zeros(0, np.int32),
    ],
    ids=lambda v: f"{v.dtype.str}-{v.flags.c_contiguous}",
)
def test_arrow_of_is_pa_array(values: np.ndarray) -> None:
    got, want = arrow_of(values), pa.array(values)
    assert got.type == want.type and got.equals(want)


def test_arrow_of_refuses_what_pa_array_refuses() -> None:
    with pytest.raises(pa.ArrowNotImplementedError):
        pa.array(np.array([1, 2], dtype=">i4"))
    with pytest.raises(pa.ArrowNotImplementedError):
        arrow_of(np.array([1, 2], dtype=">i4"))


@pytest.mark.parametrize("large", [True, False])
def test_one_string(large: bool) -> None:
    text = "data/ä b.jsonl"
    assert one_string(text, large=large).equals(pa.array([text], pa.large_string() if large else pa.string()))
    with pytest.raises(UnicodeEncodeError):
        one_string("a\udcff", large=large)  # as pa.array refuses it


def test_prepare_imports_no_pandas(tmp_path: Path) -> None:
    """pandas costs every worker 0.2-0.7 s of CPU to import; ingest and the writes never need it."""
    import pyarrow.parquet as pq

    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("".join(f'{{"tokens": [{i}, {i + 1}], "label": {i}}}\n' for i in range(300)))
    parquet = tmp_path / "a.parquet"
    pq.write_table(pa.table({"tokens": pa.array([[i, i + 1] for i in range(300)])}), parquet, row_group_size=100)
    script = (
        "import sys, shardload\n"
        "for src, out in zip(sys.argv[1::2], sys.argv[2::2]):\n"
        "    shardload.prepare(src, out, progress=False, unit_bytes=2000, num_shards=2)\n"
        "print(sorted(m for m in sys.modules if m == 'pandas' or m.startswith('pandas.')))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    args = [str(jsonl), str(tmp_path / "j"), str(parquet), str(tmp_path / "p")]
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
