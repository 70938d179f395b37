"""Checks of the loader's own options and of a saved loader state.

:func:`~shardload.loader.make_loader` and
:class:`~shardload.datamodule.ShardDataModule` call these when they are built,
so a wrong type or value fails where the user wrote it, with a
:class:`~shardload.errors.PlanError` naming the option, instead of being
rounded, ignored, or failing in a worker an epoch later. The batching options
are checked by :class:`~shardload.plan.Batching`, the plan's scalars by
:func:`shardload.plan.validate.check_call`, pad values and fields by
:class:`~shardload.collate.PadSpec`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import numpy as np

from shardload.errors import PlanError
from shardload.plan.options import MAX_COUNT
from shardload.plan.validate import MAX_EPOCH, MAX_WORLD_SIZE, check_scalar

__all__ = [
    "MAX_TIMEOUT",
    "MAX_WORKERS",
    "check_bool",
    "check_path",
    "check_state",
    "check_timeout",
    "check_worker_options",
]

#: More worker processes than this is a typo, not a configuration (each one is a process with its own mappings).
MAX_WORKERS = 1024
#: The DataLoader waits with ``poll()``, which takes at most 2^31 - 1 ms (24.8 days).
MAX_TIMEOUT = 1_000_000.0


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool, else :class:`PlanError` (``pin_memory="no"`` is true in Python)."""
    if not isinstance(value, (bool, np.bool_)):
        raise PlanError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_path(name: str, value: object) -> None:
    """A shard set location must be a ``str`` or ``os.PathLike``."""
    if not isinstance(value, (str, os.PathLike)):
        raise PlanError(f"{name} must be a shard set directory (str or path), got {type(value).__name__}")


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


def check_worker_options(
    *,
    num_workers: object,
    prefetch_factor: object,
    persistent_workers: object,
    pin_memory: object,
    timeout: object,
) -> tuple[int, int | None, bool, bool, float]:
    """The DataLoader's worker options, checked.

    ``prefetch_factor``, ``persistent_workers`` and ``timeout`` are about worker
    processes: they are checked whatever ``num_workers`` is, and have no effect
    with ``num_workers=0`` (so that one configuration works with and without workers).

    Returns:
        ``(num_workers, prefetch_factor, persistent_workers, pin_memory, timeout)``.
    """
    workers = check_scalar(
        "num_workers", num_workers, low=0, high=MAX_WORKERS, hint="0 builds batches in the training process"
    )
    prefetch = None
    if prefetch_factor is not None:
        prefetch = check_scalar(
            "prefetch_factor", prefetch_factor, low=1, high=MAX_COUNT, hint="batches each worker loads ahead"
        )
    return (
        workers,
        prefetch,
        check_bool("persistent_workers", persistent_workers),
        check_bool("pin_memory", pin_memory),
        check_timeout(timeout),
    )


_STATE_KEYS = ("version", "epoch", "batches_done", "fingerprint", "world_size")


def check_state(state: object, *, version: int) -> tuple[int, int, str, int]:
    """A loader state from :meth:`~shardload.loader.ShardLoader.state_dict`, checked for shape and types.

    Returns:
        ``(epoch, batches_done, fingerprint, world_size)``; whether they fit this
        loader's plan is the caller's check.

    Raises:
        PlanError: not a mapping, a key missing, a value of the wrong type or
            out of range, or an unknown version.
    """
    if not isinstance(state, Mapping):
        raise PlanError(
            f"a loader state must be the dict that state_dict() returned, got {type(state).__name__}: "
            "was the checkpoint saved without the loader's state?"
        )
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
        raise PlanError(
            f"the loader state lacks {missing} (it has {sorted(map(str, state))}); it was not made by "
            "ShardLoader.state_dict(), or was edited"
        )
    if state["version"] != version or isinstance(state["version"], bool):
        raise PlanError(
            f"loader state of version {state['version']!r} is not supported (this shardload writes {version})"
        )
    fingerprint = state["fingerprint"]
    if not isinstance(fingerprint, str):
        raise PlanError(f"loader state: fingerprint must be a str, got {fingerprint!r}")
    where = "loader state: "
    return (
        check_scalar(f"{where}epoch", state["epoch"], low=0, high=MAX_EPOCH),
        check_scalar(f"{where}batches_done", state["batches_done"], low=0, high=MAX_COUNT),
        fingerprint,
        check_scalar(f"{where}world_size", state["world_size"], low=1, high=MAX_WORLD_SIZE),
    )
