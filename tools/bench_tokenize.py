#!/usr/bin/env python
"""The tokenizing job side by side: raw text -> byte-level BPE token ids -> a dataset on disk, 2 workers each.

The job every LLM user runs first. The text is made at run time, deterministically: the ``.py``, ``.txt`` and
``.rst`` files of the Python standard library (``sysconfig``'s ``stdlib`` path, ``site-packages`` left out),
sorted by path, empty ones left out, one JSON Lines record ``{"text": ...}`` each, repeated until the file holds
``--mb`` MB (whole records; the last one crosses the mark). The same records are also cut into ``--files``
files of about equal size. A byte-level BPE tokenizer (HF ``tokenizers``, ``--vocab`` ids) is trained on the
first ``--train-mb`` MB of that text, so nothing is downloaded. Every contestant stores one sample per record
(the record's ids, int32) and does the same work per record; they differ in how they read, schedule and write:

* ``shardload-file`` / ``shardload-files``: ``shardload prepare`` with ``--map`` (one record per call), of the
  one file / of the directory of ``--files`` files;
* ``shardload-batched-file`` / ``-files``: the same with ``--map-batch N`` (a batch of N records per call,
  ``encode_batch``), run only where ``PrepareOptions`` has ``map_batch``;
* ``hf-datasets``: ``load_dataset("json")`` of the one file, ``map(batched=True, num_proc=W)`` (``encode_batch``
  of 1,000 records), ``save_to_disk``;
* ``litdata``: ``litdata.optimize(num_workers=W)`` with one input per file of the directory;
* ``mosaic``: ``streaming.MDSWriter``, W processes each with its own writer over its share of the files, then
  ``streaming.base.util.merge_index``;
* ``floor``: the tokenizer alone in W processes (each ``json.loads`` and ``encode_batch`` of every W-th record
  of the one file, ids to int32): no output, the least any contestant can do.

Each contestant runs as a fresh subprocess, interpreter start included (whole commands as a user runs them),
with every contestant once per round and the order rotated each round (``--rounds``). Per contestant: best and
median wall time, CPU time (the subprocess and its waited-for children, from ``wait4``), peak RSS summed over
its process tree (psutil, sampled every 50 ms; pages shared after a fork count once per process), the bytes of
its output, and ratios against HF datasets and against the floor of the same run. After each timed run, an
untimed subprocess reads the output back with the contestant's own reader and counts samples, tokens and the
sum of the ids: every contestant must hold the same (the exactness check; the run exits 1 otherwise).
A library that is not installed is skipped with a message (``pip install -c tools/bench-constraints.txt -e
'.[bench]'`` installs them all; docs/benchmarks.md, "Tokenizing text, side by side").

    python tools/bench_tokenize.py                          # the table of docs/benchmarks.md (39 MB, 3 rounds)
    python tools/bench_tokenize.py --mb 2 --rounds 1        # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing


def streaming_without_torchvision() -> None:
    """Let ``import streaming`` work where torchvision does not import.

    Mosaic's package imports its image datasets (``streaming.vision``, which needs torchvision) when it is
    imported; the writer and reader timed here do not use them. torchvision from PyPI does not import beside
    the pinned CPU build of torch, so where it is not installed, an empty ``streaming.vision`` stands in for it.
    """
    if importlib.util.find_spec("torchvision") is None:  # found, not imported: importing it costs each run ~1 s
        stub = types.ModuleType("streaming.vision")
        stub.__path__ = []
        sys.modules.setdefault("streaming.vision", stub)


streaming_without_torchvision()


#: contestant -> (library it needs, or None; what it is, for the table)
CONTESTANTS: dict[str, tuple[str | None, str]] = {
    "shardload-file": (None, "shardload prepare --map, 1 file"),
    "shardload-files": (None, "shardload prepare --map, {files} files"),
    "shardload-batched-file": (None, "shardload prepare --map --map-batch {batch}, 1 file"),
    "shardload-batched-files": (None, "shardload prepare --map --map-batch {batch}, {files} files"),
    "hf-datasets": ("datasets", "HF datasets map(batched=True, num_proc={workers}) + save_to_disk, 1 file"),
    "litdata": ("litdata", "LitData optimize(num_workers={workers}), {files} files"),
    "mosaic": ("streaming", "Mosaic MDSWriter, {workers} processes x 1 writer + merge_index, {files} files"),
    "floor": (None, "the tokenizer alone, {workers} processes, 1 file (no output)"),
}

#: the module of the map functions, written next to the data (the CLI imports ``--map`` from the current directory)
MAP_MODULE = '''\
"""The per-record work of every contestant of tools/bench_tokenize.py: text -> int32 ids of one tokenizer."""

import functools
import json

import numpy as np

TOKENIZER = {tokenizer!r}


@functools.cache  # once per process, on its first record
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(TOKENIZER)


def encode(sample):
    return {{"input_ids": np.asarray(tokenizer().encode(sample["text"]).ids, dtype=np.int32)}}


def encode_batch(batch):
    return {{"input_ids": [np.asarray(e.ids, dtype=np.int32) for e in tokenizer().encode_batch(batch["text"])]}}


def encode_batch_lists(batch):
    return {{"input_ids": [e.ids for e in tokenizer().encode_batch(batch["text"])]}}


def encode_file(path):
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            yield encode(json.loads(line))
'''


# -- the text and the tokenizer --------------------------------------------------------------------------------------
def stdlib_texts(record_kb: float) -> Iterator[str]:
    """The standard library's text files in path order, each cut at blank lines into records of about
    ``record_kb`` kB (0: one record per file)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(
        p
        for p in root.rglob("*")
        if p.suffix in (".py", ".txt", ".rst") and "site-packages" not in p.parts and p.is_file()
    )
    for p in paths:
        text = p.read_bytes().decode("utf-8", errors="replace")
        if not text.strip():
            continue
        if not record_kb:
            yield text
            continue
        piece = ""
        for para in text.split("\n\n"):
            piece = f"{piece}\n\n{para}" if piece else para
            if len(piece) >= record_kb * 1000:
                yield piece
                piece = ""
        if piece.strip():
            yield piece


def make_text(data: Path, mb: float, files: int, record_kb: float) -> dict[str, Any]:
    """``data/text.jsonl`` of about ``mb`` MB and the same records as ``data/parts/text-K.jsonl``."""
    lines: list[bytes] = []
    size, target = 0, int(mb * 1e6)
    texts = list(stdlib_texts(record_kb))
    while size < target:
        for text in texts:
            lines.append(json.dumps({"text": text}).encode() + b"\n")
            size += len(lines[-1])
            if size >= target:
                break
    blob = b"".join(lines)
    (data / "text.jsonl").write_bytes(blob)
    (data / "parts").mkdir()
    per_file, start = size / files, 0
    for k in range(files):
        end, taken = start, 0
        while end < len(lines) and (k == files - 1 or taken < per_file):
            taken += len(lines[end])
            end += 1
        (data / "parts" / f"text-{k}.jsonl").write_bytes(b"".join(lines[start:end]))
        start = end
    return {"records": len(lines), "bytes": size, "sha256": hashlib.sha256(blob).hexdigest()}


def train_tokenizer(data: Path, vocab: int, train_mb: float) -> dict[str, Any]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts() -> Iterator[str]:
        seen = 0
        with open(data / "text.jsonl", encoding="utf-8") as fh:
            for line in fh:
                seen += len(line)
                yield json.loads(line)["text"]
                if seen >= train_mb * 1e6:
                    return

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    t0 = time.perf_counter()
    tok.train_from_iterator(texts(), trainer)
    path = data / "tokenizer.json"
    tok.save(str(path))
    (data / "tokmap.py").write_text(MAP_MODULE.format(tokenizer=str(path)))
    return {
        "vocab": tok.get_vocab_size(),
        "train_seconds": round(time.perf_counter() - t0, 1),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


# -- one contestant, in its own process (--run) ---------------------------------------------------------------------
def run_contestant(name: str, data: Path, out: Path, workers: int, batch: int) -> dict[str, Any]:
    """The job as a user writes it; returns what a floor run counted (the others are read back after)."""
    sys.path.insert(0, str(data))
    import tokmap

    files = sorted(str(p) for p in (data / "parts").glob("*.jsonl"))
    if name == "hf-datasets":
        import datasets

        ds = datasets.load_dataset(
            "json", data_files=str(data / "text.jsonl"), split="train", cache_dir=str(out) + ".cache"
        )
        features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
        ds = ds.map(
            tokmap.encode_batch_lists, batched=True, num_proc=workers, remove_columns=["text"], features=features
        )
        ds.save_to_disk(str(out))
    elif name == "litdata":
        import litdata

        litdata.optimize(
            fn=tokmap.encode_file, inputs=files, output_dir=str(out), num_workers=workers, chunk_bytes="64MB"
        )
    elif name == "mosaic":
        from concurrent.futures import ProcessPoolExecutor

        from streaming.base.util import merge_index

        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(write_mds, [(files[k::workers], str(out / str(k))) for k in range(workers)]))
        merge_index(str(out), keep_local=True)
    elif name == "floor":
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            parts = list(
                pool.map(tokenize_share, [(str(data / "text.jsonl"), k, workers, batch) for k in range(workers)])
            )
        return {key: sum(p[key] for p in parts) for key in ("samples", "tokens", "id_sum")}
    else:
        raise SystemExit(f"no contestant {name!r}")
    return {}


def write_mds(job: tuple[list[str], str]) -> None:
    import tokmap
    from streaming import MDSWriter

    files, out = job
    with MDSWriter(out=out, columns={"input_ids": "ndarray:int32"}) as writer:
        for path in files:
            for sample in tokmap.encode_file(path):
                writer.write(sample)


def tokenize_share(job: tuple[str, int, int, int]) -> dict[str, int]:
    import numpy as np
    import tokmap

    path, k, every, batch = job
    counts = {"samples": 0, "tokens": 0, "id_sum": 0}

    def flush(texts: list[str]) -> None:
        for ids in tokmap.encode_batch({"text": texts})["input_ids"]:
            counts["samples"] += 1
            counts["tokens"] += len(ids)
            counts["id_sum"] += int(ids.sum(dtype=np.int64))

    texts: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i % every == k:
                texts.append(json.loads(line)["text"])
                if len(texts) == batch:
                    flush(texts)
                    texts = []
    flush(texts)
    return counts


# -- reading an output back (--count): samples, tokens and the sum of the ids ----------------------------------------
def count_output(name: str, out: Path) -> dict[str, int]:
    import numpy as np

    counts = {"samples": 0, "tokens": 0, "id_sum": 0}

    def add(ids: Any) -> None:
        ids = np.asarray(ids)
        counts["samples"] += 1
        counts["tokens"] += int(ids.size)
        counts["id_sum"] += int(ids.sum(dtype=np.int64))

    if name.startswith("shardload"):
        import shardload

        ss = shardload.open(out)
        for shard in range(len(ss.shards)):
            values = ss.shard_columns(shard).fields["input_ids"].values
            counts["tokens"] += int(values.size)
            counts["id_sum"] += int(values.sum(dtype=np.int64))
        counts["samples"] = len(ss)
        assert int(ss.lengths.sum()) == counts["tokens"], "the lengths index disagrees with the shards"
    elif name == "hf-datasets":
        import datasets
        import pyarrow.compute as pc

        ds = datasets.load_from_disk(str(out))
        values = pc.list_flatten(ds.data.column("input_ids"))
        counts.update(samples=len(ds), tokens=len(values), id_sum=int(pc.sum(values, min_count=0).as_py()))
    elif name == "litdata":
        import litdata

        for item in litdata.StreamingDataset(str(out)):
            add(item["input_ids"])
    elif name == "mosaic":
        from streaming import StreamingDataset

        for item in StreamingDataset(local=str(out), shuffle=False, batch_size=1):
            add(item["input_ids"])
    return counts


# -- the orchestrator ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    wall: float
    cpu: float
    peak_rss: int
    out_bytes: int
    counts: dict[str, int]


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def measure(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, float, int, int]:
    """Run ``cmd``; its wall time, CPU time (it and its waited-for children), peak RSS of its tree, status."""
    try:
        import psutil
    except ImportError:
        psutil = None
    with open(log, "wb") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
        peak = 0
        root = psutil.Process(proc.pid) if psutil else None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if root is not None:
                rss = 0
                try:
                    for p in [root, *root.children(recursive=True)]:
                        try:
                            rss += p.memory_info().rss
                        except psutil.Error:
                            pass
                except psutil.Error:
                    pass
                peak = max(peak, rss)
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, peak, proc.returncode


def child_env(data: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    # nothing can be downloaded; HF writes its caches under the run's directory (a fresh one per run), and
    # the temporary files of every library (Mosaic's locks, LitData's chunks) go there too, removed at the end
    (data.parent / "tmp").mkdir(exist_ok=True)
    env.update(
        HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(data / "hf-home"), TMPDIR=str(data.parent / "tmp")
    )
    return env


def contestant_command(name: str, data: Path, out: Path, args: argparse.Namespace) -> list[str]:
    if name.startswith("shardload"):
        source = "text.jsonl" if name.endswith("-file") else "parts"
        cmd = [sys.executable, "-m", "shardload", "prepare", source, "-o", str(out), "--no-progress"]
        cmd += ["--workers", str(args.workers)]
        if "batched" in name:
            return cmd + ["--map", "tokmap:encode_batch", "--map-batch", str(args.batch)]
        return cmd + ["--map", "tokmap:encode"]
    return [sys.executable, __file__, "--run", name, "--data", str(data), "--out", str(out)] + [
        *("--workers", str(args.workers), "--batch", str(args.batch))
    ]


def one_run(name: str, data: Path, work: Path, args: argparse.Namespace) -> Run | str:
    out = work / name
    env = child_env(data)
    wall, cpu, peak, rc = measure(contestant_command(name, data, out, args), data, env, work / f"{name}.log")
    if rc != 0:
        return f"exit status {rc}: " + (work / f"{name}.log").read_text(errors="replace")[-2000:]
    if name == "floor":
        counts = json.loads((work / f"{name}.log").read_text().strip().splitlines()[-1])
    else:
        res = subprocess.run(
            [sys.executable, __file__, "--count", name, "--out", str(out)],
            cwd=data,
            env=env,
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            return f"reading the output back failed: {res.stdout[-1000:]}{res.stderr[-2000:]}"
        counts = json.loads(res.stdout.strip().splitlines()[-1])
    run = Run(wall, cpu, peak, tree_bytes(out), counts)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(str(out) + ".cache", ignore_errors=True)
    return run


def available(name: str) -> str | None:
    """None if the contestant can run here, else why not."""
    module = CONTESTANTS[name][0]
    if "batched" in name:
        from shardload import PrepareOptions

        if "map_batch" not in {f.name for f in dataclasses.fields(PrepareOptions)}:
            return "this shardload has no batched map (PrepareOptions.map_batch)"
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001  (any failure to import is "unavailable", said with its cause)
        return f"unavailable: {type(exc).__name__}: {exc}"
    return None


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for module in ("shardload", "tokenizers", "numpy", "pyarrow", "datasets", "litdata", "streaming", "torch"):
        try:
            found[module] = str(importlib.import_module(module).__version__)
        except Exception:  # noqa: BLE001
            pass
    return found


def summarize(name: str, runs: list[Run], args: argparse.Namespace) -> dict[str, Any]:
    walls = [r.wall for r in runs]
    return {
        "contestant": name,
        "what": CONTESTANTS[name][1].format(files=args.files, workers=args.workers, batch=args.batch),
        "best_s": round(min(walls), 2),
        "median_s": round(statistics.median(walls), 2),
        "rounds_s": [round(w, 2) for w in walls],
        "cpu_s": round(statistics.median(r.cpu for r in runs), 2),
        "peak_rss_mb": round(max(r.peak_rss for r in runs) / 1e6, 1),
        "output_mb": round(runs[-1].out_bytes / 1e6, 1),
        **runs[-1].counts,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=39.0, help="MB of JSON Lines text (default 39)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each runs every contestant once (default 3)")
    p.add_argument("--workers", type=int, default=2, help="workers / processes of every contestant (default 2)")
    p.add_argument("--files", type=int, default=8, help="files of the many-files layout (default 8)")
    p.add_argument("--record-kb", type=float, default=4.0, help="kB per record (files cut at blank lines; 0: a file)")
    p.add_argument("--batch", type=int, default=1000, help="records per batch of a batched map (default 1000)")
    p.add_argument("--vocab", type=int, default=16384, help="ids of the trained tokenizer (default 16384)")
    p.add_argument("--train-mb", type=float, default=4.0, help="MB of the text the tokenizer is trained on")
    p.add_argument("--only", default=",".join(CONTESTANTS), help="contestants, comma-separated (default: all)")
    p.add_argument("--workdir", default=None, help="where to write (default: a temp dir, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (the data and every run's log)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the figures as JSON to PATH")
    p.add_argument("--run", help=argparse.SUPPRESS)  # one contestant's job, in its own process
    p.add_argument("--count", help=argparse.SUPPRESS)  # read one output back
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run:
        print(json.dumps(run_contestant(args.run, Path(args.data), Path(args.out), args.workers, args.batch)))
        return 0
    if args.count:
        print(json.dumps(count_output(args.count, Path(args.out))))
        return 0

    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(CONTESTANTS))
    if unknown:
        p.error(f"no contestant {', '.join(unknown)}; there are {', '.join(CONTESTANTS)}")
    skipped = {n: why for n in names if (why := available(n)) is not None}
    for n, why in skipped.items():
        print(f"note: {n} skipped, {why}")
    names = [n for n in names if n not in skipped]
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="bench_tokenize-", dir=args.workdir))
    try:
        return run_all(names, skipped, root, args)
    finally:
        if args.keep:
            print(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def run_all(names: list[str], skipped: dict[str, str], root: Path, args: argparse.Namespace) -> int:
    data = root / "data"
    data.mkdir()
    text = make_text(data, args.mb, args.files, args.record_kb)
    tok = train_tokenizer(data, args.vocab, args.train_mb)
    state = {
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "load_average_start": round(os.getloadavg()[0], 2),
        **versions(),
    }
    print(
        f"text: {text['records']:,} records, {text['bytes'] / 1e6:.1f} MB of JSON Lines (sha256 {text['sha256'][:16]}), "
        f"also as {args.files} files; tokenizer: byte-level BPE, {tok['vocab']:,} ids, trained on "
        f"{args.train_mb:g} MB in {tok['train_seconds']} s (sha256 {tok['sha256'][:16]})"
    )
    print("machine: " + ", ".join(f"{k} {v}" for k, v in state.items()))
    runs: dict[str, list[Run]] = {n: [] for n in names}
    errors: dict[str, str] = {}
    for r in range(args.rounds):
        work = root / f"round-{r}"
        work.mkdir()
        for name in names[r % len(names) :] + names[: r % len(names)] if names else []:
            if name in errors:
                continue
            result = one_run(name, data, work, args)
            if isinstance(result, str):
                errors[name] = result
                print(f"error: {name} failed in round {r + 1}: {result}")
                continue
            runs[name].append(result)
            print(f"round {r + 1}: {name:24} {result.wall:7.2f} s  {result.cpu:7.2f} CPU s", flush=True)
    state["load_average_end"] = round(os.getloadavg()[0], 2)
    rows = [summarize(n, runs[n], args) for n in names if n not in errors]
    add_ratios(rows)
    exact = {(row["samples"], row["tokens"], row["id_sum"]) for row in rows}
    print_table(rows, args)
    if len(exact) > 1:
        print("EXACTNESS CHECK FAILED: the contestants hold different samples/tokens/id sums:")
        for row in rows:
            print(f"  {row['contestant']}: {row['samples']} samples, {row['tokens']} tokens, id sum {row['id_sum']}")
    elif rows:
        sample = rows[0]
        print(
            f"exactness: every contestant holds {sample['samples']:,} samples, {sample['tokens']:,} tokens "
            f"(id sum {sample['id_sum']:,}; {text['records']:,} records)"
        )
    print(f"load average: {state['load_average_start']} at the start, {state['load_average_end']} at the end")
    report = {
        "text": text,
        "tokenizer": tok,
        "machine": state,
        "rounds": args.rounds,
        "workers": args.workers,
        "results": rows,
        "unavailable": skipped,
        "errors": errors,
        "exact": len(exact) == 1,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if len(exact) <= 1 and not errors and all(r["samples"] == text["records"] for r in rows) else 1


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Ratios against HF datasets and the floor of the same run: speed (its time over the row's: above 1 is
    faster) and the row's over the floor's (1 is at the floor); CPU likewise; peak RSS the row's over HF's."""
    by = {row["contestant"]: row for row in rows}
    hf, floor = by.get("hf-datasets", {}), by.get("floor", {})
    for row in rows:
        row["speed_vs_hf_best"] = ratio(hf.get("best_s"), row["best_s"])
        row["speed_vs_hf_median"] = ratio(hf.get("median_s"), row["median_s"])
        row["cpu_vs_hf"] = ratio(hf.get("cpu_s"), row["cpu_s"])
        row["time_vs_floor_median"] = ratio(row["median_s"], floor.get("median_s"))
        row["cpu_vs_floor"] = ratio(row["cpu_s"], floor.get("cpu_s"))
        row["peak_vs_hf"] = ratio(row["peak_rss_mb"], hf.get("peak_rss_mb"))


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    def cell(v: Any, fmt: str = "{}", suffix: str = "") -> str:
        return "-" if v is None else fmt.format(v) + suffix

    ratios = ("speed_vs_hf_best", "speed_vs_hf_median", "cpu_vs_hf", "time_vs_floor_median", "cpu_vs_floor")
    print(
        "\n| contestant | best s | median s | rounds s | CPU s | peak RSS MB | output MB | speed vs HF (best) "
        "| speed vs HF (median) | CPU vs HF | time / floor (median) | CPU / floor | peak / HF |"
    )
    print("|---|" + "---:|" * 12)
    for row in rows:
        print(
            f"| {row['what']} | {row['best_s']:.2f} | {row['median_s']:.2f} | "
            f"{', '.join(f'{w:.1f}' for w in row['rounds_s'])} | {row['cpu_s']:.2f} | {row['peak_rss_mb']:,.0f} | "
            f"{row['output_mb']:,.1f} | "
            + " | ".join(cell(row[k], "{:.2f}", "x") for k in (*ratios, "peak_vs_hf"))
            + " |"
        )
    print(
        f"\n({args.rounds} rounds, order rotated each round; CPU s: median, the process and its children; "
        f"peak RSS: the largest of the rounds, summed over the process tree)"
    )


if __name__ == "__main__":
    sys.exit(main())
