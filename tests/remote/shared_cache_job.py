"""One rank of a node reading a remote set through the node cache it shares with the other rank.

usage: shared_cache_job.py URL CACHE_DIR OUT_DIR PORT   (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE in the environment;
credentials and endpoint in the AWS_* environment)

The ranks meet at a gloo barrier, then open the set at the same moment and read epoch 0 with no
workers and epoch 1 with two; each writes ``rank<R>.json``: a digest per batch, the mirror it read and its pid.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

import shardload
from shardload.remote import RemoteOptions
from tests.distributed.torchrun_job import finish
from tests.remote.shared_cache_digest import READS, digest


def main(url: str, cache: str, out: str, port: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    remote = RemoteOptions(cache_dir=cache)
    dist.barrier()  # both ranks open the set together: the manifest must still be fetched once
    ss = shardload.open(url, remote=remote)
    record: dict[str, object] = {"pid": os.getpid(), "mirror": str(ss.path), "samples": len(ss)}
    for name, kw in READS.items():
        loader = shardload.make_loader(url, rank=rank, world_size=world, remote=remote, **kw)
        record[name] = [digest(b) for b in loader]
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    finish()  # barrier, leave the group, exit without gloo's teardown (which sometimes aborts)


if __name__ == "__main__":
    main(*sys.argv[1:5])
