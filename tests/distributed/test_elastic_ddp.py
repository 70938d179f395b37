"""Elastic resume through Lightning: a DDP job checkpoints mid-epoch, one with another process count resumes.

Both jobs are real gloo process groups under a watchdog. Each rank records
every training step's real documents (sample id and tokens); the claim checked
is per rank and per document, not only that the jobs exit: across both jobs
the interrupted epoch's documents are exactly an uninterrupted run's, each
once (every sample once for a shard set; for a packed mixture every selected
use and every piece of a cut sample), the resumed ranks run equal step
counts, and the next epoch is a whole epoch on the new world size.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shardload
from shardload.testing import synthetic_samples
from tests.distributed.elastic_ddp_job import PACKED
from tests.distributed.watchdog import python, run_with_watchdog

JOB = str(Path(__file__).with_name("elastic_ddp_job.py"))
pytestmark = pytest.mark.slow

STOP_EPOCH, STOP_STEP = 1, 6
Docs = Counter[tuple[int, int]]


def reports(out: Path, phase: str, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"{phase}_rank{r}.json").read_text()) for r in range(world)]


def token_set(path: Path, n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    shardload.write([{"tokens": rng.integers(0, 9, k).astype(np.int32)} for k in rng.integers(1, 300, n)], path)
    return str(path)


def uninterrupted(train: str, mode: str, world: int, epoch: int) -> Docs:
    """The documents an uninterrupted ``world``-rank run serves in ``epoch`` (the DataModule's options)."""
    if mode == "plain":
        source: Any = train
        options: dict[str, Any] = {"max_tokens": 120}
    else:
        a, b = train.split(",")
        source, options = shardload.Mixture({"a": a, "b": b}, weights={"a": 1, "b": 1}), {"batching": PACKED}
    docs: Docs = Counter()
    for rank in range(world):
        for batch in shardload.make_loader(source, rank=rank, world_size=world, seed=5, epoch=epoch, **options):
            real = batch["weight"] > 0
            docs.update(zip(batch["sample_id"][real].tolist(), batch["tokens_lengths"][real].tolist()))
    return docs


# 3 -> 2: the resumed epoch is shorter than a whole 2-rank epoch; 2 -> 3: longer than a whole 3-rank epoch
# (the trainer reads a loader's length once: both directions check that it is told the right one each epoch)
@pytest.mark.parametrize(("before", "after", "mode"), [(3, 2, "plain"), (2, 3, "plain"), (3, 2, "mixed-packed")])
def test_a_mid_epoch_checkpoint_resumes_on_another_process_count_with_every_sample_once(
    tmp_path: Path, before: int, after: int, mode: str
) -> None:
    if mode == "plain":
        shardload.write(synthetic_samples(83, seed=3), tmp_path / "train", num_shards=5)
        train = str(tmp_path / "train")
    else:  # the second source is repeated to reach its weight; pieces of 128 tokens
        train = token_set(tmp_path / "a", 70, 1) + "," + token_set(tmp_path / "b", 15, 2)
    out = tmp_path / "out"
    out.mkdir()
    for devices, phase, extra in ((before, "part", [f"{STOP_EPOCH}:{STOP_STEP}"]), (after, "resumed", [])):
        res = run_with_watchdog(python(JOB, train, str(out), str(devices), phase, mode, *extra), timeout=300)
        assert not res.hung, f"the {phase} job hung:\n" + res.tail()
        assert res.returncode == 0, f"the {phase} job failed:\n" + res.tail()

    part, resumed = reports(out, "part", before), reports(out, "resumed", after)
    assert [r["world_size"] for r in part + resumed] == [before] * before + [after] * after
    state = torch.load(out / "mid.ckpt", weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert (state["world_size"], state["epoch"], state["batches_done"], state["history"]) == (before, 1, STOP_STEP, [])
    epoch = str(STOP_EPOCH)
    # each rank of the first job ran exactly STOP_STEP steps of the epoch before the checkpoint
    assert [len(r["epochs"][epoch]) for r in part] == [STOP_STEP] * before
    # Invariant: the resumed ranks run equal step counts (no collective waits for ever)
    assert len({len(r["epochs"][epoch]) for r in resumed}) == 1
    assert len(resumed[0]["epochs"][epoch]) > 0

    def served(runs: list[dict[str, Any]], e: str) -> Docs:
        return Counter((i, n) for r in runs for batch in r["epochs"].get(e, []) for i, n in batch)

    # Invariant: across both jobs, the interrupted epoch's documents exactly as an uninterrupted run serves them
    seen = served(part + resumed, epoch)
    assert seen == uninterrupted(train, mode, before, STOP_EPOCH)
    if mode == "plain":  # every training sample of the epoch exactly once
        assert sorted(i for i, _ in seen.elements()) == list(range(83))
    # ... the resumed job did not replay earlier epochs, and its next epoch is a whole one on its ranks
    assert all(str(e) not in r["epochs"] for r in resumed for e in range(STOP_EPOCH))
    assert served(resumed, str(STOP_EPOCH + 1)) == uninterrupted(train, mode, after, STOP_EPOCH + 1)
