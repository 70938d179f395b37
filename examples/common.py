"""Helpers the examples share: a tiny synthetic shard set and a tiny model.

Not an example by itself. The examples import it as ``common`` (Python puts
the script's own folder on ``sys.path``), so run them from anywhere as
``python examples/NAME.py``; with your own data, pass ``--train`` / ``--val``
and the synthetic set is never made.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import shardload
from shardload.testing import synthetic_samples

#: where the examples put their synthetic sets unless told otherwise; a fixed path, so that
#: every rank of a job (and Lightning's re-launched ranks) finds the same set
DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "shardload-examples"


def example_parser(doc: str | None, *, train_samples: int = 400) -> argparse.ArgumentParser:
    """An example's argument parser with the data options every example takes.

    ``--train`` / ``--val`` name your shard sets; without them a synthetic set
    of ``--train-samples`` / ``--val-samples`` is made under ``--workdir``.
    """
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", type=Path, help="train shard set (default: a tiny synthetic one)")
    p.add_argument("--val", type=Path, help="validation shard set (default: a tiny synthetic one)")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="where the synthetic sets go")
    p.add_argument("--train-samples", type=int, default=train_samples)
    p.add_argument("--val-samples", type=int, default=101, help="odd on purpose: it does not divide by 2 ranks")
    return p


def ensure_set(path: Path, num_samples: int, make: Callable[[], Iterable[dict[str, np.ndarray]]]) -> Path:
    """Write the samples ``make()`` returns as a shard set at ``path``, unless a set of ``num_samples`` is there.

    Call it from one process per machine (before the ranks start, or on local
    rank 0 followed by a barrier): two writers into one directory conflict.
    """
    if (path / "manifest.json").exists():
        if len(shardload.open(path)) == num_samples:
            return path
        shardload.write(make(), path, num_shards=4, overwrite=True)
        return path
    shardload.write(make(), path, num_shards=4)
    return path


def ensure_tiny_set(path: Path, num_samples: int, *, seed: int) -> Path:
    """A synthetic set of ``num_samples`` samples (:func:`shardload.testing.synthetic_samples`) at ``path``."""
    return ensure_set(path, num_samples, lambda: synthetic_samples(num_samples, seed=seed))


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


def setup_distributed(backend: str | None) -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes (if any); return rank, world size and this rank's device."""
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend or ("nccl" if use_cuda else "gloo"))
    return dist.get_rank(), dist.get_world_size(), torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")


def all_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few numbers over all ranks (a no-op in a single process)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


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
