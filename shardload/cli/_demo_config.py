"""The demo's sizes (:class:`DemoConfig`): read by the command (its options) and by the job.

Its own module so that ``shardload demo --help`` and the job share it without
importing each other (the job loads torch and Lightning).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from shardload._base import envvars


def default_workdir() -> Path:
    """``$XDG_CACHE_HOME/shardload/demo``, or ``~/.cache/shardload/demo``."""
    base = os.environ.get(envvars.XDG_CACHE_HOME) or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardload" / "demo"


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo; the defaults take a couple of minutes on 2 CPU cores.

    The fields with ``help`` metadata are the options of ``shardload demo`` (:mod:`shardload.cli._flags`).
    """

    workdir: Path = field(
        default_factory=default_workdir,
        metadata={"help": "where to write (default $XDG_CACHE_HOME/shardload/demo or ~/.cache/shardload/demo)"},
    )
    train_samples: int = field(default=20_000, metadata={"help": None, "metavar": "N", "min": 1})
    # deliberately not divisible by the world size
    val_samples: int = field(default=2_001, metadata={"help": None, "metavar": "N", "min": 1})
    devices: int = field(default=2, metadata={"help": "DDP processes (CPU, gloo)", "metavar": "N", "min": 1})
    max_tokens: int = field(default=8192, metadata={"help": "token budget per batch", "metavar": "T", "min": 1})
    channels: int = 16
    workers: int = 2
    seed: int = 0
