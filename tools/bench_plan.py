"""Benchmark the batch planner on a synthetic long-tailed lengths index.

Times ``plan_rank`` for one rank (median of a few runs) with ``batch_size`` and
with ``max_tokens`` (both bucketed), reports the equalisation cost and the
memory it takes, then the padding fraction with and without bucketing from
``summarize_plan`` over all ranks (on the first ``--summary-samples``).
``--balance`` prints the step efficiency instead (how little ranks wait for
each other per step, ``PlanSummary.step_efficiency``) on the long-tailed set
and on source-file-like lengths, at a few world sizes.

Examples::

    python tools/bench_plan.py                      # 10M samples, 1024 ranks
    python tools/bench_plan.py --samples 100000000  # 100M samples
    python tools/bench_plan.py --balance --samples 1000000   # step efficiency at 3, 8 and 64 ranks
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from shardload.plan import Batching, EpochSpec, PlanInputs, RankPlan, digest_lengths, plan_rank, summarize_plan


def synthetic_lengths(num: int, seed: int) -> NDArray[np.int32]:
    """``(num,)`` lognormal lengths, median 256, sigma 1, clipped to [8, 4096]."""
    rng = np.random.default_rng(seed)
    out = np.empty(num, dtype=np.int32)
    for lo in range(0, num, 1 << 24):  # in chunks: no float64 copy of the whole array
        hi = min(num, lo + (1 << 24))
        out[lo:hi] = np.clip(rng.lognormal(np.log(256), 1.0, hi - lo), 8, 4096)
    return out


def source_like_lengths(shard_sizes: NDArray[np.int64], seed: int, *, shard_sigma: float) -> NDArray[np.int32]:
    """Lengths like source files (one per sample): median ~300 tokens, p99 ~10k, cut at 16,384 (the context).

    Lognormal with sigma 1.5 around a median of 300 tokens; with
    ``shard_sigma > 0`` each shard's median is itself scaled by a lognormal of
    that sigma (files of one repository share a shard: shards differ, as in a
    real corpus), with the sample sigma lowered to keep the same overall spread.
    """
    rng = np.random.default_rng(seed + 11)
    sigma = float(np.sqrt(1.5**2 - shard_sigma**2))
    median = np.repeat(300.0 * np.exp(shard_sigma * rng.standard_normal(len(shard_sizes))), shard_sizes)
    noise = np.exp(sigma * rng.standard_normal(len(median)))
    return np.clip(np.rint(median * noise), 1, 16384).astype(np.int32)


def balance_table(args: argparse.Namespace) -> None:
    """Step efficiency, spread and locality of bucketed and random batches on three length sets."""
    shard_sizes = synthetic_shards(args.samples, args.shard_size, args.seed)
    sets = {
        "long-tailed": synthetic_lengths(args.samples, args.seed),
        "source-like": source_like_lengths(shard_sizes, args.seed, shard_sigma=0.0),
        "source-like, shards differ": source_like_lengths(shard_sizes, args.seed, shard_sigma=0.5),
    }
    configs = [
        (f"max_tokens={args.max_tokens}", Batching(max_tokens=args.max_tokens)),
        (f"batch_size={args.batch_size}", Batching(batch_size=args.batch_size)),
        (f"max_tokens={args.max_tokens}, random", Batching(max_tokens=args.max_tokens, bucketing=False)),
        (f"batch_size={args.batch_size}, random", Batching(batch_size=args.batch_size, bucketing=False)),
    ]
    print(f"\n## Step efficiency ({args.samples:,} samples, shards of ~{args.shard_size}, epoch 1)\n")
    print("| data | ranks | batching | step efficiency | spread | padding | batches / rank | shards / rank |")
    print("|---|---:|---|---:|---:|---:|---:|---|")
    for name, lengths in sets.items():
        lens = lengths.astype(np.int64)
        print(
            f"<!-- {name}: median {int(np.median(lens))}, p99 {int(np.percentile(lens, 99))}, mean {lens.mean():.0f} -->"
        )
        inputs = PlanInputs(lengths, shard_sizes)
        for world in args.balance_ranks:
            for label, batching in configs:
                summary = summarize_plan(inputs, EpochSpec(world_size=world, seed=args.seed, epoch=1), batching)
                print(
                    f"| {name} | {world} | {label} | {summary.step_efficiency:.3f} | {summary.spread:.3f} "
                    f"| {summary.padding_fraction:.1%} | {summary.num_batches:,} "
                    f"| {summary.shards.min()}..{summary.shards.max()} |"
                )


def synthetic_shards(num: int, shard_size: int, seed: int) -> NDArray[np.int64]:
    """``(S,)`` shard sizes uniform in [shard_size / 2, 3 * shard_size / 2], summing to ``num``."""
    rng = np.random.default_rng(seed + 1)
    sizes = rng.integers(shard_size // 2, shard_size * 3 // 2 + 1, size=num // shard_size * 2 + 2)
    ends = np.cumsum(sizes)
    count = int(np.searchsorted(ends, num)) + 1
    sizes = sizes[:count].copy()
    sizes[-1] -= int(ends[count - 1]) - num
    return sizes[sizes > 0] if num else np.zeros(1, dtype=np.int64)


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _status_mib(key: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def reset_rss_peak() -> float:
    """Reset the peak RSS (Linux: /proc/self/clear_refs) and return the current RSS in MiB."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    current = _status_mib("VmRSS")
    return current if current is not None else rss_peak_mib()


def rss_peak_mib() -> float:
    """Peak RSS in MiB since the last reset (or since start, off Linux)."""
    peak = _status_mib("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--world-size", type=int, default=1024)
    parser.add_argument("--shard-size", type=int, default=1000, help="mean samples per shard")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--in-memory", action="store_true", help="plain array, not a memmap")
    parser.add_argument(
        "--summary-samples",
        type=int,
        default=10_000_000,
        help="padding report over all ranks on this many samples (0: skip)",
    )
    parser.add_argument(
        "--unbucketed",
        action="store_true",
        help="also time plan_rank without bucketing (one run each; slow for max_tokens)",
    )
    parser.add_argument(
        "--balance", action="store_true", help="only print the step-efficiency table (on --samples samples)"
    )
    parser.add_argument("--balance-ranks", type=int, nargs="+", default=[3, 8, 64], metavar="W")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.balance:
        balance_table(args)
        return

    lengths_mem = synthetic_lengths(args.samples, args.seed)
    shard_sizes = synthetic_shards(args.samples, args.shard_size, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        if args.in_memory:
            lengths: NDArray[np.int32] = lengths_mem
        else:
            path = Path(tmp) / "lengths.npy"
            np.save(path, lengths_mem)
            del lengths_mem
            lengths = np.load(path, mmap_mode="r")
        print(
            f"lengths: {args.samples:,} int32 ({'memory' if args.in_memory else 'memmap'}), "
            f"{len(shard_sizes):,} shards, world_size {args.world_size}, "
            f"numpy {np.__version__}, {os.cpu_count()} cpus"
        )
        start = time.perf_counter()
        digest = digest_lengths(lengths)
        print(f"digest_lengths: {time.perf_counter() - start:.3f} s")

        rss_before = reset_rss_peak()
        spec = EpochSpec(world_size=args.world_size, seed=args.seed, epoch=1)
        configs = [Batching(batch_size=args.batch_size), Batching(max_tokens=args.max_tokens)]
        if args.unbucketed:
            configs += [
                Batching(batch_size=args.batch_size, bucketing=False),
                Batching(max_tokens=args.max_tokens, bucketing=False),
            ]
        for batching in configs:
            repeats = args.repeats if batching.bucketing else 1

            def run(digest_arg: str | None = None, batching: Batching = batching) -> RankPlan:
                # without a digest, PlanInputs hashes the lengths: what a caller without one pays
                inputs = (
                    PlanInputs(lengths, shard_sizes)
                    if digest_arg is None
                    else PlanInputs(lengths, shard_sizes, digest_arg)
                )
                return plan_rank(inputs, spec, batching, rank=args.rank)

            full = median_time(run, repeats) if batching.bucketing else None
            cached = median_time(lambda: run(digest), repeats)
            tracemalloc.start()  # numpy reports its buffers to tracemalloc
            plan = run(digest)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            counts = plan.rank_batch_counts
            added = int((len(plan) - counts).sum())
            name = (
                f"batch_size={batching.batch_size}" if batching.batch_size else f"max_tokens={batching.max_tokens}"
            ) + ("" if batching.bucketing else " (no bucketing)")
            timing = f"{full:.3f} s median, " if full is not None else ""
            print(
                f"plan_rank {name}: {timing}{cached:.3f} s with a precomputed digest; "
                f"{len(plan)} batches/rank (before equalising {counts.min()}..{counts.max()}; "
                f"{added:,} batches added by splitting = "
                f"{added / max(1, int(counts.sum())):.2%}); "
                f"numpy peak {peak / 2**20:.0f} MiB"
            )
        print(
            f"peak RSS increase over the plan_rank runs: {rss_peak_mib() - rss_before:.0f} MiB "
            "(the memmapped lengths were already paged in by digest_lengths)"
        )

        if args.summary_samples:
            num = min(args.summary_samples, args.samples)
            part = np.asarray(lengths[:num])
            part_shards = synthetic_shards(num, args.shard_size, args.seed)
            for label, batching in (
                ("bucketed batch_size", Batching(batch_size=args.batch_size)),
                ("random batch_size", Batching(batch_size=args.batch_size, bucketing=False)),
                ("bucketed max_tokens", Batching(max_tokens=args.max_tokens)),
                ("greedy max_tokens", Batching(max_tokens=args.max_tokens, bucketing=False)),
            ):
                start = time.perf_counter()
                summary = summarize_plan(PlanInputs(part, part_shards), spec, batching)
                fill = summary.budget_fill
                print(
                    f"{label:>20} ({num:,} samples): padding {summary.padding_fraction:.2%}"
                    + (f", budget filled {fill:.1%}" if fill is not None else "")
                    + f", {summary.num_batches} batches/rank, spread {summary.spread:.3f}, "
                    f"step efficiency {summary.step_efficiency:.3f}, "
                    f"shards/rank {summary.shards.min()}..{summary.shards.max()} "
                    f"[summary {time.perf_counter() - start:.1f} s]"
                )


if __name__ == "__main__":
    main()
