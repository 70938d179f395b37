"""A mixture's batches: per source assign and batch, per rank interleave, then equalise.

:class:`MixBatcher` is what :class:`~shardload.plan.EpochPlanner` uses in
place of a single batcher for :class:`~shardload.plan.mix.inputs.MixInputs`
(the steps: docs/planning.md, "Mixtures"). Each source keeps its own seed,
shard order and batcher, so a rank reads a contiguous group of every source's
shards; with packing the unit interleaved is a row. A rank's batch count is
the sum of its sources' (packing: ``ceil(rows / rows_per_batch)``), so every
rank counts every rank without the interleave (:func:`interleave`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths
from shardload.errors import MixtureError
from shardload.plan.assign import ShardLayout, assign_shards, balance_by_tokens, shard_order
from shardload.plan.batcher import Batcher
from shardload.plan.chunks import ChunkWindows, resolve_chunk_windows
from shardload.plan.equalize import equalize_batches
from shardload.plan.mix.inputs import MixInputs, Selection, refuse_long_samples_in, select_source, source_seed
from shardload.plan.options import Batching, Uneven
from shardload.plan.packing.balance import balance_rows
from shardload.plan.packing.pack import PackBatcher
from shardload.plan.request import EpochSpec, PlanInputs
from shardload.plan.shuffle import permute_batches
from shardload.plan.strategy import layout_key, make_batcher

__all__ = ["MixBatcher", "MixedBatches", "SourcePart", "interleave"]


@dataclass(frozen=True)
class MixedBatches:
    """One rank's equalised batches of a mixture: the fields of a :class:`~shardload.plan.RankPlan`, global ids."""

    sample_ids: NDArray[np.int64]
    weights: NDArray[np.float32]
    batch_offsets: NDArray[np.int64]
    rows: NDArray[np.int32] | None
    starts: NDArray[np.int64] | None


def _per_shard(values: NDArray[np.int64], shard_sizes: NDArray[np.int64]) -> NDArray[np.int64]:
    """``(S,)`` sums of ``values`` (one per sample) over each shard."""
    out = np.zeros(len(shard_sizes), dtype=np.int64)
    nonempty = shard_sizes > 0
    if len(values):
        out[nonempty] = np.add.reduceat(values, offsets_from_lengths(shard_sizes)[:-1][nonempty])
    return out


@dataclass(frozen=True, eq=False)
class SourcePart:
    """One source's share of an epoch: the selected samples, their rank ranges and batcher.

    Attributes:
        offset: The global id of its sample 0.
        entries: ``(n,)`` local sample id of each selected use, in shard order
            (``None``: every sample once, the ids themselves).
        inputs: The selected uses as a lengths index (the source's own when ``entries`` is ``None``).
    """

    index: int
    offset: int
    selection: Selection
    entries: NDArray[np.int64] | None
    inputs: PlanInputs
    layout: ShardLayout
    batcher: Batcher

    def global_ids(self, uses: NDArray[np.int64]) -> NDArray[np.int64]:
        """Global sample ids of selected uses (the batcher's ids)."""
        local = uses if self.entries is None else self.entries[uses]
        return local + self.offset


class MixBatcher:
    """Counts every rank's batches of a mixture and builds one rank's (see the module docstring).

    Raises:
        MixtureError: see :func:`~shardload.plan.mix.inputs.select_source`.
        PlanError: with packing, a sample longer than a row and no ``pack_split`` (naming its source).
    """

    def __init__(self, mix: MixInputs, spec: EpochSpec, batching: Batching, *, order_seed: int | None = None) -> None:
        self.mix, self.spec, self.batching = mix, spec, batching
        #: the seed of the shard and sample orders (a later draw's, :mod:`shardload.plan.length`); the selection
        #: always takes the run's seed
        self.order_seed = spec.seed if order_seed is None else order_seed
        self.packed = batching.packing
        # with packing the unit interleaved is a row: each source packs one row per "batch"
        self.unit_batching = dataclasses.replace(batching, rows_per_batch=1) if self.packed else batching
        train = spec.shuffled
        self.parts: list[SourcePart] = []
        #: each source's chunk windows, in source order (``None``: a full shuffle)
        self.chunks: list[ChunkWindows | None] = []
        if self.packed:
            refuse_long_samples_in(mix, batching)
        for k, source in enumerate(mix.sources):
            selection = select_source(mix, k, seed=spec.seed, epoch=spec.epoch, train=train)
            try:
                self.parts.append(self._part(k, selection))
            except MemoryError:  # an epoch size with zeros too many: say which source and what to change
                uses = source.num_samples if selection.counts is None else int(selection.counts.sum())
                raise MixtureError(
                    f"source {mix.names[k]!r} of the mixture: planning its {uses:,} sample uses this epoch "
                    f"({selection.ratio:.3g} per sample) ran out of memory: lower the epoch size or its weight, "
                    "or set max_repeats to refuse such an epoch"
                ) from None
        #: whether evaluation's packed ranks were re-cut by the rows they pack (:meth:`_cut_by_rows`)
        self.cut_by_rows = False
        if self.packed and not train:
            self._cut_by_rows()

    def _part(self, k: int, selection: Selection) -> SourcePart:
        mix, spec, source = self.mix, self.spec, self.mix.sources[k]
        seed = source_seed(self.order_seed, k)
        entries = None
        inputs = source
        if selection.counts is not None:
            entries = np.repeat(np.arange(source.num_samples, dtype=np.int64), selection.counts)
            sizes = _per_shard(selection.counts, source.shard_sizes)
            inputs = PlanInputs(
                source.lengths[entries], sizes, digest=f"{source.digest}/selected", chunk_rows=source.chunk_rows
            )
        rotate = spec.shuffled and spec.shard_assignment == "rotate"
        order = shard_order(inputs.num_shards, seed=seed, epoch=spec.epoch, shuffle=rotate)
        layout = assign_shards(inputs.shard_sizes, spec.world_size, order=order)
        if mix.by == "tokens":  # each rank gets near its share of every source's tokens
            layout = balance_by_tokens(layout, inputs.lengths, inputs.shard_tokens)
        chunks = resolve_chunk_windows(self.unit_batching, inputs.chunk_rows, shuffled=spec.shuffled)
        self.chunks.append(chunks)
        batcher = make_batcher(
            self.unit_batching,
            lengths=inputs.lengths,
            layout=layout,
            shuffle=spec.shuffled,
            seed=seed,
            epoch=spec.epoch,
            max_length=inputs.max_length,
            chunks=chunks,
        )
        return SourcePart(k, int(mix.offsets[k]), selection, entries, inputs, layout, batcher)

    def _cut_by_rows(self) -> None:
        """Evaluation: each source's ranks re-cut by the rows they pack, given the rows of the sources before it,
        so that every rank's rows of all sources need near the same batches (:mod:`~shardload.plan.packing.balance`);
        the cuts and rows kept with each source's inputs for the next epoch."""
        per, world = self.batching.rows_per_batch, self.spec.world_size
        assert per is not None
        before = np.zeros(world, dtype=np.int64)  # (W,) rows of the sources already cut
        for k, part in enumerate(self.parts):
            batcher, layout = part.batcher, part.layout
            assert isinstance(batcher, PackBatcher) and part.entries is None  # evaluation: every sample once

            def cut(
                batcher: PackBatcher = batcher, before: NDArray[np.int64] = before, inputs: PlanInputs = part.inputs
            ) -> NDArray[np.int64]:
                balanced, rows = balance_rows(batcher, inputs.shard_tokens, per=per, before=before)
                return np.concatenate([balanced.layout.rank_starts, rows])

            key = ("packed row cuts", per, self.unit_batching.identity(), layout_key(layout), before.tobytes())
            kept = part.inputs.memo(key, cut)
            starts, rows = kept[: world + 1], kept[world + 1 :]
            if not np.array_equal(starts, layout.rank_starts):
                self.cut_by_rows = True
                layout = ShardLayout(layout.shard_starts, layout.order, layout.epoch_starts, starts)
                self.parts[k] = dataclasses.replace(part, layout=layout, batcher=batcher.relaid(layout))
                part.inputs.memo(("packed counts", self.unit_batching.identity(), layout_key(layout)), rows.copy)
            before = before + rows

    def _units_counted(self, part: SourcePart) -> NDArray[np.int64]:
        """``(W,)`` units (batches, or packed rows) of every rank for one source."""
        if self.packed and part.entries is None:  # packing every rank is costly: keep it for the next epoch
            key = ("packed counts", self.unit_batching.identity(), layout_key(part.layout))
            return part.inputs.memo(key, part.batcher.count_batches)
        return part.batcher.count_batches()

    def count_batches(self) -> NDArray[np.int64]:
        """``(W,)`` every rank's batch count before equalisation."""
        units = np.zeros(self.spec.world_size, dtype=np.int64)
        for part in self.parts:
            units += self._units_counted(part)
        if self.packed:
            assert self.batching.rows_per_batch is not None
            return -(-units // self.batching.rows_per_batch)
        return units

    def _source_units(
        self, part: SourcePart, rank: int
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64] | None, NDArray[np.int64]]:
        """``(ids, offsets, starts, sizes)`` of one source's units on ``rank``; ``sizes`` counts ``by``."""
        starts = None
        if isinstance(part.batcher, PackBatcher):
            packed = part.batcher.build_packed(rank, target=None, filler_id=0)
            uses, offsets, starts = packed.sample_ids, packed.batch_offsets, packed.starts
        else:
            uses, offsets = part.batcher.build_batches(rank)
        lens = np.asarray(part.inputs.lengths[uses], dtype=np.int64)
        if self.mix.by == "samples":
            per = np.ones(len(uses), dtype=np.int64) if starts is None else (starts == 0).astype(np.int64)
        elif starts is not None:
            assert self.batching.pack_length is not None
            per = np.minimum(lens - starts, self.batching.pack_length)
        else:
            per = lens
        sizes = np.add.reduceat(per, offsets[:-1]) if len(offsets) > 1 else np.zeros(0, dtype=np.int64)
        return part.global_ids(uses), offsets, starts, sizes.astype(np.int64)

    def _build(
        self, rank: int
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64] | None, NDArray[np.int64] | None]:
        units = [self._source_units(part, rank) for part in self.parts]
        order = interleave([u[3] for u in units])
        all_ids = np.concatenate([u[0] for u in units]) if units else np.zeros(0, np.int64)
        sizes = np.concatenate([np.diff(u[1]) for u in units]) if units else np.zeros(0, np.int64)
        offsets = offsets_from_lengths(sizes)
        ids, new_offsets = permute_batches(all_ids, offsets, order)
        if not self.packed:
            return ids, new_offsets, None, None
        all_starts = np.concatenate([u[2] for u in units if u[2] is not None])
        starts, _ = permute_batches(all_starts, offsets, order)
        assert self.batching.rows_per_batch is not None
        row_key = np.repeat(np.arange(len(order), dtype=np.int64), np.diff(new_offsets))  # (E,) row of each entry
        batch_offsets = new_offsets[:: self.batching.rows_per_batch]
        if batch_offsets[-1] != new_offsets[-1]:
            batch_offsets = np.append(batch_offsets, new_offsets[-1])
        return ids, batch_offsets.astype(np.int64), starts, row_key

    def plan(self, rank: int, *, target: int, counted: int, uneven: Uneven) -> MixedBatches:
        """One rank's ``target`` batches: interleaved, then equalised by ``uneven`` (:func:`~shardload.plan.length.rank_policy`).

        ``counted`` is the rank's count from :meth:`count_batches`, which the build must match.
        """
        ids, offsets, starts, row_key = self._build(rank)
        assert len(offsets) - 1 == counted, "count and build disagree"
        real = len(ids)
        ids, weights, offsets = equalize_batches(
            ids, offsets, target=target, uneven=uneven, filler_id=self._filler_id(ids)
        )
        if starts is None or row_key is None:
            return MixedBatches(ids, weights, offsets, None, None)
        kept = min(real, len(ids))  # real entries stay first and in order; filler (one per batch) follows
        filler = len(ids) - kept
        starts = np.concatenate([starts[:kept], np.zeros(filler, dtype=np.int64)])
        key = np.concatenate([row_key[:kept], np.zeros(filler, dtype=np.int64)])
        batch = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        rows = (key - key[offsets[:-1]][batch]).astype(np.int32)  # a split batch's rows start again at 0
        return MixedBatches(ids, weights, offsets, rows, starts)

    def _filler_id(self, ids: NDArray[np.int64]) -> int:
        """The rank's shortest sample, else the shortest of the whole mixture (0 if it is empty)."""
        if len(ids):
            return int(ids[np.argmin(self.mix.lengths_at(ids))])
        best: tuple[int, int] | None = None
        for k, source in enumerate(self.mix.sources):
            if source.num_samples:
                i = int(np.argmin(source.lengths))
                candidate = (int(source.lengths[i]), int(self.mix.offsets[k]) + i)
                best = candidate if best is None else min(best, candidate)
        return 0 if best is None else best[1]


def interleave(sizes: list[NDArray[np.int64]]) -> NDArray[np.int64]:
    """The order of every source's units on one rank: by each unit's middle as a fraction of its source.

    Unit ``j`` of source ``k``, after ``c`` of the source's ``t_k`` units and
    holding ``u`` of them, goes at ``(c + u / 2) / t_k``: a largest-deficit
    rule relative to each share, in one sort. Guarantee: after any prefix,
    source ``k`` has ``x_k`` of ``X`` units with ``|x_k - p_k X| <= (u_k +
    p_k * sum_j u_j) / 2`` (``p_k = t_k / sum_j t_j``, ``u_j`` the largest
    unit of source ``j``): about one unit. ``sizes``: one ``(n_k,)`` array
    per source, the tokens or samples of each unit, in the source's order
    (kept); returns ``(sum n_k,)`` indices into their concatenation.

    >>> interleave([np.array([1, 1, 1, 1]), np.array([2, 2])]).tolist()
    [0, 4, 1, 2, 5, 3]
    """
    keys, source, within = [], [], []
    for k, s in enumerate(sizes):
        total = int(s.sum())
        if total:
            keys.append((offsets_from_lengths(s)[:-1] + s / 2) / total)
        else:  # no units to share: spread its (empty) units evenly
            keys.append((np.arange(len(s)) + 0.5) / max(len(s), 1))
        source.append(np.full(len(s), k, dtype=np.int64))
        within.append(np.arange(len(s), dtype=np.int64))
    if not keys:
        return np.zeros(0, dtype=np.int64)
    order: NDArray[np.int64] = np.lexsort((np.concatenate(within), np.concatenate(source), np.concatenate(keys)))
    return order.astype(np.int64)
