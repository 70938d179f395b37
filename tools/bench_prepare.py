#!/usr/bin/env python
"""Prepare throughput against two naive baselines, on long-tailed int32 token samples.

Generates N samples in memory (lognormal lengths around --median tokens), then
times, each step ending with ``os.sync()`` so that every figure includes
getting the bytes to disk:

  (a) baseline: one ``.npy`` file per sample (``np.save``);
  (b) baseline: one concatenated raw file of values + one of offsets;
  (c) ``shardload.write(samples, out, workers=1)``           (from memory);
  (d) ``shardload.prepare(npy_dir, out, workers=W)``         (reads the files of (a));
  (e) ``shardload.sets.verify.verify(out)`` of (d)                (page cache warm).

MB/s are of payload (token bytes), so every step is compared on the same work.

``--big MB`` runs instead the side-by-side suite of ``docs/benchmarks.md`` ("Prepare") on one JSON Lines file
of token lists of about MB megabytes (and the same samples as one Parquet file and as a directory of ``.npy``
files): shardload with 1 and 2 workers against HF datasets (``load_dataset("json")`` + ``save_to_disk``),
pyarrow's JSON parse alone, and ``pyarrow.parquet.read_table`` + writing the same Arrow IPC bytes. It reports
input MB/s (bytes of the source files) and output MB/s (bytes written) separately, the CPU seconds of each
step (this process and its worker processes: the work done, which the load of a shared machine does not
inflate as it does wall time), and ratios against the baselines of the same run. HF datasets (the JSONL baseline), LitData and Mosaic Streaming come with ``pip install shardload[bench]``; a missing one is skipped and said so (no JSONL ratios without HF datasets).

    python tools/bench_prepare.py                  # 50k samples, ~70 MB, ~1 min on 2 cores
    python tools/bench_prepare.py --scale 5 --workers 8
    python tools/bench_prepare.py --big 166        # the prepare table of docs/benchmarks.md, ~3 min on 2 cores
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import resource
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
from shardload.prepare.sources.jsonl import _simd
from shardload.sets.verify import verify
from shardload.testing import long_tailed_lengths


def make_samples(n: int, median: float, seed: int) -> list[dict[str, np.ndarray]]:
    lengths = long_tailed_lengths(n, median=median, low=1, high=int(median * 32), seed=seed)
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.int32)
    cuts = np.cumsum(lengths)[:-1]
    # own buffers, like real decoded samples
    return [{"tokens": a.copy()} for a in np.split(values, cuts)]


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children (worker processes): on a machine
    shared with other jobs, the work a step did, where its wall time also counts the others' load."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


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
            fh.write(np.ascontiguousarray(s["tokens"]).data)
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
    p.add_argument("--big", type=float, metavar="MB", help="run the big-file suite on a JSONL file of about MB MB")
    args = p.parse_args(argv)
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    if args.big:
        return big_file_suite(args)

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


# -- the big-file suite ------------------------------------------------------------------------------------
def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def make_big_inputs(root: Path, mb: float, median: float, seed: int) -> tuple[Path, Path, Path, int]:
    """A JSONL file of token lists of about ``mb`` MB, the same samples as Parquet, and 20k of them as .npy files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    jsonl, n = root / "tokens.jsonl", 0
    lengths_all, values_all = [], []
    with open(jsonl, "w") as fh:
        while fh.tell() < mb * 1e6:
            lengths = long_tailed_lengths(4096, median=median, low=1, high=int(median * 32), seed=seed + n)
            values = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.int64)
            for row in np.split(values, np.cumsum(lengths)[:-1]):
                fh.write('{"tokens": [' + ", ".join(map(str, row.tolist())) + "]}\n")
            lengths_all.append(lengths)
            values_all.append(values)
            n += len(lengths)
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths_all))]).astype(np.int64)
    flat = np.concatenate(values_all)
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat))
    parquet = root / "tokens.parquet"
    pq.write_table(pa.table({"tokens": tokens}), parquet, row_group_size=16_384)
    npy = root / "npy"
    npy.mkdir()
    for i in range(min(n, 20_000)):
        np.save(npy / f"s{i:08d}.npy", flat[offsets[i] : offsets[i + 1]].astype(np.int32))
    return jsonl, parquet, npy, n


def hf_datasets(src: Path, out: Path) -> None:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.load_dataset("json", data_files=str(src), split="train", cache_dir=str(out.parent / "hf-cache"))
    ds.save_to_disk(str(out))


def pyarrow_json_parse(src: Path) -> None:
    import pyarrow as pa
    import pyarrow.json as pj

    pj.read_json(src, parse_options=pj.ParseOptions(explicit_schema=pa.schema([("tokens", pa.list_(pa.int64()))])))


def read_table_and_write(src: Path, out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    with pa.OSFile(str(out), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def big_file_suite(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="bench_prepare_big-", dir=args.workdir))
    rows: list[dict[str, Any]] = []
    try:
        t0 = time.perf_counter()
        jsonl, parquet, npy, n = make_big_inputs(root, args.big, args.median, args.seed)
        print(
            f"{n:,} samples of int64 tokens (median {args.median:g}): {tree_bytes(jsonl) / 1e6:.1f} MB JSONL, "
            f"{tree_bytes(parquet) / 1e6:.1f} MB Parquet, {tree_bytes(npy) / 1e6:.1f} MB in "
            f"{len(list(npy.iterdir())):,} .npy files (made in {time.perf_counter() - t0:.0f} s)"
        )
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
            f"shardload {shardload.__version__}, load average {os.getloadavg()[0]:.1f} (shared machine); JSON "
            f"parser: {'simdjson (the fast-json extra)' if _simd.available() else 'pyarrow (no fast-json extra)'}"
        )

        def step(name: str, src: Path, out: Path | None, fn: Callable[[], Any]) -> None:
            cpu0 = cpu_seconds()
            secs, _ = timed(fn)
            cpu = cpu_seconds() - cpu0
            written = tree_bytes(out) if out is not None and out.exists() else 0
            rows.append({"step": name, "seconds": secs, "cpu": cpu, "in": tree_bytes(src), "out": written})
            print(f"  {name}: {secs:.2f} s ({cpu:.2f} CPU s)", flush=True)

        def ours(kind: str, src: Path, tag: str, **kw: Any) -> None:
            """Time ``shardload.prepare`` of ``src`` with 1 and with 2 workers."""
            for w in (1, 2):
                out = root / f"{tag}{w}"
                run = functools.partial(shardload.prepare, src, out, workers=w, progress=False, **kw)
                step(f"{kind}: shardload prepare, workers={w}", src, out, run)

        ours("JSONL", jsonl, "j")
        if importlib.util.find_spec("datasets") is None:  # not imported here: its import is part of its step
            print("  HF datasets: not installed, skipped (pip install shardload[bench]); JSONL rows have no baseline")
        else:
            step(
                "JSONL: HF datasets load_dataset + save_to_disk",
                jsonl,
                root / "hf",
                lambda: hf_datasets(jsonl, root / "hf"),
            )
        step("JSONL: pyarrow.json.read_json (parse only)", jsonl, None, lambda: pyarrow_json_parse(jsonl))
        ours("Parquet", parquet, "p")
        step(
            "Parquet: pq.read_table + write Arrow IPC",
            parquet,
            root / "p.arrow",
            lambda: read_table_and_write(parquet, root / "p.arrow"),
        )
        ours("npy dir", npy, "n", field="tokens")
        for name in ("litdata", "streaming"):
            try:
                __import__(name)
                print(f"  {name} is installed but not wired into this suite yet")
            except ImportError:
                print(f"  {name}: not installed, skipped (pip install shardload[bench])")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept: {root}")
    secs = {r["step"]: r["seconds"] for r in rows}
    base = {
        "JSONL": secs.get("JSONL: HF datasets load_dataset + save_to_disk"),
        "Parquet": secs["Parquet: pq.read_table + write Arrow IPC"],
        "npy dir": secs["npy dir: shardload prepare, workers=1"],
    }
    print("\n| step | seconds | CPU seconds | input MB/s | output MB/s | vs baseline |\n|---|---:|---:|---:|---:|---:|")
    for r in rows:
        kind = r["step"].split(":")[0]
        out = f"{r['out'] / r['seconds'] / 1e6:.1f}" if r["out"] else "-"
        ratio = "-" if base[kind] is None else f"{base[kind] / r['seconds']:.2f}x"
        mb_in = r["in"] / r["seconds"] / 1e6
        print(f"| {r['step']} | {r['seconds']:.2f} | {r['cpu']:.2f} | {mb_in:.1f} | {out} | {ratio} |")
    w1, w2 = secs["JSONL: shardload prepare, workers=1"], secs["JSONL: shardload prepare, workers=2"]
    vs_hf = "-" if base["JSONL"] is None else f"{base['JSONL'] / w2:.2f}x"
    print(
        f"\nJSONL workers=2 vs HF datasets: {vs_hf} (target 2x); vs workers=1: {w1 / w2:.2f}x "
        f"(target 1.7x). Parquet workers=2 vs read_table+write: {secs['Parquet: shardload prepare, workers=2'] / base['Parquet']:.2f}x "
        f"the time (target at most 1.5x). Baselines: HF datasets (JSONL), read_table+write (Parquet), workers=1 "
        f"(npy). Load average now {os.getloadavg()[0]:.1f}."
    )
    if args.json:
        print(json.dumps({"samples": n, "steps": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
