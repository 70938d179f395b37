"""Dry-run report of a plan over all ranks: balance, padding, locality.

:func:`summarize_plan` builds every rank's plan once (sharing the per-epoch
work) and reduces each to a few numbers, for choosing options before a run.
:class:`PlanSummary` renders itself: :meth:`PlanSummary.format` is the table
``shardload plan`` prints, :meth:`PlanSummary.to_dict` its ``--json``.
Given the shards' bytes, it also sizes the node-local cache of a remote set
(:mod:`shardload.plan.reads`): per rank, and per node of ranks sharing one cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardload._base.checks import check_bool, check_scalar
from shardload._base.messages import format_bytes
from shardload.errors import PlanError
from shardload.plan.mix.inputs import MixInputs
from shardload.plan.mix.report import SourceReport, SourceTally
from shardload.plan.options import Batching, Stage
from shardload.plan.planner import EpochPlanner, RankPlan
from shardload.plan.reads import cache_bytes, read_sequence, shards_of, step_bytes
from shardload.plan.request import EpochSpec, PlanInputs
from shardload.plan.steps import batch_costs

__all__ = ["PlanSummary", "summarize_plan"]


@dataclass(frozen=True, eq=False)
class PlanSummary:
    """Per-rank figures of one epoch's plan.

    Attributes:
        world_size: Number of ranks ``W``.
        stage: The stage planned.
        num_samples: ``N``.
        num_batches: Batches per rank after equalisation (same on all ranks).
        max_tokens: The token budget, if batching by tokens.
        fingerprint: The plan fingerprint shared by all ranks.
        rank_batch_counts: ``(W,)`` batches per rank before equalisation.
        samples: ``(W,)`` real rows per rank.
        filler: ``(W,)`` filler rows per rank.
        tokens: ``(W,)`` sum of real rows' lengths per rank.
        padded_tokens: ``(W,)`` sum over the rank's batches of ``rows *
            padded_length(longest row)``, filler rows included: what the
            model computes on.
        shards: ``(W,)`` distinct shards each rank's rows touch.
        step_efficiency: How little ranks wait for each other in a step:
            the sum over steps of the mean padded tokens across ranks, over
            the sum over steps of the largest (1.0: nobody waits; 0.8: a fifth
            of the time the slowest rank sets is spent waiting, on average
            over the ranks). A packed batch is always ``rows_per_batch *
            pack_length`` tokens, so a packed plan scores 1.0.
        plans: Every rank's :class:`~shardload.plan.RankPlan`, when
            :func:`summarize_plan` was asked ``with_ids=True`` (else ``None``).
        sources: A mixture's per-source figures
            (:class:`~shardload.plan.mix.report.SourceReport`); ``None`` for one shard set.
        cache_bytes: ``(W,)`` bytes of the distinct shards each rank reads this
            epoch: a node-local cache of that size fetches no shard twice;
            ``None`` unless :func:`summarize_plan` was given the shards' bytes.
        step_bytes: ``(W,)`` the most bytes one batch of the rank reads (the
            distinct shards it touches): the least cache that works; or ``None``.
        ranks_per_node: ``K``: ranks ``kK .. kK + K - 1`` share node ``k``'s cache.
        node_cache_bytes: ``(ceil(W / K),)`` bytes of the distinct shards the
            ranks of each node read; or ``None``.
        draw: Training: the draw of the epoch's shard and sample orders (0: the first;
            :mod:`shardload.plan.length`).
        whole_samples: ``(W,)`` samples of each rank, a sample cut into pieces
            (``pack_split``) once, a sample a mixture repeats each time; ``None``:
            as ``samples``.
        rows: ``(W,)`` packed plans: the rows of each rank that hold a document; else ``None``.
        input_tokens: The tokens of the set, or of a mixture's sources together.
    """

    world_size: int
    stage: Stage
    num_samples: int
    num_batches: int
    max_tokens: int | None
    fingerprint: str
    rank_batch_counts: NDArray[np.int64]
    samples: NDArray[np.int64]
    filler: NDArray[np.int64]
    tokens: NDArray[np.int64]
    padded_tokens: NDArray[np.int64]
    shards: NDArray[np.int64]
    step_efficiency: float = 1.0
    plans: tuple[RankPlan, ...] | None = None
    sources: SourceReport | None = None
    cache_bytes: NDArray[np.int64] | None = None
    step_bytes: NDArray[np.int64] | None = None
    ranks_per_node: int = 1
    node_cache_bytes: NDArray[np.int64] | None = None
    draw: int = 0
    whole_samples: NDArray[np.int64] | None = None
    rows: NDArray[np.int64] | None = None
    input_tokens: int = 0

    @property
    def epoch_samples(self) -> int:
        """The samples the epoch holds over all ranks (a cut sample once, a repeated one each time)."""
        return int((self.samples if self.whole_samples is None else self.whole_samples).sum())

    @property
    def padding_fraction(self) -> float:
        """``1 - tokens / padded_tokens`` over all ranks (0 when nothing is padded)."""
        padded = int(self.padded_tokens.sum())
        return 1.0 - int(self.tokens.sum()) / padded if padded else 0.0

    @property
    def spread(self) -> float:
        """Largest / smallest padded tokens of a rank: 1.0 is perfect balance."""
        low, high = int(self.padded_tokens.min()), int(self.padded_tokens.max())
        if high == 0:
            return 1.0
        return high / low if low else float("inf")

    @property
    def budget_fill(self) -> float | None:
        """Padded tokens / (batches * max_tokens): how full token batches are."""
        if self.max_tokens is None or self.num_batches == 0:
            return None
        return int(self.padded_tokens.sum()) / (self.num_batches * self.world_size * self.max_tokens)

    @property
    def added_batches(self) -> NDArray[np.int64]:
        """``(W,)`` batches each rank gained by splitting or filler."""
        return np.maximum(self.num_batches - self.rank_batch_counts, 0)

    @property
    def dropped_batches(self) -> NDArray[np.int64]:
        """``(W,)`` batches each rank dropped (``uneven="drop"`` only)."""
        return np.maximum(self.rank_batch_counts - self.num_batches, 0)

    def rank_rows(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per rank: its figures, and its batches when the plans are kept."""
        rows = []
        for r in range(self.world_size):
            row: dict[str, Any] = {
                "rank": r,
                "batches": self.num_batches,  # the same on every rank, by construction
                "batches_before_equalising": int(self.rank_batch_counts[r]),
                "samples": int(self.samples[r]),
                "filler": int(self.filler[r]),
                "tokens": int(self.tokens[r]),
                "padded_tokens": int(self.padded_tokens[r]),
                "shards": int(self.shards[r]),
            }
            if self.rows is not None:
                row["rows"] = int(self.rows[r])
            if self.cache_bytes is not None and self.step_bytes is not None:
                row["cache_bytes"] = int(self.cache_bytes[r])
                row["step_bytes"] = int(self.step_bytes[r])
            if self.plans is not None:
                plan = self.plans[r]
                cuts = list(zip(plan.batch_offsets[:-1].tolist(), plan.batch_offsets[1:].tolist()))
                row["batch_sample_ids"] = [plan.sample_ids[a:b].tolist() for a, b in cuts]
                row["batch_weights"] = [plan.weights[a:b].tolist() for a, b in cuts]
                if plan.rows is not None and plan.starts is not None:  # packed: each entry's row and first token
                    row["batch_rows"] = [plan.rows[a:b].tolist() for a, b in cuts]
                    row["batch_starts"] = [plan.starts[a:b].tolist() for a, b in cuts]
            rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the scalars, and ``ranks``, one dict per rank (:meth:`rank_rows`).

        This is what ``shardload plan --json`` prints.
        """
        return {
            "world_size": self.world_size,
            "stage": self.stage,
            "num_samples": self.num_samples,
            "num_batches": self.num_batches,
            "max_tokens": self.max_tokens,
            "fingerprint": self.fingerprint,
            "padding_fraction": self.padding_fraction,
            "spread": self.spread,
            "budget_fill": self.budget_fill,
            "step_efficiency": self.step_efficiency,
            "epoch_samples": self.epoch_samples,
            "epoch_tokens": int(self.tokens.sum()),
            **({"epoch_documents": int(self.samples.sum())} if self.rows is not None else {}),
            "input_tokens": self.input_tokens,
            "ranks": self.rank_rows(),
            **(
                {"ranks_per_node": self.ranks_per_node, "node_cache_bytes": self.node_cache_bytes.tolist()}
                if self.node_cache_bytes is not None
                else {}
            ),
            **({"sources": self.sources.to_dict()} if self.sources is not None else {}),
        }

    def format(self) -> str:
        """The report ``shardload plan`` prints: one line per rank, totals, balance and locality."""
        head = ("rank", "batches", "samples", "filler", "tokens", "padded tokens", "padding")

        def cells(name: str, values: list[int], padding: float | None) -> tuple[str, ...]:
            return (name, *(f"{v:,}" for v in values), "-" if padding is None else f"{100 * padding:.1f}%")

        per_rank = np.stack(
            [np.full(self.world_size, self.num_batches), self.samples, self.filler, self.tokens, self.padded_tokens],
            axis=1,
        )  # (W, 5) batches, samples, filler, tokens, padded tokens
        rows = []
        for r in range(self.world_size):
            pad = int(self.padded_tokens[r])
            rows.append(cells(str(r), per_rank[r].tolist(), 1 - int(self.tokens[r]) / pad if pad else None))
        rows.append(cells("all", per_rank.sum(axis=0).tolist(), self.padding_fraction))
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]

        def line(values: tuple[str, ...]) -> str:
            return "  ".join(v.rjust(w) for v, w in zip(values, widths))

        out = [line(head), *map(line, rows[:-1]), "  ".join("-" * w for w in widths), line(rows[-1]), ""]
        padded, counts = self.padded_tokens, self.rank_batch_counts
        slowest, fastest = int(padded.argmax()), int(padded.argmin())
        out += [
            *self._epoch_lines(),
            f"spread:   {self.spread:.3f} = padded tokens of the slowest rank ({slowest}) / the fastest ({fastest}); "
            "every step waits for the slowest",
            f"batches:  {self.num_batches:,} per rank (before equalising {int(counts.min()):,}..{int(counts.max()):,}; "
            f"{int(self.added_batches.sum()):,} added, {int(self.dropped_batches.sum()):,} dropped)",
        ]
        if self.stage == "train":
            drawn = f" (this epoch's orders drawn again: draw {self.draw})" if self.draw else ""
            out.append(f"epochs:   {self.num_batches:,} steps in every training epoch of the run{drawn}")
        if self.budget_fill is not None:
            out.append(f"budget:   token batches are {self.budget_fill:.1%} full on average")
        out.append(
            f"steps:    step efficiency {self.step_efficiency:.3f} = mean / max padded tokens over ranks, summed "
            "over steps (1.0: no rank waits)"
        )
        out.append(f"shards:   {int(self.shards.min()):,}..{int(self.shards.max()):,} per rank")
        out += self._cache_lines()
        if self.sources is not None:
            out += ["", *self.sources.format(self.world_size)]
        out.append(f"fingerprint {self.fingerprint}")
        return "\n".join(out)

    def _epoch_lines(self) -> list[str]:
        """The headline of :meth:`format`: what the epoch holds, then (labelled) what the set or sources hold."""
        lines = [
            f"stage {self.stage}: the epoch holds {self.epoch_samples:,} samples, {int(self.tokens.sum()):,} tokens, "
            f"on {self.world_size} ranks: {self.num_batches:,} batches per rank"
        ]
        if self.rows is not None:
            lines.append(
                f"packed:   {int(self.samples.sum()):,} documents (each piece of a cut sample one) in "
                f"{int(self.rows.sum()):,} rows: {_range_of(self.rows)} rows and {self.num_batches:,} batches per rank"
            )
        totals = f"{self.num_samples:,} samples, {self.input_tokens:,} tokens in all"
        if self.sources is None:
            lines.append(f"set:      {totals}")
        else:
            each = ", ".join(
                f"{name} {n:,} / {t:,}"
                for name, n, t in zip(self.sources.names, self.sources.input_samples, self.sources.input_tokens)
            )
            lines.append(f"sources:  {totals} (samples / tokens: {each})")
        return lines

    def _cache_lines(self) -> list[str]:
        """The cache sizing lines of :meth:`format` (none without the shards' bytes)."""
        if self.cache_bytes is None or self.step_bytes is None or self.node_cache_bytes is None:
            return []
        lines = [
            f"cache:    {_span(self.cache_bytes)} per rank to fetch no shard twice this epoch "
            f"(at least {_span(self.step_bytes)}: the shards of its largest batch)"
        ]
        if self.ranks_per_node > 1:
            lines.append(
                f"node:     {_span(self.node_cache_bytes)} per node of {self.ranks_per_node} ranks sharing one cache"
            )
        return lines


def _range_of(values: NDArray[np.int64]) -> str:
    """``"20"``, or ``"19..21"`` when the values differ."""
    low, high = int(values.min()), int(values.max())
    return f"{low:,}" if low == high else f"{low:,}..{high:,}"


def _span(values: NDArray[np.int64]) -> str:
    """``"1.2 GB"``, or ``"1.1 GB..1.3 GB"`` when the values differ (decimal units)."""
    low, high = format_bytes(int(values.min())), format_bytes(int(values.max()))
    return low if low == high else f"{low}..{high}"


def lengths_of(inputs: PlanInputs | MixInputs, ids: NDArray[np.int64]) -> NDArray[np.int64]:
    """``(n,)`` the lengths of global sample ids, of one shard set or of a mixture's sources."""
    if isinstance(inputs, MixInputs):
        return inputs.lengths_at(ids)
    return np.asarray(inputs.lengths[ids], dtype=np.int64)


def _rank_figures(
    plan: RankPlan,
    lens: NDArray[np.int64],
    shard_starts: NDArray[np.int64],
    batching: Batching,
    costs: NDArray[np.int64],
) -> tuple[int, int, int, int, int, int, int]:
    """``(samples, filler, tokens, padded_tokens, shards, whole_samples, rows)`` of one rank's plan, given its
    batches' ``costs``.

    A packed plan's entries are documents (pieces of a cut sample count once
    each, with their own tokens); ``whole_samples`` counts a cut sample once, ``rows`` the packed rows that
    hold a document (0 for a plan that is not packed).
    """
    real = plan.weights > 0
    whole, rows = int(real.sum()), 0
    if plan.starts is not None:
        whole = int((real & (plan.starts == 0)).sum())
    if plan.rows is not None and batching.rows_per_batch is not None:
        batch = np.repeat(np.arange(len(plan), dtype=np.int64), np.diff(plan.batch_offsets))  # (entries,)
        rows = len(np.unique(batch[real] * batching.rows_per_batch + plan.rows[real]))
    if plan.starts is not None and batching.pack_length is not None:  # a piece's own tokens (pack_split)
        lens = np.minimum(lens - plan.starts, batching.pack_length)
    shards = np.unique(shards_of(plan.sample_ids, shard_starts))
    real_rows = int(real.sum())
    return real_rows, len(real) - real_rows, int(lens[real].sum()), int(costs.sum()), len(shards), whole, rows


def _tokens(inputs: PlanInputs) -> int:
    return int(np.asarray(inputs.lengths).sum(dtype=np.int64))


def _step_efficiency(step_sum: NDArray[np.int64], step_max: NDArray[np.int64], world_size: int) -> float:
    """Sum over steps of the mean padded tokens over ranks / sum of the largest; 1.0 when nothing is computed."""
    most = int(step_max.sum())
    return int(step_sum.sum()) / world_size / most if most else 1.0


def _batch_costs(plan: RankPlan, lens: NDArray[np.int64], batching: Batching) -> NDArray[np.int64]:
    """``(num_batches,)`` padded tokens of each batch of a plan: a packed batch is ``rows_per_batch * pack_length``."""
    if batching.packing:
        assert batching.pack_length is not None and batching.rows_per_batch is not None
        return np.full(len(plan), batching.rows_per_batch * batching.pack_length, dtype=np.int64)
    return batch_costs(lens, plan.batch_offsets, batching.pad_to_multiple_of)


class _CacheTally:
    """Cache sizing over the ranks of a summary: per rank (reads.py), and the union of each node's shards."""

    def __init__(self, shard_bytes: ArrayLike, num_shards: int, world_size: int, ranks_per_node: int) -> None:
        self.shard_bytes = np.asarray(shard_bytes)
        if self.shard_bytes.shape != (num_shards,) or not np.issubdtype(self.shard_bytes.dtype, np.integer):
            raise PlanError(
                f"shard_bytes: expected {num_shards} integer byte sizes (one per shard, a mixture's sources one "
                f"after another), got shape {self.shard_bytes.shape} of {self.shard_bytes.dtype}"
            )
        if num_shards and int(self.shard_bytes.min()) < 0:
            raise PlanError(f"shard_bytes: shard {int(self.shard_bytes.argmin())} has a negative size")
        self.shard_bytes = self.shard_bytes.astype(np.int64)
        self.ranks_per_node = ranks_per_node
        self.figures = np.zeros((world_size, 2), dtype=np.int64)  # (W, 2) cache bytes, step bytes
        self.nodes = np.zeros(-(-world_size // ranks_per_node), dtype=np.int64)  # (ceil(W / K),)
        self._node_shards = np.zeros(num_shards, dtype=bool)  # (S,) read by a rank of the current node

    def add(self, rank: int, plan: RankPlan, shard_starts: NDArray[np.int64]) -> None:
        sequence, step_offsets = read_sequence(plan.sample_ids, plan.batch_offsets, shard_starts)
        self.figures[rank] = (
            cache_bytes(sequence, self.shard_bytes),
            step_bytes(sequence, step_offsets, self.shard_bytes),
        )
        self._node_shards[sequence] = True
        node, last = divmod(rank, self.ranks_per_node)
        if last == self.ranks_per_node - 1 or rank == len(self.figures) - 1:  # the node's last rank
            self.nodes[node] = int(self.shard_bytes[self._node_shards].sum())
            self._node_shards[:] = False


def summarize_plan(
    inputs: PlanInputs | MixInputs,
    spec: EpochSpec,
    batching: Batching,
    *,
    with_ids: bool = False,
    shard_bytes: ArrayLike | None = None,
    ranks_per_node: int = 1,
) -> PlanSummary:
    """Plan every rank of one epoch and report balance, padding and locality.

    The per-epoch work (counting, fingerprint) is done once; each rank is then
    built as :func:`~shardload.plan.plan_rank` would (:meth:`EpochPlanner.plans`). Cost: about the cost of
    one :func:`plan_rank` plus ``O(N log)`` to build every rank.

    Args:
        inputs: The shard set's lengths and shard sizes.
        spec: The epoch to plan.
        batching: How rows become batches.
        with_ids: Keep every rank's plan in :attr:`PlanSummary.plans` (its
            batches' sample ids and weights; memory ``O(N)``).
        shard_bytes: ``(S,)`` bytes of every shard (``[s.bytes for s in
            ds.shards]``; a mixture's sources one after another), to size a
            remote set's cache (:attr:`PlanSummary.cache_bytes`); ``None``: not sized.
        ranks_per_node: Ranks sharing one node's cache, for
            :attr:`PlanSummary.node_cache_bytes` (ranks ``kK .. kK + K - 1``
            are node ``k``, as torchrun numbers them).

    Returns:
        The :class:`PlanSummary`.

    Raises:
        PlanError: If an argument is invalid (``with_ids`` too: ``"no"`` is not ``False``).

    >>> inputs = PlanInputs(np.arange(100), np.array([60, 40]))
    >>> summary = summarize_plan(inputs, EpochSpec(world_size=3, stage="val"), Batching(batch_size=8))
    >>> summary.samples.tolist(), summary.num_batches
    ([33, 33, 34], 5)
    """
    with_ids = check_bool("with_ids", with_ids)
    ranks_per_node = check_scalar("ranks_per_node", ranks_per_node, low=1, high=spec.world_size)
    planner = EpochPlanner(inputs, spec, batching)
    cache = None
    if shard_bytes is not None:
        cache = _CacheTally(shard_bytes, inputs.num_shards, spec.world_size, ranks_per_node)
    kept: list[RankPlan] = []
    # (W, 7) samples, filler, tokens, padded, shards, whole samples, rows
    figures = np.zeros((spec.world_size, 7), dtype=np.int64)
    step_sum = np.zeros(planner.num_batches, dtype=np.int64)  # (T,) padded tokens of each step, over ranks
    step_max = np.zeros(planner.num_batches, dtype=np.int64)  # (T,) the most a rank computes at each step
    tally = SourceTally(inputs, spec, batching, planner.num_batches) if isinstance(inputs, MixInputs) else None
    for rank, plan in enumerate(planner.plans()):
        lens = lengths_of(inputs, plan.sample_ids)  # (rows,)
        costs = _batch_costs(plan, lens, batching)  # (T,)
        figures[rank] = _rank_figures(plan, lens, planner.shard_starts, batching, costs)
        step_sum += costs
        np.maximum(step_max, costs, out=step_max)
        if tally is not None:
            tally.add(plan, lens)
        if cache is not None:
            cache.add(rank, plan, planner.shard_starts)
        if with_ids:
            kept.append(plan)
    return PlanSummary(
        world_size=spec.world_size,
        stage=spec.stage,
        num_samples=inputs.num_samples,
        num_batches=planner.num_batches,
        max_tokens=batching.max_tokens,
        fingerprint=planner.fingerprint,
        rank_batch_counts=planner.rank_batch_counts,
        samples=figures[:, 0],
        filler=figures[:, 1],
        tokens=figures[:, 2],
        padded_tokens=figures[:, 3],
        shards=figures[:, 4],
        step_efficiency=_step_efficiency(step_sum, step_max, spec.world_size),
        plans=tuple(kept) if with_ids else None,
        sources=None if tally is None else tally.report(),
        cache_bytes=None if cache is None else cache.figures[:, 0],
        step_bytes=None if cache is None else cache.figures[:, 1],
        ranks_per_node=ranks_per_node,
        node_cache_bytes=None if cache is None else cache.nodes,
        draw=planner.draw,
        whole_samples=figures[:, 5],
        rows=figures[:, 6] if batching.packing else None,
        input_tokens=sum(_tokens(one) for one in (inputs.sources if isinstance(inputs, MixInputs) else (inputs,))),
    )
