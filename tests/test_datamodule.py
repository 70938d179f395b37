"""ShardDataModule with a real Lightning Trainer (single process; multi-process runs live in tests/distributed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

import shardload
from shardload.integrations.datamodule import ShardDataModule
from shardload.load.loader import PlanSampler
from shardload.testing import synthetic_samples

# Scoped to this module's tests by pytest: the tiny loaders here use few workers on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:.*does not have many workers")


class TinyModel(pl.LightningModule):
    """Predicts the label from mean-pooled features; records what it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.train_ids: list[list[int]] = []
        self.val_ids: list[int] = []

    def per_sample_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = batch["features_lengths"].clamp(min=1).unsqueeze(-1).float()
        pooled = batch["features"].sum(1) / rows
        return (self.lin(pooled).squeeze(-1) - batch["label"].float()) ** 2

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.train_ids.append(batch["sample_id"].tolist())
        w = batch["weight"]
        return (self.per_sample_loss(batch) * w).sum() / w.sum().clamp(min=1)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        w = batch["weight"]
        self.val_ids.extend(batch["sample_id"][w > 0].tolist())
        self.log(
            "val_loss_sum",
            (self.per_sample_loss(batch) * w).sum(),
            reduce_fx="sum",
            sync_dist=True,
            on_step=False,
            on_epoch=True,
        )
        self.log("val_weight_sum", w.sum(), reduce_fx="sum", sync_dist=True, on_step=False, on_epoch=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(tmp_path: Path, **kw: object) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **kw,
    )  # type: ignore[arg-type]


@pytest.fixture
def sets(tmp_path: Path) -> tuple[Path, Path]:
    shardload.write(synthetic_samples(120, seed=1), tmp_path / "train", num_shards=4)
    shardload.write(synthetic_samples(37, seed=2), tmp_path / "val", num_shards=3)
    return tmp_path / "train", tmp_path / "val"


def test_fit_with_default_trainer_flags_keeps_our_sampler(tmp_path: Path, sets: tuple[Path, Path]) -> None:
    train, val = sets
    dm = ShardDataModule(train=train, val=val, batch_size=8, num_workers=0)
    model = TinyModel()
    t = trainer(tmp_path, max_epochs=2, enable_checkpointing=False)
    t.fit(model, datamodule=dm)
    assert isinstance(t.train_dataloader.sampler, PlanSampler)
    # Every training sample once per epoch, and a new order in epoch 2.
    per_epoch = len(model.train_ids) // 2
    e0 = sorted(i for b in model.train_ids[:per_epoch] for i in b)
    e1 = sorted(i for b in model.train_ids[per_epoch:] for i in b)
    assert e0 == e1 == list(range(120))
    assert model.train_ids[:per_epoch] != model.train_ids[per_epoch:]


def test_validation_loss_is_exact(tmp_path: Path, sets: tuple[Path, Path]) -> None:
    train, val = sets
    dm = ShardDataModule(train=train, val=val, max_tokens=64, num_workers=0)
    model = TinyModel()
    t = trainer(tmp_path, max_epochs=1, enable_checkpointing=False, limit_train_batches=0)
    t.validate(model, datamodule=dm)
    logged = float(t.callback_metrics["val_loss_sum"]) / float(t.callback_metrics["val_weight_sum"])
    ds = shardload.open(val)
    with torch.no_grad():
        exact = []
        for i in range(len(ds)):
            s = ds[i]
            feats = torch.from_numpy(np.array(s["features"]))
            pred = model.lin(feats.mean(0, keepdim=True)).squeeze()
            exact.append(float((pred - float(s["label"])) ** 2))
    # Invariant: exact evaluation — every validation sample counted once
    assert sorted(model.val_ids) == list(range(37))
    assert abs(logged - float(np.mean(exact))) < 1e-5


def test_predict_and_test_stages(tmp_path: Path, sets: tuple[Path, Path]) -> None:
    train, val = sets

    class Pred(TinyModel):
        def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return batch["sample_id"][batch["weight"] > 0]

        def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
            self.val_ids.extend(batch["sample_id"][batch["weight"] > 0].tolist())

    dm = ShardDataModule(train=train, test=val, predict=val, batch_size=5, num_workers=0)
    model = Pred()
    out = trainer(tmp_path).predict(model, datamodule=dm)
    assert sorted(torch.cat(out).tolist()) == list(range(37))
    trainer(tmp_path).test(model, datamodule=dm)
    assert sorted(model.val_ids) == list(range(37))


def test_mid_epoch_checkpoint_resumes_with_the_remaining_batches(tmp_path: Path, sets: tuple[Path, Path]) -> None:
    train, _ = sets
    ckpt_dir = tmp_path / "ckpt"
    cb = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=3, save_top_k=-1)
    full = TinyModel()
    trainer(tmp_path, max_epochs=2, callbacks=[cb]).fit(
        full, datamodule=ShardDataModule(train=train, batch_size=8, num_workers=2, seed=5)
    )
    steps_per_epoch = len(full.train_ids) // 2
    # Resume from a checkpoint in the middle of the second epoch.
    step = steps_per_epoch + 3 - (steps_per_epoch % 3) if steps_per_epoch % 3 else steps_per_epoch + 3
    ckpt = ckpt_dir / f"epoch=1-step={step}.ckpt"
    assert ckpt.exists(), sorted(p.name for p in ckpt_dir.iterdir())
    resumed = TinyModel()
    trainer(tmp_path, max_epochs=2).fit(
        resumed, datamodule=ShardDataModule(train=train, batch_size=8, num_workers=2, seed=5), ckpt_path=ckpt
    )
    # Invariant: resumability — exactly the batches the uninterrupted run had left
    assert resumed.train_ids == full.train_ids[step:]


def test_a_resume_whose_optimizers_read_the_stepping_estimate_keeps_the_remaining_batches(
    tmp_path: Path, sets: tuple[Path, Path]
) -> None:
    # configure_optimizers reading estimated_stepping_batches (a OneCycleLR) makes Lightning ask for the training
    # loader before it restores its loops: the loader is made at epoch 0 and the checkpoint's epoch comes later
    train, _ = sets

    class Scheduled(TinyModel):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
            total = int(self.trainer.estimated_stepping_batches)
            cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=total)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": cycle, "interval": "step"}}

    ckpt_dir = tmp_path / "ckpt"
    cb = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=4, save_top_k=-1)
    options = {"train": train, "max_tokens": 300, "num_workers": 0, "seed": 5}
    full = Scheduled()
    trainer(tmp_path, max_epochs=3, callbacks=[cb]).fit(full, datamodule=ShardDataModule(**options))
    per_epoch = len(full.train_ids) // 3
    step = next(s for s in range(4, 3 * per_epoch, 4) if s // per_epoch == 2 and s % per_epoch)
    resumed = Scheduled()
    trainer(tmp_path, max_epochs=3).fit(
        resumed, datamodule=ShardDataModule(**options), ckpt_path=ckpt_dir / f"epoch=2-step={step}.ckpt"
    )
    # Invariant: exactly the batches the uninterrupted run had left (the loader waited for the trainer's epoch)
    assert resumed.train_ids == full.train_ids[step:]
