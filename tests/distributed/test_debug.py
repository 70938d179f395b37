"""debug=True: a cross-rank plan check that raises a clear error instead of hanging."""

from __future__ import annotations

from pathlib import Path

import pytest

import shardload
from shardload.testing import synthetic_samples
from tests.distributed.watchdog import python, run_with_watchdog

JOB = str(Path(__file__).with_name("debug_job.py"))


@pytest.mark.slow
def test_ranks_with_different_plans_raise_instead_of_hanging(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(40, seed=1), tmp_path / "a", num_shards=2)
    shardload.write(synthetic_samples(64, seed=1), tmp_path / "b", num_shards=2)
    res = run_with_watchdog(python(JOB, str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path)), timeout=120)
    assert not res.hung, res.tail(2000)
    for rank in range(2):
        text = (tmp_path / f"rank{rank}.txt").read_text()
        # Invariant: the error names the ranks and their batch counts
        assert text.startswith("mismatch:") and "{0: 5, 1: 8}" in text, text
    assert "[shardload debug] train rank 1/2" in res.output


@pytest.mark.slow
def test_same_plans_pass_the_debug_check(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(40, seed=1), tmp_path / "a", num_shards=2)
    res = run_with_watchdog(python(JOB, str(tmp_path / "a"), str(tmp_path / "a"), str(tmp_path)), timeout=120)
    assert not res.hung and res.returncode == 0, res.tail(2000)
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)] == ["finished", "finished"]
