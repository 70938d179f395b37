"""A tiny causal language model trained on packed batches: documents end to end, no attention across them.

One process on CPU, on a small synthetic token set (made on first use)::

    python examples/packed_lm.py

two ranks (gloo), or every GPU of one machine::

    torchrun --standalone --nproc_per_node 2 examples/packed_lm.py
    torchrun --standalone --nproc_per_node 8 examples/packed_lm.py --train sets/train --val sets/val \\
        --pack-length 4096 --rows-per-batch 4

With ``Batching(packing=True, pack_length=P, rows_per_batch=R)`` every batch
is ``R`` rows of ``P`` tokens, each row several samples ("documents") laid end
to end (docs/loading.md, "Packed batches"). Three things make a packed model
equal to one that sees each document alone:

* attention stays inside a document: here the boolean block-diagonal causal
  mask that ``shardload.document_causal_mask`` builds from
  ``batch["document_ids"]`` for ``F.scaled_dot_product_attention``
  (``shardload.document_block_mask`` is the same for FlexAttention);
* positions restart at every document: the position embedding reads
  ``batch["position_ids"]``, not ``arange(P)``;
* the next-token loss only pairs tokens of one document (no target across a
  document boundary or into padding), and each document counts with
  ``batch["weight"]`` (0.0 for filler) (:meth:`TinyCausalLM.forward`).

On a GPU with FlashAttention, the mask is not needed: flatten the rows and
pass the sequence boundaries the batch carries (``cu_seqlens`` covers every
token, padding tails included, so every output position is written)::

    from flash_attn import flash_attn_varlen_func

    cu = batch["cu_seqlens"]              # int32 [E + 1 + k], on the GPU
    max_seqlen = int(batch["max_seqlen"])  # read on the CPU (or pass P, always a valid bound)
    # q, k, v: [R * P, heads, head_dim], the R rows of P tokens flattened
    out = flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True)
    out = out.reshape(R, P, heads * head_dim)

The ``RESULT`` line reports the mean training loss of the first and last
epoch, the exact validation loss before and after training (``shardload.ExactMean``:
weighted sums reduced over ranks, divided once), the mean over validation
documents of each one's loss, how many times each training sample was seen
per epoch over all ranks, real tokens per second and the fill (real tokens /
``R * P``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import all_sum, ensure_set, example_parser, leave_process_group, setup_distributed
from torch.nn.parallel import DistributedDataParallel

import shardload
from shardload.testing import long_tailed_lengths

Batch = dict[str, torch.Tensor]


def lm_samples(n: int, *, seed: int, vocab: int = 64, max_length: int = 64) -> list[dict[str, np.ndarray]]:
    """``n`` learnable token sequences: ``tokens[i + 1] = tokens[i] + step (mod vocab)``, step 1..3 per sample.

    The first token and the step are random, so a model needs the two previous
    tokens of the same document to predict the next one. Lengths are long-tailed
    in ``[1, max_length]``.
    """
    rng = np.random.default_rng(seed)
    lengths = long_tailed_lengths(n, median=max_length / 4, low=1, high=max_length, seed=seed)
    out = []
    for length in lengths:
        start, step = int(rng.integers(0, vocab)), int(rng.integers(1, 4))
        out.append({"tokens": ((start + step * np.arange(int(length))) % vocab).astype(np.int32)})
    return out


class Block(torch.nn.Module):
    """Pre-norm transformer block: masked self-attention with SDPA, then an MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        r, p, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(r, p, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [R, H, P, D]
        x = x + self.proj(att.transpose(1, 2).reshape(r, p, width))
        return x + self.mlp(self.norm2(x))


class TinyCausalLM(torch.nn.Module):
    """Token + position embeddings, a few :class:`Block`, a vocabulary head; it reads the token field ``field``."""

    def __init__(
        self,
        vocab: int = 64,
        max_length: int = 64,
        width: int = 32,
        heads: int = 2,
        layers: int = 2,
        field: str = "tokens",
    ):
        super().__init__()
        self.field = field
        self.tok = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Embedding(max_length, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def logits(self, batch: Batch) -> torch.Tensor:
        """Logits ``[R, P, vocab]`` of a packed batch."""
        x = self.tok(batch[self.field].long()) + self.pos(batch["position_ids"])  # positions restart per document
        mask = shardload.document_causal_mask(batch["document_ids"])  # [R, 1, P, P]: within documents
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token loss summed per document, and the number of predicted tokens per document (both ``[E]``).

        A pair (token, next token) counts only if both are in the same
        document: never across a document boundary, never into padding.
        """
        logits = self.logits(batch)
        tokens, doc = batch[self.field], batch["document_ids"]
        pair = (doc[:, 1:] == doc[:, :-1]) & (doc[:, 1:] >= 0)  # [R, P-1]
        token_loss = F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:].long(), reduction="none")
        e = len(batch["sample_id"])
        owner = doc[:, :-1][pair].long()
        loss_sum = torch.zeros(e, device=logits.device).index_add_(0, owner, token_loss[pair])
        count = (batch[f"{self.field}_lengths"] - 1).clamp(min=0).to(loss_sum.dtype)
        return loss_sum, count


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of this example."""
    p = example_parser(__doc__, train_samples=600)
    p.add_argument("--vocab", type=int, default=64, help="vocabulary size of the model (and the synthetic set)")
    p.add_argument("--pack-length", type=int, default=64, help="tokens per packed row")
    p.add_argument("--rows-per-batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--backend", default=None, help="nccl or gloo (default: nccl with CUDA, else gloo)")
    return p


def evaluate(model: TinyCausalLM, loader: Iterable[Batch], device: torch.device) -> dict[str, float]:
    """Exact means over every validation document once, whatever the ranks and the filler documents."""
    per_token = shardload.ExactMean("val_loss")  # mean next-token loss over every predicted token
    per_document = shardload.ExactMean("val_document_loss")  # mean over documents of each one's mean
    model.eval()
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            s, c = model(batch)  # per document: summed token losses, predicted tokens
            per_token.update(s, batch, counts=c)
            per_document.update(s / c.clamp(min=1), batch)
    model.train()
    result = {k: float(v) for k, v in (per_token.compute() | per_document.compute()).items()}  # on every rank
    result["val_count"] = float(per_document.totals().counts.sum())  # documents seen over all ranks
    return result


def times_seen(ids: list[int], num_samples: int) -> list[int]:
    """How many times each training sample was seen this epoch, over all ranks: ``[min, max]``."""
    counts = np.bincount(np.asarray(ids, dtype=np.int64), minlength=num_samples)
    if dist.is_initialized():
        t = torch.from_numpy(counts)
        dist.all_reduce(t)  # gloo on CPU tensors; with NCCL, move it to the GPU first
        counts = t.numpy()
    return [int(counts.min()), int(counts.max())]


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    rank, world, device = setup_distributed(args.backend)
    if args.train is None or args.val is None:

        def make(name: str, n: int, seed: int) -> Path:
            path = args.workdir / f"lm-{name}-{n}-{args.vocab}-{args.pack_length}"
            return ensure_set(path, n, lambda: lm_samples(n, seed=seed, vocab=args.vocab, max_length=args.pack_length))

        if rank == 0:  # one writer (the synthetic sets are on one machine), the others wait
            make("train", args.train_samples, 1), make("val", args.val_samples, 2)
        if dist.is_initialized():
            dist.barrier()
        args.train = args.train or make("train", args.train_samples, 1)
        args.val = args.val or make("val", args.val_samples, 2)

    torch.manual_seed(0)
    lm = TinyCausalLM(vocab=args.vocab, max_length=args.pack_length).to(device)
    model: torch.nn.Module = lm
    if dist.is_initialized():
        model = DistributedDataParallel(lm, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    batching = shardload.Batching(packing=True, pack_length=args.pack_length, rows_per_batch=args.rows_per_batch)
    options = shardload.LoaderOptions(num_workers=args.num_workers, pin_memory=device.type == "cuda")
    train_loader = shardload.make_loader(args.train, batching=batching, loader_options=options)
    val_loader = shardload.make_loader(args.val, stage="val", batching=batching, loader_options=options)
    num_train = len(shardload.open(args.train))

    val_before = evaluate(lm, val_loader, device)
    epoch_losses, seen, steps, real_tokens, slots, seconds = [], [], 0, 0.0, 0.0, 0.0
    train_loss = shardload.ExactMean("train_loss")
    for epoch in range(args.epochs):
        train_loader.set_epoch(epoch)
        ids: list[int] = []
        train_loss.reset()
        start = time.perf_counter()
        for batch in train_loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            w = batch["weight"]
            ids += batch["sample_id"][w > 0].tolist()
            s, c = model(batch)  # through DDP's forward, so that backward all-reduces the gradients
            # Mean over this batch's predicted tokens; filler documents (weight 0) count for nothing.
            loss = (s * w).sum() / (c * w).sum().clamp(min=1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
            train_loss.update(s, batch, counts=c)  # detached inside; no synchronisation with the device
            real_tokens += float((batch["tokens_lengths"] * w).sum())
            slots += batch["tokens"].numel()
        seconds += time.perf_counter() - start
        epoch_losses.append(float(train_loss.compute()["train_loss"]))  # reduced over ranks
        seen.append(times_seen(ids, num_train))
        if rank == 0:
            print(f"epoch {epoch}: train loss {epoch_losses[-1]:.4f}, step {steps}", flush=True)

    val_after = evaluate(lm, val_loader, device)
    tokens, total_slots = all_sum([real_tokens, slots], device)
    if rank == 0:
        result = {
            "world_size": world,
            "steps": steps,
            "train_loss_first": epoch_losses[0],
            "train_loss_last": epoch_losses[-1],
            "val_loss_before": val_before["val_loss"],
            "val_loss": val_after["val_loss"],
            "val_document_loss": val_after["val_document_loss"],
            "val_count": int(val_after["val_count"]),
            "uniform_loss": math.log(args.vocab),
            "times_seen": seen,
            "tokens_per_s": tokens / max(seconds, 1e-9),
            "fill": tokens / max(total_slots, 1.0),
        }
        print("RESULT " + json.dumps(result) + "\n", end="", flush=True)  # one write: ranks share the output
    leave_process_group()


if __name__ == "__main__":
    main()
