"""The job behind ``shardload demo``: synthetic data -> prepare -> inspect/verify -> plan -> DDP training.

Private to the ``demo`` command, and outside the library's import graph (it
loads torch and Lightning). Everything it writes goes to the config's work
directory; it leaves the process's warning filters and Lightning's log level
as it found them.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

import shardload
from shardload._base.ranges import offsets_from_lengths
from shardload.cli._demo_config import DemoConfig
from shardload.testing import long_tailed_lengths


# -- data -----------------------------------------------------------------------------------------
def generate_sources(cfg: DemoConfig) -> tuple[list[Path], Path]:
    """Parquet files for train and a JSON Lines file for val, long-tailed lengths, deterministic."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = cfg.workdir / "sources"
    src.mkdir(parents=True, exist_ok=True)
    parts = 4
    train_files = [src / f"train-{k:02d}.parquet" for k in range(parts)]
    val_file = src / "val.jsonl"
    stamp = src / "DONE.json"
    want = {"train": cfg.train_samples, "val": cfg.val_samples, "channels": cfg.channels, "seed": cfg.seed}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return train_files, val_file
    rng = np.random.default_rng(cfg.seed)

    def columns(n: int, seed: int) -> dict[str, Any]:
        tok_len = long_tailed_lengths(n, median=64, sigma=0.9, low=4, high=1024, seed=seed)
        rows = long_tailed_lengths(n, median=12, sigma=0.8, low=1, high=256, seed=seed + 1)
        tok_off = offsets_from_lengths(tok_len)
        row_off = offsets_from_lengths(rows)
        tokens = rng.integers(0, 5000, size=int(tok_off[-1]), dtype=np.int32)
        feats = rng.standard_normal((int(row_off[-1]), cfg.channels), dtype=np.float32)
        # The label depends on the data, so the model has something to learn.
        label = (np.add.reduceat(feats[:, 0], row_off[:-1]) > 0).astype(np.int64)
        return {"tok_off": tok_off, "tokens": tokens, "row_off": row_off, "feats": feats, "label": label}

    per = -(-cfg.train_samples // parts)
    for k, path in enumerate(train_files):
        n = min(per, cfg.train_samples - k * per)
        c = columns(n, seed=cfg.seed + 10 + k)
        inner = pa.FixedSizeListArray.from_arrays(pa.array(c["feats"].reshape(-1)), cfg.channels)
        table = pa.table(
            {
                "tokens": pa.LargeListArray.from_arrays(pa.array(c["tok_off"]), pa.array(c["tokens"])),
                "features": pa.LargeListArray.from_arrays(pa.array(c["row_off"]), inner),
                "label": pa.array(c["label"]),
            }
        )
        pq.write_table(table, path)
    c = columns(cfg.val_samples, seed=cfg.seed + 99)
    with open(val_file, "w") as fh:
        for i in range(cfg.val_samples):
            t = c["tokens"][c["tok_off"][i] : c["tok_off"][i + 1]]
            f = c["feats"][c["row_off"][i] : c["row_off"][i + 1]]
            fh.write(
                json.dumps({"tokens": t.tolist(), "features": np.round(f, 4).tolist(), "label": int(c["label"][i])})
            )
            fh.write("\n")
    stamp.write_text(json.dumps(want))
    return train_files, val_file


# -- model ----------------------------------------------------------------------------------------
class DemoModel(pl.LightningModule):
    """Mean-pooled token embeddings + mean-pooled features -> 2 classes; logs the exact validation loss."""

    def __init__(self, channels: int, vocab: int = 5000) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 32)
        self.feat = torch.nn.Linear(channels, 32)
        self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(64, 2))
        self.samples_seen = 0
        self.val_loss = shardload.ExactMean("val_loss")

    def per_sample_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        tok_mask = torch.arange(batch["tokens"].shape[1]) < batch["tokens_lengths"].unsqueeze(1)
        tok = (self.emb(batch["tokens"].long()) * tok_mask.unsqueeze(-1)).sum(1)
        tok = tok / batch["tokens_lengths"].clamp(min=1).unsqueeze(1)
        rows = batch["features_lengths"].clamp(min=1).unsqueeze(1).float()
        feat = self.feat(batch["features"].sum(1) / rows)
        logits = self.head(torch.cat([tok, feat], dim=1))
        return torch.nn.functional.cross_entropy(logits, batch["label"], reduction="none")

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        w = batch["weight"]
        self.samples_seen += int((w > 0).sum())
        return (self.per_sample_loss(batch) * w).sum() / w.sum().clamp(min=1)

    def on_validation_epoch_start(self) -> None:
        self.val_loss.reset()  # also after the sanity check

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        # shardload.ExactMean: weighted sums and counts, reduced over ranks as sums once; filler rows add nothing
        self.val_loss.update(self.per_sample_loss(batch), batch)
        self.log("val_batches", torch.tensor(1.0), reduce_fx="sum", sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        sums, counts = self.val_loss.totals()  # the same on every rank: "max" keeps them as they are
        metrics = {"val_loss": sums[0] / counts[0].clamp(min=1), "val_count": counts[0]}
        self.log_dict(metrics, sync_dist=True, reduce_fx="max")

    def on_train_epoch_end(self) -> None:
        self.log("train_samples", torch.tensor(float(self.samples_seen)), reduce_fx="sum", sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def exact_val_loss(model: Any, val: Path, max_tokens: int) -> tuple[float, int]:
    """The validation loss over every sample once, in this one process."""
    loader = shardload.make_loader(val, rank=0, world_size=1, stage="val", max_tokens=max_tokens)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in loader:
            w = batch["weight"]
            total += float((model.per_sample_loss(batch).double() * w.double()).sum())
            count += int(w.sum())
    return total / max(count, 1), count


# -- the job --------------------------------------------------------------------------------------
def run_demo(cfg: DemoConfig, *, progress: bool | None = None, out: Any = print) -> dict[str, Any]:
    """Run the whole demo and return its report (also printed through ``out``)."""
    from shardload.plan import Batching, EpochSpec, summarize_plan

    t0 = time.perf_counter()
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    out(f"shardload {shardload.__version__} demo in {cfg.workdir}")
    train_files, val_file = generate_sources(cfg)
    out(
        f"[1/5] sources: {len(train_files)} Parquet files ({cfg.train_samples} samples), "
        f"{val_file.name} ({cfg.val_samples} samples)"
    )

    sets = cfg.workdir / "sets"
    prep_train = shardload.prepare(
        [str(p) for p in train_files],
        sets / "train",
        workers=cfg.workers,
        num_shards=8,
        overwrite=True,
        progress=progress,
    )
    prep_val = shardload.prepare(
        str(val_file),
        sets / "val",
        num_shards=3,
        overwrite=True,
        progress=progress,
        dtypes={"tokens": "int32"},
        shuffle=False,
    )
    out(
        f"[2/5] prepare: train {prep_train.samples} samples in {prep_train.shards} shards "
        f"({prep_train.bytes / 1e6:.1f} MB, {prep_train.samples_per_s:.0f} samples/s); "
        f"val {prep_val.samples} samples in {prep_val.shards} shards"
    )

    from shardload.sets.describe import describe
    from shardload.sets.verify import verify

    info = describe(sets / "train")
    report = verify(sets / "train")
    q = info.get("lengths", {})
    out(f"[3/5] inspect: fields {[(f['name'], f['dtype'], f['shape']) for f in info['fields']]}; length quantiles {q}")
    out(f"      verify: {'ok' if report.ok else 'PROBLEMS: ' + str(report.problems)}")

    train_set = shardload.open(sets / "train")
    spec = EpochSpec(world_size=cfg.devices)
    bucketed = summarize_plan(train_set.plan_inputs(), spec, Batching(max_tokens=cfg.max_tokens))
    random = summarize_plan(train_set.plan_inputs(), spec, Batching(max_tokens=cfg.max_tokens, bucketing=False))
    out(
        f"[4/5] plan for {cfg.devices} ranks, max_tokens={cfg.max_tokens}: batches per rank "
        f"{[bucketed.num_batches] * cfg.devices} (before equalising: {bucketed.rank_batch_counts.tolist()}); "
        f"padding waste {bucketed.padding_fraction:.1%} with "
        f"bucketing vs {random.padding_fraction:.1%} without"
    )

    fit = train_ddp(cfg, sets / "train", sets / "val")
    out(
        f"[5/5] DDP fit on {cfg.devices} CPU processes (gloo): {fit['train_samples']:.0f} training samples in "
        f"{fit['seconds']:.1f} s ({fit['train_samples'] / fit['seconds']:.0f} samples/s incl. start-up); "
        f"{fit['val_batches']:.0f} validation batches"
    )
    out(
        f"      validation loss (sync_dist, {fit['val_count']:.0f} samples) = {fit['val_loss']:.6f}; "
        f"exact single-process loss = {fit['exact_loss']:.6f} over {fit['exact_count']} samples; "
        f"{'EXACT' if fit['exact'] else 'MISMATCH'}"
    )
    result = {
        "train": prep_train.to_json(),
        "val": prep_val.to_json(),
        "verify_ok": report.ok,
        "batches_per_rank": [bucketed.num_batches] * cfg.devices,
        "padding_bucketed": bucketed.padding_fraction,
        "padding_random": random.padding_fraction,
        "fit": fit,
        "seconds": time.perf_counter() - t0,
    }
    out(f"done in {result['seconds']:.0f} s")
    return result


def train_ddp(cfg: DemoConfig, train: Path, val: Path) -> dict[str, Any]:
    """One epoch of Lightning DDP (spawned processes, gloo on CPU) with validation."""
    torch.manual_seed(cfg.seed)
    model = DemoModel(cfg.channels)
    dm = shardload.ShardDataModule(train=train, val=val, max_tokens=cfg.max_tokens, num_workers=1, seed=cfg.seed)
    with _quiet_lightning():
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=cfg.devices,
            strategy="ddp_spawn" if cfg.devices > 1 else "auto",
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        t0 = time.perf_counter()
        trainer.fit(model, datamodule=dm)
        seconds = time.perf_counter() - t0
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    val_loss = m["val_loss"]
    exact, count = exact_val_loss(model, val, cfg.max_tokens)
    return {
        "seconds": seconds,
        "train_samples": m.get("train_samples", float("nan")),
        "val_loss": val_loss,
        "val_count": m["val_count"],
        "val_batches": m["val_batches"],
        "exact_loss": exact,
        "exact_count": count,
        "exact": abs(val_loss - exact) < 1e-5 and int(m["val_count"]) == count,
    }


@contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Lightning's advice that does not apply to the demo (one loader worker on purpose), silenced while it trains.

    Scoped, so that a program that calls ``shardload.cli.main(["demo"])`` keeps
    its own warning filters and log levels.
    """
    logger = logging.getLogger("lightning.pytorch")
    old_level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*does not have many workers.*")
            yield
    finally:
        logger.setLevel(old_level)
