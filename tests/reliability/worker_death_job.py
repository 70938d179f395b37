"""Kill one DataLoader worker with SIGKILL mid-epoch; the loop must raise, not hang.

Run by test_worker_death.py under a watchdog. Prints ``RAISED <message>`` when
the loader raised, ``FINISHED`` if the epoch somehow completed.
"""

from __future__ import annotations

import os
import signal
import sys

import psutil

import shardload
from shardload.testing import synthetic_samples


def main(out: str) -> None:
    shardload.write(synthetic_samples(400, seed=5), out, num_shards=8, progress=False)
    loader = shardload.make_loader(out, rank=0, world_size=1, batch_size=4, num_workers=2, prefetch_factor=2)
    try:
        for i, _batch in enumerate(loader):
            if i == 2:
                workers = psutil.Process().children()
                assert len(workers) == 2, workers
                os.kill(workers[0].pid, signal.SIGKILL)
                print(f"KILLED {workers[0].pid}", flush=True)
    except Exception as exc:  # noqa: BLE001  report whatever came out, then exit non-zero
        print(f"RAISED {type(exc).__name__}: {exc}", flush=True)
        sys.exit(3)
    print("FINISHED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
