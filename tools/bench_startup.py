#!/usr/bin/env python
"""Time to first batch: from ``make_loader(path)`` to the first batch in hand.

Writes (once, cached under ``--cache-dir``) a shard set of ``--samples`` int32
token samples in ``--shards`` shards, then measures, for ``batch_size`` and for
``max_tokens`` batching, rank 0 of ``--world-size``, ``num_workers=0``:

* **cold**: a new Python process, with every file of the shard set evicted
  from the page cache first (``posix_fadvise(DONTNEED)``, no root needed), so
  the manifest, the lengths index and the first shard come from the disk;
* **new process**: a new Python process, files in the page cache;
* **warm**: the same process again (imports, page cache and allocator warm).

Each figure is the median of ``--repeats`` runs. A second start of the same
kind (another new process, files evicted again for "cold") does the same work
stage by stage, in the order ``make_loader`` and the first ``next()`` run it:
open (manifest + shard index), lengths index (memory-map), sampler and dataset
set-up, plan (``plan_rank`` for this rank), first batch (the DataLoader
iterator, the dataset's own open of the set, mapping the first shards,
collate). Wall-clock figures on a busy machine include waiting for a CPU, so
each start also reports its CPU time (``time.process_time``); the stages are
given in CPU seconds and their sum is checked against the end-to-end CPU
time. ``import torch, shardload.load.loader`` is timed separately: a process pays
it once, before ``make_loader``.

    python tools/bench_startup.py --scale 0.01           # smoke run: 10k samples, 10 shards
    python tools/bench_startup.py                        # 1M samples, 1,000 shards
    python tools/bench_startup.py --profile              # plus a cProfile of one cold start

``--open-only 10000,100000,1000000`` measures instead what opening costs with
many shards: for each count it writes (once, cached) a set of that many
one-sample shards (the manifest and the lengths index; no shard file is
written, and none is opened), then opens it in ``--repeats`` new processes
(``shardload.open(path)``: manifest, shard table and shard index) and reports
the median wall and CPU seconds and the memory that opening added to the
process (peak resident set, ``ru_maxrss``, after minus before).

    python tools/bench_startup.py --open-only 10000,100000,1000000 --repeats 3
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import shardload
from shardload.testing import long_tailed_lengths

DEFAULT_CACHE = Path(tempfile.gettempdir()) / "shardload-bench-mem"
STAGES = ("open", "lengths", "loader", "plan", "first batch")


def cached_shard_set(cache: Path, samples: int, shards: int, median: float, seed: int) -> tuple[Path, float]:
    """The shard set (written on first use); returns its path and the seconds spent writing it."""
    path = cache / f"startup-{samples}x{shards}-median{median:g}-seed{seed}"
    if (path / "manifest.json").exists():
        return path, 0.0
    cache.mkdir(parents=True, exist_ok=True)
    lengths = long_tailed_lengths(samples, median=median, low=1, high=int(median * 16), seed=seed)
    rng = np.random.default_rng(seed + 1)
    values = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.int32)
    start = time.perf_counter()
    shardload.write(
        ({"tokens": a} for a in np.split(values, np.cumsum(lengths)[:-1])),
        path,
        num_shards=shards,
        workers=2,
        overwrite=path.exists(),
        progress=False,
    )
    return path, time.perf_counter() - start


def cached_many_shards(cache: Path, shards: int) -> tuple[Path, float]:
    """A set of ``shards`` one-sample shards: manifest and lengths index only; returns its path and write time."""
    from shardload.formats.manifest import Manifest, ShardInfo
    from shardload.schema.fields import Schema

    path = cache / f"open-{shards}"
    if (path / "manifest.json").exists():
        return path, 0.0
    path.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    digest = "sha256:" + "0" * 64
    infos = tuple(ShardInfo(f"shards/shard-{k:06d}.arrow", 1, 1000, digest, k, 4) for k in range(shards))
    schema = Schema.from_json({"fields": [{"name": "tokens", "dtype": "int32", "shape": [None]}]})
    np.save(path / "lengths.npy", np.full(shards, 4, dtype=np.int32))
    m = Manifest(schema=schema, shard_format="arrow", shards=infos, total_samples=shards, total_tokens=4 * shards)
    getattr(m, "with_table_form", lambda: m)().write(path)  # as prepare writes it (a shardload before 0.2: JSON)
    return path, time.perf_counter() - start


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(key + ":"))


def open_probe(path: str) -> dict[str, float]:
    """Body of a fresh process: ``shardload.open(path)``; wall, CPU, and resident memory growth (MB).

    The peak is the kernel's high-water mark (``VmHWM``), reset just before
    the open (``/proc/self/clear_refs``), so the imports' own peak is left out.
    """
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current resident set
    before = _status_kb("VmRSS")
    wall, cpu = _now()
    ss = shardload.open(path)
    wall2, cpu2 = _now()
    assert len(ss.shards) == len(ss)
    peak, now = _status_kb("VmHWM"), _status_kb("VmRSS")
    return {
        "open": wall2 - wall,
        "open cpu": cpu2 - cpu,
        "rss MB": (now - before) / 1024,
        "peak MB": (peak - before) / 1024,
    }


def open_only(args: argparse.Namespace) -> int:
    """``--open-only``: the cost of opening sets of many shards, each count in new processes."""
    print("$ " + shlex.join(["python", *sys.argv]))
    print(f"shardload {shardload.__version__}, python {platform.python_version()}, load {os.getloadavg()[0]:.1f}")
    print(
        f"{'shards':>10}  {'manifest kB':>11}  {'other kB':>9}  {'open s':>7}  {'cpu s':>6}  {'+RSS MB':>8}  {'+peak MB':>8}"
    )
    for count in (int(c) for c in args.open_only.split(",")):
        path, wrote = cached_many_shards(args.cache_dir, count)
        other = sum(f.stat().st_size for f in path.iterdir() if f.name not in ("manifest.json", "lengths.npy"))
        runs = []
        for _ in range(args.repeats):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", json.dumps({"open": str(path)})]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        r = median_of(runs)
        print(
            f"{count:>10,}  {(path / 'manifest.json').stat().st_size / 1e3:>11,.0f}  {other / 1e3:>9,.0f}  "
            f"{r['open']:>7.3f}  {r['open cpu']:>6.3f}  {r['rss MB']:>8.1f}  {r['peak MB']:>8.1f}"
            + (f"   (set written in {wrote:.0f} s)" if wrote else "")
        )
    print(
        f"median of {args.repeats} new processes each; '+RSS MB': resident set after the open minus before it; "
        "'+peak MB': its high-water mark during the open minus the resident set before it"
    )
    return 0


def evict(path: Path) -> None:
    """Drop the shard set's files from the page cache (clean pages only; no root needed)."""
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _batching(spec: dict[str, int]) -> Any:
    from shardload.plan import Batching

    return Batching(batch_size=spec.get("batch_size"), max_tokens=spec.get("max_tokens"))


def time_total(path: str, batching: dict[str, int], world_size: int) -> dict[str, float]:
    """End to end: ``make_loader(path)`` then the first ``next()``; wall and CPU seconds."""
    from shardload.load.loader import make_loader

    wall, cpu = _now()
    loader = make_loader(path, rank=0, world_size=world_size, batching=_batching(batching))
    first = next(iter(loader))
    wall2, cpu2 = _now()
    assert first["tokens"].shape[0] >= 1
    return {"total": wall2 - wall, "total cpu": cpu2 - cpu}


def time_stages(path: str, batching: dict[str, int], world_size: int) -> dict[str, float]:
    """The same work as :func:`time_total`, stage by stage (CPU seconds, and the wall sum)."""
    from shardload.load.loader import make_loader
    from shardload.sets.shardset import ShardSet

    t = [_now()]
    ss = ShardSet(path)
    t.append(_now())
    _ = ss.lengths
    t.append(_now())
    loader = make_loader(ss, rank=0, world_size=world_size, batching=_batching(batching))
    t.append(_now())
    loader.plan_sampler.plan()
    t.append(_now())
    next(iter(loader))
    t.append(_now())
    stages = {name: b[1] - a[1] for name, a, b in zip(STAGES, t[:-1], t[1:], strict=True)}
    return {**stages, "stage sum": t[-1][1] - t[0][1], "stage wall": t[-1][0] - t[0][0]}


def start_once(path: str, batching: dict[str, int], world_size: int) -> dict[str, float]:
    """One warm start, end to end, then again stage by stage."""
    return {**time_total(path, batching, world_size), **time_stages(path, batching, world_size)}


def probe_main(spec: dict[str, Any]) -> None:
    """Body of a fresh process: time the imports and one start (total or stages), print JSON."""
    if "open" in spec:
        print(json.dumps(open_probe(spec["open"])))
        return
    t0 = time.perf_counter()
    import torch  # noqa: F401

    import shardload.load.loader  # noqa: F401

    imports = time.perf_counter() - t0
    if spec["what"] == "profile":
        prof = cProfile.Profile()
        prof.enable()
        time_total(spec["path"], spec["batching"], spec["world_size"])
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(spec["top"])
        print(buf.getvalue())
        return
    timer = time_total if spec["what"] == "total" else time_stages
    out = timer(spec["path"], spec["batching"], spec["world_size"])
    print(json.dumps({"imports": imports, **out}))


def in_new_process(path: Path, batching: dict[str, int], world_size: int, cold: bool) -> dict[str, float]:
    """One end-to-end start and, in another new process, one start stage by stage."""
    out: dict[str, float] = {}
    for what in ("total", "stages"):
        if cold:
            evict(path)
        spec = {"path": str(path), "batching": batching, "world_size": world_size, "what": what}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", json.dumps(spec)]
        run = subprocess.run(cmd, check=True, capture_output=True, text=True)
        res = json.loads(run.stdout.strip().splitlines()[-1])
        if what == "total":
            out["imports"] = res["imports"]
        out.update({k: v for k, v in res.items() if k != "imports"})
    return out


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def profile_cold(path: Path, batching: dict[str, int], world_size: int, top: int) -> str:
    """cProfile of one end-to-end start in a new process after evicting the files (imports not profiled)."""
    evict(path)
    spec = {"path": str(path), "batching": batching, "world_size": world_size, "what": "profile", "top": top}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", json.dumps(spec)]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1_000_000, help="samples in the set (before --scale)")
    p.add_argument("--shards", type=int, default=1000, help="shards in the set (before --scale)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply --samples and --shards by this")
    p.add_argument("--median", type=float, default=32, help="median tokens per sample")
    p.add_argument("--world-size", type=int, default=4, help="rank 0 of this many plans its share")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--target", type=float, default=0.5, help="seconds to first batch to aim for")
    p.add_argument("--profile", action="store_true", help="print a cProfile of one cold start per batching")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="generated shard sets, reused across runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    p.add_argument("--open-only", metavar="COUNTS", help="only time opening sets of these many shards (1,2,...)")
    p.add_argument("--probe", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:
        probe_main(json.loads(args.probe))
        return 0
    if args.open_only:
        return open_only(args)

    print("$ " + shlex.join(["python", *sys.argv]))
    samples, shards = int(args.samples * args.scale), max(1, int(args.shards * args.scale))
    path, wrote = cached_shard_set(args.cache_dir, samples, shards, args.median, args.seed)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    print(
        f"set: {samples:,} samples, {shards:,} shards, {size / 1e6:,.0f} MB, manifest "
        f"{(path / 'manifest.json').stat().st_size / 1e3:,.0f} kB"
        + (f" (written in {wrote:.0f} s)" if wrote else " (cached)")
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"numpy {np.__version__}, shardload {shardload.__version__}, load average {os.getloadavg()[0]:.1f}"
    )

    rows: list[tuple[str, str, dict[str, float]]] = []
    for label, batching in (
        (f"batch_size={args.batch_size}", {"batch_size": args.batch_size}),
        (f"max_tokens={args.max_tokens}", {"max_tokens": args.max_tokens}),
    ):
        cold = [in_new_process(path, batching, args.world_size, cold=True) for _ in range(args.repeats)]
        fresh = [in_new_process(path, batching, args.world_size, cold=False) for _ in range(args.repeats)]
        warm = [start_once(str(path), batching, args.world_size) for _ in range(args.repeats + 1)][1:]
        rows += [(label, "cold", median_of(cold)), (label, "new process", median_of(fresh))]
        rows.append((label, "warm", median_of(warm)))

    print(f"\nrank 0 of {args.world_size}, num_workers=0; seconds, median of {args.repeats}")
    cols = (*STAGES, "stage sum")
    head = (
        f"{'batching':<18}  {'start':<11}  {'import':>6}  {'TO FIRST BATCH':>14}  {'vs target':>9}  {'cpu':>6}  "
        + "  ".join(f"{s:>11}" for s in cols)
    )
    print(head)
    units = "  ".join(f"{'cpu':>11}" for _ in cols)
    print(f"{'':<18}  {'':<11}  {'wall':>6}  {'wall':>14}  {'':>9}  {'':>6}  {units}")
    for label, kind, r in rows:
        imports = f"{r['imports']:6.2f}" if "imports" in r else f"{'-':>6}"
        print(
            f"{label:<18}  {kind:<11}  {imports}  {r['total']:14.3f}  {r['total'] / args.target:8.2f}x  "
            f"{r['total cpu']:6.3f}  " + "  ".join(f"{r[s]:11.3f}" for s in cols)
        )
    print(
        f"\n'TO FIRST BATCH' = make_loader(path) + next(iter(loader)), end to end, wall clock; 'vs target' = that / "
        f"{args.target:g} s (<= 1 meets it); 'cpu' = the process's CPU time over the same span (what a busy "
        "machine does not inflate; it leaves out waiting for the disk). Stages are CPU seconds of a separate "
        "start of the same kind (another new process, files evicted again for 'cold'). import = wall time of "
        "`import torch, shardload.load.loader` in the new process (not part of the total). "
        f"Load average now {os.getloadavg()[0]:.1f}."
    )
    if args.profile:
        for label, batching in (
            (f"batch_size={args.batch_size}", {"batch_size": args.batch_size}),
            (f"max_tokens={args.max_tokens}", {"max_tokens": args.max_tokens}),
        ):
            print(f"\n--- cProfile, {label}: new process, files evicted, after the imports ---")
            print(profile_cold(path, batching, args.world_size, top=40))
    if args.json:
        print(json.dumps([{"batching": b, "start": k, **r} for b, k, r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
