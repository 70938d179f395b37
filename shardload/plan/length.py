"""The length of a training epoch: the same batch count in every epoch of a run.

A trainer reads the length of an epoch once and plans its clock on it
(Lightning's validation point, ``estimated_stepping_batches`` for a learning
rate schedule, the progress bar, ``limit_train_batches``). So every training
epoch of a run has the same number of batches, ``steps``: a function of the
inputs, the world size, the batching options, the seed and the shard
assignment, not of the epoch. Evaluation plans are not concerned (their
layout and order do not depend on the epoch).

What each strategy naturally needs varies a little from epoch to epoch: the
rank whose new shard group holds the most batches sets the target (token
budgets, packing, mixtures; a fixed ``batch_size`` needs the same count every
epoch). The planner makes it constant in two steps::

    steps  = the largest natural target of the probe epochs 0 .. PROBE_EPOCHS - 1 (the smallest with
             uneven="drop"); a mixture's: plus their spread (largest - smallest), once per run
    epoch e: its natural target fits (<= steps; >= with "drop")?  plan it to exactly `steps`
             (split / pad: a few more, smaller batches; drop: drop to it)
             it does not fit: draw the epoch's shard order and sample order again,
             from a seed derived from (seed, draw), until one fits (draw 1, 2, ...)

The draws are part of the plan (every rank makes the same ones: they depend on
nothing but the request), and the epochs of the probes never need one. Where
epochs are alike (a fixed ``batch_size``; shards of similar lengths) ``steps``
is the natural target of every epoch: no step is added. Where they differ, a
fresh draw of the shard and sample orders is a new sample of the same
distribution as the probes, so it fits with probability about ``K / (K + 1)``
for ``K`` probes, and ``MAX_DRAWS`` draws all miss with probability about
``(K + 1) ** -MAX_DRAWS``. A mixture's selection of samples is not redrawn (its
windows keep every sample's uses even over the epochs), and its natural target
also moves with the selection: there a margin of one spread of the probes
does that part of the work.
If all ``MAX_DRAWS`` draws miss (a set whose shards differ wildly), the epoch
keeps its natural target and an :class:`EpochLengthWarning` says so: every
rank still has the same count, only the trainer's clock sees another length
for that epoch (the DataModule tells Lightning, so validation still runs after
its last step).

Cost: the probes count ``PROBE_EPOCHS`` epochs once (kept with the inputs,
:meth:`~shardload.plan.PlanInputs.memo`); a redraw counts one epoch again.
The steps added by split are measured in docs/benchmarks.md ("Epoch length").
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from shardload.plan.options import Batching, Uneven
from shardload.plan.request import EpochSpec

__all__ = ["MAX_DRAWS", "PROBE_EPOCHS", "EpochLengthWarning", "draw_seed", "epoch_steps", "fits", "natural_target"]

#: epochs whose natural targets set a run's steps per epoch
PROBE_EPOCHS = 4
#: draws of an epoch's orders tried before it keeps its natural target
MAX_DRAWS = 32

_DRAW_STREAM = 0x4452  # tag of the seeds of later draws


class EpochLengthWarning(UserWarning):
    """An epoch could not be planned to the run's steps per epoch (see :mod:`shardload.plan.length`)."""


def draw_seed(seed: int, draw: int) -> int:
    """The seed of an epoch's shard and sample orders at ``draw`` (draw 0: the run's seed itself)."""
    if draw == 0:
        return seed
    state = np.random.SeedSequence([seed, draw, _DRAW_STREAM]).generate_state(2, np.uint32)
    return int(state[0]) << 32 | int(state[1])


def natural_target(counts: np.ndarray, uneven: Uneven) -> int:
    """The batch count every rank can reach from ``counts`` (``(W,)``): the largest, the smallest for ``drop``."""
    if not len(counts):
        return 0
    return int(counts.min() if uneven == "drop" else counts.max())


def fits(natural: int, steps: int, uneven: Uneven) -> bool:
    """Whether an epoch of this natural target can be planned to exactly ``steps`` batches."""
    return natural >= steps if uneven == "drop" else natural <= steps


def epoch_steps(
    spec: EpochSpec,
    batching: Batching,
    natural_of: Callable[[int], int],
    memo: Callable[[object, Callable[[], np.ndarray]], np.ndarray],
    *,
    margin: bool,
) -> int:
    """The run's training steps per epoch (see the module docstring), computed once per run.

    Args:
        spec: A training epoch of the run (its epoch is ignored).
        batching: The run's batching.
        natural_of: The natural target of an epoch at draw 0.
        memo: The inputs' memo (:meth:`~shardload.plan.PlanInputs.memo`).
        margin: Add the probes' spread (a mixture, whose selection is not redrawn).
    """
    key = ("epoch steps", batching, spec.world_size, spec.seed, spec.shard_assignment, PROBE_EPOCHS)

    def probe() -> np.ndarray:
        targets = [natural_of(epoch) for epoch in range(PROBE_EPOCHS)]
        low, high = min(targets), max(targets)
        spread = high - low if margin else 0
        steps = max(low - spread, min(1, low)) if batching.uneven == "drop" else high + spread
        return np.asarray([steps], dtype=np.int64)

    return int(memo(key, probe)[0])


def warn_unfit(spec: EpochSpec, natural: int, steps: int) -> None:
    """Say that an epoch keeps its natural target (every draw missed the run's steps)."""
    warnings.warn(
        f"training epoch {spec.epoch} could not be planned to the run's {steps} steps per epoch in {MAX_DRAWS} "
        f"draws of its shard order; it has {natural} steps (the same on every rank). The shards differ so much "
        "in length that epochs differ in steps: the trainer's step total (e.g. estimated_stepping_batches) is "
        "off by the difference. More shards, or a shard set prepared from shuffled input, make epochs alike.",
        EpochLengthWarning,
        stacklevel=3,
    )
