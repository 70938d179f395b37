"""Dry-run the batch plan of a shard set: what every rank would get for one epoch.

Plans all ranks from the lengths index alone (no shard is read, no process
group is needed) and prints, per rank: batches, real samples, filler rows, real
tokens, padded tokens (rows x padded length, what the GPU computes on) and the
padding fraction, plus the spread between the slowest and the fastest rank
(max/min padded tokens). Every rank has the same number of batches: that is
the planner's guarantee, and this table shows what it costs.
"""

from __future__ import annotations

import argparse

from shardload.cli._common import CommandError, Exit, print_json, python_hint
from shardload.cli._flags import add_option_flags, options_from_args
from shardload.plan import Batching, EpochSpec

SUMMARY = "dry-run the per-rank batch plan (batches, padding, balance)"

EPILOG = """examples:
  shardload plan out/ --world-size 8 --max-tokens 16384 --pad-to-multiple-of 8
  shardload plan out/ --world-size 4 --batch-size 32 --stage val --json
  shardload plan out/ --world-size 2 --batch-size 4 --with-ids --json > plan.json
  shardload plan out/ --world-size 8 --packing --pack-length 4096 --rows-per-batch 8

the epoch and batching flags are the fields of shardload.plan.EpochSpec and
shardload.plan.Batching (--max-tokens is max_tokens=...); one of --batch-size,
--max-tokens and --packing is needed.

""" + python_hint(
    "from shardload.plan import Batching, EpochSpec, summarize_plan",
    "ds = shardload.open('out/')",
    "summary = summarize_plan(ds.plan_inputs(), EpochSpec(world_size=8),",
    "                         Batching(max_tokens=16384, pad_to_multiple_of=8))",
    "print(summary.format())   # summary.to_dict() is what --json prints",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="OUT", help="a shard set directory")
    add_option_flags(p.add_argument_group("the epoch to plan (EpochSpec)"), EpochSpec)
    add_option_flags(
        p.add_argument_group("batching (Batching)"), Batching, one_of=("batch_size", "max_tokens", "packing")
    )
    p.add_argument("--json", action="store_true", help="print the plan summary as one JSON object on stdout")
    p.add_argument(
        "--with-ids",
        action="store_true",
        help="with --json: add each rank's batch_sample_ids and batch_weights (large!)",
    )


def run(args: argparse.Namespace) -> int:
    import shardload
    from shardload.plan import summarize_plan

    if args.with_ids and not args.json:
        raise CommandError("--with-ids adds the batches to the JSON output: add --json", Exit.USAGE)
    spec, batching = options_from_args(EpochSpec, args), options_from_args(Batching, args)
    summary = summarize_plan(shardload.open(args.path).plan_inputs(), spec, batching, with_ids=args.with_ids)
    if args.json:
        print_json(summary.to_dict())
    else:
        print(summary.format())
    return Exit.OK
