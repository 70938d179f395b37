"""A Lightning DDP job (gloo on CPU) that stops mid-epoch with a checkpoint, or resumes from one.

usage: elastic_ddp_job.py TRAIN OUT_DIR DEVICES PHASE MODE [STOP_EPOCH:STOP_STEP]
PHASE "part": train until step STOP_STEP of epoch STOP_EPOCH, save OUT_DIR/mid.ckpt there and stop.
PHASE "resumed": ``trainer.fit(..., ckpt_path=OUT_DIR/mid.ckpt)`` on DEVICES ranks, to the end.
MODE "plain": TRAIN is a shard set, token budgets; "mixed-packed": TRAIN is two sets "A,B" mixed 1:1,
packed rows with pack_split.
Each rank writes OUT_DIR/PHASE_rank{r}.json: every training batch's real documents, per epoch, as
[sample_id, tokens] pairs (tokens: of the piece, for a cut sample).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

import shardload
from shardload.plan import Batching
from tests.distributed.ddp_job import Model

EPOCHS = 3
PACKED = Batching(packing=True, pack_length=128, rows_per_batch=2, pack_split=True)

if __name__ in ("__main__", "__mp_main__"):
    warnings.filterwarnings("ignore")


class Recorder(Model):
    """Records the real sample ids of each training batch, by epoch."""

    def __init__(self, out: Path) -> None:
        super().__init__(out)
        self.seen: dict[str, list[list[int]]] = {}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        real = batch["weight"] > 0
        docs = list(zip(batch["sample_id"][real].tolist(), batch["tokens_lengths"][real].tolist()))
        self.seen.setdefault(str(self.current_epoch), []).append(docs)
        if "features" in batch:
            return super().training_step(batch, batch_idx)
        return sum(p.sum() for p in self.parameters()) * 0.0  # packed token rows: only the data is under test


class StopAt(pl.Callback):
    """Saves a checkpoint after step ``step`` of epoch ``epoch`` and stops the run there."""

    def __init__(self, path: Path, epoch: int, step: int) -> None:
        self.path, self.epoch, self.step = path, epoch, step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.current_epoch == self.epoch and args[-1] + 1 == self.step:  # args[-1]: batch_idx
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def main() -> None:
    train, out, devices, phase, mode = sys.argv[1:6]
    out_dir = Path(out)
    torch.manual_seed(0)
    model = Recorder(out_dir)
    callbacks: list[pl.Callback] = []
    if phase == "part":
        epoch, step = map(int, sys.argv[6].split(":"))
        callbacks.append(StopAt(out_dir / "mid.ckpt", epoch, step))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(devices),
        strategy="ddp",
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    # the resumed job changes the number of worker processes too: only the batches' ranks matter
    workers = 1 if phase == "part" else 0
    if mode == "plain":
        dm = shardload.ShardDataModule(train=train, max_tokens=120, seed=5, num_workers=workers)
    else:
        a, b = train.split(",")
        mix = shardload.Mixture({"a": a, "b": b}, weights={"a": 1, "b": 1})
        dm = shardload.ShardDataModule(train=mix, batching=PACKED, seed=5, num_workers=workers)
    trainer.fit(model, datamodule=dm, ckpt_path=str(out_dir / "mid.ckpt") if phase == "resumed" else None)
    report = {"rank": trainer.global_rank, "world_size": trainer.world_size, "epochs": model.seen}
    (out_dir / f"{phase}_rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
