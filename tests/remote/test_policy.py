"""The plan-driven cache policy: next uses, victims, and its replay against LRU and the optimum."""

from __future__ import annotations

import functools
import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.errors import PlanError
from shardload.plan.reads import read_sequence
from shardload.remote.policy import NEVER, NextUseTable, choose_victims, next_uses, node_next_uses, node_sequence


@functools.cache
def sim_cache() -> ModuleType:
    """``tools/sim_cache.py``, imported by path (tools/ is not a package)."""
    path = Path(__file__).resolve().parents[2] / "tools" / "sim_cache.py"
    spec = importlib.util.spec_from_file_location("sim_cache", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sim_cache"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def brute_next_uses(seq: list[int], position: int, num_shards: int) -> list[int]:
    return [next((i for i in range(position, len(seq)) if seq[i] == s), NEVER) for s in range(num_shards)]


sequences = st.integers(1, 6).flatmap(
    lambda s: st.tuples(st.just(s), st.lists(st.integers(0, s - 1), max_size=30))
)  # (num_shards, sequence)


@given(sequences, st.data())
def test_next_uses_is_the_first_index_at_or_after_the_position(case, data) -> None:
    num_shards, seq = case
    position = data.draw(st.integers(0, len(seq)))
    got = next_uses(np.array(seq, dtype=np.int64), position, num_shards)
    assert got.dtype == np.int64 and got.tolist() == brute_next_uses(seq, position, num_shards)


@given(sequences, st.lists(st.integers(0, 30), max_size=8))
def test_next_use_table_follows_any_positions(case, positions) -> None:
    num_shards, seq = case
    table = NextUseTable(np.array(seq, dtype=np.int64), num_shards)
    for position in [min(p, len(seq)) for p in positions]:  # forwards (incremental) and backwards (rebuilt)
        got = table.at(position)
        assert got.tolist() == brute_next_uses(seq, position, num_shards)
        assert not got.flags.writeable  # the table itself: a caller cannot corrupt it


def test_next_use_table_walks_a_long_sequence_in_linear_time() -> None:
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 1000, 200_000)
    table = NextUseTable(seq, 1000)
    for position in range(0, len(seq) + 1, 9_999):
        assert np.array_equal(table.at(position), next_uses(seq, position, 1000))


@given(st.integers(1, 4), st.integers(1, 5), st.data())
def test_node_next_uses_is_the_nearest_step_over_ranks(ranks, num_shards, data) -> None:
    steps = data.draw(st.integers(0, 4))
    per_rank = [
        [data.draw(st.lists(st.integers(0, num_shards - 1), max_size=3, unique=True)) for _ in range(steps)]
        for _ in range(ranks)
    ]  # per rank, per step: the shards it reads
    seqs = [np.array([s for batch in r for s in batch], dtype=np.int64) for r in per_rank]
    offs = [np.cumsum([0] + [len(b) for b in r]) for r in per_rank]
    positions = [data.draw(st.integers(0, len(s))) for s in seqs]
    tables = [NextUseTable(s, num_shards, o) for s, o in zip(seqs, offs)]
    got = node_next_uses(tables, positions)
    for shard in range(num_shards):
        uses = [
            int(np.searchsorted(o, i, side="right")) - 1
            for s, o, p in zip(seqs, offs, positions)
            for i in range(p, len(s))
            if s[i] == shard
        ]
        assert got[shard] == min(uses, default=NEVER)
    merged, merged_offs = node_sequence(seqs, offs)
    expected = [s for t in range(steps) for r in per_rank for s in r[t]]  # step by step, rank by rank
    assert merged.tolist() == expected
    assert merged_offs.tolist() == np.cumsum([0] + [sum(len(r[t]) for r in per_rank) for t in range(steps)]).tolist()


@st.composite
def victim_cases(draw):
    num_shards = draw(st.integers(1, 12))
    sizes = np.array(draw(st.lists(st.integers(0, 50), min_size=num_shards, max_size=num_shards)))
    next_use = np.array(draw(st.lists(st.sampled_from([0, 1, 2, 5, NEVER]), min_size=num_shards, max_size=num_shards)))
    cached = np.array(draw(st.lists(st.integers(0, num_shards - 1), unique=True)), dtype=np.int64)
    pinned = draw(st.none() | st.lists(st.booleans(), min_size=num_shards, max_size=num_shards).map(np.array))
    need = draw(st.integers(-5, 200))
    return cached, sizes, next_use, need, pinned


@given(victim_cases(), st.randoms())
def test_choose_victims_frees_enough_farthest_first_never_a_pinned_one(case, random) -> None:
    cached, sizes, next_use, need, pinned = case
    victims = choose_victims(cached, sizes, next_use, need, pinned)
    chosen = victims.tolist()
    assert len(set(chosen)) == len(chosen) and set(chosen) <= set(cached.tolist())
    if pinned is not None:
        assert not pinned[victims].any()
    free = [s for s in cached.tolist() if pinned is None or not pinned[s]]
    if need <= 0:
        assert chosen == []
    elif sum(sizes[free]) >= need:
        assert sizes[victims].sum() >= need  # enough ...
        assert sizes[victims[:-1]].sum() < need  # ... and not one more than needed
    else:
        assert sorted(chosen) == sorted(free)  # what it could: every unpinned shard
    keys = [(int(next_use[s]), int(sizes[s]), s) for s in chosen]
    assert keys == sorted(keys, reverse=True)  # farthest, then largest, then highest id
    if chosen:  # no unchosen free shard ranks before the last chosen one
        last = keys[-1]
        assert all((int(next_use[s]), int(sizes[s]), s) < last for s in free if s not in chosen)
    shuffled = cached.copy()
    random.shuffle(shuffled)
    assert choose_victims(shuffled, sizes, next_use, need, pinned).tolist() == chosen  # deterministic


def test_bad_arguments_are_plan_errors_naming_what_to_fix() -> None:
    with pytest.raises(PlanError, match="outside 0..2"):
        next_uses(np.array([0, 3]), 0, 3)
    with pytest.raises(PlanError, match="position=5"):
        next_uses(np.array([0, 1]), 5, 3)
    with pytest.raises(PlanError, match="one entry per shard"):
        choose_victims(np.array([0]), np.ones(3, np.int64), np.zeros(2, np.int64), 1)
    with pytest.raises(PlanError, match="outside 0..2"):
        choose_victims(np.array([4]), np.ones(3, np.int64), np.zeros(3, np.int64), 1)
    with pytest.raises(PlanError, match="step_offsets"):
        NextUseTable(np.array([0, 1]), 2).steps_at(0)
    with pytest.raises(PlanError, match="step_offsets"):
        NextUseTable(np.array([0, 1]), 2, np.array([0, 1]))  # does not end at the sequence's length
    with pytest.raises(PlanError, match="different numbers of steps"):
        node_sequence([np.array([0]), np.array([1])], [np.array([0, 1]), np.array([0, 0, 1])])


def brute_optimum(seq: tuple[int, ...], slots: int) -> int:
    """Fewest downloads of ``seq`` through a cache of ``slots`` equal shards: every eviction choice tried."""

    @functools.cache
    def best(position: int, cache: frozenset[int]) -> int:
        if position == len(seq):
            return 0
        shard = seq[position]
        if shard in cache:
            return best(position + 1, cache)
        if len(cache) < slots:
            return 1 + best(position + 1, cache | {shard})
        return 1 + min(best(position + 1, (cache - {out}) | {shard}) for out in cache)

    return best(0, frozenset())


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 5), st.integers(1, 3), st.integers(1, 1000), st.data())
def test_planned_replay_is_the_optimum_with_equal_sizes_and_never_worse_than_lru(shards, slots, size, data) -> None:
    seq = np.array(data.draw(st.lists(st.integers(0, shards - 1), max_size=14)), dtype=np.int64)
    sizes = np.full(shards, size, dtype=np.int64)
    sim = sim_cache()
    optimum = brute_optimum(tuple(seq.tolist()), slots)
    planned = sim.simulate_planned(seq, sizes, slots * size)
    assert (planned.fetches, planned.bytes) == (optimum, optimum * size)
    assert sim.simulate_belady(seq, sizes, slots * size).fetches == optimum  # the tool's textbook reference
    assert planned.fetches <= sim.simulate_lru(seq, sizes, slots * size).fetches


def test_planned_beats_lru_on_a_real_plan_and_equals_belady() -> None:
    sim = sim_cache()
    reads, tokens = sim.epoch_reads(64, 40, world_size=4, batch_size=8, seed=3)
    sizes = np.full(len(tokens), 1000, dtype=np.int64)
    rows = sim.compare(reads[:2], sizes, [0.25, 1.0])
    tight, whole = rows
    assert tight["planned"] == tight["belady"] and tight["planned"]["fetches"] < tight["lru"]["fetches"]
    # a cache of the whole working set fetches every shard once, whatever the policy
    assert whole["planned"]["fetches"] == whole["lru"]["fetches"] == whole["distinct_shards"]
    assert tight["planned-steps"]["fetches"] >= tight["planned"]["fetches"]  # coarser view, never better than optimum


def test_read_sequence_is_each_batch_distinct_shards_in_first_touch_order() -> None:
    rng = np.random.default_rng(1)
    shard_sizes = rng.integers(0, 6, 10)
    starts = np.concatenate([[0], np.cumsum(shard_sizes)])
    ids = rng.integers(0, int(starts[-1]), 60)
    offsets = np.array([0, 1, 13, 30, 31, 60])
    seq, steps = read_sequence(ids, offsets, starts)
    expected: list[int] = []
    expected_steps = [0]
    for lo, hi in itertools.pairwise(offsets.tolist()):
        for i in ids[lo:hi]:
            shard = next(k for k in range(10) if starts[k] <= i < starts[k + 1])
            if shard not in expected[expected_steps[-1] :]:
                expected.append(shard)
        expected_steps.append(len(expected))
    assert seq.tolist() == expected and steps.tolist() == expected_steps
