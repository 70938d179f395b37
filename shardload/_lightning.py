"""Everything shardload reads from a Lightning ``Trainer``, in one place.

The DataModule needs three facts from the trainer; each is read here and
nowhere else, so that a change in Lightning is mended in one file. Checked
against Lightning 2.2 to 2.6 (``lightning.pytorch``):

* rank and world size: ``trainer.global_rank`` and ``trainer.world_size``
  (public properties since 1.x; they cover ddp, ddp_spawn, fsdp, deepspeed
  and multi-node);
* the epoch to plan: ``trainer.current_epoch`` (public);
* how many training batches of this epoch are finished, for a mid-epoch
  checkpoint: ``trainer.fit_loop.epoch_loop.batch_progress.current.processed``
  (the fit loop's progress tracker; not a public API, stable since 2.0).
  Lightning fetches one batch ahead of the step it runs, so the loader's own
  count of yielded batches is one too many when a checkpoint is saved; the
  batches a resume must skip are those whose training step finished.

The trainer is duck-typed: this module does not import Lightning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardload.world import World

__all__ = ["current_epoch", "train_steps_done", "trainer_world"]


def trainer_world(trainer: Any) -> World:
    """This process's rank and the world size, as the trainer sees them."""
    return World(int(trainer.global_rank), int(trainer.world_size), "Lightning trainer")


def current_epoch(trainer: Any) -> int:
    """The epoch the trainer is at (0 without a trainer)."""
    return int(trainer.current_epoch) if trainer is not None else 0


def train_steps_done(trainer: Any) -> Callable[[], int]:
    """A function giving the training steps finished in the current epoch (read when called)."""

    def done() -> int:
        return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)

    return done
