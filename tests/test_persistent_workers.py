"""Persistent loader workers (the default with workers): the same batches across epochs, resumes and failures.

The workers live from one epoch to the next; the plan does not live in them
(the sampler sends each batch key from the main process), so ``set_epoch``,
``load_state_dict`` and an abandoned pass must reach the batches exactly as
with new workers each epoch.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from pathlib import Path

import pytest

import shardload
from shardload.errors import WorkerError
from shardload.load.loader import ShardLoader, make_loader
from shardload.testing import synthetic_samples
from tests.helpers.resume import batch_ids

WORKERS = 2


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("persistent") / "set"
    shardload.write(synthetic_samples(157, seed=8), path, num_shards=4, progress=False)
    return path


def loader_of(data: Path, workers: int, epoch: int = 0, timeout: float = 60) -> ShardLoader:
    # timeout: a worker that never answers fails the test instead of hanging it
    options = shardload.LoaderOptions(num_workers=workers, timeout=timeout)
    return make_loader(data, rank=1, world_size=2, max_tokens=150, seed=2, epoch=epoch, loader_options=options)


def fresh(data: Path, epoch: int) -> list[list[int]]:
    """The epoch's batches from a new loader without worker processes."""
    return batch_ids(loader_of(data, 0, epoch))


def worker_pids(loader: ShardLoader) -> list[int]:
    return [w.pid for w in loader._iterator._workers]  # type: ignore[union-attr]


def test_workers_persist_by_default_and_epochs_give_a_fresh_loaders_batches(data: Path) -> None:
    loader = loader_of(data, WORKERS)
    assert loader.persistent_workers
    pids: list[list[int]] = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert batch_ids(loader) == fresh(data, epoch), epoch
        pids.append(worker_pids(loader))
    # the very same worker processes served every epoch
    assert pids[0] == pids[1] == pids[2] and len(pids[0]) == WORKERS
    assert fresh(data, 0) != fresh(data, 1)  # the epochs differ: set_epoch reached the batches


def test_a_pass_left_early_then_resumed_gives_the_remaining_batches(data: Path) -> None:
    loader = loader_of(data, WORKERS)
    assert batch_ids(loader) == fresh(data, 0)
    loader.set_epoch(1)
    it = iter(loader)
    head = [next(it)["sample_id"].tolist() for _ in range(4)]  # the workers have prefetched beyond these
    state = loader.state_dict()
    expected = fresh(data, 1)
    assert head == expected[:4]
    # the same loader, whose persistent workers still hold batches of the pass left early
    loader.load_state_dict(state)
    assert batch_ids(loader) == expected[4:]
    # a new persistent loader resumed from the state
    resumed = loader_of(data, WORKERS)
    resumed.load_state_dict(state)
    assert batch_ids(resumed) == expected[4:]
    # and the next epochs are whole
    for one in (loader, resumed):
        one.set_epoch(2)
        assert batch_ids(one) == fresh(data, 2)


def test_a_pass_abandoned_mid_epoch_restarts_the_epoch(data: Path) -> None:
    loader = loader_of(data, WORKERS)
    it = iter(loader)
    next(it), next(it)
    del it
    assert batch_ids(loader) == fresh(data, 0)


def test_a_worker_killed_between_epochs_is_named_and_the_next_pass_starts_new_workers(data: Path) -> None:
    # Named at once, not after the timeout: without the check, the reset of the workers waits `timeout` seconds
    # for the dead one (torch checks workers' liveness only when a wait times out)
    loader = loader_of(data, WORKERS, timeout=300)
    assert batch_ids(loader) == fresh(data, 0)
    before = worker_pids(loader)
    # torch's SIGCHLD handler would raise its own error wherever the main thread is when the worker dies;
    # without it, the next pass finds the dead worker and says why
    handler = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        os.kill(before[0], signal.SIGKILL)
        loader._iterator._workers[0].join(10)  # type: ignore[union-attr]  # it died between the epochs
        loader.set_epoch(1)
        started = time.monotonic()
        with pytest.raises(WorkerError, match="SIGKILL"):
            batch_ids(loader)
        assert time.monotonic() - started < 30
        assert batch_ids(loader) == fresh(data, 1)
        after = worker_pids(loader)
    finally:
        signal.signal(signal.SIGCHLD, handler)
    assert not set(after) & set(before)


def test_lightning_does_not_advise_persistent_workers_for_the_datamodules_loaders(data: Path) -> None:
    from types import SimpleNamespace

    from lightning.pytorch.trainer.connectors.data_connector import _worker_check

    dm = shardload.ShardDataModule(train=data, val=data, batch_size=4)  # the default: 2 workers
    dm.setup("fit")
    trainer = SimpleNamespace(num_devices=1, reload_dataloaders_every_n_epochs=0)
    for name, loader in (("train_dataloader", dm.train_dataloader()), ("val_dataloader", dm.val_dataloader())):
        assert isinstance(loader, ShardLoader) and loader.num_workers == 2
        loader.multiprocessing_context = "spawn"  # where Lightning gives the advice (ddp_spawn ranks, macOS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _worker_check(trainer, loader, name)  # Lightning's own check of a loader it is given
        assert not [w for w in caught if "persistent_workers" in str(w.message)], name
