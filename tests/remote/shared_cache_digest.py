"""What the shared-cache job reads and how it records a batch, shared by the job and its test."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

#: the reads of each rank: name -> make_loader keywords (epoch 0 without workers, epoch 1 with two)
READS: dict[str, dict[str, Any]] = {
    "workers0": {"batch_size": 8, "epoch": 0, "num_workers": 0},
    "workers2": {"batch_size": 8, "epoch": 1, "num_workers": 2},
}


def digest(batch: dict[str, torch.Tensor]) -> str:
    """sha256 over each field's name, dtype, shape and bytes: equal digests, equal batches."""
    h = hashlib.sha256()
    for key in sorted(batch):
        t = batch[key].contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()
