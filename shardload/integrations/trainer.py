"""Everything shardload reads from a Lightning ``Trainer`` or writes into it, in one place.

The trainer is duck-typed (Lightning is not imported here); checked against
Lightning 2.2 and 2.6, the oldest and newest supported (tests/distributed/test_trainer_clock.py).

* Read, public: ``global_rank``, ``world_size`` and ``current_epoch``; for the loader's stats
  (``integrations/loader_stats.py``) ``log_every_n_steps``, ``loggers``, ``strategy.all_gather`` and
  ``is_global_zero``.
* Read, not public (:func:`logging_step`, :func:`logs_after_this_step`): the step Lightning logs ``self.log``
  values at, ``fit_loop.epoch_loop._batches_that_stepped`` (what its own ``LearningRateMonitor`` logs at),
  and whether it logs them after the step under way (its rule: that count plus one a multiple of
  ``log_every_n_steps``, counted over the run, not the epoch, and not on a step that only accumulates
  gradients, ``epoch_loop._should_accumulate()``), so that the loader's figures share their rows;
  ``global_step`` (optimizer steps) where the count is absent.
* Written, public: the DataModule appends its ``LoaderStatsLogger`` to ``callbacks`` in ``setup`` (a
  DataModule has no ``configure_callbacks``; the trainer runs the hooks of that list as it is at each call).
* Read, not public (:func:`restored_steps`): the steps of this epoch a restore
  counts as done, from ``fit_loop.epoch_loop.batch_progress.current`` (stable
  since 2.0); no public attribute counts them, and the loader's own count is one
  ahead (Lightning prefetches). Versions differ on a checkpoint saved in
  ``on_train_batch_end``: 2.2 runs that step again, 2.6 counts it as done.
* Written, not public (:func:`train_link`): the length of the epoch after an
  elastic resume (docs/loading.md, "The length of an epoch"), as a reload
  (``fit_loop.setup_data``) would compute it; the public way,
  ``reload_dataloaders_every_n_epochs``, is the user's flag, rebuilds the
  loader and its workers every epoch, and runs before Lightning's restart check.
"""

from __future__ import annotations

from typing import Any

from shardload.load.sampler import TrainerLink

__all__ = [
    "TrainerLink",
    "current_epoch",
    "limited_batches",
    "logging_step",
    "logs_after_this_step",
    "restored_steps",
    "train_link",
]


def limited_batches(length: int, limit: int | float) -> int:
    """The batches Lightning runs of a loader of ``length`` under ``limit_train_batches`` (its own rule).

    >>> limited_batches(20, 1.0), limited_batches(20, 5), limited_batches(20, 0.25)
    (20, 5, 5)
    """
    if isinstance(limit, int):
        return min(length, limit)
    return int(length * limit)


def current_epoch(trainer: Any) -> int:
    """The epoch the trainer is at (0 without a trainer)."""
    return int(trainer.current_epoch) if trainer is not None else 0


def logging_step(trainer: Any) -> int:
    """The step at which the trainer logs the values of ``self.log`` now."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    return int(getattr(loop, "_batches_that_stepped", trainer.global_step))


def logs_after_this_step(trainer: Any) -> bool:
    """Whether the trainer logs the values of ``self.log`` after the training step under way (Lightning's rule).

    Called in ``on_train_batch_end``, before Lightning counts the step: every ``log_every_n_steps`` steps of the
    run (the count goes on over epochs, so an epoch shorter than the interval still gets its rows), never on a
    step that only accumulates gradients. The same on every rank: every rank runs the same steps.
    """
    every = int(getattr(trainer, "log_every_n_steps", 50))  # set by Lightning, not declared on Trainer
    if every <= 0:
        return False
    accumulating = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "_should_accumulate", None)
    if callable(accumulating) and accumulating():
        return False
    return (logging_step(trainer) + 1) % every == 0


def restored_steps(progress: Any, restart_stages: bool) -> int:
    """The steps of the epoch that a restore counts as done, from a batch progress tracker's ``current`` counts.

    ``restart_stages``: the loop restores a checkpoint saved in ``on_train_batch_end`` after that step (Lightning
    with ``update_restart_stage``, its counts then ``ready == started == processed == completed + 1``); without
    them (Lightning 2.2) a restore starts after the last completed step.
    """
    ready, started, processed, completed = (
        int(getattr(progress, k)) for k in ("ready", "started", "processed", "completed")
    )
    if restart_stages and ready == started == processed == completed + 1:
        return processed
    return completed


def train_link(trainer: Any) -> TrainerLink:
    """The training loader's :class:`TrainerLink` to ``trainer``."""

    def done() -> int:
        loop = trainer.fit_loop.epoch_loop
        return restored_steps(loop.batch_progress.current, hasattr(loop, "update_restart_stage"))

    def tell(steps: int) -> None:
        loop = trainer.fit_loop
        combined = getattr(loop, "_combined_loader", None)
        if combined is None or not isinstance(loop.max_batches, int):
            return  # not set up yet (it will read len(loader) itself), or an endless loader
        batches = limited_batches(steps, trainer.limit_train_batches)
        limits = [batches] * len(combined.flattened)
        fetcher: Any = getattr(loop, "_data_fetcher", None)
        counted = getattr(fetcher, "length", None)  # the fetcher's count, which ends the epoch
        if batches == loop.max_batches and list(combined.limits) == limits and counted in (None, batches):
            return  # the length Lightning computed holds: every epoch of a run but the one after an elastic resume
        combined.limits = limits
        if counted is not None:  # a resumed run iterates the fetcher it made before the restore: it keeps its count
            fetcher.length = batches
        epoch_loop = loop.epoch_loop
        progress = epoch_loop.batch_progress
        ran = int(progress.current.processed)
        if epoch_loop.restarting and (progress.is_last_batch or ran >= loop.max_batches):
            # restored from a checkpoint saved at the last step of the epoch before: Lightning starts this epoch
            # from step 0 only if its restored count reaches the length it has. Until the epoch's iteration starts
            # (the loader tells the length again then) that length is the steps the old epoch ran, which can be
            # fewer than its plan's under limit_train_batches.
            loop.max_batches = min(loop.max_batches, ran)
            return
        loop.max_batches = batches
        interval = trainer.val_check_interval
        timed = getattr(trainer, "_val_check_time_interval", None) is not None  # Lightning >= 2.6: time-based
        if isinstance(interval, float) and not timed and batches > 0:
            trainer.val_check_batch = max(1, int(batches * interval))

    return TrainerLink(done, tell)
