#!/usr/bin/env python
"""Zarr shards against Arrow shards: disk size, and read speed through the loader.

Generates N long-tailed samples with :func:`shardload.testing.synthetic_samples`
(``tokens`` int32 from a 1,000-word vocabulary, ``features`` float32 standard
normal rows, ``label`` int64), writes them once per format, and reports:

  * bytes on disk and the ratio to Arrow;
  * one training epoch through ``make_loader`` (shuffled: Zarr sets in their default chunk windows; batch_size 64,
    num_workers=0): samples/s and payload MB/s, page cache warm;
  * the same epoch with the Zarr chunk cache turned off, to show what it saves;
  * zip store vs directory store: every chunk of every values array of the
    zstd set read once in random order with plain zarr, from the ``.zarr.zip``
    files and from the same stores unpacked into directories.

MB/s are of uncompressed payload, so every row compares the same work.

    python tools/bench_zarr.py                    # 20k samples, ~90 MB, ~1-2 min on 2 cores
    python tools/bench_zarr.py --samples 50000 --json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import shardload
from shardload.formats.zarr import chunk_cache, set_chunk_cache_bytes
from shardload.formats.zarr.cache import DEFAULT_CACHE_BYTES
from shardload.testing import synthetic_samples

VARIANTS: list[tuple[str, dict[str, Any]]] = [  # shard_format "arrow", else ZarrOptions' fields
    ("arrow", {}),
    ("zarr zstd-3", {"compression": "zstd"}),
    ("zarr zstd-9", {"compression": "zstd", "compression_level": 9}),
    ("zarr blosc-lz4-5", {"compression": "blosc-lz4"}),
    ("zarr none", {"compression": "none"}),
]


def payload_bytes(samples: list[dict[str, np.ndarray]]) -> int:
    return sum(a.nbytes for s in samples for a in s.values())


def epoch(path: Path, max_batches: int | None = None) -> tuple[float, int, int]:
    """Seconds for one shuffled training epoch (or its first batches), payload bytes and samples returned."""
    loader = shardload.make_loader(path, rank=0, world_size=1, stage="train", batch_size=64, seed=0)
    t0 = time.perf_counter()
    nbytes = samples = 0
    for k, batch in enumerate(loader):
        if max_batches is not None and k == max_batches:
            break
        for name in ("tokens", "features"):
            nbytes += int(batch[f"{name}_lengths"].sum()) * batch[name][0, :1].numel() * batch[name].element_size()
        nbytes += batch["label"].numel() * 8
        samples += len(batch["sample_id"])
    return time.perf_counter() - t0, nbytes, samples


def read_every_chunk(stores: list[Any], seed: int = 0) -> tuple[float, int, int]:
    """Read every chunk of every values array of ``stores`` once, in random order, with plain zarr."""
    import zarr

    jobs = []
    for store in stores:
        group = zarr.open_group(store, mode="r")
        for name in ("tokens", "features", "label"):
            arr = group[f"{name}/values"]
            assert isinstance(arr, zarr.Array)
            rows = arr.chunks[0]
            jobs += [(arr, c * rows, min((c + 1) * rows, arr.shape[0])) for c in range(-(-arr.shape[0] // rows))]
    order = np.random.default_rng(seed).permutation(len(jobs))
    t0 = time.perf_counter()
    nbytes = 0
    for j in order:
        arr, a, b = jobs[j]
        nbytes += arr[a:b].nbytes
    return time.perf_counter() - t0, nbytes, len(jobs)


def zip_vs_directory(zarr_set: Path, work: Path) -> dict[str, Any]:
    import zarr

    zips = sorted((zarr_set / "shards").glob("*.zarr.zip"))
    dirs = []
    for z in zips:
        d = work / z.name.replace(".zarr.zip", ".zarr")
        with zipfile.ZipFile(z) as zf:
            zf.extractall(d)
        dirs.append(d)
    out = {}
    for label, stores in (
        ("zip", lambda: [zarr.storage.ZipStore(z, mode="r") for z in zips]),
        ("directory", lambda: [zarr.storage.LocalStore(d, read_only=True) for d in dirs]),
    ):
        read_every_chunk(stores())  # warm the page cache and zarr's event loop
        best = min((read_every_chunk(stores()) for _ in range(3)), key=lambda r: r[0])
        seconds, nbytes, chunks = best
        out[label] = {
            "seconds": round(seconds, 3),
            "chunks": chunks,
            "chunks_per_s": round(chunks / seconds),
            "mb_per_s": round(nbytes / seconds / 1e6, 1),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=20_000)
    p.add_argument("--median-tokens", type=float, default=256)
    p.add_argument("--median-rows", type=float, default=32)
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--chunk-size", type=int, default=None, help="zarr chunk size in bytes (default: the library's)")
    p.add_argument("--only", nargs="*", default=None, help="run only these variants (labels as printed)")
    p.add_argument("--no-cache-batches", type=int, default=20, help="batches timed with the chunk cache off")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)

    samples = synthetic_samples(
        args.samples, seed=0, median_tokens=args.median_tokens, median_rows=args.median_rows, channels=args.channels
    )
    payload = payload_bytes(samples)
    results: dict[str, Any] = {
        "samples": args.samples,
        "payload_mb": round(payload / 1e6, 1),
        "machine": f"{platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}",
        "chunk_size": args.chunk_size,
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-zarr-") as tmp:
        root = Path(tmp)
        arrow_bytes = 0
        for label, options in VARIANTS:
            if args.only and label not in args.only and label != "arrow":
                continue
            shard_format: Any = "arrow"
            if label != "arrow":
                chunk = {"chunk_size": args.chunk_size} if args.chunk_size else {}
                shard_format = shardload.ZarrOptions(**options, **chunk)
            out = root / label.replace(" ", "_")
            t0 = time.perf_counter()
            shardload.write(samples, out, progress=False, shard_format=shard_format)
            write_s = time.perf_counter() - t0
            disk = sum(s.bytes for s in shardload.open(out).shards)
            arrow_bytes = arrow_bytes or disk
            epoch(out)  # warm the page cache
            chunk_cache().clear()
            seconds, nbytes, _ = epoch(out)
            row = {
                "write_s": round(write_s, 2),
                "disk_mb": round(disk / 1e6, 2),
                "vs_arrow": round(disk / arrow_bytes, 3),
                "epoch_s": round(seconds, 2),
                "samples_per_s": round(args.samples / seconds),
                "mb_per_s": round(nbytes / seconds / 1e6, 1),
            }
            if label != "arrow":
                cache = chunk_cache()
                row["chunk_loads"], row["cache_hits"] = cache.loads, cache.hits
            if label == "zarr zstd-3":
                # Without the cache every sample decodes its whole chunk: time the first batches only.
                set_chunk_cache_bytes(0)
                chunk_cache().clear()
                no_cache_s, _, no_cache_samples = epoch(out, max_batches=args.no_cache_batches)
                row["samples_per_s_without_cache"] = round(no_cache_samples / no_cache_s)
                row["chunk_loads_per_sample_without_cache"] = round(chunk_cache().loads / no_cache_samples, 2)
                set_chunk_cache_bytes(DEFAULT_CACHE_BYTES)
            results["variants"][label] = row
            if label == "zarr zstd-3":
                results["zip_vs_directory"] = zip_vs_directory(out, root / "unzipped")
                shutil.rmtree(root / "unzipped")
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{results['samples']:,} samples, {results['payload_mb']} MB of payload ({results['machine']})")
    print(
        f"{'variant':<18} {'disk MB':>8} {'vs arrow':>8} {'write s':>8} {'epoch s':>8} {'samples/s':>10} "
        f"{'MB/s':>7} {'chunk loads':>11} {'cache hits':>10}"
    )
    for label, r in results["variants"].items():
        print(
            f"{label:<18} {r['disk_mb']:>8} {r['vs_arrow']:>8} {r['write_s']:>8} {r['epoch_s']:>8} "
            f"{r['samples_per_s']:>10,} {r['mb_per_s']:>7} {r.get('chunk_loads', '-'):>11} "
            f"{r.get('cache_hits', '-'):>10}"
        )
    z = results["variants"].get("zarr zstd-3")
    if z is None:
        return 0
    print(
        f"zarr zstd-3 with the chunk cache off: {z['samples_per_s_without_cache']:,} samples/s "
        f"({z['chunk_loads_per_sample_without_cache']} chunk decodes per sample)"
    )
    zd = results["zip_vs_directory"]
    for label in ("zip", "directory"):
        print(
            f"zstd chunks from a {label:<9}: {zd[label]['chunks']} chunks in {zd[label]['seconds']} s, "
            f"{zd[label]['chunks_per_s']:,} chunks/s, {zd[label]['mb_per_s']} MB/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
