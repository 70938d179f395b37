"""Packed plans: equal steps, every sample (or piece) once, no row over capacity, fixed shapes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.errors import PlanError
from shardload.plan import Batching, EpochSpec, PlanInputs, RankPlan
from shardload.plan.length import PROBE_EPOCHS
from shardload.plan.options import EVAL_STAGES
from shardload.plan.packing.rows import SizeRuns, count_rows
from shardload.plan.packing.track import pack_rows, pack_segments
from shardload.plan.planner import EpochPlanner

from .strategies import STAGES, long_tailed, partition


@st.composite
def packed_cases(draw: st.DrawFn) -> tuple[PlanInputs, EpochSpec, Batching]:
    num = draw(st.one_of(st.integers(0, 40), st.integers(0, 3000)))
    kind = draw(st.sampled_from(["lognormal", "lognormal", "zeros", "constant", "giant"]))
    data_seed = draw(st.integers(0, 2**32 - 1))
    lengths = long_tailed(num, data_seed, kind)
    split = draw(st.booleans())
    pack_length = draw(st.sampled_from([1, 7, 64, 512, 4096]))
    if not split:
        lengths = np.minimum(lengths, pack_length)
    if kind == "giant" and split:
        lengths = np.minimum(lengths, 3000)  # pieces of the 100k-token giants would be many thousands
    stage = draw(st.sampled_from(STAGES))
    uneven = draw(st.sampled_from(["split", "pad"] + (["drop"] if stage == "train" else [])))
    batching = Batching(
        packing=True,
        pack_length=pack_length,
        rows_per_batch=draw(st.integers(1, 8)),
        pack_split=split,
        uneven=uneven,
    )
    spec = EpochSpec(
        world_size=draw(st.one_of(st.integers(1, 8), st.integers(1, 64))),
        stage=stage,
        seed=draw(st.integers(0, 2**32 - 1)),
        epoch=draw(st.integers(0, 5)),
        shard_assignment=draw(st.sampled_from(["rotate", "fixed"])),
    )
    sizes = partition(num, draw(st.integers(1, 30)), data_seed, allow_empty=draw(st.booleans()))
    return PlanInputs(lengths, sizes), spec, batching


def _check(inputs: PlanInputs, spec: EpochSpec, batching: Batching) -> list[RankPlan]:
    planner = EpochPlanner(inputs, spec, batching)
    plans = [planner.plan(rank) for rank in range(spec.world_size)]
    # Invariant: every rank planned at once (summaries) is each rank planned alone
    for alone, together in zip(plans, planner.plans(), strict=True):
        for name in ("sample_ids", "weights", "batch_offsets", "rows", "starts"):
            assert np.array_equal(getattr(alone, name), getattr(together, name)), name
    cap, per = batching.pack_length, batching.rows_per_batch
    assert cap is not None and per is not None
    # Invariant: every rank has the same number of batches
    assert len({len(p) for p in plans}) == 1
    pieces: list[tuple[int, int]] = []
    for plan in plans:
        assert plan.rows is not None and plan.starts is not None
        assert (np.diff(plan.batch_offsets) >= 1).all()  # no empty batch
        for i in range(len(plan)):
            ids, weights, rows, starts = plan.packed_batch(i)
            # Invariant: rows in order, fewer than rows_per_batch; no row over pack_length tokens
            assert (np.diff(rows) >= 0).all() and rows.min() == 0 and rows.max() < per
            tokens = np.minimum(inputs.lengths[ids] - starts, cap)
            assert (tokens >= 0).all()
            assert np.bincount(rows, weights=tokens).max(initial=0) <= cap
            assert np.unique(rows).tolist() == list(range(rows.max() + 1))  # no empty row between rows
            pieces += [(int(a), int(b)) for a, b, w in zip(ids, starts, weights) if w > 0]
        if spec.stage == "train":
            # Invariant: training batch positions are shared by every rank (the heaviest-first order, permuted alike)
            assert len(plan) == len(plans[0])
    if batching.uneven != "drop":
        expected = []
        for sample, length in enumerate(inputs.lengths.tolist()):
            count = max(1, -(-length // cap)) if batching.pack_split else 1
            expected += [(sample, k * cap) for k in range(count)]
        # Invariant: every sample (every piece of a cut one) is planned exactly once over all ranks
        assert sorted(pieces) == expected
    else:
        assert len(pieces) == len(set(pieces))
    return plans


@settings(max_examples=200, deadline=None)
@given(packed_cases())
def test_packed_plans_keep_every_guarantee(case: tuple[PlanInputs, EpochSpec, Batching]) -> None:
    inputs, spec, batching = case
    if spec.stage in EVAL_STAGES and batching.uneven == "drop":
        return
    _check(inputs, spec, batching)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=400), st.integers(1, 300), st.randoms(use_true_random=False))
def test_pack_rows_fits_every_item_once_and_depends_only_on_sizes(sizes: list[int], capacity: int, rnd) -> None:
    items = np.minimum(np.array(sizes, dtype=np.int64), capacity)
    row_of, used = pack_rows(items, capacity)
    # Invariant: every item in one row, no row over capacity, no empty row, used = the sum of its items
    assert len(row_of) == len(items) and (row_of >= 0).all()
    assert (used <= capacity).all()
    assert np.array_equal(np.bincount(row_of, weights=items, minlength=len(used)).astype(np.int64), used)
    if len(items):
        assert set(row_of.tolist()) == set(range(len(used)))
    shuffled = items.copy()
    rnd.shuffle(shuffled)
    # Invariant: the row count depends on the sizes only, not their order (counting and building agree)
    assert len(pack_rows(shuffled, capacity)[1]) == len(used)


def test_long_tailed_rows_are_filled_to_99_percent() -> None:
    lengths = long_tailed(50_000, seed=0)  # lognormal, median 256, clipped [8, 4096]
    _, used = pack_rows(lengths, 4096)
    # Invariant: the packing leaves under 1% of a row empty on long-tailed lengths
    assert lengths.sum() / (len(used) * 4096) >= 0.99


def test_a_sample_longer_than_a_row_is_refused_by_default() -> None:
    inputs = PlanInputs(np.array([3, 9, 2]), np.array([3]))
    with pytest.raises(PlanError, match=r"sample 1 has 9 tokens, more than pack_length=8.*pack_split=True"):
        EpochPlanner(inputs, EpochSpec(world_size=1), Batching(packing=True, pack_length=8, rows_per_batch=2))


def test_small_eval_sets_pack_on_many_ranks() -> None:
    inputs = PlanInputs(np.array([5, 1, 3]), np.array([3]))
    plans = _check(
        inputs, EpochSpec(world_size=8, stage="val"), Batching(packing=True, pack_length=8, rows_per_batch=4)
    )
    # Invariant: fewer documents than ranks still gives one batch everywhere, filler weighted 0
    assert {len(p) for p in plans} == {1}
    assert sum(p.num_real for p in plans) == 3


def test_per_step_work_is_balanced_across_ranks() -> None:
    from shardload.plan import summarize_plan

    lengths = long_tailed(40_000, seed=5)
    inputs = PlanInputs(lengths, np.full(40, 1000))
    batching = Batching(packing=True, pack_length=4096, rows_per_batch=4)
    summary = summarize_plan(inputs, EpochSpec(world_size=8, seed=1), batching, with_ids=True)
    assert summary.plans is not None
    real = np.stack(
        [
            np.add.reduceat(np.minimum(lengths[p.sample_ids] - p.starts, 4096) * p.weights, p.batch_offsets[:-1])
            for p in summary.plans
        ]
    )  # (W, T) real tokens of each rank's batch at each step
    # Invariant: heaviest-first batches at shared positions: ranks compute nearly the same real tokens per step
    assert real.mean(axis=0).sum() / real.max(axis=0).sum() >= 0.97
    # a packed batch is always rows_per_batch * pack_length tokens: nobody waits
    assert summary.step_efficiency == 1.0
    assert summary.padding_fraction < 0.05


@pytest.mark.parametrize("stage", ["train", "val"])
def test_packed_plans_are_deterministic(stage: str) -> None:
    lengths = long_tailed(3000, seed=2)
    inputs = PlanInputs(lengths, np.full(3, 1000))
    spec = EpochSpec(world_size=3, stage=stage, seed=4, epoch=1)
    batching = Batching(packing=True, pack_length=4096, rows_per_batch=2)
    a = EpochPlanner(inputs, spec, batching).plan(1)
    b = EpochPlanner(inputs, spec, batching).plan(1)
    assert a.fingerprint == b.fingerprint
    assert a.rows is not None and b.rows is not None
    assert np.array_equal(a.sample_ids, b.sample_ids) and np.array_equal(a.rows, b.rows)


def test_packing_fields_change_the_fingerprint_and_others_keep_theirs() -> None:
    inputs = PlanInputs(np.arange(1, 50), np.array([49]))
    spec = EpochSpec(world_size=2)
    fixed = EpochPlanner(inputs, spec, Batching(batch_size=4)).fingerprint
    packed = EpochPlanner(inputs, spec, Batching(packing=True, pack_length=64, rows_per_batch=2)).fingerprint
    longer = EpochPlanner(inputs, spec, Batching(packing=True, pack_length=128, rows_per_batch=2)).fingerprint
    assert len({fixed, packed, longer}) == 3
    # Invariant: a plan without packing keeps the fingerprint it had before packing existed (saved states resume)
    assert Batching(batch_size=4).identity() == (4, None, True, 1, "split", 1.05, None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 120), max_size=60), min_size=1, max_size=6), st.integers(1, 120), st.booleans())
def test_segments_pack_as_if_each_were_alone(groups: list[list[int]], capacity: int, cut: bool) -> None:
    lengths = np.array([x for g in groups for x in g], dtype=np.int64)
    if not cut:
        lengths = np.minimum(lengths, capacity)
    seg = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    rows = count_rows(SizeRuns.of_lengths(lengths, seg, len(groups), capacity), len(groups), capacity)
    pieces = [_pieces(lengths[seg == k], capacity) for k in range(len(groups))]
    row_of, used, row_seg = pack_segments(
        np.concatenate(pieces),
        np.repeat(seg_ids := np.arange(len(groups)), [len(p) for p in pieces]),
        len(groups),
        capacity,
    )
    lo = 0
    for k in seg_ids:
        alone_rows, alone_used = pack_rows(pieces[k], capacity)
        # Invariant: counting every rank together gives each the rows it gets when built alone
        assert rows[k] == len(alone_used)
        # Invariant: packing every rank together gives each exactly the rows and items it gets alone
        mine = row_seg == k
        assert np.array_equal(used[mine], alone_used)
        first = int(np.flatnonzero(mine)[0]) if mine.any() else 0
        assert np.array_equal(row_of[lo : lo + len(pieces[k])] - first, alone_rows)
        lo += len(pieces[k])


def _best_fit_decreasing(sizes: list[int], capacity: int) -> list[int]:
    """The textbook algorithm, one item at a time: each item into the fullest row it fits."""
    used: list[int] = []
    for size in sorted((x for x in sizes if x > 0), reverse=True):
        fits = [r for r, u in enumerate(used) if u + size <= capacity]
        if fits:
            best = max(fits, key=lambda r: used[r])
            used[best] += size
        else:
            used.append(size)
    return sorted(used) if used or not sizes else [0]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 200), max_size=80), min_size=1, max_size=5),
    st.integers(1, 200),
    st.sampled_from([1 << 24, 64, 1]),
    st.sampled_from([1 << 19, 2, 1]),
)
def test_rows_are_those_of_textbook_best_fit_decreasing(
    groups: list[list[int]], capacity: int, table: int, open_chunk: int
) -> None:
    import shardload.plan.packing.rows as packrows

    sizes = [[min(x, capacity) for x in g] for g in groups]
    seg = np.repeat(np.arange(len(sizes)), [len(g) for g in sizes])
    flat = np.array([x for g in sizes for x in g], dtype=np.int64)
    with pytest.MonkeyPatch.context() as patch:
        # small tables look sizes up by buckets and wake rows early: the rows must not change
        patch.setattr(packrows, "_DENSE_BINS", table)
        patch.setattr(packrows, "OPEN_CHUNK", open_chunk)  # step 0 in chunks: the same rows as in one go
        _, used, row_seg = pack_segments(flat, seg, len(sizes), capacity)
        rows = count_rows(SizeRuns.of(flat, seg, len(sizes), capacity), len(sizes), capacity)
    for k, group in enumerate(sizes):
        expected = _best_fit_decreasing(group, capacity) if group else []
        # Invariant: packing is best-fit decreasing exactly (the same rows as one item at a time)
        assert sorted(used[row_seg == k].tolist()) == expected
        assert rows[k] == len(expected)


def _pieces(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """The pieces ``pack_split`` cuts samples into: full rows and the rest, an empty sample one empty piece."""
    full = np.full(int((np.maximum(lengths - 1, 0) // capacity).sum()), capacity, dtype=np.int64)
    return np.concatenate([full, lengths - np.maximum(lengths - 1, 0) // capacity * capacity])


def test_evaluation_counts_are_packed_once_per_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardload.plan.packing import pack
    from shardload.plan.packing.pack import PackBatcher

    calls: list[int] = []  # epochs whose sizes are counted (in one histogram each, at 4 ranks)
    runs: list[int] = []  # best-fit runs that count them
    real_sizes, real_count = PackBatcher._histogram, pack.count_rows

    def sizes(self: PackBatcher, hist: np.ndarray) -> None:
        calls.append(1)
        real_sizes(self, hist)

    def count(runs_: SizeRuns, segments: int, capacity: int) -> np.ndarray:
        runs.append(1)
        return real_count(runs_, segments, capacity)

    monkeypatch.setattr(PackBatcher, "_histogram", sizes)
    monkeypatch.setattr(pack, "count_rows", count)
    inputs = PlanInputs(long_tailed(5000, seed=3), np.full(5, 1000))
    batching = Batching(packing=True, pack_length=4096, rows_per_batch=2)
    first = EpochPlanner(inputs, EpochSpec(world_size=4, stage="val", epoch=0), batching)
    again = EpochPlanner(inputs, EpochSpec(world_size=4, stage="val", epoch=7), batching)
    # Invariant: an evaluation layout is the same every epoch: its counts are packed once, and are the same
    assert len(calls) == len(runs) == 1 and np.array_equal(first.rank_batch_counts, again.rank_batch_counts)
    EpochPlanner(inputs, EpochSpec(world_size=4, stage="train", epoch=1), batching)
    # training layouts are counted afresh: the run's probe epochs (epoch 1 is one of them), all in one best-fit run
    assert len(calls) == 1 + PROBE_EPOCHS and len(runs) == 2
    EpochPlanner(inputs, EpochSpec(world_size=4, stage="train", epoch=2), batching)
    assert len(calls) == 1 + PROBE_EPOCHS and len(runs) == 2  # a probe epoch's counts are kept: nothing counted
    EpochPlanner(inputs, EpochSpec(world_size=4, stage="train", epoch=9), batching)
    assert len(calls) == 2 + PROBE_EPOCHS and len(runs) == 3  # the run's steps are known: this epoch alone


@pytest.mark.parametrize(
    ("kind", "length", "split", "world"),
    [("lognormal", 4096, False, 5), ("lognormal", 1000, True, 3), ("zeros", 16, True, 7), ("constant", 7, False, 2)],
)
def test_epochs_counted_at_once_get_the_counts_of_each_counted_alone(
    kind: str, length: int, split: bool, world: int
) -> None:
    from shardload.plan.packing.pack import PackBatcher, count_at_once

    inputs = PlanInputs(long_tailed(3000, seed=5, kind=kind), partition(3000, 11, seed=2, allow_empty=True))
    batching = Batching(packing=True, pack_length=length, rows_per_batch=1, pack_split=split)
    batchers = []
    for epoch in range(4):
        planner = EpochPlanner(inputs, EpochSpec(world_size=world, epoch=epoch, seed=epoch), batching, steady=False)
        assert isinstance(planner.batcher, PackBatcher)
        batchers.append(planner.batcher)
    alone = [b.count_batches() for b in batchers]
    assert len({a.tobytes() for a in alone}) > 1 or kind == "constant"  # the epochs differ: a mix-up would show
    # Invariant: each rank of each epoch is packed as if alone, in one run over all of them
    assert [a.tolist() for a in count_at_once(batchers)] == [a.tolist() for a in alone]
    assert [a.tolist() for a in count_at_once(batchers[::-1])] == [a.tolist() for a in alone[::-1]]


def test_sizes_near_the_capacity_get_a_row_each() -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(3600, 4097, 20_000)  # all over half a row: no two share one
    _, used = pack_rows(sizes, 4096)
    # Invariant: one row per item, placed in one step (this took minutes when such items straddled new rows)
    assert len(used) == len(sizes) and np.array_equal(np.sort(used), np.sort(sizes))


@pytest.mark.parametrize(
    ("lengths", "sizes", "world", "expected"),
    [
        ([1, 1, 1, 1], [2, 2], 2, [0, 2, 4]),  # a cut exactly on a shard boundary ends there
        ([50_000] + [100] * 100, [101], 4, [0, 1, 2, 3, 101]),  # one long sample leaves no rank empty
        ([5, 0, 0, 0], [4], 3, [0, 1, 2, 4]),
        ([5, 1], [2], 3, [0, 1, 1, 2]),  # fewer samples than ranks: an empty rank is unavoidable
    ],
)
def test_ranks_cut_by_tokens(lengths: list[int], sizes: list[int], world: int, expected: list[int]) -> None:
    from shardload.plan.assign import assign_shards, balance_by_tokens

    lens = np.array(lengths)
    shards = np.array(sizes)
    tokens = np.add.reduceat(lens, np.r_[0, np.cumsum(shards)[:-1]])
    layout = balance_by_tokens(assign_shards(shards, world, order=np.arange(len(shards))), lens, tokens)
    # Invariant: contiguous ranges at the token quantiles, and no empty rank while N >= W
    assert layout.rank_starts.tolist() == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=12), st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_tokens_per_shard_are_summed_in_chunks_exactly(sizes: list[int], chunk: int, seed: int) -> None:
    import shardload.plan.request as request

    lengths = np.random.default_rng(seed).integers(0, 100, sum(sizes)).astype(np.int32)
    bounds = np.cumsum([0, *sizes])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(request, "_SUM_CHUNK", chunk)  # chunk edges inside, at and between shards
        tokens = PlanInputs(lengths, np.array(sizes)).shard_tokens
    # Invariant: the tokens of every shard (that cut the ranks of packed plans) are its lengths' sum
    assert tokens.tolist() == [int(lengths[a:b].sum()) for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("dtype", ["int8", "int16", "uint16", "uint32", "int32", "uint64"])
@pytest.mark.parametrize(("pack_length", "split"), [(50, True), (50, False), ((1 << 31) - 1, False)])
def test_lengths_of_any_integer_dtype_pack_as_int64(dtype: str, pack_length: int, split: bool) -> None:
    lengths = np.random.default_rng(2).integers(0, 120, 600)
    lengths[::7] = 0  # unsigned: `length - 1` must not wrap around to a huge count of pieces
    if not split:
        lengths = np.minimum(lengths, pack_length)
    typed = PlanInputs(lengths.astype(dtype), np.array([200, 0, 400]))
    rows = 1 if pack_length > 1 << 30 else 2
    batching = Batching(packing=True, pack_length=pack_length, rows_per_batch=rows, pack_split=split)
    for stage in ("train", "val"):
        spec = EpochSpec(world_size=3, stage=stage, seed=5)
        plans = _check(typed, spec, batching)
        wide = EpochPlanner(PlanInputs(lengths, np.array([200, 0, 400])), spec, batching)
        # Invariant: a lengths index (a memory map of any integer dtype) plans exactly as its int64 values do
        for rank, plan in enumerate(plans):
            assert np.array_equal(plan.sample_ids, wide.plan(rank).sample_ids)
            assert np.array_equal(plan.rows, wide.plan(rank).rows)


def test_rows_leave_the_run_once_no_size_of_their_segment_is_left() -> None:
    from shardload.plan.packing.rows import BestFit

    rng = np.random.default_rng(1)
    sizes = np.concatenate([[60, 60, 50, 45], rng.integers(1, 101, 500)])  # segment 0: 3 sizes; 1: ~100
    seg = np.repeat([0, 1], [4, 500])
    fit = BestFit(SizeRuns.of(sizes, seg, 2, 100), 2, 100)
    rows = fit.run()
    assert rows.tolist() == [len(_best_fit_decreasing(sizes[seg == k].tolist(), 100)) for k in (0, 1)]
    # Invariant: a segment's rows leave the run with its last size (else every later step of the other segments
    # pays for them), and rows that no size of their segment fits never wake
    assert len(fit.a_key) == 0 and not fit.waiting


def _best_fit_decreasing_rows(sizes: list[int], capacity: int) -> tuple[list[int], list[int]]:
    """Textbook best fit decreasing with row numbers: ``(row_of, used)``.

    Items largest first (equal sizes in input order), each into the row with
    the smallest gap that fits it (equal gaps: the row opened first), else a
    new row; rows numbered as opened; items of size 0 in row 0.
    """
    gaps: list[int] = []
    row_of = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        if sizes[i] == 0:
            continue
        fits = [r for r, gap in enumerate(gaps) if gap >= sizes[i]]
        if fits:
            row = min(fits, key=lambda r: (gaps[r], r))
        else:
            gaps.append(capacity)
            row = len(gaps) - 1
        gaps[row] -= sizes[i]
        row_of[i] = row
    if sizes and not gaps:
        gaps = [capacity]  # only empty items: one empty row
    return row_of, [capacity - gap for gap in gaps]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 60), max_size=80), min_size=1, max_size=5),
    st.integers(1, 60),
    st.sampled_from([1 << 24, 64, 1]),
    st.sampled_from([1 << 19, 2, 1]),
)
def test_each_item_goes_to_the_row_textbook_best_fit_gives_it(
    groups: list[list[int]], capacity: int, table: int, open_chunk: int
) -> None:
    import shardload.plan.packing.rows as packrows

    sizes = [[min(x, capacity) for x in g] for g in groups]
    flat = np.array([x for g in sizes for x in g], dtype=np.int64)
    shuffled = np.random.default_rng(len(flat)).permutation(len(flat))  # segments interleaved in the input
    seg = np.repeat(np.arange(len(sizes)), [len(g) for g in sizes])[shuffled]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(packrows, "_DENSE_BINS", table)  # small tables: runs found by a sort, sizes by buckets
        patch.setattr(packrows, "OPEN_CHUNK", open_chunk)  # step 0 in chunks: each item's row as in one go
        row_of, used, row_seg = pack_segments(flat[shuffled], seg, len(sizes), capacity)
    for k in range(len(sizes)):
        expected_rows, expected_used = _best_fit_decreasing_rows(flat[shuffled][seg == k].tolist(), capacity)
        first = int(np.searchsorted(row_seg, k))
        # Invariant: every item is in the row, and every row in the place, that one item at a time gives
        assert (row_of[seg == k] - first).tolist() == expected_rows
        assert used[row_seg == k].tolist() == expected_used


@settings(max_examples=150, deadline=None)
@given(packed_cases(), st.floats(0, 1))
def test_consumed_entries_are_the_plans_cut_after_k_batches(
    case: tuple[PlanInputs, EpochSpec, Batching], fraction: float
) -> None:
    inputs, spec, batching = case
    planner = EpochPlanner(inputs, spec, batching)
    k = int(fraction * planner.num_batches)
    for plan, (ids, starts) in zip(planner.plans(), planner.consumed(k), strict=True):
        end = int(plan.batch_offsets[k])
        real = plan.weights[:end] > 0
        assert plan.starts is not None and starts is not None
        expected = sorted(zip(plan.sample_ids[:end][real].tolist(), plan.starts[:end][real].tolist()))
        # Invariant: the consumed entries of a rank (found without sorting its plan) are its plan's first k
        # batches' real entries, whatever the policy (rows cut, padded, dropped)
        assert sorted(zip(ids.tolist(), starts.tolist())) == expected


@pytest.mark.parametrize("seed", range(6))
def test_one_tracked_run_of_all_ranks_gives_each_rank_its_own_rows_and_histogram(seed: int) -> None:
    """Every rank's rows from one tracked run of all ranks (``track_all``, ``rows_of``) are those of packing it
    alone, and the one-histogram size runs are the ones gathered a group of ranks at a time."""
    import shardload.plan.packing.pack as pack

    rng = np.random.default_rng(seed)
    cap = int(rng.choice([5, 64, 300]))
    n, world = int(rng.integers(0, 3000)), int(rng.integers(1, 12))
    lengths = rng.integers(0, 3 * cap, n).astype(np.int32)
    cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(1, 30))))
    shards = np.diff(np.concatenate([[0], cuts, [n]])).astype(np.int64)
    batching = Batching(packing=True, pack_length=cap, rows_per_batch=3, pack_split=True)
    planner = EpochPlanner(PlanInputs(lengths, shards), EpochSpec(world_size=world, seed=seed), batching, steady=False)
    batcher = planner.batcher
    assert isinstance(batcher, pack.PackBatcher)
    tracked = batcher.track_all()
    assert tracked is not None
    for rank in range(world):
        alone, shared = batcher.pack_ranks(range(rank, rank + 1))[0], batcher.rows_of(rank, tracked)
        for field in ("ids", "starts", "row_of", "used"):
            assert np.array_equal(getattr(alone, field), getattr(shared, field)), (rank, field)
    by_id = batcher._size_runs_by_id(chunk=int(rng.integers(1, 500)))
    grouped = batcher.size_runs.__func__  # the grouped path: every rank's histogram alone
    saved, pack.COUNT_BINS = pack.COUNT_BINS, 0
    try:
        runs = grouped(batcher)
    finally:
        pack.COUNT_BINS = saved
    for a, b in zip((by_id.seg, by_id.size, by_id.count), (runs.seg, runs.size, runs.count)):
        assert np.array_equal(a, b)
