"""A Lightning DDP job (gloo, default Trainer flags) over a training mixture and two validation sets.

usage: mix_ddp_job.py WEB CODE VAL_A VAL_B OUT_DIR DEVICES

Training reads ``Mixture({"web": WEB, "code": CODE}, weights 0.6 / 0.4)``; validation reads the dict
``{"a": VAL_A, "b": VAL_B}`` and logs one exact loss per validation set with ``sync_dist=True`` at every
step, and with ``shardload.ExactMean(sources=...)`` at the epoch's end. Each rank writes what it saw
and what ``ExactMean`` computed to ``OUT_DIR/rank{r}.json``; rank 0 writes the logged metrics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

import shardload
from tests.distributed.ddp_job import Model

NAMES = ("a", "b")


class MixModel(Model):
    """The distributed tests' model, with one loss sum and count per validation source."""

    def __init__(self, out: Path) -> None:
        super().__init__(out)
        self.train_batches = 0
        self.train_tokens = [0, 0]
        self.val_sources: list[int] = []
        self.val_loss = shardload.ExactMean("val_loss", sources=NAMES)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.train_batches += 1
        real = batch["weight"] > 0
        for k in range(2):
            self.train_tokens[k] += int(batch["tokens_lengths"][real & (batch["source"] == k)].sum())
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        w = batch["weight"]
        self.val_ids += batch["sample_id"][w > 0].tolist()
        self.val_sources += batch["source"][w > 0].tolist()
        self.val_batches += 1
        loss = self.per_sample_loss(batch)
        self.val_loss.update(loss, batch)
        for k, name in enumerate(NAMES):
            mine = w * (batch["source"] == k)
            for on_step in (True, False):
                kw = {"on_step": on_step, "on_epoch": not on_step, "sync_dist": True, "reduce_fx": "sum"}
                suffix = "_step" if on_step else ""
                self.log(f"{name}_loss_sum{suffix}", (loss * mine).sum(), **kw)
                self.log(f"{name}_count{suffix}", mine.sum(), **kw)

    def on_validation_epoch_start(self) -> None:
        self.val_loss.reset()

    def on_validation_epoch_end(self) -> None:
        computed = self.val_loss.compute()
        self.log_dict(computed, sync_dist=True, reduce_fx="max")
        record = {
            "exact_mean": {k: float(v) for k, v in computed.items()},
            "exact_counts": self.val_loss.totals().counts.tolist(),
            "val_ids": self.val_ids,
            "val_sources": self.val_sources,
            "val_batches": self.val_batches,
            "train_batches": self.train_batches,
            "train_tokens": self.train_tokens,
        }
        (self.out / f"rank{self.trainer.global_rank}.json").write_text(json.dumps(record))
        self.val_ids, self.val_sources, self.val_batches = [], [], 0


def main() -> None:
    web, code, val_a, val_b, out, devices = sys.argv[1:7]
    out_dir = Path(out)
    torch.manual_seed(0)
    model = MixModel(out_dir)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(devices),
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    train = shardload.Mixture({"web": web, "code": code}, weights={"web": 0.6, "code": 0.4})
    dm = shardload.ShardDataModule(train=train, val={"a": val_a, "b": val_b}, max_tokens=96, num_workers=1)
    trainer.fit(model, datamodule=dm)
    if trainer.global_rank == 0:
        torch.save(model.state_dict(), out_dir / "model.pt")
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        (out_dir / "metrics.json").write_text(json.dumps(metrics))


if __name__ == "__main__":
    main()
