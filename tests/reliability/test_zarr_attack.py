"""The Zarr read path (a read-only mapping of each shard, a shared decoded-chunk cache) under misuse.

What a careless or hostile user can do to a Zarr shard set while it is read:
write into the arrays it hands out, open many shards under a low file
descriptor limit, fork after chunks were cached, compare it with the same
samples in Arrow. Each test names what it once broke, or what it guards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload import Batching, ZarrOptions, make_loader

pytest.importorskip("zarr")

COMPRESSIONS = ["none", "zstd", "blosc-lz4"]


def samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Variable tokens (some empty), a bool mask, float16 rows with an inner shape, a fixed label."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(0, 40))
        out.append(
            {
                "tokens": rng.integers(0, 1000, length).astype(np.int32),
                "mask": rng.random(length) > 0.5,
                "img": rng.random((length, 3)).astype(np.float16),
                "label": np.int64(i),
            }
        )
    return out


def write_zarr(out: Path, data: list[dict[str, Any]], compression: str, chunk_size: int, shards: int = 2) -> Path:
    shardload.write(
        data,
        out,
        num_shards=shards,
        shuffle=False,
        progress=False,
        shard_format=ZarrOptions(compression=compression, chunk_size=chunk_size),
    )
    return out


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- arrays handed out cannot write into the file or the shared cache ------------------------------------
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_a_sample_cannot_be_made_writable_to_corrupt_the_shared_cache(tmp_path: Path, compression: str) -> None:
    # Before: a decompressed chunk was a writable buffer made read-only by a flag, which a user
    # (or a library silencing torch's warning) could set back, then write into every later read of it.
    data = samples(60)
    out = write_zarr(tmp_path / "set", data, compression, 1024, shards=1)
    ds = shardload.open(out)
    sample = ds[5]
    for arr in sample.values():
        if arr.ndim == 0 or not arr.size:
            continue
        with pytest.raises(ValueError, match="read-only|WRITEABLE"):
            arr[...] = 0
        with pytest.raises(ValueError, match="WRITEABLE"):
            arr.flags.writeable = True
    values = ds.shard_columns(0).fields["tokens"].values
    with pytest.raises(ValueError, match="WRITEABLE"):
        values.decode_chunk(0).flags.writeable = True  # type: ignore[attr-defined]
    again = shardload.open(out)  # another open in this process shares the chunk cache
    for i in range(len(data)):
        np.testing.assert_array_equal(again[i]["tokens"], data[i]["tokens"])


@pytest.mark.parametrize("compression", ["none", "blosc-lz4"])
def test_writing_into_batches_changes_neither_the_file_nor_later_batches(tmp_path: Path, compression: str) -> None:
    data = samples(80)
    out = write_zarr(tmp_path / "set", data, compression, 512)
    batching = Batching(batch_size=8, chunk_window=0)
    first = [b["tokens"].clone() for b in make_loader(out, batching=batching, seed=2)]
    for b in make_loader(out, batching=batching, seed=2):
        b["tokens"].add_(1000)  # batches are copies: in place is the caller's business
        b["mask"].logical_not_()
    again = [b["tokens"] for b in make_loader(out, batching=batching, seed=2)]
    assert len(first) == len(again) == 10
    for x, y in zip(first, again, strict=True):
        assert bool((x == y).all())
    ds = shardload.open(out)
    for i in range(len(data)):
        np.testing.assert_array_equal(ds[i]["mask"], data[i]["mask"])


# -- file descriptors ----------------------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd (Linux)")
def test_cached_raw_chunks_of_closed_shards_hold_no_file_descriptors(tmp_path: Path) -> None:
    # Before: each shard's mapping (mmap) held a duplicate descriptor for as long as a chunk stored raw
    # (a view of the mapping) stayed cached, so closing shards freed nothing: 40 shards read through
    # 2 open ones kept 80+ descriptors, and a large set ran out of them however low max_open_shards was.
    data = samples(200)
    out = write_zarr(tmp_path / "set", data, "none", 256, shards=40)
    ds = shardload.ShardSet(out, max_open_shards=2)
    for name in ("tokens", "mask", "img"):
        ds.field_lengths(name)  # the lengths indexes stay mapped (and open) for good: not shards
    ds[0]  # zarr's event loop (its descriptors, for good) starts with the first shard opened
    before = open_fds() - 2
    views = [ds[i]["tokens"] for i in range(len(data))]
    assert len(ds._readers) == 2
    assert open_fds() - before <= 2 * 2  # each open Zarr shard: its zip, and zarr's store of it
    for got, want in zip(views, data, strict=True):
        np.testing.assert_array_equal(got, want["tokens"])  # views of closed shards: still mapped, same data
    ds.close()
    assert open_fds() <= before


def run_with_fd_headroom(out: Path, headroom: int) -> subprocess.CompletedProcess[str]:
    code = (
        "import os, resource, shardload\n"
        f"ds = shardload.open({str(out)!r})\n"
        "lengths = [ds.field_lengths(name) for name in ('tokens', 'mask', 'img')]\n"
        "used = len(os.listdir('/proc/self/fd'))\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, (used + {headroom}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "print(sum(int(ds[i]['tokens'].sum()) for i in range(len(ds))))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd (Linux)")
def test_low_fd_limit_closes_zarr_shards_to_make_room_or_says_so(tmp_path: Path) -> None:
    # Before: a Zarr shard needs more descriptors than the probe before it, so the probe passed, the
    # open failed and zarr's ZipStore, closed half-open, raised AttributeError: '_zf' instead.
    data = samples(160)
    out = write_zarr(tmp_path / "set", data, "blosc-lz4", 1024, shards=40)
    want = sum(int(s["tokens"].sum()) for s in data)
    run = run_with_fd_headroom(out, 12)  # room for a few shards, not 40: the oldest are closed
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) == want
    run = run_with_fd_headroom(out, 2)  # not even one shard fits
    assert run.returncode != 0
    raised = [line for line in run.stderr.splitlines() if line.startswith("shardload.errors.")]
    assert len(raised) == 1, run.stderr
    assert "'ZipStore' object has no attribute" not in run.stderr
    assert raised[0].startswith("shardload.errors.ShardSetError: cannot open a shard (")
    assert "shard-000000.zarr.zip): too many open files" in raised[0] and "ulimit -n" in raised[0]


# -- the same batches as Arrow ----------------------------------------------------------------------------
def arrow_batches(out: Path, data: list[dict[str, Any]], **kw: Any) -> list[dict[str, Any]]:
    shardload.write(data, out, num_shards=2, shuffle=False, progress=False)
    return batches(out, **kw)


def batches(out: Path, **kw: Any) -> list[dict[str, Any]]:
    batching = Batching(batch_size=8, chunk_window=0)
    return [{k: v.numpy().copy() for k, v in b.items()} for b in make_loader(out, batching=batching, seed=5, **kw)]


def assert_same_batches(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k].dtype == w[k].dtype, k
            np.testing.assert_array_equal(g[k], w[k], err_msg=k)


@pytest.mark.parametrize(
    ("compression", "chunk_size"),
    [("none", 1), ("none", 256 << 10), ("zstd", 64 << 10), ("zstd", 100), ("blosc-lz4", 256 << 10), ("blosc-lz4", 7)],
)
def test_zarr_batches_equal_arrow_batches(tmp_path: Path, compression: str, chunk_size: int) -> None:
    data = samples(120, seed=1)
    want = arrow_batches(tmp_path / "arrow", data)
    got = batches(write_zarr(tmp_path / "zarr", data, compression, chunk_size))
    assert_same_batches(got, want)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_workers_forked_after_the_parent_cached_chunks_read_the_same_batches(tmp_path: Path, compression: str) -> None:
    # the parent's cache (chunks of "none": views of its mapping) is inherited by the workers
    data = samples(120, seed=2)
    want = arrow_batches(tmp_path / "arrow", data)
    out = write_zarr(tmp_path / "zarr", data, compression, 512)
    parent = shardload.open(out)
    for i in range(len(data)):
        parent[i]
    got = batches(out, num_workers=2)
    assert_same_batches(got, want)
