"""Chunk windows: the training order that reads each stored chunk about once per epoch.

Every planner guarantee holds as with a full shuffle (the batcher still cuts
the batches); on top, each rank's order keeps every chunk's samples inside one
window of at most ``chunk_window`` chunks. Chunks are recomputed here sample by
sample, independently of :func:`shardload.plan.chunks.chunk_blocks`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from shardload.errors import PlanError
from shardload.plan import Batching, EpochPlanner, EpochSpec, PlanInputs
from shardload.plan.chunks import DEFAULT_CHUNK_WINDOW
from shardload.plan.resume import run_identity
from tests.plan.strategies import Case, cases, long_tailed, partition
from tests.plan.test_planner import check_invariants


def chunk_of_each(case: Case, rows: int) -> dict[int, tuple[int, int]]:
    """``sample id -> (shard, chunk)``: a shard's value rows laid end to end, cut every (evened-out) ``rows``."""
    out = {}
    start = 0
    for shard, size in enumerate(case.shard_sizes.tolist()):
        lens = case.lengths[start : start + size].tolist()
        total = sum(lens)
        grid = max(1, total) if total <= rows else math.ceil(total / math.ceil(total / rows))
        offset = 0
        for i, length in enumerate(lens):
            out[start + i] = (shard, offset // grid)
            offset += length
        start += size
    return out


def windows_of(order: NDArray[np.int64], chunk: dict[int, tuple[int, int]]) -> list[int]:
    """Chunks per window when ``order`` is cut wherever no chunk has samples on both sides (at least one)."""
    last = {chunk[i]: pos for pos, i in enumerate(order.tolist())}  # each chunk's last position
    sizes, seen, reach = [], set(), -1
    for pos, i in enumerate(order.tolist()):
        seen.add(chunk[i])
        reach = max(reach, last[chunk[i]])
        if reach == pos:  # every chunk begun so far ends here: a window closes
            sizes.append(len(seen))
            seen = set()
    return sizes


def windowed(case: Case, window: int, rows: int) -> Case:
    return dataclasses.replace(case, chunk_rows=rows, batching=dataclasses.replace(case.batching, chunk_window=window))


@st.composite
def windowed_cases(draw: st.DrawFn, **kwargs: object) -> Case:
    case = draw(cases(max_samples=1500, **kwargs))  # type: ignore[arg-type]
    return windowed(case, draw(st.integers(1, 6)), draw(st.sampled_from([1, 7, 300, 2000, 5000])))


@settings(max_examples=200, deadline=None)
@given(windowed_cases())
def test_every_planner_guarantee_holds_with_chunk_windows(case: Case) -> None:
    # Invariants of test_planner (equal counts, budgets, every sample once, locality), windows on
    plans = check_invariants(case)
    # Invariant: a pure function of the arguments
    again = [EpochPlanner(case.inputs(), case.spec(), case.batching).plan(p.rank) for p in plans]
    for a, b in zip(plans, again):
        assert np.array_equal(a.sample_ids, b.sample_ids) and np.array_equal(a.batch_offsets, b.batch_offsets)
        assert a.fingerprint == b.fingerprint


@settings(max_examples=200, deadline=None)
@given(windowed_cases(stages=("train",)))
def test_each_chunk_lies_in_one_window_of_at_most_k_chunks(case: Case) -> None:
    planner = EpochPlanner(case.inputs(), case.spec(), case.batching)
    assert case.batching.chunk_window is not None and case.chunk_rows is not None
    chunk = chunk_of_each(case, case.chunk_rows)
    for rank in range(case.world_size):
        order, _, _ = planner.batcher.rank_order(rank)
        # Invariant: the order is the rank's samples, each once
        assert np.array_equal(np.sort(order), np.sort(planner.layout.rank_sample_ids(rank)))
        # Invariant: cut into windows that hold whole chunks, at most chunk_window of them each
        assert max(windows_of(order, chunk), default=0) <= case.batching.chunk_window
        if case.batching.batch_size is not None and not case.batching.bucketing:
            # Invariant: fixed batches are cut from that order as it is
            real = planner.plan(rank)
            assert np.array_equal(real.sample_ids[real.weights > 0], order[: real.num_real])


def test_a_full_shuffle_breaks_the_window_property_that_windows_keep() -> None:
    lengths = long_tailed(3000, 1)
    case = Case(lengths, partition(3000, 4, 1, allow_empty=False), 1, Batching(batch_size=8), "train", 5, 0, "rotate")
    rows = 2000
    full = EpochPlanner(PlanInputs(lengths, case.shard_sizes), case.spec(), case.batching).batcher.rank_order(0)[0]
    win = windowed(case, 4, rows)
    kept = EpochPlanner(win.inputs(), win.spec(), win.batching).batcher.rank_order(0)[0]
    chunk = chunk_of_each(case, rows)
    assert max(windows_of(full, chunk)) > 100  # samples of every chunk all over the epoch
    sizes = windows_of(kept, chunk)
    assert max(sizes) <= 4 and len(sizes) >= len(set(chunk.values())) // 4


def test_bucketed_batches_follow_the_windows_they_complete_in() -> None:
    lengths = long_tailed(4000, 2)
    inputs = PlanInputs(lengths, np.array([1000, 1000, 2000]), chunk_rows=4000)
    spec = EpochSpec(world_size=1, seed=3)
    planner = EpochPlanner(inputs, spec, Batching(max_tokens=4096, chunk_window=2))
    order, _, _ = planner.batcher.rank_order(0)
    case = Case(lengths, inputs.shard_sizes, 1, Batching(batch_size=1), "train", 3, 0, "rotate")
    chunk = chunk_of_each(case, 4000)
    # the window of each sample: cut the order as windows_of does
    window, current, reach, last = {}, 0, -1, {chunk[i]: p for p, i in enumerate(order.tolist())}
    for pos, i in enumerate(order.tolist()):
        window[i] = current
        reach = max(reach, last[chunk[i]])
        current += reach == pos
    plan = planner.plan(0)
    completes = [max(window[i] for i in ids.tolist()) for ids, _ in plan]
    # Invariant: whole batches in the order of the window they complete in (shuffled within it)
    assert completes == sorted(completes) and len(set(completes)) > 10


def test_default_windows_for_a_set_with_chunks_and_none_without() -> None:
    lengths = long_tailed(500, 3)
    spec, batching = EpochSpec(world_size=2, seed=1), Batching(batch_size=16)
    arrow, zarr = PlanInputs(lengths, np.array([500])), PlanInputs(lengths, np.array([500]), chunk_rows=900)

    def fingerprint(inputs: PlanInputs, b: Batching, s: EpochSpec = spec) -> str:
        return EpochPlanner(inputs, s, b).fingerprint

    explicit = Batching(batch_size=16, chunk_window=DEFAULT_CHUNK_WINDOW, chunk_rows=900)
    # Invariant: a set with chunks gets windows of DEFAULT_CHUNK_WINDOW chunks unless told otherwise ...
    assert EpochPlanner(zarr, spec, batching).chunks[0] is not None
    assert np.array_equal(
        EpochPlanner(zarr, spec, batching).plan(0).sample_ids, EpochPlanner(arrow, spec, explicit).plan(0).sample_ids
    )
    # ... which the fingerprint and a loader state's identity name, while chunk_window=0 keeps the old ones
    off = Batching(batch_size=16, chunk_window=0)
    assert fingerprint(zarr, batching) != fingerprint(zarr, off) == fingerprint(arrow, batching)
    assert "chunk windows" in run_identity(zarr, spec, batching)
    assert run_identity(zarr, spec, off) == run_identity(arrow, spec, batching)
    # Invariant: evaluation never uses windows (its order is the set's own)
    val = EpochSpec(world_size=2, stage="val")
    assert fingerprint(zarr, batching, val) == fingerprint(arrow, batching, val)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 8, "chunk_window": -1}, r"Batching\(chunk_window=-1\): must be >= 1"),
        ({"batch_size": 8, "chunk_window": 2.5}, r"chunk_window=2.5.*integer"),
        ({"batch_size": 8, "chunk_window": True}, r"chunk_window=True"),
        ({"batch_size": 8, "chunk_rows": 0}, r"Batching\(chunk_rows=0\)"),
        ({"packing": True, "pack_length": 64, "rows_per_batch": 2, "chunk_window": 4}, r"chunk_window=4.*packed"),
    ],
)
def test_bad_chunk_options_are_plan_errors_naming_them(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        Batching(**kwargs)  # type: ignore[arg-type]


def test_windows_on_a_set_without_chunks_need_chunk_rows() -> None:
    inputs = PlanInputs(np.arange(1, 20), np.array([19]))
    with pytest.raises(PlanError, match=r"chunk_window=4.*chunk_rows"):
        EpochPlanner(inputs, EpochSpec(world_size=1), Batching(batch_size=4, chunk_window=4))
    # Invariant: a packed plan of a set with chunks keeps its own order (no windows by default)
    packed = Batching(packing=True, pack_length=64, rows_per_batch=2)
    zarr = PlanInputs(np.arange(1, 20), np.array([19]), chunk_rows=10)
    assert EpochPlanner(zarr, EpochSpec(world_size=1), packed).chunks == [None]
