"""A DataLoader worker stuck on its way out of fork() is replaced, and the pass gives the same batches.

The stuck workers are made by an ``after_in_child`` at-fork handler that sleeps for ever (tests/helpers/
stuck_fork_job.py), as a child waiting on a lock another thread held at the fork does: it never reaches torch's
worker loop, so torch alone would wait for its batch for ever.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import shardload
from shardload.load.worker_start import MarkStart, await_start, new_board
from shardload.testing import synthetic_samples
from tests.distributed.watchdog import run_with_watchdog

JOB = str(Path(__file__).parent / "helpers" / "stuck_fork_job.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stuck") / "set"
    shardload.write(synthetic_samples(73, seed=4), path, num_shards=3, progress=False)
    return path


def run_job(data: Path, tmp_path: Path, stuck: int, persistent: bool) -> tuple[dict[str, object], str]:
    out = tmp_path / "out.json"
    res = run_with_watchdog(
        [sys.executable, JOB, str(data), str(out), str(stuck), "1" if persistent else "0"], timeout=90
    )
    assert not res.hung, "the loader waited for a worker that never started:\n" + res.tail()
    assert res.returncode == 0, res.tail()
    return json.loads(out.read_text()), res.output


@pytest.mark.parametrize("persistent", [False, True])
def test_a_worker_stuck_in_fork_is_replaced_and_the_batches_are_the_same(
    data: Path, tmp_path: Path, persistent: bool
) -> None:
    result, output = run_job(data, tmp_path, stuck=1, persistent=persistent)
    assert result["got"] == result["expected"]
    assert len(result["stuck"]) == 1  # type: ignore[arg-type]
    assert result["alive"] == []  # the stuck child was ended, not left behind
    assert f"worker pid {result['stuck'][0]} never started" in output  # type: ignore[index]


def test_workers_that_never_start_raise_instead_of_hanging(data: Path, tmp_path: Path) -> None:
    result, _ = run_job(data, tmp_path, stuck=-1, persistent=False)
    assert "got" not in result
    assert str(result["error"]).startswith("WorkerError: DataLoader workers")
    assert "never started, 3 times" in str(result["error"])
    assert result["alive"] == []


def test_a_marked_worker_is_not_waited_for_and_an_idle_unmarked_one_is_stuck() -> None:
    board = new_board(2, None)

    class Worker:  # await_start reads a worker's pid and exit code, as of a multiprocessing.Process
        def __init__(self, pid: int) -> None:
            self.pid, self.exitcode = pid, None

    import subprocess

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        workers = [Worker(sleeper.pid), Worker(sleeper.pid)]
        MarkStart(board, None)(0)
        MarkStart(board, None)(1)
        assert await_start(workers, board, patience=0.5) == []
        board[1] = 0
        assert await_start(workers, board, patience=0.5) == [workers[1]]
        workers[1].exitcode = 0  # an exited worker is torch's to report, not waited for
        assert await_start(workers, board, patience=0.5) == []
    finally:
        sleeper.kill()
        sleeper.wait()


def loader_of(data: Path, workers: int) -> shardload.ShardLoader:
    options = shardload.LoaderOptions(num_workers=workers, persistent_workers=False, timeout=60)
    return shardload.make_loader(data, rank=0, world_size=1, stage="val", batch_size=8, loader_options=options)


@pytest.mark.parametrize("done", [0, 7])
def test_workers_replaced_at_the_end_of_a_resumed_epoch_serve_only_its_rest(
    data: Path, done: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch's new iterator takes prefetch_factor * num_workers keys as it is made: with 3 batches left that runs
    # the sampler's keys to their end, and a second iterator made then must still start at the resumed batch.
    reference = loader_of(data, 0)
    assert len(reference) == 10
    it = iter(reference)
    for _ in range(done):
        next(it)
    state = reference.state_dict()
    want = [b["sample_id"].tolist() for b in it]

    import shardload.load.loader as loader_module

    calls: list[int] = []

    def stuck_once(workers: list[object], board: object, **_: object) -> list[object]:
        calls.append(1)
        return list(workers[:1]) if len(calls) == 1 else []

    monkeypatch.setattr(loader_module, "await_start", stuck_once)
    loader = loader_of(data, 2)
    loader.load_state_dict(state)
    torch.manual_seed(5)
    got = [b["sample_id"].tolist() for b in loader]
    after_retry = torch.random.get_rng_state()
    assert len(calls) == 2  # the first workers were taken as stuck and replaced
    assert got == want
    # the pass leaves torch's random state as a pass whose workers started at once does
    monkeypatch.setattr(loader_module, "await_start", lambda workers, board, **_: [])
    loader = loader_of(data, 2)
    loader.load_state_dict(state)
    torch.manual_seed(5)
    assert [b["sample_id"].tolist() for b in loader] == want
    assert torch.equal(torch.random.get_rng_state(), after_retry)
