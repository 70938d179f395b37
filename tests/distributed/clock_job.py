"""Lightning DDP runs (gloo on CPU) that record the trainer's clock against the loader's epochs.

usage: clock_job.py CONFIG.json

CONFIG: ``{"out": DIR, "devices": N, "runs": [RUN, ...]}``; the runs are fitted one after another in the
same processes. RUN: ``name``; ``train`` (a set directory, or ``{"a": DIR, "b": DIR}``: a 0.7/0.3
mixture by tokens); ``val`` (a set directory); ``batching`` (``Batching`` keywords); ``trainer``
(``Trainer`` keywords, e.g. ``val_check_interval``); optional ``onecycle`` (an ``OneCycleLR`` over
``trainer.estimated_stepping_batches``), ``stop`` (``[epoch, step]``: save ``DIR/NAME.ckpt`` after that
training step and stop), ``resume`` (a checkpoint to resume from), ``num_workers`` (default 0).

Each rank writes ``DIR/NAME_rank{r}.json``: every event in order (epoch starts with the trainer's batch
count and the progress bar's total, training steps with the real documents, validations with a digest
of the parameters they saw and the logged sums, epoch ends with the digest of the parameters), the
stepping estimate and the final global step. Rank 0 saves the model each validation saw as
``DIR/NAME_val{k}.pt``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

import shardload
from tests.distributed.elastic_ddp_job import StopAt

if __name__ in ("__main__", "__mp_main__"):
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("error", category=shardload.plan.EpochLengthWarning)  # no epoch held by leaving out

VOCAB = 16


def token_weights(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token weight of a padded or packed batch: 1 on a real document's tokens, 0 on padding and filler."""
    tokens, weight = batch["tokens"], batch["weight"]
    if "document_ids" in batch:  # packed: [R, P] document of each token, -1 on padding
        docs = batch["document_ids"].long()
        return torch.where(docs >= 0, weight[docs.clamp(min=0)], torch.zeros((), dtype=weight.dtype))
    positions = torch.arange(tokens.shape[1]).unsqueeze(0)
    return (positions < batch["tokens_lengths"].unsqueeze(1)).to(weight.dtype) * weight.unsqueeze(1)


class ClockModel(pl.LightningModule):
    """A per-token model (the loss of a token depends on the token alone, so any batching sums alike)."""

    def __init__(self, record: list[dict[str, Any]], onecycle: bool) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 8)
        self.head = torch.nn.Linear(8, VOCAB)
        self.record = record
        self.onecycle = onecycle
        self.val_sums = torch.zeros(2, dtype=torch.float64)

    def token_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss sum, weight sum)`` over the batch's real tokens."""
        tokens = batch["tokens"].long()
        logits = self.head(self.emb(tokens))
        target = (tokens * 3 + 1) % VOCAB
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1), reduction="none")
        w = token_weights(batch).reshape(-1)
        return (loss * w).sum(), w.sum()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        real = batch["weight"] > 0
        docs = [[int(i), int(n)] for i, n in zip(batch["sample_id"][real], batch["tokens_lengths"][real])]
        self.record.append(
            {
                "ev": "step",
                "epoch": self.current_epoch,
                "batch_idx": batch_idx,
                "global_step": self.global_step,
                "docs": docs,
            }
        )
        total, count = self.token_loss(batch)
        return total / count.clamp(min=1)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        estimate = self.trainer.estimated_stepping_batches
        self.record.append({"ev": "estimate", "value": float(estimate)})
        if not self.onecycle:
            return optimizer
        cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=int(estimate))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": cycle, "interval": "step"}}

    def on_validation_epoch_start(self) -> None:
        self.val_sums = torch.zeros(2, dtype=torch.float64)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        total, count = self.token_loss(batch)
        self.val_sums += torch.stack([total, count]).double().detach()
        self.log("val_loss_sum", total, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="sum")
        self.log("val_tokens", count, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="sum")


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    for p in model.parameters():
        h.update(p.detach().double().numpy().tobytes())
    return h.hexdigest()


class Clock(pl.Callback):
    """Records the trainer's clock: epoch starts, validations, epoch ends."""

    def __init__(self, record: list[dict[str, Any]], out: Path, name: str) -> None:
        self.record, self.out, self.name, self.validations = record, out, name, 0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.record.append(
            {
                "ev": "epoch_start",
                "epoch": trainer.current_epoch,
                "num_training_batches": trainer.num_training_batches,
                "val_check_batch": trainer.val_check_batch,
                "loader_len": len(trainer.train_dataloader),
            }
        )

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        bar = getattr(trainer.progress_bar_callback, "train_progress_bar", None)
        if bar is not None and self.record[-1]["ev"] == "step":
            self.record[-1]["bar_total"] = bar.total

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if trainer.global_rank == 0:
            torch.save(pl_module.state_dict(), self.out / f"{self.name}_val{self.validations}.pt")
        self.record.append(
            {
                "ev": "val",
                "epoch": trainer.current_epoch,
                "global_step": trainer.global_step,
                "params": digest(pl_module),
                "k": self.validations,
            }
        )
        self.validations += 1

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        m = trainer.callback_metrics
        self.record[-1 - next(i for i, e in enumerate(reversed(self.record)) if e["ev"] == "val")].update(
            logged=[float(m["val_loss_sum"]), float(m["val_tokens"])],
            mine=[float(v) for v in pl_module.val_sums],  # type: ignore[union-attr]
        )

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.record.append({"ev": "epoch_end", "epoch": trainer.current_epoch, "params": digest(pl_module)})


def fit(run: dict[str, Any], out: Path, devices: int) -> None:
    torch.manual_seed(0)
    record: list[dict[str, Any]] = []
    model = ClockModel(record, bool(run.get("onecycle")))
    train: Any = run["train"]
    if isinstance(train, dict):
        train = shardload.Mixture(train, weights={"a": 0.7, "b": 0.3})
    dm = shardload.ShardDataModule(
        train=train,
        val=run["val"],
        batching=shardload.Batching(**run["batching"]),
        seed=3,
        num_workers=run.get("num_workers", 0),
    )
    # the tqdm bar whatever is installed (Lightning picks rich's when rich is importable): the records read its total
    callbacks: list[pl.Callback] = [Clock(record, out, run["name"]), pl.callbacks.TQDMProgressBar()]
    if "stop" in run:
        epoch, batch_idx = run["stop"]
        callbacks.append(StopAt(out / f"{run['name']}.ckpt", epoch, batch_idx + 1))  # after that many steps
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp",
        logger=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=out,
        callbacks=callbacks,
        **run["trainer"],
    )
    trainer.fit(model, datamodule=dm, ckpt_path=run.get("resume"))
    record.append({"ev": "end", "global_step": trainer.global_step})
    (out / f"{run['name']}_rank{trainer.global_rank}.json").write_text(json.dumps(record))


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    out = Path(config["out"])
    for run in config["runs"]:
        fit(run, out, int(config["devices"]))


if __name__ == "__main__":
    main()
