"""Mixture plans: equal steps, each source's share at every step prefix, bounded repetition, exact evaluation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from shardload.errors import MixtureError, PlanError, PlanMismatchError
from shardload.plan import Batching, EpochSpec, PlanInputs, RankPlan, summarize_plan
from shardload.plan.mix.batcher import interleave
from shardload.plan.mix.inputs import MixInputs, check_weights, select_source
from shardload.plan.planner import EpochPlanner

from .strategies import STAGES, batchings, long_tailed, partition


@dataclass
class MixCase:
    """One drawn mixture problem."""

    mix: MixInputs
    spec: EpochSpec
    batching: Batching

    def plans(self) -> tuple[EpochPlanner, list[RankPlan]]:
        planner = EpochPlanner(self.mix, self.spec, self.batching)
        return planner, [planner.plan(r) for r in range(self.spec.world_size)]


@st.composite
def sources(draw: st.DrawFn, world: int, split: bool | None) -> PlanInputs:
    """One source: sometimes empty, sometimes smaller than the world size."""
    num = draw(st.one_of(st.just(0), st.integers(1, max(1, world - 1)), st.integers(0, 60), st.integers(0, 1500)))
    kind = draw(st.sampled_from(["lognormal", "lognormal", "zeros", "constant", "giant"]))
    seed = draw(st.integers(0, 2**32 - 1))
    lengths = long_tailed(num, seed, kind)
    if split is not None:  # packing: giants would be thousands of pieces; without split, at most a row
        lengths = np.minimum(lengths, 3000 if split else 512)
    return PlanInputs(lengths, partition(num, draw(st.integers(1, 12)), seed, allow_empty=draw(st.booleans())))


@st.composite
def mix_cases(draw: st.DrawFn, *, stages: tuple[str, ...] = STAGES, packed: bool | None = None) -> MixCase:
    world = draw(st.one_of(st.integers(1, 4), st.integers(1, 24)))
    stage = draw(st.sampled_from(stages))
    uneven = ("split", "pad", "drop") if stage == "train" else ("split", "pad")
    pack = draw(st.booleans()) if packed is None else packed
    split = draw(st.booleans()) if pack else None
    if pack:
        batching = Batching(
            packing=True, pack_length=512, rows_per_batch=draw(st.integers(1, 4)), pack_split=bool(split),
            uneven=draw(st.sampled_from(uneven)),
        )  # fmt: skip
    else:
        batching = draw(batchings(uneven=uneven))
    k = draw(st.integers(1, 5))
    srcs = tuple(draw(sources(world, split)) for _ in range(k))
    names = tuple(f"s{i}" for i in range(k))
    by = draw(st.sampled_from(["tokens", "samples"]))
    units = [s.num_samples if by == "samples" else int(s.lengths.sum()) for s in srcs]
    # a source with nothing to give gets weight 0 in training (a positive one is refused: its own test)
    weights = {n: (draw(st.sampled_from([0.0, 0.1, 0.5, 1.0, 3.0])) if u else 0.0) for n, u in zip(names, units)}
    if sum(weights.values()) == 0:
        weights = {n: (1.0 if u else 0.0) for n, u in zip(names, units)}
        if sum(weights.values()) == 0:
            weights = {n: 1.0 for n in names}
    epoch_size = draw(st.one_of(st.none(), st.integers(0, 2 * sum(units) + 10)))
    if all(u == 0 for u in units) or any(u == 0 and weights[n] > 0 for n, u in zip(names, units)):
        weights = None  # proportions by size: a mixture of empty sources plans no batch
    mix = MixInputs(srcs, names, weights, by=by, epoch_size=epoch_size)
    spec = EpochSpec(
        world_size=world,
        stage=stage,  # type: ignore[arg-type]
        seed=draw(st.integers(0, 2**32 - 1)),
        epoch=draw(st.integers(0, 6)),
        shard_assignment=draw(st.sampled_from(["rotate", "fixed"])),  # type: ignore[arg-type]
    )
    return MixCase(mix, spec, batching)


def entry_units(ids: NDArray[np.int64], starts: NDArray[np.int64] | None, case: MixCase) -> NDArray[np.int64]:
    """``(E,)`` units (tokens or samples, as the mixture's ``by``) of each entry (a packed piece: its own part)."""
    mix, batching = case.mix, case.batching
    if mix.by == "samples":
        return np.ones(len(ids), np.int64) if starts is None else (starts == 0).astype(np.int64)
    per = mix.lengths_at(ids)
    if starts is not None:
        assert batching.pack_length is not None
        per = np.minimum(per - starts, batching.pack_length)
    return per


def units_per_step(plan: RankPlan, case: MixCase) -> NDArray[np.int64]:
    """``(batches, K)`` real units (tokens or samples, as the mixture's ``by``) of each source in each batch."""
    ids, real = plan.sample_ids, plan.weights > 0
    out = np.zeros((len(plan), case.mix.num_sources), dtype=np.int64)
    batch = np.repeat(np.arange(len(plan)), np.diff(plan.batch_offsets))
    np.add.at(out, (batch, case.mix.source_of(ids)), np.where(real, entry_units(ids, plan.starts, case), 0))
    return out


def largest_unit(planner: EpochPlanner, case: MixCase) -> int:
    """The most units of one interleaved unit (a batch, or a packed row) on any rank.

    Taken as the rank's sources were interleaved, before equalising: ``uneven="split"`` may then cut a unit into
    consecutive smaller batches, which do not make the interleave any finer.
    """
    assert planner.mix is not None
    best = 0
    for rank in range(case.spec.world_size):
        ids, offsets, starts, row_key = planner.mix._build(rank)  # (E,) ids; a unit per batch, or per row_key
        unit = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets)) if row_key is None else row_key
        if len(ids):
            best = max(best, int(np.bincount(unit, weights=entry_units(ids, starts, case)).max()))
    return best


def used_counts(plans: list[RankPlan], mix: MixInputs) -> NDArray[np.int64]:
    """``(N,)`` real uses of each global sample id (a packed sample cut in pieces counts once)."""
    ids = np.concatenate([p.sample_ids[(p.weights > 0) & ((p.starts is None) | (p.starts == 0))] for p in plans])
    return np.bincount(ids, minlength=mix.num_samples)


def selected(case: MixCase) -> NDArray[np.int64]:
    """``(N,)`` the uses the selection asks of each sample this epoch."""
    parts = []
    for k, source in enumerate(case.mix.sources):
        sel = select_source(case.mix, k, seed=case.spec.seed, epoch=case.spec.epoch, train=case.spec.shuffled)
        parts.append(np.ones(source.num_samples, np.int64) if sel.counts is None else sel.counts)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


#: pack_split with samples of several rows: the selection overshoots its share by most of a sample (228 tokens,
#: more than W * (row + pack_length) = 200), within W * (row + the longest sample)
SPLIT_OVERSHOOT = MixCase(
    MixInputs(
        (PlanInputs(np.full(50, 10), np.array([50])), PlanInputs(np.array([745, 657, 488, 515]), np.array([4]))),
        ("a", "b"),
        {"a": 1, "b": 1},
    ),
    EpochSpec(world_size=1, stage="train", seed=0, epoch=0),
    Batching(packing=True, pack_length=100, rows_per_batch=1, pack_split=True),
)

#: by samples, a source of short and empty samples packs all its 40 uses on a rank into one row, which the run's steps
#: per epoch (52, above the epoch's 30 rows) have uneven="split" cut into 23 batches of 1 or 2 samples: the deviation
#: (20.5 samples) is bounded by the row as interleaved (U = 40), not by its pieces (U = 2 bounds it by 20)
SPLIT_ROW = MixCase(
    MixInputs(
        (
            PlanInputs(np.array([290, 224, 485, 284, 149, 367, 512]), np.array([0, 0, 0, 1, 1, 0, 2, 1, 0, 1, 0, 1])),
            PlanInputs(np.array([290]), np.array([1])),
            PlanInputs(
                np.array(
                    [1, 0, 5, 1, 0, 2, 17, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 10, 0, 19, 0, 2, 8, 1, 0, 0, 0, 1, 0, 0]
                    + [0, 4, 1, 2, 0, 0, 6, 23, 0, 24, 18, 6, 2, 0, 22, 49, 38, 17, 2, 0, 0, 5, 0, 2, 3, 5, 0, 0, 0]
                    + [0, 34, 0, 2, 0, 27, 17, 5, 0, 0, 5, 10, 0, 39, 0, 0, 9, 0, 52, 1, 0, 0, 0, 0, 4, 4, 16, 0, 32]
                    + [0, 26, 0, 0, 1, 10, 1, 0, 0, 0, 3, 9, 0, 0, 8, 0, 0, 4, 0, 2, 0, 1, 0, 1, 5, 0, 20, 6, 7, 13]
                    + [6, 7, 1, 0, 0, 0, 0, 2, 0, 0, 0, 2, 2, 17, 0, 10, 20, 13, 0, 15, 2, 3, 2, 2, 2, 0, 0, 0, 0]
                    + [11, 0]
                ),
                np.array([151]),
            ),
        ),
        ("s0", "s1", "s2"),
        {"s0": 0.1, "s1": 0.0, "s2": 0.1},
        by="samples",
    ),
    EpochSpec(world_size=2, stage="train", seed=0, epoch=0),
    Batching(packing=True, pack_length=512, rows_per_batch=1, pack_split=False),
)


@settings(max_examples=300, deadline=None)
@given(mix_cases())
@example(SPLIT_OVERSHOOT)
@example(SPLIT_ROW)
def test_mixture_plans_keep_every_guarantee(case: MixCase) -> None:
    planner, plans = case.plans()
    mix = case.mix
    # equal batch counts
    assert {len(p) for p in plans} == {planner.num_batches}
    assert len({p.fingerprint for p in plans}) == 1
    # what is used: evaluation every sample once; training the selection, nothing dropped or repeated beyond it
    uses, asked = used_counts(plans, mix), selected(case)
    if case.spec.stage != "train":
        assert (uses == 1).all()
    elif case.batching.uneven != "drop":
        assert (uses == asked).all()
    else:
        assert (uses <= asked).all()
    # repetition: each sample floor or ceil of its source's ratio
    for k in range(mix.num_sources):
        sel = select_source(mix, k, seed=case.spec.seed, epoch=case.spec.epoch, train=case.spec.shuffled)
        mine = asked[mix.offsets[k] : mix.offsets[k + 1]]
        if sel.counts is not None and sel.units and len(mine):
            assert mine.max() <= math.ceil(sel.ratio)
            assert mine.min() >= math.floor(sel.ratio)
    # the share of every source after every step prefix, over all ranks, stays within (K + 1) * (W * (U / 2 + L) + L)
    # of its weight: interleave (u_k + p_k * sum_j u_j) / 2 per rank, each rank's split of the sources and the
    # selection in whole samples (L each, for the source and its share of the others). U is the largest unit as
    # interleaved (largest_unit): uneven="split" cuts units into consecutive batches only after the interleave, and
    # through a unit of one source every x_k - p_k X moves linearly, so a prefix that ends inside a cut unit is
    # within the bound at the unit's ends, which needs the whole unit (SPLIT_ROW: pieces of 2, a unit of 40)
    steps = sum(units_per_step(p, case) for p in plans)
    if len(plans[0]) == 0:
        return
    done = np.cumsum(steps, axis=0)  # (T, K)
    total = done.sum(axis=1)
    shares = np.array(mix.shares)
    if case.spec.stage != "train":  # evaluation mixes every sample once: the sizes are the shares
        units = np.array(mix.units, dtype=np.float64)
        shares = units / units.sum() if units.sum() else shares
    deviation = np.abs(done - np.outer(total, shares)).max()
    longest = 1 if mix.by == "samples" else mix.max_length
    if case.batching.packing and not case.batching.pack_split:
        # with pack_split, L stays the longest sample: the selection takes whole samples, pieces or not
        assert case.batching.pack_length is not None
        longest = min(longest, case.batching.pack_length)
    bound = (mix.num_sources + 1) * (case.spec.world_size * (largest_unit(planner, case) / 2 + longest) + longest)
    assert deviation <= bound + 1e-6 * total[-1], (deviation, bound)
    # packed: every row within its batch and within pack_length
    if case.batching.packing:
        for p in plans:
            assert p.rows is not None
            assert (p.rows >= 0).all() and (p.rows < (case.batching.rows_per_batch or 0)).all()


@settings(max_examples=60, deadline=None)
@given(mix_cases(stages=("train",)), st.integers(2, 6))
def test_selection_is_even_over_epochs(case: MixCase, epochs: int) -> None:
    """Over E epochs every sample of a source is used floor or ceil of E * ratio times."""
    mix = case.mix
    for k in range(mix.num_sources):
        total = np.zeros(mix.sources[k].num_samples, dtype=np.int64)
        ratio = 0.0
        for e in range(epochs):
            sel = select_source(mix, k, seed=case.spec.seed, epoch=e, train=True)
            total += 1 if sel.counts is None else sel.counts
            ratio = sel.ratio if sel.counts is not None else 1.0
        if len(total) and mix.units[k]:
            if mix.by == "samples" or (mix.sources[k].lengths > 0).all():
                assert total.max() - total.min() <= 1
            assert total.max() <= math.ceil(epochs * ratio - 1e-9) + 1


@settings(max_examples=80, deadline=None)
@given(mix_cases(stages=("train",)))
def test_each_rank_reads_a_contiguous_group_of_every_source(case: MixCase) -> None:
    _, plans = case.plans()
    mix = case.mix
    for k, source in enumerate(mix.sources):
        starts = np.concatenate([[0], np.cumsum(source.shard_sizes)])
        touched = 0
        for p in plans:
            ids = p.sample_ids[(p.weights > 0) & (mix.source_of(p.sample_ids) == k)] - mix.offsets[k]
            touched += len(np.unique(np.searchsorted(starts, ids, side="right") - 1))
        assert touched <= int((source.shard_sizes > 0).sum()) + case.spec.world_size - 1


def test_max_repeats_names_the_source_the_ratio_and_the_cap() -> None:
    big = PlanInputs(np.full(100, 10), np.array([100]))
    small = PlanInputs(np.full(4, 10), np.array([4]))
    mix = MixInputs((big, small), ("web", "math"), {"web": 1, "math": 1}, max_repeats=3)
    with pytest.raises(
        MixtureError, match=r"'math' would be repeated 13 times.*up to 13 times; 520 of its 40 tokens.*max_repeats=3"
    ):
        EpochPlanner(mix, EpochSpec(world_size=2), Batching(batch_size=4))
    # within the cap, and in evaluation (no repetition), it plans
    ok = MixInputs((big, small), ("web", "math"), {"web": 1, "math": 1}, max_repeats=13)
    EpochPlanner(ok, EpochSpec(world_size=2), Batching(batch_size=4))
    EpochPlanner(mix, EpochSpec(world_size=2, stage="val"), Batching(batch_size=4))


def test_an_empty_source_with_a_positive_weight_is_refused_in_training_only() -> None:
    full = PlanInputs(np.full(10, 5), np.array([10]))
    empty = PlanInputs(np.zeros(0, np.int64), np.array([0]))
    mix = MixInputs((full, empty), ("web", "code"), {"web": 1, "code": 1})
    with pytest.raises(MixtureError, match="source 'code' has no tokens.*weight 0"):
        EpochPlanner(mix, EpochSpec(world_size=2), Batching(batch_size=4))
    assert len(EpochPlanner(mix, EpochSpec(world_size=2, stage="val"), Batching(batch_size=4)).plan(0)) == 2


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ({"a": 1}, "no weight for source 'b'"),
        ({"a": 1, "b": 1, "c": 1}, "'c', which is not a source"),
        ({"a": -1, "b": 1}, "finite numbers >= 0"),
        ({"a": float("nan"), "b": 1}, "finite numbers >= 0"),
        ({"a": 0, "b": 0.0}, "every weight is 0"),
        ({"a": "1", "b": 1}, "must be a number"),
        ([1, 2], "must be a dict"),
    ],
)
def test_bad_weights_are_refused(weights: object, match: str) -> None:
    with pytest.raises(MixtureError, match=match):
        check_weights(("a", "b"), weights)  # type: ignore[arg-type]


def test_mixture_inputs_refuse_bad_fields() -> None:
    a = PlanInputs(np.ones(3, np.int64), np.array([3]))
    with pytest.raises(MixtureError, match="distinct"):
        MixInputs((a, a), ("x", "x"))
    with pytest.raises(MixtureError, match="by="):
        MixInputs((a,), ("x",), by="bytes")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="max_repeats"):
        MixInputs((a,), ("x",), max_repeats=0)
    with pytest.raises(PlanError, match="epoch_size"):
        MixInputs((a,), ("x",), epoch_size=-1)
    assert not isinstance(MixtureError("x"), PlanMismatchError)


def test_fingerprint_covers_the_mixture() -> None:
    a = PlanInputs(np.arange(1, 40), np.array([20, 19]))
    b = PlanInputs(np.arange(1, 10), np.array([9]))
    spec, batching = EpochSpec(world_size=2), Batching(batch_size=4)
    prints = {
        EpochPlanner(MixInputs((a, b), ("a", "b"), weights), spec, batching).fingerprint
        for weights in ({"a": 1, "b": 1}, {"a": 1, "b": 2}, None)
    }
    prints.add(EpochPlanner(MixInputs((a, b), ("a", "c"), None), spec, batching).fingerprint)
    prints.add(EpochPlanner(MixInputs((b, a), ("a", "b"), None), spec, batching).fingerprint)
    prints.add(EpochPlanner(a, spec, batching).fingerprint)
    assert len(prints) == 6


def test_interleave_keeps_each_source_in_order_and_close_to_its_share() -> None:
    sizes = [np.full(70, 10), np.full(20, 10), np.full(10, 10)]
    order = interleave(sizes)
    source = np.repeat(np.arange(3), [70, 20, 10])[order]
    for k in range(3):  # each source's units keep their order
        assert (np.diff(order[source == k]) > 0).all()
    done = np.cumsum(np.eye(3)[source] * 10, axis=0)
    deviation = np.abs(done - np.outer(done.sum(axis=1), [0.7, 0.2, 0.1])).max()
    assert deviation <= 10


def test_summary_of_a_mixture_counts_every_sample() -> None:
    a = PlanInputs(long_tailed(500, 1), np.array([250, 250]))
    b = PlanInputs(long_tailed(120, 2), np.array([120]))
    mix = MixInputs((a, b), ("web", "code"), {"web": 0.5, "code": 0.5})
    summary = summarize_plan(mix, EpochSpec(world_size=3, stage="val"), Batching(max_tokens=4096))
    assert int(summary.samples.sum()) == 620
    assert summary.num_samples == 620
