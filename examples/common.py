"""Helpers the examples share: a tiny synthetic shard set and a tiny model.

Not an example by itself. The examples import it as ``common`` (Python puts
the script's own folder on ``sys.path``), so run them from anywhere as
``python examples/NAME.py``; with your own data, pass ``--train`` / ``--val``
and the synthetic set is never made.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

import shardload
from shardload.testing import synthetic_samples

#: where the examples put their synthetic sets unless told otherwise; a fixed path, so that
#: every rank of a job (and Lightning's re-launched ranks) finds the same set
DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "shardload-examples"


def ensure_tiny_set(path: Path, num_samples: int, *, seed: int) -> Path:
    """Write a synthetic shard set of ``num_samples`` samples at ``path`` unless it is already there.

    Call it from one process per machine (before the ranks start, or on local
    rank 0 followed by a barrier): two writers into one directory conflict.
    """
    if (path / "manifest.json").exists():
        if len(shardload.open(path)) == num_samples:
            return path
        shardload.write(synthetic_samples(num_samples, seed=seed), path, num_shards=4, overwrite=True)
        return path
    shardload.write(synthetic_samples(num_samples, seed=seed), path, num_shards=4)
    return path


def tiny_sets(workdir: Path, train_samples: int, val_samples: int) -> tuple[Path, Path]:
    """A train and a val set under ``workdir`` (made on first use)."""
    train = ensure_tiny_set(workdir / f"train-{train_samples}", train_samples, seed=1)
    val = ensure_tiny_set(workdir / f"val-{val_samples}", val_samples, seed=2)
    return train, val


class TinyClassifier(torch.nn.Module):
    """Mean-pooled token embeddings -> class logits; stands in for a real model.

    :meth:`per_sample_loss` returns one loss per row, so callers can weight it
    by ``batch["weight"]`` (1.0 real sample, 0.0 filler).
    """

    def __init__(self, vocab: int = 1000, classes: int = 7, width: int = 32) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(width, classes))

    def per_sample_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Cross-entropy per row, shape ``[B]``; padding tokens are masked out of the mean."""
        tokens, lengths = batch["tokens"], batch["tokens_lengths"]
        mask = torch.arange(tokens.shape[1], device=tokens.device) < lengths.unsqueeze(1)
        pooled = (self.emb(tokens.long()) * mask.unsqueeze(-1)).sum(1) / lengths.clamp(min=1).unsqueeze(1)
        return torch.nn.functional.cross_entropy(self.head(pooled), batch["label"], reduction="none")

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.per_sample_loss(batch)


def exact_loss(model: TinyClassifier, path: Path, max_tokens: int) -> tuple[float, int]:
    """The mean loss over every sample of ``path`` once, computed in this one process."""
    loader = shardload.make_loader(path, rank=0, world_size=1, stage="val", max_tokens=max_tokens)
    total, count = 0.0, 0.0
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            w = batch["weight"].double()
            total += float((model.per_sample_loss(batch).double() * w).sum())
            count += float(w.sum())
    return total / max(count, 1.0), int(count)


def leave_process_group() -> None:
    """Destroy the process group, then exit this process at once (exit code 0).

    With torch 2.13's gloo backend on CPU, about one run in ten aborts during
    interpreter shutdown after training has finished ("terminate called without
    an active exception", SIGABRT): gloo worker threads still hold finished work
    whose tensors are released after Python is gone. Leaving with ``os._exit``
    once everything is written skips that teardown.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
