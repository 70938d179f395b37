"""The planner's guarantees, on random problems and on edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.errors import PlanError
from shardload.plan import Batching, RankPlan, digest_lengths, plan_rank
from shardload.plan.options import EVAL_STAGES

from .strategies import Case, batch_costs, cases, long_tailed, plan_all, plan_of, shard_of


def check_invariants(case: Case) -> list[RankPlan]:
    """Assert every planner guarantee for one problem; return the plans."""
    if case.stage in EVAL_STAGES and case.batching.uneven == "drop":
        # Invariant: evaluation refuses a policy that loses samples
        with pytest.raises(PlanError, match="uneven='drop'"):
            plan_all(case)
        return []
    _, plans = plan_all(case)
    num, world = len(case.lengths), case.world_size
    batching = case.batching
    counts = [len(plan) for plan in plans]

    # Invariant: every rank has the same number of batches (0 when N == 0)
    assert len(set(counts)) == 1
    if num == 0:
        assert counts[0] == 0
    # Invariant: evaluation's count is the largest rank's count (split/pad); training's is the run's steps per
    # epoch, which every rank can reach: at least the largest count (split/pad), at most the smallest (drop)
    before = plans[0].rank_batch_counts
    if case.stage in EVAL_STAGES or num == 0:
        assert counts[0] == before.max()
    elif batching.uneven == "drop":
        assert counts[0] <= before.min()
    else:
        assert counts[0] >= before.max()
    # Invariant: all ranks agree on the fingerprint and the pre-equalisation counts
    assert len({plan.fingerprint for plan in plans}) == 1
    assert all(np.array_equal(plan.rank_batch_counts, before) for plan in plans)

    real_ids = []
    for plan in plans:
        sizes = np.diff(plan.batch_offsets)
        # Invariant: no batch is empty, offsets cover exactly the rows
        assert (sizes >= 1).all()
        assert plan.batch_offsets[0] == 0 and plan.batch_offsets[-1] == len(plan.sample_ids)
        # Invariant: sample ids are valid ids, weights are 1 (real) or 0 (filler)
        assert ((plan.sample_ids >= 0) & (plan.sample_ids < max(num, 1))).all()
        assert set(np.unique(plan.weights).tolist()) <= {0.0, 1.0}
        real = plan.sample_ids[plan.weights > 0]
        real_ids.append(real)
        if batching.batch_size is not None:
            # Invariant: fixed batches never exceed batch_size rows
            assert (sizes <= batching.batch_size).all()
        else:
            assert batching.max_tokens is not None
            costs = batch_costs(plan, case.lengths, batching.pad_to_multiple_of)
            # Invariant: rows * padded length <= max_tokens, unless a batch has one row;
            # a row costs at least one token, so rows <= max_tokens too
            assert ((costs <= batching.max_tokens) | (sizes == 1)).all()
            assert (sizes <= batching.max_tokens).all()
            if batching.max_rows is not None:
                # Invariant: max_rows caps rows per batch
                assert (sizes <= batching.max_rows).all()
        if batching.uneven == "split" and plan.num_filler:
            # Invariant: split only adds filler when the rank has fewer rows than batches
            assert plan.num_real < len(plan)
            # Invariant: a filler batch is a single row
            filler_batches = np.flatnonzero(plan.weights[plan.batch_offsets[:-1]] == 0)
            assert (sizes[filler_batches] == 1).all()

    everything = np.sort(np.concatenate(real_ids)) if real_ids else np.zeros(0, np.int64)
    if case.stage in EVAL_STAGES or batching.uneven in ("split", "pad"):
        # Invariant: every sample is yielded exactly once, as a real row, over all ranks
        assert np.array_equal(everything, np.arange(num))
    else:
        # Invariant: drop loses samples but never repeats one
        assert len(np.unique(everything)) == len(everything)

    nonempty = int((case.shard_sizes > 0).sum())
    touched = [len(np.unique(shard_of(ids, case.shard_sizes))) for ids in real_ids]
    # Invariant: ranks read contiguous runs of shards: together they touch each shard
    # once plus at most one shared shard per cut between ranks
    assert sum(touched) <= nonempty + world - 1
    if (case.stage in EVAL_STAGES or case.shard_assignment == "fixed") and batching.uneven != "drop":
        starts = np.concatenate([[0], np.cumsum([len(ids) for ids in real_ids])])
        total = int(case.lengths.sum())
        for rank, ids in enumerate(real_ids):
            # Invariant: without rotation, the ranks own consecutive ranges of sample ids, in rank order
            assert np.array_equal(np.sort(ids), np.arange(starts[rank], starts[rank + 1]))
            if batching.batch_size is not None:
                # Invariant: with batch_size, cut by samples: rank r owns [r N / W, (r + 1) N / W)
                assert starts[rank] == rank * num // world
            elif num:
                # Invariant: otherwise cut by tokens: a rank has at most one sample's tokens over an equal share
                assert int(case.lengths[ids].sum()) <= total / world + int(case.lengths.max()) + 1
    return plans


@settings(max_examples=600, deadline=None)
@given(cases())
def test_invariants_hold_for_random_problems(case: Case) -> None:
    check_invariants(case)


@settings(max_examples=150, deadline=None)
@given(cases(stages=("train",), uneven=("drop",)))
def test_invariants_hold_when_training_drops(case: Case) -> None:
    check_invariants(case)


@settings(max_examples=150, deadline=None)
@given(cases(stages=("val", "test", "predict"), uneven=("split", "pad")))
def test_invariants_hold_in_evaluation(case: Case) -> None:
    check_invariants(case)


@settings(max_examples=40, deadline=None)
@given(cases(max_samples=2000), st.data())
def test_each_rank_plans_alone_and_deterministically(case: Case, data: st.DataObject) -> None:
    if case.stage in EVAL_STAGES and case.batching.uneven == "drop":
        return
    _, plans = plan_all(case)
    for rank in data.draw(st.lists(st.integers(0, case.world_size - 1), max_size=3)):
        alone = plan_rank(case.inputs(), case.spec(), case.batching, rank=rank)
        # Invariant: a rank planning on its own gets what the shared planner gives it
        assert np.array_equal(alone.sample_ids, plans[rank].sample_ids)
        assert np.array_equal(alone.weights, plans[rank].weights)
        assert np.array_equal(alone.batch_offsets, plans[rank].batch_offsets)
        assert alone.fingerprint == plans[rank].fingerprint


@settings(max_examples=40, deadline=None)
@given(
    cases(max_samples=2000, stages=("val", "test", "predict"), uneven=("split", "pad")),
    st.integers(0, 2**32 - 1),
    st.integers(0, 9),
)
def test_evaluation_ignores_seed_and_epoch(case: Case, seed: int, epoch: int) -> None:
    _, plans = plan_all(case)
    other = Case(**{**case.__dict__, "seed": seed, "epoch": epoch})
    _, others = plan_all(other)
    for mine, theirs in zip(plans, others, strict=True):
        # Invariant: evaluation order depends on neither seed nor epoch
        assert np.array_equal(mine.sample_ids, theirs.sample_ids)
        assert np.array_equal(mine.batch_offsets, theirs.batch_offsets)
        assert mine.fingerprint == theirs.fingerprint


def test_equal_sized_shards_are_read_by_few_ranks() -> None:
    lengths = long_tailed(100_000, seed=3)
    sizes = np.full(100, 1000)
    for world in (1, 3, 7, 16, 64):
        for rank in range(world):
            plan = plan_of(
                lengths,
                sizes,
                rank=rank,
                world_size=world,
                batching=Batching(max_tokens=8192),
                seed=1,
                epoch=2,
            )
            touched = len(np.unique(shard_of(plan.sample_ids, sizes)))
            # Invariant: a rank touches about S / W shards, never all of them
            assert touched <= math.ceil(100 / world) + 2


@pytest.mark.parametrize(
    "batching",
    [
        Batching(batch_size=16),
        Batching(max_tokens=4096),
        Batching(max_tokens=4096, bucketing=False),
    ],
)
def test_training_plans_change_between_epochs(batching: Batching) -> None:
    lengths, sizes = long_tailed(5000, seed=1), np.full(10, 500)
    plans = [plan_of(lengths, sizes, rank=1, world_size=4, batching=batching, epoch=epoch) for epoch in (0, 1)]
    # Invariant: training reshuffles every epoch (shards, samples and batches)
    assert not np.array_equal(plans[0].sample_ids, plans[1].sample_ids)
    assert plans[0].fingerprint != plans[1].fingerprint
    again = plan_of(lengths, sizes, rank=1, world_size=4, batching=batching, epoch=1)
    # Invariant: the same arguments give the same plan
    assert np.array_equal(again.sample_ids, plans[1].sample_ids)


def test_no_samples_gives_no_batches_on_any_rank() -> None:
    for shard_sizes in (np.zeros(0, np.int64), np.zeros(3, np.int64)):
        for rank in (0, 5):
            plan = plan_of(
                np.zeros(0, np.int32),
                shard_sizes,
                rank=rank,
                world_size=8,
                batching=Batching(max_tokens=100, uneven="pad"),
                stage="val",
            )
            # Invariant: N == 0 means 0 batches everywhere, and nothing to iterate
            assert len(plan) == 0 and plan.num_real == 0 and list(plan) == []


@pytest.mark.parametrize("uneven", ["split", "pad"])
def test_one_sample_on_64_ranks(uneven: str) -> None:
    plans = [
        plan_of(
            np.array([5]),
            np.array([1]),
            rank=r,
            world_size=64,
            batching=Batching(batch_size=4, uneven=uneven),
            stage="val",
        )
        for r in range(64)
    ]
    # Invariant: one batch everywhere; the sample is real once, filler (weight 0) elsewhere
    assert {len(p) for p in plans} == {1}
    assert sum(p.num_real for p in plans) == 1
    assert all(p.sample_ids.tolist() == [0] for p in plans)


def test_fewer_samples_than_ranks_in_training_drop() -> None:
    plans = [
        plan_of(
            np.arange(3),
            np.array([3]),
            rank=r,
            world_size=5,
            batching=Batching(batch_size=2, uneven="drop"),
        )
        for r in range(5)
    ]
    # Invariant: drop goes down to the smallest count, here 0 for the empty ranks
    assert {len(p) for p in plans} == {0}


def test_equal_lengths_make_full_token_batches() -> None:
    lengths = np.full(1000, 100)
    plan = plan_of(
        lengths,
        np.array([1000]),
        rank=0,
        world_size=1,
        batching=Batching(max_tokens=1000),
        stage="test",
    )
    # Invariant: identical lengths pack exactly max_tokens // length rows
    assert np.diff(plan.batch_offsets).tolist() == [10] * 100


def test_a_giant_sample_gets_its_own_batch() -> None:
    lengths = np.array([10, 10, 1_000_000, 10, 10])
    plan = plan_of(lengths, np.array([5]), rank=0, world_size=1, batching=Batching(max_tokens=100), stage="val")
    batches = [ids.tolist() for ids, _ in plan]
    # Invariant: an over-budget sample is not dropped: it is alone in its batch
    assert [2] in batches
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]


def test_rank_plan_accessors() -> None:
    plan = plan_of(
        np.arange(1, 11),
        np.array([4, 6]),
        rank=0,
        world_size=1,
        batching=Batching(batch_size=3, bucketing=False),
        stage="val",
    )
    ids, weights = plan.batch(-1)
    assert ids.tolist() == [9] and weights.tolist() == [1.0]
    # Invariant: batches are views into the plan's arrays, not copies
    assert np.shares_memory(ids, plan.sample_ids) and np.shares_memory(weights, plan.weights)
    assert plan.batch(0)[0].tolist() == [0, 1, 2]
    assert plan.num_batches == 4 and plan.num_filler == 0
    with pytest.raises(IndexError):
        plan.batch(4)
    with pytest.raises(ValueError):  # read-only arrays: a plan cannot be edited by accident
        plan.sample_ids[0] = 1
    assert "num_batches=4" in repr(plan)


def test_memmap_and_int32_give_the_same_plan(tmp_path) -> None:
    lengths = long_tailed(3000, seed=4)
    path = tmp_path / "lengths.npy"
    np.save(path, lengths.astype(np.int32))
    mapped = np.load(path, mmap_mode="r")
    kwargs = {"rank": 2, "world_size": 3, "batching": Batching(max_tokens=4096), "seed": 9}
    a = plan_of(lengths, np.array([1000, 2000]), **kwargs)
    b = plan_of(mapped, np.array([1000, 2000]), **kwargs)
    # Invariant: the dtype and storage of the index do not change the plan
    assert np.array_equal(a.sample_ids, b.sample_ids)
    assert np.array_equal(a.batch_offsets, b.batch_offsets)
    assert digest_lengths(mapped) == digest_lengths(lengths.astype(np.int32))


def test_fingerprint_follows_the_inputs() -> None:
    lengths, sizes = long_tailed(500, seed=2), np.array([250, 250])
    base = {"rank": 0, "world_size": 2, "batching": Batching(batch_size=8)}
    first = plan_of(lengths, sizes, **base).fingerprint
    changed = lengths.copy()
    changed[7] += 1
    # Invariant: a different index or option changes the fingerprint; the rank does not
    assert plan_of(changed, sizes, **base).fingerprint != first
    assert plan_of(lengths, sizes, **{**base, "batching": Batching(batch_size=9)}).fingerprint != first
    assert plan_of(lengths, sizes, **{**base, "rank": 1}).fingerprint == first
    assert plan_of(lengths, sizes, digest="abc", **base).fingerprint != first


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 2, "world_size": 2}, "rank=2 is out of range"),
        ({"rank": -1}, "rank must be >= 0"),
        ({"world_size": 0}, "world_size must be >= 1"),
        ({"stage": "eval"}, "stage='eval'"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"epoch": 1.5}, "epoch must be an integer"),
        ({"shard_assignment": "random"}, "shard_assignment='random'"),
        ({"batching": {"batch_size": 4}}, "batching must be a shardload.plan.Batching"),
        ({"stage": "val", "batching": Batching(batch_size=4, uneven="drop")}, "lose samples"),
        ({"lengths": np.array([1, -2, 3])}, r"lengths\[1\] = -2 is negative"),
        ({"lengths": np.array([1.0, 2.0, 3.0])}, "must hold integers"),
        ({"lengths": np.ones((3, 1), np.int64)}, "1-D array"),
        ({"shard_sizes": np.array([2, 2])}, "add up to 4 samples but lengths has 3"),
        ({"shard_sizes": np.array([4, -1])}, "negative"),
    ],
)
def test_bad_arguments_raise_plan_errors(kwargs: dict, message: str) -> None:
    call = {
        "lengths": np.array([1, 2, 3]),
        "shard_sizes": np.array([3]),
        "rank": 0,
        "world_size": 1,
        "batching": Batching(batch_size=4),
        **kwargs,
    }
    with pytest.raises(PlanError, match=message):
        plan_of(call.pop("lengths"), call.pop("shard_sizes"), **call)
