"""The loader's stats (shardload/load/stats.py): wait, step and tokens against a hand-timed loop, and in Lightning.

Timings are asserted as ranges around sleeps of known size (the machine is shared and noisy): a figure that
measured the wrong interval (the step instead of the wait, nothing, or a batch twice) falls outside them.
"""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import Logger

import shardload
import shardload.load.stats as stats_module
from shardload.integrations.datamodule import ShardDataModule
from shardload.integrations.loader_stats import LoaderStatsLogger, reduce_over_ranks
from shardload.load.dataset import ShardBatchDataset
from shardload.load.stats import BOTTLENECK_MIN_STEPS, LoaderBottleneckWarning, LoaderStats
from shardload.plan import Batching
from shardload.testing import synthetic_samples

pytestmark = pytest.mark.filterwarnings("ignore:.*does not have many workers")

SLEEP = 0.02  # seconds: the artificial slow step or slow batch


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stats") / "set"
    # tokens and label only: packing needs every loaded variable field at the batching length
    samples = [{k: v for k, v in s.items() if k != "features"} for s in synthetic_samples(96, seed=5)]
    shardload.write(samples, path, num_shards=4, progress=False)
    return path


@pytest.fixture
def slow_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch takes ``SLEEP`` longer to build."""
    build = ShardBatchDataset.__getitem__

    def slow(self: ShardBatchDataset, key: Any) -> Any:
        time.sleep(SLEEP)
        return build(self, key)

    monkeypatch.setattr(ShardBatchDataset, "__getitem__", slow)


def test_a_slow_step_is_step_time_and_not_wait(small_set: Path) -> None:
    loader = shardload.make_loader(small_set, batch_size=8, rank=0, world_size=1)
    list(loader)  # shards mapped: the timed pass below measures batches, not first opens
    loader.reset_stats()
    start = time.perf_counter()
    for _ in loader:
        time.sleep(SLEEP)
    elapsed = time.perf_counter() - start
    stats = loader.stats
    assert stats is not None
    # Invariant: one step per batch (the last one ends at the ask that ends the pass), each at least the sleep
    assert stats.steps == len(loader)
    assert len(loader) * SLEEP <= stats.step_s <= elapsed
    assert stats.wait_s < 0.5 * stats.step_s and stats.wait_fraction < 0.5


def test_a_slow_loader_is_wait(small_set: Path, slow_batches: None) -> None:
    loader = shardload.make_loader(small_set, batch_size=8, rank=0, world_size=1)
    for _ in loader:
        pass  # the loop does nothing: the whole step is the wait
    stats = loader.stats
    assert stats is not None
    # Invariant: a loop that does nothing waits for each batch at least the sleep, and the wait is the step
    assert stats.steps == len(loader)
    assert stats.wait_s >= len(loader) * SLEEP
    assert 0.8 < stats.wait_fraction <= 1.0


@pytest.mark.parametrize(
    "batching",
    [
        Batching(batch_size=8, bucketing=False),
        Batching(batch_size=8, uneven="pad"),
        Batching(packing=True, pack_length=64, rows_per_batch=2, pack_split=True),
    ],
    ids=["random", "pad", "packed"],
)
@pytest.mark.parametrize("workers", [0, 1])
def test_tokens_are_the_lengths_of_real_samples_and_the_padded_tensors(
    small_set: Path, batching: Batching, workers: int
) -> None:
    loader = shardload.make_loader(
        small_set, batching=batching, fields=("tokens", "label"), num_workers=workers, rank=0, world_size=2, stage="val"
    )
    real = padded = 0
    for batch in loader:
        real += int(batch["tokens_lengths"][batch["weight"] > 0].sum())
        padded += batch["tokens"].shape[0] * batch["tokens"].shape[1]
    stats = loader.stats
    assert stats is not None
    # Invariant: real tokens leave filler (weight 0) out; padded tokens are what the tensors hold
    assert (stats.real_tokens, stats.padded_tokens) == (real, padded)
    assert 0 <= stats.padding < 1 and stats.tokens_per_s > 0


def test_filler_rows_are_not_real_tokens() -> None:
    from shardload.load.stats import StatsRecorder

    rec = StatsRecorder("tokens")
    batch = {
        "tokens": torch.zeros(3, 10, dtype=torch.int32),
        "tokens_lengths": torch.tensor([4, 10, 7]),
        "weight": torch.tensor([1.0, 1.0, 0.0]),
    }
    for _ in range(70):  # past one fold of the held batches
        rec.got(rec.asked(), batch)
    rec.asked()
    # Invariant: a row of weight 0 is padding to the stats, whatever its length
    assert (rec.snapshot().steps, rec.snapshot().real_tokens, rec.snapshot().padded_tokens) == (70, 70 * 14, 70 * 30)


def test_a_set_without_variable_fields_counts_rows(small_set: Path) -> None:
    loader = shardload.make_loader(small_set, batch_size=8, fields=("label",), rank=0, world_size=1)
    rows = sum(int(b["weight"].shape[0]) for b in loader)
    stats = loader.stats
    assert stats is not None
    assert (stats.real_tokens, stats.padded_tokens, stats.padding) == (rows, rows, 0.0)


def test_reset_starts_a_new_interval_and_stats_can_be_turned_off(small_set: Path) -> None:
    loader = shardload.make_loader(small_set, batch_size=8, rank=0, world_size=1)
    list(loader)
    assert loader.stats is not None and loader.stats.steps == len(loader)
    loader.reset_stats()
    assert loader.stats == LoaderStats()
    off = shardload.make_loader(
        small_set, batch_size=8, loader_options=shardload.LoaderOptions(stats=False), rank=0, world_size=1
    )
    list(off)
    off.reset_stats()  # does nothing
    assert off.stats is None


def test_a_pass_left_early_does_not_count_the_gap_before_the_next() -> None:
    # the step of a batch left pending ends at the next ask; a new pass drops it instead
    from shardload.load.stats import StatsRecorder

    rec = StatsRecorder(None)
    asked = rec.asked()
    rec.got(asked, {"weight": torch.ones(3)})
    rec.begin_pass()
    time.sleep(SLEEP)
    rec.asked()
    assert rec.snapshot() == LoaderStats()


def test_reduce_over_ranks_gives_the_mean_and_the_largest() -> None:
    gathered = torch.tensor([[10, 1.0, 4.0, 400, 500], [10, 3.0, 4.0, 200, 500]], dtype=torch.float64)
    got = reduce_over_ranks(gathered)
    assert got["data/wait_fraction"] == pytest.approx(0.5) and got["data/wait_fraction_max"] == pytest.approx(0.75)
    assert got["data/tokens_per_s"] == pytest.approx(75.0) and got["data/tokens_per_s_max"] == pytest.approx(100.0)
    assert got["data/padding"] == pytest.approx(0.4) and got["data/padding_max"] == pytest.approx(0.6)


class Recorder(Logger):
    """A logger that keeps what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))


class Model(pl.LightningModule):
    def __init__(self, step_sleep: float = 0.0) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.step_sleep = step_sleep

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(self.step_sleep)
        self.log("loss_seen", 1.0)
        return self.lin(batch["label"].float().unsqueeze(-1)).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(
    root: Path, small_set: Path, model: Model, trainer_options: dict[str, Any] | None = None, **options: Any
) -> tuple[Recorder, list[warnings.WarningMessage]]:
    logger = Recorder()
    trainer_options = {"log_every_n_steps": 3, "max_epochs": 2} | (trainer_options or {})
    dm = ShardDataModule(
        train=small_set, batch_size=8, loader_options=shardload.LoaderOptions(num_workers=0, **options)
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=logger,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
        **trainer_options,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LoaderBottleneckWarning)
        trainer.fit(model, datamodule=dm)
    return logger, [w for w in caught if issubclass(w.category, LoaderBottleneckWarning)]


def test_the_stats_reach_the_trainers_logger(tmp_path: Path, small_set: Path) -> None:
    logger, warned = fit(tmp_path, small_set, Model(step_sleep=2 * SLEEP))
    data = [(step, m) for step, m in logger.logged if "data/wait_fraction" in m]
    steps_per_epoch = 12  # 96 samples, batches of 8, one rank
    # Invariant: one record every log_every_n_steps steps, at the step the module's own values are logged at
    assert len(data) == 2 * steps_per_epoch // 3
    own_steps = {step for step, m in logger.logged if "loss_seen" in m}
    assert {step for step, _ in data} <= own_steps
    for _, m in data:
        assert set(m) == {f"data/{k}{s}" for k in ("wait_fraction", "tokens_per_s", "padding") for s in ("", "_max")}
        assert 0 <= m["data/wait_fraction"] <= m["data/wait_fraction_max"] < 0.5  # the step sleeps; the loader not
        assert m["data/tokens_per_s"] > 0 and 0 <= m["data/padding"] < 1
    # Invariant: a fast loader does not warn
    assert warned == []


@pytest.mark.parametrize(
    ("every", "epochs", "accumulate"), [(5, 3, 1), (20, 3, 1), (2, 2, 3)], ids=["5-of-12", "20-of-12", "accumulate3"]
)
def test_the_stats_are_logged_at_the_steps_lightning_logs_at_across_epochs(
    tmp_path: Path, small_set: Path, every: int, epochs: int, accumulate: int
) -> None:
    options = {"log_every_n_steps": every, "max_epochs": epochs, "accumulate_grad_batches": accumulate}
    logger, _ = fit(tmp_path, small_set, Model(), options)
    own_steps = [step for step, m in logger.logged if "loss_seen" in m]
    data_steps = [step for step, m in logger.logged if "data/wait_fraction" in m]
    # Invariant: Lightning counts log_every_n_steps over the run (an epoch of 12 steps is not a multiple of 5,
    # and shorter than 20) and over optimizer steps; the loader's figures share every row of the module's own
    assert own_steps and data_steps == own_steps


def test_a_slow_loader_warns_once_per_run(
    tmp_path: Path, small_set: Path, slow_batches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 24 steps of about 0.02 s: under BOTTLENECK_MIN_SECONDS of steps, a run too short to be judged...
    logger, warned = fit(tmp_path, small_set, Model())
    assert warned == []
    # ...unless the floor is lowered (the same run, judged)
    monkeypatch.setattr(stats_module, "BOTTLENECK_MIN_SECONDS", 0.0)
    logger, warned = fit(tmp_path, small_set, Model())
    # Invariant: the loader is the bottleneck in every interval, and the run warns once, naming what to change
    assert len(warned) == 1
    assert "num_workers" in str(warned[0].message) and "prefetch_factor" in str(warned[0].message)
    data = [m for _, m in logger.logged if "data/wait_fraction" in m]
    assert data and all(m["data/wait_fraction"] > 0.5 for m in data)


def test_a_slow_loader_is_not_judged_on_fewer_steps_than_the_least(
    tmp_path: Path, small_set: Path, slow_batches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stats_module, "BOTTLENECK_MIN_SECONDS", 0.0)  # steps alone (seconds: the test above)
    # 12 steps logged every 6: after the first interval (start-up, not evidence) 6 steps, under BOTTLENECK_MIN_STEPS
    assert BOTTLENECK_MIN_STEPS > 6
    logger, warned = fit(tmp_path, small_set, Model(), {"log_every_n_steps": 6, "max_epochs": 1})
    data = [m for _, m in logger.logged if "data/wait_fraction" in m]
    assert len(data) == 2 and all(m["data/wait_fraction"] > 0.5 for m in data)  # slow, but too short to say
    assert warned == []
    # one more epoch: 12 steps after the first interval, judged together (each interval alone is 6)
    logger, warned = fit(tmp_path, small_set, Model(), {"log_every_n_steps": 6, "max_epochs": 2})
    assert len(warned) == 1
    judged = int(re.search(r"over (\d+) steps", str(warned[0].message)).group(1))  # type: ignore[union-attr]
    assert judged > 6 and judged >= BOTTLENECK_MIN_STEPS  # (an epoch's first step has no step time of its own)


def test_turning_stats_off_logs_nothing_and_adds_no_callback(tmp_path: Path, small_set: Path) -> None:
    logger, warned = fit(tmp_path, small_set, Model(), stats=False)
    assert logger.logged and not any(k.startswith("data/") for _, m in logger.logged for k in m)
    assert warned == []
    dm = ShardDataModule(train=small_set, batch_size=8, loader_options=shardload.LoaderOptions(stats=False))
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    dm.trainer = trainer
    dm.setup("fit")
    assert not any(isinstance(c, LoaderStatsLogger) for c in trainer.callbacks)
