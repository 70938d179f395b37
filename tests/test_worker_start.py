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
