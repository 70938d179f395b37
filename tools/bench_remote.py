#!/usr/bin/env python
"""Remote shard sets: time to the first batch from a cold node cache, an epoch, and the open once per node.

Writes a set of ``--shards`` small shards, uploads it through the S3 API to a
local ``rclone serve s3`` (the test extra's server, started as the tests do),
then, each in a new Python process with an empty cache directory:

* ``open`` (``shardload.open``: the manifest's stamp, the manifest and lengths
  indexes downloaded), ``make_loader`` and the first batch (its shards
  downloaded), then the rest of the epoch; rank 0 of 1, ``num_workers=0``;
* the same with the prefetcher on (the default, 4 downloads at once) and off
  (``prefetch_downloads=0``), and on the set on disk;
* the bytes downloaded (the cache's own ``.downloads`` log).

Then ``--procs`` processes open the set at the same moment with one empty
cache, through a request-counting proxy in front of the server: the manifest
and lengths indexes must be fetched once for the node (GETs in the proxy log).

    PYTHONPATH=. python tools/bench_remote.py                 # 1,000 shards
    PYTHONPATH=. python tools/bench_remote.py --shards 50     # smoke run
    PYTHONPATH=. python tools/bench_remote.py --shards 4 --procs 2 --start-delay 3   # smallest run

The figures are wall-clock seconds on this machine, with the server on the
same machine (no network latency: a real object store adds ~10-50 ms per request).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def child(args: argparse.Namespace) -> None:
    """In a new process: open, make_loader, first batch, the epoch; prints one JSON line."""
    t0 = time.perf_counter()
    import shardload
    import shardload.load.loader  # torch: paid once per process, before make_loader; not counted below
    from shardload.remote import RemoteOptions

    if args.path.startswith("s3://"):
        import s3fs  # noqa: F401  (and botocore: imported once per process, not counted in "open")

    t_import = time.perf_counter() - t0
    remote = None
    if args.path.startswith("s3://"):
        remote = RemoteOptions(cache_dir=args.cache, prefetch_downloads=args.prefetch)
    if args.start_at:
        time.sleep(max(0.0, args.start_at - time.time()))
    t0 = time.perf_counter()
    ss = shardload.open(args.path, remote=remote)
    t_open = time.perf_counter() - t0
    if args.open_only:
        print(json.dumps({"open_s": t_open, "samples": len(ss)}))
        return
    loader = shardload.make_loader(args.path, batch_size=16, rank=0, world_size=1, num_workers=0, remote=remote)
    it = iter(loader)
    next(it)
    t_first = time.perf_counter() - t0
    batches = 1 + sum(1 for _ in it)
    t_epoch = time.perf_counter() - t0
    logs = list(Path(args.cache).glob("sets/*/*/.downloads")) if remote else []
    lines = [line.split() for log in logs for line in log.read_text().splitlines()]
    print(
        json.dumps(
            {
                "import_s": t_import,
                "open_s": t_open,
                "first_batch_s": t_first,
                "epoch_s": t_epoch,
                "batches": batches,
                "shards_downloaded": len(lines),
                "bytes_downloaded": sum(int(x[2]) for x in lines),
            }
        )
    )


def run_child(path: str, cache: Path, env: dict[str, str], *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--path", path, "--cache", str(cache), *extra]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--samples-per-shard", type=int, default=10)
    parser.add_argument("--procs", type=int, default=4, help="processes opening the set at once")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--start-delay", type=float, default=8.0, help="seconds the --procs processes get to import before they open"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--prefetch", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--open-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d")
    if args.child:
        child(args)
        return 0

    import shardload
    from shardload.testing import synthetic_samples
    from tests.helpers.faultproxy import FaultProxy
    from tests.helpers.servers import s3_server

    with tempfile.TemporaryDirectory(prefix="bench_remote_") as tmp:
        work = Path(tmp)
        local = work / "set"
        n = args.shards * args.samples_per_shard
        shardload.write(synthetic_samples(n, seed=1), local, num_shards=args.shards, progress=False)
        size = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
        print(f"set: {n:,} samples, {args.shards:,} shards, {size / 1e6:.1f} MB on disk")
        with s3_server(work / "s3" / "root") as s3:
            t0 = time.perf_counter()
            fs = s3.filesystem()
            fs.put(str(local) + "/", "bucket/set", recursive=True)  # concurrent PUTs through the S3 API
            print(f"upload through the S3 API: {time.perf_counter() - t0:.1f} s")
            url = "s3://bucket/set"
            env = {**os.environ, **s3.env(), "PYTHONPATH": str(REPO)}
            rows: dict[str, list[dict[str, Any]]] = {"local": [], "s3 prefetch 4": [], "s3 prefetch off": []}
            for rep in range(args.repeats):
                rows["local"].append(run_child(str(local), work / f"unused{rep}", env))
                rows["s3 prefetch 4"].append(run_child(url, work / f"cache-on{rep}", env, "--prefetch", "4"))
                rows["s3 prefetch off"].append(run_child(url, work / f"cache-off{rep}", env, "--prefetch", "0"))
            print(f"\n{'set':<16} {'open s':>8} {'1st batch s':>12} {'epoch s':>8} {'batches':>8} {'downloaded':>16}")
            for name, runs in rows.items():
                r = sorted(runs, key=lambda x: x["epoch_s"])[len(runs) // 2]
                dl = f"{r['shards_downloaded']} / {r['bytes_downloaded'] / 1e6:.2f} MB" if "s3" in name else "-"
                print(
                    f"{name:<16} {r['open_s']:>8.2f} {r['first_batch_s']:>12.2f} {r['epoch_s']:>8.2f} "
                    f"{r['batches']:>8} {dl:>16}"
                )

            with FaultProxy(s3.endpoint) as proxy:  # no fault: it counts the requests
                penv = {**env, "AWS_ENDPOINT_URL": proxy.url}
                start = time.time() + args.start_delay  # every process imported by then; they open together
                cache = work / "cache-shared"
                procs = [
                    subprocess.Popen(
                        [sys.executable, __file__, "--child", "--open-only", "--path", url, "--cache", str(cache)]
                        + ["--start-at", str(start)],
                        env=penv,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    for _ in range(args.procs)
                ]
                opens = [json.loads(p.communicate()[0].strip().splitlines()[-1])["open_s"] for p in procs]
                gets = Counter(r.path.rsplit("/", 1)[-1] for r in proxy.requests if r.method == "GET")
                heads = sum(1 for r in proxy.requests if r.method == "HEAD")
            late = [p for p in procs if p.returncode]
            print(
                f"\n{args.procs} processes opening at once with one empty cache: GETs {dict(gets)}, "
                f"HEADs {heads}; open took {min(opens):.2f}-{max(opens):.2f} s; failed: {len(late)}"
            )
    print(f"\n{started}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
