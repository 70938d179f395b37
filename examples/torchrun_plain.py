"""Plain PyTorch + torchrun (no Lightning): DDP training, exact validation, resumable checkpoints.

Two ranks on CPU (gloo) with a tiny synthetic set made on first use::

    torchrun --standalone --nproc_per_node 2 examples/torchrun_plain.py --max-steps 20

every GPU of one machine (NCCL), your own shard sets::

    torchrun --standalone --nproc_per_node 8 examples/torchrun_plain.py \\
        --train sets/train --val sets/val --max-tokens 16384 --num-workers 4

several machines: see ``examples/slurm_multinode.sbatch``. Without torchrun it
runs as a single process. With ``--checkpoint FILE`` it saves the model, the
optimiser and the loader state every ``--save-every`` steps (one file per
rank) and resumes from them when the files exist: the resumed epoch sees
exactly the batches the interrupted one had left.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.distributed as dist
from common import TinyClassifier, all_sum, example_parser, leave_process_group, setup_distributed, tiny_sets
from torch.nn.parallel import DistributedDataParallel

import shardload


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of this example."""
    p = example_parser(__doc__)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps in all (-1: no limit)")
    p.add_argument("--max-tokens", type=int, default=2048, help="token budget per batch")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--backend", default=None, help="nccl or gloo (default: nccl with CUDA, else gloo)")
    p.add_argument("--checkpoint", type=Path, help="checkpoint prefix; one file per rank: PREFIX.rank{r}.pt")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--debug", action="store_true", help="check across ranks that every rank has the same plan")
    return p


def validate(
    model: torch.nn.Module, loader: Iterable[dict[str, torch.Tensor]], device: torch.device
) -> tuple[float, int]:
    """Exact mean loss over every validation sample once: sum and count reduced separately."""
    model.eval()
    loss_sum, count = 0.0, 0.0
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            w = batch["weight"]  # 0.0 on filler rows: they count for nothing
            loss_sum += float((model(batch) * w).sum())
            count += float(w.sum())
    model.train()
    total, n = all_sum([loss_sum, count], device)
    return total / max(n, 1.0), int(n)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    rank, world, device = setup_distributed(args.backend)
    if args.train is None or args.val is None:
        # One writer per machine, the others wait for it (a node-local temp dir on every node).
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            tiny_sets(args.workdir, args.train_samples, args.val_samples)
        if dist.is_initialized():
            dist.barrier()
        train, val = tiny_sets(args.workdir, args.train_samples, args.val_samples)
        args.train, args.val = args.train or train, args.val or val

    torch.manual_seed(0)
    model: torch.nn.Module = TinyClassifier().to(device)
    if dist.is_initialized():
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    pin = device.type == "cuda"
    # Rank and world size come from torchrun's environment (RANK / WORLD_SIZE).
    train_loader = shardload.make_loader(
        args.train,
        max_tokens=args.max_tokens,
        loader_options=shardload.LoaderOptions(num_workers=args.num_workers, pin_memory=pin, debug=args.debug),
    )
    val_loader = shardload.make_loader(
        args.val,
        stage="val",
        max_tokens=args.max_tokens,
        loader_options=shardload.LoaderOptions(pin_memory=pin, debug=args.debug),
    )

    step, first_epoch = 0, 0
    ckpt_file = Path(f"{args.checkpoint}.rank{rank}.pt") if args.checkpoint else None
    if ckpt_file is not None and ckpt_file.exists():
        ckpt = torch.load(ckpt_file, map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        train_loader.load_state_dict(ckpt["loader"])
        step, first_epoch = ckpt["step"], ckpt["loader"]["epoch"]
        if rank == 0:
            print(f"resumed at epoch {first_epoch}, step {step}", flush=True)

    val_loss, val_count = float("nan"), 0
    for epoch in range(first_epoch, args.epochs):
        train_loader.set_epoch(epoch)  # keeps a resume point restored for this epoch
        for batch in train_loader:
            if step == args.max_steps:
                break
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            w = batch["weight"]
            loss = (model(batch) * w).sum() / w.sum().clamp(min=1)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP's gradient all-reduce: every rank has the same number of steps
            opt.step()
            step += 1
            if ckpt_file is not None and step % args.save_every == 0:
                state = {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "loader": train_loader.state_dict(),
                    "step": step,
                }
                torch.save(state, ckpt_file)
        val_loss, val_count = validate(model, val_loader, device)
        if rank == 0:
            print(f"epoch {epoch}: step {step}, val_loss {val_loss:.5f} over {val_count} samples", flush=True)
        if step == args.max_steps:
            break

    if rank == 0:
        result = {"world_size": world, "steps": step, "val_loss": val_loss, "val_count": val_count}
        print("RESULT " + json.dumps(result) + "\n", end="", flush=True)  # one write: ranks share the output
    leave_process_group()


if __name__ == "__main__":
    main()
