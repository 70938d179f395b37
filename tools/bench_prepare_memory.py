#!/usr/bin/env python
"""Peak memory of prepare against the shard size, for uint8, int32 and float32 data.

For each dtype and each size in ``--shard-mb``, ``shardload.write`` prepares that many MB of long-tailed
variable-length samples (generated lazily, so the input is never held in
memory) into ONE shard, shuffled, with one worker, in a fresh process per run.
Each process reports ``VmHWM`` (peak resident set) minus its ``VmRSS`` just
before the run (the interpreter, numpy and pyarrow), and the ratio of that
delta to the shard's data bytes; with two sizes or more, also the *marginal*
ratio (extra peak per extra byte of shard, between the smallest and the largest
size), which leaves out fixed costs (imports done during the run, ingest's
buffers). Two methods run in the same invocation:

* **current**: shardload's gather (:mod:`shardload.prepare.gather`);
* **legacy** (baseline): the gather shardload used before, kept below: an
  int64 position per element, per chunk and again to restore the order.

Staging chunks are 8 MiB (``chunk_bytes``), so that ingest (at most about two
chunks in memory) stays small next to the shard and the figure is the shard
write's.

    python tools/bench_prepare_memory.py                 # 32 and 64 MB shards, ~1.5 min on 2 cores
    python tools/bench_prepare_memory.py --shard-mb 64 256 --methods current
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

DTYPES = ("uint8", "int32", "float32")
METHODS = ("legacy", "current")


def samples(payload: int, dtype: str, median: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    """Samples of ``dtype`` with lognormal lengths around ``median`` until ``payload`` bytes are yielded."""
    rng = np.random.default_rng(seed)
    itemsize = np.dtype(dtype).itemsize
    left = payload // itemsize
    while left > 0:
        n = int(min(left, max(1, rng.lognormal(np.log(median), 0.8))))
        left -= n
        if dtype == "float32":
            yield {"x": rng.standard_normal(n, dtype=np.float32)}
        else:
            yield {"x": rng.integers(0, np.iinfo(dtype).max, size=n, dtype=dtype, endpoint=True)}


def legacy_gather(schema: Any, positions: Any, chunk_paths: Sequence[Path], chunk_starts: Any) -> Any:
    """The gather of shardload <= 0.1 (the baseline): an int64 index per element, twice."""
    from shardload.formats.arrow import ArrowShardReader
    from shardload.formats.base import concat_columns

    chunk_of = np.searchsorted(chunk_starts, positions, side="right") - 1
    by_chunk = np.argsort(chunk_of, kind="stable")
    parts = []
    for c in np.unique(chunk_of):
        sel = by_chunk[chunk_of[by_chunk] == c]
        cols = ArrowShardReader(chunk_paths[c], schema).columns()
        parts.append(cols.take(positions[sel] - chunk_starts[c]))
    grouped = concat_columns(schema, parts)
    inverse = np.empty_like(by_chunk)
    inverse[by_chunk] = np.arange(len(by_chunk))
    return grouped.take(inverse)


def proc_status() -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def child(dtype: str, method: str, shard_mb: float, median: int, seed: int, workdir: str) -> dict[str, Any]:
    """One measured run (in its own process)."""
    import shardload

    pipeline = importlib.import_module("shardload.prepare.pipeline")  # shardload.prepare is also a function
    if method == "legacy":
        pipeline.gather = legacy_gather  # type: ignore[attr-defined]  # what pipeline calls, by its module name
    payload = int(shard_mb * 1e6)
    out = Path(tempfile.mkdtemp(prefix="bench_prepare_memory-", dir=workdir)) / "set"
    before = proc_status()["VmRSS"]
    t0 = time.perf_counter()
    result = shardload.write(
        samples(payload, dtype, median, seed),
        out,
        num_shards=1,
        chunk_bytes=8 << 20,
        workers=1,
        progress=False,
    )
    seconds = time.perf_counter() - t0
    peak = proc_status()["VmHWM"]
    shard = sum(s.bytes for s in shardload.open(out).shards)
    return {
        "dtype": dtype,
        "method": method,
        "samples": result.samples,
        "data_bytes": payload,
        "shard_bytes": shard,
        "base_rss": before,
        "peak_delta": peak - before,
        "ratio": round((peak - before) / payload, 2),
        "seconds": round(seconds, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shard-mb", type=float, nargs="+", default=[32, 64], help="data per shard, MB (default 32 64)")
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--median", type=int, default=256, help="median elements per sample")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None, help="where to write (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    p.add_argument("--child", nargs=2, metavar=("DTYPE", "METHOD"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        workdir = args.workdir or tempfile.gettempdir()
        dtype, method = args.child
        print(json.dumps(child(dtype, method, args.shard_mb[0], args.median, args.seed, workdir)))
        return 0

    import shardload

    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"numpy {np.__version__}, shardload {shardload.__version__}, load average {os.getloadavg()[0]:.1f}"
    )
    sizes = sorted(args.shard_mb)
    print(f"one shard of {' / '.join(f'{mb:g}' for mb in sizes)} MB of data, median {args.median} elements per sample")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_prepare_memory-", dir=args.workdir) as tmp:
        for dtype in args.dtypes:
            for method in args.methods:
                runs = []
                for mb in sizes:
                    cmd = [sys.executable, __file__, "--child", dtype, method, "--shard-mb", str(mb)]
                    cmd += ["--median", str(args.median), "--seed", str(args.seed), "--workdir", tmp]
                    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=True)
                    runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
                rows.extend(runs)
                cells = ", ".join(
                    f"{r['data_bytes'] / 1e6:g} MB: +{r['peak_delta'] / 1e6:.0f} MB = {r['ratio']:.2f}x in {r['seconds']:.1f} s"
                    for r in runs
                )
                marginal = ""
                if len(runs) > 1:
                    lo, hi = runs[0], runs[-1]
                    slope = (hi["peak_delta"] - lo["peak_delta"]) / (hi["data_bytes"] - lo["data_bytes"])
                    marginal = f"; marginal {slope:.2f}x"
                    for r in runs:
                        r["marginal_ratio"] = round(slope, 2)
                print(f"{dtype:>8} {method:>8}: {cells}{marginal}")
    print(
        "\n(peak RSS delta: VmHWM minus VmRSS before the run; the ratio divides it by the shard's data bytes. "
        f"Load average now {os.getloadavg()[0]:.1f})"
    )
    if args.json:
        print(json.dumps({"shard_mb": args.shard_mb, "median": args.median, "runs": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
