"""The per-source part of a mixture's plan report: what each source gives the epoch, and how evenly.

:func:`~shardload.plan.summarize_plan` feeds every rank's plan of a mixture
to a :class:`SourceTally` and puts the :class:`SourceReport` it makes into
:attr:`PlanSummary.sources <shardload.plan.PlanSummary.sources>`, which
``shardload plan --source ...`` prints::

    RankPlan of each rank  ->  SourceTally.add()  ->  (T, K) units per step, (W, K) per rank
                                                  ->  SourceReport: per source tokens, samples,
                                                      repeats, share per rank, worst prefix deviation
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload.plan.mix.inputs import MixInputs, select_source
from shardload.plan.options import Batching
from shardload.plan.rankplan import RankPlan
from shardload.plan.request import EpochSpec

__all__ = ["SourceReport", "SourceTally"]


@dataclass(frozen=True, eq=False)
class SourceReport:
    """Per-source figures of one epoch of a mixture.

    Attributes:
        names: The sources, in order (``batch["source"]`` indexes them).
        by: What the weights count: ``"tokens"`` or ``"samples"``.
        weights: ``(K,)`` target share of each source (normalised).
        tokens: ``(K,)`` real tokens of each source in the epoch.
        samples: ``(K,)`` real samples (uses: a repeated sample counts each time).
        ratios: ``(K,)`` uses asked per sample on average (``T_k / U_k``; 1.0 in evaluation).
        max_uses: ``(K,)`` the most times one sample of the source is used.
        rank_share: ``(W, K)`` each source's share of each rank's units.
        deviation: ``(K,)`` the worst ``|x_k - w_k X|`` over step prefixes, all
            ranks together, in units (tokens or samples).
        longest: The longest sample (1 with ``by="samples"``): the scale of the deviation bound.
        input_samples: ``(K,)`` the samples each source holds (what the epoch selects from).
        input_tokens: ``(K,)`` the tokens each source holds.
    """

    names: tuple[str, ...]
    by: str
    weights: NDArray[np.float64]
    tokens: NDArray[np.int64]
    samples: NDArray[np.int64]
    ratios: NDArray[np.float64]
    max_uses: NDArray[np.int64]
    rank_share: NDArray[np.float64]
    deviation: NDArray[np.float64]
    longest: int
    input_samples: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    input_tokens: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def to_dict(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per source (``shardload plan --json``'s ``sources``)."""
        return [
            {
                "name": name,
                "weight": float(self.weights[k]),
                "tokens": int(self.tokens[k]),
                "samples": int(self.samples[k]),
                "ratio": float(self.ratios[k]),
                "max_uses": int(self.max_uses[k]),
                "rank_share_min": float(self.rank_share[:, k].min()) if len(self.rank_share) else 0.0,
                "rank_share_max": float(self.rank_share[:, k].max()) if len(self.rank_share) else 0.0,
                f"worst_prefix_deviation_{self.by}": float(self.deviation[k]),
                **(
                    {"input_samples": int(self.input_samples[k]), "input_tokens": int(self.input_tokens[k])}
                    if len(self.input_samples)
                    else {}
                ),
            }
            for k, name in enumerate(self.names)
        ]

    def format(self, world_size: int) -> list[str]:
        """The table's lines: one row per source, then what the deviation means."""
        head = ("source", "weight", "tokens", "samples", "ratio", "max uses", "share per rank", "worst deviation")
        rows = []
        for row in self.to_dict():
            rows.append(
                (
                    row["name"],
                    f"{row['weight']:.3f}",
                    f"{row['tokens']:,}",
                    f"{row['samples']:,}",
                    f"{row['ratio']:.3g}",
                    f"{row['max_uses']:,}",
                    f"{row['rank_share_min']:.3f}..{row['rank_share_max']:.3f}",
                    f"{row[f'worst_prefix_deviation_{self.by}']:,.0f} {self.by}",
                )
            )
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        out = ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in [head, *rows]]
        worst = float(self.deviation.max(initial=0.0)) / max(world_size, 1) / max(self.longest, 1)
        out.append(
            f"mixture:  worst deviation from the weights over step prefixes = {worst:.2f} longest samples per rank "
            f"(by {self.by})"
        )
        return out


class SourceTally:
    """Adds up every rank's plan of a mixture, source by source (see the module docstring)."""

    def __init__(self, mix: MixInputs, spec: EpochSpec, batching: Batching, num_batches: int) -> None:
        self.mix, self.spec, self.batching = mix, spec, batching
        k = mix.num_sources
        self.steps = np.zeros((num_batches, k), dtype=np.int64)  # (T, K) units of each source at each step
        self.rank_units = np.zeros((spec.world_size, k), dtype=np.int64)
        self.tokens = np.zeros(k, dtype=np.int64)
        self.samples = np.zeros(k, dtype=np.int64)

    def add(self, plan: RankPlan, lens: NDArray[np.int64]) -> None:
        """Count one rank's plan; ``lens`` are its entries' lengths (``(rows,)``)."""
        real = plan.weights > 0
        source = self.mix.source_of(plan.sample_ids)
        tokens = lens if plan.starts is None else np.minimum(lens - plan.starts, self.batching.pack_length or 0)
        firsts = real if plan.starts is None else real & (plan.starts == 0)  # a sample cut in pieces counts once
        k = self.mix.num_sources
        self.tokens += np.bincount(source, weights=np.where(real, tokens, 0), minlength=k).astype(np.int64)
        self.samples += np.bincount(source, weights=firsts, minlength=k).astype(np.int64)
        units = np.where(firsts, 1, 0) if self.mix.by == "samples" else np.where(real, tokens, 0)
        batch = np.repeat(np.arange(len(plan)), np.diff(plan.batch_offsets))
        np.add.at(self.steps, (batch, source), units)
        self.rank_units[plan.rank] = np.bincount(source, weights=units, minlength=k).astype(np.int64)

    def report(self) -> SourceReport:
        """The figures of every rank added so far."""
        mix, spec = self.mix, self.spec
        selections = [
            select_source(mix, k, seed=spec.seed, epoch=spec.epoch, train=spec.shuffled) for k in range(mix.num_sources)
        ]
        weights = np.asarray(mix.shares, dtype=np.float64)
        if not spec.shuffled:  # evaluation reads every sample once: the sources' sizes are the shares
            units = np.asarray(mix.units, dtype=np.float64)
            weights = units / units.sum() if units.sum() else weights
        done = np.cumsum(self.steps, axis=0)  # (T, K)
        deviation = np.abs(done - np.outer(done.sum(axis=1), weights)).max(axis=0, initial=0.0)
        per_rank = self.rank_units.sum(axis=1, keepdims=True)
        return SourceReport(
            names=mix.names,
            by=mix.by,
            weights=weights,
            tokens=self.tokens,
            samples=self.samples,
            ratios=np.array([s.ratio if s.counts is not None else float(s.units > 0) for s in selections]),
            max_uses=np.array([s.max_uses for s in selections], dtype=np.int64),
            rank_share=self.rank_units / np.maximum(per_rank, 1),
            deviation=deviation,
            longest=1 if mix.by == "samples" else mix.max_length,
            input_samples=np.array([s.num_samples for s in mix.sources], dtype=np.int64),
            input_tokens=np.array([np.asarray(s.lengths).sum(dtype=np.int64) for s in mix.sources], dtype=np.int64),
        )
