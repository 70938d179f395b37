"""Packed batches in a real Lightning DDP run (gloo on CPU, two ranks, default Trainer flags), under a watchdog.

Claims tested: the run finishes on every rank (each rank's own record, not
only the launcher's exit code), every validation document is seen exactly
once over the ranks, and the validation loss reduced over ranks (logged with
``sync_dist=True``, and all-reduced by hand) equals the loss computed in one
process over the whole validation set, document by document.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import shardload
from tests.distributed.packed_ddp_job import VOCAB, PackedModel, lm_samples
from tests.distributed.watchdog import python, run_with_watchdog

JOB = str(Path(__file__).with_name("packed_ddp_job.py"))
PACK_LENGTH, ROWS = 32, 4
pytestmark = pytest.mark.slow


def lm_set(path: Path, n: int, seed: int) -> Path:
    shardload.write(lm_samples(n, seed=seed, vocab=VOCAB, max_length=PACK_LENGTH), path, num_shards=min(3, n))
    return path


def one_process_documents(model_path: Path, val: Path) -> dict[int, list[float]]:
    """Each validation document's loss sum and token count, from one process over the whole set."""
    model = PackedModel(PACK_LENGTH)
    model.load_state_dict(torch.load(model_path))
    model.eval()
    batching = shardload.Batching(packing=True, pack_length=PACK_LENGTH, rows_per_batch=ROWS)
    loader = shardload.make_loader(val, rank=0, world_size=1, stage="val", batching=batching)
    docs: dict[int, list[float]] = {}
    with torch.no_grad():
        for batch in loader:
            s, c = model.lm(batch)
            for i, sid in enumerate(batch["sample_id"].tolist()):
                if batch["weight"][i] > 0:
                    docs[sid] = [float(s[i]), float(c[i])]
    return docs


@pytest.mark.parametrize("n_val", [37, 1], ids=["val_37_on_2_ranks", "val_1_fewer_rows_than_ranks"])
def test_packed_ddp_validation_is_exact(tmp_path: Path, n_val: int) -> None:
    train = lm_set(tmp_path / "train", 90, seed=1)
    val = lm_set(tmp_path / "val", n_val, seed=2)
    out = tmp_path / "out"
    out.mkdir()
    res = run_with_watchdog(python(JOB, str(train), str(val), str(out), "2", str(PACK_LENGTH), str(ROWS)), timeout=240)
    assert not res.hung, "the packed DDP run hung:\n" + res.tail()
    assert res.returncode == 0, res.tail()
    # Each rank says it finished (the launcher can exit 0 when a rank crashed).
    ranks: list[dict[str, Any]] = []
    for r in range(2):
        record = out / f"rank{r}.json"
        assert record.exists(), f"rank {r} left no record:\n" + res.tail()
        ranks.append(json.loads(record.read_text()))
    assert all(r["finished"] for r in ranks)
    # Invariant: every rank ran the same number of validation batches
    assert len({r["val_batches"] for r in ranks}) == 1
    # Invariant: exact evaluation — every validation document exactly once across ranks
    seen = [int(sid) for r in ranks for sid in r["docs"]]
    assert sorted(seen) == list(range(n_val))

    exact = one_process_documents(out / "model.pt", val)
    assert sorted(exact) == list(range(n_val))
    for r in ranks:
        for sid, (loss_sum, count) in r["docs"].items():
            # A document's loss does not depend on what else its row holds, nor on the rank.
            assert count == exact[int(sid)][1]
            assert loss_sum == pytest.approx(exact[int(sid)][0], rel=1e-5, abs=1e-5)
    total = sum(s for s, _ in exact.values())
    tokens = sum(c for _, c in exact.values())
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["val_docs"], metrics["val_tokens"]) == (n_val, tokens)
    assert metrics["val_loss_sum"] / metrics["val_tokens"] == pytest.approx(total / tokens, rel=1e-5)
    # The hand-made all-reduce gives every rank the same totals
    for r in ranks:
        assert r["reduced"] == pytest.approx([total, tokens, n_val], rel=1e-5)
