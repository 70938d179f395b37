"""A DataLoader worker killed mid-epoch: the training loop gets an error, never a hang."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.distributed.watchdog import python, run_with_watchdog

JOB = Path(__file__).with_name("worker_death_job.py")


@pytest.mark.slow
def test_killed_worker_raises_in_the_main_process(tmp_path: Path) -> None:
    outcome = run_with_watchdog(python(str(JOB), str(tmp_path / "set")), timeout=120)
    assert not outcome.hung, outcome.output
    killed = re.search(r"KILLED (\d+)", outcome.output)
    assert killed, outcome.output
    # Invariant: the loop raised an error naming the dead worker (never a hang, never a bare
    # ConnectionResetError from the tensor transfer)
    assert outcome.returncode == 3, outcome.output
    pid = killed.group(1)
    assert re.search(
        rf"RAISED RuntimeError: DataLoader worker \(pid(\(s\))? {pid}\) (died with exit code -9|is killed by signal|exited unexpectedly)",
        outcome.output,
    ), outcome.output
