"""Make OUT one shard set from the parts that `prepare --part K/N` wrote into OUT/parts/.

No shard is copied: the merged manifest lists every part's shards where they
are, and the lengths index is the parts' concatenated, in part order (sample
ids follow part order whichever part finished first). The manifest is written
last; merging an already merged OUT again changes nothing. A missing part, one
not finished, one from another run, or one with another schema or options is
refused by name, and OUT is left as it was.
"""

from __future__ import annotations

import argparse

from shardload.cli._common import print_json, python_hint

SUMMARY = "make one shard set of the parts written by prepare --part"

EPILOG = """examples:
  for k in 0 1 2 3; do shardload prepare data/*.parquet -o out/ --part $k/4; done   # one machine each
  shardload merge out/
  shardload verify out/

""" + python_hint(
    "import shardload",
    "shardload.merge('out/')        # the same merge",
    "ds = shardload.open('out/')    # one set: every part's samples, in part order",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="OUT", help="the output of the parts (holds parts/KKKKK-of-NNNNN/)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    import shardload

    result = shardload.merge(args.path)
    if args.json:
        print_json(result.to_json())
        return 0
    what = "merged" if result.changed else "already merged, unchanged:"
    print(
        f"{what} {result.path}: {result.samples:,} samples in {result.shards:,} shards from {result.parts:,} parts, "
        f"{result.tokens:,} tokens"
    )
    print(f"load it: shardload.open({result.path!r})")
    return 0
