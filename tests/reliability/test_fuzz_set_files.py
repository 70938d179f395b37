"""Fuzz: hostile lengths indexes and hostile files in a shard set.

Whatever the index holds and whatever stands where a set file should be,
opening, inspecting, reading every sample and verifying give only
``ShardloadError``s, never a hang or a large allocation, and a set that reads
without error reads the true lengths.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardload
from shardload.sets.describe import describe
from shardload.sets.verify import verify

from .conftest import read_all, read_manifest, write_manifest
from .test_set_files import long_samples, no_hang

LENGTHS = [100, 40_000, 70_000, 5, 200, 0, 3]
INT_DTYPES = [f"{order}{kind}{size}" for order in "<>" for kind in "iu" for size in (1, 2, 4, 8)]


@pytest.fixture(scope="module")
def one_field_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One variable field, so that the index the planner uses is checked against every shard's offsets."""
    out = tmp_path_factory.mktemp("fuzz-index") / "set"
    shardload.write(long_samples(LENGTHS), out, num_shards=3, shuffle=False, progress=False)
    return out


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


@st.composite
def hostile_indexes(draw: st.DrawFn, truth: np.ndarray) -> bytes:
    """The bytes of a lengths.npy: true or perturbed values, any integer layout, maybe a damaged file."""
    values = truth.astype(object)
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(values) - 1))
        values[i] = draw(
            st.sampled_from([-1, 0, 1, 2**15, 2**31, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)])
            | st.integers(-(2**64), 2**64)
            | st.just(values[(i + 1) % len(values)])
        )
    if draw(st.booleans()):
        values = values[: draw(st.integers(0, len(values) + 2))]
    dtype = np.dtype(draw(st.sampled_from(INT_DTYPES)))
    info = np.iinfo(dtype)
    # What a writer with too narrow a type would store: the value modulo 2**bits, reinterpreted.
    wrapped = [((int(v) - info.min) % (1 << (8 * dtype.itemsize))) + info.min for v in values]
    data = npy_bytes(np.array(wrapped, dtype=dtype))
    damage = draw(st.sampled_from(["none", "none", "truncate", "append", "flip-header"]))
    if damage == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif damage == "append":
        data += draw(st.binary(min_size=1, max_size=16))
    elif damage == "flip-header":
        i = draw(st.integers(0, min(len(data), 128) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
    return data


def read_everything(root: Path) -> np.ndarray:
    """Open, inspect, read every sample, verify; the lengths the loader planned with."""
    ds = shardload.open(root)
    lengths = np.array(ds.lengths, dtype=np.int64)
    describe(root)
    read_all(root)
    report = verify(root)
    assert report.ok, report.problems
    return lengths


def test_hostile_lengths_indexes_raise_only_shardload_errors(one_field_set: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(one_field_set, tmp_path / "set"))
    truth = np.load(root / "lengths.npy")
    original = (root / "lengths.npy").read_bytes()

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(hostile_indexes(truth))
    def check(data: bytes) -> None:
        (root / "lengths.npy").write_bytes(data)
        tracemalloc.start()
        try:
            with no_hang():
                lengths = read_everything(root)
        except shardload.ShardloadError:
            return
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            (root / "lengths.npy").write_bytes(original)
            assert peak < 64 << 20, f"{peak} bytes allocated for a {len(data)}-byte index"
        # no error: then the plan is made from the true lengths, never from wrapped or edited ones
        np.testing.assert_array_equal(lengths, truth)

    check()


# -- whatever stands where a set file should be --------------------------------------------------------------
KINDS = ["fifo", "directory", "dev-zero", "dev-null", "outside", "missing", "empty", "truncated", "loop", "garbage"]
HOSTILE_NAMES = st.sampled_from(
    [
        "x" * 256,
        "/".join(["d" * 250] * 20),
        "manifest.json/x",
        "shards",
        "\udcff.arrow",
        "\ud800",
        "shards/./shard-000000.arrow",
        "lengths.npy",
    ]
) | st.text(st.characters(codec=None, exclude_characters="\0"), min_size=1, max_size=300)


@st.composite
def hostile_sets(draw: st.DrawFn, files: list[str]) -> dict[str, Any]:
    replaced = draw(st.dictionaries(st.sampled_from(files), st.sampled_from(KINDS), max_size=3))
    names = draw(st.dictionaries(st.integers(0, 3), HOSTILE_NAMES, max_size=2))
    return {"files": replaced, "names": names}


def make_hostile(root: Path, outside: Path, case: dict[str, Any]) -> list[Path]:
    """Apply ``case`` to the set at ``root``; the FIFOs made (for the watchdog to unblock)."""
    fifos = []
    if case["names"]:
        m = read_manifest(root)
        for k, name in case["names"].items():
            m["shards"][k]["file"] = name
        write_manifest(root, m)
    for name, kind in case["files"].items():
        path = root / name
        data = path.read_bytes() if path.is_file() else b""
        path.unlink(missing_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
            fifos.append(path)
        elif kind == "directory":
            path.mkdir()
        elif kind in ("dev-zero", "dev-null"):
            path.symlink_to("/dev/zero" if kind == "dev-zero" else "/dev/null")
        elif kind == "outside":
            (outside / path.name).write_bytes(data)
            path.symlink_to(outside / path.name)
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "truncated":
            path.write_bytes(data[: len(data) // 2])
        elif kind == "loop":
            path.symlink_to(path.name)
        elif kind == "garbage":
            path.write_bytes(os.urandom(len(data)))
    return fifos


def test_hostile_set_files_raise_only_shardload_errors(pristine: Path, tmp_path: Path) -> None:
    m = read_manifest(pristine)
    files = ["manifest.json", m["lengths"]["file"], *m["lengths"]["per_field"].values(), m["shards"][0]["file"]]
    outside = tmp_path / "outside"
    outside.mkdir()

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(hostile_sets(files))
    def check(case: dict[str, Any]) -> None:
        root = tmp_path / "set"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(pristine, root)
        try:
            fifos = make_hostile(root, outside, case)
        except (OSError, UnicodeError, json.JSONDecodeError):
            return  # the damage itself could not be made (the manifest was already replaced)
        for step in (lambda: read_all(root), lambda: describe(root), lambda: verify(root)):
            tracemalloc.start()
            try:
                with no_hang(fifo=fifos):
                    step()
            except shardload.ShardloadError:
                pass
            finally:
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
            assert peak < 64 << 20

    check()
