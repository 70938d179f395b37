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
from dataclasses import MISSING, fields

from shardload.cli._common import Exit, python_hint
from shardload.cli._demo_config import DemoConfig

SUMMARY = "run the main job on synthetic data: prepare, verify, plan, DDP training with exact validation"

EPILOG = """examples:
  shardload demo
  shardload demo --devices 3 --train-samples 50000 --workdir /tmp/shardload-demo

""" + python_hint(
    "dm = shardload.ShardDataModule(train='WORKDIR/sets/train', val='WORKDIR/sets/val', max_tokens=8192)",
    "trainer.fit(model, datamodule=dm)",
)


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
