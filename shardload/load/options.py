"""The loader's own options: :class:`LoaderOptions` (how batches are delivered).

Beside :class:`~shardload.plan.Batching` (how rows become batches) and
:class:`~shardload.plan.EpochSpec` (the epoch), it is one of the three option
objects of :func:`~shardload.load.loader.make_loader` and the DataModule. Each
checks itself when built, raising a :class:`~shardload.errors.PlanError` that
names the option where the user wrote it (docs/loading.md, "Options").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardload._base.checks import check_bool, check_scalar
from shardload._base.checks import with_shortcuts as with_shortcuts  # this module's own name in 0.1.0
from shardload.errors import PlanError
from shardload.plan.options import MAX_COUNT

__all__ = [
    "MAX_TIMEOUT",
    "MAX_WORKERS",
    "LoaderOptions",
    "check_timeout",
]

#: More worker processes than this is a typo, not a configuration (each one is a process with its own mappings).
MAX_WORKERS = 1024
#: The DataLoader waits with ``poll()``, which takes at most 2^31 - 1 ms (24.8 days).
MAX_TIMEOUT = 1_000_000.0


def check_timeout(value: object) -> float:
    """``timeout`` in seconds: a finite number in ``[0, MAX_TIMEOUT]`` (0: wait for ever)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise PlanError(f"timeout must be a number of seconds (0: no timeout), got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_TIMEOUT:
        raise PlanError(
            f"timeout={value!r}: must be a number of seconds in [0, {MAX_TIMEOUT:,.0f}]; 0 waits for ever, "
            "and a few minutes is usually right (see docs/loading.md)"
        )
    return seconds


@dataclass(frozen=True)
class LoaderOptions:
    """How batches are delivered: worker processes, pinning, prefetch, timeout, debug, stats.

    None of these changes which batches come out, or their order: the plan
    does not depend on them. The same object serves
    :func:`~shardload.load.loader.make_loader` and
    :class:`~shardload.integrations.datamodule.ShardDataModule` (``loader_options=``);
    ``num_workers=`` is also a shortcut keyword of both.

    Attributes:
        num_workers: DataLoader worker processes (``0 .. 1024``); 0 builds
            batches in the training process. ``None`` (the default): the
            default of what the options are given to, 0 for ``make_loader``
            and 2 for ``ShardDataModule``, so that ``LoaderOptions(stats=False)``
            changes nothing else and agrees with a ``num_workers=`` keyword.
        pin_memory: Pin batches for faster host-to-device copies; ``None``:
            when CUDA is available.
        prefetch_factor: Batches each worker loads ahead (``None``: torch's
            default, 2).
        persistent_workers: Keep worker processes alive between epochs (and
            between validation runs) instead of starting new ones each time;
            on by default. Safe here because workers hold no plan: the
            sampler, in the main process, sends every batch key, so
            ``set_epoch`` and a resume reach the batches without restarting
            workers. Turn it off to return the workers' memory between
            epochs, or with Lightning's ``reload_dataloaders_every_n_epochs``
            and pinned memory (Lightning warns about that combination).
        timeout: Seconds to wait for a batch from the workers before raising
            :class:`~shardload.errors.WorkerError` (0: wait for ever). It turns
            a stopped or stuck worker into an error instead of a hang; set it
            well above the slowest batch, e.g. 300.
        debug: ``num_workers=0``, a per-rank plan summary every epoch, and a
            cross-rank check (one small all-gather) that raises
            :class:`~shardload.errors.PlanMismatchError` instead of hanging.
        stats: Time each ``next()`` and count each batch's real and padded
            tokens (``loader.stats``; the DataModule logs them as ``data/...``
            and warns when the loader is the bottleneck); on by default, at a
            cost of about a microsecond per batch (docs/loading.md, "Is the
            loader the bottleneck?").

    ``prefetch_factor``, ``persistent_workers`` and ``timeout`` are about
    worker processes: they are checked whatever ``num_workers`` is, and have no
    effect with ``num_workers=0`` (so that one configuration works with and
    without workers).

    Raises:
        PlanError: On construction, naming the option, if a value has the
            wrong type (``num_workers=1.5``, ``pin_memory="no"``) or range.

    Examples:
        >>> LoaderOptions(num_workers=4, timeout=300).workers
        4
        >>> LoaderOptions(num_workers=4, debug=True).workers
        0
    """

    num_workers: int | None = None
    pin_memory: bool | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool = True
    timeout: float = 0
    debug: bool = False
    stats: bool = True

    def __post_init__(self) -> None:
        fixed: dict[str, object] = {
            "persistent_workers": check_bool("persistent_workers", self.persistent_workers),
            "timeout": check_timeout(self.timeout),
            "debug": check_bool("debug", self.debug),
            "stats": check_bool("stats", self.stats),
        }
        if self.num_workers is not None:
            fixed["num_workers"] = check_scalar(
                "num_workers",
                self.num_workers,
                low=0,
                high=MAX_WORKERS,
                hint="0 builds batches in the training process",
            )
        if self.pin_memory is not None:
            fixed["pin_memory"] = check_bool("pin_memory", self.pin_memory)
        if self.prefetch_factor is not None:
            fixed["prefetch_factor"] = check_scalar(
                "prefetch_factor", self.prefetch_factor, low=1, high=MAX_COUNT, hint="batches each worker loads ahead"
            )
        for name, value in fixed.items():
            object.__setattr__(self, name, value)  # plain Python values

    @property
    def workers(self) -> int:
        """The worker processes the loader starts: ``num_workers`` (``None``: 0), or 0 in debug mode."""
        return 0 if self.debug or self.num_workers is None else self.num_workers

    def dataloader_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``torch.utils.data.DataLoader`` these options stand for."""
        pin = self.pin_memory
        if pin is None:
            import torch

            pin = torch.cuda.is_available()
        return {
            "num_workers": self.workers,
            "pin_memory": pin,
            "prefetch_factor": self.prefetch_factor,
            "persistent_workers": self.persistent_workers,
            # torch refuses a timeout without workers (debug mode, num_workers=0): there is nothing to wait for
            "timeout": self.timeout if self.workers else 0,
        }
