"""One digest of many plans: a change that should not change any plan is checked by comparing two digests.

Plans a fixed, seeded set of random requests and hashes everything the planner
gives: every rank's ``RankPlan`` (ids, weights, offsets, rows, starts,
fingerprint) from ``EpochPlanner.plans()`` and from ``plan_rank``, the batches
``consumed()`` reports, the ``summarize_plan`` JSON and text, and the message of
every refusal. The requests cover tiny and empty sets, world sizes 1-9, every
batching mode (fixed and bucketed ``batch_size``, greedy and bucketed
``max_tokens`` with ``max_rows``, packing with and without ``pack_split``,
chunk windows), the uneven policies, training and evaluation, mixtures
(weights, ``epoch_size``, ``max_repeats``), elastic resumes of 1-3 segments and
a few larger long-tailed sets.

Run it on the tree before a change and after it (``PYTHONPATH`` picks the
tree); the last line must be the same::

    PYTHONPATH=. python tools/plan_digest.py                # 600 requests
    PYTHONPATH=/path/to/other/checkout python tools/plan_digest.py --cases 100
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import warnings
from typing import Any

import numpy as np
from numpy.random import Generator

from shardload.errors import ShardloadError
from shardload.plan import (
    Batching,
    EpochPlanner,
    EpochSpec,
    MixInputs,
    PlanInputs,
    RankPlan,
    ResumeInputs,
    plan_rank,
    summarize_plan,
)

Inputs = PlanInputs | MixInputs | ResumeInputs


class Digest:
    """A sha256 over tagged values, and the counts of plans and refusals fed to it."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.planned = 0
        self.refused = 0

    def add(self, tag: str, *parts: Any) -> None:
        self.hash.update(tag.encode())
        for part in parts:
            if isinstance(part, np.ndarray):
                self.hash.update(f"{part.dtype}{part.shape}".encode())
                self.hash.update(np.ascontiguousarray(part).tobytes())
            else:
                self.hash.update(repr(part).encode())

    def plan(self, p: RankPlan) -> None:
        self.add("plan", p.rank, p.fingerprint, p.sample_ids, p.weights, p.batch_offsets, p.rank_batch_counts)
        self.add("packed", p.rows, p.starts)

    def refusal(self, exc: ShardloadError) -> None:
        self.add("error", type(exc).__name__, str(exc))
        self.refused += 1


def random_inputs(rng: Generator, tiny: bool = False) -> PlanInputs:
    shards = int(rng.integers(0, 4 if tiny else 12))
    sizes = rng.integers(0, 4 if tiny else 60, size=shards)
    if shards and rng.random() < 0.3:
        sizes[rng.integers(0, shards)] = 0
    n = int(sizes.sum())
    kind = rng.integers(0, 3)
    if kind == 0:
        lengths: np.ndarray = rng.integers(0, 50, size=n)
    elif kind == 1:
        lengths = np.clip(rng.lognormal(3, 1.2, size=n), 1, 600).astype(np.int32)
    else:
        lengths = rng.integers(1, 9, size=n).astype(np.int16)
    chunk_rows = int(rng.integers(1, 20)) if rng.random() < 0.3 else None
    return PlanInputs(lengths, sizes.astype(np.int64), chunk_rows=chunk_rows)


def random_batching(rng: Generator, max_length: int, stage: str) -> Batching:
    mode = int(rng.integers(0, 5))
    options: dict[str, Any] = {"uneven": str(rng.choice(["split", "pad", "drop"]))}
    pad = int(rng.choice([1, 1, 8, 3]))
    if mode in (0, 1):
        options.update(batch_size=int(rng.integers(1, 10)), bucketing=bool(mode), pad_to_multiple_of=pad)
        if rng.random() < 0.3:
            options["bucket_ratio"] = float(rng.choice([1.01, 1.2, 2.0]))
    elif mode in (2, 3):
        options.update(max_tokens=int(rng.integers(10, 400)), bucketing=mode == 3, pad_to_multiple_of=pad)
        if rng.random() < 0.3:
            options["max_rows"] = int(rng.integers(1, 8))
    else:
        split = bool(rng.random() < 0.5)
        length = int(rng.integers(8, 120)) if split else max(max_length, int(rng.integers(1, 120)))
        options.update(packing=True, pack_length=max(length, 1), rows_per_batch=int(rng.integers(1, 5)))
        options["pack_split"] = split
    if mode < 4 and rng.random() < 0.25:
        options["chunk_window"] = int(rng.integers(0, 4))
        if rng.random() < 0.5:
            options["chunk_rows"] = int(rng.integers(1, 10))
    if stage != "train" and options["uneven"] == "drop":
        options["uneven"] = "split"  # evaluation never drops
    return Batching(**options)


def random_spec(rng: Generator) -> EpochSpec:
    return EpochSpec(
        world_size=int(rng.integers(1, 10)),
        stage=str(rng.choice(["train", "train", "val", "test"])),  # type: ignore[arg-type]
        seed=int(rng.integers(0, 1000)),
        epoch=int(rng.integers(0, 3)),
        shard_assignment=str(rng.choice(["rotate", "fixed"])),  # type: ignore[arg-type]
    )


def plan_all(digest: Digest, inputs: Inputs, spec: EpochSpec, batching: Batching, summary: bool = True) -> None:
    """Hash everything the planner gives for one request (or its refusal)."""
    try:
        planner = EpochPlanner(inputs, spec, batching)
        digest.add("planner", planner.num_batches, planner.fingerprint, planner.draw, planner.rank_batch_counts)
        for p in planner.plans():
            digest.plan(p)
        for rank in range(spec.world_size):
            digest.plan(plan_rank(inputs, spec, batching, rank=rank))
        if isinstance(inputs, ResumeInputs):
            digest.planned += 1
            return
        if planner.num_batches:
            for ids, starts in planner.consumed(max(1, planner.num_batches // 2)):
                digest.add("consumed", ids, starts)
        if summary:
            shard_bytes = np.arange(inputs.num_shards) * 100 + 7
            s = summarize_plan(inputs, spec, batching, shard_bytes=shard_bytes, ranks_per_node=1)
            digest.add("summary", json.dumps(s.to_dict(), sort_keys=True, default=str), s.format())
        digest.planned += 1
    except ShardloadError as exc:
        digest.refusal(exc)


def random_mixture(rng: Generator) -> MixInputs:
    sources = tuple(random_inputs(rng) for _ in range(int(rng.integers(1, 4))))
    names = tuple(f"s{k}" for k in range(len(sources)))
    weights = None if rng.random() < 0.3 else {n: float(rng.choice([0.0, 1.0, 2.5, 7.0])) for n in names}
    if weights is not None and not any(weights.values()):
        weights[names[0]] = 1.0
    return MixInputs(
        sources,
        names,
        weights,
        by=str(rng.choice(["tokens", "samples"])),  # type: ignore[arg-type]
        epoch_size=None if rng.random() < 0.5 else int(rng.integers(0, 500)),
        max_repeats=None if rng.random() < 0.7 else 3,
    )


def elastic(
    digest: Digest, rng: Generator, inputs: PlanInputs | MixInputs, spec: EpochSpec, batching: Batching
) -> None:
    """A valid history of 1-3 segments on random world sizes, then the rest planned."""
    try:
        history: list[tuple[int, int]] = []
        world = spec.world_size
        for _ in range(int(rng.integers(1, 4))):
            segment = EpochPlanner(
                ResumeInputs(inputs, tuple(history)), dataclasses.replace(spec, world_size=world), batching
            )
            if not segment.num_batches:
                break
            history.append((world, int(rng.integers(1, segment.num_batches + 1))))
            world = int(rng.integers(1, 10))
        digest.add("history", history)
        plan_all(digest, ResumeInputs(inputs, tuple(history)), dataclasses.replace(spec, world_size=world), batching)
    except ShardloadError as exc:
        digest.refusal(exc)


def larger_sets(digest: Digest, count: int) -> None:
    rng = np.random.default_rng(7)
    for j in range(count):
        sizes = rng.integers(0, 300, size=int(rng.integers(20, 200))).astype(np.int64)
        lengths = np.clip(rng.lognormal(5, 1.0, size=int(sizes.sum())), 1, 4000).astype(np.int32)
        inputs = PlanInputs(lengths, sizes, chunk_rows=64 if j % 3 == 0 else None)
        spec = EpochSpec(world_size=int(rng.integers(1, 10)), stage="train" if j % 4 else "val", seed=j, epoch=j % 3)
        for batching in (
            Batching(batch_size=16),
            Batching(max_tokens=8192, pad_to_multiple_of=8),
            Batching(max_tokens=4096, bucketing=False, uneven="pad"),
            Batching(packing=True, pack_length=4096, rows_per_batch=2),
            Batching(packing=True, pack_length=512, rows_per_batch=4, pack_split=True, uneven="pad"),
            Batching(batch_size=8, uneven="drop" if j % 4 else "split", chunk_window=4 if j % 3 == 0 else None),
        ):
            plan_all(digest, inputs, spec, batching)


def main(argv: list[str] | None = None) -> Digest:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=600, help="random requests")
    p.add_argument("--large", type=int, default=12, help="larger long-tailed sets, 6 batchings each")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")  # EpochLengthWarning of held epochs: their plans are hashed all the same
    digest = Digest()
    rng = np.random.default_rng(12345)
    for i in range(args.cases):
        inputs: PlanInputs | MixInputs = random_inputs(rng, tiny=i % 7 == 0)
        spec = random_spec(rng)
        if i % 5 == 3:
            try:
                inputs = random_mixture(rng)
            except ShardloadError as exc:
                digest.refusal(exc)
                continue
        batching = random_batching(rng, inputs.max_length, spec.stage)
        if i % 10 in (4, 8):
            elastic(digest, rng, inputs, spec, batching)
            continue
        plan_all(digest, inputs, spec, batching)
        if i % 11 == 0:  # the next epoch of the same run (the run's steps, memo)
            plan_all(digest, inputs, spec.at_epoch(spec.epoch + 1), batching, summary=False)
    larger_sets(digest, args.large)
    print(f"{digest.planned} requests planned, {digest.refused} refused")
    print(f"plan digest: {digest.hash.hexdigest()}")
    return digest


if __name__ == "__main__":
    main()
