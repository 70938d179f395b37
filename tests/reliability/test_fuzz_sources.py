"""Fuzz the source readers with malformed bytes: only shardload's own errors may come out.

Each example takes a valid file of one kind, damages it (flipped bytes, a cut,
inserted junk), and reads it the way prepare does: decode every sample, infer
the schema from the first and check the others against it. The readers may
accept a damaged file whose samples still decode (a flipped byte in a value),
but anything they refuse must be an :class:`~shardload.InputError`.

``SHARDLOAD_FUZZ_EXAMPLES`` raises the number of examples for a longer hunt.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardload
from shardload.prepare.sources import SourceOptions, SourceUnit, read_unit
from shardload.schema.fields import Schema

EXAMPLES = int(os.environ.get("SHARDLOAD_FUZZ_EXAMPLES", "100"))


def npy_file() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.arange(40, dtype=np.float32).reshape(10, 4))
    return buf.getvalue()


def npz_file() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, t=np.arange(12, dtype=np.int32), y=np.int64(3))
    return buf.getvalue()


def jsonl_file() -> bytes:
    lines = [json.dumps({"t": list(range(i)), "f": [[0.5] * 3] * (i % 3 + 1), "y": i}) for i in range(12)]
    return ("\n".join(lines) + "\n").encode()


def parquet_file() -> bytes:
    buf = io.BytesIO()
    table = pa.table({"t": pa.array([np.arange(i % 9) for i in range(60)]), "y": pa.array(np.arange(60))})
    pq.write_table(table, buf, row_group_size=20)
    return buf.getvalue()


def tar_file() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(4):
            arr = io.BytesIO()
            np.save(arr, np.arange(i + 1, dtype=np.int16))
            for name, data in (
                (f"k{i}.t.npy", arr.getvalue()),
                (f"k{i}.cls", str(i).encode()),
                (f"k{i}.json", json.dumps({"m": [1.5, 2]}).encode()),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


KINDS: dict[str, tuple[str, str, Callable[[], bytes]]] = {
    "npy": ("npy", "x.npy", npy_file),
    "npz": ("npz", "x.npz", npz_file),
    "jsonl": ("jsonl", "x.jsonl", jsonl_file),
    "jsonl.gz": ("jsonl", "x.jsonl.gz", lambda: gzip.compress(jsonl_file(), mtime=0)),
    "parquet": ("parquet", "x.parquet", parquet_file),
    "webdataset": ("webdataset", "x.tar", tar_file),
}


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        what = draw(st.sampled_from(["flip", "flip", "cut", "insert", "zero"]))
        pos = draw(st.integers(0, max(len(b) - 1, 0)))
        if what == "flip" and b:
            b[pos] ^= draw(st.integers(1, 255))
        elif what == "cut":
            del b[pos:]
        elif what == "insert":
            b[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif what == "zero":
            b[pos : pos + draw(st.integers(1, 64))] = bytes(len(b[pos : pos + 64]))
    return bytes(b)


def read_like_prepare(kind: str, path: Path) -> int:
    """Decode and check every sample of ``path`` as prepare would; returns the sample count."""
    schema = None
    n = 0
    for where, sample in read_unit(SourceUnit(kind, (str(path),)), SourceOptions()):
        if schema is None:
            schema = Schema.infer(sample, where=where)
        schema.check(sample, where=where)
        n += 1
    return n


@pytest.mark.parametrize("name", list(KINDS))
def test_damaged_source_files_raise_only_input_errors(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    kind, file_name, make = KINDS[name]
    original = make()
    path = tmp_path_factory.mktemp(f"fuzz-{name}") / file_name
    path.write_bytes(original)
    assert read_like_prepare(kind, path) > 0  # the undamaged file reads

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize="SHARDLOAD_FUZZ_EXAMPLES" not in os.environ,
    )
    @given(damaged(original))
    def check(data: bytes) -> None:
        path.write_bytes(data)
        try:
            read_like_prepare(kind, path)
        except shardload.InputError:
            pass  # Invariant: refusals are InputErrors (anything else fails the test)

    check()
