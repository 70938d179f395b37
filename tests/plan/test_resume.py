"""Elastic resume in the planner: the rest of an epoch after segments on other world sizes.

The property: run an epoch as a chain of segments, each on its own world size
for its own number of batches, then finish it on the last world size. The
real entries served (``(sample, start)``) are exactly the epoch's, each once:
the uninterrupted run's with the default policy in training, and with weight
1 in evaluation; every segment's plan has equal counts on its ranks.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from shardload.errors import PlanError
from shardload.plan import Batching, EpochPlanner, EpochSpec, MixInputs, PlanInputs
from shardload.plan.resume import ResumeInputs
from tests.plan.strategies import long_tailed, partition

Served = Counter[tuple[int, int]]


def _served(planner: EpochPlanner, batches: int | None = None) -> tuple[Served, set[int], set[float]]:
    """Real ``(sample, start)`` entries of the first ``batches`` batches of every rank; batch counts; weights."""
    out: Served = Counter()
    counts, weights = set(), set()
    for plan in planner.plans():
        counts.add(len(plan))
        end = int(plan.batch_offsets[len(plan) if batches is None else batches])
        real = plan.weights[:end] > 0
        starts = np.zeros(end, np.int64) if plan.starts is None else plan.starts[:end]
        out.update(zip(plan.sample_ids[:end][real].tolist(), starts[real].tolist()))
        weights.update(plan.weights[:end][real].tolist())
    return out, counts, weights


@st.composite
def batchings(draw: st.DrawFn) -> Batching:
    mode = draw(st.sampled_from(["fixed", "tokens", "buckets", "packing"]))
    uneven = draw(st.sampled_from(["split", "split", "pad"]))
    if mode == "fixed":
        return Batching(batch_size=draw(st.integers(1, 16)), uneven=uneven)
    if mode == "packing":
        return Batching(
            packing=True,
            pack_length=draw(st.sampled_from([64, 300, 4096])),
            rows_per_batch=draw(st.integers(1, 4)),
            pack_split=draw(st.booleans()),
            uneven=uneven,
        )
    return Batching(max_tokens=draw(st.sampled_from([500, 4096, 20000])), bucketing=mode == "buckets", uneven=uneven)


def _inputs(draw: st.DrawFn, mixture: bool) -> PlanInputs | MixInputs:
    def one() -> PlanInputs:
        n = draw(st.one_of(st.integers(0, 30), st.integers(0, 400)))
        seed = draw(st.integers(0, 2**32 - 1))
        lengths = np.minimum(long_tailed(n, seed), 4096)
        return PlanInputs(lengths, partition(n, draw(st.integers(1, 12)), seed, allow_empty=True))

    if not mixture:
        return one()
    a, b = one(), one()
    if a.num_samples + b.num_samples == 0 or 0 in (a.max_length, b.max_length):
        return MixInputs((a, b), ("a", "b"))  # sizes (nothing to weigh)
    return MixInputs((a, b), ("a", "b"), {"a": 1, "b": draw(st.sampled_from([0.3, 1, 3]))})


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_chain_of_world_sizes_serves_the_epoch_exactly_once(data: st.DataObject) -> None:
    mixture = data.draw(st.booleans(), "mixture")
    inputs = _inputs(data.draw, mixture)
    batching = data.draw(batchings(), "batching")
    stage = data.draw(st.sampled_from(["train", "train", "val"]), "stage")
    seed, epoch = data.draw(st.integers(0, 2**32 - 1)), data.draw(st.integers(0, 3))
    worlds = data.draw(st.lists(st.integers(1, 9), min_size=2, max_size=4), "world sizes")

    def spec(world: int) -> EpochSpec:
        return EpochSpec(world_size=world, stage=stage, seed=seed, epoch=epoch)  # type: ignore[arg-type]

    try:
        whole, _, _ = _served(EpochPlanner(inputs, spec(worlds[0]), batching))
    except PlanError:  # a mixture source with a weight and no tokens, or a sample longer than a row
        event("refused")
        return
    served: Served = Counter()
    history: list[tuple[int, int]] = []
    for i, world in enumerate(worlds):
        planner = EpochPlanner(ResumeInputs(inputs, tuple(history)), spec(world), batching)
        last = i == len(worlds) - 1
        k = None if last else data.draw(st.integers(0, planner.num_batches), f"batches on {world} ranks")
        got, counts, weights = _served(planner, k)
        # Invariant: every segment's plan gives its ranks equal batch counts, and real entries weight 1
        assert len(counts) <= 1
        assert weights <= {1.0}
        served += got
        if k is not None:
            history.append((world, k))
    # Invariant: before and after every resume together, the epoch's entries, each as often as uninterrupted
    assert served == whole
    if not mixture or stage == "val":  # every sample once (each of its pieces once, when cut)
        assert served == Counter(_pieces(inputs, batching))


def _pieces(inputs: PlanInputs | MixInputs, batching: Batching) -> list[tuple[int, int]]:
    cap = batching.pack_length if batching.packing and batching.pack_split else None
    lengths = inputs.lengths.tolist()
    return [(i, s) for i, n in enumerate(lengths) for s in (range(0, max(n, 1), cap) if cap else [0])]


def test_partly_consumed_samples_resume_as_their_remaining_pieces() -> None:
    # 12 samples of 250 tokens cut into pieces of 100, 100, 50: one rank packs them in 5 batches of 3 rows
    inputs = PlanInputs(np.full(12, 250), np.array([12]))
    batching = Batching(packing=True, pack_length=100, rows_per_batch=3, pack_split=True)
    spec = EpochSpec(world_size=1, seed=3)
    first = EpochPlanner(inputs, spec, batching)
    before, _, _ = _served(first, 1)
    # the first batch holds pieces of samples whose other pieces are in later batches
    partly = {i for i, _ in before} - {i for i, s in before if s == 200}
    assert partly
    rest = EpochPlanner(ResumeInputs(inputs, ((1, 1),)), EpochSpec(world_size=2, seed=3), batching)
    assert rest.rest is not None and rest.rest.starts is not None
    after, _, _ = _served(rest)
    # Invariant: a partly consumed sample comes back as exactly its pieces not yet served, with their starts
    assert not set(before) & set(after)
    assert sorted(before + after) == [(i, s) for i in range(12) for s in (0, 100, 200)]


def test_same_history_gives_the_same_plan_and_fingerprint() -> None:
    inputs = PlanInputs(np.arange(1, 101), np.array([30, 30, 40]))
    batching = Batching(max_tokens=300, bucketing=True)
    a = EpochPlanner(ResumeInputs(inputs, ((4, 2), (3, 0))), EpochSpec(world_size=2, seed=1), batching)
    b = EpochPlanner(ResumeInputs(inputs, ((4, 2),)), EpochSpec(world_size=2, seed=1), batching)
    c = EpochPlanner(ResumeInputs(inputs, ((4, 3),)), EpochSpec(world_size=2, seed=1), batching)
    # segments of 0 batches consumed nothing; another history is another plan
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert [p.sample_ids.tolist() for p in a.plans()] == [p.sample_ids.tolist() for p in b.plans()]


def test_locality_each_new_rank_reads_a_contiguous_group_of_the_shards_left() -> None:
    inputs = PlanInputs(np.full(400, 10), np.full(20, 20))
    batching = Batching(batch_size=5)
    spec = EpochSpec(world_size=3, stage="train", shard_assignment="fixed")
    planner = EpochPlanner(ResumeInputs(inputs, ((8, 3),)), spec, batching)
    for plan in planner.plans():
        shards = np.unique(plan.sample_ids[plan.weights > 0] // 20)
        # Invariant: about (shards left) / 3 + 2 shards each, never all 20
        assert len(shards) <= 20 // 3 + 2


@pytest.mark.parametrize(
    ("history", "named"),
    [
        (((4, 10**6),), "segment 0 ran 1000000 batches"),
        (((0, 1),), "world_size must be >= 1"),
        (((2, -1),), "batches must be >= 0"),
        (((2, 1.5),), "batches must be an integer"),
        ((2, 1), "segment 0 must be a [world_size, batches] pair"),
        ("8:3", "must be a list"),
    ],
)
def test_a_bad_history_is_a_plan_error_naming_it(history: object, named: str) -> None:
    inputs = PlanInputs(np.arange(1, 101), np.array([100]))
    with pytest.raises(PlanError) as err:
        EpochPlanner(ResumeInputs(inputs, history), EpochSpec(world_size=2), Batching(batch_size=4))  # type: ignore[arg-type]
    assert named in str(err.value)
