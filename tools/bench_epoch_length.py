"""Benchmark one length for every training epoch: what it costs in steps, padding and planning time.

The planner plans every training epoch of a run to the same batch count
(``shardload/plan/length.py``). This compares, in the same run, each epoch's
*natural* plan (``EpochPlanner(..., steady=False)``: the count the epoch would
have on its own, as before) with the *steady* one, for every batching mode, on
two sets:

* ``alike``: long-tailed lengths in shards that all look alike (the usual set
  prepared from shuffled input);
* ``unlike``: shards of short, medium and long documents in turn (a set
  prepared from files sorted by source or length): natural counts vary most.

Printed per mode: natural counts over the epochs (min / mean / max), the
steady count and its ratio to the natural mean (the steps added), the padded
tokens of rank 0's epochs steady / natural (split batches never pad more), the
draws beyond the first, and planning time: the first epoch (which counts the
probes) and a later one, against the natural plan's.

Examples::

    python tools/bench_epoch_length.py --quick      # 100k samples, seconds
    python tools/bench_epoch_length.py              # 1M samples, 8 ranks, 8 epochs
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numpy.typing import NDArray

from shardload.plan import Batching, EpochSpec, MixInputs, PlanInputs
from shardload.plan.planner import EpochPlanner, RankPlan
from shardload.plan.steps import batch_costs

MODES: dict[str, Batching] = {
    "batch_size=32": Batching(batch_size=32),
    "max_tokens (no buckets)": Batching(max_tokens=16384, bucketing=False),
    "max_tokens, buckets": Batching(max_tokens=16384),
    "packing 4096x4": Batching(packing=True, pack_length=4096, rows_per_batch=4, pack_split=True),
    "mixture 0.7/0.3, buckets": Batching(max_tokens=16384),
}


def lengths_of(kind: str, n: int, shards: int, seed: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(lengths, shard_sizes)`` of an ``alike`` or ``unlike`` set."""
    rng = np.random.default_rng(seed)
    sizes = np.full(shards, n // shards, dtype=np.int64)
    sizes[: n - int(sizes.sum())] += 1
    if kind == "alike":
        return np.minimum(rng.lognormal(5, 1, n).astype(np.int64) + 1, 8192), sizes
    scale = np.repeat(np.array([1.0, 3.0, 8.0])[np.arange(shards) % 3], sizes)  # short, medium, long shards
    return np.minimum((rng.lognormal(4, 1, n) * scale).astype(np.int64) + 1, 8192), sizes


def padded_tokens(plan: RankPlan, lengths: NDArray[np.int64], batching: Batching) -> int:
    """Tokens rank 0 computes on in the epoch: rows x padded longest row (packed: rows x pack_length)."""
    if batching.packing:
        assert plan.rows is not None and batching.pack_length is not None
        rows = sum(
            int(plan.rows[plan.batch_offsets[i] : plan.batch_offsets[i + 1]].max()) + 1 for i in range(len(plan))
        )
        return rows * batching.pack_length
    lens = np.asarray(lengths[plan.sample_ids], dtype=np.int64)
    return int(batch_costs(lens, plan.batch_offsets, batching.pad_to_multiple_of).sum())


def planned(
    inputs: PlanInputs | MixInputs, spec: EpochSpec, batching: Batching, *, steady: bool
) -> tuple[EpochPlanner, float]:
    """The epoch's planner, and the seconds it took (counting every rank, the probes too when steady)."""
    start = time.perf_counter()
    planner = EpochPlanner(inputs, spec, batching, steady=steady)
    return planner, time.perf_counter() - start


def inputs_of(parts: list[tuple[NDArray[np.int64], NDArray[np.int64]]]) -> PlanInputs | MixInputs:
    """A set (one part), or a 0.7/0.3 mixture (two): fresh objects, so that nothing kept is shared."""
    sources = tuple(PlanInputs(lengths, sizes) for lengths, sizes in parts)
    return sources[0] if len(sources) == 1 else MixInputs(sources, ("a", "b"), {"a": 0.7, "b": 0.3})


def bench(kind: str, n: int, shards: int, world: int, epochs: int) -> None:
    lengths, sizes = lengths_of(kind, n, shards, 0)
    print(f"\n== {kind}: {n:,} samples in {shards} shards, {world} ranks, {epochs} epochs")
    header = "mode                          natural min/mean/max   steady  steps   padded  draws  plan s: natural/first/later"
    print(header)
    for name, batching in MODES.items():
        parts = [(lengths, sizes)]
        if name.startswith("mixture"):
            parts.append(lengths_of(kind, n // 2, shards // 2, 1))
        flat = np.concatenate([p[0] for p in parts])
        natural_inputs, steady_inputs = inputs_of(parts), inputs_of(parts)
        natural, steady, pad_nat, pad_steady, draws = [], [], 0, 0, 0
        t_nat = t_first = t_later = 0.0
        for epoch in range(epochs):
            spec = EpochSpec(world_size=world, seed=7, epoch=epoch)
            nat, dt = planned(natural_inputs, spec, batching, steady=False)
            t_nat += dt
            fixed, dt = planned(steady_inputs, spec, batching, steady=True)
            if epoch == 0:
                t_first = dt
            else:
                t_later += dt / (epochs - 1)
            natural.append(nat.num_batches)
            steady.append(fixed.num_batches)
            draws += fixed.draw
            pad_nat += padded_tokens(nat.plan(0), flat, batching)
            pad_steady += padded_tokens(fixed.plan(0), flat, batching)
        assert len(set(steady)) == 1, f"{name}: steady counts differ: {steady}"
        mean = float(np.mean(natural))
        print(
            f"{name:<29} {min(natural):>6}/{mean:>8.1f}/{max(natural):<6} {steady[0]:>7}  "
            f"{steady[0] / mean:>5.3f}x  {pad_steady / pad_nat:>5.3f}x  {draws:>5}  "
            f"{t_nat / epochs:>6.3f}/{t_first:.3f}/{t_later:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=256)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="100k samples, 64 shards")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.shards = 100_000, 64
    for kind in ("alike", "unlike"):
        bench(kind, args.samples, args.shards, args.world_size, args.epochs)


if __name__ == "__main__":
    main()
