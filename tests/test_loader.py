"""The dataset, collate and loader: contract, zero-copy, locality, determinism, resume."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shardload
import shardload.load.sampler
from shardload.load.loader import make_loader
from shardload.plan import Batching
from shardload.testing import synthetic_samples
from tests.helpers.resume import assert_resumes_identically, batch_ids


def mapped_ranges(path: Path) -> list[tuple[int, int]]:
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] == str(path.resolve()):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi))
    return out


def test_getitem_is_a_view_into_the_memory_mapped_shard(shard_set: shardload.ShardSet) -> None:
    sample = shard_set[5]
    shard_file = shard_set.path / shard_set.shards[0].file
    ranges = mapped_ranges(shard_file)
    assert ranges, "the shard file is not memory-mapped"
    for name in ("tokens", "features"):
        addr = sample[name].__array_interface__["data"][0]
        # Invariant: zero-copy — the sample's bytes are the file's mapped pages
        assert any(lo <= addr < hi for lo, hi in ranges), name
        assert not sample[name].flags.owndata


def test_batch_contract(shard_set: shardload.ShardSet, samples: list[dict]) -> None:
    loader = make_loader(
        shard_set.path,
        rank=0,
        world_size=1,
        stage="val",
        batching=Batching(batch_size=16, pad_to_multiple_of=8),
        pad_values={"tokens": -1},
    )
    n_seen = 0
    for batch in loader:
        b = len(batch["sample_id"])
        assert 1 <= b <= 16
        assert batch["sample_id"].dtype == torch.int64 and batch["weight"].dtype == torch.float32
        assert batch["tokens"].dtype == torch.int32 and batch["tokens"].shape[0] == b
        assert batch["tokens"].shape[1] % 8 == 0
        assert batch["features"].shape[0] == b and batch["features"].shape[2] == 4
        assert batch["label"].shape == (b,) and batch["label"].dtype == torch.int64
        assert batch["tokens_lengths"].dtype == torch.int64
        for i, sid in enumerate(batch["sample_id"].tolist()):
            want = samples[sid]  # the fixture set is not shuffled: id == source position
            n = int(batch["tokens_lengths"][i])
            assert n == len(want["tokens"])
            np.testing.assert_array_equal(batch["tokens"][i, :n].numpy(), want["tokens"])
            assert (batch["tokens"][i, n:] == -1).all()
            rows = int(batch["features_lengths"][i])
            np.testing.assert_array_equal(batch["features"][i, :rows].numpy(), want["features"])
            assert (batch["features"][i, rows:] == 0).all()
            assert int(batch["label"][i]) == int(want["label"])
        n_seen += int((batch["weight"] > 0).sum())
    assert n_seen == len(samples)


def test_fields_selects_what_is_loaded(shard_set: shardload.ShardSet) -> None:
    batch = next(iter(make_loader(shard_set.path, rank=0, world_size=1, batch_size=4, fields=("label",))))
    assert set(batch) == {"label", "sample_id", "weight"}
    with pytest.raises(shardload.PlanError, match="nope"):
        make_loader(shard_set.path, rank=0, world_size=1, batch_size=4, fields=("nope",))


@pytest.mark.parametrize("stage", ["train", "val"])
def test_same_batches_for_any_num_workers(shard_set: shardload.ShardSet, stage: str) -> None:
    def run(workers: int) -> list[list[int]]:
        loader = make_loader(
            shard_set.path, rank=1, world_size=3, stage=stage, max_tokens=200, num_workers=workers, seed=4, epoch=2
        )
        return batch_ids(loader)

    # Invariant: debug mode (num_workers=0) yields the very same batches as workers
    assert run(0) == run(2)


def test_rank_opens_only_the_shards_its_plan_touches(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(400, seed=3), tmp_path / "s", num_shards=20)
    world = 4
    for rank in range(world):
        loader = make_loader(tmp_path / "s", rank=rank, world_size=world, batch_size=8, stage="train", epoch=1)
        list(loader)
        opened = loader.dataset.shard_set.open_shards
        planned = loader.dataset.shard_set.index.shards_of(loader.plan_sampler.plan().sample_ids)
        # Invariant: locality — only planned shards are mapped, about shards/world_size of them
        assert set(opened) <= set(planned.tolist())
        assert len(opened) <= math.ceil(20 / world) + 2


def test_manifest_is_parsed_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shardload.write(synthetic_samples(60, seed=4), tmp_path / "s", num_shards=3)
    from shardload.formats.manifest import Manifest

    loads: list[Path] = []
    original = Manifest.load.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Manifest, "load", classmethod(lambda cls, d: loads.append(d) or original(cls, d)))
    loader = make_loader(tmp_path / "s", rank=0, world_size=1, batch_size=8, stage="val")
    next(iter(loader))
    # start-up cost: the loader's opened set is reused by the dataset in the main process
    assert len(loads) == 1


def test_first_batch_does_not_import_pyarrow_compute_or_pandas(tmp_path: Path) -> None:
    # Each DataLoader worker pays such imports again (0.4-1.3 s measured); shards are read from raw buffers.
    import subprocess
    import sys

    shardload.write(synthetic_samples(50, seed=5), tmp_path / "s", num_shards=2)
    code = (
        "import sys; from shardload.load.loader import make_loader; "
        f"b = next(iter(make_loader({str(tmp_path / 's')!r}, rank=0, world_size=1, batch_size=8))); "
        "print(sorted(m for m in ('pyarrow.compute', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_epochs_reshuffle_training_but_not_evaluation(shard_set: shardload.ShardSet) -> None:
    def ids(stage: str, epoch: int) -> list[list[int]]:
        loader = make_loader(shard_set.path, rank=0, world_size=2, stage=stage, batch_size=8)
        loader.set_epoch(epoch)
        return batch_ids(loader)

    assert ids("train", 0) != ids("train", 1)
    assert ids("train", 1) == ids("train", 1)
    assert ids("val", 0) == ids("val", 1)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_in_one_process(shard_set: shardload.ShardSet, workers: int) -> None:
    def make() -> shardload.load.loader.ShardLoader:
        loader = make_loader(
            shard_set.path, rank=0, world_size=2, stage="train", max_tokens=160, num_workers=workers, seed=1
        )
        loader.set_epoch(3)
        return loader

    assert_resumes_identically(make, stop_after=4)


def test_resume_plans_the_epoch_once(shard_set: shardload.ShardSet, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan load_state_dict checks against the checkpoint is the one the resumed iteration uses."""
    a = make_loader(shard_set.path, rank=0, world_size=2, batch_size=8)
    a.set_epoch(2)
    it = iter(a)
    next(it)
    state = a.state_dict()
    b = make_loader(shard_set.path, rank=0, world_size=2, batch_size=8)
    planned: list[int] = []
    real = shardload.load.sampler.plan_rank

    def counting(*args: Any, **kwargs: Any) -> Any:
        planned.append(args[1].epoch)  # the EpochSpec
        return real(*args, **kwargs)

    monkeypatch.setattr(shardload.load.sampler, "plan_rank", counting)
    b.load_state_dict(state)
    rest = batch_ids(b)
    assert planned == [2]
    assert len(rest) == len(a) - 1


def test_reprepared_set_is_detected(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(50, seed=1), tmp_path / "s", num_shards=2)
    loader = make_loader(tmp_path / "s", rank=0, world_size=1, batch_size=8)
    shardload.write(synthetic_samples(50, seed=2), tmp_path / "s", num_shards=2, overwrite=True)
    with pytest.raises(shardload.ShardSetChangedError, match="re-prepared"):
        next(iter(loader))


def test_rank_from_environment(shard_set: shardload.ShardSet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = make_loader(shard_set.path, batch_size=8)
    assert (loader.plan_sampler.world.rank, loader.plan_sampler.world.world_size) == (2, 3)


@pytest.mark.parametrize("workers", [0, 2])
def test_packed_loader_resumes_mid_epoch(tmp_path: Path, workers: int) -> None:
    rng = np.random.default_rng(3)
    tokens = [{"tokens": rng.integers(0, 100, n).astype(np.int32)} for n in rng.integers(1, 300, 200)]
    shardload.write(tokens, tmp_path / "set", num_shards=4, progress=False)

    def make() -> shardload.load.loader.ShardLoader:
        batching = Batching(packing=True, pack_length=512, rows_per_batch=2)
        loader = make_loader(tmp_path / "set", rank=1, world_size=2, batching=batching, num_workers=workers, seed=2)
        loader.set_epoch(1)
        return loader

    assert_resumes_identically(make, stop_after=2)


@pytest.mark.parametrize("pin_memory", [False, True])
def test_without_workers_the_direct_path_changes_nothing(
    shard_set: shardload.ShardSet, monkeypatch: pytest.MonkeyPatch, pin_memory: bool
) -> None:
    """num_workers=0 reads each batch from the sampler and the dataset itself, skipping torch's per-batch
    wrappers: the same batches, and the same draw from torch's random generator per pass, as through torch's
    iterator; when torch pins batches, they go through torch's iterator."""
    from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

    calls = [0]
    through_torch = _SingleProcessDataLoaderIter.__next__

    def counted(self: Any) -> Any:
        calls[0] += 1
        return through_torch(self)

    monkeypatch.setattr(_SingleProcessDataLoaderIter, "__next__", counted)

    def run(direct: bool) -> tuple[list[dict[str, Any]], float, int]:
        calls[0] = 0
        loader = make_loader(shard_set.path, rank=0, world_size=1, max_tokens=200, seed=3)
        loader.pin_memory = pin_memory  # no accelerator here: torch's iterator warns and leaves batches as they are
        if not direct:
            monkeypatch.setattr(loader, "_direct_fetch", lambda it: None)
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            batches = list(loader)
        return batches, torch.rand(1).item(), calls[0]

    (direct, after_direct, direct_calls), (usual, after_usual, usual_calls) = run(True), run(False)
    assert usual_calls == len(usual) + 1  # every batch, then the end
    pins = pin_memory and torch.accelerator.is_available()  # torch pins only with an accelerator
    assert direct_calls == (usual_calls if pins else 0)
    assert after_direct == after_usual
    assert len(direct) == len(usual) > 1
    for a, b in zip(direct, usual):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
