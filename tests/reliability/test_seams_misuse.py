"""The option objects and the planning request, misused as a careless user would.

Each test is one problem found by misusing the documented API (``Batching``,
``LoaderOptions``, ``PlanInputs``, ``summarize_plan``, ``ZarrOptions``, the
shortcut keywords): the misuse now ends in a ``ShardloadError`` naming the
option, or in the right result, instead of a wrong plan, an assertion, a
silently accepted value or a process killed for memory.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload import Batching, LoaderOptions
from shardload.errors import InputError, PlanError
from shardload.plan import EpochSpec, PlanInputs, plan_rank, summarize_plan


@pytest.mark.parametrize(
    "lengths",
    [
        np.array([2**63 + 5, 1, 1, 1], dtype=np.uint64),  # beyond int64: wrapped negative in the planner's sums
        np.array([2**62, 2**62, 1, 1], dtype=np.int64),  # rows x length overflowed int64
        np.array([(1 << 40) + 1, 1, 1, 1], dtype=np.int64),  # beyond what a shard set's lengths index may hold
    ],
    ids=["uint64 above int64", "2**62", "2**40 + 1"],
)
def test_plan_inputs_refuse_lengths_beyond_the_index_bound(lengths: np.ndarray) -> None:
    # Invariant: PlanInputs refuses a length a shard set could not hold (> 2**40), naming the sample, instead of
    # an AssertionError, an OverflowError, a batch over max_tokens or negative token counts in the summary.
    with pytest.raises(PlanError, match=r"lengths\[0\].*2\*\*40"):
        PlanInputs(lengths, np.array([2, 2]))
    bound = PlanInputs(np.array([1 << 40, 1, 1, 1]), np.array([2, 2]))  # the bound itself is a length
    summary = summarize_plan(bound, EpochSpec(world_size=2, stage="val"), Batching(batch_size=2, bucketing=False))
    assert summary.tokens.tolist() == [(1 << 40) + 1, 2]
    for bucketing in (True, False):  # over the budget: alone in its batch
        plan = plan_rank(
            bound, EpochSpec(world_size=1, stage="val"), Batching(max_tokens=10, bucketing=bucketing), rank=0
        )
        assert sorted(len(ids) for ids, _ in plan) == [1, 3]


def test_summary_with_ids_over_many_ranks_does_not_grow_with_the_square_of_the_world_size() -> None:
    # Invariant: each RankPlan shares the epoch's (W,) batch counts, so keeping every rank's plan costs O(N + W)
    # memory, not O(W**2) (65,536 ranks of a 97-sample set took 32 GiB: `shardload plan --json --with-ids` was killed).
    inputs = PlanInputs(np.arange(97) % 50, np.array([20, 20, 20, 20, 17]))
    world = 4096
    tracemalloc.start()
    try:
        summary = summarize_plan(
            inputs, EpochSpec(world_size=world, stage="val"), Batching(max_tokens=64), with_ids=True
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary.plans is not None and len(summary.plans) == world
    assert peak < (world * world * 8) // 4, f"peak {peak / 2**20:.0f} MiB for {world} ranks"  # copies: 128 MiB
    counts = summary.plans[0].rank_batch_counts
    assert not counts.flags.writeable and counts.tolist() == summary.rank_batch_counts.tolist()


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        ({"batching": Batching(batch_size=1), "batch_size": True}, "batch_size"),
        ({"batching": Batching(batch_size=32), "batch_size": 32.0}, "batch_size"),
        ({"batching": Batching(max_tokens=64), "max_tokens": np.float64(64)}, "max_tokens"),
        ({"batch_size": 4, "loader_options": LoaderOptions(), "num_workers": False}, "num_workers"),
        ({"batch_size": 4, "loader_options": LoaderOptions(num_workers=2), "num_workers": 2.0}, "num_workers"),
    ],
    ids=["batch_size=True", "batch_size=32.0", "max_tokens float64", "num_workers=False", "num_workers=2.0"],
)
def test_a_shortcut_of_the_wrong_type_is_refused_even_when_it_equals_its_object(
    pristine: Path, keywords: dict[str, object], named: str
) -> None:
    # Invariant: a shortcut keyword is checked like the field it stands for, whether or not its object is given
    # (batch_size=True beside Batching(batch_size=1) passed, as True == 1; alone it is refused).
    with pytest.raises(PlanError, match=named):
        shardload.make_loader(pristine, rank=0, world_size=1, **keywords)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=named):
        shardload.ShardDataModule(train=pristine, **keywords)  # type: ignore[arg-type]


def test_zarr_options_take_numpy_integers_like_every_other_option_object() -> None:
    # Invariant: ZarrOptions accepts numpy integers as Batching and PrepareOptions do (it said "chunk size must be a
    # positive number of bytes, got np.int64(4096)"), stores plain ints, and still refuses bools and floats.
    pytest.importorskip("zarr")
    options = shardload.ZarrOptions(compression_level=np.int64(5), chunk_size=np.int64(4096))
    assert (options.compression_level, options.chunk_size) == (5, 4096)
    assert type(options.chunk_size) is int and type(options.compression_level) is int
    for bad in ({"chunk_size": np.float64(4096)}, {"chunk_size": np.True_}, {"compression_level": np.int64(99)}):
        with pytest.raises(InputError):
            shardload.ZarrOptions(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("with_ids", ["no", 0, None, 1.0])
def test_summarize_plan_refuses_a_with_ids_that_is_not_a_bool(with_ids: object) -> None:
    # Invariant: with_ids is checked like every bool option (with_ids="no" kept every rank's plan, as "no" is true).
    inputs = PlanInputs(np.array([3, 1, 2]), np.array([3]))
    with pytest.raises(PlanError, match="with_ids"):
        summarize_plan(inputs, EpochSpec(world_size=2), Batching(batch_size=2), with_ids=with_ids)  # type: ignore[arg-type]
    assert summarize_plan(inputs, EpochSpec(world_size=2), Batching(batch_size=2), with_ids=np.False_).plans is None  # type: ignore[arg-type]


@pytest.mark.parametrize(("rank", "world_size"), [(0, None), (None, 4)])
def test_rank_without_world_size_says_to_give_both(pristine: Path, rank: int | None, world_size: int | None) -> None:
    # Invariant: half of the pair is refused with what to do, not "world_size must be an integer, got None"
    with pytest.raises(PlanError, match="give rank and world_size together"):
        shardload.make_loader(pristine, batch_size=4, rank=rank, world_size=world_size)


def test_unsigned_shard_sizes_beyond_int64_are_too_large_not_negative() -> None:
    sizes = np.array([2**64 - 1, 1], dtype=np.uint64)
    # Invariant: the message names the real problem (it said "-1 is negative" after a cast)
    with pytest.raises(PlanError, match=r"shard_sizes\[0\] = 18446744073709551615 is too large"):
        PlanInputs(np.zeros(2, np.int64), sizes)
