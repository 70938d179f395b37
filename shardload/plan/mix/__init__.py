"""Mixtures in the planner: several sources planned as one epoch, by weight.

* ``inputs``: :class:`MixInputs` (one ``PlanInputs`` per source and their weights) and the
  per-epoch selection of each source's samples.
* ``batcher``: :class:`~shardload.plan.mix.batcher.MixBatcher`, per source batches interleaved per rank.
* ``report``: what each source gives an epoch (``shardload plan --source``).

The names of the 0.1.0 module ``shardload.plan.mix`` are re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardload.plan.mix import inputs as _inputs
from shardload.plan.mix.inputs import *  # noqa: F403  (every name of inputs.__all__)

__all__ = list(_inputs.__all__)

if not TYPE_CHECKING:  # hidden from type checkers, which would take any attribute as this one's

    def __getattr__(name: str) -> object:
        """Any other name the 0.1.0 module ``shardload.plan.mix`` held (``MAX_EPOCH_SIZE``, ...), from ``inputs``."""
        return getattr(_inputs, name)
