"""A loader whose workers can stop in fork(), as a lock held by another thread at that instant would stop them.

Run in its own interpreter: an at-fork handler cannot be removed. ``python stuck_fork_job.py SET OUT STUCK
PERSISTENT``: the first STUCK forked children sleep for ever in an ``after_in_child`` handler, before any
Python of theirs runs, so they never reach torch's worker loop (``-1``: every child). Writes OUT as JSON: the
batches' ids with workers and without, the stuck children's pids and those still alive at the end, or the
error raised.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import shardload
import shardload.load.loader as loader_module
import shardload.load.worker_start as worker_start
from shardload.load.loader import make_loader

data, out, stuck, persistent = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
worker_start.START_PATIENCE = 1.0
loader_module.START_PATIENCE = 1.0
marks = out.with_suffix(".stuck")
marks.mkdir()
places = out.with_suffix(".places")
places.mkdir()


def claim_a_place() -> bool:
    """Whether this child is one of the first STUCK: children forked together race, so each claims a numbered
    place with an exclusive create rather than counting the marks already made."""
    if stuck < 0:
        return True
    for place in range(stuck):
        try:
            os.close(os.open(places / str(place), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        return True
    return False


def stop_some_children() -> None:
    if not claim_a_place():
        return
    (marks / str(os.getpid())).touch()
    while True:  # asleep, without using the CPU: as a child waiting on an inherited lock
        time.sleep(3600)


logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s", stream=sys.stdout)


def batch_ids(workers: int, epochs: int) -> list[list[list[int]]]:
    options = shardload.LoaderOptions(num_workers=workers, persistent_workers=persistent, timeout=120)
    loader = make_loader(data, rank=0, world_size=1, max_tokens=150, seed=3, loader_options=options)
    passes = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        passes.append([b["sample_id"].tolist() for b in loader])
    return passes


expected = batch_ids(0, 2)
os.register_at_fork(after_in_child=stop_some_children)
result: dict[str, object] = {"expected": expected}
try:
    result["got"] = batch_ids(2, 2)
except shardload.ShardloadError as exc:
    result["error"] = f"{type(exc).__name__}: {exc}"
pids = [int(p.name) for p in marks.iterdir()]
result["stuck"] = pids
result["alive"] = [
    p for p in pids if Path(f"/proc/{p}").exists() and "zombie" not in Path(f"/proc/{p}/status").read_text()
]
out.write_text(json.dumps(result))
