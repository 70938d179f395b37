"""A plain-PyTorch evaluation (gloo, launched with torchrun) that reduces ``ExactMean`` over the ranks.

usage::

    python -m torch.distributed.run --standalone --nproc_per_node N metric_job.py A B OUT_DIR

Evaluates the dict ``{"a": A, "b": B}`` twice: padded batches (a token budget, ``uneven="pad"``, so
ranks that run out get filler rows) with one value per sample, and packed batches with one value per
token. Each rank writes ``OUT_DIR/rank{r}.json``: what ``compute()`` returned (float64, as JSON
floats), the real sample ids it saw, its filler rows and batch counts, and its own sums per source
added by hand, row by row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import shardload

SOURCES = ("a", "b")
PADDED = shardload.Batching(max_tokens=100, uneven="pad")
PACKED = shardload.Batching(packing=True, pack_length=32, rows_per_batch=2, pack_split=True)


def sample_value(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One float64 per sample, from its tokens (padding is 0, so the row sum is the sample's)."""
    return torch.log1p(batch["tokens"].double().sum(1)) + 1e-3 * batch["tokens_lengths"].double()


def token_value(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cos(batch["tokens"].double())


def main() -> None:
    a, b, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sets = {"a": a, "b": b}
    per_sample = shardload.ExactMean("sample", sources=sets)
    ids: list[int] = []
    fillers, batches = 0, 0
    own = {name: [0.0, 0.0] for name in SOURCES}  # this rank's sum and count per source, by hand
    for batch in shardload.make_loader(sets, stage="val", batching=PADDED, fields=("tokens",)):
        values = sample_value(batch)
        per_sample.update(values, batch)
        for v, w, k, sid in zip(values, batch["weight"], batch["source"], batch["sample_id"], strict=True):
            if w > 0:
                own[SOURCES[int(k)]][0] += float(v)
                own[SOURCES[int(k)]][1] += 1
                ids.append(int(sid))
            else:
                fillers += 1
        batches += 1
    per_token = shardload.ExactMean("token", sources=sets)
    packed_batches = 0
    for batch in shardload.make_loader(sets, stage="val", batching=PACKED, fields=("tokens",)):
        per_token.update(token_value(batch), batch)
        packed_batches += 1
    record = {
        "computed": {k: float(v) for k, v in (per_sample.compute() | per_token.compute()).items()},
        "counts": per_sample.totals().counts.tolist() + per_token.totals().counts.tolist(),
        "ids": ids,
        "fillers": fillers,
        "batches": batches,
        "packed_batches": packed_batches,
        "own": own,
    }
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
