#!/usr/bin/env python
"""Prepare throughput against two naive baselines, on long-tailed int32 token samples.

Generates N samples in memory (lognormal lengths around --median tokens), then
times, each step ending with ``os.sync()`` so that every figure includes
getting the bytes to disk:

  (a) baseline: one ``.npy`` file per sample (``np.save``);
  (b) baseline: one concatenated raw file of values + one of offsets;
  (c) ``shardload.write(samples, out, workers=1)``           (from memory);
  (d) ``shardload.prepare(npy_dir, out, workers=W)``         (reads the files of (a));
  (e) ``shardload.verify.verify(out)`` of (d)                (page cache warm).

MB/s are of payload (token bytes), so every step is compared on the same work.

    python tools/bench_prepare.py                  # 50k samples, ~70 MB, ~1 min on 2 cores
    python tools/bench_prepare.py --scale 5 --workers 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import shardload
from shardload.testing import long_tailed_lengths
from shardload.verify import verify


def make_samples(n: int, median: float, seed: int) -> list[dict[str, np.ndarray]]:
    lengths = long_tailed_lengths(n, median=median, low=1, high=int(median * 32), seed=seed)
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.int32)
    cuts = np.cumsum(lengths)[:-1]
    # own buffers, like real decoded samples
    return [{"tokens": a.copy()} for a in np.split(values, cuts)]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    os.sync()
    t0 = time.perf_counter()
    result = fn()
    os.sync()
    return time.perf_counter() - t0, result


def write_npy_files(samples: list[dict[str, np.ndarray]], d: Path) -> None:
    d.mkdir()
    for i, s in enumerate(samples):
        np.save(d / f"s{i:08d}.npy", s["tokens"])


def write_raw(samples: list[dict[str, np.ndarray]], d: Path) -> None:
    d.mkdir()
    offsets = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum([len(s["tokens"]) for s in samples], out=offsets[1:])
    with open(d / "values.bin", "wb") as fh:
        for s in samples:
            fh.write(memoryview(s["tokens"]))
        os.fsync(fh.fileno())
    offsets.tofile(d / "offsets.bin")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=50_000, help="number of samples (before --scale)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply --samples by this")
    p.add_argument("--median", type=float, default=256, help="median tokens per sample")
    p.add_argument("--workers", type=int, default=2, help="workers of step (d)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None, help="where to write (default: a temp dir, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the written files")
    p.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    args = p.parse_args(argv)

    n = int(args.samples * args.scale)
    t0 = time.perf_counter()
    samples = make_samples(n, args.median, args.seed)
    payload = sum(s["tokens"].nbytes for s in samples)
    print(
        f"{n:,} int32 samples, median {args.median:g} tokens, payload {payload / 1e6:,.1f} MB "
        f"(generated in {time.perf_counter() - t0:.1f} s)"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"numpy {np.__version__}, shardload {shardload.__version__}, load average {os.getloadavg()[0]:.1f}"
    )

    root = Path(tempfile.mkdtemp(prefix="bench_prepare-", dir=args.workdir))
    rows: list[tuple[str, float]] = []
    try:
        secs, _ = timed(lambda: write_npy_files(samples, root / "npy"))
        rows.append(("(a) np.save, one .npy per sample", secs))
        secs, _ = timed(lambda: write_raw(samples, root / "raw"))
        rows.append(("(b) one raw values file + offsets", secs))
        secs, rc = timed(lambda: shardload.write(samples, root / "write", workers=1, progress=False))
        rows.append((f"(c) shardload.write, workers=1 ({rc.shards} shards)", secs))
        secs, rd = timed(
            lambda: shardload.prepare(root / "npy", root / "prep", field="tokens", workers=args.workers, progress=False)
        )
        rows.append((f"(d) shardload.prepare of (a), workers={args.workers} ({rd.shards} shards)", secs))
        assert rc.samples == rd.samples == n
        secs, report = timed(lambda: verify(root / "prep", progress=False))
        assert report.ok, report.problems[:3]
        rows.append(("(e) shardload verify of (d), page cache warm", secs))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept: {root}")

    base_a, base_b = rows[0][1], rows[1][1]
    width = max(len(name) for name, _ in rows)
    print(f"\n{'step':<{width}}  {'seconds':>8}  {'MB/s':>8}  {'vs (a)':>7}  {'vs (b)':>7}")
    for name, secs in rows:
        mbps = payload / secs / 1e6
        print(f"{name:<{width}}  {secs:8.2f}  {mbps:8.1f}  {base_a / secs:6.2f}x  {base_b / secs:6.2f}x")
    print(
        f"\n(ratio > 1: faster than the baseline; every step's time includes os.sync(); "
        f"load average now {os.getloadavg()[0]:.1f})"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "samples": n,
                    "payload_bytes": payload,
                    "steps": [
                        {"step": name, "seconds": round(s, 3), "mb_per_s": round(payload / s / 1e6, 1)}
                        for name, s in rows
                    ],
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
