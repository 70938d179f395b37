"""One rank's plan for one epoch: the entry point of the planner.

:func:`plan_rank` runs the stages of this package in order::

    PlanInputs + EpochSpec + Batching          (request.py: what, when, how)
       |  assign.shard_order / assign_shards   shards -> contiguous rank ranges
       |  assign.balance_by_tokens             ... cut at near-equal tokens (unless batch_size)
       |  packing.balance.balance_rows         packed evaluation: ... re-cut by the rows each rank packs
       v
    batcher.count_batches()                    every rank's batch count (cheap)
    batcher.build_batches(rank)                this rank's batches (materialised)
       |  length.epoch_steps                   training: the run's steps per epoch, the same every epoch
       |  equalize.equalize_batches            same count on every rank
       |  steps.order_steps                    training: heaviest first, at positions shared by every rank
       v
    RankPlan (+ fingerprint shared by all ranks)

No step communicates: every rank counts every rank and takes the same
target. :class:`EpochPlanner` keeps what all ranks share, so that planning
several ranks (reports, tests) does it once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

from shardload._base.checks import check_rank
from shardload._base.ranges import offsets_from_lengths
from shardload.errors import PlanError
from shardload.plan.assign import ShardLayout, assign_shards, balance_by_tokens, shard_order
from shardload.plan.batcher import Batcher
from shardload.plan.chunks import ChunkWindows, chunk_identity, resolve_chunk_windows
from shardload.plan.equalize import equalize_batches
from shardload.plan.length import (
    MAX_DRAWS,
    PROBE_EPOCHS,
    draw_seed,
    epoch_steps,
    epoch_steps_key,
    fits,
    natural_target,
    rank_policy,
    warn_unfit,
)
from shardload.plan.mix.batcher import MixBatcher
from shardload.plan.mix.inputs import MixInputs
from shardload.plan.options import Batching
from shardload.plan.packing.balance import balance_rows
from shardload.plan.packing.pack import BUILD_CHUNK, PackBatcher, RankRows, count_at_once
from shardload.plan.rankplan import RankPlan
from shardload.plan.request import EpochSpec, PlanInputs, check_request, memo_has
from shardload.plan.resume import Rest, ResumeInputs, rest_of
from shardload.plan.shuffle import permute_batches
from shardload.plan.steps import batch_costs, heaviest_first, order_steps
from shardload.plan.strategy import layout_key, make_batcher

__all__ = ["EpochPlanner", "RankPlan", "plan_rank"]

_FORMAT = "shardload.plan/2"  # bump when the same inputs would give a different plan


class EpochPlanner:
    """What all ranks share for one epoch: layout, counts, target, fingerprint.

    Args:
        inputs: One shard set, a mixture, or :class:`~shardload.plan.resume.ResumeInputs`: the rest
            of an epoch after segments on other world sizes (planned over the remainder, whose
            entries :attr:`rest` maps back to the base's sample ids and starts).
        steady: Training only: plan the epoch to the run's steps per epoch, the same in every epoch
            (:mod:`shardload.plan.length`). ``False``: the epoch's natural target (the probes of that
            module, and the replay of a resumed epoch's later segments, which were planned so).
            A resumed epoch's remainder (:class:`ResumeInputs`) always has its natural target.

    Raises:
        PlanError: If an argument is of the wrong type, or ``batching`` does
            not fit ``spec`` (``uneven="drop"`` in an evaluation stage).
    """

    def __init__(
        self,
        inputs: PlanInputs | MixInputs | ResumeInputs,
        spec: EpochSpec,
        batching: Batching,
        *,
        steady: bool = True,
    ) -> None:
        if not isinstance(inputs, (PlanInputs, MixInputs, ResumeInputs)):
            raise PlanError(
                f"inputs must be a shardload.plan.PlanInputs (or MixInputs), got {type(inputs).__name__}: "
                "use shard_set.plan_inputs() or PlanInputs(lengths, shard_sizes)"
            )
        check_request(spec, batching)
        #: a resumed epoch's remainder (a selection step before assignment, plan/resume.py); ``None`` otherwise
        self.rest: Rest | None = None
        self.steady = steady
        if isinstance(inputs, ResumeInputs) and not inputs.history:  # nothing ran yet: the whole epoch
            inputs = inputs.base
        if isinstance(inputs, ResumeInputs):
            self.rest = rest_of(inputs, spec, batching, EpochPlanner)
            inputs = self.rest.inputs
        self.inputs, self.spec, self.batching = inputs, spec, batching
        #: ``(S + 1,)`` shard offsets in the global id space (a mixture's sources one after another)
        self.shard_starts = offsets_from_lengths(inputs.shard_sizes)
        #: the draw of the epoch's shard and sample orders (:mod:`shardload.plan.length`; 0: the run's seed)
        self.draw = 0
        #: whether packed evaluation ranks were re-cut by the rows they pack (:meth:`_cut_by_rows`)
        self.cut_by_rows = False
        counts = self._lay_out(0)
        natural = natural_target(counts, batching.uneven)
        #: the batch count of every rank: training's steps per epoch (steady), else the natural target
        self.num_batches = natural
        if steady and spec.shuffled and self.rest is None:
            counts = self._hold_to_run_steps(counts, natural)
        # (W,) before equalisation; read-only, so that every rank's plan shares it (a copy each is O(W**2) memory)
        self.rank_batch_counts = counts.copy()
        self.rank_batch_counts.setflags(write=False)
        header = {
            "format": _FORMAT,
            "num_samples": inputs.num_samples,
            "num_shards": inputs.num_shards,
            "batching": batching.identity(),
            **spec.identity(),  # evaluation ignores seed, epoch and shard_assignment: same plan, same digest
            "lengths": inputs.digest,
            "num_batches": self.num_batches,
        }
        if isinstance(inputs, MixInputs):
            header["mixture"] = inputs.identity()
        if self.draw:  # only a redrawn epoch names its draw: other plans keep their digest
            header["draw"] = self.draw
        if self.cut_by_rows:  # only a plan whose ranks were re-cut says so: other plans keep their digest
            header["rank_cuts"] = "rows"
        windows = chunk_identity(self.chunks)
        if windows is not None:  # only a plan that uses chunk windows names them: other plans keep their digest
            header["chunk_windows"] = windows
        digest = hashlib.sha1(json.dumps(header, sort_keys=True).encode(), usedforsecurity=False)
        digest.update(inputs.shard_sizes.astype("<i8").tobytes())
        self.fingerprint = digest.hexdigest()

    def _hold_to_run_steps(self, counts: NDArray[np.int64], natural: int) -> NDArray[np.int64]:
        """Plan a training epoch to the run's steps per epoch (:mod:`shardload.plan.length`), drawing its orders
        again while its natural target does not fit; sets :attr:`num_batches` and returns the counts drawn."""
        inputs, spec, batching = self.inputs, self.spec, self.batching

        def natural_of(epoch: int) -> int:
            if epoch == spec.epoch:
                return natural
            return EpochPlanner(inputs, spec.at_epoch(epoch), batching, steady=False).num_batches

        steps = epoch_steps(spec, batching, natural_of, inputs.memo, margin=isinstance(inputs, MixInputs))
        while not fits(natural, steps, batching.uneven) and self.draw + 1 < MAX_DRAWS:
            counts = self._lay_out(self.draw + 1)
            natural = natural_target(counts, batching.uneven)
        if not fits(natural, steps, batching.uneven):  # every rank still reaches the run's steps
            warn_unfit(spec, natural, steps, int(np.maximum(counts - steps, 0).sum()))
        self.num_batches = steps
        return counts

    def _lay_out(self, draw: int) -> NDArray[np.int64]:
        """Lay out and count the epoch at ``draw``: ``(W,)`` every rank's natural batch count."""
        self.draw = draw
        self.cut_by_rows = False
        #: the seed of the shard and sample orders (the run's seed at draw 0)
        self.order_seed = draw_seed(self.spec.seed, draw)
        self.mix: MixBatcher | None = None
        #: the chunk windows of the set (of each source of a mixture; ``None``: a full shuffle)
        self.chunks: list[ChunkWindows | None] = []
        if isinstance(self.inputs, MixInputs):  # a selection step, then one batcher per source (plan/mix/batcher.py)
            self.mix = MixBatcher(self.inputs, self.spec, self.batching, order_seed=self.order_seed)
            self.chunks = self.mix.chunks
            self.cut_by_rows = self.mix.cut_by_rows
            return self.mix.count_batches()
        return self._single(self.inputs)

    def _single(self, inputs: PlanInputs) -> NDArray[np.int64]:
        """Lay out and count one shard set: sets :attr:`layout`, :attr:`batcher`, :attr:`lengths`."""
        self.lengths = inputs.lengths
        chunks = resolve_chunk_windows(self.batching, inputs.chunk_rows, shuffled=self.spec.shuffled)
        self.chunks = [chunks]
        self.batcher: Batcher = _batcher_of(inputs, self.spec, self.batching, self.order_seed, chunks)
        if isinstance(self.batcher, PackBatcher) and not self.spec.shuffled:
            self.batcher = self._cut_by_rows(inputs, self.batcher)
        self.layout = self.batcher.layout
        if (
            self.batching.packing
        ):  # counting packs every rank: kept with the inputs for the next epoch of the same layout
            if self.draw == 0 and self.spec.shuffled and self.steady and self.rest is None:
                _count_probes_at_once(inputs, self.spec, self.batching, self.batcher)
            return inputs.memo(_packed_key(self.batching, self.batcher), self.batcher.count_batches)
        return self.batcher.count_batches()

    def _cut_by_rows(self, inputs: PlanInputs, batcher: PackBatcher) -> PackBatcher:
        """Evaluation: the ranks re-cut by the rows they pack (:mod:`~shardload.plan.packing.balance`), the cuts
        and counts kept with the inputs for the next epoch (an evaluation layout never changes)."""

        def cut() -> NDArray[np.int64]:
            balanced, rows = balance_rows(batcher, inputs.shard_tokens)
            inputs.memo(_packed_key(self.batching, balanced), lambda: -(-rows // balanced.rows_per_batch))
            return balanced.layout.rank_starts.copy()

        layout = batcher.layout
        starts = inputs.memo(("packed row cuts", self.batching.identity(), layout_key(layout)), cut)
        if np.array_equal(starts, layout.rank_starts):
            return batcher
        self.cut_by_rows = True
        return batcher.relaid(ShardLayout(layout.shard_starts, layout.order, layout.epoch_starts, starts))

    def plans(self) -> Iterator[RankPlan]:
        """Every rank's plan, in rank order (packed ranks are packed a group at a time, in one run each)."""
        if self.mix is not None or not isinstance(self.batcher, PackBatcher):
            yield from (self.plan(rank) for rank in range(self.spec.world_size))
            return
        for rank, rows in self._packed_rows():
            yield self._plan(rank, rows)

    def consumed(self, batches: int) -> Iterator[tuple[NDArray[np.int64], NDArray[np.int64] | None]]:
        """Every rank's ``(sample_ids, starts)`` of the real entries of its first ``batches`` batches, in rank order.

        The entries of :meth:`plans` cut at ``batches`` (in another order when
        packed); ``starts`` is ``None`` unless packed.
        """
        if self.mix is not None or not isinstance(self.batcher, PackBatcher):
            for plan in self.plans():
                end = int(plan.batch_offsets[batches])
                real = plan.weights[:end] > 0
                yield plan.sample_ids[:end][real], None if plan.starts is None else plan.starts[:end][real]
            return
        for rank, rows in self._packed_rows():
            # a rank with more rows than counted would drop some in equalising: never, whatever the policy
            planned = -(-len(rows.used) // self.batcher.rows_per_batch)
            assert planned == self.rank_batch_counts[rank], "count and build disagree"
            ids, starts = self.batcher.consumed(rank, target=self.num_batches, batches=batches, packed=rows)
            yield (ids, starts) if self.rest is None else self.rest.globalise(ids, starts)

    def _packed_rows(self) -> Iterator[tuple[int, RankRows]]:
        """Every rank's packed rows, in rank order: from one tracked run of all ranks, or packed a group at a time."""
        batcher = self.batcher
        assert isinstance(batcher, PackBatcher)
        tracked = batcher.track_all()
        if tracked is None:
            for group in batcher.rank_groups(BUILD_CHUNK):
                yield from zip(group, batcher.pack_ranks(group))
            return
        for rank in range(self.spec.world_size):
            yield rank, batcher.rows_of(rank, tracked)

    def plan(self, rank: int) -> RankPlan:
        """The plan of one rank (``0 <= rank < world_size``)."""
        return self._plan(check_rank(rank, self.spec.world_size), None)

    def _plan(self, rank: int, packed_rows: RankRows | None) -> RankPlan:
        rows = starts = None
        if self.mix is not None:
            counted = int(self.rank_batch_counts[rank])
            uneven = rank_policy(counted, self.num_batches, self.batching.uneven)
            mixed = self.mix.plan(rank, target=self.num_batches, counted=counted, uneven=uneven)
            ids, weights, offsets = mixed.sample_ids, mixed.weights, mixed.batch_offsets
            rows, starts = mixed.rows, mixed.starts
        elif isinstance(self.batcher, PackBatcher):  # equalised at the row level by the batcher itself
            packed = self.batcher.build_packed(
                rank,
                target=self.num_batches,
                filler_id=self._filler_id(self.layout.rank_sample_ids(rank)),
                packed=packed_rows,
            )
            # a rank with more rows than counted would drop some in equalising: never, whatever the policy
            assert packed.planned == self.rank_batch_counts[rank], "count and build disagree"
            ids, weights, offsets = packed.sample_ids, packed.weights, packed.batch_offsets
            rows, starts = packed.rows, packed.starts
        else:
            ids, weights, offsets = self._equalized(rank)
        if self.rest is not None:  # a resumed epoch: the remainder's entries -> the base's samples
            ids, starts = self.rest.globalise(ids, starts)
        return RankPlan(
            rank=rank,
            spec=self.spec,
            sample_ids=ids,
            weights=weights,
            batch_offsets=offsets,
            rank_batch_counts=self.rank_batch_counts,
            fingerprint=self.fingerprint,
            rows=rows,
            starts=starts,
        )

    def _equalized(self, rank: int) -> tuple[NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]:
        """One rank's batches (not packed, not mixed), equalised; in training put in their steps (plan/steps.py)."""
        spec, multiple = self.spec, self.batching.pad_to_multiple_of
        ids, offsets = self.batcher.build_batches(rank)
        assert len(offsets) - 1 == self.rank_batch_counts[rank], "count and build disagree"
        uneven = rank_policy(len(offsets) - 1, self.num_batches, self.batching.uneven)
        if not spec.shuffled or self.batcher.chunks is not None:
            # Evaluation: no step waits on another rank's. Chunk windows (plan/chunks.py): a rank's batches must
            # stay in window order so that each chunk is decoded about once. Both keep the batcher's order;
            # every other training plan is put in balanced steps.
            return equalize_batches(
                ids, offsets, target=self.num_batches, uneven=uneven, filler_id=self._filler_id(ids)
            )
        lens = np.asarray(self.lengths[ids], dtype=np.int64)  # (n,) read once: the rows keep their lengths below
        if uneven == "split":  # of the batches with the most rows, the heaviest are split first
            rows, offsets = permute_batches(
                np.arange(len(ids), dtype=np.int64), offsets, heaviest_first(batch_costs(lens, offsets, multiple))
            )
            ids, lens = ids[rows], lens[rows]
        filler = self._filler_id(ids, lens)
        ids, weights, offsets = equalize_batches(ids, offsets, target=self.num_batches, uneven=uneven, filler_id=filler)
        kept = min(len(lens), len(ids))  # equalising keeps a prefix of the rows and appends filler rows
        if len(ids) > kept:
            lens = np.concatenate([lens[:kept], np.full(len(ids) - kept, self.lengths[filler], dtype=np.int64)])
        else:
            lens = lens[:kept]
        return order_steps(ids, weights, offsets, lens, multiple=multiple, seed=self.order_seed, epoch=spec.epoch)

    def _filler_id(self, ids: NDArray[np.int64], lens: NDArray[np.int64] | None = None) -> int:
        """Filler sample: the rank's shortest (``lens``: their lengths, when already read), else the globally shortest.

        A rank can only be empty when ``N < world_size``, so the global search is over a tiny index.
        """
        if len(ids):
            return int(ids[np.argmin(self.lengths[ids] if lens is None else lens)])
        if self.layout.num_samples:
            return int(np.argmin(self.lengths))
        return 0


def _batcher_of(
    inputs: PlanInputs, spec: EpochSpec, batching: Batching, order_seed: int, chunks: ChunkWindows | None
) -> Batcher:
    """The batcher of one shard set's epoch laid out from ``order_seed`` (its layout: ``batcher.layout``)."""
    order = shard_order(
        inputs.num_shards,
        seed=order_seed,
        epoch=spec.epoch,
        shuffle=spec.shuffled and spec.shard_assignment == "rotate",
    )
    layout = assign_shards(inputs.shard_sizes, spec.world_size, order=order)
    # a rank's batch count and work follow what its batches are cut by: with max_tokens and packing its
    # tokens, so the ranges are cut by tokens; with batch_size its samples (equal counts, no splits)
    if batching.batch_size is None:
        layout = balance_by_tokens(layout, inputs.lengths, inputs.shard_tokens)
    return make_batcher(
        batching,
        lengths=inputs.lengths,
        layout=layout,
        shuffle=spec.shuffled,
        seed=order_seed,
        epoch=spec.epoch,
        max_length=inputs.max_length,
        chunks=chunks,
    )


def _packed_key(batching: Batching, batcher: Batcher) -> tuple[str, object, str]:
    """The memo key of an epoch's packed batch counts (:meth:`PlanInputs.memo`): the same for the same layout."""
    return ("packed counts", batching.identity(), layout_key(batcher.layout))


def _count_probes_at_once(inputs: PlanInputs, spec: EpochSpec, batching: Batching, batcher: Batcher) -> None:
    """Count the packed batches of a training epoch and of the probe epochs that fix the run's steps
    (:func:`~shardload.plan.length.epoch_steps`) in one best-fit run, and keep each with the inputs.

    The counts are those each epoch's own count gives (every rank is packed as if alone,
    :func:`~shardload.plan.packing.pack.count_at_once`); one run pays the steps once instead of once an
    epoch. Nothing is done when the run's steps are already known (then only this epoch is counted).
    """
    if memo_has(inputs, epoch_steps_key(spec, batching, PROBE_EPOCHS)):
        return
    probes = [epoch for epoch in range(PROBE_EPOCHS) if epoch != spec.epoch]
    batchers = [batcher] + [_batcher_of(inputs, spec.at_epoch(e), batching, spec.seed, batcher.chunks) for e in probes]
    todo = {_packed_key(batching, b): b for b in batchers if not memo_has(inputs, _packed_key(batching, b))}
    packers = [b for b in todo.values() if isinstance(b, PackBatcher)]
    if len(packers) < 2:  # this epoch (and probes already counted): counted alone
        return
    for key, counts in zip(todo, count_at_once(packers)):
        inputs.memo(key, counts.copy)  # this epoch first, as counting one epoch at a time


def plan_rank(
    inputs: PlanInputs | MixInputs | ResumeInputs, spec: EpochSpec, batching: Batching, *, rank: int
) -> RankPlan:
    """Plan one rank's batches for one epoch, without talking to other ranks.

    Guarantees (each tested):

    * every rank gets the same number of batches, for any ``N`` (also
      ``N < world_size`` and ``N == 0``) and any options;
    * evaluation stages yield every sample exactly once over all ranks
      (filler rows have weight 0); ``uneven="split"`` does the same in
      training;
    * a rank reads a contiguous run of the epoch's shards (about ``S / W + 1``
      shards);
    * the plan is a pure function of the arguments.

    Cost: one vectorised pass over ``lengths`` (none for fixed ``batch_size``
    apart from the checks of :class:`PlanInputs`) plus ``O(n_r log n_r)`` for
    this rank's ``n_r`` samples; see docs/planning.md for figures.

    Args:
        inputs: The shard set's lengths and shard sizes
            (:meth:`shardload.ShardSet.plan_inputs`, or ``PlanInputs(lengths, shard_sizes)``), or a
            mixture's :class:`~shardload.plan.mix.inputs.MixInputs`.
        spec: The epoch to plan (world size, stage, seed, epoch, shard assignment).
        batching: How rows become batches.
        rank: This rank, ``0 <= rank < spec.world_size``.

    Returns:
        The rank's :class:`RankPlan`.

    Raises:
        PlanError: If an argument is invalid.

    >>> inputs = PlanInputs(np.array([5, 9, 3, 7, 2]), np.array([3, 2]))
    >>> plan = plan_rank(inputs, EpochSpec(world_size=2, stage="val"), Batching(batch_size=2), rank=1)
    >>> [ids.tolist() for ids, _ in plan], bool(len(plan) == plan.rank_batch_counts.max())
    ([[3, 2], [4]], True)
    """
    if isinstance(spec, EpochSpec):
        check_rank(rank, spec.world_size)  # fail before the pass over lengths
    return EpochPlanner(inputs, spec, batching).plan(rank)
