"""A plain-PyTorch job (no Lightning) launched with torchrun, used by the distributed tests.

usage::

    python -m torch.distributed.run --standalone --nproc_per_node 2 torchrun_job.py \
        --data SET --out DIR [--epochs 2] [--batch-size N | --max-tokens N] [--uneven split|pad|drop]
        [--stage train|val] [--num-workers K] [--stop-at EPOCH:STEPS] [--resume] [--report NAME]

Each rank trains a tiny model wrapped in ``DistributedDataParallel`` (gloo),
runs one explicit ``all_reduce`` per step on top of DDP's gradient all-reduce,
and writes ``OUT/REPORT_rank{r}.json`` with, per epoch, every batch it saw (sample ids
and weights) and the all-reduced count of real samples.

``--stop-at E:K`` saves ``OUT/ckpt_rank{r}.pt`` (the loader's ``state_dict()``)
after ``K`` training steps of epoch ``E`` and exits, as a preempted job would.
``--resume`` loads rank 0's checkpoint first (the loader state is the same on
every rank), in a fresh process group of any size, and runs the rest; its
report holds only the batches it ran itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from shardload.load.loader import make_loader
from shardload.plan import Batching


class TinyModel(torch.nn.Module):
    """Mean of token embeddings -> 7 label classes; enough to make DDP all-reduce gradients."""

    def __init__(self, vocab: int = 1000) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 8)
        self.head = torch.nn.Linear(8, 7)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = torch.arange(batch["tokens"].shape[1]) < batch["tokens_lengths"].unsqueeze(1)
        pooled = (self.emb(batch["tokens"].long()) * mask.unsqueeze(-1)).sum(1)
        pooled = pooled / batch["tokens_lengths"].clamp(min=1).unsqueeze(1)
        return torch.nn.functional.cross_entropy(self.head(pooled), batch["label"], reduction="none")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--uneven", choices=("split", "pad", "drop"), default="split")
    p.add_argument("--stage", choices=("train", "val"), default="train")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--stop-at", help="EPOCH:STEPS: checkpoint after STEPS steps of EPOCH and exit")
    p.add_argument("--resume", action="store_true", help="restore OUT/ckpt_rank0.pt before running")
    p.add_argument("--report", default="report", help="reports go to OUT/REPORT_rank{r}.json")
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")  # torchrun provides RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyModel())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = make_loader(
        args.data,
        stage=args.stage,
        batching=Batching(batch_size=args.batch_size, max_tokens=args.max_tokens, uneven=args.uneven),
        seed=3,
        num_workers=args.num_workers,
    )
    # Rank and world size must have come from torchrun's environment, not a default.
    assert (loader.plan_sampler.world.rank, loader.plan_sampler.world.world_size) == (rank, world)

    first_epoch = 0
    if args.resume:
        ckpt = torch.load(out / "ckpt_rank0.pt")
        loader.load_state_dict(ckpt["loader"])
        first_epoch = int(ckpt["loader"]["epoch"])
    stop_epoch, stop_steps = (int(x) for x in args.stop_at.split(":")) if args.stop_at else (-1, -1)

    report: dict[str, Any] = {"rank": rank, "world_size": world, "epochs": {}}
    for epoch in range(first_epoch, args.epochs):
        # After load_state_dict, set_epoch with the checkpoint's epoch keeps the resume point.
        loader.set_epoch(epoch)
        batches: list[dict[str, list[Any]]] = []
        real_total = 0
        for batch in loader:
            w = batch["weight"]
            loss = (model(batch) * w).sum() / w.sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            real = w.sum().reshape(1)
            dist.all_reduce(real)  # pairs up only if every rank runs this step
            real_total += int(real.item())
            batches.append({"ids": batch["sample_id"].tolist(), "weights": w.tolist()})
            # batches_done counts the epoch's steps from its start, a resumed start included.
            if epoch == stop_epoch and loader.batches_done == stop_steps:
                torch.save({"loader": loader.state_dict()}, out / f"ckpt_rank{rank}.pt")
                report["epochs"][str(epoch)] = {"batches": batches, "all_reduced_real": real_total}
                write_report(out / f"{args.report}_rank{rank}.json", report, stopped=True)
                finish()
        report["epochs"][str(epoch)] = {"batches": batches, "all_reduced_real": real_total}
    write_report(out / f"{args.report}_rank{rank}.json", report, stopped=False)
    finish()


def finish() -> NoReturn:
    """Leave the process group and exit without running native destructors.

    The reports are written by now. About one run in ten, torch+gloo 2.13 on
    CPU aborts in interpreter teardown *after* destroy_process_group returned
    ("terminate called without an active exception", SIGABRT), which would fail
    the run for a reason that has nothing to do with loading.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def write_report(path: Path, report: dict[str, Any], *, stopped: bool) -> None:
    report["stopped"] = stopped
    path.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
