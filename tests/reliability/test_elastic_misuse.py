"""Elastic resume misused: edited states, and a resumed loader iterated again without set_epoch.

Each test is a way a careless or hostile user met a wrong answer or a
misleading error; tests/test_elastic.py covers the guarantees themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import shardload
from shardload import ShardDataModule, make_loader
from shardload.errors import PlanError, PlanMismatchError
from shardload.load.world import World
from shardload.testing import synthetic_samples

BATCH = 2


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("elastic_misuse") / "set"
    shardload.write(synthetic_samples(23, seed=4), out, num_shards=5, progress=False)
    return out


def real_ids(batch: dict[str, torch.Tensor]) -> list[int]:
    return [int(s) for s, w in zip(batch["sample_id"].tolist(), batch["weight"].tolist(), strict=True) if w > 0]


def state_after(data: Path, world: int, steps: int) -> dict[str, Any]:
    """Rank 0's state after ``steps`` batches of a ``world``-rank run (the same on every rank)."""
    loader = make_loader(data, rank=0, world_size=world, batch_size=BATCH)
    batches = iter(loader)
    for _ in range(steps):
        next(batches)
    return loader.state_dict()


@pytest.mark.parametrize("key", ["history", "identity"])
def test_a_version_2_state_without_history_or_identity_is_refused_naming_the_key(data: Path, key: str) -> None:
    state = state_after(data, 4, 1)
    resumed = make_loader(data, rank=0, world_size=2, batch_size=BATCH)
    resumed.load_state_dict(state)
    edited = {k: v for k, v in resumed.state_dict().items() if k != key}  # saved on 2 ranks after a 4 -> 2 resume
    for world in (2, 3):
        loader = make_loader(data, rank=0, world_size=world, batch_size=BATCH)
        with pytest.raises(PlanError, match=f"lacks \\['{key}'\\]") as caught:
            loader.load_state_dict(edited)
        assert not isinstance(caught.value, PlanMismatchError)  # nothing about the run changed: the state is broken


@pytest.mark.parametrize(
    "edit",
    [
        lambda identity: {**identity, 7: "x"},  # a key that is not a string
        lambda identity: {**identity, "seed": torch.arange(3)},  # a value no != can compare to an int
        lambda identity: {**identity, "batching": {**identity["batching"], 3: torch.arange(2)}},
    ],
)
def test_an_edited_identity_is_a_named_mismatch(data: Path, edit: Any) -> None:
    state = state_after(data, 2, 1)
    state["identity"] = edit(state["identity"])
    loader = make_loader(data, rank=0, world_size=2, batch_size=BATCH)
    with pytest.raises(PlanMismatchError, match="belongs to another run"):
        loader.load_state_dict(state)


def test_an_edited_history_is_not_blamed_on_changed_options(data: Path) -> None:
    state = state_after(data, 4, 1)
    resumed = make_loader(data, rank=0, world_size=2, batch_size=BATCH)
    resumed.load_state_dict(state)
    edited = resumed.state_dict() | {"history": [[3, 1]]}  # the run's options are the checkpoint's
    loader = make_loader(data, rank=0, world_size=2, batch_size=BATCH)
    with pytest.raises(PlanMismatchError) as caught:
        loader.load_state_dict(edited)
    message = str(caught.value)
    assert "shard set, seed or batching options changed" not in message
    assert "history" in message and "batches_done" in message


def test_a_second_pass_after_an_elastic_resume_is_the_whole_epoch_as_on_the_same_world_size(data: Path) -> None:
    state = state_after(data, 4, 1)
    for world in (4, 2):  # the same world size, then another one: a second pass behaves alike
        resumed = make_loader(data, rank=0, world_size=world, batch_size=BATCH)
        resumed.load_state_dict(state)
        first = [real_ids(b) for b in resumed]
        second = [real_ids(b) for b in resumed]  # no set_epoch: epoch 0 again, all of it
        fresh = [real_ids(b) for b in make_loader(data, rank=0, world_size=world, batch_size=BATCH)]
        assert len(first) < len(fresh)
        assert second == fresh
        assert len(resumed) == len(fresh)
        resumed.load_state_dict(state)  # and the state loaded again resumes again
        assert [real_ids(b) for b in resumed] == first


def test_an_end_of_epoch_state_loaded_again_after_its_empty_pass_still_leaves_nothing(data: Path) -> None:
    state = state_after(data, 4, len(make_loader(data, rank=0, world_size=4, batch_size=BATCH)))
    resumed = make_loader(data, rank=0, world_size=2, batch_size=BATCH)
    resumed.load_state_dict(state)
    assert list(resumed) == []
    resumed.load_state_dict(state)  # as Lightning restores a loader the DataModule made already resumed
    assert list(resumed) == []


@pytest.mark.parametrize("broken", [[1, 2], "state", {"version": 2}])
def test_a_broken_training_loader_state_in_a_datamodule_checkpoint_is_refused(data: Path, broken: object) -> None:
    module = ShardDataModule(train=data, batch_size=BATCH)
    module.world = World(rank=0, world_size=2)
    with pytest.raises(PlanError, match="loader state"):  # not a training epoch silently started over
        module.load_state_dict({"seed": 0, "train_loader": broken})


def test_a_datamodule_resumes_a_state_of_another_world_size(data: Path) -> None:
    saved = ShardDataModule(train=data, batch_size=BATCH)
    saved.world = World(rank=0, world_size=4)
    next(iter(saved.train_dataloader()))
    module = ShardDataModule(train=data, batch_size=BATCH)
    module.world = World(rank=0, world_size=2)
    module.load_state_dict(saved.state_dict())
    loader = module.train_dataloader()
    assert len(list(loader)) < len(make_loader(data, rank=0, world_size=2, batch_size=BATCH))
