"""One process of a node reading a remote set through a bounded node cache that other processes share.

usage: cache_pressure_job.py URL CACHE_DIR OUT_DIR RANK WORLD_SIZE WORKERS LIMIT   (credentials and endpoint
in the AWS_* environment)

The processes are separate jobs of one node (no LOCAL_WORLD_SIZE: none knows how many others read the
cache). Each reads its rank's part of the set once with ``WORKERS`` loader workers and writes
``rank<R>.json``: a digest per batch and its pid.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import shardload
from shardload.remote import RemoteOptions
from tests.remote.shared_cache_digest import digest

#: what each process reads: its rank's part of the set in order, so that a batch touches a shard or two
PRESSURE_READ: dict[str, Any] = {"stage": "val", "batching": shardload.Batching(batch_size=8, bucketing=False)}

#: seconds a process may wait for room: short, so a cache that deadlocks fails the test fast
WAIT_TIMEOUT = 20.0


def main(url: str, cache: str, out: str, rank: str, world: str, workers: str, limit: str) -> None:
    remote = RemoteOptions(cache_dir=cache, cache_limit=int(limit), wait_timeout=WAIT_TIMEOUT)
    loader = shardload.make_loader(
        url, rank=int(rank), world_size=int(world), remote=remote, num_workers=int(workers), **PRESSURE_READ
    )
    record = {"pid": os.getpid(), "batches": [digest(b) for b in loader]}
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:8])
