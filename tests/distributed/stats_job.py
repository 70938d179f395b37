"""A 2-rank Lightning DDP job (gloo, CPU) whose rank 1 builds its batches slowly: the loader stats it logs.

usage: stats_job.py TRAIN OUT_DIR SLOW_SECONDS
Rank 0 writes what the CSVLogger got (OUT_DIR/csv) and the LoaderBottleneckWarnings it caught
(OUT_DIR/warnings.json).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.loggers import CSVLogger

import shardload
import shardload.load.stats as stats_module
from shardload.load.dataset import ShardBatchDataset
from shardload.load.stats import LoaderBottleneckWarning


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.lin(batch["label"].float().unsqueeze(-1)).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(train: str, out: Path, slow: float) -> None:
    stats_module.BOTTLENECK_MIN_SECONDS = 0.0  # 10 steps of 0.05 s: judged, though far under a real run's floor
    warnings.filterwarnings("ignore")
    warnings.simplefilter("always", LoaderBottleneckWarning)
    build = ShardBatchDataset.__getitem__

    def slow_on_rank_1(self: ShardBatchDataset, key: Any) -> Any:
        if dist.is_initialized() and dist.get_rank() == 1:
            time.sleep(slow)
        return build(self, key)

    ShardBatchDataset.__getitem__ = slow_on_rank_1  # type: ignore[method-assign]
    dm = shardload.ShardDataModule(train=train, batch_size=4, num_workers=0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=CSVLogger(out, name="csv", version=0),
        log_every_n_steps=2,
        max_epochs=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=out,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LoaderBottleneckWarning)
        trainer.fit(Model(), datamodule=dm)
    if trainer.is_global_zero:
        found = [str(w.message) for w in caught if issubclass(w.category, LoaderBottleneckWarning)]
        (out / "warnings.json").write_text(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]))
