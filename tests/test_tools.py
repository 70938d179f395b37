"""Every benchmark in tools/ still runs: each script at its smallest size, as a real subprocess.

The speed and memory figures of docs/benchmarks.md come from ``tools/bench_*.py`` and
``tools/sim_cache.py``, which nothing else runs: a script that no longer runs (an option the
library now refuses, a renamed function) would go unnoticed until someone needs its figures.
Each case runs one script under the watchdog (cwd and ``PYTHONPATH`` the repository root,
``TMPDIR`` the test's own directory), checks that it exited 0, and reads what it printed or
wrote: the JSON where the script offers one, else its table, checking that the figures it
exists for are there and finite (and, where a figure has a bound that holds at any size, the
bound: Belady's optimum never downloads more than LRU, bucketing pads less than random batches).
Nothing is written into the repository: outputs go under ``tmp_path``, and every case checks
that ``docs/`` and ``tools/`` are unchanged. ``bench_gpu.py`` runs in its ``--device cpu``
smoke mode. ``bench_loaders.py`` runs the contestants the test extra installs; the ones from
the ``bench`` extra are not installed in CI (one is hidden on purpose, to check how a missing
contestant is reported).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.watchdog import REPO, Outcome, python, run_with_watchdog

pytestmark = pytest.mark.slow

TOOLS = REPO / "tools"
#: seconds of idle time before the watchdog stops a case (a busy one gets 3x): a hang, not slowness
TIMEOUT = 120.0
#: the loaders that the test extra installs (the `bench` extra's litdata, streaming, hf are not in CI)
INSTALLED_LOADERS = "memmap,npy,shardload,shardload-bucketed,shardload-zarr,webdataset"


# -- reading what a script printed ---------------------------------------------------------------------------------
def last_json(output: str) -> Any:
    """The last JSON object or list in ``output`` that starts a line (scripts print it last)."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    for m in re.finditer(r"^[\[{]", output, flags=re.M):
        try:
            found.append(decoder.raw_decode(output, m.start())[0])
        except json.JSONDecodeError:
            continue
    assert found, f"no JSON in the output:\n{output[-3000:]}"
    return found[-1]


def table(output: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table whose header line starts with ``header``."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
    assert start is not None, f"no table {header!r} in the output:\n{output[-3000:]}"
    rows = []
    for line in lines[start + 2 :]:  # after the header and its |---| line
        if line.startswith("<!--"):
            continue
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    assert rows, f"table {header!r} has no rows:\n{output[-3000:]}"
    return rows


def number(text: str) -> float:
    """The first number in ``text`` (``1,234``, ``0.5 s``, ``12.3%``, ``1.2x``), checked finite."""
    m = re.search(r"-?\d[\d,]*(\.\d+)?(e[-+]?\d+)?", text)
    assert m, f"no number in {text!r}"
    value = float(m.group(0).replace(",", ""))
    assert math.isfinite(value), text
    return value


def positive(*values: Any) -> None:
    for v in values:
        assert isinstance(v, int | float) and math.isfinite(v) and v > 0, values


# -- the checks, one per case ----------------------------------------------------------------------------------------
def check_elastic(out: str, tmp: Path) -> None:
    rows = table(out, "| batching | plan the epoch on the new size |")
    assert [r[0] for r in rows] == ["max_tokens=16384, bucketing", "max_tokens=16384", "packing L=4096 R=8"]
    for r in rows:
        assert all(number(c) >= 0 for c in r[1:4]), r
        after = re.fullmatch(r"(\d+) \(after (\d+)\)", r[4])
        assert after and int(after.group(1)) > 0, r
    assert "peak RSS" in out


def check_elastic_baseline(out: str, tmp: Path) -> None:
    rows = table(out, "| batching | plan the epoch on the new size |")
    # one run of each library (both this checkout here): the same plan, so the same batches
    assert [r[-1] for r in rows] == ["this checkout", "baseline"] and rows[0][4] == rows[1][4], rows
    assert all(re.fullmatch(r"[\d.]+ s \(CPU [\d.]+ s\)", r[2]) for r in rows), rows
    ratio = re.search(r"packing L=4096 R=8: wall .* = ([\d.]+), CPU .* = ([\d.]+)", out)
    assert ratio and float(ratio.group(1)) > 0 and float(ratio.group(2)) > 0, out[-2000:]


def check_mix(out: str, tmp: Path) -> None:
    rows = table(out, "| batching | stage |")
    assert {(r[0].strip("`").split("=")[0].split()[0], r[1]) for r in rows} == {
        (b, s) for b in ("max_tokens", "batch_size", "packing") for s in ("train", "val")
    }
    for r in rows:
        assert number(r[2]) >= 0 and number(r[3]) >= 0 and number(r[4]) > 0, r


def check_webdataset(out: str, tmp: Path) -> None:
    rows = {r[0]: r for r in table(out, "| step | shardload s |")}
    assert set(rows) == {"write", "read"}
    for r in rows.values():
        assert number(r[1]) > 0 and number(r[2]) > 0 and number(r[3]) > 0, r
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["samples"] == 300 and figures["write_ratio"] > 0 and figures["read_ratio"] > 0


def check_epoch_length(out: str, tmp: Path) -> None:
    rows = {}
    for kind in ("alike", "unlike"):
        section = out.split(f"== {kind}:")[1].split("==")[0]
        for line in section.splitlines()[2:]:
            m = re.match(r"(.+?)\s+(\d+)/\s*([\d.]+)/(\d+)\s+(\d+)\s+([\d.]+)x\s+([\d.]+)x\s+(\d+)", line)
            if m:
                rows[(kind, m.group(1).strip())] = m.groups()[1:]
    assert len(rows) == 10, out
    for (kind, mode), (low, mean, high, steady, steps, padded, draws) in rows.items():
        # the run's steps reach every epoch's natural count, or that epoch was drawn again; split batches pad no more
        assert int(steady) >= int(high) or int(draws) > 0, (kind, mode)
        assert int(steady) >= int(low) and float(steps) == pytest.approx(int(steady) / float(mean), abs=1e-3)
        assert float(padded) <= 1.001, (kind, mode, padded)
    assert rows[("alike", "batch_size=32")][4] == "1.000"


def check_plan(out: str, tmp: Path) -> None:
    for batching in ("batch_size=32", "max_tokens=16384"):
        m = re.search(rf"plan_rank {batching}: ([\d.]+) s median.*?; (\d+) batches/rank", out)
        assert m and int(m.group(2)) > 0, out
    padding = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\s*(\w+ \w+) \(.*?padding ([\d.]+)%", out, re.M)}
    assert set(padding) == {"bucketed batch_size", "random batch_size", "bucketed max_tokens", "greedy max_tokens"}
    assert padding["bucketed batch_size"] < padding["random batch_size"], padding
    assert padding["bucketed max_tokens"] < padding["greedy max_tokens"], padding


def check_plan_balance(out: str, tmp: Path) -> None:
    rows = table(out, "| data | ranks | batching | step efficiency |")
    assert {r[0] for r in rows} == {"long-tailed", "source-like", "source-like, shards differ"}
    for r in rows:
        assert 0 < number(r[3]) <= 1 and number(r[4]) >= 1, r


def check_pack(out: str, tmp: Path) -> None:
    fill = table(out, "| data | ranks | batching | fill |")
    for data in ("long-tailed", "text-like"):
        mine = {r[2].split(" L=")[0].split(" max_tokens")[0]: number(r[3]) for r in fill if r[0] == data}
        assert set(mine) == {"packing", "bucketed", "random", "random batch_size=8"}, fill
        assert all(0 < v <= 100 for v in mine.values()), mine
        assert mine["packing"] > mine["random"], mine
    rows = table(out, "| data | items | L | rows |")
    assert len(rows) == 2 and all(number(r[3]) > 0 and number(r[5]) >= 0 for r in rows), rows
    timing = table(out, "| samples | EpochPlanner")
    assert [number(r[0]) for r in timing] == [10_000] and number(timing[0][3]) > 0, timing
    filler = table(out, "| data | samples | R | ranks | cut at tokens")
    assert [(r[0], r[3]) for r in filler] == [(d, w) for d in ("two-corpora", "text-like", "long-tailed") for w in "28"]
    for r in filler:  # the re-cut never needs more batches than the cut at tokens; within one, the cut is kept
        assert 0 < number(r[8]) <= number(r[4]), r
        assert number(r[7]) > 1 or r[8:12] == r[4:8], r


def check_pack_baseline(out: str, tmp: Path) -> None:
    timing = table(out, "| samples | EpochPlanner")
    libraries = [r[-2] for r in timing]
    assert libraries == ["this checkout", "baseline"] * 2 + ["median, this checkout", "median, baseline"], timing
    assert all(number(r[3]) > 0 and number(r[4]) > 0 and number(r[-1]) > 10 for r in timing), timing  # MiB of RSS
    assert len({r[5] for r in timing[:4]}) == 1, timing  # the same batch counts with either library
    ratio = re.search(
        r"after/before \(10,000 samples, medians of 2 runs each\): wall ([\d.]+), CPU ([\d.]+), peak RSS ([\d.]+)", out
    )
    assert ratio and all(float(ratio.group(k)) > 0 for k in (1, 2, 3)), out[-2000:]


def check_pack_load(out: str, tmp: Path) -> None:
    runs = table(out, "| run | batches")
    assert [r[-1] for r in runs] == ["this checkout", "baseline"] * 2 + ["this checkout", "baseline"], runs
    assert len({(r[1], r[2]) for r in runs[:4]}) == 1, runs  # the same batches and tokens with either library
    assert all(number(r[3]) > 0 and number(r[4]) > 0 for r in runs), runs
    ratio = re.search(r"after/before \(loading, medians of 2 runs each\): wall ([\d.]+), CPU ([\d.]+)", out)
    assert ratio and float(ratio.group(1)) > 0 and float(ratio.group(2)) > 0, out[-2000:]


def check_sim_cache(out: str, tmp: Path) -> None:
    results = json.loads((tmp / "cache.json").read_text())["results"]
    assert set(results) == {"equal sizes", "sizes by tokens"}
    for label, rows in results.items():
        assert {(r["ranks"], r["cache_fraction"]) for r in rows} == {(1, 0.25), (1, 1.0), (2, 0.25), (2, 1.0)}
        for r in rows:
            for policy in ("planned", "planned-steps", "lru", "belady"):
                # every shard read is fetched at least once, and no more often than it is read
                assert r["distinct_shards"] <= r[policy]["fetches"] <= r["reads"], (label, r)
            if label == "equal sizes":  # Belady is the optimum for equal sizes
                assert r["belady"]["fetches"] <= r["lru"]["fetches"], r
    assert "| ranks | cache / working set | downloads: planned |" in out


def check_handoff(out: str, tmp: Path) -> None:
    rows = table(out, "| workers | batch KiB | one shared buffer | by value |")
    assert [(r[0], r[1]) for r in rows] == [("1", "64")]
    assert all(number(c) > 0 for c in rows[0][2:]), rows


def check_stats(out: str, tmp: Path) -> None:
    rows = last_json(out)
    assert [r["batch_size"] for r in rows] == [4], rows
    for r in rows:
        assert r["batches"] > 0 and all(math.isfinite(r[k]) and r[k] > 0 for k in ("on_us", "off_us", "recorder_us"))
        assert r["ratio"] == pytest.approx(r["on_us"] / r["off_us"])


def check_integrity(out: str, tmp: Path) -> None:
    for pattern in (r"os\.fstat: ([\d.]+) us", r"stamp check \(one shard\): ([\d.]+) us"):
        m = re.search(pattern, out)
        assert m and float(m.group(1)) > 0, out
    fetches = re.findall(r"fetch of (\d+) samples over (\d+) shards: (\d+) us", out)
    assert [(b, s) for b, s, _ in fetches] == [("32", "1"), ("32", "8"), ("256", "8")], out
    m = re.search(r"prepare of (\d+) MB: ([\d.]+) s, of which the set id ([\d.]+) s \(([\d.]+)%\)", out)
    assert m and float(m.group(2)) > 0 and 0 <= float(m.group(4)) <= 100, out


def check_zarr(out: str, tmp: Path) -> None:
    report = last_json(out)
    variants = report["variants"]
    assert "arrow" in variants and any(name.startswith("zarr ") for name in variants), variants
    for v in variants.values():
        positive(v["disk_mb"], v["vs_arrow"], v["samples_per_s"], v["mb_per_s"])
    assert variants["arrow"]["vs_arrow"] == 1.0
    for store in ("zip", "directory"):
        positive(report["zip_vs_directory"][store]["chunks"], report["zip_vs_directory"][store]["mb_per_s"])


def check_prepare(out: str, tmp: Path) -> None:
    report = last_json(out)
    assert report["samples"] == 300 and report["payload_bytes"] > 0
    assert [s["step"][:3] for s in report["steps"]] == ["(a)", "(b)", "(c)", "(d)", "(e)"]
    for s in report["steps"]:
        positive(s["seconds"], s["mb_per_s"])
    assert not any((tmp / "work").iterdir()), "bench_prepare left its files without --keep"


def check_prepare_big(out: str, tmp: Path) -> None:
    steps = {s["step"]: s for s in last_json(out)["steps"]}
    for kind in ("JSONL", "Parquet", "npy dir"):
        for w in (1, 2):
            s = steps[f"{kind}: shardload prepare, workers={w}"]
            positive(s["seconds"], s["in"], s["out"])
    positive(steps["Parquet: pq.read_table + write Arrow IPC"]["seconds"])
    assert table(out, "| step | seconds | CPU seconds |")


def check_prepare_memory(out: str, tmp: Path) -> None:
    runs = last_json(out)["runs"]
    assert sorted((r["method"], r["data_bytes"]) for r in runs) == [
        (m, mb * 1_000_000) for m in ("current", "legacy") for mb in (1, 2)
    ]
    for r in runs:
        positive(r["peak_delta"], r["ratio"], r["shard_bytes"])
        assert math.isfinite(r["marginal_ratio"]), r


def check_startup(out: str, tmp: Path) -> None:
    rows = last_json(out)
    assert sorted((r["batching"], r["start"]) for r in rows) == sorted(
        (b, s) for b in ("batch_size=32", "max_tokens=16384") for s in ("cold", "new process", "warm")
    )
    for r in rows:
        positive(r["total"], r["total cpu"], r["stage sum"])


def check_startup_open(out: str, tmp: Path) -> None:
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)]
    assert [int(r[0]) for r in rows] == [10, 100], out
    assert all(float(r[3]) > 0 for r in rows), rows


def check_memory(out: str, tmp: Path) -> None:
    runs = {r["mode"]: r for r in last_json(out)}
    assert set(runs) == {"shardload", "naive"}
    for run in runs.values():
        assert [r["rank"] for r in run["ranks"]] == [0, 1]
        assert all(r["batches"] > 0 for r in run["ranks"])
        positive(run["total_rss"], run["total_pss"], *(p[0] for p in run["peaks"]))
    # the two ways iterate the same planned batches: every rank sums the same tokens
    assert [r["tokens_sum"] for r in runs["shardload"]["ranks"]] == [r["tokens_sum"] for r in runs["naive"]["ranks"]]
    assert "USS vs naive" in out


def check_remote(out: str, tmp: Path) -> None:
    row = r"^(local|s3 prefetch 4|s3 prefetch off) +([\d.]+) +([\d.]+) +([\d.]+) +(\d+) +(-|(\d+) / [\d.]+ MB)$"
    rows = {m.group(1): m for m in re.finditer(row, out, flags=re.M)}
    assert set(rows) == {"local", "s3 prefetch 4", "s3 prefetch off"}, out
    assert len({m.group(5) for m in rows.values()}) == 1, out  # the same epoch's batches from each
    for name, m in rows.items():
        assert float(m.group(2)) <= float(m.group(3)) <= float(m.group(4)), out  # open, first batch, epoch
        assert name == "local" or m.group(7) == "4", out  # every one of the 4 shards downloaded once
    opened = re.search(r"GETs (\{.*?\}), HEADs \d+; open took .*; failed: (\d+)", out)
    assert opened, out
    gets = ast.literal_eval(opened.group(1))
    assert gets.get("manifest.json") == 1 and opened.group(2) == "0", out  # the manifest fetched once for the node


def check_gpu(out: str, tmp: Path) -> None:
    report = json.loads((tmp / "gpu.json").read_text())
    assert report["device"] == "cpu"
    assert [(r["max_tokens"], r["workers"]) for r in report["loader_to_device"]] == [(16384, 0), (16384, 2)]
    for r in report["loader_to_device"]:
        positive(r["batches"], r["bytes"], r["gb_per_s"], r["staged_gb_per_s"])
    assert [r["workers"] for r in report["training"]] == [0, 2]
    for r in report["training"]:
        positive(r["step_ms_resident"], r["step_ms_loader"], r["slowdown"])
    assert "| model | workers | ms/step, resident data |" in out


def check_tokenize(out: str, tmp: Path) -> None:
    import shardload

    report = json.loads((tmp / "tokenize.json").read_text())
    hidden = {"hf-datasets", "litdata", "mosaic"}  # hidden (see CASES): reported unavailable, the run goes on
    batched = "map_batch" in {f.name for f in dataclasses.fields(shardload.PrepareOptions)}
    expected = {"shardload-file", "shardload-files", "floor"} | (
        {"shardload-batched-file", "shardload-batched-files"} if batched else set()
    )
    assert set(report["unavailable"]) == hidden | ({"shardload-batched-file", "shardload-batched-files"} - expected)
    for name in hidden:
        assert report["unavailable"][name].startswith("unavailable: ImportError"), report["unavailable"]
        assert f"note: {name} skipped, unavailable" in out
    rows = {r["contestant"]: r for r in report["results"]}
    assert set(rows) == expected and not report["errors"], report
    records = report["text"]["records"]
    for name, r in rows.items():
        positive(r["best_s"], r["median_s"], r["cpu_s"], r["peak_rss_mb"], r["tokens"])
        positive(r["time_vs_floor_median"], r["cpu_vs_floor"])
        assert r["best_s"] <= r["median_s"] and len(r["rounds_s"]) == 1, r
        assert r["speed_vs_hf_best"] is None and r["cpu_vs_hf"] is None and r["peak_vs_hf"] is None, r  # no HF
        assert name == "floor" or r["output_mb"] > 0, r
        # Invariant: every contestant holds one sample per record and the same tokens (exactness check)
        assert (r["samples"], r["tokens"], r["id_sum"]) == (records, rows["floor"]["tokens"], rows["floor"]["id_sum"])
    assert report["exact"] and rows["floor"]["time_vs_floor_median"] == 1.0
    assert len(table(out, "| contestant | best s |")) == len(rows)


def check_loaders(workers: int) -> Callable[[str, Path], None]:
    def check(out: str, tmp: Path) -> None:
        report = json.loads((tmp / "loaders.json").read_text())
        # litdata is hidden (see run_case): reported unavailable, the run goes on without it
        assert list(report["unavailable"]) == ["litdata"], report["unavailable"]
        assert report["unavailable"]["litdata"].startswith("unavailable: ImportError"), report["unavailable"]
        assert "note: litdata skipped, unavailable" in out
        ran = {r["contestant"]: r for r in report["results"]}
        assert set(ran) == set(INSTALLED_LOADERS.split(",")), ran
        for name, r in ran.items():
            assert "error" not in r and r["exactly_once"] and r["num_workers"] == workers, (name, r)
            positive(r["samples_per_s"], r["payload_mb_per_s"], r["peak_rss_bytes"])
        assert {q["contestant"] for q in report["ratios"]} == {"shardload", "shardload-bucketed", "shardload-zarr"}
        for q in report["ratios"]:
            positive(q["vs_memmap"], q["vs_memmap_cpu"], q["vs_best_library"])
        assert (tmp / "loaders.png").stat().st_size > 0
        assert table(out, "| dataset | contestant | workers |")

    return check


# -- the cases ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    script: str
    args: Callable[[Path], list[str]]
    check: Callable[[str, Path], None]
    hide: tuple[str, ...] = field(default=())  # modules made unimportable (a contestant not installed)


def loaders_args(dataset: str, workers: int) -> Callable[[Path], list[str]]:
    return lambda t: [
        *("--scale", "0.001", "--datasets", dataset, "--workers", str(workers), "--workdir", str(t / "work")),
        *("--only", INSTALLED_LOADERS + ",litdata", "--json", str(t / "loaders.json"), "--png", str(t / "loaders.png")),
    ]


CASES = {
    "bench_elastic": Case(
        "bench_elastic.py", lambda t: ["--samples", "20000", "--from", "4", "--to", "3", "--packing"], check_elastic
    ),
    "bench_elastic-baseline-tree": Case(
        "bench_elastic.py",
        lambda t: [
            *("--samples", "20000", "--from", "4", "--to", "3", "--packing-only"),
            *("--baseline-tree", str(REPO), "--repeat", "1"),
        ],
        check_elastic_baseline,
    ),
    "bench_epoch_length": Case(
        "bench_epoch_length.py",
        lambda t: ["--samples", "20000", "--shards", "32", "--world-size", "4", "--epochs", "5"],
        check_epoch_length,
    ),
    "bench_gpu": Case(
        "bench_gpu.py",
        lambda t: [
            *("--device", "cpu", "--scale", "0.001", "--steps", "2", "--warmup", "1", "--workers", "0,2"),
            *("--models", "small", "--budgets", "16384", "--train-tokens", "256"),
            *("--workdir", str(t / "work"), "--json", str(t / "gpu.json")),
        ],
        check_gpu,
    ),
    "bench_handoff": Case(
        "bench_handoff.py", lambda t: ["--workers", "1", "--sizes", "64", "--batches", "20"], check_handoff
    ),
    "bench_integrity": Case("bench_integrity.py", lambda t: ["--scale", "0.05"], check_integrity),
    "bench_loaders-tokens": Case("bench_loaders.py", loaders_args("tokens", 0), check_loaders(0), hide=("litdata",)),
    "bench_loaders-features": Case(
        "bench_loaders.py", loaders_args("features", 2), check_loaders(2), hide=("litdata",)
    ),
    "bench_memory": Case(
        "bench_memory.py",
        lambda t: ["--scale", "0.005", "--sizes", "1", "--world-size", "2", "--cache-dir", str(t / "work"), "--json"],
        check_memory,
    ),
    "bench_stats": Case(
        "bench_stats.py", lambda t: ["--samples", "200", "--batch-sizes", "4", "--rounds", "1", "--json"], check_stats
    ),
    "bench_mix": Case("bench_mix.py", lambda t: ["--samples", "10000", "--world-size", "4", "--runs", "1"], check_mix),
    "bench_pack": Case(
        "bench_pack.py",
        lambda t: [
            *("--samples", "10000", "--world-size", "4", "--items", "1000", "--pack-lengths", "4096"),
            *("--timing-samples", "10000", "--timing-world-size", "4"),
            *("--filler-samples", "10000", "--filler-world-size", "2", "8", "--filler-rows-per-batch", "1"),
        ],
        check_pack,
    ),
    "bench_pack-baseline-tree": Case(
        "bench_pack.py",
        lambda t: [
            *("--parts", "time", "--timing-samples", "10000", "--timing-world-size", "4"),
            *("--baseline-tree", str(REPO), "--repeat", "2"),
        ],
        check_pack_baseline,
    ),
    "bench_pack-load": Case(
        "bench_pack.py",
        lambda t: ["--parts", "load", "--load-samples", "300", "--baseline-tree", str(REPO), "--repeat", "2"],
        check_pack_load,
    ),
    "bench_plan": Case(
        "bench_plan.py",
        lambda t: ["--samples", "20000", "--world-size", "4", "--repeats", "1", "--summary-samples", "20000"],
        check_plan,
    ),
    "bench_plan-balance": Case(
        "bench_plan.py", lambda t: ["--balance", "--samples", "10000", "--balance-ranks", "3"], check_plan_balance
    ),
    "bench_prepare": Case(
        "bench_prepare.py",
        lambda t: ["--samples", "300", "--workers", "1", "--workdir", str(t / "work"), "--json"],
        check_prepare,
    ),
    "bench_prepare-big": Case(
        "bench_prepare.py", lambda t: ["--big", "0.3", "--workdir", str(t / "work"), "--json"], check_prepare_big
    ),
    "bench_prepare_memory": Case(
        "bench_prepare_memory.py",
        lambda t: ["--shard-mb", "1", "2", "--dtypes", "int32", "--workdir", str(t / "work"), "--json"],
        check_prepare_memory,
    ),
    "bench_remote": Case(
        "bench_remote.py", lambda t: ["--shards", "4", "--procs", "2", "--start-delay", "3"], check_remote
    ),
    "bench_startup": Case(
        "bench_startup.py",
        lambda t: ["--scale", "0.001", "--repeats", "1", "--cache-dir", str(t / "work"), "--json"],
        check_startup,
    ),
    "bench_startup-open": Case(
        "bench_startup.py",
        lambda t: ["--open-only", "10,100", "--repeats", "1", "--cache-dir", str(t / "work")],
        check_startup_open,
    ),
    "bench_tokenize": Case(
        "bench_tokenize.py",
        lambda t: [
            *("--mb", "0.3", "--rounds", "1", "--vocab", "300", "--train-mb", "0.1"),
            *("--workdir", str(t / "work"), "--json", str(t / "tokenize.json")),
        ],
        check_tokenize,
        hide=("datasets", "litdata", "streaming"),
    ),
    "bench_webdataset": Case(
        "bench_webdataset.py",
        lambda t: ["--samples", "300", "--per-tar", "100", "--rounds", "1", "--json"],
        check_webdataset,
    ),
    "bench_zarr": Case("bench_zarr.py", lambda t: ["--samples", "300", "--json"], check_zarr),
    "sim_cache": Case(
        "sim_cache.py",
        lambda t: [
            *("--shards", "32", "--samples-per-shard", "20", "--world-size", "4", "--ranks-per-node", "2"),
            *("--fractions", "0.25,1.0", "--json", str(t / "cache.json")),
        ],
        check_sim_cache,
    ),
}


def snapshot() -> dict[str, tuple[int, int]]:
    """(mtime, size) of every file under docs/ and tools/ (what a script could overwrite by default)."""
    return {
        str(p.relative_to(REPO)): (p.stat().st_mtime_ns, p.stat().st_size)
        for top in ("docs", "tools")
        for p in (REPO / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def run_case(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    (tmp_path / "work").mkdir()
    env = {"TMPDIR": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    if case.hide:  # a package of that name that fails to import, ahead of the real one (if any)
        for name in case.hide:
            (tmp_path / "hidden" / name).mkdir(parents=True)
            (tmp_path / "hidden" / name / "__init__.py").write_text(f"raise ImportError('{name} is hidden')\n")
        env["PYTHONPATH"] = f"{tmp_path / 'hidden'}:{REPO}"
    monkeypatch.chdir(REPO)
    return run_with_watchdog(python(str(TOOLS / case.script), *case.args(tmp_path)), timeout=TIMEOUT, env=env)


@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_runs_and_reports(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[name]
    before = snapshot()
    res = run_case(case, tmp_path, monkeypatch)
    assert not res.hung, res.tail()
    assert res.returncode == 0, res.tail()
    case.check(res.output, tmp_path)
    assert snapshot() == before, "the script wrote into docs/ or tools/"


def test_every_benchmark_script_has_a_case() -> None:
    scripts = {p.name for p in TOOLS.glob("bench_*.py")} | {"sim_cache.py"}
    assert scripts == {case.script for case in CASES.values()}


def test_the_import_graph_tool_counts_modules_lines_and_cycles() -> None:
    out = subprocess.run(
        [sys.executable, str(TOOLS / "import_graph.py"), "--top-level"], capture_output=True, text=True, check=True
    ).stdout
    m = re.match(r"(\d+) modules, ([\d,]+) lines\n", out)
    files = list((TOOLS.parent / "shardload").rglob("*.py"))
    assert m and int(m.group(1)) == len(files), out
    assert int(m.group(2).replace(",", "")) == sum(len(f.read_text().splitlines()) for f in files)
    cycles = re.search(r"^(\d+) import cycles", out, re.M)
    assert cycles and len(re.findall(r"^  shardload\S* <-> ", out, re.M)) == int(cycles.group(1)), out


def test_the_plan_digest_is_the_same_on_every_run_and_moves_with_a_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(TOOLS))
    try:
        import plan_digest
    finally:
        sys.path.remove(str(TOOLS))
    first, again = (
        plan_digest.main(["--cases", "30", "--large", "0"]),
        plan_digest.main(["--cases", "30", "--large", "0"]),
    )
    # Invariant: the digest is a function of the plans alone (seeded requests, no time, no randomness)
    assert first.hash.hexdigest() == again.hash.hexdigest() and first.planned > 30 and first.refused >= 0
    real = plan_digest.plan_rank
    monkeypatch.setattr(
        plan_digest, "plan_rank", lambda *a, **k: dataclasses.replace(real(*a, **k), weights=0 * real(*a, **k).weights)
    )
    # Invariant: a plan that changes changes the digest
    assert plan_digest.main(["--cases", "30", "--large", "0"]).hash.hexdigest() != first.hash.hexdigest()
