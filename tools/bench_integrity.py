#!/usr/bin/env python
"""Cost of the shard integrity checks: the per-batch file stamp check and the set id at prepare.

(1) One stamp check (``fstat`` of the shard's descriptor, compared with the
    stamp taken when it was mapped), and ``ShardBatchDataset.fetch`` of a few
    batch shapes, which runs it twice per shard the batch reads.
(2) The set id: CRC-32 of every staged chunk, as a share of a whole prepare
    of long-tailed int32 token samples.

    python tools/bench_integrity.py               # ~10 s on 2 cores
    python tools/bench_integrity.py --scale 0.05  # smoke run: fewer timed calls, a smaller prepare
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import tempfile
import time
import timeit
from typing import Any

import numpy as np

import shardload
from shardload.load.dataset import ShardBatchDataset
from shardload.testing import synthetic_samples


def per_batch(tmp: str, scale: float) -> None:
    shardload.write(synthetic_samples(4000, seed=3), f"{tmp}/a", num_shards=8, progress=False)
    ds = ShardBatchDataset(f"{tmp}/a")
    ss = ds.shard_set
    assert isinstance(ss, shardload.ShardSet)
    for k in range(8):
        ss.shard_columns(k)
    reader = ss._readers.readers[1]
    n = max(1000, int(200_000 * scale))
    fd = reader.fileno()
    assert fd is not None
    print(f"os.fstat: {timeit.timeit(lambda: os.fstat(fd), number=n) / n * 1e6:.2f} us")
    print(
        f"stamp check (one shard): {timeit.timeit(lambda: ss._readers.check_stamp(1, reader), number=n) / n * 1e6:.2f} us"
    )
    rng = np.random.default_rng(0)
    for b, pool in ((32, 500), (32, 4000), (256, 4000)):
        ids = np.sort(rng.choice(pool, b, replace=False)).astype(np.int64)
        w = np.ones(b, np.float32)
        shards = len(np.unique(ss.index.locate(ids)[0]))
        k = max(10, int(500 * scale))
        t = min(timeit.repeat(functools.partial(ds.fetch, ids, w), number=k, repeat=5)) / k * 1e6
        print(f"fetch of {b} samples over {shards} shards: {t:.0f} us (includes {2 * shards} stamp checks)")


def set_id_share(tmp: str, scale: float) -> None:
    pipeline: Any = importlib.import_module("shardload.prepare.pipeline")
    original, spent = pipeline.set_id_of, [0.0]

    def timed(*args: Any) -> str:
        t = time.perf_counter()
        out: str = original(*args)
        spent[0] += time.perf_counter() - t
        return out

    pipeline.set_id_of = timed
    rng = np.random.default_rng(0)
    lengths = rng.lognormal(6, 1, max(500, int(40_000 * scale))).clip(1, 20_000).astype(int)
    samples = [{"tokens": rng.integers(0, 50_000, n, dtype=np.int32)} for n in lengths]
    t = time.perf_counter()
    result = shardload.write(samples, f"{tmp}/p", num_shards=4, progress=False)
    total = time.perf_counter() - t
    print(
        f"prepare of {result.bytes / 1e6:.0f} MB: {total:.2f} s, of which the set id {spent[0]:.3f} s "
        f"({100 * spent[0] / total:.1f}%)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the timed calls and the prepare by this")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        per_batch(tmp, args.scale)
        set_id_share(tmp, args.scale)
