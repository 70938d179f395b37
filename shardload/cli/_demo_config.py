"""The demo's sizes (:class:`DemoConfig`): read by the command (its options) and by the job.

Its own module so that ``shardload demo --help`` and the job share it without
importing each other (the job loads torch and Lightning).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardload._base import envvars
from shardload.cli._common import positive_int


def default_workdir() -> Path:
    """``$XDG_CACHE_HOME/shardload/demo``, or ``~/.cache/shardload/demo``."""
    base = os.environ.get(envvars.XDG_CACHE_HOME) or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardload" / "demo"


def _option(help_text: str | None = None, *, parse: Any = positive_int, metavar: str | None = "N") -> dict[str, Any]:
    """Field metadata that makes a :class:`DemoConfig` field a ``shardload demo`` option."""
    return {"option": {"type": parse, "metavar": metavar, "help": help_text}}


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo; the defaults take a couple of minutes on 2 CPU cores.

    The one place of the demo's defaults: the fields with ``option`` metadata
    are the options of ``shardload demo`` (``train_samples`` ->
    ``--train-samples``), with these defaults.
    """

    workdir: Path = field(
        default_factory=default_workdir,
        metadata=_option(
            "where to write (default $XDG_CACHE_HOME/shardload/demo or ~/.cache/shardload/demo)",
            parse=Path,
            metavar=None,
        ),
    )
    train_samples: int = field(default=20_000, metadata=_option())
    # deliberately not divisible by the world size
    val_samples: int = field(default=2_001, metadata=_option())
    devices: int = field(default=2, metadata=_option("DDP processes (CPU, gloo)"))
    max_tokens: int = field(default=8192, metadata=_option("token budget per batch", metavar="T"))
    channels: int = 16
    workers: int = 2
    seed: int = 0
