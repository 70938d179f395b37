#!/usr/bin/env python
"""What the loader's stats cost: CPU time per batch with ``LoaderOptions(stats=True)`` against ``stats=False``.

Writes a long-tailed token set (``shardload.testing.synthetic_samples``), then reads it with two loaders
that differ only in ``stats``, and a second loader with ``stats=False`` (the A/A pair: how far two equal
loaders' figures differ under the machine's load, the noise floor of the ratio), without workers (the stats
are taken in the training process, so that is where their cost shows), in ``--rounds`` interleaved rounds of
one epoch each (on, off, off2, then reversed, ...), and prints the median CPU time (``time.process_time``)
per batch of each, the ratios on/off and off2/off, and the cost of the recorder alone per batch (its two calls
on a real batch, timed in a loop). Small batches are the worst case: the stats' cost is per batch, the
loader's grows with the batch.

    python tools/bench_stats.py                          # batch sizes 8 and 64, 9 rounds
    python tools/bench_stats.py --samples 2000 --rounds 3 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import shardload
from shardload.load.stats import StatsRecorder
from shardload.testing import synthetic_samples


def epoch_cpu(loader: Any) -> float:
    """CPU seconds per batch of one pass."""
    start = time.process_time()
    n = sum(1 for _ in loader)
    return (time.process_time() - start) / n


def recorder_cost(loader: Any, repeat: int) -> float:
    """CPU seconds per batch of the recorder alone: ``asked()`` and ``got()`` on a real batch."""
    batch = next(iter(loader))
    rec = StatsRecorder("tokens")
    start = time.process_time()
    for _ in range(repeat):
        rec.got(rec.asked(), batch)
    return (time.process_time() - start) / repeat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--batch-sizes", default="8,64")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "set"
        samples = ({"tokens": s["tokens"]} for s in synthetic_samples(args.samples, seed=0))
        shardload.write(samples, path, num_shards=8, progress=False)
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            loaders = {
                name: shardload.make_loader(
                    path,
                    batch_size=batch_size,
                    loader_options=shardload.LoaderOptions(stats=name == "on", pin_memory=False),
                    rank=0,
                    world_size=1,
                )
                for name in ("on", "off", "off2")
            }
            for loader in loaders.values():
                epoch_cpu(loader)  # warm: shards mapped, page cache
            times: dict[str, list[float]] = {name: [] for name in loaders}
            for r in range(args.rounds):
                for name in list(loaders) if r % 2 == 0 else reversed(list(loaders)):
                    times[name].append(epoch_cpu(loaders[name]))
            on_us, off_us, off2_us = (statistics.median(times[k]) * 1e6 for k in ("on", "off", "off2"))
            alone_us = recorder_cost(loaders["off"], 20_000) * 1e6
            rows.append(
                {
                    "batch_size": batch_size,
                    "batches": len(loaders["on"]),
                    "on_us": on_us,
                    "off_us": off_us,
                    "off2_us": off2_us,
                    "ratio": on_us / off_us,
                    "noise_ratio": off2_us / off_us,
                    "recorder_us": alone_us,
                }
            )
    print("| batch size | batches | CPU us/batch, stats on | off | off2 | on / off | off2 / off | recorder, us/batch |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['batch_size']} | {row['batches']} | {row['on_us']:.1f} | {row['off_us']:.1f} | "
            f"{row['off2_us']:.1f} | {row['ratio']:.3f} | {row['noise_ratio']:.3f} | {row['recorder_us']:.2f} |"
        )
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
