"""Benchmark elastic-resume planning: one rank's plan of the rest of an epoch on a new world size.

A run of ``--from`` ranks stopped after half of an epoch's batches; a job of
``--to`` ranks resumes from its state. The figure is what one rank of the new
job spends in planning (single-threaded numpy): replaying every old rank's
plan (the consumed samples), subtracting them from the epoch, and planning
its own share of the remainder. The first column is an ordinary epoch's
planning on the new world size, for scale. Each time is wall time, with the
process's CPU time (``time.process_time``) beside it: on a shared machine the
steadier figure.

Lengths are those of tools/bench_mix.py (lognormal, median 256, sigma 1,
clipped to [8, 4096], int32; shards of 500-1500 samples). Peak RSS is the
process's, lengths included.

With ``--baseline-tree DIR`` each batching is measured in a fresh interpreter,
``--repeat`` times, once with this checkout's library and once with the
library of the checkout at ``DIR``, in alternation: a row per run, and
after/before ratios of the medians of the resume planning's wall and CPU time
(below 1: this checkout is faster). Peak RSS is then the largest child's.

Examples::

    python tools/bench_elastic.py                                   # 100M samples, 1024 -> 768 ranks
    python tools/bench_elastic.py --samples 1000000 --from 16 --to 12 --packing   # quick, packing too
    python tools/bench_elastic.py --packing-only --baseline-tree /tmp/base --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from baseline import REPO, add_baseline_arguments, checked_tree, run_child
from bench_mix import synthetic_lengths, synthetic_shards

from shardload.plan import Batching, EpochPlanner, EpochSpec, PlanInputs, plan_rank
from shardload.plan.resume import ResumeInputs

MODES = {
    "max_tokens=16384, bucketing": Batching(max_tokens=16384, bucketing=True),
    "max_tokens=16384": Batching(max_tokens=16384),
    "packing L=4096 R=8": Batching(packing=True, pack_length=4096, rows_per_batch=8),
}


def measure(inputs: PlanInputs, old_world: int, new_world: int, batching: Batching) -> dict[str, float]:
    """Seconds (wall, CPU) of one rank's ordinary plan on the new size, and of its plan of the rest of the epoch."""
    old, new = EpochSpec(world_size=old_world, epoch=1), EpochSpec(world_size=new_world, epoch=1)
    t0, c0 = time.perf_counter(), time.process_time()
    plan_rank(inputs, new, batching, rank=0)
    plain, plain_cpu = time.perf_counter() - t0, time.process_time() - c0
    k = EpochPlanner(inputs, old, batching).num_batches // 2
    t0, c0 = time.perf_counter(), time.process_time()
    planner = EpochPlanner(ResumeInputs(inputs, ((old_world, k),)), new, batching)
    replayed = time.perf_counter() - t0  # replay, subtraction, and every new rank counted
    plan = planner.plan(0)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "plain_s": plain,
        "plain_cpu_s": plain_cpu,
        "resume_s": total,
        "resume_cpu_s": cpu,
        "replay_s": replayed,
        "batches": len(plan),
        "after": k,
    }


def row(label: str, got: dict[str, float], library: str | None) -> str:
    cells = [
        label,
        f"{got['plain_s']:.1f} s (CPU {got['plain_cpu_s']:.1f} s)",
        f"{got['resume_s']:.1f} s (CPU {got['resume_cpu_s']:.1f} s)",
        f"{got['replay_s']:.1f} s",
        f"{int(got['batches'])} (after {int(got['after'])})",
    ]
    return "| " + " | ".join(cells + ([library] if library else [])) + " |"


def make_inputs(samples: int) -> PlanInputs:
    lengths = synthetic_lengths(samples, 256, seed=0)
    return PlanInputs(lengths, synthetic_shards(samples, seed=10), digest="bench")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=100_000_000)
    p.add_argument("--from", dest="old", type=int, default=1024, help="world size that saved the state")
    p.add_argument("--to", dest="new", type=int, default=768, help="world size that resumes")
    p.add_argument("--packing", action="store_true", help="also time packed batches (L=4096, R=8)")
    p.add_argument("--packing-only", action="store_true", help="time packed batches (L=4096, R=8) only")
    add_baseline_arguments(p, measured="measures", repeat_help="runs of each library with --baseline-tree")
    args = p.parse_args()
    if args.child is not None:
        job = json.loads(args.child)
        got = measure(make_inputs(job["samples"]), job["old"], job["new"], MODES[job["label"]])
        print("RESULT " + json.dumps(got))
        return
    labels = list(MODES)[:2] if not args.packing_only else []
    if args.packing or args.packing_only:
        labels.append("packing L=4096 R=8")
    args.baseline_tree = checked_tree(p, args.baseline_tree)
    print(
        f"{args.samples:,} samples, {args.old} -> {args.new} ranks, epoch 1, rank 0, stopped halfway "
        f"({os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f})"
    )
    header = (
        "| batching | plan the epoch on the new size | resume planning | of it: replay + counts | batches / new rank |"
    )
    print(header + (" library |" if args.baseline_tree else ""))
    print("|---" * (header.count("|") - (0 if args.baseline_tree else 1)) + "|")
    if args.baseline_tree is None:
        inputs = make_inputs(args.samples)
        for label in labels:
            print(row(label, measure(inputs, args.old, args.new, MODES[label]), None))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"peak RSS {peak:.1f} GiB")
        return
    ratios = []
    for label in labels:
        runs: dict[str, list[dict[str, float]]] = {"this checkout": [], "baseline": []}
        for _ in range(args.repeat):  # in alternation: both libraries under the same load
            for name, tree in (("this checkout", REPO), ("baseline", args.baseline_tree)):
                job = {"samples": args.samples, "old": args.old, "new": args.new, "label": label}
                got = run_child(__file__, job, tree)
                runs[name].append(got)
                print(row(label, got, name))
        wall = [statistics.median(r["resume_s"] for r in runs[n]) for n in runs]
        cpu = [statistics.median(r["resume_cpu_s"] for r in runs[n]) for n in runs]
        ratios.append(
            f"{label}: wall {wall[0]:.1f} s / {wall[1]:.1f} s = {wall[0] / wall[1]:.2f}, "
            f"CPU {cpu[0]:.1f} s / {cpu[1]:.1f} s = {cpu[0] / cpu[1]:.2f}"
        )
    print(
        f"\nresume planning, after/before (this checkout over {args.baseline_tree}, medians of {args.repeat} runs each):"
    )
    for line in ratios:
        print(f"- {line}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    print(f"peak RSS {peak:.1f} GiB (the largest child)")


if __name__ == "__main__":
    main()
