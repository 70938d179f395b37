"""Elastic resume through Lightning: a DDP job checkpoints mid-epoch, one with another process count resumes.

Both jobs are real gloo process groups under a watchdog. Each rank records
the real sample ids of every training step; the claim checked is per rank and
per sample, not only that the jobs exit: across both jobs every training
sample of the interrupted epoch is seen exactly once, the resumed ranks run
equal step counts, and the next epoch is a whole epoch on the new world size.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import shardload
from shardload.testing import synthetic_samples
from tests.distributed.watchdog import python, run_with_watchdog

JOB = str(Path(__file__).with_name("elastic_ddp_job.py"))
pytestmark = pytest.mark.slow

N, STOP_EPOCH, STOP_STEP = 83, 1, 6


def reports(out: Path, phase: str, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"{phase}_rank{r}.json").read_text()) for r in range(world)]


# 3 -> 2: the resumed epoch is shorter than a whole 2-rank epoch; 2 -> 3: longer than a whole 3-rank epoch
# (the trainer reads a loader's length once: both directions check that it is told the right one each epoch)
@pytest.mark.parametrize(("before", "after"), [(3, 2), (2, 3)])
def test_a_mid_epoch_checkpoint_resumes_on_another_process_count_with_every_sample_once(
    tmp_path: Path, before: int, after: int
) -> None:
    shardload.write(synthetic_samples(N, seed=3), tmp_path / "train", num_shards=5)
    out = tmp_path / "out"
    out.mkdir()
    for devices, phase, extra in ((before, "part", [f"{STOP_EPOCH}:{STOP_STEP}"]), (after, "resumed", [])):
        res = run_with_watchdog(
            python(JOB, str(tmp_path / "train"), str(out), str(devices), phase, *extra), timeout=300
        )
        assert not res.hung, f"the {phase} job hung:\n" + res.output[-3000:]
        assert res.returncode == 0, f"the {phase} job failed:\n" + res.output[-3000:]

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
    # Invariant: across both jobs, every training sample of the interrupted epoch exactly once
    seen = Counter(i for r in part + resumed for batch in r["epochs"][epoch] for i in batch)
    assert sorted(seen) == list(range(N)) and set(seen.values()) == {1}
    # ... the resumed job did not replay earlier epochs, and its next epoch is a whole one on its ranks
    assert all(str(e) not in r["epochs"] for r in resumed for e in range(STOP_EPOCH))
    next_epoch = Counter(i for r in resumed for batch in r["epochs"][str(STOP_EPOCH + 1)] for i in batch)
    assert sorted(next_epoch) == list(range(N)) and set(next_epoch.values()) == {1}
