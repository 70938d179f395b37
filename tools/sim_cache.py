"""Simulate a node-local shard cache over one epoch of a real plan: plan-driven vs LRU vs the optimum.

A remote shard set is read through a cache of whole shards, smaller than what
the ranks read. This tool plans an epoch of a synthetic set
(:func:`shardload.plan.plan_rank` on long-tailed lengths), turns each rank's
plan into its read sequence (:func:`shardload.plan.reads.read_sequence`:
batch by batch, the distinct shards the batch touches) and replays it against
a cache of a given size with three policies, counting downloads and bytes:

* ``planned``: the library's policy, :func:`shardload.remote.policy.choose_victims`
  with next uses from a :class:`~shardload.remote.policy.NextUseTable`;
* ``lru``: evict the least recently used shard (what a cache that does not
  know the plan does);
* ``belady``: the textbook optimum (evict the cached shard whose next
  reference is farthest), written here on its own with a heap, not calling
  the library; optimal for equal-sized shards.

For a node, the ranks' sequences are merged step by step
(:func:`~shardload.remote.policy.node_sequence`), and a fourth policy,
``planned-steps``, uses what a cache shared by processes sees: each rank's
next uses in steps, minimum over the ranks (:func:`~shardload.remote.policy.node_next_uses`).

Examples::

    python tools/sim_cache.py                          # the table in docs/benchmarks.md
    python tools/sim_cache.py --shards 512 --world-size 8 --ranks-per-node 4
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from shardload.plan import Batching, EpochSpec, PlanInputs
from shardload.plan.planner import EpochPlanner
from shardload.plan.reads import cache_bytes, read_sequence, step_bytes
from shardload.remote.policy import NextUseTable, choose_victims, node_next_uses, node_sequence
from shardload.testing import long_tailed_lengths

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Tally:
    """What one policy fetched over a sequence."""

    fetches: int
    bytes: int


def _check_capacity(sizes: NDArray[np.int64], sequence: NDArray[np.int64], capacity: int) -> None:
    largest = int(sizes[sequence].max()) if len(sequence) else 0
    if capacity < largest:
        raise SystemExit(f"a cache of {capacity} bytes cannot hold the largest shard read ({largest} bytes)")


def simulate_planned(
    sequence: NDArray[np.int64],
    sizes: NDArray[np.int64],
    capacity: int,
    next_use_at: Callable[[int], NDArray[np.int64]] | None = None,
) -> Tally:
    """Replay ``sequence`` evicting with :func:`choose_victims`.

    ``next_use_at(position)`` gives the next uses at a position (default: a
    :class:`NextUseTable` of ``sequence`` itself).
    """
    _check_capacity(sizes, sequence, capacity)
    if next_use_at is None:
        next_use_at = NextUseTable(sequence, len(sizes)).at
    cached = np.zeros(len(sizes), dtype=bool)
    used = fetches = fetched = 0
    for position, shard in enumerate(sequence.tolist()):
        if cached[shard]:
            continue
        size = int(sizes[shard])
        fetches, fetched = fetches + 1, fetched + size
        need = used + size - capacity
        if need > 0:
            victims = choose_victims(np.flatnonzero(cached), sizes, next_use_at(position), need)
            cached[victims] = False
            used -= int(sizes[victims].sum())
        cached[shard] = True
        used += size
    return Tally(fetches, fetched)


def simulate_lru(sequence: NDArray[np.int64], sizes: NDArray[np.int64], capacity: int) -> Tally:
    """Replay ``sequence`` evicting the least recently used shard until the new one fits."""
    _check_capacity(sizes, sequence, capacity)
    cache: OrderedDict[int, int] = OrderedDict()  # shard -> size, least recently used first
    used = fetches = fetched = 0
    for shard in sequence.tolist():
        if shard in cache:
            cache.move_to_end(shard)
            continue
        size = int(sizes[shard])
        fetches, fetched = fetches + 1, fetched + size
        while used + size > capacity:
            used -= cache.popitem(last=False)[1]
        cache[shard] = size
        used += size
    return Tally(fetches, fetched)


def simulate_belady(sequence: NDArray[np.int64], sizes: NDArray[np.int64], capacity: int) -> Tally:
    """Replay ``sequence`` with Belady's rule, textbook style: a max-heap of next references.

    Each cached shard has a heap entry ``(-next reference, shard)``; an entry
    whose shard was read again since is stale and skipped when popped.
    """
    _check_capacity(sizes, sequence, capacity)
    seq = sequence.tolist()
    never = len(seq)  # past the end: not referenced again
    following = [never] * len(seq)
    seen: dict[int, int] = {}
    for i in range(len(seq) - 1, -1, -1):  # one backward scan: the next reference of each read
        following[i] = seen.get(seq[i], never)
        seen[seq[i]] = i
    current: dict[int, int] = {}  # cached shard -> its next reference
    heap: list[tuple[int, int]] = []
    used = fetches = fetched = 0
    for i, shard in enumerate(seq):
        if shard not in current:
            size = int(sizes[shard])
            fetches, fetched = fetches + 1, fetched + size
            while used + size > capacity:
                far, victim = heapq.heappop(heap)
                if current.get(victim) == -far:  # not stale
                    del current[victim]
                    used -= int(sizes[victim])
            used += size
        current[shard] = following[i]
        heapq.heappush(heap, (-following[i], shard))
    return Tally(fetches, fetched)


def epoch_reads(
    num_shards: int, samples_per_shard: int, world_size: int, batch_size: int, seed: int
) -> tuple[list[tuple[NDArray[np.int64], NDArray[np.int64]]], NDArray[np.int64]]:
    """Every rank's ``(sequence, step_offsets)`` for epoch 0 of a synthetic set, and its shards' tokens."""
    rng = np.random.default_rng(seed)
    shard_sizes = rng.integers(samples_per_shard // 2, samples_per_shard * 3 // 2 + 1, num_shards)
    lengths = long_tailed_lengths(int(shard_sizes.sum()), seed=seed)
    inputs = PlanInputs(lengths, shard_sizes)
    planner = EpochPlanner(inputs, EpochSpec(world_size=world_size, seed=seed), Batching(batch_size=batch_size))
    reads = [read_sequence(p.sample_ids, p.batch_offsets, planner.shard_starts) for p in planner.plans()]
    return reads, inputs.shard_tokens


def compare(
    reads: list[tuple[NDArray[np.int64], NDArray[np.int64]]], sizes: NDArray[np.int64], fractions: list[float]
) -> list[dict[str, object]]:
    """One row per cache size: each policy's downloads and bytes over the reads of ``reads``' ranks together."""
    if len(reads) == 1:
        sequence, offsets = reads[0]
    else:
        sequence, offsets = node_sequence([s for s, _ in reads], [o for _, o in reads])
    tables = [NextUseTable(s, len(sizes), o) for s, o in reads]
    counts = np.stack([np.diff(o) for _, o in reads])  # (K, T) reads of each rank at each step
    before = np.cumsum(counts, axis=0) - counts  # (K, T) reads of the lower ranks at each step

    def by_steps(position: int) -> NDArray[np.int64]:
        """What processes sharing a cache see: each rank's next uses in steps, from its own position."""
        step = min(int(np.searchsorted(offsets, position, side="right")) - 1, counts.shape[1] - 1)
        done = np.clip(position - offsets[step] - before[:, step], 0, counts[:, step])  # (K,) read this step
        return node_next_uses(tables, [int(o[step]) + int(d) for (_, o), d in zip(reads, done)])

    working = cache_bytes(sequence, sizes)
    one_step = max(step_bytes(s, o, sizes) for s, o in reads)
    rows: list[dict[str, object]] = []
    for fraction in fractions:
        capacity = max(int(working * fraction), int(sizes[sequence].max()))
        policies: dict[str, Callable[[NDArray[np.int64], NDArray[np.int64], int], Tally]] = {
            "planned": simulate_planned,
            "planned-steps": lambda seq, sz, cap: simulate_planned(seq, sz, cap, by_steps),
            "lru": simulate_lru,
            "belady": simulate_belady,
        }
        row: dict[str, object] = {
            "ranks": len(reads),
            "cache_fraction": fraction,
            "cache_bytes": capacity,
            "working_set_bytes": working,
            "step_bytes": one_step,
            "reads": len(sequence),
            "distinct_shards": len(np.unique(sequence)),
        }
        for name, run in policies.items():
            start = time.perf_counter()
            row[name] = asdict(run(sequence, sizes, capacity))
            row[f"{name}_seconds"] = round(time.perf_counter() - start, 2)
        rows.append(row)
    return rows


def table(rows: list[dict[str, object]], sizes_label: str) -> str:
    """The markdown table of :func:`compare`'s rows."""
    out = [
        f"{sizes_label}:",
        "",
        "| ranks | cache / working set | downloads: planned | planned (steps) | LRU | Belady "
        "| GB fetched: planned | planned (steps) | LRU | Belady |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        t = {k: r[k] for k in ("planned", "planned-steps", "lru", "belady")}
        gb = {k: v["bytes"] / 1e9 for k, v in t.items()}  # type: ignore[index]
        out.append(
            f"| {r['ranks']} | {r['cache_fraction']:.0%} | {t['planned']['fetches']:,} "  # type: ignore[index]
            f"| {t['planned-steps']['fetches']:,} | {t['lru']['fetches']:,} | {t['belady']['fetches']:,} "  # type: ignore[index]
            f"| {gb['planned']:.2f} | {gb['planned-steps']:.2f} | {gb['lru']:.2f} | {gb['belady']:.2f} |"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=2048, help="shards in the set (default: 2048)")
    p.add_argument("--samples-per-shard", type=int, default=200, help="mean samples per shard (default: 200)")
    p.add_argument("--world-size", type=int, default=32, help="ranks of the job (default: 32)")
    p.add_argument("--ranks-per-node", type=int, default=8, help="ranks sharing one cache (default: 8)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--bytes-per-token", type=int, default=4, help="shard bytes = tokens x this (int32: 4)")
    p.add_argument("--fractions", default="0.1,0.25,0.5,1.0", help="cache sizes, fractions of the working set")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=str(ROOT / "docs" / "bench_cache.json"), help="raw figures (JSON)")
    args = p.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    reads, tokens = epoch_reads(args.shards, args.samples_per_shard, args.world_size, args.batch_size, args.seed)
    sized = {
        "equal sizes": np.full(args.shards, int(tokens.mean()) * args.bytes_per_token, dtype=np.int64),
        "sizes by tokens": tokens * args.bytes_per_token,
    }
    results: dict[str, list[dict[str, object]]] = {}
    for label, sizes in sized.items():
        rows = compare(reads[:1], sizes, fractions) + compare(reads[: args.ranks_per_node], sizes, fractions)
        results[label] = rows
        print(table(rows, label), end="\n\n", flush=True)
        if label == "equal sizes":
            for r in rows:  # the library's policy is the optimum here: a mismatch is a bug
                assert r["planned"] == r["belady"], r
    Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
