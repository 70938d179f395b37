"""A Lightning DDP job on CPU (gloo) used by the distributed tests.

usage: ddp_job.py TRAIN VAL OUT_DIR DEVICES STRATEGY MODE
MODE: "shardload" (ShardDataModule), "unequal" (a hand-written split that gives ranks different
batch counts) or "distributed_sampler" (a plain DataLoader that Lightning wraps in a DistributedSampler)
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader

import shardload

if __name__ in ("__main__", "__mp_main__"):
    # Run as the job, or as one of its spawned ranks: the process is the job's own. A test that imports
    # Model from here keeps its warning filters.
    warnings.filterwarnings("ignore")


class Model(pl.LightningModule):
    """Mean-pooled features -> the 7 synthetic labels; records which samples validation saw, per rank."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 7)
        self.out = out
        self.val_ids: list[int] = []
        self.val_batches = 0

    def per_sample_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = batch["features_lengths"].clamp(min=1).unsqueeze(1).float()
        logits = self.head(batch["features"].sum(1) / rows)
        return torch.nn.functional.cross_entropy(logits, batch["label"], reduction="none")

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        w = batch["weight"]
        return (self.per_sample_loss(batch) * w).sum() / w.sum().clamp(min=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=3e-3)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        w = batch["weight"]
        self.val_ids += batch["sample_id"][w > 0].tolist()
        self.val_batches += 1
        loss_sum = (self.per_sample_loss(batch) * w).sum()
        for on_step in (True, False):
            kw = {"on_step": on_step, "on_epoch": not on_step, "sync_dist": True}
            suffix = "_step" if on_step else ""
            self.log("val_loss_sum" + suffix, loss_sum, reduce_fx="sum", **kw)
            self.log("val_count" + suffix, w.sum(), reduce_fx="sum", **kw)

    def on_validation_epoch_end(self) -> None:
        rank = self.trainer.global_rank
        (self.out / f"rank{rank}.json").write_text(
            json.dumps({"val_ids": self.val_ids, "val_batches": self.val_batches})
        )
        self.val_ids, self.val_batches = [], 0


def fetching_loader(path: str, keys: list[list[int]] | list[int], batch_size: int | None) -> DataLoader:
    """A plain DataLoader that reads shardload samples by id, as hand-written pipelines do."""
    data = shardload.make_loader(path, rank=0, world_size=1, stage="val", batch_size=4).dataset

    def fetch(k: list[int] | int) -> dict[str, torch.Tensor]:
        ids = np.atleast_1d(np.asarray(k, dtype=np.int64))
        arrays = data.fetch(ids, np.ones(len(ids), dtype=np.float32))
        return {key: torch.from_numpy(v) for key, v in arrays.items()}

    return DataLoader(keys, batch_size=batch_size, collate_fn=fetch)  # type: ignore[arg-type]


def unequal_split(path: str, rank: int, world: int) -> DataLoader:
    """A hand-written per-rank split where rank 0 gets two batches more than the others."""
    n = len(shardload.open(path))
    ids = list(range(rank, n, world)) + (list(range(8)) if rank == 0 else [])
    return fetching_loader(path, [ids[i : i + 4] for i in range(0, len(ids), 4)], None)


def main() -> None:
    train, val, out, devices, strategy, mode = sys.argv[1:7]
    out_dir = Path(out)
    torch.manual_seed(0)
    model = Model(out_dir)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(devices),
        strategy=strategy,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    if mode == "shardload":
        dm = shardload.ShardDataModule(train=train, val=val, max_tokens=96, num_workers=1)
        trainer.fit(model, datamodule=dm)
    elif mode == "unequal":
        # Users of hand-written splits turn Lightning's sampler off, as its docs advise.
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=int(devices),
            strategy=strategy,
            logger=False,
            use_distributed_sampler=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.validate(model, dataloaders=unequal_split(val, trainer.global_rank, trainer.world_size))
    else:  # "distributed_sampler": all ids, batch size 4; Lightning injects a DistributedSampler
        n = len(shardload.open(val))
        trainer.validate(model, dataloaders=fetching_loader(val, list(range(n)), 4))
    if trainer.global_rank == 0:
        m = {k: float(v) for k, v in trainer.callback_metrics.items()}
        torch.save(model.state_dict(), out_dir / "model.pt")
        (out_dir / "metrics.json").write_text(json.dumps(m))


if __name__ == "__main__":
    main()
