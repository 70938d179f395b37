"""Run the main job end to end on synthetic data, with no arguments.

Generates a long-tailed variable-length dataset (token sequences and 2D float
arrays) in a cache directory, prepares it with progress bars, inspects and
verifies it, reports the plan (equal batch counts per rank, padding waste with
and without bucketing), then trains a small model for one epoch with
Lightning DDP on CPU processes (gloo) and checks that the validation loss
logged with sync_dist=True equals the exact loss over every sample.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from shardload.cli._common import Exit, positive_int, python_hint

SUMMARY = "run the main job on synthetic data: prepare, verify, plan, DDP training with exact validation"

EPILOG = """examples:
  shardload demo
  shardload demo --devices 3 --train-samples 50000 --workdir /tmp/shardload-demo

""" + python_hint(
    "dm = shardload.ShardDataModule(train='WORKDIR/sets/train', val='WORKDIR/sets/val', max_tokens=8192)",
    "trainer.fit(model, datamodule=dm)",
)


def default_workdir() -> Path:
    """``$XDG_CACHE_HOME/shardload/demo``, or ``~/.cache/shardload/demo``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    # No import of the job here: it loads torch and Lightning, which `--help` does not need.
    for f in fields(DemoConfig):
        if "option" in f.metadata:
            # A default made by a factory is made when the config is built: None here means "not given".
            default = None if f.default is MISSING else f.default
            p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=default, **f.metadata["option"])
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="also print the report as one JSON object")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """The :class:`DemoConfig` of the parsed options (the defaults for those not given)."""
    given = {f.name: getattr(args, f.name) for f in fields(DemoConfig) if "option" in f.metadata}
    return DemoConfig(**{name: value for name, value in given.items() if value is not None})


def run(args: argparse.Namespace) -> int:
    from shardload.cli._demo_job import run_demo

    report = run_demo(config_from_args(args), progress=False if args.no_progress else None)
    if args.json:
        print(json.dumps(report, default=str))
    ok = report["verify_ok"] and report["fit"]["exact"]
    return Exit.OK if ok else Exit.PROBLEMS
