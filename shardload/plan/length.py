"""The length of a training epoch: the same batch count in every epoch of a run.

A trainer reads the length of an epoch once, so every training epoch of a run is planned to the same
``steps``, fixed once per run from ``PROBE_EPOCHS`` probe epochs (a mixture's: ``MIX_PROBE_EPOCHS`` plus
their spread); an epoch whose natural count does not fit is drawn again from ``(seed, draw)``, up to
:data:`MAX_DRAWS` times. Evaluation plans are not concerned.

Guarantee: every training epoch has ``steps`` batches on every rank, and the draws depend on nothing
but the request (every rank makes the same ones). If every draw misses, a rank above ``steps`` leaves
its last batches out and an :class:`EpochLengthWarning` says how many. The rule, its cost and why:
docs/loading.md, "The length of an epoch".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from shardload.plan.options import Batching, Uneven
from shardload.plan.request import EpochSpec

__all__ = [
    "MAX_DRAWS",
    "MIX_PROBE_EPOCHS",
    "PROBE_EPOCHS",
    "EpochLengthWarning",
    "draw_seed",
    "epoch_steps",
    "epoch_steps_key",
    "fits",
    "natural_target",
    "rank_policy",
]

#: epochs whose natural targets set a run's steps per epoch
PROBE_EPOCHS = 4
#: a mixture's probe epochs (its selection of samples moves the count too, and is never redrawn)
MIX_PROBE_EPOCHS = 8
#: draws of an epoch's orders tried before it is held to the run's steps by leaving batches out
MAX_DRAWS = 32

_DRAW_STREAM = 0x4452  # tag of the seeds of later draws


class EpochLengthWarning(UserWarning):
    """No draw of an epoch fitted the run's steps per epoch: batches were left out to hold it (:mod:`shardload.plan.length`)."""


def draw_seed(seed: int, draw: int) -> int:
    """The seed of an epoch's shard and sample orders at ``draw`` (draw 0: the run's seed itself)."""
    if draw == 0:
        return seed
    state = np.random.SeedSequence([seed, draw, _DRAW_STREAM]).generate_state(2, np.uint32)
    return int(state[0]) << 32 | int(state[1])


def natural_target(counts: NDArray[np.int64], uneven: Uneven) -> int:
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
    memo: Callable[[object, Callable[[], NDArray[np.int64]]], NDArray[np.int64]],
    *,
    margin: bool,
) -> int:
    """The run's training steps per epoch (see the module docstring), computed once per run.

    ``spec.epoch`` is ignored; ``natural_of(epoch)`` is an epoch's natural
    target at draw 0; ``memo`` the inputs' (:meth:`~shardload.plan.PlanInputs.memo`).
    ``margin`` (a mixture): probe :data:`MIX_PROBE_EPOCHS` epochs and add their spread, at least 1.
    """
    probes = MIX_PROBE_EPOCHS if margin else PROBE_EPOCHS
    key = epoch_steps_key(spec, batching, probes)

    def probe() -> NDArray[np.int64]:
        targets = [natural_of(epoch) for epoch in range(probes)]
        low, high = min(targets), max(targets)
        spread = max(high - low, 1) if margin and high else 0  # an epoch of nothing stays empty
        steps = max(low - spread, min(1, low)) if batching.uneven == "drop" else high + spread
        return np.asarray([steps], dtype=np.int64)

    return int(memo(key, probe)[0])


def epoch_steps_key(spec: EpochSpec, batching: Batching, probes: int) -> tuple[object, ...]:
    """The memo key of a run's steps per epoch (:func:`epoch_steps`, ``probes`` probe epochs)."""
    return ("epoch steps", batching, spec.world_size, spec.seed, spec.shard_assignment, probes)


def rank_policy(count: int, steps: int, uneven: Uneven) -> Uneven:
    """How a rank with ``count`` natural batches reaches the epoch's ``steps``.

    Above: it drops its last batches (only in an epoch no draw could fit); below: the batching's
    policy, and ``"split"`` for ``"drop"`` (a rank cannot drop up to more batches).
    """
    if count > steps:
        return "drop"
    return "split" if uneven == "drop" else uneven


def warn_unfit(spec: EpochSpec, natural: int, steps: int, left_out: int) -> None:
    """Say that an epoch was held to the run's steps by leaving batches out (every draw needed more)."""
    if natural > steps:
        what = (
            f"needs up to {natural} steps on a rank; the run's {steps} steps per epoch are kept by leaving "
            f"{left_out} batches out over all ranks (their samples are not trained this epoch)"
        )
    else:
        what = f"has as few as {natural} batches on a rank; the ranks below {steps} split theirs (nothing is lost)"
    warnings.warn(
        f"training epoch {spec.epoch} {what}. No draw of {MAX_DRAWS} fitted the run's steps per epoch: its "
        "shards (or a mixture's selection of samples) differ a lot from epoch to epoch. More, smaller shards, or a "
        "shard set prepared from shuffled input, make epochs alike.",
        EpochLengthWarning,
        stacklevel=4,  # the caller of EpochPlanner(...)
    )
