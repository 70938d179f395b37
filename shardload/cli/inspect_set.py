"""Describe a shard set: fields, sizes, shard balance and the distribution of sample lengths.

Reads only manifest.json and the memory-mapped lengths index, never a shard, so
it is instant even for a set of 100,000 shards. The histogram uses log-spaced
bins: long-tailed lengths are what make padding expensive.
"""

from __future__ import annotations

import argparse

from shardload.cli._common import CommandError, Exit, add_remote_flags, print_json, python_hint, remote_of

SUMMARY = "describe a shard set (fields, sizes, length distribution)"

EPILOG = """examples:
  shardload inspect out/
  shardload inspect out/ --json | jq .lengths.p99
  shardload inspect out/ --plot lengths.png     # needs matplotlib: pip install shardload[plot]
  shardload inspect s3://bucket/sets/train      # fetches manifest and lengths index into the node cache

""" + python_hint(
    "from shardload.sets.describe import describe, plot_lengths",
    "info = describe('out/')          # the --json object, as a dict",
    "ds = shardload.open('out/')      # ds.lengths: the memory-mapped lengths index",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="OUT", help="a shard set directory or URL")
    p.add_argument("--json", action="store_true", help="print the description as one JSON object on stdout")
    p.add_argument("--plot", metavar="FILE.png", help="also save a histogram of the lengths to this image")
    add_remote_flags(p)


def run(args: argparse.Namespace) -> int:
    from shardload.sets.describe import describe, format_description, plot_lengths

    remote = remote_of(args)
    info = describe(args.path, remote=remote)
    if args.plot:
        try:
            plot_lengths(args.path, args.plot, remote=remote)
        except ImportError as exc:
            raise CommandError(str(exc), Exit.USAGE) from None
        except OSError as exc:
            raise CommandError(f"{args.plot}: cannot write the plot ({exc.strerror or exc})", Exit.OUTPUT) from None
    if args.json:
        print_json(info)
    else:
        print(format_description(info))
        if args.plot:
            print(f"plot:      {args.plot}")
    return Exit.OK
