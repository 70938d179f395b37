"""Put a finished local shard set into object storage, manifest last; checked before and after.

The set is verified first (every byte, as `shardload verify` checks it): a
damaged set is refused before anything is uploaded. Then the shards are put
(4 at a time), then the lengths indexes and origins; every object is compared
with its file (size, and MD5 where the store's ETag is one), and only then is
manifest.json put, and read back: a reader never opens a half-uploaded set.
Run again after a stop (Ctrl-C, a crash, storage failing after every retry),
it puts only the objects that are missing or differ. Another shard set at the
URL is refused unless --force. Credentials and endpoint come from the
environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, ...).
"""

from __future__ import annotations

import argparse

from shardload.cli._common import positive_int, print_json, python_hint

SUMMARY = "put a finished local shard set into object storage (s3://, gs://, az://)"

EPILOG = """examples:
  shardload upload out/ s3://bucket/sets/train
  shardload upload out/ s3://bucket/sets/train           # again after a stop: puts what is missing
  shardload upload out/ s3://bucket/sets/train --force   # replace another set there
  shardload verify s3://bucket/sets/train                # every byte, downloaded through the cache

""" + python_hint(
    "from shardload.sets.upload import upload_set",
    "result = upload_set('out/', 's3://bucket/sets/train')   # storage_options={...} for credentials",
    "ds = shardload.open('s3://bucket/sets/train')",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="SET", help="the local shard set directory (the -o of prepare)")
    p.add_argument("url", metavar="URL", help="where to put it: s3://BUCKET/PREFIX (or gs://, az://)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace another shard set at URL (its manifest is deleted first, its other objects at the end)",
    )
    p.add_argument("--workers", type=positive_int, default=1, metavar="N", help="shards verified in parallel (threads)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (log lines instead)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    from shardload.sets.upload import upload_set

    result = upload_set(
        args.path, args.url, force=args.force, workers=args.workers, progress=False if args.no_progress else None
    )
    if args.json:
        print_json(result.to_json())
        return 0
    skipped = result.objects - result.uploaded_objects
    print(
        f"{'replaced the set at' if result.replaced else 'uploaded'} {result.url}: {result.shards:,} shards, "
        f"{result.samples:,} samples; put {result.uploaded_objects:,} of {result.objects:,} objects "
        f"({result.uploaded_bytes:,} of {result.bytes:,} bytes), {skipped:,} already there and identical"
    )
    print(f"check it: shardload verify {result.url}")
    print(f"load it:  shardload.open({result.url!r})")
    return 0
