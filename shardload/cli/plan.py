"""Dry-run the batch plan of a shard set: what every rank would get for one epoch.

Plans all ranks from the lengths index alone (no shard is read, no process
group is needed) and prints, per rank: batches, real samples, filler rows, real
tokens, padded tokens (rows x padded length, what the GPU computes on) and the
padding fraction, plus the spread between the slowest and the fastest rank
(max/min padded tokens). Every rank has the same number of batches: that is
the planner's guarantee, and this table shows what it costs.
"""

from __future__ import annotations

import argparse
from typing import Any

from shardload.cli._common import CommandError, Exit, non_negative_int, positive_int, print_json, python_hint

SUMMARY = "dry-run the per-rank batch plan (batches, padding, balance)"

EPILOG = """examples:
  shardload plan out/ --world-size 8 --max-tokens 16384 --pad-to-multiple-of 8
  shardload plan out/ --world-size 4 --batch-size 32 --stage val --json
  shardload plan out/ --world-size 2 --batch-size 4 --with-ids --json > plan.json

""" + python_hint(
    "from shardload.plan import Batching, plan_rank, summarize_plan",
    "ds = shardload.open('out/')",
    "summary = summarize_plan(ds.lengths, ds.index.sizes, world_size=8,",
    "                         batching=Batching(max_tokens=16384, pad_to_multiple_of=8))",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="OUT", help="a shard set directory")
    p.add_argument("--world-size", type=positive_int, required=True, metavar="W", help="number of ranks")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--batch-size", type=positive_int, metavar="B", help="fixed rows per batch")
    size.add_argument(
        "--max-tokens",
        type=positive_int,
        metavar="T",
        help="token budget per batch, padding included (rows x padded length)",
    )
    p.add_argument(
        "--bucketing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="group samples of similar length (default: on)",
    )
    p.add_argument(
        "--pad-to-multiple-of",
        type=positive_int,
        default=1,
        metavar="M",
        help="pad each batch's length to a multiple of M (e.g. 8)",
    )
    p.add_argument(
        "--uneven",
        choices=("split", "pad", "drop"),
        default="split",
        help="how ranks reach the same batch count: split big batches (default), "
        "pad with weight-0 filler, or drop (training only)",
    )
    p.add_argument(
        "--stage",
        choices=("train", "val", "test", "predict"),
        default="train",
        help="training shuffles; evaluation stages keep every sample exactly once",
    )
    p.add_argument("--epoch", type=non_negative_int, default=0, metavar="E", help="epoch to plan (default: 0)")
    p.add_argument("--seed", type=non_negative_int, default=0, metavar="S", help="run seed (default: 0)")
    p.add_argument(
        "--shard-assignment",
        choices=("rotate", "fixed"),
        default="rotate",
        help="rotate: new shard order each training epoch (default); fixed: natural order",
    )
    p.add_argument("--json", action="store_true", help="print the plan summary as one JSON object on stdout")
    p.add_argument(
        "--with-ids",
        action="store_true",
        help="with --json: add each rank's batch_sample_ids and batch_weights (large!)",
    )


def run(args: argparse.Namespace) -> int:
    import shardload
    from shardload.plan import Batching, EpochPlanner, summarize_plan

    if args.with_ids and not args.json:
        raise CommandError("--with-ids adds the batches to the JSON output: add --json", Exit.USAGE)

    batching = Batching(
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        bucketing=args.bucketing,
        pad_to_multiple_of=args.pad_to_multiple_of,
        uneven=args.uneven,
    )
    ds = shardload.open(args.path)
    common: dict[str, Any] = {
        "world_size": args.world_size,
        "batching": batching,
        "stage": args.stage,
        "seed": args.seed,
        "epoch": args.epoch,
        "shard_assignment": args.shard_assignment,
    }
    summary = summarize_plan(ds.lengths, ds.index.sizes, **common)
    if not args.json:
        print(format_summary(summary))
        return Exit.OK
    ranks = rank_rows(summary)
    if args.with_ids:
        planner = EpochPlanner(ds.lengths, ds.index.sizes, **common)
        for row in ranks:
            plan = planner.plan(row["rank"])
            cuts = list(zip(plan.batch_offsets[:-1].tolist(), plan.batch_offsets[1:].tolist()))
            row["batch_sample_ids"] = [plan.sample_ids[a:b].tolist() for a, b in cuts]
            row["batch_weights"] = [plan.weights[a:b].tolist() for a, b in cuts]
    print_json(
        {
            "world_size": summary.world_size,
            "stage": summary.stage,
            "padding_fraction": float(summary.padding_fraction),
            "ranks": ranks,
        }
    )
    return Exit.OK


def rank_rows(summary: Any) -> list[dict[str, Any]]:
    """One dict per rank from a ``PlanSummary``: the ``ranks`` of ``--json``."""
    return [
        {
            "rank": r,
            "batches": int(summary.num_batches),  # the same on every rank, by construction
            "samples": int(summary.samples[r]),
            "filler": int(summary.filler[r]),
            "tokens": int(summary.tokens[r]),
            "padded_tokens": int(summary.padded_tokens[r]),
        }
        for r in range(summary.world_size)
    ]


def format_summary(summary: Any) -> str:
    """The human report: one line per rank, totals, then balance and locality."""
    ranks = rank_rows(summary)
    head = ("rank", "batches", "samples", "filler", "tokens", "padded tokens", "padding")

    def cells(name: str, r: dict[str, Any], padding: float | None) -> tuple[str, ...]:
        return (
            name,
            f"{r['batches']:,}",
            f"{r['samples']:,}",
            f"{r['filler']:,}",
            f"{r['tokens']:,}",
            f"{r['padded_tokens']:,}",
            "-" if padding is None else f"{100 * padding:.1f}%",
        )

    rows = [
        cells(str(r["rank"]), r, 1 - r["tokens"] / r["padded_tokens"] if r["padded_tokens"] else None) for r in ranks
    ]
    total = {key: sum(r[key] for r in ranks) for key in ("batches", "samples", "filler", "tokens", "padded_tokens")}
    rows.append(cells("all", total, float(summary.padding_fraction)))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]

    def line(values: tuple[str, ...]) -> str:
        return "  ".join(v.rjust(w) for v, w in zip(values, widths))

    out = [line(head), *map(line, rows[:-1]), "  ".join("-" * w for w in widths), line(rows[-1]), ""]
    padded = summary.padded_tokens
    slowest, fastest = int(padded.argmax()), int(padded.argmin())
    out.append(
        f"spread:   {summary.spread:.3f} = padded tokens of the slowest rank ({slowest}) / the fastest ({fastest}); "
        "every step waits for the slowest"
    )
    added, dropped = int(summary.added_batches.sum()), int(summary.dropped_batches.sum())
    counts = summary.rank_batch_counts
    out.append(
        f"batches:  {summary.num_batches:,} per rank (before equalising {int(counts.min()):,}..{int(counts.max()):,}; "
        f"{added:,} added, {dropped:,} dropped)"
    )
    if summary.budget_fill is not None:
        out.append(f"budget:   token batches are {summary.budget_fill:.1%} full on average")
    out.append(f"shards:   {int(summary.shards.min()):,}..{int(summary.shards.max()):,} per rank")
    out.append(f"fingerprint {summary.fingerprint}")
    return "\n".join(out)
