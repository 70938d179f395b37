"""Dry-run the batch plan of a shard set: what every rank would get for one epoch.

Plans all ranks from the lengths index alone (no shard is read, no process
group is needed) and prints, per rank: batches, real samples, filler rows, real
tokens, padded tokens (rows x padded length, what the GPU computes on) and the
padding fraction, plus the spread between the slowest and the fastest rank
(max/min padded tokens). Every rank has the same number of batches: that is
the planner's guarantee, and this table shows what it costs. It also sizes the
node-local cache a remote set needs: the bytes of the distinct shards each rank
reads this epoch (no shard fetched twice), those of its largest batch (the least
cache that works) and, with ``--ranks-per-node``, those of each node's ranks together.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from shardload.cli._common import CommandError, Exit, add_remote_flags, int_at_least, print_json, python_hint, remote_of
from shardload.cli._flags import add_option_flags, options_from_args
from shardload.plan import Batching, EpochSpec

if TYPE_CHECKING:
    from shardload.sets.mixture import MixedSets, Mixture
    from shardload.sets.shardset import ShardSet

SUMMARY = "dry-run the per-rank batch plan (batches, padding, balance)"

EPILOG = """examples:
  shardload plan out/ --world-size 8 --max-tokens 16384 --pad-to-multiple-of 8
  shardload plan out/ --world-size 4 --batch-size 32 --stage val --json
  shardload plan out/ --world-size 2 --batch-size 4 --with-ids --json > plan.json
  shardload plan out/ --world-size 8 --packing --pack-length 4096 --rows-per-batch 8
  shardload plan out/ --world-size 16 --batch-size 32 --ranks-per-node 8   # cache per node of 8 ranks
  shardload plan s3://bucket/sets/train --world-size 8 --max-tokens 16384   # manifest + lengths only
  shardload plan --source web=sets/web:0.7 --source code=sets/code:0.3 --world-size 8 --max-tokens 16384

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
    p.add_argument("path", metavar="OUT", nargs="?", help="a shard set directory or URL (or give --source instead)")
    mix = p.add_argument_group("a mixture of shard sets (shardload.Mixture), instead of OUT")
    mix.add_argument(
        "--source",
        action="append",
        metavar="NAME=PATH[:WEIGHT]",
        help="a source of the mixture, repeated once per source in order; give every source a weight, or none "
        "(proportions by size)",
    )
    mix.add_argument(
        "--by", choices=("tokens", "samples"), default="tokens", help="what weights count (default: tokens)"
    )
    mix.add_argument(
        "--epoch-tokens", type=int_at_least(1), metavar="N", help="tokens in a training epoch (--by tokens)"
    )
    mix.add_argument(
        "--epoch-samples", type=int_at_least(1), metavar="N", help="samples in a training epoch (--by samples)"
    )
    mix.add_argument("--max-repeats", type=int_at_least(1), metavar="N", help="refuse using a sample more often")
    add_option_flags(p.add_argument_group("the epoch to plan (EpochSpec)"), EpochSpec)
    add_option_flags(
        p.add_argument_group("batching (Batching)"), Batching, one_of=("batch_size", "max_tokens", "packing")
    )
    p.add_argument(
        "--ranks-per-node",
        type=int_at_least(1),
        default=1,
        metavar="K",
        help="ranks sharing one node's cache (ranks kK..kK+K-1 are node k): also print the cache each node needs",
    )
    p.add_argument("--json", action="store_true", help="print the plan summary as one JSON object on stdout")
    p.add_argument(
        "--with-ids",
        action="store_true",
        help="with --json: add each rank's batch_sample_ids and batch_weights (large!)",
    )
    add_remote_flags(p)


def run(args: argparse.Namespace) -> int:
    import shardload
    from shardload.plan import summarize_plan

    if args.with_ids and not args.json:
        raise CommandError("--with-ids adds the batches to the JSON output: add --json", Exit.USAGE)
    if (args.path is None) == (args.source is None):
        raise CommandError("give a shard set directory OUT, or a mixture with --source NAME=PATH[:WEIGHT]", Exit.USAGE)
    spec, batching = options_from_args(EpochSpec, args), options_from_args(Batching, args)
    if args.ranks_per_node > spec.world_size:
        raise CommandError(
            f"--ranks-per-node {args.ranks_per_node} is more than --world-size {spec.world_size}: give the ranks "
            "of one node",
            Exit.USAGE,
        )
    remote = remote_of(args)
    opened = shardload.open(args.path, remote=remote) if args.path is not None else mixture_of(args).open(remote)
    summary = summarize_plan(
        opened.plan_inputs(),
        spec,
        batching,
        with_ids=args.with_ids,
        shard_bytes=shard_bytes_of(opened),
        ranks_per_node=args.ranks_per_node,
    )
    if args.json:
        print_json(summary.to_dict())
    else:
        print(summary.format())
    return Exit.OK


def shard_bytes_of(opened: ShardSet | MixedSets) -> NDArray[np.int64]:
    """``(S,)`` every shard's bytes from the manifest(s): a mixture's sources one after another."""
    from shardload.sets.mixture import MixedSets

    sets = opened.sets if isinstance(opened, MixedSets) else (opened,)
    return np.array([shard.bytes for one in sets for shard in one.shards], dtype=np.int64)


def mixture_of(args: argparse.Namespace) -> Mixture:
    """The :class:`~shardload.Mixture` of the ``--source`` flags (a bad one is a usage error)."""
    from shardload.errors import PlanError
    from shardload.sets.mixture import Mixture

    sources: dict[str, str] = {}
    weights: dict[str, float] = {}
    for text in args.source:
        name, sep, where = text.partition("=")
        if not sep or not name or not where:
            raise CommandError(f"--source {text!r}: expected NAME=PATH or NAME=PATH:WEIGHT", Exit.USAGE)
        path, colon, weight = where.rpartition(":")
        try:
            if colon and path:
                weights[name] = float(weight)
                where = path
        except ValueError:  # a ':' that is part of the path, unless the path is only what comes before it
            if Path(path).exists() and not Path(where).exists():
                raise CommandError(
                    f"--source {text!r}: the weight {weight!r} of source {name!r} is not a number (give a "
                    "decimal number such as 0.7)",
                    Exit.USAGE,
                ) from None
        if name in sources:
            raise CommandError(f"--source {name!r} is given twice: each source once", Exit.USAGE)
        sources[name] = where
    try:
        return Mixture(
            sources,
            weights=weights or None,
            by=args.by,
            epoch_tokens=args.epoch_tokens,
            epoch_samples=args.epoch_samples,
            max_repeats=args.max_repeats,
        )
    except PlanError as exc:
        raise CommandError(f"--source: {exc}", Exit.USAGE) from None
