"""Real multi-process Lightning DDP runs (gloo on CPU), each under a watchdog.

Claims tested: every run finishes (equal batch counts, so no collective waits
forever), and the validation loss logged with ``sync_dist=True`` equals the
exact loss over every validation sample once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import shardload
from shardload.testing import synthetic_samples
from tests.distributed.ddp_job import Model
from tests.distributed.watchdog import python, run_with_watchdog

JOB = str(Path(__file__).with_name("ddp_job.py"))
pytestmark = pytest.mark.slow


def exact_loss(model_path: Path, val: Path, out: Path) -> tuple[float, int]:
    model = Model(out)
    model.load_state_dict(torch.load(model_path))
    model.eval()
    loader = shardload.make_loader(val, rank=0, world_size=1, stage="val", batch_size=7)
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in loader:
            w = batch["weight"].double()
            total += float((model.per_sample_loss(batch).double() * w).sum())
            count += int(w.sum())
    return total / count, count


@pytest.mark.parametrize(
    ("devices", "strategy", "n_val"),
    [(2, "ddp", 37), (3, "ddp", 2), (2, "ddp_spawn", 41)],
)
def test_ddp_fit_finishes_and_validation_is_exact(tmp_path: Path, devices: int, strategy: str, n_val: int) -> None:
    shardload.write(synthetic_samples(61, seed=1), tmp_path / "train", num_shards=5)
    shardload.write(synthetic_samples(n_val, seed=2), tmp_path / "val", num_shards=min(3, n_val))
    out = tmp_path / "out"
    out.mkdir()
    res = run_with_watchdog(
        python(JOB, str(tmp_path / "train"), str(tmp_path / "val"), str(out), str(devices), strategy, "shardload"),
        timeout=240,
    )
    assert not res.hung, "the DDP run hung:\n" + res.tail()
    assert res.returncode == 0, res.tail()
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)]
    # Invariant: every rank ran the same number of validation batches
    assert len({r["val_batches"] for r in ranks}) == 1
    # Invariant: exact evaluation — every validation sample exactly once across ranks
    assert sorted(i for r in ranks for i in r["val_ids"]) == list(range(n_val))
    metrics = json.loads((out / "metrics.json").read_text())
    logged = metrics["val_loss_sum"] / metrics["val_count"]
    exact, count = exact_loss(out / "model.pt", tmp_path / "val", out)
    assert int(metrics["val_count"]) == count == n_val
    assert abs(logged - exact) < 1e-5


def test_the_watchdog_catches_a_hand_written_split_that_hangs(tmp_path: Path) -> None:
    # Rank 0 has two validation batches more than rank 1: its extra sync_dist all-reduces
    # have no partner. This is the failure shardload's plan prevents.
    shardload.write(synthetic_samples(20, seed=1), tmp_path / "val", num_shards=2)
    out = tmp_path / "out"
    out.mkdir()
    res = run_with_watchdog(
        python(JOB, str(tmp_path / "val"), str(tmp_path / "val"), str(out), "2", "ddp", "unequal"), timeout=45
    )
    # It must not finish cleanly: the watchdog killed it (hang), or gloo gave up with an error.
    assert res.hung or res.returncode != 0, res.tail(2000)
    assert not (out / "metrics.json").exists()


def test_distributed_sampler_finishes_but_counts_samples_twice(tmp_path: Path) -> None:
    # The usual "fix": Lightning's DistributedSampler evens out counts by repeating samples,
    # so a metric over 21 samples on 2 ranks silently counts 22.
    shardload.write(synthetic_samples(21, seed=1), tmp_path / "val", num_shards=2)
    out = tmp_path / "out"
    out.mkdir()
    res = run_with_watchdog(
        python(JOB, str(tmp_path / "val"), str(tmp_path / "val"), str(out), "2", "ddp", "distributed_sampler"),
        timeout=120,
    )
    assert res.returncode == 0, res.tail(2000)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["val_count"] == 22.0
