"""A plain-PyTorch FSDP job (``fully_shard``, gloo on CPU) launched with torchrun, used by test_fsdp.py.

usage::

    python -m torch.distributed.run --standalone --nproc_per_node 2 fsdp_job.py \
        --data SET --out DIR [--split shardload|unequal]

Lightning's ``strategy="fsdp"`` refuses CPU, so this job uses PyTorch's own
FSDP directly: the model's two layers and the model itself are wrapped with
``torch.distributed.fsdp.fully_shard``, so each rank holds a shard of every
parameter, and every forward all-gathers the full parameters from every rank
(training and validation alike). A rank with one batch more than another
would wait in that all-gather for ever.

``--split shardload`` (the default) trains one epoch and validates through
:func:`~shardload.make_loader` (one loader worker each, persistent by
default). ``--split unequal`` validates on a hand-written split that gives
rank 0 two batches more, the failure the plan prevents: it must not finish.

Each rank writes ``OUT/report_rank{r}.json``: its training and validation
batches (sample ids and weights), the validation sums it all-reduced (float64:
weighted loss, weight), its local shard sizes; rank 0 also saves the full
trained weights to ``OUT/model.pt``.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import shardload
from shardload.load.loader import make_loader
from tests.distributed.ddp_job import fetching_loader
from tests.distributed.torchrun_job import TinyModel, finish, write_report

TRAIN_BATCH = 9
VAL_BATCH = 7


def unequal_val_loader(path: str, rank: int, world: int) -> Any:
    """Every ``world``-th sample from ``rank``, and rank 0 two batches more: what a hand-written split risks."""
    ids = list(range(rank, len(shardload.open(path)), world)) + (list(range(2 * VAL_BATCH)) if rank == 0 else [])
    return fetching_loader(path, [ids[i : i + VAL_BATCH] for i in range(0, len(ids), VAL_BATCH)], None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--split", choices=("shardload", "unequal"), default="shardload")
    p.add_argument("--timeout", type=float, default=120, help="seconds a collective may wait for its partner")
    args = p.parse_args()
    # A collective left without its partner fails after this long instead of waiting for 30 minutes.
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    torch.manual_seed(0)
    model = TinyModel()
    for layer in (model.emb, model.head):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    report: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        # every parameter is a DTensor of which this rank holds one shard
        "local_numel": sum(p.to_local().numel() for p in model.parameters()),  # type: ignore[attr-defined]
        "full_numel": sum(p.numel() for p in model.parameters()),
    }

    train_batches: list[dict[str, list[Any]]] = []
    if args.split == "shardload":
        train = make_loader(args.data, batch_size=TRAIN_BATCH, seed=3, num_workers=1)
        model.train()
        for batch in train:
            w = batch["weight"]
            loss = (model(batch) * w).sum() / w.sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()  # reduce-scatters the gradients: every rank must run this step
            opt.step()
            train_batches.append({"ids": batch["sample_id"].tolist(), "weights": w.tolist()})
        val: Any = make_loader(args.data, stage="val", batch_size=VAL_BATCH, num_workers=1)
    else:
        val = unequal_val_loader(args.data, rank, world)
    report["train"] = train_batches
    print(f"rank {rank}: validating {len(val)} batches", flush=True)

    val_batches: list[dict[str, list[Any]]] = []
    sums = torch.zeros(2, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for batch in val:
            w = batch["weight"]
            per_sample = model(batch)  # all-gathers every parameter from every rank
            sums += torch.stack([(per_sample.double() * w.double()).sum(), w.double().sum()])
            val_batches.append({"ids": batch["sample_id"].tolist(), "weights": w.tolist()})
    report["val"] = val_batches
    report["val_sums_local"] = sums.tolist()
    dist.all_reduce(sums)
    report["val_sums"] = sums.tolist()
    full = {name: tensor.full_tensor() for name, tensor in model.state_dict().items()}  # a collective too
    if rank == 0:
        torch.save(full, out / "model.pt")
    write_report(out / f"report_rank{rank}.json", report, stopped=False)
    finish()


if __name__ == "__main__":
    main()
