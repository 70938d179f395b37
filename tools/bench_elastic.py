"""Benchmark elastic-resume planning: one rank's plan of the rest of an epoch on a new world size.

A run of ``--from`` ranks stopped after half of an epoch's batches; a job of
``--to`` ranks resumes from its state. The figure is what one rank of the new
job spends in planning (single-threaded numpy): replaying every old rank's
plan (the consumed samples), subtracting them from the epoch, and planning
its own share of the remainder. The first row is an ordinary epoch's planning
on the new world size, for scale.

Lengths are those of tools/bench_mix.py (lognormal, median 256, sigma 1,
clipped to [8, 4096], int32; shards of 500-1500 samples). Peak RSS is the
process's, lengths included.

Examples::

    python tools/bench_elastic.py                                   # 100M samples, 1024 -> 768 ranks
    python tools/bench_elastic.py --samples 1000000 --from 16 --to 12 --packing   # quick, packing too
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_mix import synthetic_lengths, synthetic_shards

from shardload.plan import Batching, EpochPlanner, EpochSpec, PlanInputs, plan_rank
from shardload.plan.resume import ResumeInputs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=100_000_000)
    p.add_argument("--from", dest="old", type=int, default=1024, help="world size that saved the state")
    p.add_argument("--to", dest="new", type=int, default=768, help="world size that resumes")
    p.add_argument("--packing", action="store_true", help="also time packed batches (L=4096, R=8)")
    args = p.parse_args()
    lengths = synthetic_lengths(args.samples, 256, seed=0)
    inputs = PlanInputs(lengths, synthetic_shards(args.samples, seed=10), digest="bench")
    print(f"{args.samples:,} samples, {args.old} -> {args.new} ranks, epoch 1, rank 0, stopped halfway")
    print(
        "| batching | plan the epoch on the new size | resume planning | of it: replay + counts | batches / new rank |"
    )
    print("|---|---|---|---|---|")
    modes = [
        ("max_tokens=16384, bucketing", Batching(max_tokens=16384, bucketing=True)),
        ("max_tokens=16384", Batching(max_tokens=16384)),
    ]
    if args.packing:
        modes.append(("packing L=4096 R=8", Batching(packing=True, pack_length=4096, rows_per_batch=8)))
    for label, batching in modes:
        old, new = EpochSpec(world_size=args.old, epoch=1), EpochSpec(world_size=args.new, epoch=1)
        t0 = time.perf_counter()
        plan_rank(inputs, new, batching, rank=0)
        plain = time.perf_counter() - t0
        k = EpochPlanner(inputs, old, batching).num_batches // 2
        t0 = time.perf_counter()
        planner = EpochPlanner(ResumeInputs(inputs, ((args.old, k),)), new, batching)
        replayed = time.perf_counter() - t0  # replay, subtraction, and every new rank counted
        plan = planner.plan(0)
        total = time.perf_counter() - t0
        print(f"| {label} | {plain:.1f} s | {total:.1f} s | {replayed:.1f} s | {len(plan)} (after {k}) |")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak RSS {peak:.1f} GiB")


if __name__ == "__main__":
    main()
