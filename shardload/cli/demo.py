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
from pathlib import Path

from shardload.cli._common import Exit, positive_int, python_hint

SUMMARY = "run the main job on synthetic data: prepare, verify, plan, DDP training with exact validation"

EPILOG = """examples:
  shardload demo
  shardload demo --devices 3 --train-samples 50000 --workdir /tmp/shardload-demo

""" + python_hint(
    "dm = shardload.ShardDataModule(train='WORKDIR/sets/train', val='WORKDIR/sets/val', max_tokens=8192)",
    "trainer.fit(model, datamodule=dm)",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    # No import of shardload.demo here: it loads torch and Lightning, which `--help` does not need.
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where to write (default $XDG_CACHE_HOME/shardload/demo or ~/.cache/shardload/demo)",
    )
    p.add_argument("--train-samples", type=positive_int, default=20_000, metavar="N")
    p.add_argument("--val-samples", type=positive_int, default=2_001, metavar="N")
    p.add_argument("--devices", type=positive_int, default=2, metavar="N", help="DDP processes (CPU, gloo)")
    p.add_argument("--max-tokens", type=positive_int, default=8192, metavar="T", help="token budget per batch")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="also print the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    from shardload.demo import DemoConfig, default_workdir, run_demo

    cfg = DemoConfig(
        workdir=args.workdir or default_workdir(),
        train_samples=args.train_samples,
        val_samples=args.val_samples,
        devices=args.devices,
        max_tokens=args.max_tokens,
    )
    report = run_demo(cfg, progress=False if args.no_progress else None)
    if args.json:
        print(json.dumps(report, default=str))
    ok = report["verify_ok"] and report["fit"]["exact"]
    return Exit.OK if ok else Exit.PROBLEMS
