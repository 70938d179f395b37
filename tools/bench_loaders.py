#!/usr/bin/env python
"""Loaders side by side: one shuffled epoch of the same data through each loader.

Generates two long-tailed datasets deterministically:

  tokens    int32 token sequences, lengths lognormal (median 256) clipped to [8, 4096], 200,000 samples;
  features  float32 arrays of shape (rows, 32), rows lognormal (median 64) clipped to [1, 2048], 50,000 samples;

writes each with every contestant's own writer, then reads one full shuffled
epoch with ``num_workers`` 0 and 2, with the same padding collate and batch size:

  memmap     baseline: one raw ``np.memmap`` of all samples + an offsets array, a torch
             DataLoader over lists of sample indices (the physical floor of Python-side loading);
             when the shardload row runs, the lists are its batches (the same samples together,
             so the same padded shapes), else a shuffle of its own;
  npy        baseline: one ``.npy`` file per sample, same DataLoader and collate;
  shardload  ``shardload.write`` + ``make_loader(batch_size=...)`` (random batches, no bucketing),
             and ``make_loader(max_tokens=...)`` (token budget, length bucketing);
  litdata    ``litdata.optimize`` + ``StreamingDataset`` / ``StreamingDataLoader``;
  streaming  MosaicML ``MDSWriter`` + ``StreamingDataset`` (local directory);
  webdataset tar shards (``ShardWriter``) + ``WebDataset`` with shard and buffer shuffling;
  hf         Hugging Face ``datasets`` (``save_to_disk``, Arrow), ``with_format("numpy")``;
  shardload-zarr  when shardload has a ``zarr`` shard format: the same random batches, in the Zarr
             set's default order (chunk windows); ``shardload-zarr-shuffled``: the same set in a full
             shuffle (``Batching(chunk_window=0)``).

Every write and every epoch runs in a fresh process, so that peak RSS (summed
over the process and its DataLoader workers) is the loader's own. The page
cache is warmed with the contestant's files before each epoch: the figures are
of the CPU side of loading, not of the disk. Each epoch is checked to yield
every sample exactly once (count, sum of lengths, sum of each sample's first
value); a contestant that fails the check is reported as such, not ranked.

    python tools/bench_loaders.py --scale 0.02          # smoke run, about two minutes
    python tools/bench_loaders.py --repeat 3            # each row the median of 3 epochs, run round robin
    python tools/bench_loaders.py                       # the full size (see docs/benchmarks.md)

Needs the competitors: ``pip install -e ".[bench]"``. A competitor that cannot
be imported is reported as "unavailable: <reason>".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from shardload.testing import long_tailed_lengths

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("litdata", "streaming", "webdataset", "hf")  # "the best other library" is the best of these
ZARR_ROWS = ("shardload-zarr", "shardload-zarr-shuffled")
CONTESTANTS = ("memmap", "npy", "shardload", "shardload-bucketed", *ZARR_ROWS, *LIBRARIES)
# Contestants that read what another one wrote.
WRITTEN_BY = {"shardload-bucketed": "shardload", "shardload-zarr-shuffled": "shardload-zarr"}


@dataclass(frozen=True)
class DataSpec:
    """One synthetic dataset: a single variable-length field."""

    name: str
    field: str
    dtype: str
    inner: tuple[int, ...]
    samples: int
    median: float
    low: int
    high: int
    seed: int

    @property
    def row_bytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * math.prod(self.inner))


SPECS = {
    "tokens": DataSpec("tokens", "tokens", "int32", (), 200_000, 256, 8, 4096, seed=1),
    "features": DataSpec("features", "features", "float32", (32,), 50_000, 64, 1, 2048, seed=2),
}


# -- data: generated once, written raw; every other writer reads its samples from there ------------------------
def generate(spec: DataSpec) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (total_rows, *inner) and ``offsets`` (samples + 1,) int64, deterministic in ``spec``."""
    lengths = long_tailed_lengths(spec.samples, median=spec.median, low=spec.low, high=spec.high, seed=spec.seed)
    offsets = np.zeros(spec.samples + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    rng = np.random.default_rng(spec.seed + 100)
    shape = (int(offsets[-1]), *spec.inner)
    values: np.ndarray
    if spec.dtype == "int32":
        values = rng.integers(0, 50_000, size=shape, dtype=np.int32)
    else:
        values = rng.standard_normal(shape, dtype=np.float32)
    return values, offsets


def write_raw(values: np.ndarray, offsets: np.ndarray, out: Path) -> None:
    """Baseline writer: all samples concatenated in one file, plus the offsets."""
    out.mkdir(parents=True)
    with open(out / "values.bin", "wb") as fh:
        fh.write(np.ascontiguousarray(values).data.cast("B"))
        os.fsync(fh.fileno())
    np.save(out / "offsets.npy", offsets)


class RawSamples:
    """The samples of a raw set as zero-copy views (what every other writer is fed)."""

    def __init__(self, raw: Path, spec: DataSpec) -> None:
        self.spec = spec
        self.offsets = np.load(raw / "offsets.npy")
        mm = np.memmap(raw / "values.bin", dtype=spec.dtype, mode="r")
        # a plain ndarray view of the map: slicing a np.memmap subclass costs ~1 us more per slice
        self.values = np.asarray(mm).reshape(-1, *spec.inner)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        o = self.offsets.tolist()
        for i in range(len(self)):
            yield self.values[o[i] : o[i + 1]]


# -- the one padding collate every non-shardload contestant uses ------------------------------------------------
def pad_collate(arrays: Sequence[np.ndarray], field: str) -> dict[str, Any]:
    """Pad a list of ``(L_i, *inner)`` arrays into ``{field: [B, L_max, *inner], field_lengths: [B]}``.

    The same contract and the same copy as shardload's collate: one preallocated
    array, zero padding, one slice copy per sample.
    """
    import torch

    b = len(arrays)
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=b)
    first = arrays[0]
    out = np.zeros((b, int(lengths.max(initial=0)), *first.shape[1:]), dtype=first.dtype)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = a
    return {field: torch.from_numpy(out), f"{field}_lengths": torch.from_numpy(lengths)}


class _Collate:
    """Picklable ``collate_fn`` around :func:`pad_collate`, optionally picking a key out of each sample."""

    def __init__(self, field: str, key: str | int | None = None) -> None:
        self.field, self.key = field, key

    def __call__(self, samples: Sequence[Any]) -> dict[str, Any]:
        if self.key is not None:
            samples = [s[self.key] for s in samples]
        return pad_collate([np.asarray(s) for s in samples], self.field)


def shuffled_batches(n: int, batch_size: int, seed: int) -> list[np.ndarray]:
    """One epoch of random batches of ``batch_size`` sample ids (the last one may be short)."""
    perm = np.random.default_rng(seed).permutation(n)
    return [perm[i : i + batch_size] for i in range(0, n, batch_size)]


# -- contestants: writers (run in a fresh process) ---------------------------------------------------------------
def write_shardload(src: RawSamples, out: Path, spec: DataSpec, fmt: str = "arrow") -> None:
    import shardload

    samples = ({spec.field: a} for a in src)
    shardload.write(samples, out, shard_format=fmt, workers=1, progress=False)


def write_npy(src: RawSamples, out: Path, spec: DataSpec) -> None:
    out.mkdir(parents=True)
    for i, a in enumerate(src):
        np.save(out / f"{i:08d}.npy", a)


class _LitSample:
    """litdata ``optimize`` function: sample ``i`` of the raw set (picklable, opens the map lazily)."""

    def __init__(self, raw: Path, spec: DataSpec) -> None:
        self.raw, self.spec = raw, spec
        self._src: RawSamples | None = None

    def __call__(self, i: int) -> dict[str, np.ndarray]:
        if self._src is None:
            self._src = RawSamples(self.raw, self.spec)
        return {self.spec.field: np.ascontiguousarray(self._src[i])}


def write_litdata(src: RawSamples, out: Path, spec: DataSpec, raw: Path) -> None:
    import litdata

    litdata.optimize(
        fn=_LitSample(raw, spec),
        inputs=list(range(len(src))),
        output_dir=str(out),
        chunk_bytes="64MB",
        num_workers=1,
        start_method="fork",
        reorder_files=False,
        verbose=False,
    )


def write_streaming(src: RawSamples, out: Path, spec: DataSpec) -> None:
    streaming = import_streaming()
    columns = {spec.field: f"ndarray:{spec.dtype}"}
    with streaming.MDSWriter(out=str(out), columns=columns, compression=None, size_limit=1 << 26) as w:
        for a in src:
            w.write({spec.field: a})


def write_webdataset(src: RawSamples, out: Path, spec: DataSpec) -> None:
    import webdataset as wds

    out.mkdir(parents=True)
    # at least 16 shards, so that shard shuffling and splitting across workers have something to work with
    per_shard = max(1, math.ceil(len(src) / 16))
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=per_shard, maxsize=1 << 26, verbose=0) as w:
        for i, a in enumerate(src):
            w.write({"__key__": f"{i:09d}", "npy": a})


def write_hf(src: RawSamples, out: Path, spec: DataSpec) -> None:
    import datasets

    if spec.inner:
        feature: Any = datasets.Array2D(shape=(None, *spec.inner), dtype=spec.dtype)
    else:
        feature = datasets.Sequence(datasets.Value(spec.dtype))
    features = datasets.Features({spec.field: feature})

    def gen() -> Iterator[dict[str, np.ndarray]]:
        for a in src:
            yield {spec.field: a}

    cache = out.parent / (out.name + ".cache")
    ds = datasets.Dataset.from_generator(gen, features=features, cache_dir=str(cache))
    ds.save_to_disk(str(out))
    del ds
    shutil.rmtree(cache, ignore_errors=True)


# -- contestants: readers (run in a fresh process); each returns an iterable of padded batches --------------------
class _BatchDataset:
    """Map-style dataset indexed by a whole batch of ids: ``fetch(ids)`` -> list of sample arrays."""

    def __init__(self, field: str, fetch: Callable[[np.ndarray], Sequence[np.ndarray]]) -> None:
        self.field, self.fetch = field, fetch

    def __len__(self) -> int:
        raise TypeError("indexed by batches only")

    def __getitem__(self, ids: np.ndarray) -> dict[str, Any]:
        return pad_collate(self.fetch(ids), self.field)


class _MemmapFetch:
    def __init__(self, raw: Path, spec: DataSpec) -> None:
        self.raw, self.spec = raw, spec
        self._src: RawSamples | None = None

    def __call__(self, ids: np.ndarray) -> list[np.ndarray]:
        if self._src is None:  # mapped in each process, after the fork
            self._src = RawSamples(self.raw, self.spec)
        v, o = self._src.values, self._src.offsets
        return [v[o[i] : o[i + 1]] for i in ids.tolist()]


class _NpyFetch:
    def __init__(self, d: Path) -> None:
        self.d = d

    def __call__(self, ids: np.ndarray) -> list[np.ndarray]:
        return [np.load(self.d / f"{i:08d}.npy") for i in ids.tolist()]


class _HFFetch:
    def __init__(self, d: Path, field: str) -> None:
        self.d, self.field = d, field
        self._ds: Any = None

    def __call__(self, ids: np.ndarray) -> Sequence[np.ndarray]:
        if self._ds is None:
            import datasets

            self._ds = datasets.load_from_disk(str(self.d)).with_format("numpy")
        return list(self._ds[ids.tolist()][self.field])


def planned_batches(d: Path, spec: DataSpec, opts: dict[str, Any], out: Path) -> None:
    """Save shardload's batches of the epoch (fixed size, random), as raw sample indices, to ``out``.

    The baselines that read by index lists (memmap, npy, hf) then read the very same batches as the
    ``shardload`` row: the same samples together, so the same padded shapes and the same bytes copied.
    shardload's sample ids map to raw indices through the set's ``origins.arrow`` (``write()`` records
    each sample's position in its input).
    """
    import pyarrow as pa

    loader = read_shardload(d, spec, {**opts, "num_workers": 0, "bucketed": False})
    plan = loader.plan_sampler.plan()
    with pa.memory_map(str(d / "origins.arrow")) as f:
        raw = pa.ipc.open_file(f).read_all().column("position").to_numpy()
    batches = [raw[plan.batch(i)[0]] for i in range(len(plan))]
    bounds = np.cumsum([0, *(len(b) for b in batches)])
    np.savez(out, ids=np.concatenate(batches).astype(np.int64), bounds=bounds)


def epoch_batches(spec: DataSpec, opts: dict[str, Any]) -> list[np.ndarray]:
    """The baselines' batches: shardload's (:func:`planned_batches`) when saved, else a shuffle of their own."""
    saved = opts.get("batches")
    if saved is None:
        return shuffled_batches(spec.samples, opts["batch_size"], opts["seed"])
    with np.load(saved) as z:
        ids, bounds = z["ids"], z["bounds"].tolist()
    return [ids[a:b] for a, b in pairwise(bounds)]


def _batch_loader(fetch: Callable[[np.ndarray], Sequence[np.ndarray]], spec: DataSpec, opts: dict[str, Any]) -> Any:
    from torch.utils.data import DataLoader

    batches = epoch_batches(spec, opts)
    dataset: Any = _BatchDataset(spec.field, fetch)  # map-style: what DataLoader calls is __getitem__
    return DataLoader(dataset, sampler=batches, batch_size=None, num_workers=opts["num_workers"])


def read_memmap(d: Path, spec: DataSpec, opts: dict[str, Any]) -> Any:  # a loader of batches
    return _batch_loader(_MemmapFetch(d, spec), spec, opts)


def read_npy(d: Path, spec: DataSpec, opts: dict[str, Any]) -> Any:  # a loader of batches
    return _batch_loader(_NpyFetch(d), spec, opts)


def read_hf(d: Path, spec: DataSpec, opts: dict[str, Any]) -> Any:  # a loader of batches
    return _batch_loader(_HFFetch(d, spec.field), spec, opts)


def read_shardload(d: Path, spec: DataSpec, opts: dict[str, Any]) -> Any:  # a loader of batches
    import shardload
    from shardload.plan import Batching

    if opts["bucketed"]:
        kw: dict[str, Any] = {"max_tokens": opts["max_tokens"][spec.name], "bucketing": True}
    else:  # random batches of a fixed size: the same work as every other contestant
        kw = {"batch_size": opts["batch_size"], "bucketing": False}
    if opts.get("full_shuffle"):  # a Zarr set read in a full shuffle instead of its default chunk windows
        kw["chunk_window"] = 0
    return shardload.make_loader(
        d,
        rank=0,
        world_size=1,
        stage="train",
        seed=opts["seed"],
        num_workers=opts["num_workers"],
        batching=Batching(**kw),
    )


def read_litdata(d: Path, spec: DataSpec, opts: dict[str, Any]) -> Any:  # a loader of batches
    import litdata

    ds = litdata.StreamingDataset(str(d), shuffle=True, seed=opts["seed"], cache_dir=str(d) + ".cache")
    return litdata.StreamingDataLoader(
        ds, batch_size=opts["batch_size"], num_workers=opts["num_workers"], collate_fn=_Collate(spec.field, spec.field)
    )


def read_streaming(d: Path, spec: DataSpec, opts: dict[str, Any]) -> Any:  # a loader of batches
    import torch.utils.data

    streaming = import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = streaming.StreamingDataset(
        local=str(d), shuffle=True, shuffle_seed=opts["seed"], batch_size=opts["batch_size"]
    )
    return torch.utils.data.DataLoader(
        ds, batch_size=opts["batch_size"], num_workers=opts["num_workers"], collate_fn=_Collate(spec.field, spec.field)
    )


def read_webdataset(d: Path, spec: DataSpec, opts: dict[str, Any]) -> Any:  # a loader of batches
    import webdataset as wds

    urls = sorted(str(p) for p in d.glob("shard-*.tar"))
    ds = (
        wds.WebDataset(urls, shardshuffle=len(urls), seed=opts["seed"], empty_check=False)
        .shuffle(1000)
        .decode()
        .to_tuple("npy")
        .batched(opts["batch_size"], collation_fn=_Collate(spec.field, 0), partial=True)
    )
    return wds.WebLoader(ds, batch_size=None, num_workers=opts["num_workers"])


def import_streaming() -> Any:
    """Import MosaicML streaming without its ``vision`` subpackage.

    ``streaming/__init__.py`` imports its vision datasets, and with them
    torchvision, which the MDS writer and reader never use; a torchvision wheel
    built for another torch (e.g. a CUDA wheel beside a CPU torch) fails at
    import. An empty placeholder module stands in for ``streaming.vision``.
    """
    import types

    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


def import_contestant(name: str) -> None:
    """Import torch and everything the reader of ``name`` needs."""
    import numpy.random  # noqa: F401  # numpy imports it on first use: a shuffle would pay for it inside the epoch
    import torch.utils.data  # noqa: F401

    if name.startswith("shardload"):
        import shardload.load.loader  # noqa: F401

        if name.startswith("shardload-zarr"):  # the reader imports zarr when it opens the first shard
            from shardload.formats.zarr.compression import require_zarr

            require_zarr()
    elif name == "streaming":
        import_streaming()
    elif name in MODULES:
        __import__(MODULES[name])


WRITERS: dict[str, Callable[..., None]] = {
    "npy": write_npy,
    "shardload": write_shardload,
    "shardload-zarr": lambda src, out, spec: write_shardload(src, out, spec, fmt="zarr"),
    "litdata": write_litdata,
    "streaming": write_streaming,
    "webdataset": write_webdataset,
    "hf": write_hf,
}
READERS: dict[str, Callable[[Path, DataSpec, dict[str, Any]], Any]] = {
    "memmap": read_memmap,
    "npy": read_npy,
    "shardload": read_shardload,
    "shardload-bucketed": read_shardload,
    "shardload-zarr": read_shardload,
    "shardload-zarr-shuffled": read_shardload,
    "litdata": read_litdata,
    "streaming": read_streaming,
    "webdataset": read_webdataset,
    "hf": read_hf,
}
MODULES = {"litdata": "litdata", "streaming": "streaming", "webdataset": "webdataset", "hf": "datasets"}


# -- the child process: one write or one epoch ---------------------------------------------------------------------
def child(job: dict[str, Any]) -> dict[str, Any]:
    """Run one job in this (fresh) process and return its figures."""
    spec = DataSpec(**{**job["spec"], "inner": tuple(job["spec"]["inner"])})
    root = Path(job["root"])
    raw = root / spec.name / "memmap"
    name = job["contestant"]
    out = root / spec.name / WRITTEN_BY.get(name, name)
    if job["op"] == "write":
        src = RawSamples(raw, spec)
        kwargs = {"raw": raw} if name == "litdata" else {}
        os.sync()
        t0 = time.perf_counter()
        WRITERS[name](src, out, spec, **kwargs)
        os.sync()
        return {"write_s": time.perf_counter() - t0}
    opts = {**job["opts"], "bucketed": name == "shardload-bucketed", "full_shuffle": name == "shardload-zarr-shuffled"}
    import_contestant(name)  # imports are not part of the loader's time
    print("START", flush=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    loader = READERS[name](out, spec, opts)
    first = None
    count = length_sum = padded = 0
    checksum = 0.0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        x, lengths = batch[spec.field], batch[f"{spec.field}_lengths"]
        count += len(lengths)
        length_sum += int(lengths.sum())
        padded += int(x.shape[0]) * int(x.shape[1])
        heads = x[:, 0].reshape(len(lengths), -1)[:, 0]  # each sample's first value (every sample has one)
        checksum += float(heads.double().sum())
    total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print("END", flush=True)
    del loader
    return {
        "first_batch_s": first,
        "epoch_s": total,
        "cpu_s": cpu,
        "count": count,
        "length_sum": length_sum,
        "padded_rows": padded,
        "checksum": checksum,
    }


def run_child(job: dict[str, Any], timeout: float) -> tuple[dict[str, Any] | None, int, str]:
    """Run ``job`` in a fresh interpreter; return (figures or None, peak RSS of its process tree, error)."""
    import psutil

    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(job)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    measuring = threading.Event()
    ps = psutil.Process(proc.pid)
    peak = 0

    def sample() -> None:
        nonlocal peak
        try:
            procs = [ps, *ps.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in procs if p.is_running()))
        except psutil.Error:
            pass

    def read_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("START"):
                measuring.set()
            elif line.startswith("END"):
                sample()  # an epoch shorter than one polling interval still gets a figure
                measuring.clear()
            lines.append(line)

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    err_chunks: list[str] = []
    err_reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    err_reader.start()
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            for p in ps.children(recursive=True):
                p.kill()
            proc.kill()
            break
        if measuring.is_set():
            sample()
        time.sleep(0.05)
    proc.wait()
    reader.join(5)
    err_reader.join(5)
    err = "".join(err_chunks)
    for line in lines:
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :]), peak, ""
    if proc.returncode in (-9, 137) and time.monotonic() > deadline:
        return None, peak, f"timed out after {timeout:.0f} s"
    tail = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or [f"exit status {proc.returncode}"]
    return None, peak, tail[0][:200]


# -- the parent: generate, write, read, report ---------------------------------------------------------------------
def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def warm_page_cache(d: Path) -> None:
    """Read every file of ``d`` once, so every contestant's epoch starts from a warm page cache."""
    for p in d.rglob("*"):
        if p.is_file():
            with open(p, "rb", buffering=0) as fh:
                while fh.read(16 << 20):
                    pass


def memcpy_gbps(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Single-core memcpy speed (best of ``repeats`` copies of ``nbytes``), the machine's reference."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def availability(name: str) -> str:
    """An empty string if ``name`` can run here, else why not."""
    if name in ZARR_ROWS:
        from shardload.formats import FORMATS

        return "" if "zarr" in FORMATS else "unavailable: shardload has no zarr shard format in this version"
    module = MODULES.get(name)
    if module is None:
        return ""
    code = f"import sys, types; sys.modules['streaming.vision'] = types.ModuleType('streaming.vision'); import {module}"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode:
        last = [ln for ln in r.stderr.strip().splitlines() if ln.strip()][-1:] or ["import failed"]
        return f"unavailable: {last[0][:160]}"
    return ""


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("shardload", "torch", "numpy", "pyarrow", "litdata", "mosaicml-streaming", "webdataset", "datasets"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="multiply the sample counts by this (0.02: smoke run)")
    p.add_argument("--batch-size", type=int, default=64, help="batch size of every contestant")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="token budget of the bucketed shardload rows (default: batch size x median length)",
    )
    p.add_argument("--workers", default="0,2", help="num_workers values to run, comma-separated")
    p.add_argument("--only", default=None, help="comma-separated contestants to run (default: all)")
    p.add_argument("--datasets", default="tokens,features", help="comma-separated: tokens, features")
    p.add_argument(
        "--repeat", type=int, default=1, help="epochs per contestant, round robin; each row is the median run"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="/tmp/shardload-bench-loaders", help="where the data is written")
    p.add_argument("--keep", action="store_true", help="keep the written data")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed for one write or one epoch")
    p.add_argument("--json", default=str(ROOT / "docs" / "bench_loaders.json"), help="raw figures (JSON)")
    p.add_argument("--png", default=str(ROOT / "docs" / "img" / "bench_loaders.png"), help="bar chart")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child is not None:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return 0

    specs = [SPECS[s] for s in args.datasets.split(",")]
    specs = [DataSpec(**{**asdict(s), "samples": max(64, int(s.samples * args.scale))}) for s in specs]
    workers = [int(w) for w in args.workers.split(",")]
    unknown = sorted(set(args.only.split(",")) - set(CONTESTANTS)) if args.only is not None else []
    if unknown:  # a misspelt name would otherwise drop its row without a word
        p.error(f"--only: unknown contestant(s) {', '.join(unknown)}; choose from {', '.join(CONTESTANTS)}")
    names = [c for c in CONTESTANTS if args.only is None or c in args.only.split(",")]
    max_tokens = {s.name: args.max_tokens or int(args.batch_size * s.median) for s in specs}
    opts = {"batch_size": args.batch_size, "seed": args.seed, "max_tokens": max_tokens}
    root = Path(args.workdir)
    root.mkdir(parents=True, exist_ok=True)

    load0 = os.getloadavg()
    machine = {
        "platform": f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}",
        "memcpy_gb_per_s": round(memcpy_gbps(), 2),
    }
    print(
        f"machine: {machine['platform']}, single-core memcpy {machine['memcpy_gb_per_s']:.1f} GB/s, "
        f"load average {load0[0]:.1f}"
    )
    vers = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    unavailable = {n: why for n in names if (why := availability(n))}
    for n, why in unavailable.items():
        print(f"note: {n} skipped, {why}")

    results: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    try:
        for spec in specs:
            t0 = time.perf_counter()
            values, offsets = generate(spec)
            payload = int(values.nbytes)
            lengths = np.diff(offsets)
            heads = values[offsets[:-1]].reshape(spec.samples, -1)[:, 0].astype(np.float64)
            expect = {"count": spec.samples, "length_sum": int(lengths.sum()), "checksum": float(heads.sum())}
            print(
                f"\n[{spec.name}] {spec.samples:,} samples of {spec.dtype}[L{''.join(f', {d}' for d in spec.inner)}], "
                f"median length {np.median(lengths):.0f}, payload {payload / 1e6:,.1f} MB "
                f"(generated in {time.perf_counter() - t0:.1f} s)"
            )
            job: dict[str, Any] = {"root": str(root), "spec": asdict(spec), "opts": opts}
            shutil.rmtree(root / spec.name, ignore_errors=True)
            os.sync()
            t0 = time.perf_counter()
            write_raw(values, offsets, root / spec.name / "memmap")
            os.sync()
            write_s = {"memmap": time.perf_counter() - t0}
            del values, offsets, heads
            for name in names:
                if name in unavailable or name not in WRITERS:
                    continue
                res, _, err = run_child({**job, "op": "write", "contestant": name}, args.timeout)
                if res is None:
                    unavailable[name] = f"write failed: {err}"
                    print(f"  write {name:<18} FAILED: {err}")
                    continue
                write_s[name] = res["write_s"]
                print(f"  write {name:<18} {res['write_s']:7.1f} s  {dir_bytes(root / spec.name / name) / 1e6:8.1f} MB")
            if "shardload" in write_s:  # the index-list baselines read shardload's batches
                planned_batches(root / spec.name / "shardload", spec, opts, root / spec.name / "batches.npz")
                job["opts"] = {**opts, "batches": str(root / spec.name / "batches.npz")}
            runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
            for rep in range(args.repeat):  # round robin: a change of load falls on every contestant alike
                for name in names:
                    if name in unavailable:
                        continue
                    d = root / spec.name / WRITTEN_BY.get(name, name)
                    for nw in workers:
                        warm_page_cache(d)
                        res, rss, err = run_child(
                            {**job, "op": "read", "contestant": name, "opts": {**job["opts"], "num_workers": nw}},
                            args.timeout,
                        )
                        row: dict[str, Any] = {
                            "dataset": spec.name,
                            "contestant": name,
                            "num_workers": nw,
                            "samples": spec.samples,
                            "payload_bytes": payload,
                            "write_s": write_s.get(WRITTEN_BY.get(name, name)),
                            "disk_bytes": dir_bytes(d),
                            "peak_rss_bytes": rss,
                            "load_avg": os.getloadavg()[0],
                        }
                        if res is None:
                            row["error"] = err
                        else:
                            row.update(res)
                            checks = [
                                res["count"] == expect["count"],
                                res["length_sum"] == expect["length_sum"],
                                math.isclose(res["checksum"], expect["checksum"], rel_tol=1e-9, abs_tol=1e-6),
                            ]
                            row["exactly_once"] = all(checks)
                            row["samples_per_s"] = spec.samples / res["epoch_s"]
                            row["payload_mb_per_s"] = payload / res["epoch_s"] / 1e6
                            row["padding"] = 1 - res["length_sum"] / max(1, res["padded_rows"])
                            if not row["exactly_once"]:
                                row["error"] = (
                                    f"wrong samples: count {res['count']} (expected {expect['count']}), "
                                    f"length sum {res['length_sum']} (expected {expect['length_sum']})"
                                )
                        runs.setdefault((name, nw), []).append(row)
                        show = (
                            f"{row['samples_per_s']:9,.0f} samples/s  {row['payload_mb_per_s']:7.1f} MB/s  "
                            f"first batch {row['first_batch_s']:.2f} s  padding {row['padding']:.1%}  "
                            f"RSS {rss / 2**20:,.0f} MiB"
                            if "samples_per_s" in row
                            else ""
                        )
                        run = f"  run {rep + 1}/{args.repeat}" if args.repeat > 1 else ""
                        print(
                            f"  read  {name:<18} workers={nw}  {show}{'  ' + row['error'] if 'error' in row else ''}{run}"
                        )
            results += [median_run(rows) for rows in runs.values()]
    finally:
        if not args.keep:
            for spec in specs:
                shutil.rmtree(root / spec.name, ignore_errors=True)
            if root.exists() and not any(root.iterdir()):
                root.rmdir()
        else:
            print(f"kept: {root}")

    ratios = compute_ratios(results, specs, workers)
    report = {
        "command": "python tools/bench_loaders.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine,
        "versions": vers,
        "load_average": {"start": round(load0[0], 2), "end": round(os.getloadavg()[0], 2)},
        "wall_s": round(time.perf_counter() - t_start, 1),
        "batch_size": args.batch_size,
        "max_tokens": max_tokens,
        "seed": args.seed,
        "repeat": args.repeat,
        "unavailable": unavailable,
        "results": results,
        "ratios": ratios,
    }
    md = markdown(report)
    print("\n" + md)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.png:
        plot(report, Path(args.png))
        print(f"wrote {args.png}")
    return 0


def median_run(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median speed among one contestant's repeated runs (the first failed one if any failed).

    ``runs_samples_per_s`` lists every run's speed, in run order; ``median_cpu_s`` is the median of the
    runs' CPU seconds (of the training process).
    """
    failed = [r for r in rows if "error" in r]
    if failed:
        return failed[0]
    ranked = sorted(rows, key=lambda r: r["samples_per_s"])
    cpu = sorted(r["cpu_s"] for r in rows)
    return {
        **ranked[(len(ranked) - 1) // 2],
        "runs_samples_per_s": [r["samples_per_s"] for r in rows],
        "median_cpu_s": cpu[(len(cpu) - 1) // 2],
    }


def compute_ratios(results: list[dict[str, Any]], specs: list[DataSpec], workers: list[int]) -> list[dict[str, Any]]:
    """Per dataset and num_workers: shardload's speed over the baseline's and over the best other library's."""
    out = []
    for spec in specs:
        for nw in workers:
            ok = {
                r["contestant"]: r
                for r in results
                if r["dataset"] == spec.name and r["num_workers"] == nw and r.get("exactly_once")
            }
            libs = {k: v["samples_per_s"] for k, v in ok.items() if k in LIBRARIES}
            best = max(libs, key=libs.__getitem__) if libs else None
            for mine in ("shardload", "shardload-bucketed", *ZARR_ROWS):
                if mine not in ok:
                    continue
                speed = ok[mine]["samples_per_s"]
                out.append(
                    {
                        "dataset": spec.name,
                        "num_workers": nw,
                        "contestant": mine,
                        "vs_memmap": speed / ok["memmap"]["samples_per_s"] if "memmap" in ok else None,
                        # the same ratio from the CPU time of the training process: what a loaded machine
                        # disturbs least; with workers, their CPU time is not in it
                        "vs_memmap_cpu": ok["memmap"]["median_cpu_s"] / ok[mine]["median_cpu_s"]
                        if "memmap" in ok
                        else None,
                        "best_library": best,
                        "vs_best_library": speed / libs[best] if best else None,
                        "padding": ok[mine]["padding"],
                    }
                )
    return out


def markdown(report: dict[str, Any]) -> str:
    """The results as markdown tables (figures, then ratios)."""
    lines = [
        "| dataset | contestant | workers | write s | disk MB | first batch s | samples/s | payload MB/s "
        "| peak RSS MiB | padding | exactly once |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in report["results"]:
        if "samples_per_s" not in r:
            lines.append(
                f"| {r['dataset']} | {r['contestant']} | {r['num_workers']} | | | | | | | | failed: {r['error']} |"
            )
            continue
        write = "" if r["write_s"] is None else f"{r['write_s']:.1f}"
        lines.append(
            f"| {r['dataset']} | {r['contestant']} | {r['num_workers']} | {write} | {r['disk_bytes'] / 1e6:,.1f} "
            f"| {r['first_batch_s']:.2f} | {r['samples_per_s']:,.0f} | {r['payload_mb_per_s']:,.1f} "
            f"| {r['peak_rss_bytes'] / 2**20:,.0f} | {r['padding']:.1%} | {'yes' if r['exactly_once'] else 'NO'} |"
        )
    lines += [
        "",
        "| dataset | workers | shardload row | vs memmap baseline | vs memmap, CPU time | vs best other library "
        "| padding |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for q in report["ratios"]:
        best = f"{fmt_ratio(q['vs_best_library'])} ({q['best_library']})" if q["best_library"] else "-"
        lines.append(
            f"| {q['dataset']} | {q['num_workers']} | {q['contestant']} | {fmt_ratio(q['vs_memmap'])} "
            f"| {fmt_ratio(q.get('vs_memmap_cpu'))} | {best} | {q['padding']:.1%} |"
        )
    for name, why in report["unavailable"].items():
        lines.append(f"\n{name}: {why}")
    if report.get("repeat", 1) > 1:
        lines.append(f"\nEach row: the median of {report['repeat']} epochs, run round robin.")
    m = report["machine"]
    lines.append(
        f"\nMachine: {m['platform']}; single-core memcpy {m['memcpy_gb_per_s']:.1f} GB/s; load average "
        f"{report['load_average']['start']:.1f} at the start, {report['load_average']['end']:.1f} at the end."
    )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """Payload MB/s of every contestant, one panel per (dataset, num_workers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if "samples_per_s" in r and r["exactly_once"]]
    panels = sorted({(r["dataset"], r["num_workers"]) for r in rows}, key=lambda k: (k[0] != "tokens", k[1]))
    if not panels:
        return
    cols = 2
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(11, 3.2 * nrows), squeeze=False)
    for ax, (ds, nw) in zip(axes.flat, panels):
        sel = sorted(
            (r for r in rows if r["dataset"] == ds and r["num_workers"] == nw), key=lambda r: r["payload_mb_per_s"]
        )
        names = [r["contestant"] for r in sel]
        speeds = [r["payload_mb_per_s"] for r in sel]
        colors = [
            "tab:orange" if n.startswith("shardload") else "tab:gray" if n in ("memmap", "npy") else "tab:blue"
            for n in names
        ]
        ax.barh(names, speeds, color=colors)
        for y, v in enumerate(speeds):
            ax.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
        ax.set_title(f"{ds}, num_workers={nw}", fontsize=10)
        ax.set_xlabel("payload MB/s (padding excluded), one shuffled epoch")
        ax.set_xlim(0, max(speeds) * 1.18)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(
        f"Loaders side by side (batch size {report['batch_size']}; "
        f"memcpy {report['machine']['memcpy_gb_per_s']:.1f} GB/s; load avg "
        f"{report['load_average']['start']:.1f})",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
