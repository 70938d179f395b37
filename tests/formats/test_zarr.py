"""Zarr shards: the same shard set as Arrow, compressed; lazy chunk reads through a bounded cache."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import struct
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shardload
from shardload.cli import main
from shardload.formats import get_format
from shardload.formats.zarr import ChunkCache, ZarrOptions, ZarrShardReader, ZarrShardWriter, ZarrValues, chunk_cache
from shardload.formats.zarr import cache as cache_module
from shardload.integrations.datamodule import ShardDataModule
from shardload.load.collate import PadSpec, collate_batch
from shardload.plan import Batching
from shardload.sets.describe import describe
from shardload.sets.verify import verify
from shardload.testing import synthetic_samples
from tests.helpers.resume import assert_resumes_identically, batch_ids

pytest.importorskip("zarr")

REPO = Path(__file__).resolve().parents[2]


# -- helpers ----------------------------------------------------------------------------------------
def rich_samples(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Several variable fields (1-D int, 2-D float, bool), a fixed vector and a scalar."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rows = int(rng.integers(0, 9))
        out.append(
            {
                "tokens": rng.integers(0, 50, size=int(rng.integers(1, 40)), dtype=np.int32),
                "frames": rng.standard_normal((rows, 3), dtype=np.float32),
                "mask": rng.random(rows) < 0.5,
                "emb": rng.standard_normal(5).astype(np.float64),
                "label": np.int64(i % 11),
            }
        )
    return out


def assert_same_sample(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        g, v = np.asarray(got[k]), np.asarray(v)
        assert g.dtype == v.dtype and g.shape == v.shape, (k, g.dtype, g.shape, v.dtype, v.shape)
        np.testing.assert_array_equal(g, v, err_msg=k)


def assert_same_sets(arrow: Path, zarr_set: Path) -> None:
    a, z = shardload.open(arrow), shardload.open(zarr_set)
    assert z.manifest.shard_format == "zarr" and a.manifest.shard_format == "arrow"
    assert len(a) == len(z) and a.schema == z.schema
    np.testing.assert_array_equal(a.lengths, z.lengths)
    for i in range(len(a)):
        assert_same_sample(z[i], a[i])


def write_both(
    samples: list[dict[str, Any]], root: Path, zarr: ZarrOptions | None = None, **options: Any
) -> tuple[Path, Path]:
    shardload.write(samples, root / "arrow", **options)
    shardload.write(samples, root / "zarr", shard_format=zarr or ZarrOptions(), **options)
    return root / "arrow", root / "zarr"


def member_data_offset(path: Path, member: str) -> tuple[int, int]:
    """Where the stored bytes of zip member ``member`` start in the file, and how many there are."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        header = fh.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len, info.compress_size


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def batches(loader: Any) -> list[dict[str, torch.Tensor]]:
    return [dict(b) for b in loader]


def assert_same_batches(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert set(x) == set(y)
        for k in x:
            assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, k
            assert torch.equal(x[k], y[k]), k


@pytest.fixture
def private_cache() -> Iterator[ChunkCache]:
    yield ChunkCache(1 << 30)


# -- round trips ------------------------------------------------------------------------------------
@pytest.mark.parametrize("compression", ["zstd", "blosc-lz4", "none"])
def test_iterable_with_many_field_kinds_round_trips_like_arrow(tmp_path: Path, compression: str) -> None:
    samples = rich_samples(150)
    # A small chunk size puts many samples across chunk boundaries.
    arrow, zarr_set = write_both(
        samples,
        tmp_path,
        ZarrOptions(compression=compression, chunk_size=300),
        num_shards=3,
        seed=2,
        fixed_fields=["emb"],
    )
    assert_same_sets(arrow, zarr_set)
    z = shardload.open(zarr_set)
    origin = np.load(zarr_set / "origin.npy")
    for i in range(len(z)):
        assert_same_sample(z[i], samples[origin[i]])
    assert z.schema.field("emb").shape == (5,) and not z.schema.field("emb").variable
    assert [s.file for s in z.shards] == [f"shards/shard-{k:06d}.zarr.zip" for k in range(3)]


def test_npy_directory_round_trips_like_arrow(tmp_path: Path) -> None:
    src = tmp_path / "npy"
    src.mkdir()
    rng = np.random.default_rng(3)
    for i in range(40):
        np.save(src / f"{i:03d}.npy", rng.standard_normal((int(rng.integers(0, 30)), 4)).astype(np.float32))
    shardload.prepare(src, tmp_path / "arrow", field="x", num_shards=4)
    shardload.prepare(src, tmp_path / "zarr", field="x", num_shards=4, shard_format=ZarrOptions(chunk_size=1000))
    assert_same_sets(tmp_path / "arrow", tmp_path / "zarr")


def test_jsonl_round_trips_like_arrow(tmp_path: Path) -> None:
    samples = synthetic_samples(60, seed=4)
    lines = [json.dumps({k: np.asarray(v).tolist() for k, v in s.items()}) for s in samples]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    shardload.prepare(tmp_path / "a.jsonl", tmp_path / "arrow", num_shards=2, dtypes={"tokens": "int32"})
    shardload.prepare(
        tmp_path / "a.jsonl",
        tmp_path / "zarr",
        num_shards=2,
        dtypes={"tokens": "int32"},
        shard_format=ZarrOptions(compression="blosc-lz4"),
    )
    assert_same_sets(tmp_path / "arrow", tmp_path / "zarr")


def test_empty_and_single_sample_shards(tmp_path: Path) -> None:
    samples = [
        {"x": np.zeros((0, 3), np.float32), "t": np.zeros(0, np.int64)},
        {"x": np.ones((5, 3), np.float32), "t": np.arange(2, dtype=np.int64)},
    ]
    arrow, zarr_set = write_both(samples, tmp_path, num_shards=2, shuffle=False)
    assert_same_sets(arrow, zarr_set)


def test_same_samples_and_options_give_the_same_bytes(tmp_path: Path) -> None:
    samples = rich_samples(50)
    shardload.write(samples, tmp_path / "a", shard_format="zarr", num_shards=2)
    shardload.write(samples, tmp_path / "b", shard_format="zarr", num_shards=2)
    # Invariant: a shard's bytes depend on its content only (no timestamps), so resume can reproduce them
    assert [s.checksum for s in shardload.open(tmp_path / "a").shards] == [
        s.checksum for s in shardload.open(tmp_path / "b").shards
    ]


# -- values are lazy, and index like an ndarray -----------------------------------------------------------
def test_zarr_values_index_like_the_ndarray(tmp_path: Path, private_cache: ChunkCache) -> None:
    samples = [{"f": np.arange(i * 12, (i + 1) * 12, dtype=np.float32).reshape(4, 3)} for i in range(30)]
    shardload.write(samples, tmp_path / "s", shard_format=ZarrOptions(chunk_size=100), num_shards=1, shuffle=False)
    ss = shardload.open(tmp_path / "s")
    reader = ZarrShardReader(tmp_path / "s" / ss.shards[0].file, ss.schema, cache=private_cache)
    values = reader.columns().fields["f"].values
    assert isinstance(values, ZarrValues) and values.chunk_rows == 8
    full = np.concatenate([s["f"] for s in samples])
    assert values.shape == full.shape and values.dtype == full.dtype and len(values) == len(full)
    assert values.nbytes == full.nbytes
    keys: list[Any] = [
        0,
        7,
        8,
        -1,
        np.int64(33),
        slice(None),
        slice(5, 30),
        slice(7, 9),
        slice(30, 5, -3),
        slice(2, 100, 7),
        slice(50, 10),
        np.array([119, 0, 8, 8, 63]),
        [3, -2],
        np.zeros(0, np.int64),
        (slice(3, 20), 1),
        (5, 2),
        full[:, 0] > 200,
        Ellipsis,
    ]
    for key in keys:
        np.testing.assert_array_equal(values[key], full[key], err_msg=repr(key))
    np.testing.assert_array_equal(np.asarray(values), full)
    with pytest.raises(IndexError):
        values[len(full)]
    with pytest.raises(IndexError):
        values[np.array([0, len(full)])]
    # Cached chunks are shared: a view must not let one reader change another's data.
    assert not values[0:2].flags.writeable


# -- loading ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("workers", "window"), [(0, 0), (2, 0), (0, 4), (2, 3)])
def test_make_loader_gives_the_same_batches_as_arrow(tmp_path: Path, workers: int, window: int) -> None:
    """The same plan on both formats gives the same batches (a Zarr set's default windows given to both)."""
    arrow, zarr_set = write_both(synthetic_samples(200, seed=5), tmp_path, ZarrOptions(chunk_size=2000), num_shards=4)
    # Open a shard in this process first: workers forked afterwards must reopen the zip themselves.
    assert len(shardload.open(zarr_set)[0]["tokens"]) >= 0
    rows = shardload.open(zarr_set).plan_inputs().chunk_rows
    assert rows == 2000 // 4  # int32 tokens: 500 rows in 2000 bytes

    def run(path: Path, stage: str) -> list[dict[str, torch.Tensor]]:
        loader = shardload.make_loader(
            path,
            rank=1,
            world_size=2,
            stage=stage,
            batching=Batching(max_tokens=300, pad_to_multiple_of=8, chunk_window=window, chunk_rows=rows),
            seed=3,
            num_workers=workers,
            pad_values={"tokens": -1},
        )
        loader.set_epoch(1)
        return batches(loader)

    for stage in ("train", "val"):
        assert_same_batches(run(arrow, stage), run(zarr_set, stage))


def test_datamodule_gives_the_same_batches_as_arrow(tmp_path: Path) -> None:
    write_both(synthetic_samples(90, seed=6), tmp_path / "train", num_shards=3)
    write_both(synthetic_samples(31, seed=7), tmp_path / "val", num_shards=2)

    def run(kind: str) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
        dm = ShardDataModule(  # a full shuffle on both (a Zarr set's default is chunk windows)
            train=tmp_path / "train" / kind,
            val=tmp_path / "val" / kind,
            batching=Batching(batch_size=8, chunk_window=0),
            num_workers=0,
            seed=1,
        )
        dm.setup("fit")
        return batches(dm.train_dataloader()), batches(dm.val_dataloader())

    (train_a, val_a), (train_z, val_z) = run("arrow"), run("zarr")
    assert_same_batches(train_a, train_z)
    assert_same_batches(val_a, val_z)


def test_loader_over_zarr_resumes_mid_epoch(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(120, seed=8), tmp_path / "s", shard_format="zarr", num_shards=3)

    def make() -> shardload.load.loader.ShardLoader:
        loader = shardload.make_loader(tmp_path / "s", rank=0, world_size=2, stage="train", max_tokens=160, seed=1)
        loader.set_epoch(2)
        return loader

    assert len(batch_ids(make())) > 5
    assert_resumes_identically(make, stop_after=4)


# -- the chunk cache --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("batching", "cached", "per_chunk"),
    [
        (Batching(batch_size=16, bucketing=False), 12, 2.0),
        (Batching(max_tokens=200, bucketing=False), 12, 2.0),
        # a bucket's batch waits for its rows over several windows: a quarter of the set cached, ~3 decodes
        (Batching(max_tokens=200), 95, 3.5),
    ],
    ids=["fixed", "greedy", "buckets"],
)
def test_chunk_windows_decode_each_chunk_about_once_per_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batching: Batching, cached: int, per_chunk: float
) -> None:
    rng = np.random.default_rng(4)
    samples = [{"tokens": rng.integers(0, 99, int(rng.integers(1, 25)), dtype=np.int32)} for _ in range(3000)]
    shardload.write(samples, tmp_path / "s", shard_format=ZarrOptions(chunk_size=400), num_shards=3)
    ss = shardload.open(tmp_path / "s")
    chunks = sum(ss.shard_columns(k).fields["tokens"].values.num_chunks for k in range(len(ss.shards)))
    assert ss.plan_inputs().chunk_rows == 100 and chunks > 200  # ~8 samples per chunk

    def loads(window: int) -> int:
        # the process cache holds `cached` chunks (12: a window of 4 and the batches that span two)
        monkeypatch.setattr(cache_module, "_shared", cache_module.ChunkCache(cached * 400))
        loader = shardload.make_loader(
            ss,
            rank=0,
            world_size=1,
            stage="train",
            seed=2,
            num_workers=0,
            batching=dataclasses.replace(batching, chunk_window=window),
        )
        assert sorted(int(i) for b in loader for i in b["sample_id"]) == list(range(len(samples)))
        return chunk_cache().loads

    # once in its window, and at most once more for the sample that spills into it from the chunk before
    windowed = loads(4)  # measured: 1.9, 1.9 and 3.0 decodes per chunk
    assert windowed <= per_chunk * chunks
    assert loads(0) >= 2 * windowed  # a full shuffle decodes a chunk for most samples (measured: 8.6, 8.5, 6.7)


@pytest.mark.parametrize("pad_to_multiple_of", [1, 64])  # 64: mostly padding, each sample copied over it
def test_the_chunk_gather_copies_what_a_plain_array_holds(
    tmp_path: Path, private_cache: ChunkCache, pad_to_multiple_of: int
) -> None:
    # tiny chunks (tokens: 4 rows, frames: 1-2 rows), so samples lie within a chunk, across two, or across several
    samples = rich_samples(120, seed=13)
    for i in (3, 50, 51, 119):  # empty samples, two of them side by side and one last in the shard
        samples[i] = {**samples[i], "tokens": np.zeros(0, np.int32), "frames": np.zeros((0, 3), np.float32)}
        samples[i]["mask"] = np.zeros(0, bool)
    shardload.write(samples, tmp_path / "s", shard_format=ZarrOptions(chunk_size=16), num_shards=2, shuffle=False)
    ss = shardload.open(tmp_path / "s")
    readers = [ZarrShardReader(tmp_path / "s" / sh.file, ss.schema, cache=private_cache) for sh in ss.shards]
    zcols = [r.columns() for r in readers]
    # the same columns as plain arrays: what the Arrow path copies from
    plain = [
        dataclasses.replace(
            c, fields={k: dataclasses.replace(d, values=np.asarray(d.values)) for k, d in c.fields.items()}
        )
        for c in zcols
    ]
    tokens = zcols[0].fields["tokens"]
    lens = np.diff(tokens.offsets)
    first, last = tokens.offsets[:-1] // tokens.values.chunk_rows, (tokens.offsets[1:] - 1) // tokens.values.chunk_rows
    assert ((last - first >= 2) & (lens > 0)).any() and ((last - first == 1) & (lens > 0)).any()  # several, two
    assert ((first == last) & (lens > 0)).any() and (lens == 0).any()  # one chunk, none
    bounds = np.cumsum([0, *(sh.samples for sh in ss.shards)])
    rng = np.random.default_rng(0)
    pad = PadSpec({"tokens": -1, "frames": 0.5}, pad_to_multiple_of=pad_to_multiple_of)
    picks = [np.arange(120), rng.permutation(120)[:40], np.array([50, 51]), np.array([3, 4, 5, 6, 119])]
    for ids in picks:
        shards = np.searchsorted(bounds, ids, side="right") - 1
        rows = ids - bounds[shards]
        ones = np.ones(len(ids), np.float32)
        got = collate_batch(ss.schema, lambda s: zcols[s], shards, rows, ids, ones, pad)
        want = collate_batch(ss.schema, lambda s: plain[s], shards, rows, ids, ones, pad)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        for j, i in enumerate(ids.tolist()):  # and what was written
            n = len(samples[i]["frames"])
            np.testing.assert_array_equal(got["frames"][j, :n], samples[i]["frames"])
            assert (got["frames"][j, n:] == 0.5).all() and got["frames_lengths"][j] == n


def test_a_batch_of_neighbours_decodes_each_chunk_once(tmp_path: Path, private_cache: ChunkCache) -> None:
    samples = synthetic_samples(100, seed=9)
    shardload.write(samples, tmp_path / "s", shard_format=ZarrOptions(chunk_size=1000), num_shards=1, shuffle=False)
    ss = shardload.open(tmp_path / "s")
    cols = ZarrShardReader(tmp_path / "s" / ss.shards[0].file, ss.schema, cache=private_cache).columns()
    rows = np.arange(10, 40, dtype=np.int64)
    touched = 0
    for f in ss.schema.fields:
        data = cols.fields[f.name]
        lo, hi = (
            (rows[0], rows[-1] + 1) if data.offsets is None else (data.offsets[rows[0]], data.offsets[rows[-1] + 1])
        )
        touched += len(range(int(lo) // data.values.chunk_rows, (int(hi) - 1) // data.values.chunk_rows + 1))
    assert touched > 6  # the batch spans several chunks of each field

    def fetch() -> dict[str, np.ndarray]:
        ones = np.ones(len(rows), np.float32)
        return collate_batch(ss.schema, lambda s: cols, np.zeros(len(rows), np.int64), rows, rows, ones, PadSpec())

    batch = fetch()
    # Invariant: each chunk the batch touches is decompressed once, however many samples share it
    assert private_cache.loads == touched
    hits = private_cache.hits
    fetch()
    # the second time every chunk comes from the cache, looked up about once per chunk, not once per sample
    lookups = private_cache.hits - hits
    assert private_cache.loads == touched and touched <= lookups < len(rows) * len(ss.schema.fields)
    for j, i in enumerate(rows):
        n = len(samples[i]["tokens"])
        np.testing.assert_array_equal(batch["tokens"][j, :n], samples[i]["tokens"])


def test_cache_stays_within_its_bound(tmp_path: Path) -> None:
    samples = synthetic_samples(200, seed=10)
    shardload.write(samples, tmp_path / "s", shard_format=ZarrOptions(chunk_size=800), num_shards=1, shuffle=False)
    ss = shardload.open(tmp_path / "s")
    path = tmp_path / "s" / ss.shards[0].file
    bound = 2500  # about three 800-byte chunks
    small = ChunkCache(bound)
    cols = ZarrShardReader(path, ss.schema, cache=small).columns()
    for i in range(len(ss)):
        cols.sample(i)
        # Invariant: the cache never holds more than its bound
        assert small.nbytes <= bound and sum(c.nbytes for c in small._chunks.values()) == small.nbytes
    assert 0 < len(small) <= 4
    # A chunk larger than the whole bound is decoded but never kept.
    tiny = ChunkCache(10)
    tiny_cols = ZarrShardReader(path, ss.schema, cache=tiny).columns()
    tiny_cols.sample(0)
    tiny_cols.sample(0)
    assert len(tiny) == 0 and tiny.nbytes == 0 and tiny.loads == 2 * len(ss.schema.fields)
    # With room for everything, each chunk is decoded exactly once over two full passes.
    big = ChunkCache(1 << 30)
    big_cols = ZarrShardReader(path, ss.schema, cache=big).columns()
    for _ in range(2):
        for i in range(len(ss)):
            assert_same_sample(big_cols.sample(i), samples[i])
    chunks = sum(
        -(-len(big_cols.fields[f.name].values) // big_cols.fields[f.name].values.chunk_rows) for f in ss.schema.fields
    )
    assert big.loads == chunks == len(big)


def test_a_chunk_a_batch_used_gets_a_second_chance_and_an_evicted_one_leaves_its_table() -> None:
    cache = ChunkCache(3 * 800)
    base, table = cache.table(("file", "tokens/values"), 10)
    chunk = {c: np.full(200, c, dtype=np.int32) for c in range(10)}  # 800 bytes each
    for c in range(3):
        cache.get(base + c, lambda c=c: chunk[c].copy())
    assert [t is None for t in table.slots[:4]] == [False, False, False, True]
    table.used[:] = 0
    table.used[0] = 1  # a batch used chunk 0 since eviction last passed over it
    cache.get(base + 3, lambda: chunk[3].copy())
    # Invariant: the oldest chunk not used since the last pass (1) goes first; the used one (0) stays once more
    kept = [c for c in range(10) if table.slots[c] is not None]
    assert kept == [0, 2, 3] and table.used[0] == 0
    assert cache.nbytes == 3 * 800 == sum(a.nbytes for a in cache._chunks.values())
    # Invariant: a table slot holds exactly what the cache holds under that key
    for c in range(10):
        held = cache._chunks.get(base + c)
        assert (table.slots[c] is None) == (held is None) and (held is None or table.slots[c] is held)
    # A second array of the same cache gets keys of its own.
    other, _ = cache.table(("file", "features/values"), 10)
    assert other != base and cache.table(("file", "tokens/values"), 10)[0] == base
    cache.clear()
    assert table.slots == [None] * 10 and not table.used.any() and len(cache) == 0


@pytest.mark.parametrize("compression", ["none", "blosc-lz4"])
def test_chunks_are_read_from_a_read_only_mapping_of_the_shard(tmp_path: Path, compression: str) -> None:
    samples = synthetic_samples(80, seed=12)
    options = ZarrOptions(compression=compression, chunk_size=1024)
    shardload.write(samples, tmp_path / "s", shard_format=options, num_shards=1, shuffle=False)
    ss = shardload.open(tmp_path / "s")
    reader = ZarrShardReader(tmp_path / "s" / ss.shards[0].file, ss.schema, cache=ChunkCache(1 << 20))
    values = reader.columns().fields["tokens"].values
    assert isinstance(values, ZarrValues) and values.num_chunks > 3
    first = values.decode_chunk(0)
    # Stored raw, a chunk is the mapped file itself (no copy, and numpy refuses writes to it, which the
    # read-only mapping could not take); compressed, it is decoded into memory of its own, read-only too
    # (below the array: its writeable flag cannot be set back, see tests/reliability/test_zarr_attack.py).
    raw = compression == "none"
    assert np.shares_memory(first, values.decode_chunk(0)) == raw
    assert not first.flags.writeable
    reader.close()  # chunks taken before the close stay readable: the mapping lives as long as they do
    offsets = reader.columns().fields["tokens"].offsets
    assert offsets is not None
    np.testing.assert_array_equal(first[: len(samples[0]["tokens"])], samples[0]["tokens"])


def test_without_a_mapping_chunks_are_read_through_zipfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Mapping opens the file once more: with no descriptor (or no address space) left, the shard is still read.
    import pyarrow as pa

    samples = synthetic_samples(40, seed=13)
    shardload.write(samples, tmp_path / "s", shard_format=ZarrOptions(chunk_size=1024), num_shards=1, shuffle=False)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(pa, "memory_map", refuse)
    ss = shardload.open(tmp_path / "s")
    reader = ZarrShardReader(tmp_path / "s" / ss.shards[0].file, ss.schema, cache=ChunkCache(0))
    cols = reader.columns()
    assert reader._mapped is None
    for i, sample in enumerate(samples):
        assert_same_sample(cols.sample(i), sample)


def test_the_cache_keeps_no_table_for_shards_closed_long_ago(tmp_path: Path) -> None:
    # A process reads many shards in turn (at most 2 open): tables and names of closed shards whose chunks
    # were all evicted are dropped, so the cache's bookkeeping stays bounded however many shards it saw.
    shardload.write(
        synthetic_samples(240, seed=14), tmp_path / "s", shard_format=ZarrOptions(chunk_size=1024), num_shards=24
    )
    small = ChunkCache(8 << 10)
    ss = shardload.ShardSet(tmp_path / "s", max_open_shards=2)
    ss._checks.reader_cls = lambda path, schema, **kw: ZarrShardReader(path, schema, cache=small, **kw)  # type: ignore[assignment]
    for _ in range(2):
        for i in range(len(ss)):
            ss[i]
            # Invariant: a table per array of an open shard at most, a name per table or cached chunk
            fields = len(ss.schema.fields)
            assert len(small._tables) <= 2 * fields
            assert len(small._spaces) <= 2 * fields + len(small)
    # A shard reopened while its chunks are still cached finds them again (by key), without decoding.
    big = ChunkCache(1 << 30)
    path = tmp_path / "s" / ss.shards[0].file
    first = ZarrShardReader(path, ss.schema, cache=big)
    first.columns().sample(0)
    loads = big.loads
    first.close()
    again = ZarrShardReader(path, ss.schema, cache=big)
    again.columns().sample(0)
    assert big.loads == loads and len(big._tables) == len(ss.schema.fields)


@pytest.mark.parametrize("compression", ["blosc-lz4", "none"])
def test_a_batch_over_more_shards_than_stay_open_leaves_no_table_behind(tmp_path: Path, compression: str) -> None:
    # The batch's first shards are closed to open its later ones, then read: their tables must still be
    # released once (they were taken again and never released), and a raw array's chunks (slices of the
    # closed shard's mapping) leave the cache with its table.
    import gc

    from shardload.load.dataset import ShardBatchDataset

    out = tmp_path / "s"
    samples = synthetic_samples(400, seed=15)
    options = ZarrOptions(compression=compression, chunk_size=1024)
    shardload.write(samples, out, shard_format=options, num_shards=4, shuffle=False)
    cache = ChunkCache(1 << 30)
    ss = shardload.ShardSet(out, max_open_shards=1)
    ss._checks.reader_cls = lambda path, schema, **kw: ZarrShardReader(path, schema, cache=cache, **kw)  # type: ignore[assignment]
    ids = np.array([0, 150, 250, 390], dtype=np.int64)
    for _ in range(5):
        batch = ShardBatchDataset(ss).fetch(ids, np.ones(len(ids), np.float32))
        for j, i in enumerate(ids.tolist()):
            n = len(samples[i]["tokens"])
            np.testing.assert_array_equal(batch["tokens"][j, :n], samples[i]["tokens"])
    fields = len(ss.schema.fields)
    assert len(cache._tables) <= fields  # the one open shard's arrays
    del batch
    ss.close()
    gc.collect()
    # Invariant: no table outlives the arrays that hold it; a raw chunk outlives no table
    assert len(cache._tables) == 0 and not cache._users
    assert (len(cache) == 0) == (compression == "none")


_FAIL_AT: list[int] = []


def _fail_once(sample: dict[str, Any]) -> dict[str, Any]:
    """A map that stops the prepare at one sample while ``_FAIL_AT`` names it (an interrupted run)."""
    if _FAIL_AT and len(next(iter(sample.values()))) == _FAIL_AT[0]:
        raise ValueError("interrupted")
    return sample


def test_resuming_a_prepare_interrupted_under_other_zarr_defaults_names_what_changed(tmp_path: Path) -> None:
    # A run made with the earlier defaults (zstd, 64 KiB), resumed with `--format zarr` alone after they
    # changed: the refusal must say which options differ, with both values, so the user can pin them.
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        np.save(src / f"{i:02d}.npy", np.arange(5 + i, dtype=np.int32))
    out = tmp_path / "s"
    old = ZarrOptions(compression="zstd", chunk_size=64 << 10)
    _FAIL_AT[:] = [5 + 9]
    try:
        with pytest.raises(shardload.InputError, match="interrupted"):
            shardload.prepare(src, out, shard_format=old, map=_fail_once, chunk_bytes=64, progress=False)
    finally:
        _FAIL_AT.clear()
    with pytest.raises(shardload.OutputError) as err:
        shardload.prepare(src, out, shard_format="zarr", map=_fail_once, resume=True, progress=False)
    assert "compression was 'zstd', now 'blosc-lz4'" in str(err.value)
    assert "chunk_size was 65536, now 262144" in str(err.value)
    result = shardload.prepare(src, out, shard_format=old, map=_fail_once, chunk_bytes=64, resume=True, progress=False)
    assert result.samples == 12 and shardload.open(out).manifest.options["compression"] == "zstd"


def test_shared_cache_bound_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "_shared", None)
    monkeypatch.setenv(cache_module.CACHE_ENV, "12345")
    assert chunk_cache().max_bytes == 12345
    cache_module.set_chunk_cache_bytes(99)
    assert chunk_cache().max_bytes == 99
    monkeypatch.setattr(cache_module, "_shared", None)
    monkeypatch.delenv(cache_module.CACHE_ENV)
    assert chunk_cache().max_bytes == 64 << 20
    monkeypatch.setattr(cache_module, "_shared", None)
    monkeypatch.setenv(cache_module.CACHE_ENV, "lots")
    with pytest.raises(shardload.InputError, match=cache_module.CACHE_ENV):
        chunk_cache()


# -- compression ------------------------------------------------------------------------------------
def test_compression_shrinks_compressible_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    # Small token ids in long runs, and smooth float rows: both compress well.
    samples = [
        {
            "tokens": np.repeat(rng.integers(0, 8, size=40), 10).astype(np.int32),
            "curve": np.cumsum(np.full((64, 4), 0.5, np.float32), axis=0),
        }
        for _ in range(100)
    ]
    sizes = {}
    for label, options in {
        "arrow": {},
        "none": {"shard_format": ZarrOptions(compression="none")},
        "zstd": {"shard_format": ZarrOptions(compression="zstd")},
        "zstd-19": {"shard_format": ZarrOptions(compression="zstd", compression_level=19)},
        "blosc-lz4": {"shard_format": ZarrOptions(compression="blosc-lz4")},
    }.items():
        shardload.write(samples, tmp_path / label, num_shards=2, **options)
        sizes[label] = sum(s.bytes for s in shardload.open(tmp_path / label).shards)
    payload = sum(a.nbytes for s in samples for a in s.values())
    assert sizes["none"] >= payload and sizes["arrow"] >= payload
    assert sizes["zstd"] < sizes["none"] / 5
    assert sizes["blosc-lz4"] < sizes["none"] / 3
    assert sizes["zstd-19"] <= sizes["zstd"]
    opts = shardload.open(tmp_path / "zstd-19").manifest.options
    assert (opts["compression"], opts["compression_level"], opts["chunk_size"]) == ("zstd", 19, 256 << 10)
    assert_same_sets(tmp_path / "arrow", tmp_path / "zstd-19")


def test_zarr_options_are_checked(tmp_path: Path) -> None:
    samples = synthetic_samples(5)
    with pytest.raises(shardload.InputError, match="apply to zarr shards"):
        shardload.write(samples, tmp_path / "a", compression="zstd")
    with pytest.raises(shardload.InputError, match="apply to zarr shards"):
        shardload.write(samples, tmp_path / "a", chunk_size=1000)
    with pytest.raises(shardload.InputError, match=r"level must be an integer in \[1, 22\]"):
        shardload.write(samples, tmp_path / "a", shard_format=ZarrOptions(compression="zstd", compression_level=40))
    with pytest.raises(shardload.InputError, match=r"blosc-lz4 compression level must be an integer in \[0, 9\]"):
        shardload.write(samples, tmp_path / "a", shard_format=ZarrOptions(compression_level=40))
    with pytest.raises(shardload.InputError, match="compression must be one of"):
        shardload.write(samples, tmp_path / "a", shard_format=ZarrOptions(compression="gzip"))
    with pytest.raises(shardload.InputError, match="not 'none'"):
        shardload.write(samples, tmp_path / "a", shard_format=ZarrOptions(compression="none", compression_level=3))
    with pytest.raises(shardload.InputError, match="cannot name a Zarr group"):
        shardload.write([{"a/b": np.arange(3)}], tmp_path / "b", shard_format="zarr")


@pytest.mark.parametrize("chunk_size", [0, -1, 1.5, True])
def test_a_chunk_size_that_is_not_a_positive_integer_is_refused(chunk_size: Any) -> None:
    # 0 was taken for "unset" by the writer and became 64 KiB without a word.
    with pytest.raises(
        shardload.InputError, match=f"chunk size must be a positive number of bytes, got {chunk_size!r}"
    ):
        ZarrOptions(chunk_size=chunk_size)


def test_the_options_of_a_format_given_on_their_own_say_how_to_give_them(tmp_path: Path) -> None:
    with pytest.raises(shardload.InputError) as err:
        shardload.PrepareOptions(shard_format="zarr", compression="zstd")
    assert "shard_format=shardload.ZarrOptions(compression='zstd')" in str(err.value)
    assert "--format zarr --compression zstd" in str(err.value)
    with pytest.raises(shardload.InputError, match=r"ZarrOptions\(chunk_size=4096\)"):
        shardload.write(synthetic_samples(5), tmp_path / "a", shard_format="zarr", chunk_size=4096)
    assert not (tmp_path / "a").exists()


def test_zarr_options_resolve_their_defaults_once() -> None:
    assert ZarrOptions() == ZarrOptions(compression="blosc-lz4", compression_level=5, chunk_size=256 << 10)
    assert ZarrOptions(compression="zstd").compression_level == 3
    assert ZarrOptions(compression="none").compression_level is None
    # "zarr" is the shortcut for those defaults, and the manifest records them resolved.
    opts = shardload.PrepareOptions(shard_format="zarr")
    assert opts.shard_format == ZarrOptions() and opts.format is get_format("zarr")
    assert {k: opts.layout_key()[k] for k in ("shard_format", "compression", "compression_level", "chunk_size")} == {
        "shard_format": "zarr",
        "compression": "blosc-lz4",
        "compression_level": 5,
        "chunk_size": 256 << 10,
    }


# -- damage -----------------------------------------------------------------------------------------
def test_corrupt_chunk_names_the_shard_and_the_chunk(tmp_path: Path) -> None:
    samples = synthetic_samples(80, seed=12)
    shardload.write(samples, tmp_path / "s", shard_format=ZarrOptions(chunk_size=400), num_shards=2, shuffle=False)
    ss = shardload.open(tmp_path / "s")
    path = tmp_path / "s" / ss.shards[1].file
    start, size = member_data_offset(path, "tokens/values/c/2")
    flip_byte(path, start + size // 2)
    cols = shardload.open(tmp_path / "s").shard_columns(1)
    values = cols.fields["tokens"].values
    cols.sample(0)  # chunk 0 is intact
    with pytest.raises(shardload.CorruptShardError) as err:
        values[2 * values.chunk_rows]
    msg = str(err.value)
    assert "shard-000001.zarr.zip" in msg and "chunk 2 of array 'tokens/values'" in msg
    assert "shardload verify" in msg and "re-run prepare" in msg
    # Through the loader, the same error stops the batch that needs the chunk.
    with pytest.raises(shardload.CorruptShardError, match="chunk 2 of array 'tokens/values'"):
        list(shardload.make_loader(tmp_path / "s", rank=0, world_size=1, stage="val", batch_size=80))


def test_damaged_zip_directory_is_a_corrupt_shard(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(20), tmp_path / "s", shard_format="zarr", num_shards=1)
    path = tmp_path / "s" / shardload.open(tmp_path / "s").shards[0].file
    data = path.read_bytes()
    path.write_bytes(data[:-30] + b"\0" * 30)  # same size, broken end-of-central-directory record
    with pytest.raises(shardload.CorruptShardError, match=r"shard-000000\.zarr\.zip.*cannot be opened"):
        shardload.open(tmp_path / "s")[0]


def test_verify_detects_a_damaged_zarr_shard(tmp_path: Path) -> None:
    shardload.write(
        synthetic_samples(90, seed=13), tmp_path / "s", shard_format=ZarrOptions(chunk_size=500), num_shards=3
    )
    assert verify(tmp_path / "s").ok
    ss = shardload.open(tmp_path / "s")
    flipped = tmp_path / "s" / ss.shards[1].file
    start, size = member_data_offset(flipped, "features/values/c/0/0")
    flip_byte(flipped, start + size - 1)
    truncated = tmp_path / "s" / ss.shards[2].file
    truncated.write_bytes(truncated.read_bytes()[:-100])
    report = verify(tmp_path / "s")
    assert not report.ok and report.damaged_shards == [1, 2]
    reasons = {(p.shard, p.reason) for p in report.problems}
    assert (1, "checksum_mismatch") in reasons and (2, "truncated") in reasons
    assert (2, "unreadable") in reasons  # the cut-off zip cannot be opened at all


def test_inspect_and_verify_cli_on_a_zarr_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shardload.write(synthetic_samples(40), tmp_path / "s", shard_format="zarr", num_shards=2)
    info = describe(tmp_path / "s")
    assert info["shard_format"] == "zarr" and info["samples"] == 40 and info["shards"] == 2
    assert info["bytes"] == sum(p.stat().st_size for p in (tmp_path / "s" / "shards").iterdir())
    assert main(["inspect", str(tmp_path / "s")]) == 0
    assert "zarr shards" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "s")]) == 0


# -- the command line -----------------------------------------------------------------------------------
def test_prepare_cli_format_and_compression_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "npy"
    src.mkdir()
    for i in range(12):
        np.save(src / f"{i:02d}.npy", np.arange(i * 7 + 1, dtype=np.int32))
    code = main(
        [
            "prepare",
            str(src),
            "-o",
            str(tmp_path / "z"),
            "--field",
            "tokens",
            "--format",
            "zarr",
            "--compression",
            "blosc-lz4",
            "--compression-level",
            "3",
            "--chunk-size",
            "4k",
            "--no-progress",
        ]
    )
    assert code == 0
    m = shardload.open(tmp_path / "z").manifest
    assert m.shard_format == "zarr"
    assert (m.options["compression"], m.options["compression_level"], m.options["chunk_size"]) == ("blosc-lz4", 3, 4096)
    shardload.prepare(src, tmp_path / "a", field="tokens")
    assert_same_sets(tmp_path / "a", tmp_path / "z")
    capsys.readouterr()
    # Compression asked of the uncompressed format is bad input (exit 3), not silently ignored.
    assert main(["prepare", str(src), "-o", str(tmp_path / "x"), "--field", "tokens", "--compression", "zstd"]) == 3
    assert "apply to zarr shards" in capsys.readouterr().err


# -- plain zarr, without shardload ------------------------------------------------------------------------
def docs_snippet() -> str:
    text = (REPO / "docs" / "format.md").read_text()
    section = text.split("## Zarr shards", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/format.md: the Zarr shards section has no python snippet"
    return match.group(1)


def test_plain_zarr_snippet_from_the_docs_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(14)
    samples = [
        {"features": rng.standard_normal((int(rng.integers(1, 20)), 32), dtype=np.float32), "label": np.int64(i)}
        for i in range(10)
    ]
    out = tmp_path / "OUT"
    shardload.write(samples, out, shard_format="zarr", num_shards=1, shuffle=False)
    code = docs_snippet().replace('"OUT/', f'"{out}/')
    ns: dict[str, Any] = {}
    exec(compile(code, "docs/format.md", "exec"), ns)
    np.testing.assert_array_equal(ns["sample_3"], samples[3]["features"])
    assert int(ns["label_3"]) == 3
    assert ns["meta"]["num_samples"] == 10


# -- resume and the optional dependency -------------------------------------------------------------------
WRITER = textwrap.dedent(
    """
    import sys
    import shardload
    from shardload.testing import synthetic_samples

    out = sys.argv[1]
    samples = synthetic_samples(300, seed=15)
    shardload.write(samples, out, num_shards=5, chunk_bytes=4000, resume=True, progress=False,
                    shard_format=shardload.ZarrOptions(compression="zstd", chunk_size=2000))
    """
)


def run_writer(out: Path, kill_at: str | None = None) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SHARDLOAD_KILL_AT", None)
    if kill_at:
        env["SHARDLOAD_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-c", WRITER, str(out)], env=env, timeout=180).returncode


@pytest.mark.slow
def test_resumed_zarr_prepare_gives_the_uninterrupted_result(tmp_path: Path) -> None:
    assert run_writer(tmp_path / "ref") == 0
    want = [s.checksum for s in shardload.open(tmp_path / "ref").shards]
    out = tmp_path / "killed"
    assert run_writer(out, kill_at="shard:2") == -signal.SIGKILL
    assert (out / ".prepare" / "shards" / "shard-000002.zarr.zip").exists()
    with pytest.raises(shardload.ManifestError):
        shardload.open(out)
    assert run_writer(out) == 0
    # Invariant: resume finishes with the bytes an uninterrupted run writes
    assert [s.checksum for s in shardload.open(out).shards] == want
    assert verify(out).ok


def test_without_zarr_arrow_works_and_zarr_says_how_to_install(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(10), tmp_path / "z", shard_format="zarr", num_shards=1)
    script = textwrap.dedent(
        """
        import sys
        sys.modules["zarr"] = None  # as if zarr were not installed
        import shardload
        from shardload.testing import synthetic_samples

        out = sys.argv[1]
        shardload.write(synthetic_samples(10), out + "/a")
        assert len(shardload.open(out + "/a")) == 10
        for attempt in (lambda: shardload.write(synthetic_samples(10), out + "/b", shard_format="zarr"),
                        lambda: shardload.open(out + "/z")[0]):
            try:
                attempt()
            except shardload.MissingDependencyError as exc:
                print("refused:", exc)
            else:
                raise SystemExit("zarr was used without being installed")
        from shardload.cli import main
        # A missing optional dependency is exit status 2, whether the command writes or reads zarr shards.
        import numpy as np
        np.save(out + "/t.npy", np.arange(5))
        codes = [main(["prepare", out + "/t.npy", "-o", out + "/c", "--format", "zarr", "--no-progress"]),
                 main(["verify", out + "/z", "--no-progress"]),
                 main(["export", out + "/z", out + "/w", "--to", "webdataset", "--no-progress"])]
        print("exit statuses:", [int(c) for c in codes])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("pip install shardload[zarr]") == 2, proc.stdout
    assert "exit statuses: [2, 2, 2]" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.count("shardload: error: zarr shards need the zarr package") == 3, proc.stderr


def test_format_is_registered() -> None:
    fmt = get_format("zarr")
    assert (fmt.name, fmt.writer, fmt.reader, fmt.options) == ("zarr", ZarrShardWriter, ZarrShardReader, ZarrOptions)
    assert fmt.writer.suffix == ".zarr.zip"


@pytest.mark.parametrize("compression", ["zstd", "blosc-lz4", "none"])
def test_direct_chunk_decoding_matches_zarr(tmp_path: Path, compression: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import zarr

    from shardload.formats.zarr import _chunks as chunks_module

    samples = rich_samples(60, seed=16)
    shardload.write(
        samples,
        tmp_path / "s",
        shard_format=ZarrOptions(compression=compression, chunk_size=200),
        num_shards=1,
        fixed_fields=["emb"],
    )
    ss = shardload.open(tmp_path / "s")
    path = tmp_path / "s" / ss.shards[0].file
    group = zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r")
    for f in ss.schema.fields:
        # The writer's own layouts take the direct path; anything else would go through zarr.
        assert chunks_module.ChunkDecoder.for_array(group[f"{f.name}/values"]) is not None, f.name
    direct = ZarrShardReader(path, ss.schema, cache=ChunkCache(0)).columns()
    monkeypatch.setattr(chunks_module.ChunkDecoder, "for_array", classmethod(lambda cls, arr: None))
    through_zarr = ZarrShardReader(path, ss.schema, cache=ChunkCache(0)).columns()
    for i in range(len(ss)):
        assert_same_sample(direct.sample(i), through_zarr.sample(i))
