"""Benchmark packed batches: fill, per-step balance, planning time and loading, against bucketing and random batches.

Four parts, each comparing figures measured in the same run:

1. **Fill and balance** (``summarize_plan`` over all ranks) of packed batches
   (``Batching(packing=True, pack_length=L, rows_per_batch=R)``) against
   bucketed and random token batches of the same capacity
   (``max_tokens=R*L``) and random ``batch_size=R`` batches, on two length
   distributions (``--datasets``): the planner's synthetic long-tailed set and
   a text-like mixture of many short documents and a heavy tail (see
   :func:`text_like_lengths`). ``pack_split`` is on when a sample is longer
   than ``L``.
2. **pack_rows alone** (one rank's packing, before equalising across ranks) on
   ``--items`` sizes: fill, rows over the lower bound ``ceil(tokens / L)``, time.
3. **Filler of packed evaluation** (``--parts filler``): validation plans (no
   shuffle) for ``--filler-samples`` x ``--filler-world-size``; per rank the
   batches its packing needs against the batches every rank gets (the largest
   count), once with the ranks cut at equal tokens (the cut before re-cutting
   by rows, measured in the same run) and once as planned; filler share =
   filler batches / all batches; CPU time of counting the token cut against
   building the planner (which re-cuts). A third data set, ``two-corpora``,
   is what a map that splits records makes of two corpora one after the other:
   a quarter of long documents cut into rows of ``L`` (full rows and a last
   piece each), then short documents.
4. **Planning time** for one rank of ``--timing-world-size`` ranks on a
   memory-mapped int32 lengths index: ``EpochPlanner`` construction (it packs
   every rank to agree on the batch count) and ``plan(rank)``. ``--profile``
   repeats the count of every rank, timing the gather of every rank's size
   histogram and the best-fit run over them apart; "rest" is construction
   minus both (the layout, plus the run-to-run variance of a shared machine).
   Wall and CPU time (``time.process_time``) are both shown: on a shared
   machine the CPU time is the steadier figure. With ``--baseline-tree DIR``
   each measurement runs in a fresh interpreter, ``--repeat`` times, once with
   this checkout's library and once with the library of the checkout at
   ``DIR`` in alternation, on the same lengths file: the table gets a row per
   run and the medians, and an after/before line gives the ratios of the
   medians of wall and CPU time (below 1: this checkout is faster).
4. **Loading** (``--parts load``): one epoch of packed batches read through
   ``make_loader`` (``pack_split``, one rank, ``num_workers=0``) from a set of
   ``--load-samples`` long-tailed int32 token samples written once, after one
   warm-up epoch: wall and CPU time of the epoch, in a fresh interpreter per
   run; with ``--baseline-tree DIR`` in alternation with the library at
   ``DIR``, ``--repeat`` times, with the after/before ratios of the medians.

Examples::

    python tools/bench_pack.py --quick                        # about a minute
    python tools/bench_pack.py                                # 10M samples, 8 and 1024 ranks
    python tools/bench_pack.py --parts time --timing-samples 10000000 100000000 --profile
    python tools/bench_pack.py --parts time --timing-lengths uniform --pack-lengths 131072 --timing-world-size 1000
    python tools/bench_pack.py --parts time --timing-samples 100000000 --baseline-tree /tmp/base --repeat 3
    python tools/bench_pack.py --parts load --baseline-tree /tmp/base --repeat 5
    python tools/bench_pack.py --parts filler --filler-samples 10000 100000 1000000
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
from baseline import REPO, add_baseline_arguments, checked_tree, run_child
from bench_plan import synthetic_lengths, synthetic_shards
from numpy.typing import NDArray

from shardload.plan import Batching, EpochPlanner, EpochSpec, PlanInputs, digest_lengths, summarize_plan
from shardload.plan.assign import assign_shards, balance_by_tokens
from shardload.plan.packing.pack import PackBatcher
from shardload.plan.packing.rows import count_rows
from shardload.plan.packing.track import pack_rows
from shardload.plan.strategy import make_batcher

DATASETS = ("long-tailed", "text-like")
FILLER_DATASETS = ("two-corpora", "text-like", "long-tailed")


def text_like_lengths(num: int, seed: int) -> NDArray[np.int32]:
    """``(num,)`` a text-like mixture: 80% short, 20% long documents, clipped to [1, 16384].

    Short: lognormal, median 80 tokens, sigma 1.0 (messages, snippets, short
    pages). Long: lognormal, median 1,024 tokens, sigma 1.3 (articles, code
    files, book chapters). Median 107, mean 539 tokens; 2.9% of the documents
    are longer than 4,096 tokens and hold 44% of the tokens (0.3% are cut at
    16,384).
    """
    rng = np.random.default_rng(seed + 7)
    out = np.empty(num, dtype=np.int32)
    for lo in range(0, num, 1 << 24):  # in chunks: no float64 copy of the whole array
        hi = min(num, lo + (1 << 24))
        long = rng.random(hi - lo) < 0.2
        median = np.where(long, 1024.0, 80.0)
        sigma = np.where(long, 1.3, 1.0)
        out[lo:hi] = np.clip(np.rint(median * np.exp(sigma * rng.standard_normal(hi - lo))), 1, 16384)
    return out


def two_corpora_lengths(num: int, seed: int, length: int) -> NDArray[np.int32]:
    """``(num,)`` a map's pieces of two corpora in natural order: long documents (lognormal, median ``2 * length``)
    cut into pieces of ``length`` tokens (full ones, then the rest), then short ones (uniform in [1, length / 3])."""
    rng = np.random.default_rng(seed + 11)
    docs = np.clip(rng.lognormal(np.log(2 * length), 1.0, max(num // 8, 1)), 1, 20 * length).astype(np.int64)
    full, rest = docs // length, docs % length
    per_doc = full + (rest > 0)
    pieces = np.full(int(per_doc.sum()), length, dtype=np.int64)
    last = np.cumsum(per_doc) - 1  # the last piece of each document
    pieces[last[rest > 0]] = rest[rest > 0]
    short = rng.integers(1, length // 3 + 1, num, endpoint=True)
    return np.concatenate([pieces, short])[:num].astype(np.int32)


def make_lengths(dataset: str, num: int, seed: int) -> NDArray[np.int32]:
    return synthetic_lengths(num, seed) if dataset == "long-tailed" else text_like_lengths(num, seed)


def describe(lengths: NDArray[np.int32]) -> str:
    lens = np.asarray(lengths, dtype=np.int64)
    total = int(lens.sum())
    share = [f"{int(lens[lens > c].sum()) / total:.0%} of tokens in samples > {c}" for c in (2048, 4096)]
    return f"median {int(np.median(lens))}, mean {lens.mean():.0f}, max {int(lens.max())}; " + ", ".join(share)


def pieces(lens: NDArray[np.int64], length: int) -> NDArray[np.int64]:
    """The sizes ``pack_split`` packs: a sample longer than ``length`` -> full pieces and a remainder."""
    sizes = np.concatenate([np.full(int((lens // length).sum()), length, dtype=np.int64), lens % length])
    out: NDArray[np.int64] = sizes[sizes > 0]
    return out


def configs(pack_lengths: list[int], rows: int, max_length: int) -> list[tuple[str, Batching]]:
    out: list[tuple[str, Batching]] = []
    for length in pack_lengths:
        split = max_length > length
        name = f"packing L={length} R={rows}" + (" split" if split else "")
        out.append((name, Batching(packing=True, pack_length=length, rows_per_batch=rows, pack_split=split)))
    for length in pack_lengths:
        out.append((f"bucketed max_tokens={rows * length}", Batching(max_tokens=rows * length)))
    for length in pack_lengths:
        out.append((f"random max_tokens={rows * length}", Batching(max_tokens=rows * length, bucketing=False)))
    out.append((f"random batch_size={rows}", Batching(batch_size=rows, bucketing=False)))
    return out


def fill_table(args: argparse.Namespace) -> None:
    print(
        "\n## Fill and per-step balance (summarize_plan over all ranks)\n"
        "fill = real tokens / computed tokens (rows * padded length; a packed batch is R*L); "
        "capacity = real tokens / (batches * max_tokens), packing: the same as fill\n"
    )
    print("| data | ranks | batching | fill | capacity | step efficiency | batches/rank | summary s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for dataset in args.datasets:
        lengths = make_lengths(dataset, args.samples, args.seed)
        shards = synthetic_shards(args.samples, args.shard_size, args.seed)
        print(f"<!-- {dataset}, {args.samples:,} samples: {describe(lengths)} -->")
        inputs = PlanInputs(lengths, shards, digest_lengths(lengths))
        for world in args.world_size:
            spec = EpochSpec(world_size=world, seed=args.seed, epoch=1)
            for name, batching in configs(args.pack_lengths, args.rows_per_batch, int(lengths.max())):
                start = time.perf_counter()
                summary = summarize_plan(inputs, spec, batching)
                took = time.perf_counter() - start
                fill = 1.0 - summary.padding_fraction
                budget = summary.max_tokens or (
                    batching.pack_length * batching.rows_per_batch
                    if batching.pack_length and batching.rows_per_batch
                    else None
                )
                capacity = (
                    f"{int(summary.tokens.sum()) / (summary.num_batches * world * budget):.1%}"
                    if budget and summary.num_batches
                    else ""
                )
                print(
                    f"| {dataset} | {world} | {name} | {fill:.1%} | {capacity} | {summary.step_efficiency:.3f} "
                    f"| {summary.num_batches} | {took:.1f} |"
                )


def pack_rows_table(args: argparse.Namespace) -> None:
    print(
        "\n## pack_rows alone (one rank's items, before equalising)\n"
        "fill = tokens / (rows * L); over bound = rows / ceil(tokens / L) - 1\n"
    )
    print("| data | items | L | rows | fill | over bound | time s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for dataset in args.datasets:
        lengths = np.asarray(make_lengths(dataset, max(args.items), args.seed), dtype=np.int64)
        for length in args.pack_lengths:
            for items in args.items:
                sizes = pieces(lengths[:items], length)
                start = time.perf_counter()
                _, used = pack_rows(sizes, length)
                took = time.perf_counter() - start
                tokens = int(sizes.sum())
                bound = -(-tokens // length)
                print(
                    f"| {dataset} | {items:,} | {length} | {len(used):,} | {tokens / (len(used) * length):.2%} "
                    f"| {len(used) / bound - 1:.2%} | {took:.3f} |"
                )


def token_cut_counts(inputs: PlanInputs, spec: EpochSpec, batching: Batching) -> NDArray[np.int64]:
    """``(W,)`` each rank's packed batches with the ranks cut at equal tokens (the planner's cut before re-cutting)."""
    layout = assign_shards(inputs.shard_sizes, spec.world_size, order=np.arange(inputs.num_shards))
    layout = balance_by_tokens(layout, inputs.lengths, inputs.shard_tokens)
    batcher = make_batcher(
        batching, lengths=inputs.lengths, layout=layout, shuffle=False, seed=0, epoch=0, max_length=inputs.max_length
    )
    return batcher.count_batches()


def filler_cells(counts: NDArray[np.int64], target: int) -> list[str]:
    filler = target - counts  # (W,)
    needed = ", ".join(map(str, counts.tolist())) if len(counts) <= 4 else f"{counts.min()}..{counts.max()}"
    share = int(filler.sum()) / max(target * len(counts), 1)
    return [str(target), needed, f"{int(filler.sum())} ({share:.2%})", str(int(filler.max()))]


def filler_table(args: argparse.Namespace) -> None:
    length = args.pack_lengths[0]
    print(
        f"\n## Filler of packed evaluation: L={length}, stage val, shards of {args.shard_size} samples "
        f"({os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f})\n"
        "needed: the batches each rank's packing needs; filler: batches below the largest count, over all ranks "
        "(share of all batches) and on the rank with most; CPU: counting the token cut / building the planner\n"
    )
    print(
        "| data | samples | R | ranks | cut at tokens: batches | needed | filler | most on a rank "
        "| re-cut: batches | needed | filler | most on a rank | CPU s tokens / re-cut |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|")
    for dataset in args.filler_datasets:
        for num in args.filler_samples:
            if dataset == "two-corpora":
                lengths = two_corpora_lengths(num, args.seed, length)
            else:
                lengths = make_lengths(dataset, num, args.seed)
            shards = synthetic_shards(num, args.shard_size, args.seed)
            split = int(lengths.max()) > length
            for rows, world in itertools.product(args.filler_rows_per_batch, args.filler_world_size):
                batching = Batching(packing=True, pack_length=length, rows_per_batch=rows, pack_split=split)
                spec = EpochSpec(world_size=world, stage="val")
                cpu = time.process_time()
                before = token_cut_counts(PlanInputs(lengths, shards, digest_lengths(lengths)), spec, batching)
                cpu_before = time.process_time() - cpu
                cpu = time.process_time()
                planner = EpochPlanner(PlanInputs(lengths, shards, digest_lengths(lengths)), spec, batching)
                cpu_after = time.process_time() - cpu
                cells = [dataset, f"{num:,}", str(rows), str(world)]
                cells += filler_cells(before, int(before.max()))
                cells += filler_cells(planner.rank_batch_counts, planner.num_batches)
                cells.append(f"{cpu_before:.2f} / {cpu_after:.2f}")
                print("| " + " | ".join(cells) + " |")


def timing_table(args: argparse.Namespace) -> None:
    length, rows = args.pack_lengths[0], args.rows_per_batch
    world = args.timing_world_size
    print(
        f"\n## Planning time: packing L={length} R={rows}, {world} ranks, rank {args.rank}, "
        f"{args.timing_lengths} lengths, int32 memmap, one process ({os.cpu_count()} cpus, numpy {np.__version__}, "
        f"load average {os.getloadavg()[0]:.1f})\n"
    )
    header = (
        "| samples | EpochPlanner (all ranks counted) | plan(rank) | total | CPU time | batches/rank (before equalising) "
        "| library |"
    )
    if args.profile:
        header += " rest of construction | size histograms, all ranks | best fit, all ranks |"
    if args.baseline_tree is not None:  # each run in a child of its own: its peak RSS (the lengths' pages included)
        header += " peak RSS |"
    print(header)
    print("|---:" * (header.count("|") - 1) + "|")
    ratios = []
    for num in args.timing_samples:
        if args.timing_lengths == "uniform":  # the worst case: every size up to L about equally often
            lengths_mem = np.random.default_rng(args.seed).integers(1, length, num, endpoint=True, dtype=np.int32)
        else:
            lengths_mem = synthetic_lengths(num, args.seed)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "lengths.npy"
            np.save(path, lengths_mem)
            del lengths_mem
            job = {"path": str(path), "num": num, "length": length, "rows": rows, "world": world}
            job |= {"rank": args.rank, "seed": args.seed, "shard_size": args.shard_size}
            if args.baseline_tree is None:
                planner, got = time_planning(job)
                cells = timing_cells(num, got, planner.num_batches, planner.rank_batch_counts, "this checkout")
                if args.profile:
                    gather, packing = profile_count(planner)
                    rest = got["built_s"] - gather - packing
                    cells += [f"{rest:.2f} s", f"{gather:.2f} s", f"{packing:.2f} s"]
                print("| " + " | ".join(cells) + " |")
                continue
            runs: dict[str, list[dict[str, float]]] = {"this checkout": [], "baseline": []}
            for _ in range(args.repeat):  # in alternation: both libraries under the same load
                for name, tree in (("this checkout", REPO), ("baseline", args.baseline_tree)):
                    got = run_child(__file__, job, tree)
                    runs[name].append(got)
                    counts = np.array(got["counts"])
                    cells = timing_cells(num, got, int(got["num_batches"]), counts, name)
                    print("| " + " | ".join([*cells, f"{got['peak_rss_mib']:,.0f} MiB"]) + " |")
            keys = ("total_s", "cpu_s", "peak_rss_mib")
            medians = {name: {k: median([r[k] for r in rs]) for k in keys} for name, rs in runs.items()}
            for name, m in medians.items():
                print(
                    f"| {num:,} | | | **{m['total_s']:.2f} s** | {m['cpu_s']:.2f} s | | median, {name} | "
                    f"{m['peak_rss_mib']:,.0f} MiB |"
                )
            mine, base = medians["this checkout"], medians["baseline"]
            ratios.append((num, *(mine[k] / base[k] for k in keys)))
    for num, wall, cpu, rss in ratios:
        print(
            f"\nafter/before ({num:,} samples, medians of {args.repeat} runs each): wall {wall:.2f}, CPU {cpu:.2f}, "
            f"peak RSS {rss:.2f} (this checkout over {args.baseline_tree})"
        )


def load_table(args: argparse.Namespace) -> None:
    length, rows, num = args.pack_lengths[0], args.rows_per_batch, args.load_samples
    print(
        f"\n## Loading packed batches: L={length} R={rows}, pack_split, {num:,} long-tailed int32 token samples, "
        f"one rank, num_workers=0 ({os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f})\n"
    )
    print("| run | batches | tokens | epoch wall | epoch CPU | library |")
    print("|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        import shardload
        from shardload.testing import long_tailed_lengths

        rng = np.random.default_rng(args.seed)
        lengths = long_tailed_lengths(num, median=256, high=4 * length, seed=args.seed)
        samples = ({"tokens": rng.integers(0, 50_000, n, dtype=np.int32)} for n in lengths)
        shardload.write(samples, Path(tmp) / "set", shard_size=max(1, num // 16), progress=False)
        job = {"part": "load", "path": str(Path(tmp) / "set"), "length": length, "rows": rows, "seed": args.seed}
        trees = [("this checkout", REPO)]
        if args.baseline_tree is not None:
            trees.append(("baseline", args.baseline_tree))
        runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
        for k in range(args.repeat):  # in alternation: both libraries under the same load
            for name, tree in trees:
                got = run_child(__file__, job, tree)
                runs[name].append(got)
                print(
                    f"| {k + 1} | {int(got['batches'])} | {int(got['tokens']):,} | {got['wall_s']:.3f} s "
                    f"| {got['cpu_s']:.3f} s | {name} |"
                )
    medians = {name: {k: median([r[k] for r in rs]) for k in ("wall_s", "cpu_s")} for name, rs in runs.items()}
    for name, m in medians.items():
        print(f"| median | | | {m['wall_s']:.3f} s | **{m['cpu_s']:.3f} s** | {name} |")
    if args.baseline_tree is not None:
        mine, base = medians["this checkout"], medians["baseline"]
        print(
            f"\nafter/before (loading, medians of {args.repeat} runs each): wall {mine['wall_s'] / base['wall_s']:.3f}, "
            f"CPU {mine['cpu_s'] / base['cpu_s']:.3f} (this checkout over {args.baseline_tree})"
        )


def time_loading(job: dict[str, int | str]) -> dict[str, float]:
    """One packed epoch of the set at ``job["path"]``, after a warm-up epoch: wall and CPU seconds, batches, tokens."""
    from shardload import make_loader

    batching = Batching(packing=True, pack_length=int(job["length"]), rows_per_batch=int(job["rows"]), pack_split=True)
    loader = make_loader(str(job["path"]), batching=batching, rank=0, world_size=1, seed=int(job["seed"]))
    for _ in loader:  # warm-up: imports, shard maps, page cache
        pass
    batches = tokens = 0
    start, cpu = time.perf_counter(), time.process_time()
    for batch in loader:
        batches += 1
        tokens += int(batch["tokens_lengths"].sum())
    return {
        "wall_s": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu,
        "batches": batches,
        "tokens": tokens,
    }


def median(values: list[float]) -> float:
    return float(np.median(values))


def timing_cells(num: int, got: dict[str, float], batches: int, counts: NDArray[np.int64], library: str) -> list[str]:
    return [
        f"{num:,}",
        f"{got['built_s']:.2f} s",
        f"{got['plan_s']:.3f} s",
        f"**{got['total_s']:.2f} s**",
        f"{got['cpu_s']:.2f} s",
        f"{batches} ({counts.min()}..{counts.max()})",
        library,
    ]


def time_planning(job: dict[str, int | str]) -> tuple[EpochPlanner, dict[str, float]]:
    """Plan one rank of ``job`` (the lengths file ``path``, ...): the planner and its wall and CPU seconds."""
    num, length, rows, world = int(job["num"]), int(job["length"]), int(job["rows"]), int(job["world"])
    shards = synthetic_shards(num, int(job["shard_size"]), int(job["seed"]))
    lengths: NDArray[np.int32] = np.load(str(job["path"]), mmap_mode="r")
    digest = digest_lengths(lengths)  # also pages the lengths in
    batching = Batching(packing=True, pack_length=length, rows_per_batch=rows, pack_split=True)
    spec = EpochSpec(world_size=world, seed=int(job["seed"]), epoch=1)
    start, cpu = time.perf_counter(), time.process_time()
    planner = EpochPlanner(PlanInputs(lengths, shards, digest), spec, batching)
    built = time.perf_counter() - start
    planner.plan(int(job["rank"]))
    total = time.perf_counter() - start
    got = {"built_s": built, "plan_s": total - built, "total_s": total, "cpu_s": time.process_time() - cpu}
    return planner, got


def child(job: dict[str, int | str]) -> None:
    import shardload

    if job.get("part") == "load":
        print("RESULT " + json.dumps(time_loading(job)))
        return
    planner, got = time_planning(job)
    library = str(Path(shardload.__file__).resolve().parent.parent)
    counts = planner.rank_batch_counts.tolist()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux: the child's own peak, in MiB
    result = {**got, "num_batches": planner.num_batches, "counts": counts, "library": library, "peak_rss_mib": peak}
    print("RESULT " + json.dumps(result))


def profile_count(planner: EpochPlanner) -> tuple[float, float]:
    """Seconds the count of all ranks spends gathering their size histograms and packing them (a second pass)."""
    batcher = planner.batcher
    assert isinstance(batcher, PackBatcher)
    start = time.perf_counter()
    runs = batcher.size_runs()
    middle = time.perf_counter()
    count_rows(runs, planner.spec.world_size, batcher.capacity)
    return middle - start, time.perf_counter() - middle


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=("fill", "rows", "filler", "time", "load"),
        default=["fill", "rows", "filler", "time"],
    )
    parser.add_argument("--samples", type=int, default=10_000_000, help="samples for the fill table")
    parser.add_argument("--world-size", type=int, nargs="+", default=[8, 1024], help="ranks for the fill table")
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--pack-lengths", type=int, nargs="+", default=[4096, 2048], metavar="L")
    parser.add_argument("--rows-per-batch", type=int, default=8, metavar="R")
    parser.add_argument("--shard-size", type=int, default=1000, help="mean samples per shard")
    parser.add_argument("--items", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--filler-samples", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--filler-world-size", type=int, nargs="+", default=[2, 3, 8, 64])
    parser.add_argument("--filler-rows-per-batch", type=int, nargs="+", default=[1, 4], metavar="R")
    parser.add_argument("--filler-datasets", nargs="+", choices=FILLER_DATASETS, default=list(FILLER_DATASETS))
    parser.add_argument("--timing-samples", type=int, nargs="+", default=[10_000_000])
    parser.add_argument("--timing-world-size", type=int, default=1024)
    parser.add_argument(
        "--timing-lengths",
        choices=("long-tailed", "uniform"),
        default="long-tailed",
        help="lengths of the timing table (uniform: in [1, L], the packer's worst case)",
    )
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--load-samples", type=int, default=50_000, help="samples of the set the load part reads")
    parser.add_argument("--profile", action="store_true", help="split the planning time (adds a second count pass)")
    parser.add_argument("--quick", action="store_true", help="1M samples, items up to 100k, timing on 1M")
    parser.add_argument("--seed", type=int, default=0)
    add_baseline_arguments(
        parser,
        measured="the timing table and the load part plan and load",
        repeat_help="runs of each library with --baseline-tree (and of load)",
    )
    args = parser.parse_args(argv)
    if args.child is not None:
        child(json.loads(args.child))
        return
    args.baseline_tree = checked_tree(parser, args.baseline_tree)
    if args.baseline_tree is not None and args.profile:
        parser.error("--profile splits this checkout's planning time: run it without --baseline-tree")
    if args.quick:
        args.samples, args.timing_samples = min(args.samples, 1_000_000), [1_000_000]
        args.items = [n for n in args.items if n <= 100_000] or [10_000]
        args.filler_samples = [n for n in args.filler_samples if n <= 100_000] or [10_000]

    print(f"bench_pack: {os.cpu_count()} cpus, numpy {np.__version__}, seed {args.seed}")
    start = time.perf_counter()
    if "fill" in args.parts:
        fill_table(args)
    if "rows" in args.parts:
        pack_rows_table(args)
    if "filler" in args.parts:
        filler_table(args)
    if "time" in args.parts:
        timing_table(args)
    if "load" in args.parts:
        load_table(args)
    print(f"\nwall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
