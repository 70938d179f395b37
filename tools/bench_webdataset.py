"""WebDataset tars: shardload's own tar writer and reader against the ``webdataset`` package, on the same data.

Why shardload writes and reads WebDataset tars itself instead of through the
``webdataset`` package (docs/design.md, "What shardload keeps of its own"):
this measures the speed side of that choice. A shard set of variable-length
``int32`` token lists and a scalar label is exported to tars two ways, and
the tars are read back two ways; rounds are interleaved and the best of each
is kept:

* write, shardload: ``to_webdataset`` (the ``shardload export`` command);
* write, webdataset: ``webdataset.ShardWriter`` with the same member names,
  tar size and fixed metadata, from samples already in memory (so its time is
  the writing alone);
* read, shardload: prepare's WebDataset source, every sample decoded to arrays
  with its safety checks (member names, sizes, end-of-archive);
* read, webdataset: ``webdataset.WebDataset(...).decode()``, every sample decoded.

Prints the times and the ratios webdataset / shardload (above 1: shardload is faster).

Examples::

    python tools/bench_webdataset.py                   # 20,000 samples, 3 rounds
    python tools/bench_webdataset.py --samples 2000 --rounds 1 --json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import shardload
from shardload.integrations.webdataset_export import to_webdataset
from shardload.prepare.sources import SourceOptions, discover, read_unit


def make_set(root: Path, samples: int) -> tuple[Path, list[dict[str, Any]]]:
    """A shard set of ``samples`` token lists (16-511 tokens) and labels, and its samples in memory."""
    rng = np.random.default_rng(0)
    data = [
        {"tokens": rng.integers(0, 50_000, int(rng.integers(16, 512)), dtype=np.int32), "label": np.int64(i % 7)}
        for i in range(samples)
    ]
    path = root / "set"
    shardload.write(data, path, num_shards=4, shuffle=False, progress=False)
    return path, data


def write_ours(set_path: Path, dest: Path, per_tar: int) -> None:
    to_webdataset(set_path, dest, samples_per_tar=per_tar, progress=False)


def write_webdataset(data: list[dict[str, Any]], dest: Path, per_tar: int) -> None:
    import webdataset as wds

    dest.mkdir()
    pattern = str(dest / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=per_tar, verbose=0, user="", group="", mode=0o644, mtime=0) as sink:
        for i, sample in enumerate(data):
            sink.write(
                {"__key__": f"{i:09d}", "tokens.npy": sample["tokens"], "label.npy": np.asarray(sample["label"])}
            )


def read_ours(tars: list[Path]) -> int:
    count = 0
    for unit in discover([str(p) for p in tars]):
        count += sum(1 for _ in read_unit(unit, SourceOptions()))
    return count


def read_webdataset(tars: list[Path]) -> int:
    import webdataset as wds

    return sum(1 for _ in wds.WebDataset([str(p) for p in tars], shardshuffle=False).decode())


def best_of(rounds: int, runs: dict[str, Callable[[int], Any]]) -> dict[str, float]:
    """The best time of each run over ``rounds`` interleaved rounds (each run gets the round number)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run(r)
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=20_000)
    p.add_argument("--per-tar", type=int, default=5_000, help="samples per tar")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-wds-"))
    set_path, data = make_set(root, args.samples)

    def tars(r: int) -> list[Path]:
        return sorted((root / f"ours{r}").glob("*.tar"))

    written = best_of(
        args.rounds,
        {
            "write shardload": lambda r: write_ours(set_path, root / f"ours{r}", args.per_tar),
            "write webdataset": lambda r: write_webdataset(data, root / f"wds{r}", args.per_tar),
        },
    )
    counts: dict[str, int] = {}
    read = best_of(
        args.rounds,
        {
            "read shardload": lambda r: counts.__setitem__("shardload", read_ours(tars(r))),
            "read webdataset": lambda r: counts.__setitem__("webdataset", read_webdataset(tars(r))),
        },
    )
    assert counts == {"shardload": args.samples, "webdataset": args.samples}, counts
    result = {
        "samples": args.samples,
        "seconds": {k: round(v, 4) for k, v in {**written, **read}.items()},
        "write_ratio": written["write webdataset"] / written["write shardload"],
        "read_ratio": read["read webdataset"] / read["read shardload"],
    }
    print(f"{args.samples:,} samples in tars of {args.per_tar:,}, best of {args.rounds} interleaved rounds")
    print("| step | shardload s | webdataset s | webdataset / shardload |")
    print("|---|---|---|---|")
    for step in ("write", "read"):
        ours, theirs = result["seconds"][f"{step} shardload"], result["seconds"][f"{step} webdataset"]
        print(f"| {step} | {ours:.3f} | {theirs:.3f} | {result[f'{step}_ratio']:.2f}x |")
    if args.json:
        print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
