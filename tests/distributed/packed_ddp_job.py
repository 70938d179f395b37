"""A Lightning DDP job on CPU (gloo) that trains and validates on packed batches.

usage: packed_ddp_job.py TRAIN VAL OUT_DIR DEVICES PACK_LENGTH ROWS_PER_BATCH

The model is ``examples/packed_lm.py``'s tiny causal LM. Every rank writes
``OUT_DIR/rank{r}.json`` once the run is over: the validation documents it
saw with their loss sums and counts, its batch count, and the weighted sums
all-reduced over ranks. Rank 0 also writes the logged metrics and the model.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch

import shardload

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from packed_lm import TinyCausalLM, lm_samples

if __name__ in ("__main__", "__mp_main__"):
    warnings.filterwarnings("ignore")

VOCAB = 64
__all__ = ["VOCAB", "PackedModel", "lm_samples"]


class PackedModel(pl.LightningModule):
    """The causal LM; validation logs the weighted sums with ``sync_dist=True`` and records what it saw."""

    def __init__(self, pack_length: int) -> None:
        super().__init__()
        self.lm = TinyCausalLM(vocab=VOCAB, max_length=pack_length, width=16, heads=2, layers=1)
        self.docs: dict[int, list[float]] = {}  # sample id -> [loss sum, predicted tokens]
        self.val_batches = 0
        self.reduced: list[float] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        s, c = self.lm(batch)
        w = batch["weight"]
        return (s * w).sum() / (c * w).sum().clamp(min=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)

    def on_validation_epoch_start(self) -> None:
        self.docs, self.val_batches = {}, 0
        self.sums = torch.zeros(3, dtype=torch.float64)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        s, c = self.lm(batch)
        w = batch["weight"]
        for i, sid in enumerate(batch["sample_id"].tolist()):
            if w[i] > 0:
                assert sid not in self.docs, f"sample {sid} twice on one rank"
                self.docs[sid] = [float(s[i]), float(c[i])]
        self.val_batches += 1
        step = torch.stack([(s * w).sum(), (c * w).sum(), w.sum()]).double()
        self.sums += step
        for on_step in (True, False):
            kw = {"on_step": on_step, "on_epoch": not on_step, "sync_dist": True, "reduce_fx": "sum"}
            suffix = "_step" if on_step else ""
            self.log("val_loss_sum" + suffix, step[0], **kw)
            self.log("val_tokens" + suffix, step[1], **kw)
            self.log("val_docs" + suffix, step[2], **kw)

    def on_validation_epoch_end(self) -> None:
        # The exact recipe by hand: reduce the sums and the weights, divide once.
        self.reduced = self.trainer.strategy.reduce(self.sums, reduce_op="sum").tolist()


def main() -> None:
    train, val, out, devices, pack_length, rows = sys.argv[1:7]
    out_dir = Path(out)
    torch.manual_seed(0)
    model = PackedModel(int(pack_length))
    batching = shardload.Batching(packing=True, pack_length=int(pack_length), rows_per_batch=int(rows))
    dm = shardload.ShardDataModule(train=train, val=val, batching=batching, num_workers=1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=int(devices), strategy="ddp", max_epochs=1, default_root_dir=out_dir
    )
    trainer.fit(model, datamodule=dm)
    rank = trainer.global_rank
    record = {"docs": model.docs, "val_batches": model.val_batches, "reduced": model.reduced, "finished": True}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record))
    if rank == 0:
        torch.save(model.state_dict(), out_dir / "model.pt")
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        (out_dir / "metrics.json").write_text(json.dumps(metrics))


if __name__ == "__main__":
    main()
