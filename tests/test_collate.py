"""The collate's two padding strategies, the shared batch buffer of workers, and what a kept tensor holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import shardload
import shardload.load.dataset
from shardload.formats import Columns
from shardload.load.collate import Layout, PadSpec, collate_batch, group_by_shard
from shardload.load.dataset import BatchArena, ShardBatchDataset
from shardload.load.loader import make_loader
from shardload.load.options import LoaderOptions
from shardload.plan import Batching, EpochSpec, PlanInputs, padded_length, plan_rank
from shardload.schema.fields import Field, Schema
from shardload.sets.index import ShardIndex

# Sample i has i % 7 == 6 long (40 rows), the others short (1-3 rows): batches of short ids plus
# one long id are mostly padding (the whole array is filled first); batches of long ids are not.
LONG = 40


def _samples(n: int = 42) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    out = []
    for i in range(n):
        rows = LONG if i % 7 == 6 else 1 + i % 3
        out.append(
            {
                "tokens": rng.integers(1, 1000, size=rows, dtype=np.int32),
                "features": rng.standard_normal((rows, 3), dtype=np.float32),
                "label": np.asarray(i, dtype=np.int64),
            }
        )
    return out


@pytest.fixture(scope="module")
def collate_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, np.ndarray]]]:
    samples = _samples()
    path = tmp_path_factory.mktemp("collate") / "set"
    shardload.write(samples, path, num_shards=3, shuffle=False)  # ids 0-13, 14-27, 28-41 per shard
    return path, samples


def _reference(samples: list[dict[str, np.ndarray]], ids: list[int], pad: dict[str, float]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name in ("tokens", "features"):
        rows = [samples[i][name] for i in ids]
        l_pad = max(len(r) for r in rows)
        arr = np.full((len(ids), l_pad, *rows[0].shape[1:]), pad.get(name, 0), dtype=rows[0].dtype)
        for j, r in enumerate(rows):
            arr[j, : len(r)] = r
        out[name] = arr
        out[f"{name}_lengths"] = np.array([len(r) for r in rows], dtype=np.int64)
    out["label"] = np.array([samples[i]["label"] for i in ids], dtype=np.int64)
    return out


@pytest.mark.parametrize(
    "ids",
    [
        [0, 1, 2, 6],  # one shard, mostly padding: filled first
        [6, 13, 6, 13],  # one shard, no padding at all
        [6, 13, 20, 1],  # two shards, little padding: tails filled per row
        [0, 15, 29, 34, 6],  # three shards, mostly padding
        [],  # an empty batch
    ],
)
@pytest.mark.parametrize("pad", [{"tokens": -7, "features": 2.5}, {}], ids=["pad-values", "zeros"])
@pytest.mark.parametrize("alloc", ["poisoned", "separate", "shared"])
def test_padding_strategies_match_a_reference(
    collate_set: tuple[Path, list[dict[str, np.ndarray]]], ids: list[int], pad: dict[str, float], alloc: str
) -> None:
    path, samples = collate_set
    ds = ShardBatchDataset(path, PadSpec(pad_values=pad))
    sample_ids = np.array(ids, dtype=np.int64)
    weights = np.ones(len(ids), dtype=np.float32)
    if alloc == "shared":
        arena = BatchArena(shared_from=0)
        got = ds.fetch(sample_ids, weights, arena)
        assert arena.tensors is not None and set(arena.tensors) == set(got)
        for name, arr in got.items():  # each torch view shows the same bytes as the numpy array
            np.testing.assert_array_equal(arena.tensors[name].numpy(), arr)
    elif alloc == "poisoned":  # memory not asked to be zeroed holds junk: every element must be written

        def poisoned(layout: Layout) -> dict[str, np.ndarray]:
            return {n: np.zeros(s, d) if z else np.full(s, 99, d) for n, s, d, z in layout}

        got = ds.fetch(sample_ids, weights, poisoned)
    else:
        got = ds.fetch(sample_ids, weights)
    assert list(got) == ["tokens", "tokens_lengths", "features", "features_lengths", "label", "sample_id", "weight"]
    if not ids:
        assert got["tokens"].shape == (0, 0) and got["features"].shape == (0, 0, 3)
        return
    want = _reference(samples, ids, pad)
    for name, arr in want.items():
        np.testing.assert_array_equal(got[name], arr, err_msg=name)
        assert got[name].dtype == arr.dtype
    np.testing.assert_array_equal(got["sample_id"], sample_ids)
    np.testing.assert_array_equal(got["weight"], weights)


def test_arena_is_one_shared_buffer(collate_set: tuple[Path, list[dict[str, np.ndarray]]]) -> None:
    path, _ = collate_set
    arena = BatchArena(shared_from=0)
    ShardBatchDataset(path).fetch(np.array([1, 6, 20]), np.ones(3, dtype=np.float32), arena)
    assert arena.tensors is not None and arena.batch().shared
    storages = {t.untyped_storage().data_ptr() for t in arena.tensors.values()}
    assert len(storages) == 1, "a worker's batch must travel as one storage"
    assert all(t.is_shared() for t in arena.tensors.values())
    for t in arena.tensors.values():  # every view is aligned for its dtype
        assert t.data_ptr() % 64 == 0


def test_small_batches_go_by_value(collate_set: tuple[Path, list[dict[str, np.ndarray]]]) -> None:
    path, _ = collate_set
    arena = BatchArena(shared_from=1 << 20)
    ShardBatchDataset(path).fetch(np.array([1, 6, 20]), np.ones(3, dtype=np.float32), arena)
    batch = arena.batch()
    assert arena.tensors is None and not batch.shared
    assert all(isinstance(a, np.ndarray) for a in batch.arrays.values())


@pytest.mark.parametrize("pin", [False, True])
@pytest.mark.parametrize("shared_from", [0, 1 << 30])  # every batch shared / every batch by value
def test_worker_batches_equal_main_process_batches(
    collate_set: tuple[Path, list[dict[str, np.ndarray]]], pin: bool, shared_from: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = collate_set
    monkeypatch.setattr(shardload.load.dataset, "SHARED_FROM_BYTES", shared_from)  # workers are forked: they see it

    def epoch(workers: int) -> list[dict[str, torch.Tensor]]:
        loader = make_loader(
            path,
            rank=0,
            world_size=1,
            batching=Batching(batch_size=5, bucketing=False),
            loader_options=LoaderOptions(num_workers=workers, pin_memory=pin),
        )
        return list(loader)

    main, workers = epoch(0), epoch(2)
    assert len(main) == len(workers) > 0
    for a, b in zip(main, workers):
        assert list(a) == list(b)
        for name in a:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
        # Small tensors never share a buffer with the padded arrays: keeping one keeps a few bytes, not the batch.
        for name in ("sample_id", "weight", "tokens_lengths", "label"):
            assert b[name].untyped_storage().nbytes() == b[name].nbytes, name


@pytest.mark.parametrize("bucketing", [True, False], ids=["buckets", "greedy"])
@pytest.mark.parametrize(("max_tokens", "multiple"), [(64, 1), (100, 8), (256, 3), (40, 64)])
def test_the_collate_pads_a_planned_batch_to_the_planners_padded_length(
    bucketing: bool, max_tokens: int, multiple: int
) -> None:
    # One rule, padded_length: the planner counts rows * padded_length(longest) against max_tokens, and the
    # collate pads every row to that same width, so the budget holds for the arrays the model gets.
    rng = np.random.default_rng(max_tokens + multiple)
    lengths = np.minimum(rng.lognormal(2.5, 1.0, 300).astype(np.int64), 90)  # zeros and samples over budget
    schema = Schema(fields=(Field("tokens", "int32", (None,)),))
    cols = Columns.from_samples(schema, [{"tokens": np.ones(n, np.int32)} for n in lengths])
    batching = Batching(max_tokens=max_tokens, pad_to_multiple_of=multiple, bucketing=bucketing)
    plan = plan_rank(PlanInputs(lengths, np.array([len(lengths)])), EpochSpec(world_size=1, seed=1), batching, rank=0)
    pad = PadSpec(pad_to_multiple_of=multiple)
    for ids, weights in plan:
        batch = collate_batch(schema, lambda s: cols, np.zeros(len(ids), np.int64), ids, ids, weights, pad)
        rows, width = batch["tokens"].shape
        assert width == padded_length(int(lengths[ids].max()), multiple)
        assert rows * max(width, 1) <= max_tokens or rows == 1


@pytest.mark.parametrize("num_shards", [1, 2, 3, 40])
def test_grouping_by_shard_matches_a_reference(num_shards: int) -> None:
    """Each shard of a batch once, ascending, with its positions in batch order; None for a batch of one shard."""
    rng = np.random.default_rng(num_shards)
    for b in (1, 2, 64, 300):
        shards = rng.integers(0, num_shards, b).astype(np.int64) + 5
        expected = [(int(s), np.flatnonzero(shards == s)) for s in np.unique(shards)]
        got = group_by_shard(shards)
        assert [s for s, _ in got] == [s for s, _ in expected]
        if len(expected) == 1:
            assert got[0][1] is None
        else:
            assert all(pos is not None and np.array_equal(pos, want) for (_, pos), (_, want) in zip(got, expected))
    assert group_by_shard(np.zeros(0, np.int64)) == []


@pytest.mark.parametrize("sizes", [[7], [3, 4, 0, 5]])
def test_locate_maps_ids_to_shard_and_row_and_refuses_ids_out_of_range(sizes: list[int]) -> None:
    index = ShardIndex(sizes)
    where = [(s, r) for s, n in enumerate(sizes) for r in range(n)]
    ids = np.array([11, 0, 3, 6, 6, 2] if len(sizes) > 1 else [6, 0, 3], np.int64)
    shard, row = index.locate(ids)
    assert list(zip(shard.tolist(), row.tolist())) == [where[i] for i in ids]
    for bad in (-1, sum(sizes), -(2**63)):
        with pytest.raises(IndexError, match=f"sample id {bad} out of range"):
            index.locate(np.array([0, bad, 1], np.int64))
