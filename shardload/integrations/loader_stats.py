"""The training loader's stats in the trainer's loggers: ``data/wait_fraction``, ``data/tokens_per_s``, ``data/padding``.

:class:`LoaderStatsLogger` is the Lightning callback that :class:`~shardload.ShardDataModule` adds to its trainer
when ``LoaderOptions(stats=True)`` (the default). Every ``log_every_n_steps`` training steps, where Lightning
logs ``self.log`` values (counted over the run, not the epoch; never on a step that only accumulates), it takes
the training loader's :class:`~shardload.load.stats.LoaderStats` of the interval, gathers them from every rank (one
small ``all_gather``: every rank logs at the same step, since every rank has the same number of batches), logs
the mean and the largest over ranks to each of the trainer's loggers, and starts a new interval. Once per run,
rank 0 warns (:class:`~shardload.load.stats.LoaderBottleneckWarning`) when a rank waited for its batches more
than :data:`~shardload.load.stats.BOTTLENECK_FRACTION` of its steps since the first interval (workers starting,
the page cache warming), once those are :data:`~shardload.load.stats.BOTTLENECK_MIN_STEPS` steps and
:data:`~shardload.load.stats.BOTTLENECK_MIN_SECONDS` seconds or more.
docs/loading.md, "Is the loader the bottleneck?".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

from shardload.integrations.trainer import logging_step, logs_after_this_step
from shardload.load.loader import ShardLoader
from shardload.load.stats import LoaderStats, warn_bottleneck

__all__ = ["LoaderStatsLogger", "reduce_over_ranks"]


def reduce_over_ranks(gathered: torch.Tensor) -> dict[str, float]:
    """The logged figures from ``(W, 5)`` sums of every rank (steps, wait_s, step_s, real, padded): mean and max.

    Each rank's figures are its own ratios (``wait_s / step_s``, ...); ``*_max`` is the largest over ranks and
    the plain name their mean.
    """
    per_rank = [
        LoaderStats(int(s), float(w), float(t), int(r), int(p)).metrics() for s, w, t, r, p in gathered.tolist()
    ]
    out: dict[str, float] = {}
    for name in per_rank[0]:
        values = [m[name] for m in per_rank]
        out[name] = sum(values) / len(values)
        out[name + "_max"] = max(values)
    return out


class LoaderStatsLogger(pl.Callback):
    """Logs the training loader's stats every ``log_every_n_steps`` steps, reduced over ranks; warns once.

    Args:
        loader: The training loader of the run, as the DataModule holds it (``None`` until it is made).
        options: The delivery options as the warning names them (e.g. ``"num_workers=2"``).
    """

    def __init__(self, loader: Callable[[], ShardLoader | None], options: str) -> None:
        self._loader = loader
        self._options = options
        self._intervals = 0
        self._warned = False
        #: (W, 5) rank 0's sums of every rank's intervals after the first: what the warning judges
        self._since_first: torch.Tensor | None = None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loader = self._loader()
        if loader is None or loader.stats is None or not logs_after_this_step(trainer):
            return
        stats = loader.stats
        loader.reset_stats()
        sums = torch.tensor(
            [[stats.steps, stats.wait_s, stats.step_s, stats.real_tokens, stats.padded_tokens]],
            dtype=torch.float64,
            device=pl_module.device if trainer.world_size > 1 else "cpu",  # nccl gathers device tensors only
        )
        gathered = trainer.strategy.all_gather(sums).reshape(-1, 5).cpu()
        self._intervals += 1
        if not trainer.is_global_zero:
            return
        figures = reduce_over_ranks(gathered)
        step = logging_step(trainer)
        for logger in trainer.loggers:
            logger.log_metrics(figures, step=step)
        if self._intervals == 1 or self._warned:
            return
        seen = gathered if self._since_first is None else self._since_first + gathered
        self._since_first = seen
        worst = int(seen[:, 1].div(seen[:, 2].clamp(min=1e-12)).argmax())
        s, w, t, r, p = seen[worst].tolist()
        self._warned = warn_bottleneck(LoaderStats(int(s), w, t, int(r), int(p)), f"rank {worst}; {self._options}")
