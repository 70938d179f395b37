"""Mid-epoch resume across a real restart: torchrun launches with gloo ranks, on the same or another world size.

Why torchrun and not Lightning: the claim is about the loader's own
``state_dict()`` / ``load_state_dict()`` protocol, per rank, in a fresh
process group. A plain loop checkpoints at an exact, known step, with nothing
between the loader and the checkpoint; the Lightning path (which stores the
same state through the trainer's checkpoint) is covered in-process by
``tests/test_datamodule.py``.

The scenario: an uninterrupted 3-epoch run is the reference. A second run
saves each rank's loader state after step K of epoch 1 and exits; a third run,
a new torchrun launch, restores it and finishes. Each rank must then see
exactly the reference's remaining batches of epoch 1, and the same epoch 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import shardload
from shardload.testing import synthetic_samples
from tests.distributed.test_torchrun import read_reports, torchrun

pytestmark = pytest.mark.slow

STOP_EPOCH, STOP_STEP = 1, 3


def test_two_rank_resume_gives_each_rank_exactly_the_remaining_batches(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(45, seed=7), tmp_path / "set", num_shards=4)
    out = tmp_path / "out"
    out.mkdir()
    # Token budgets and a worker process: batches vary in size and are prefetched ahead of the step.
    common = [
        "--data",
        str(tmp_path / "set"),
        "--out",
        str(out),
        "--epochs",
        "3",
        "--max-tokens",
        "110",
        "--num-workers",
        "1",
    ]

    for phase, extra in (
        ("full", []),
        ("part", ["--stop-at", f"{STOP_EPOCH}:{STOP_STEP}"]),
        ("resumed", ["--resume"]),
    ):
        res = torchrun(*common, "--report", phase, *extra)
        assert not res.hung, f"the {phase} run hung:\n" + res.tail()
        assert res.returncode == 0, f"{phase} run failed:\n" + res.tail()

    full, part, resumed = (read_reports(out, name, 2) for name in ("full", "part", "resumed"))
    for rank in range(2):
        ckpt = torch.load(out / f"ckpt_rank{rank}.pt")["loader"]
        assert (ckpt["world_size"], ckpt["epoch"], ckpt["batches_done"]) == (2, STOP_EPOCH, STOP_STEP)
        # the state is the same on every rank: any rank's checkpoint resumes every rank
        assert ckpt == torch.load(out / "ckpt_rank0.pt")["loader"]
        ref = {e: [b["ids"] for b in full[rank]["epochs"][e]["batches"]] for e in ("0", "1", "2")}
        assert len(ref["1"]) > STOP_STEP + 1, "the stop must fall in the middle of the epoch"
        assert part[rank]["stopped"] and not resumed[rank]["stopped"]
        before = [b["ids"] for b in part[rank]["epochs"]["1"]["batches"]]
        after = [b["ids"] for b in resumed[rank]["epochs"]["1"]["batches"]]
        assert before == ref["1"][:STOP_STEP]
        # Invariant: the resumed epoch is exactly the rest of the uninterrupted one, on each rank
        assert after == ref["1"][STOP_STEP:]
        # ... and the run goes on as if never interrupted
        assert "0" not in resumed[rank]["epochs"]
        assert [b["ids"] for b in resumed[rank]["epochs"]["2"]["batches"]] == ref["2"]
    # Invariant: both ranks still run the same number of steps after the resume
    assert len(resumed[0]["epochs"]["1"]["batches"]) == len(resumed[1]["epochs"]["1"]["batches"])
    # Across the interruption, epoch 1 still sees every sample exactly once
    ids = sorted(
        i
        for report in (*part, *resumed)
        for b in report["epochs"]["1"]["batches"]
        for i, w in zip(b["ids"], b["weights"])
        if w > 0
    )
    assert ids == list(range(45))


def test_a_torchrun_job_resumes_on_another_world_size_with_every_sample_once(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(71, seed=2), tmp_path / "set", num_shards=5)
    out = tmp_path / "out"
    out.mkdir()
    common = ["--data", str(tmp_path / "set"), "--out", str(out), "--epochs", "3", "--max-tokens", "110"]
    for phase, nproc, extra in (("part", 3, ["--stop-at", f"{STOP_EPOCH}:{STOP_STEP}"]), ("resumed", 2, ["--resume"])):
        res = torchrun(*common, "--report", phase, *extra, nproc=nproc)
        assert not res.hung, f"the {phase} run hung:\n" + res.tail()
        assert res.returncode == 0, f"{phase} run failed:\n" + res.tail()
    part, resumed = read_reports(out, "part", 3), read_reports(out, "resumed", 2)
    epoch = str(STOP_EPOCH)
    assert [len(r["epochs"][epoch]["batches"]) for r in part] == [STOP_STEP] * 3
    # Invariant: equal steps on the new ranks (the all-reduce of every step paired up)
    assert len({len(r["epochs"][epoch]["batches"]) for r in resumed}) == 1
    # Invariant: across the two jobs, the epoch's samples each exactly once; the next epoch is a whole 2-rank one
    for reports, e in (((*part, *resumed), epoch), (resumed, str(STOP_EPOCH + 1))):
        ids = sorted(i for r in reports for b in r["epochs"][e]["batches"] for i, w in zip(b["ids"], b["weights"]) if w)
        assert ids == list(range(71))
