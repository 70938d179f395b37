#!/usr/bin/env python
"""Private memory per rank: shardload's loader against loading everything, 4 ranks over gloo.

For each dataset size (``--sizes``, GB of int32 token payload, long-tailed
lengths), the script writes a shard set once (cached under ``--cache-dir``,
keyed by size and seed, reused by later runs), then launches ``--world-size``
rank processes itself (``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``
in the environment, ``torch.distributed`` over gloo, like torchrun). Each rank
iterates its share for one epoch and sums every batch's tokens, in one of two
ways:

* **shardload**: ``shardload.make_loader(path, max_tokens=..., num_workers=W)``;
  shards are memory-mapped, only the ones this rank's plan touches;
* **naive** (baseline): every rank reads the whole shard set into its own
  memory (``np.fromfile`` of every shard, the leanest in-memory copy: one flat
  buffer per shard, no per-sample objects) and iterates the same planned
  batches from RAM with the same collate code.

The launcher samples every rank process (and its DataLoader workers) every
``--interval`` seconds from ``/proc/PID/smaps_rollup`` and keeps the peaks:

* USS: ``Private_Clean + Private_Dirty + Private_Hugetlb``, exactly what
  ``psutil.Process().memory_full_info().uss`` reports;
* of which ``Private_Dirty`` (anonymous and written pages: memory only this
  process holds and the kernel cannot drop) and ``Private_Clean`` (clean pages
  mapped by this process alone: for shardload, shard pages no other process
  has mapped, i.e. page cache the kernel can reclaim);
* RSS, and the total RSS and PSS of all ranks at the same instant.

    python tools/bench_memory.py --scale 0.02            # smoke run: 20 MB and 80 MB
    python tools/bench_memory.py                         # 1 GB and 4 GB, workers 0
    python tools/bench_memory.py --workers 0 2 --sizes 1 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import shardload
from shardload.testing import long_tailed_lengths

MiB = 1 << 20
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "shardload-bench-mem"


# -- data -----------------------------------------------------------------------------------------
def token_samples(payload_bytes: int, median: float, seed: int) -> Iterator[dict[str, np.ndarray]]:
    """Int32 token samples with lognormal lengths until ``payload_bytes`` of tokens are yielded."""
    # mean of a lognormal(sigma=0.8) is median * e^0.32; 10% margin, then cut at the budget
    estimate = int(payload_bytes / 4 / (median * np.exp(0.32)) * 1.1) + 16
    lengths = long_tailed_lengths(estimate, median=median, low=8, high=int(median * 16), seed=seed)
    ends = np.cumsum(lengths)
    n = max(1, int(np.searchsorted(ends, payload_bytes // 4)))
    lengths = lengths[:n]
    rng = np.random.default_rng(seed + 1)
    chunk = 20_000
    for lo in range(0, n, chunk):
        part = lengths[lo : lo + chunk]
        values = rng.integers(0, 50_000, size=int(part.sum()), dtype=np.int32)
        for sample in np.split(values, np.cumsum(part)[:-1]):
            yield {"tokens": sample}


def cached_shard_set(cache: Path, gb: float, *, median: float, shard_mb: int, seed: int) -> tuple[Path, float]:
    """The shard set of ``gb`` GB (written on first use); returns its path and the seconds spent writing."""
    path = cache / f"tokens-{gb:g}GB-median{median:g}-shard{shard_mb}MB-seed{seed}"
    if (path / "manifest.json").exists():
        return path, 0.0
    cache.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    shardload.write(
        token_samples(int(gb * 1e9), median, seed),
        path,
        shard_size=shard_mb << 20,
        workers=2,
        overwrite=path.exists(),
        progress=False,
    )
    return path, time.perf_counter() - start


# -- measuring ------------------------------------------------------------------------------------
@dataclass
class Mem:
    """Memory of one process (or a rank plus its workers), in bytes."""

    uss: int = 0
    private_dirty: int = 0
    private_clean: int = 0
    rss: int = 0
    pss: int = 0

    def __add__(self, other: Mem) -> Mem:
        return Mem(*(a + b for a, b in zip(self.astuple(), other.astuple(), strict=True)))

    def astuple(self) -> tuple[int, int, int, int, int]:
        return (self.uss, self.private_dirty, self.private_clean, self.rss, self.pss)

    def peak(self, other: Mem) -> Mem:
        return Mem(*(max(a, b) for a, b in zip(self.astuple(), other.astuple(), strict=True)))


def read_mem(pid: int) -> Mem:
    """One process's memory from ``/proc/PID/smaps_rollup`` (USS computed as psutil does)."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
        for line in fh:
            key, _, rest = line.partition(b":")
            parts = rest.split()
            if parts and parts[-1] == b"kB":
                fields[key.decode()] = int(parts[0]) * 1024
    clean, dirty = fields.get("Private_Clean", 0), fields.get("Private_Dirty", 0)
    return Mem(
        uss=clean + dirty + fields.get("Private_Hugetlb", 0),
        private_dirty=dirty,
        private_clean=clean,
        rss=fields.get("Rss", 0),
        pss=fields.get("Pss", 0),
    )


def tree_mem(pid: int) -> Mem:
    """A rank's memory plus that of its child processes (DataLoader workers)."""
    import psutil

    total = Mem()
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for p in procs:
        try:
            total = total + read_mem(p.pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass  # a worker that exited between the listing and the read
    return total


# -- one rank (a separate process) ----------------------------------------------------------------
def rank_main(job: dict[str, Any]) -> None:
    """Run one rank's epoch and write its figures to ``job["out"]`` as JSON."""
    import torch
    import torch.distributed as dist

    from shardload.load.collate import PadSpec, collate_batch
    from shardload.load.dataset import ShardBatchDataset
    from shardload.load.loader import make_loader
    from shardload.plan import Batching, EpochSpec, plan_rank

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    grouped = job["concurrent"]
    if grouped:
        dist.init_process_group("gloo")
        dist.barrier()
    baseline = read_mem(os.getpid())
    start = time.perf_counter()
    tokens_sum = 0
    batches = 0
    shard_set = shardload.open(job["path"])
    if job["mode"] == "shardload":
        loader = make_loader(shard_set, max_tokens=job["max_tokens"], num_workers=job["workers"], seed=0)
        plan = loader.plan_sampler.plan()
        for batch in loader:
            tokens_sum += int(batch["tokens"].sum(dtype=torch.int64))
            batches += 1
        # with workers the main process maps nothing; each worker holds its own ShardSet
        dataset = loader.dataset
        assert isinstance(dataset, ShardBatchDataset)
        assert isinstance(dataset.shard_set, shardload.ShardSet)
        opened = len(dataset.shard_set.open_shards) if job["workers"] == 0 else None
    else:
        # Baseline: the whole shard set in this process's memory, then this rank's planned batches.
        columns = {}
        for k, info in enumerate(shard_set.shards):
            columns[k] = _columns_in_memory(np.fromfile(shard_set.path / info.file, dtype=np.uint8))
        plan = plan_rank(
            shard_set.plan_inputs(), EpochSpec(world_size=world), Batching(max_tokens=job["max_tokens"]), rank=rank
        )
        pad = PadSpec()
        for ids, weights in plan:
            shards, rows = shard_set.index.locate(ids)
            out = collate_batch(shard_set.schema, columns.__getitem__, shards, rows, ids, weights, pad)
            tokens_sum += int(torch.from_numpy(out["tokens"]).sum(dtype=torch.int64))
            batches += 1
        opened = len(columns)
    seconds = time.perf_counter() - start
    planned = len(shard_set.index.shards_of(plan.sample_ids))
    end = read_mem(os.getpid())
    result = {
        "rank": rank,
        "batches": batches,
        "tokens_sum": tokens_sum,
        "seconds": seconds,
        "shards_planned": planned,
        "shards_opened": opened,
        "shards_total": len(shard_set.shards),
        "baseline": baseline.astuple(),
        "end": end.astuple(),
    }
    Path(job["out"]).write_text(json.dumps(result))
    if grouped:
        dist.barrier()  # every rank still holds its data: the launcher samples them together
    time.sleep(job["hold"])
    if grouped:
        dist.barrier()
        dist.destroy_process_group()


def _columns_in_memory(raw: np.ndarray) -> Any:
    """Arrow IPC bytes already in memory -> :class:`Columns` of views into ``raw`` (token sets only)."""
    import pyarrow as pa

    from shardload.formats import Columns
    from shardload.formats.base import FieldData

    batch = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(raw))).get_batch(0)
    col = batch.column("tokens")
    offsets = np.frombuffer(col.buffers()[1], dtype=np.int64, count=batch.num_rows + 1, offset=col.offset * 8)
    values = col.values.to_numpy(zero_copy_only=True)
    return Columns(num_samples=batch.num_rows, fields={"tokens": FieldData(values, offsets)})


# -- the launcher ---------------------------------------------------------------------------------
@dataclass
class RunResult:
    """The figures of one (mode, size, workers) run over all ranks."""

    mode: str
    gb: float
    workers: int
    concurrent: bool
    ranks: list[dict[str, Any]] = field(default_factory=list)
    peaks: list[Mem] = field(default_factory=list)  # per rank, rank + workers, peak of each figure
    total_rss: int = 0  # peak over samples of the sum over ranks (concurrent runs; else the sum of peaks)
    total_pss: int = 0
    wall: float = 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    job: dict[str, Any], ranks: list[int], world: int, interval: float, tmp: Path
) -> tuple[list[dict[str, Any]], list[Mem], int, int]:
    """Start ``ranks`` together, sample their memory until they exit, return their results and peaks."""
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.setdefault("OMP_NUM_THREADS", "1")
    procs = {}
    for r in ranks:
        spec = dict(job, out=str(tmp / f"rank{r}.json"))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--rank-job", json.dumps(spec)]
        procs[r] = subprocess.Popen(cmd, env=dict(env, RANK=str(r)))
    peaks = {r: Mem() for r in ranks}
    total_rss = total_pss = 0
    # Stop sampling once any rank exits: the pages it shared with the others would
    # otherwise turn "private" in the ranks still shutting down.
    while all(p.poll() is None for p in procs.values()):
        now = {r: tree_mem(p.pid) for r, p in procs.items()}
        for r, m in now.items():
            peaks[r] = peaks[r].peak(m)
        total_rss = max(total_rss, sum(m.rss for m in now.values()))
        total_pss = max(total_pss, sum(m.pss for m in now.values()))
        time.sleep(interval)
    if any(p.poll() for p in procs.values()):  # a rank failed: the others would wait at a barrier forever
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
    for p in procs.values():
        p.wait()
    failed = {r: p.returncode for r, p in procs.items() if p.returncode}
    if failed:
        raise SystemExit(f"rank processes failed: {failed}")
    results = [json.loads((tmp / f"rank{r}.json").read_text()) for r in ranks]
    return results, [peaks[r] for r in ranks], total_rss, total_pss


def run(mode: str, path: Path, gb: float, workers: int, args: argparse.Namespace, concurrent: bool) -> RunResult:
    job = {
        "mode": mode,
        "path": str(path),
        "workers": workers,
        "max_tokens": args.max_tokens,
        "concurrent": concurrent,
        "hold": max(1.0, 4 * args.interval),
    }
    res = RunResult(mode, gb, workers, concurrent)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        groups = [list(range(args.world_size))] if concurrent else [[r] for r in range(args.world_size)]
        for group in groups:
            results, peaks, rss, pss = launch(job, group, args.world_size, args.interval, Path(tmp))
            res.ranks += results
            res.peaks += peaks
            res.total_rss += rss
            res.total_pss += pss
    res.wall = time.perf_counter() - start
    counts = {r["batches"] for r in res.ranks}
    # Invariant: every rank runs the same number of batches
    assert len(counts) == 1, f"ranks ran different batch counts: {counts}"
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=float, nargs="+", default=[1.0, 4.0], help="GB of token payload (before --scale)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply --sizes by this (e.g. 0.02 for a smoke run)")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--workers", type=int, nargs="+", default=[0], help="num_workers values to run shardload with")
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--median", type=float, default=256, help="median tokens per sample")
    p.add_argument("--shard-mb", type=int, default=32, help="shard size of the generated sets")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between memory samples")
    p.add_argument(
        "--naive",
        choices=["auto", "concurrent", "sequential", "skip"],
        default="auto",
        help="run the naive ranks together, one at a time (per-rank figures are the same; the machine "
        "needs only one rank's copy), or skip them; auto: together when world_size copies fit in half "
        "the available memory",
    )
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="generated shard sets, reused across runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    p.add_argument("--rank-job", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_job:
        rank_main(json.loads(args.rank_job))
        return 0

    import psutil

    print("$ " + shlex.join(["python", *sys.argv]))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.1f} GiB RAM, "
        f"python {platform.python_version()}, numpy {np.__version__}, shardload {shardload.__version__}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    runs: list[RunResult] = []
    for gb in [s * args.scale for s in args.sizes]:
        path, wrote = cached_shard_set(args.cache_dir, gb, median=args.median, shard_mb=args.shard_mb, seed=args.seed)
        ss = shardload.open(path)
        payload = sum(i.bytes for i in ss.shards)
        print(
            f"{gb:g} GB set: {len(ss):,} samples, {len(ss.shards)} shards, {payload / 1e9:.2f} GB of shard files"
            + (f" (written in {wrote:.0f} s)" if wrote else " (cached)")
        )
        for w in args.workers:
            runs.append(run("shardload", path, gb, w, args, concurrent=True))
            print(f"  shardload workers={w}: {runs[-1].wall:.1f} s")
        if args.naive != "skip":
            fits = args.world_size * payload < psutil.virtual_memory().available / 2
            concurrent = args.naive == "concurrent" or (args.naive == "auto" and fits)
            runs.append(run("naive", path, gb, 0, args, concurrent=concurrent))
            print(f"  naive ({'together' if concurrent else 'one rank at a time'}): {runs[-1].wall:.1f} s")
            # Both ways must have read exactly the same tokens on every rank.
            expected = sorted((rk["rank"], rk["tokens_sum"]) for rk in runs[-1].ranks)
            for r in runs[-1 - len(args.workers) : -1]:
                assert sorted((rk["rank"], rk["tokens_sum"]) for rk in r.ranks) == expected, "token sums differ"

    print_table(runs, args.world_size)
    print(f"\nload average now {os.getloadavg()[0]:.1f} (timings are wall-clock on a shared machine)")
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "mode": r.mode,
                        "gb": r.gb,
                        "workers": r.workers,
                        "concurrent": r.concurrent,
                        "ranks": r.ranks,
                        "peaks": [m.astuple() for m in r.peaks],
                        "total_rss": r.total_rss,
                        "total_pss": r.total_pss,
                    }
                    for r in runs
                ]
            )
        )
    return 0


def print_table(runs: list[RunResult], world: int) -> None:
    """One row per run; memory columns are the largest rank's peak (rank + its workers), MiB."""
    naive = {r.gb: r for r in runs if r.mode == "naive"}
    header = (
        f"{'size':>6}  {'loader':<20}  {'shards/rank':>11}  {'epoch s':>7}  {'base USS':>8}  "
        f"{'peak USS':>8}  {'dirty':>7}  {'clean':>7}  {'PSS':>7}  {'RSS':>7}  {f'sum RSS x{world}':>11}  "
        f"{f'sum PSS x{world}':>11}  {'USS vs naive':>12}"
    )
    print("\n" + header)
    for r in runs:
        worst = max(range(len(r.peaks)), key=lambda i: r.peaks[i].uss)
        peak = r.peaks[worst]
        base = max(Mem(*x).uss for x in (rk["baseline"] for rk in r.ranks))
        opened = [rk["shards_opened"] for rk in r.ranks]
        planned = [rk["shards_planned"] for rk in r.ranks]
        total = r.ranks[0]["shards_total"]
        shown = opened if all(o is not None for o in opened) else planned
        shards = f"{min(shown)}-{max(shown)}/{total}" if min(shown) != max(shown) else f"{shown[0]}/{total}"
        label = r.mode + (f", workers={r.workers}" if r.mode == "shardload" else "")
        if r.mode == "naive" and not r.concurrent:
            label += " (1 at a time)"
        ref = naive.get(r.gb)
        ratio = f"{peak.uss / max(m.uss for m in ref.peaks):.3f}x" if ref else "-"
        seconds = max(rk["seconds"] for rk in r.ranks)
        print(
            f"{r.gb:>5g}G  {label:<20}  {shards:>11}  {seconds:7.1f}  {base / MiB:8.0f}  {peak.uss / MiB:8.0f}  "
            f"{peak.private_dirty / MiB:7.0f}  {peak.private_clean / MiB:7.0f}  {peak.pss / MiB:7.0f}  "
            f"{peak.rss / MiB:7.0f}  "
            f"{r.total_rss / MiB:11.0f}  {r.total_pss / MiB:11.0f}  {ratio:>12}"
        )
    print(
        "\nMiB. Memory columns: the rank (with its workers) whose USS peaked highest; each column is that "
        "figure's own peak over the epoch (launcher samples). USS = dirty + clean private pages (psutil's uss); "
        "'dirty' cannot be reclaimed, 'clean' is file pages only this process maps (reclaimable page cache); "
        "a page shared by a rank and its forked workers is in nobody's USS, so with workers read PSS too. "
        "'base USS' = a rank after importing torch and joining the process group, before opening the set; "
        "shards/rank = shards mapped (workers>0: shards the rank's plan touches) / total. For naive runs "
        "one rank at a time, the sums are sums of the ranks' peaks."
    )


if __name__ == "__main__":
    raise SystemExit(main())
