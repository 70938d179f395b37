"""Hypothesis strategies and helpers shared by the planner tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from numpy.typing import NDArray

from shardload.plan import Batching, EpochSpec, PlanInputs, RankPlan, padded_length, plan_rank
from shardload.plan.planner import EpochPlanner

STAGES = ("train", "val", "test", "predict")


def long_tailed(num: int, seed: int, kind: str = "lognormal") -> NDArray[np.int64]:
    """``(num,)`` lengths: lognormal (median 256, clipped [8, 4096]) or a harder variant."""
    rng = np.random.default_rng(seed)
    if kind == "lognormal":
        return np.clip(rng.lognormal(np.log(256), 1.0, num), 8, 4096).astype(np.int64)
    if kind == "zeros":  # short, with many zero-length samples
        return np.maximum(rng.lognormal(1.0, 1.5, num).astype(np.int64) - 2, 0)
    if kind == "constant":
        return np.full(num, 7, dtype=np.int64)
    # "giant": short samples and a few far over any budget used in the tests
    out = rng.integers(0, 40, num)
    out[rng.random(num) < 0.02] = 100_000
    return out.astype(np.int64)


def partition(num: int, parts: int, seed: int, *, allow_empty: bool) -> NDArray[np.int64]:
    """``(parts,)`` random shard sizes summing to ``num``."""
    rng = np.random.default_rng(seed)
    if allow_empty or num < parts:
        cuts = np.sort(rng.integers(0, num + 1, parts - 1))
    else:
        cuts = np.sort(rng.choice(np.arange(1, num), parts - 1, replace=False)) if parts > 1 else []
    return np.diff(np.concatenate([[0], cuts, [num]])).astype(np.int64)


@dataclass
class Case:
    """One drawn planning problem."""

    lengths: NDArray[np.int64]
    shard_sizes: NDArray[np.int64]
    world_size: int
    batching: Batching
    stage: str
    seed: int
    epoch: int
    shard_assignment: str
    chunk_rows: int | None = None  # the set's rows per chunk (a Zarr set's), None: no chunks

    def inputs(self) -> PlanInputs:
        return PlanInputs(self.lengths, self.shard_sizes, chunk_rows=self.chunk_rows)

    def spec(self) -> EpochSpec:
        return EpochSpec(
            world_size=self.world_size,
            stage=self.stage,  # type: ignore[arg-type]
            seed=self.seed,
            epoch=self.epoch,
            shard_assignment=self.shard_assignment,  # type: ignore[arg-type]
        )


@st.composite
def batchings(draw: st.DrawFn, *, uneven: tuple[str, ...] = ("split", "pad", "drop")) -> Batching:
    common = {
        "bucketing": draw(st.booleans()),
        "pad_to_multiple_of": draw(st.sampled_from([1, 8])),
        "uneven": draw(st.sampled_from(uneven)),
        "bucket_ratio": draw(st.sampled_from([1.05, 1.5])),
    }
    if draw(st.booleans()):
        return Batching(batch_size=draw(st.integers(1, 64)), **common)
    return Batching(
        max_tokens=draw(st.sampled_from([1, 16, 100, 1000, 4096, 16384])),
        max_rows=draw(st.sampled_from([None, None, 1, 7])),
        **common,
    )


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    max_samples: int = 5000,
    stages: tuple[str, ...] = STAGES,
    uneven: tuple[str, ...] = ("split", "pad", "drop"),
) -> Case:
    num = draw(st.one_of(st.integers(0, 70), st.integers(0, max_samples)))
    kind = draw(st.sampled_from(["lognormal", "lognormal", "zeros", "constant", "giant"]))
    data_seed = draw(st.integers(0, 2**32 - 1))
    parts = draw(st.integers(1, 50))
    return Case(
        lengths=long_tailed(num, data_seed, kind),
        shard_sizes=partition(num, parts, data_seed, allow_empty=draw(st.booleans())),
        world_size=draw(st.one_of(st.integers(1, 8), st.integers(1, 64))),
        batching=draw(batchings(uneven=uneven)),
        stage=draw(st.sampled_from(stages)),
        seed=draw(st.integers(0, 2**32 - 1)),
        epoch=draw(st.integers(0, 5)),
        shard_assignment=draw(st.sampled_from(["rotate", "fixed"])),
    )


def plan_all(case: Case) -> tuple[EpochPlanner, list[RankPlan]]:
    """Every rank's plan, sharing the per-epoch work (as summarize_plan does)."""
    planner = EpochPlanner(case.inputs(), case.spec(), case.batching)
    return planner, [planner.plan(rank) for rank in range(case.world_size)]


def batch_costs(plan: RankPlan, lengths: NDArray[np.integer], multiple: int) -> NDArray[np.int64]:
    """``(num_batches,)`` rows * padded length of each batch."""
    out = []
    for ids, _ in plan:
        out.append(len(ids) * padded_length(int(lengths[ids].max()), multiple))
    return np.asarray(out, dtype=np.int64)


def shard_of(sample_ids: NDArray[np.int64], shard_sizes: NDArray[np.int64]) -> NDArray[np.int64]:
    """``(n,)`` shard of each sample id."""
    starts = np.concatenate([[0], np.cumsum(shard_sizes)])
    return np.searchsorted(starts, sample_ids, side="right") - 1


def plan_of(
    lengths: Any, shard_sizes: Any, *, rank: int, batching: Any, digest: str | None = None, **spec: Any
) -> RankPlan:
    """:func:`plan_rank` from raw arrays and the :class:`EpochSpec` fields: the tests' shorthand.

    The request objects are built inside the call, so that a test of a bad
    argument sees the error they raise.
    """
    return plan_rank(
        PlanInputs(np.asarray(lengths), np.asarray(shard_sizes), digest), EpochSpec(**spec), batching, rank=rank
    )
