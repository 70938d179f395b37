"""Check every shard of a set against its manifest, reading every byte.

For each shard: the file exists, its size and sha256 checksum match, the
format's reader opens it, it holds the expected number of samples, and the
lengths index (and each per-field index) agrees with its offsets. Each problem
is printed as one line naming the shard, the file and a reason code: missing,
truncated, size_mismatch, checksum_mismatch, unreadable, wrong_count,
lengths_mismatch. The exit status is 1 when anything is wrong. A URL is
checked through the node cache: every shard is downloaded (or found there),
its sha256 compared, then checked as a local one; a copy found damaged in the
cache is downloaded again and checked afresh (a line says so; not a problem
of the set when the new copy is good).
"""

from __future__ import annotations

import argparse

from shardload.cli._common import Exit, add_remote_flags, positive_int, print_json, python_hint, remote_of

SUMMARY = "check every shard against the manifest (exit 1 on problems)"

EPILOG = """examples:
  shardload verify out/
  shardload verify out/ --workers 8 --json > report.json
  shardload verify s3://bucket/sets/train --cache-limit 20GiB   # downloads every shard through the cache

""" + python_hint(
    "from shardload.sets.verify import verify",
    "report = verify('out/')   # report.ok, report.problems, report.to_json()",
    "ds = shardload.open('out/')",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="OUT", help="a shard set directory or URL")
    p.add_argument("--workers", type=positive_int, default=1, metavar="N", help="shards checked in parallel (threads)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (log lines instead)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")
    add_remote_flags(p)


def run(args: argparse.Namespace) -> int:
    from shardload.remote.url import is_remote
    from shardload.sets.verify import verify

    report = verify(
        args.path, workers=args.workers, progress=False if args.no_progress else None, remote=remote_of(args)
    )
    if args.json:
        print_json(report.to_json())
        return Exit.OK if report.ok else Exit.PROBLEMS
    for repaired in report.refetched:  # the node cache's damage, repaired: not a problem of the set
        print(f"shard {repaired.shard} ({repaired.file}): {repaired.detail}")
    if report.ok:
        print(f"ok: {report.shards:,} shards, {report.samples:,} samples verified")
    else:
        for problem in report.problems:
            print(problem)
        print(
            f"FAILED: {len(report.problems)} problem(s) in {len(report.damaged_shards)} of {report.shards:,} shards "
            f"of {report.path}; re-run prepare (with --overwrite) to rebuild the set"
            + (", or put the local set there again (shardload upload SET URL)" if is_remote(args.path) else "")
        )
    return Exit.OK if report.ok else Exit.PROBLEMS
