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

from shardload.cli._common import Exit, python_hint
from shardload.cli._demo_config import DemoConfig
from shardload.cli._flags import add_option_flags, options_from_args

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
    add_option_flags(p, DemoConfig)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="also print the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    from shardload.cli._demo_job import run_demo

    report = run_demo(options_from_args(DemoConfig, args), progress=False if args.no_progress else None)
    if args.json:
        print(json.dumps(report, default=str))
    ok = report["verify_ok"] and report["fit"]["exact"]
    return Exit.OK if ok else Exit.PROBLEMS
