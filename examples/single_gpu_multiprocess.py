"""Several ranks on one GPU (or on the CPU) with the gloo backend: distributed code paths, cheaply.

A real multi-GPU job is the wrong place to find out that validation hangs or
that a metric counts samples twice. This example starts ``--ranks`` processes
on one machine, all on the same device, joined by gloo (NCCL refuses two ranks
on one GPU; gloo does not mind), and runs the same DDP training and exact
validation as a real job: the same plans, the same collectives, the same
equal step counts.

    python examples/single_gpu_multiprocess.py --ranks 4                 # CPU
    python examples/single_gpu_multiprocess.py --ranks 3 --device cuda   # 3 ranks share cuda:0
    python examples/single_gpu_multiprocess.py --ranks 2 --train sets/train --val sets/val

Each rank prints its step and batch counts; the script fails if they differ
or if the validation count is not the number of validation samples.
"""

from __future__ import annotations

import argparse
import json
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from common import TinyClassifier, example_parser, leave_process_group, tiny_sets
from torch.nn.parallel import DistributedDataParallel

import shardload


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of this example."""
    p = example_parser(__doc__)
    p.add_argument("--ranks", type=int, default=2, help="processes to start on this one device")
    p.add_argument("--device", default="cpu", help="cpu or cuda (all ranks use cuda:0)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=-1, help="steps per epoch at most (-1: the whole epoch)")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--num-workers", type=int, default=0, help="loader workers per rank (0 is gentlest here)")
    return p


def run_rank(rank: int, args: argparse.Namespace, port: int) -> None:
    """One rank: join the group, train, validate exactly, check the counts."""
    world = args.ranks
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    torch.set_num_threads(1)  # the ranks share the machine's cores
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyClassifier().to(device), device_ids=[0] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    # Explicit rank and world size: spawned processes have no RANK / WORLD_SIZE in their environment.
    common = {"rank": rank, "world_size": world, "max_tokens": args.max_tokens, "num_workers": args.num_workers}
    train_loader = shardload.make_loader(args.train, **common)
    val_loader = shardload.make_loader(args.val, stage="val", **common)

    steps = 0
    for epoch in range(args.epochs):
        train_loader.set_epoch(epoch)
        for i, batch in enumerate(train_loader):
            if i == args.max_steps:
                break
            batch = {k: v.to(device) for k, v in batch.items()}
            w = batch["weight"]
            loss = (model(batch) * w).sum() / w.sum().clamp(min=1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1

    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, weight sum, batches
    with torch.no_grad():
        for batch in val_loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            w = batch["weight"]
            sums += torch.stack([(model(batch) * w).sum().double(), w.sum().double(), torch.ones((), device=device)])
    mine = (steps, int(sums[2]))
    dist.all_reduce(sums)
    counts: list[tuple[int, int]] = [(0, 0)] * world
    dist.all_gather_object(counts, mine)
    # One write per line (end="" with the newline inside): ranks share stdout, and with unbuffered
    # output print() writes the text and the newline separately, so lines could interleave.
    print(f"rank {rank}/{world}: {steps} train steps, {mine[1]} val batches\n", end="", flush=True)
    if rank == 0:
        if len(set(counts)) != 1:
            raise SystemExit(f"ranks ran different numbers of steps/batches: {counts}")
        n_val = len(shardload.open(args.val))
        if int(sums[1]) != n_val:
            raise SystemExit(f"validation counted {int(sums[1])} samples, the set has {n_val}")
        result = {
            "world_size": world,
            "device": str(device),
            "steps": steps,
            "val_loss": float(sums[0] / sums[1]),
            "val_count": int(sums[1]),
        }
        print("RESULT " + json.dumps(result) + "\n", end="", flush=True)
    leave_process_group()


def free_port() -> int:
    """A TCP port nobody listens on right now, for the rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible; use --device cpu")
    if args.train is None or args.val is None:
        train, val = tiny_sets(args.workdir, args.train_samples, args.val_samples)  # once, before the ranks start
        args.train, args.val = args.train or train, args.val or val
    mp.start_processes(run_rank, args=(args, free_port()), nprocs=args.ranks, start_method="spawn")


if __name__ == "__main__":
    main()
