"""The loader's stats under Lightning DDP (2 gloo ranks, one slow), under the watchdog: reduced over ranks."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import shardload
from shardload.testing import synthetic_samples
from tests.distributed.watchdog import python, run_with_watchdog

JOB = str(Path(__file__).with_name("stats_job.py"))
pytestmark = pytest.mark.slow


def test_the_stats_are_the_mean_and_the_largest_over_ranks_and_the_slow_rank_is_named(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(80, seed=1), tmp_path / "train", num_shards=4, progress=False)
    out = tmp_path / "out"
    out.mkdir()
    res = run_with_watchdog(python(JOB, str(tmp_path / "train"), str(out), "0.05"), timeout=240)
    assert not res.hung, "the DDP run hung:\n" + res.tail()
    assert res.returncode == 0, res.tail()
    with open(out / "csv" / "version_0" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("data/wait_fraction")]
    # 80 samples, 2 ranks, batches of 4: 10 steps per rank, logged every 2
    assert len(rows) == 5
    for r in rows:
        mean, top = float(r["data/wait_fraction"]), float(r["data/wait_fraction_max"])
        # Invariant: rank 1 waits for its slow batches, rank 0 for rank 1 only in the step's collectives,
        # so the largest is rank 1's and lies above the mean
        assert 0.5 < top <= 1.0 and mean < top
        assert float(r["data/tokens_per_s"]) > 0 and 0 <= float(r["data/padding"]) < 1
    warned = json.loads((out / "warnings.json").read_text())
    # Invariant: one warning per run, naming the slow rank
    assert len(warned) == 1 and "rank 1" in warned[0], warned
