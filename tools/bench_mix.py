"""Benchmark planning a mixture: 3 sources of 30M samples each (by default), one rank of 1024.

Each source has synthetic long-tailed lengths (lognormal, median 256 / 512 / 128 tokens,
sigma 1, clipped to [8, 4096], int32) in shards of 500-1500 samples. The mixture's
weights (0.6 / 0.3 / 0.1 by tokens) repeat "web" (x2.1) and subsample the others,
so the selection step does real work. Times are medians of a few runs of
``plan_rank`` for one rank, with a fresh ``PlanInputs`` per source (digest given, as
``ShardSet.plan_inputs()`` passes the manifest fingerprint); the first epoch of a
loader also draws each source's permutation, which later epochs reuse (``memo``).

Examples::

    python tools/bench_mix.py                                  # 3 x 30M samples, 1024 ranks
    python tools/bench_mix.py --samples 1000000 --world-size 8 # quick
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
from numpy.typing import NDArray

from shardload.plan import Batching, EpochSpec, MixInputs, PlanInputs, plan_rank


def synthetic_lengths(num: int, median: float, seed: int) -> NDArray[np.int32]:
    """``(num,)`` lognormal lengths around ``median``, sigma 1, clipped to [8, 4096]."""
    rng = np.random.default_rng(seed)
    out = np.empty(num, dtype=np.int32)
    for lo in range(0, num, 1 << 24):  # in chunks: no float64 copy of the whole array
        hi = min(num, lo + (1 << 24))
        out[lo:hi] = np.clip(rng.lognormal(np.log(median), 1.0, hi - lo), 8, 4096)
    return out


def synthetic_shards(num: int, seed: int) -> NDArray[np.int64]:
    """``(S,)`` shard sizes uniform in [500, 1500], summing to ``num``."""
    sizes = np.random.default_rng(seed).integers(500, 1501, size=num // 500 + 2)
    ends = np.cumsum(sizes)
    count = int(np.searchsorted(ends, num)) + 1
    sizes = sizes[:count].copy()
    sizes[-1] -= int(ends[count - 1]) - num
    return sizes.astype(np.int64)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=30_000_000, help="samples per source (default 30M)")
    p.add_argument("--world-size", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    medians = (256, 512, 128)
    names = ("web", "code", "math")
    lengths = [synthetic_lengths(args.samples, m, seed=k) for k, m in enumerate(medians)]
    shards = [synthetic_shards(args.samples, seed=10 + k) for k in range(3)]
    weights = {"web": 0.6, "code": 0.3, "math": 0.1}
    print(f"3 sources x {args.samples:,} samples, {args.world_size} ranks, rank 0, epoch 1, weights {weights}")
    print("| batching | stage | first epoch (permutations drawn) | next epochs | batches / rank |")
    print("|---|---|---|---|---|")
    for label, batching in (
        ("max_tokens=16384", Batching(max_tokens=16384)),
        ("batch_size=32", Batching(batch_size=32)),
        ("packing L=4096 R=8", Batching(packing=True, pack_length=4096, rows_per_batch=8)),
    ):
        for stage in ("train", "val"):
            first, later, batches = [], [], 0
            for run in range(args.runs):
                sources = tuple(PlanInputs(x, s, digest=f"src{k}") for k, (x, s) in enumerate(zip(lengths, shards)))
                mix = MixInputs(sources, names, weights)
                spec = EpochSpec(world_size=args.world_size, stage=stage, epoch=1)
                t0 = time.perf_counter()
                plan = plan_rank(mix, spec, batching, rank=0)
                t1 = time.perf_counter()
                plan_rank(mix, spec.at_epoch(2), batching, rank=0)
                t2 = time.perf_counter()
                first.append(t1 - t0)
                later.append(t2 - t1)
                batches = len(plan)
                if label.startswith("packing") and run == 0 and args.runs > 1:
                    break  # packing every rank is slow: one run
            print(
                f"| `{label}` | {stage} | {statistics.median(first):.2f} s | {statistics.median(later):.2f} s | "
                f"{batches:,} |"
            )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:,.0f} MiB (lengths: {3 * args.samples * 4 / 2**20:,.0f} MiB)")


if __name__ == "__main__":
    main()
