"""Real torchrun launches (2 gloo ranks on CPU) of a plain-PyTorch loop over ``make_loader``.

Claims tested: the run finishes (every rank reaches every ``all_reduce`` and
DDP gradient all-reduce, because every rank has the same number of steps),
and every sample of the set is seen exactly once per epoch across the ranks,
filler rows (weight 0) aside, with fixed-size and token-budget batching.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

import shardload
from shardload.load.loader import make_loader
from shardload.plan import Batching
from shardload.testing import synthetic_samples
from tests.distributed.watchdog import Outcome, run_with_watchdog

JOB = str(Path(__file__).with_name("torchrun_job.py"))
pytestmark = pytest.mark.slow


def torchrun(*job_args: str, nproc: int = 2, timeout: float = 240) -> Outcome:
    """Launch the job with torchrun (``--standalone`` picks a free rendezvous port)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), JOB]
    return run_with_watchdog([*cmd, *job_args], timeout=timeout)


def read_reports(out: Path, name: str, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"{name}_rank{r}.json").read_text()) for r in range(world)]


def real_ids(batches: list[dict[str, list[Any]]]) -> list[int]:
    return [i for b in batches for i, w in zip(b["ids"], b["weights"]) if w > 0]


def as_flags(options: dict[str, Any]) -> list[str]:
    return [x for k, v in options.items() for x in ("--" + k.replace("_", "-"), str(v))]


def planned_batches(path: Path, rank: int, epoch: int, options: dict[str, Any]) -> list[list[int]]:
    """The batches (sample ids) that rank's plan has for epoch, computed here in one process."""
    opts = {k: v for k, v in options.items() if k != "num_workers"}
    batching = Batching(**{k: opts.pop(k) for k in ("batch_size", "max_tokens", "uneven") if k in opts})
    plan = make_loader(
        path, rank=rank, world_size=2, epoch=epoch, seed=3, batching=batching, **opts
    ).plan_sampler.plan()
    return [plan.batch(i)[0].tolist() for i in range(len(plan))]


@pytest.mark.parametrize(
    ("n", "options"),
    [
        (37, {"batch_size": 4}),
        (41, {"max_tokens": 120, "num_workers": 1}),
        (21, {"batch_size": 5, "uneven": "pad"}),
        (19, {"max_tokens": 90, "stage": "val"}),
    ],
    ids=["batch-size", "max-tokens-worker", "pad-filler", "val-stage"],
)
def test_torchrun_epochs_see_every_sample_once(tmp_path: Path, n: int, options: dict[str, Any]) -> None:
    assert n % 2 == 1  # the set size must not divide by the world size
    shardload.write(synthetic_samples(n, seed=5), tmp_path / "set", num_shards=3)
    out = tmp_path / "out"
    out.mkdir()
    res = torchrun("--data", str(tmp_path / "set"), "--out", str(out), "--epochs", "2", *as_flags(options))
    assert not res.hung, "the torchrun job hung:\n" + res.tail()
    assert res.returncode == 0, res.tail()
    reports = read_reports(out, "report", 2)
    assert [r["rank"] for r in reports] == [0, 1]
    for epoch in ("0", "1"):
        per_rank = [r["epochs"][epoch] for r in reports]
        # Invariant: every rank ran the same number of steps in the epoch
        steps = [len(p["batches"]) for p in per_rank]
        assert steps[0] == steps[1] > 0, steps
        # Invariant: every real sample exactly once per epoch across ranks; filler excluded
        seen = sorted(i for p in per_rank for i in real_ids(p["batches"]))
        assert seen == list(range(n)), f"epoch {epoch}: {seen}"
        # The per-step all_reduce paired up step by step: both ranks summed the same totals, n in all
        assert [p["all_reduced_real"] for p in per_rank] == [n, n]
        # Rank and world size came from torchrun's environment: each rank ran its own plan
        for r, p in enumerate(per_rank):
            assert [b["ids"] for b in p["batches"]] == planned_batches(tmp_path / "set", r, int(epoch), options)
    if options.get("stage") != "val":
        # Training reshuffles between epochs (set_epoch took effect)
        assert reports[0]["epochs"]["0"]["batches"] != reports[0]["epochs"]["1"]["batches"]
    if options.get("uneven") == "pad":
        # This size leaves one rank a batch short: it runs a filler batch, which must be weight 0
        weights = [w for r in reports for e in ("0", "1") for b in r["epochs"][e]["batches"] for w in b["weights"]]
        assert weights.count(0.0) == 2, weights
