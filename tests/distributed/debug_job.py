"""Two gloo ranks with make_loader(loader_options=LoaderOptions(debug=True)); rank 1 opens a different shard set.

usage: debug_job.py SET_A SET_B OUT_DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

import shardload


def rank_main(rank: int, set_a: str, set_b: str, out: str) -> None:
    # A rendezvous file, not a port: a fixed port can be taken by another job on the machine.
    dist.init_process_group("gloo", init_method=f"file://{Path(out, 'rendezvous')}", rank=rank, world_size=2)
    loader = shardload.make_loader(
        set_a if rank == 0 else set_b, batch_size=4, loader_options=shardload.LoaderOptions(debug=True)
    )
    try:
        for _ in loader:
            pass
        Path(out, f"rank{rank}.txt").write_text("finished")
    except shardload.PlanMismatchError as exc:
        Path(out, f"rank{rank}.txt").write_text(f"mismatch: {exc}")
    dist.destroy_process_group()
    # Exit without interpreter teardown, where torch+gloo on CPU sometimes aborts after the group is gone.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    mp.start_processes(rank_main, args=tuple(sys.argv[1:4]), nprocs=2, start_method="spawn")
