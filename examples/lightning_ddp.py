"""Lightning DDP with the drop-in ShardDataModule and an exact validation loss.

Run it on CPU with two ranks on a tiny synthetic set (made on first use)::

    python examples/lightning_ddp.py --accelerator cpu --devices 2 --max-steps 20

on every GPU of the machine::

    python examples/lightning_ddp.py --accelerator gpu --devices -1

or on your own shard sets (made with ``shardload prepare``)::

    python examples/lightning_ddp.py --train sets/train --val sets/val --max-tokens 16384 --devices 4

The Trainer keeps its default flags (``use_distributed_sampler=True``
included). ``val_loss`` is exact: ``shardload.ExactMean`` adds each rank's
weighted loss sum and weight sum, reduces both over ranks (as sums, in
float64) and divides once per epoch, so filler rows (weight 0) and uneven
batch sizes do not bias it. ``--verify`` recomputes the loss in one process
over every validation sample and prints both numbers.
"""

from __future__ import annotations

import argparse
import json
import warnings

import lightning.pytorch as pl
import torch
from common import TinyClassifier, exact_loss, example_parser, tiny_sets

import shardload


class LitClassifier(pl.LightningModule):
    """A LightningModule whose training and validation weight every row by ``batch["weight"]``."""

    def __init__(self, lr: float = 3e-3) -> None:
        super().__init__()
        self.model = TinyClassifier()
        self.lr = lr
        self.val_loss = shardload.ExactMean("val_loss")

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        w = batch["weight"]
        loss = (self.model.per_sample_loss(batch) * w).sum() / w.sum().clamp(min=1)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        self.val_loss.reset()  # every validation starts from zero (the sanity check too)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.val_loss.update(self.model.per_sample_loss(batch), batch)  # weighted by batch["weight"]

    def on_validation_epoch_end(self) -> None:
        metrics = self.val_loss.compute()  # {"val_loss": ...}, reduced over the ranks: the same on every rank
        metrics["val_count"] = self.val_loss.totals().counts.sum()
        # Equal on every rank already: reduce_fx="max" keeps the values as they are, and Lightning does not warn.
        self.log_dict(metrics, prog_bar=True, sync_dist=True, reduce_fx="max")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of this example."""
    p = example_parser(__doc__)
    p.add_argument("--accelerator", default="auto", help="cpu, gpu, auto")
    p.add_argument("--devices", default="auto", help="device count, -1 for all, or auto")
    p.add_argument("--strategy", default="auto", help="ddp, ddp_spawn, fsdp, auto ...")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--max-epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--max-tokens", type=int, default=2048, help="token budget per batch")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--verify", action="store_true", help="check val_loss against a one-process computation")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    if args.train is None or args.val is None:
        # Runs before the Trainer starts the other ranks, and they find the set already made.
        train, val = tiny_sets(args.workdir, args.train_samples, args.val_samples)
        args.train, args.val = args.train or train, args.val or val
    devices: int | str = args.devices if args.devices == "auto" else int(args.devices)

    pl.seed_everything(0, verbose=False)
    dm = shardload.ShardDataModule(
        train=args.train, val=args.val, max_tokens=args.max_tokens, num_workers=args.num_workers
    )
    model = LitClassifier()
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=devices,
        strategy=args.strategy,
        num_nodes=args.num_nodes,
        max_epochs=args.max_epochs,
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, datamodule=dm)
    # One more validation with the final weights, so the check below compares like with like.
    metrics = trainer.validate(model, datamodule=dm, verbose=False)[0]
    if trainer.global_rank != 0:
        return
    report = {
        "world_size": trainer.world_size,
        "steps": trainer.global_step,
        "val_loss": metrics["val_loss"],
        "val_count": metrics["val_count"],
    }
    if args.verify:
        exact, count = exact_loss(model.model.cpu(), args.val, args.max_tokens)
        report.update(exact_val_loss=exact, exact_val_count=count)
    print("RESULT " + json.dumps(report) + "\n", end="", flush=True)  # one write: ranks share the output


if __name__ == "__main__":
    main()
