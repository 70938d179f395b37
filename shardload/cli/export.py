"""Write a shard set as WebDataset tar shards, for pipelines that stream tars from object storage.

Each sample becomes one member per field, `<key>.<field>.npy` (numpy's .npy
format, never pickled), where the key is the sample id zero-padded to 9
digits; tars are named DEST/shard-000000.tar, shard-000001.tar, ... and hold
samples in id order. DEST/_shardload_export.json, written last, records the
schema, the tars and their checksums. `shardload prepare` reads the tars back
into the same samples (the command to do it is printed at the end).

DEST must be empty or new; --overwrite replaces an earlier export there, which
stays intact until the new one is complete. Exporting the same set twice gives
byte-identical tars.
"""

from __future__ import annotations

import argparse
import shlex

from shardload.cli._common import Exit, positive_int, print_json, python_hint

SUMMARY = "write a shard set as WebDataset tar shards (round-trips through prepare)"

EPILOG = """examples:
  shardload export out/ --to webdataset wds/
  shardload export out/ --to webdataset wds/ --samples-per-tar 10000 --overwrite --json
  shardload prepare 'wds/shard-{000000..000003}.tar' -o again/ --no-shuffle   # and back

""" + python_hint(
    "from shardload.integrations.webdataset_export import to_webdataset",
    "result = to_webdataset('out/', 'wds/', samples_per_tar=10_000)",
    "webdataset.WebDataset(result.pattern).decode()   # sample['tokens.npy'] is the array",
    "shardload.prepare(result.pattern, 'again/', shuffle=False)",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="SET", help="a shard set directory")
    p.add_argument("--to", required=True, choices=("webdataset",), help="the format to write")
    p.add_argument("dest", metavar="DEST", help="the directory to write the tars into (empty or new)")
    p.add_argument(
        "--samples-per-tar",
        type=positive_int,
        metavar="N",
        help="samples in each tar (the last may hold fewer); default: one tar per shard of the set",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in DEST")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (log lines instead)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    from shardload.integrations.webdataset_export import to_webdataset

    result = to_webdataset(
        args.path,
        args.dest,
        samples_per_tar=args.samples_per_tar,
        overwrite=args.overwrite,
        progress=False if args.no_progress else None,
    )
    if args.json:
        print_json(result.to_json())
        return Exit.OK
    print(
        f"exported {result.path} to {result.dest}: {result.samples:,} samples in {len(result.tars):,} tars, "
        f"{_mb(result.bytes)} ({result.seconds:.1f} s)"
    )
    if result.tars:
        print(f"stream it:    webdataset.WebDataset({result.pattern!r}).decode()")
        back = " ".join(
            shlex.quote(a) for a in ("shardload", "prepare", result.pattern, "-o", "OUT", *result.prepare_options)
        )
        print(f"import it:    {back}")
    return Exit.OK


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"
