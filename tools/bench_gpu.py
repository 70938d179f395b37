#!/usr/bin/env python
"""The GPU side of loading: host-to-device throughput, and whether a training step waits on data.

Writes (once, under ``--workdir``) a synthetic token set like ``bench_loaders``'
``tokens`` one (int32, lognormal lengths, median 256, clipped to [8, 4096]) and
measures, on ``cuda:0``:

1. **Card copy bandwidth.** One large host buffer copied to the GPU, pinned and
   pageable, best of ``--repeats`` (CUDA events): the ceiling for step 2.
2. **Loader to GPU.** Epochs of ``make_loader`` (token-budget batches), every
   tensor of every batch copied to the GPU (``non_blocking=True``), with
   ``pin_memory`` on and off and each ``--workers`` value; against the same
   epoch without the copies, and against copying the same batches again once
   they are all in pinned memory (the copy rate at this batch size).
3. **Training step.** A small causal transformer LM (bf16 autocast, AdamW)
   trained on the loader's batches for ``--steps`` steps per ``--workers``
   value: time per step fed by the loader vs fed from batches already on the
   GPU, and the time the loop spent blocked in ``next()``. A ratio near 1.0
   means the loader keeps the GPU busy.

``--device cpu`` runs the same code paths at a tiny size as a smoke test (no
bandwidth figures: there is no card); tests/test_tools.py runs it so.

    python tools/bench_gpu.py                                # on a GPU machine
    python tools/bench_gpu.py --device cpu --scale 0.005 --steps 3 --workers 0,2 --models small --train-tokens 256
    python tools/bench_gpu.py --device cpu --scale 0.001 --steps 2 --warmup 1 --workers 0,2 --models small \
        --budgets 16384 --train-tokens 256                   # the smallest smoke run (tests/test_tools.py)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import shardload  # noqa: E402
from shardload.testing.synthetic import long_tailed_lengths  # noqa: E402

VOCAB = 50_000


# -- data -------------------------------------------------------------------------------------------------------
def token_set(workdir: Path, samples: int) -> Path:
    """The synthetic token set (written once per sample count, then reused)."""
    out = workdir / f"tokens-{samples}"
    if (out / "manifest.json").exists():
        return out
    lengths = long_tailed_lengths(samples, median=256, low=8, high=4096, seed=1)
    rng = np.random.default_rng(101)

    def gen() -> Iterator[dict[str, np.ndarray]]:
        for n in lengths.tolist():
            yield {"tokens": rng.integers(0, VOCAB, size=n, dtype=np.int32)}

    t0 = time.perf_counter()
    shardload.write(gen(), out, workers=min(8, os.cpu_count() or 1), progress=False)
    print(f"wrote {samples:,} samples ({int(lengths.sum()) * 4 / 1e6:,.0f} MB) in {time.perf_counter() - t0:.1f} s")
    return out


def loader(path: Path, *, max_tokens: int, workers: int, pin: bool, epoch: int = 0) -> Any:
    ld = shardload.make_loader(
        path,
        rank=0,
        world_size=1,
        max_tokens=max_tokens,
        loader_options=shardload.LoaderOptions(num_workers=workers, pin_memory=pin),
        seed=0,
    )
    ld.set_epoch(epoch)
    return ld


def batch_bytes(batch: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values())


# -- 1. the card's own copy bandwidth ---------------------------------------------------------------------------
def copy_bandwidth(dev: torch.device, nbytes: int, repeats: int) -> dict[str, float]:
    """GB/s of one ``nbytes`` host-to-device copy, pinned and pageable (best of ``repeats``)."""
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    out: dict[str, float] = {}
    for kind in ("pinned", "pageable"):
        src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
        if kind == "pinned":
            src = src.pin_memory()
        best = float("inf")
        for _ in range(repeats + 1):  # the first copy warms up
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            dst.copy_(src, non_blocking=kind == "pinned")
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        out[kind] = nbytes / best / 1e9
    return out


# -- 2. loader -> GPU ---------------------------------------------------------------------------------------------
def loader_to_device(path: Path, dev: torch.device, *, max_tokens: int, workers: int, pin: bool) -> dict[str, Any]:
    """One epoch read only, then one epoch read and copied to ``dev``."""
    row: dict[str, Any] = {"max_tokens": max_tokens, "workers": workers, "pin_memory": pin}
    t0 = time.perf_counter()
    n = nbytes = 0
    for batch in loader(path, max_tokens=max_tokens, workers=workers, pin=pin):
        n += 1
        nbytes += batch_bytes(batch)
    row["read_only_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for batch in loader(path, max_tokens=max_tokens, workers=workers, pin=pin):
        on_dev = {k: v.to(dev, non_blocking=pin) for k, v in batch.items()}
        del on_dev
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    row["read_and_copy_s"] = time.perf_counter() - t0
    row.update(batches=n, bytes=nbytes, gb_per_s=nbytes / row["read_and_copy_s"] / 1e9)
    return row


def staged_copy_rate(path: Path, dev: torch.device, *, max_tokens: int, limit: int = 2000) -> float:
    """GB/s copying up to ``limit`` of the loader's batches again, once they all sit in pinned memory."""
    staged = []
    for i, batch in enumerate(loader(path, max_tokens=max_tokens, workers=0, pin=dev.type == "cuda")):
        if i == limit:
            break
        staged.append(batch)
    nbytes = sum(batch_bytes(b) for b in staged)
    best = float("inf")
    for _ in range(3):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for b in staged:
            on_dev = {k: v.to(dev, non_blocking=True) for k, v in b.items()}
            del on_dev
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


# -- 3. a training step -------------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # Padding sits at the end of each row, so causal attention never lets a real token see it.
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class TinyLM(nn.Module):
    def __init__(self, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def loss(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens.long())
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln(x)[:, :-1] @ self.emb.weight.T
        target = tokens[:, 1:].long()
        real = torch.arange(target.shape[1], device=tokens.device)[None, :] < (lengths[:, None] - 1)
        # (rows, vocab) with the vocabulary last: a class dimension in the middle takes a slow kernel
        per_token = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), reduction="none")
        return (per_token * real.flatten()).sum() / real.sum().clamp(min=1)


def train_steps(
    model: TinyLM, opt: torch.optim.Optimizer, batches: Any, dev: torch.device, steps: int, warmup: int
) -> tuple[float, float]:
    """(seconds for ``steps`` steps, seconds of it blocked in ``next()``), timed after ``warmup`` steps."""
    it = iter(batches)
    waited, t_start = 0.0, 0.0
    for i in range(steps + warmup):
        if i == warmup:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            waited, t_start = 0.0, time.perf_counter()
        t0 = time.perf_counter()
        batch = next(it)
        waited += time.perf_counter() - t0
        tokens = batch["tokens"].to(dev, non_blocking=True)
        lengths = batch["tokens_lengths"].to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = model.loss(tokens, lengths)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() - t_start, waited


def training(path: Path, dev: torch.device, args: argparse.Namespace, workers: list[int]) -> list[dict[str, Any]]:
    rows = []
    for size, (d, layers, heads) in args.models.items():
        torch.manual_seed(0)
        model = TinyLM(d, layers, heads).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        params = sum(p.numel() for p in model.parameters())
        # Reference: the same steps on batches already on the device (the loader out of the picture).
        resident = []
        for i, b in enumerate(loader(path, max_tokens=args.train_tokens, workers=0, pin=False)):
            if i == args.steps + args.warmup:
                break
            resident.append({k: v.to(dev) for k, v in b.items()})
        # Twice: the first pass meets every batch shape for the first time (kernel choice, allocator
        # growth); the loader runs below see the same shapes again, so they are timed against the second.
        train_steps(model, opt, resident, dev, args.steps, args.warmup)
        ref_s, _ = train_steps(model, opt, resident, dev, args.steps, args.warmup)
        del resident
        print(f"model {size} ({params / 1e6:.1f}M parameters): {ref_s / args.steps * 1e3:.2f} ms/step on resident data")
        for w in workers:
            # the same batches as the reference, in the same order: epoch 0, from the start
            ld = loader(path, max_tokens=args.train_tokens, workers=w, pin=dev.type == "cuda")
            fed_s, waited = train_steps(model, opt, ld, dev, args.steps, args.warmup)
            row = {
                "model": size,
                "params_m": round(params / 1e6, 1),
                "workers": w,
                "step_ms_resident": ref_s / args.steps * 1e3,
                "step_ms_loader": fed_s / args.steps * 1e3,
                "wait_ms": waited / args.steps * 1e3,
                "slowdown": fed_s / ref_s,
            }
            rows.append(row)
            print(
                f"  workers {w}: {row['step_ms_loader']:.2f} ms/step fed by the loader "
                f"({row['slowdown']:.2f}x resident), {row['wait_ms']:.3f} ms/step blocked in next()"
            )
        del model, opt
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = [f"device: {report['device']}; host: {report['host']}", ""]
    bw = report.get("copy_bandwidth_gb_s")
    if bw:
        lines += [
            f"card copy bandwidth ({report['copy_bytes'] >> 20} MiB, host to device): "
            f"pinned {bw['pinned']:.1f} GB/s, pageable {bw['pageable']:.1f} GB/s",
            "",
        ]
    lines += [
        "| max_tokens | workers | pin_memory | epoch, read only | epoch, read + copy | GB/s to GPU | staged copy GB/s |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in report["loader_to_device"]:
        lines.append(
            f"| {r['max_tokens']:,} | {r['workers']} | {r['pin_memory']} | {r['read_only_s']:.2f} s "
            f"| {r['read_and_copy_s']:.2f} s | {r['gb_per_s']:.2f} | {r['staged_gb_per_s']:.2f} |"
        )
    lines += [
        "",
        "| model | workers | ms/step, resident data | ms/step, fed by loader | slowdown | ms/step in next() |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in report["training"]:
        lines.append(
            f"| {r['model']} ({r['params_m']}M) | {r['workers']} | {r['step_ms_resident']:.2f} "
            f"| {r['step_ms_loader']:.2f} | {r['slowdown']:.2f}x | {r['wait_ms']:.3f} |"
        )
    return "\n".join(lines)


MODELS = {"small": (256, 2, 4), "medium": (768, 6, 12)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (figures) or cpu (smoke test)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the 200k samples by this")
    p.add_argument("--workers", default="0,2,8", help="num_workers values, comma-separated")
    p.add_argument("--budgets", default="16384,131072", help="max_tokens values of the copy runs")
    p.add_argument("--train-tokens", type=int, default=16384, help="max_tokens of the training runs")
    p.add_argument("--steps", type=int, default=300, help="timed training steps per run")
    p.add_argument("--warmup", type=int, default=10, help="untimed training steps before them")
    p.add_argument("--models", default="small,medium", help=f"models to train, from {sorted(MODELS)}")
    p.add_argument("--copy-mib", type=int, default=1024, help="size of the bandwidth probe")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/shardload-bench-gpu"))
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    args.models = {m: MODELS[m] for m in args.models.split(",") if m}
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device; use --device cpu for a smoke run")
    workers = [int(w) for w in args.workers.split(",")]
    budgets = [int(b) for b in args.budgets.split(",")]
    args.workdir.mkdir(parents=True, exist_ok=True)
    path = token_set(args.workdir, max(256, int(200_000 * args.scale)))

    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    report: dict[str, Any] = {
        "device": name,
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
        "copy_bytes": args.copy_mib << 20,
    }
    print(f"device {report['device']}; host {report['host']}")
    if dev.type == "cuda":
        report["copy_bandwidth_gb_s"] = copy_bandwidth(dev, args.copy_mib << 20, args.repeats)
        bw = report["copy_bandwidth_gb_s"]
        print(f"card copy bandwidth: pinned {bw['pinned']:.1f} GB/s, pageable {bw['pageable']:.1f} GB/s")

    rows = []
    for budget in budgets:
        staged = staged_copy_rate(path, dev, max_tokens=budget)
        for w in workers:
            for pin in (True, False) if dev.type == "cuda" else (False,):
                row = loader_to_device(path, dev, max_tokens=budget, workers=w, pin=pin)
                row["staged_gb_per_s"] = staged
                rows.append(row)
                print(
                    f"max_tokens {budget:,} workers {w} pin {pin}: read {row['read_only_s']:.2f} s, "
                    f"read+copy {row['read_and_copy_s']:.2f} s, {row['gb_per_s']:.2f} GB/s "
                    f"(staged batches copy at {staged:.2f} GB/s)"
                )
    report["loader_to_device"] = rows
    report["training"] = training(path, dev, args, workers)
    report["median_slowdown"] = statistics.median(r["slowdown"] for r in report["training"])
    print()
    print(markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
