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

And it tells the trainer one: how many training batches the epoch that starts
has, by setting ``trainer.fit_loop.max_batches`` and the limits of its
``CombinedLoader`` (``fit_loop._combined_loader.limits``), as a reload of the
loader would (not a public API, stable since 2.0). Lightning reads a training loader's length once, when it sets the
loader up, and ends every later epoch when that many batches are ready; but a
plan's batch count may change from epoch to epoch (token budgets), and after
an elastic resume the resumed epoch's count differs from the next one's.
Only with ``limit_train_batches`` at its default (``1.0``: every batch; the int ``1`` is one batch).

The trainer is duck-typed: this module does not import Lightning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardload.world import World

__all__ = ["TrainerLink", "current_epoch", "train_link", "trainer_world"]


def trainer_world(trainer: Any) -> World:
    """This process's rank and the world size, as the trainer sees them."""
    return World(int(trainer.global_rank), int(trainer.world_size), "Lightning trainer")


def current_epoch(trainer: Any) -> int:
    """The epoch the trainer is at (0 without a trainer)."""
    return int(trainer.current_epoch) if trainer is not None else 0


@dataclass(frozen=True)
class TrainerLink:
    """What the training loader reads from the trainer, and tells it.

    Attributes:
        steps_done: the training steps finished in the current epoch (read when called).
        epoch_steps: tell the trainer the training batches of the epoch that starts.
    """

    steps_done: Callable[[], int]
    epoch_steps: Callable[[int], None]


def train_link(trainer: Any) -> TrainerLink:
    """The training loader's :class:`TrainerLink` to ``trainer``."""

    def done() -> int:
        return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)

    def tell(steps: int) -> None:
        loop = trainer.fit_loop
        combined = getattr(loop, "_combined_loader", None)  # what Lightning would compute on a reload of the loader
        limit = trainer.limit_train_batches  # 1.0 (a float) is every batch; the int 1 is one batch per epoch
        if isinstance(limit, float) and limit == 1.0 and isinstance(loop.max_batches, int) and combined is not None:
            combined.limits = [steps] * len(combined.flattened)
            loop.max_batches = steps

    return TrainerLink(done, tell)
