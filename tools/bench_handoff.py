#!/usr/bin/env python
"""How fast a DataLoader worker hands batches to the main process: one shared buffer vs by value.

Each batch is one buffer of ``--sizes`` KiB plus small vectors, built in a
worker and sent either as torch tensors in shared memory (one storage; what
torch does with any tensor a worker returns) or as numpy arrays, which go
through the worker's pipe by value. Prints batches per second for each, best
of two epochs of ``--batches`` batches. ``shardload.load.dataset.SHARED_FROM_BYTES``
is set from where the two cross.

    python tools/bench_handoff.py
    python tools/bench_handoff.py --workers 2,8 --sizes 64,512,1024
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset[Any]):
    def __init__(self, mode: str, nbytes: int, n: int) -> None:
        self.mode, self.nbytes, self.n = mode, nbytes, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.mode == "shared":
            buf = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(self.nbytes + 1536))  # type: ignore[no-untyped-call]
            buf.numpy()[: self.nbytes].fill(1)
            return {"data": buf[: self.nbytes], "ids": buf[self.nbytes : self.nbytes + 512].view(torch.int64)}
        data = np.empty(self.nbytes, np.uint8)
        data.fill(1)
        return {"data": data, "lengths": np.zeros(64, np.int64), "ids": np.zeros(64, np.int64)}


def _as_is(batch: Any) -> Any:
    return batch


def rate(mode: str, kib: int, workers: int, batches: int) -> float:
    loader = DataLoader(Batches(mode, kib << 10, batches), batch_size=None, num_workers=workers, collate_fn=_as_is)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        n = sum(1 for _ in loader)
        best = min(best, time.perf_counter() - t0)
    return n / best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="2", help="num_workers values, comma-separated")
    p.add_argument("--sizes", default="64,256,512,768,1024,2048,4096", help="batch sizes in KiB, comma-separated")
    p.add_argument("--batches", type=int, default=1000, help="batches per epoch")
    args = p.parse_args(argv)
    print(f"{os.cpu_count()} CPUs, torch {torch.__version__}; batches per second")
    print("| workers | batch KiB | one shared buffer | by value | by value / shared |")
    print("|---:|---:|---:|---:|---:|")
    for w in (int(x) for x in args.workers.split(",")):
        for kib in (int(x) for x in args.sizes.split(",")):
            shared, value = rate("shared", kib, w, args.batches), rate("value", kib, w, args.batches)
            print(f"| {w} | {kib} | {shared:,.0f} | {value:,.0f} | {value / shared:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
