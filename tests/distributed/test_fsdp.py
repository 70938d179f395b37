"""FSDP (PyTorch's ``fully_shard``) over ``make_loader``: 2 gloo ranks on CPU launched by torchrun, under the watchdog.

Lightning's ``strategy="fsdp"`` refuses CPU, so the job (fsdp_job.py) wraps a
model with ``torch.distributed.fsdp.fully_shard`` itself: every forward
all-gathers the parameters from every rank, so one rank with a batch more
would hang. Claims tested: one training epoch and a validation over an
uneven set (1001 samples, odd batch sizes) finish; every rank ran the same
number of steps; every sample is trained on and validated exactly once; the
all-reduced validation loss equals the one computed in one process over every
sample with the trained weights; and the same job on a hand-written split with
rank 0 two batches ahead does not finish (the test can fail).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import shardload
from shardload.testing import synthetic_samples
from tests.distributed.test_torchrun import read_reports, real_ids
from tests.distributed.torchrun_job import TinyModel
from tests.distributed.watchdog import Outcome, run_with_watchdog

JOB = str(Path(__file__).with_name("fsdp_job.py"))
N = 1001
pytestmark = pytest.mark.slow


def torchrun_fsdp(data: Path, out: Path, *args: str, timeout: float) -> Outcome:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", JOB]
    return run_with_watchdog([*cmd, "--data", str(data), "--out", str(out), *args], timeout=timeout)


def one_process_val_loss(model_path: Path, data: Path) -> tuple[float, int]:
    """The validation loss over every sample once, with the trained weights, in this one process."""
    model = TinyModel()
    model.load_state_dict(torch.load(model_path))
    model.eval()
    total, count = 0.0, 0.0
    with torch.no_grad():
        for batch in shardload.make_loader(data, rank=0, world_size=1, stage="val", batch_size=7):
            w = batch["weight"].double()
            total += float((model(batch).double() * w).sum())
            count += float(w.sum())
    return total, int(count)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fsdp") / "set"
    shardload.write(synthetic_samples(N, seed=4), path, num_shards=5)
    return path


def test_fsdp_trains_and_validates_exactly_over_an_uneven_set(tmp_path: Path, data: Path) -> None:
    res = torchrun_fsdp(data, tmp_path, timeout=300)
    assert not res.hung, "the FSDP job hung:\n" + res.tail()
    assert res.returncode == 0, res.tail()
    reports = read_reports(tmp_path, "report", 2)
    assert [r["rank"] for r in reports] == [0, 1]
    # The model really is sharded: each rank holds part of every parameter, the two parts make the whole
    assert all(0 < r["local_numel"] < r["full_numel"] for r in reports)
    assert sum(r["local_numel"] for r in reports) == reports[0]["full_numel"]
    for stage in ("train", "val"):
        # Invariant: every rank ran the same number of steps (each forward all-gathered with its partner)
        steps = [len(r[stage]) for r in reports]
        assert steps[0] == steps[1] > 0, (stage, steps)
        # Invariant: every sample exactly once across ranks; filler (weight 0) excluded
        assert sorted(i for r in reports for i in real_ids(r[stage])) == list(range(N)), stage
    # 1001 samples over 2 ranks: one rank has a real sample less, so the sizes were uneven
    assert sorted(len(real_ids(r["val"])) for r in reports) == [500, 501]
    # The all-reduce added the ranks' own sums, and both ranks got the same total
    local = [r["val_sums_local"] for r in reports]
    assert reports[0]["val_sums"] == reports[1]["val_sums"]
    assert reports[0]["val_sums"][1] == local[0][1] + local[1][1] == N
    # Invariant: exact evaluation: the loss over every sample once, as one process computes it
    loss_sum, count = reports[0]["val_sums"]
    exact_sum, exact_count = one_process_val_loss(tmp_path / "model.pt", data)
    assert count == exact_count == N
    assert loss_sum / count == pytest.approx(exact_sum / exact_count, rel=1e-6)


def test_fsdp_on_a_hand_written_split_with_an_extra_batch_does_not_finish(tmp_path: Path, data: Path) -> None:
    res = torchrun_fsdp(data, tmp_path, "--split", "unequal", "--timeout", "15", timeout=120)
    # Both ranks reached validation, rank 0 with two batches more (then its all-gather has no partner)
    assert "rank 0: validating 74 batches" in res.output, res.tail()
    assert "rank 1: validating 72 batches" in res.output, res.tail()
    # It must not finish: the watchdog killed it (hang), or gloo gave up waiting in FSDP's all-gather.
    assert res.hung or (res.returncode != 0 and "all_gather" in res.output), res.tail()
    assert not list(tmp_path.glob("report_rank*.json"))
