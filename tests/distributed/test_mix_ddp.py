"""A mixture under real multi-process Lightning DDP (gloo on CPU, default Trainer flags), under a watchdog.

Claims tested: a two-source training mixture and a dict of two validation sets
run to the end (equal batch counts on every rank, so no collective waits), each
validation set is seen exactly once over the ranks, and the loss of each set,
logged with ``sync_dist=True`` at every step, equals the one computed in one process, and so does the mean
``ExactMean(sources=...)`` computes on every rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import shardload
from shardload.testing import synthetic_samples
from tests.distributed.mix_ddp_job import NAMES, MixModel
from tests.distributed.watchdog import python, run_with_watchdog

JOB = str(Path(__file__).with_name("mix_ddp_job.py"))
pytestmark = pytest.mark.slow


def exact_per_source(model_path: Path, sets: dict[str, Path], out: Path) -> dict[str, tuple[float, int]]:
    """Each validation set's loss sum and count, computed in this process over every sample once."""
    model = MixModel(out)
    model.load_state_dict(torch.load(model_path))
    model.eval()
    result = {}
    with torch.no_grad():
        for name, path in sets.items():
            total, count = 0.0, 0
            for batch in shardload.make_loader(path, rank=0, world_size=1, stage="val", batch_size=5):
                w = batch["weight"].double()
                total += float((model.per_sample_loss(batch).double() * w).sum())
                count += int(w.sum())
            result[name] = (total, count)
    return result


@pytest.mark.parametrize(("devices", "n_a", "n_b"), [(2, 23, 1), (3, 17, 40)])
def test_mixture_ddp_fit_finishes_and_each_source_is_exact(tmp_path: Path, devices: int, n_a: int, n_b: int) -> None:
    shardload.write(synthetic_samples(70, seed=1), tmp_path / "web", num_shards=4, progress=False)
    shardload.write(synthetic_samples(15, seed=2, median_tokens=60), tmp_path / "code", num_shards=2, progress=False)
    val = {"a": tmp_path / "va", "b": tmp_path / "vb"}
    shardload.write(synthetic_samples(n_a, seed=3), val["a"], num_shards=min(3, n_a), progress=False)
    shardload.write(synthetic_samples(n_b, seed=4), val["b"], num_shards=min(2, n_b), progress=False)
    out = tmp_path / "out"
    out.mkdir()
    argv = [str(tmp_path / "web"), str(tmp_path / "code"), str(val["a"]), str(val["b"]), str(out), str(devices)]
    res = run_with_watchdog(python(JOB, *argv), timeout=240)
    assert not res.hung, "the DDP run hung:\n" + res.tail()
    assert res.returncode == 0, res.tail()
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)]
    # Invariant: every rank ran the same number of training and validation batches
    assert len({r["train_batches"] for r in ranks}) == 1 and ranks[0]["train_batches"] > 0
    assert len({r["val_batches"] for r in ranks}) == 1
    # Invariant: exact evaluation — every sample of each validation set once, with its source
    ids = [i for r in ranks for i in r["val_ids"]]
    sources = [s for r in ranks for s in r["val_sources"]]
    assert sorted(ids) == list(range(n_a + n_b))
    assert all(s == (i >= n_a) for i, s in zip(ids, sources))
    # each set's loss, reduced with sync_dist=True, is the one computed over its samples in one process
    metrics = json.loads((out / "metrics.json").read_text())
    exact = exact_per_source(out / "model.pt", val, out)
    for name in NAMES:
        total, count = exact[name]
        assert int(metrics[f"{name}_count"]) == count
        assert abs(metrics[f"{name}_loss_sum"] - total) < 1e-4 * max(1.0, abs(total))
    # Invariant: ExactMean gives every rank the same per-source means, those of one process
    assert all(r["exact_mean"] == ranks[0]["exact_mean"] for r in ranks)
    assert ranks[0]["exact_counts"] == [exact[name][1] for name in NAMES]
    for name in NAMES:
        total, count = exact[name]
        assert ranks[0]["exact_mean"][f"val_loss/{name}"] == pytest.approx(total / count, rel=1e-5)
        assert metrics[f"val_loss/{name}"] == pytest.approx(total / count, rel=1e-5)  # logged to Lightning
    everything = sum(t for t, _ in exact.values()) / sum(c for _, c in exact.values())
    assert ranks[0]["exact_mean"]["val_loss"] == pytest.approx(everything, rel=1e-5)
    # training gave each source its weight of tokens (0.6 / 0.4), summed over the ranks
    tokens = [sum(r["train_tokens"][k] for r in ranks) for k in range(2)]
    assert abs(tokens[0] / sum(tokens) - 0.6) < 0.05, tokens
