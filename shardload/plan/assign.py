"""Shards -> ranks: which contiguous range of samples each rank plans this epoch.

The epoch's shard order (seeded in training, natural otherwise) is laid end to
end and cut into ``world_size`` contiguous ranges, so a rank reads whole
shards plus at most two partial ones. Positions are *epoch positions*
(``0..N-1`` along the epoch's shard order) or *sample ids* (along the natural
shard order: the ids of the lengths index).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths, range_positions
from shardload.plan.shuffle import epoch_rng

__all__ = ["ShardLayout", "assign_shards", "balance_by_tokens", "cut_at_tokens", "rank_tokens", "shard_order"]


def shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> NDArray[np.int64]:
    """``(S,)`` shard ids in the order the epoch lays them end to end.

    With ``shuffle`` a permutation seeded by ``(seed, epoch)`` only, so that
    every rank computes the same one; else the natural order.
    """
    if not shuffle:
        return np.arange(num_shards, dtype=np.int64)
    return epoch_rng(seed, epoch).permutation(num_shards).astype(np.int64)


@dataclass(frozen=True)
class ShardLayout:
    """One epoch's placement of shards and rank ranges.

    Attributes:
        shard_starts: ``(S + 1,)`` offsets of shards along sample ids.
        order: ``(S,)`` shard ids in epoch order.
        epoch_starts: ``(S + 1,)`` offsets of ``order``'s shards along epoch
            positions.
        rank_starts: ``(W + 1,)`` offsets of rank ranges along epoch
            positions; rank ``r`` owns ``[rank_starts[r], rank_starts[r+1])``.
    """

    shard_starts: NDArray[np.int64]
    order: NDArray[np.int64]
    epoch_starts: NDArray[np.int64]
    rank_starts: NDArray[np.int64]

    @property
    def num_samples(self) -> int:
        """Total number of samples ``N``."""
        return int(self.shard_starts[-1])

    @property
    def world_size(self) -> int:
        """Number of ranks ``W``."""
        return len(self.rank_starts) - 1

    @property
    def rank_sizes(self) -> NDArray[np.int64]:
        """``(W,)`` number of samples each rank owns (max - min <= 1, unless cut by :func:`balance_by_tokens`)."""
        return np.diff(self.rank_starts)

    def rank_segments(self, rank: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(starts, sizes)``, each ``(k,)``: the runs of sample ids of a rank's range, in epoch order.

        One run per shard the rank touches, all non-empty.
        """
        lo, hi = int(self.rank_starts[rank]), int(self.rank_starts[rank + 1])
        if lo == hi:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        first = int(np.searchsorted(self.epoch_starts, lo, side="right")) - 1
        stop = int(np.searchsorted(self.epoch_starts, hi, side="left"))
        k = np.arange(first, stop)  # epoch indices of the overlapping shards
        seg_lo = np.maximum(self.epoch_starts[k], lo)  # (k,) epoch positions
        seg_hi = np.minimum(self.epoch_starts[k + 1], hi)
        keep = seg_hi > seg_lo
        k, seg_lo, seg_hi = k[keep], seg_lo[keep], seg_hi[keep]
        starts = self.shard_starts[self.order[k]] + (seg_lo - self.epoch_starts[k])
        return starts.astype(np.int64), (seg_hi - seg_lo).astype(np.int64)

    def rank_sample_ids(self, rank: int) -> NDArray[np.int64]:
        """``(n_r,)`` sample ids of a rank's range, in epoch order."""
        return range_positions(*self.rank_segments(rank))

    def rank_shards(self, rank: int) -> NDArray[np.int64]:
        """``(k,)`` ids of the (non-empty) shards a rank's range touches, in epoch order."""
        starts, _ = self.rank_segments(rank)
        return (np.searchsorted(self.shard_starts, starts, side="right") - 1).astype(np.int64)

    def epoch_sample_id(self, position: int) -> int:
        """The sample id at an epoch position (``0 <= position < N``)."""
        k = int(np.searchsorted(self.epoch_starts, position, side="right")) - 1
        return int(self.shard_starts[self.order[k]] + position - self.epoch_starts[k])

    def pieces(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """``(starts, sizes, ranks)``: all sample ids tiled into runs that each lie in one shard and one rank.

        Each ``(P,)`` with ``P <= S + W``, sorted by ``starts``; the runs tile
        ``[0, N)``, so every rank counts every rank's batches in one pass.
        """
        cuts = np.union1d(self.epoch_starts, self.rank_starts)  # (P + 1,) epoch positions
        lo, hi = cuts[:-1], cuts[1:]
        k = np.searchsorted(self.epoch_starts, lo, side="right") - 1  # (P,) epoch shard index
        ranks = np.searchsorted(self.rank_starts, lo, side="right") - 1  # (P,)
        starts = self.shard_starts[self.order[k]] + (lo - self.epoch_starts[k])
        by_id = np.argsort(starts, kind="stable")
        return (
            starts[by_id].astype(np.int64),
            (hi - lo)[by_id].astype(np.int64),
            ranks[by_id].astype(np.int64),
        )


def assign_shards(shard_sizes: NDArray[np.int64], world_size: int, *, order: NDArray[np.int64]) -> ShardLayout:
    """Cut the epoch's sample sequence into ``world_size`` contiguous ranges.

    Guarantee: rank range sizes differ by at most one (``floor`` or ``ceil``
    of ``N / world_size``), and each range is contiguous in epoch order, so a
    rank touches only the shards its range overlaps.

    ``shard_sizes`` is in natural order (zeros allowed), ``order`` is :func:`shard_order`'s.

    >>> layout = assign_shards(np.array([3, 3, 3]), 2, order=np.arange(3))
    >>> layout.rank_sizes.tolist(), layout.rank_sample_ids(1).tolist()
    ([4, 5], [4, 5, 6, 7, 8])
    """
    shard_starts = offsets_from_lengths(shard_sizes)
    epoch_starts = offsets_from_lengths(shard_sizes[order])
    total = int(shard_starts[-1])
    # floor(r * N / W): sizes are floor(N/W) or ceil(N/W); exact in int64 up to N*W < 2**63
    rank_starts = np.arange(world_size + 1, dtype=np.int64) * total // world_size
    return ShardLayout(shard_starts, np.asarray(order, dtype=np.int64), epoch_starts, rank_starts)


def balance_by_tokens(
    layout: ShardLayout, lengths: NDArray[np.integer], shard_tokens: NDArray[np.int64]
) -> ShardLayout:
    """The same epoch order cut into rank ranges of near-equal *tokens* instead of samples.

    Guarantee: each range is contiguous in epoch order (locality is kept);
    rank ``r``'s range ends at the first sample where the epoch's running
    token count reaches ``(r + 1) * total / W``, so ranks differ by less than
    one sample's tokens, except that with ``N >= W`` every rank keeps at least
    one sample (a rank is never left empty by a few long samples). Used by
    packing, whose batch count follows a rank's tokens, not its samples.
    Cost: ``O(S + W)`` plus one cumulative sum per shard a cut falls in.
    ``shard_tokens`` is ``(S,)``, in natural order; only ``rank_starts`` change.

    >>> layout = assign_shards(np.array([4]), 2, order=np.arange(1))
    >>> balance_by_tokens(layout, np.array([9, 1, 1, 1]), np.array([12])).rank_starts.tolist()
    [0, 1, 4]
    >>> layout = assign_shards(np.array([2, 2]), 2, order=np.arange(2))
    >>> balance_by_tokens(layout, np.array([1, 1, 1, 1]), np.array([2, 2])).rank_starts.tolist()
    [0, 2, 4]
    """
    world = layout.world_size
    total = int(shard_tokens.sum())
    if total == 0 or world == 1:
        return layout
    targets = np.arange(1, world, dtype=np.int64) * total // world  # (W - 1,) token count each cut must reach
    return cut_at_tokens(layout, lengths, shard_tokens, targets)


def cut_at_tokens(
    layout: ShardLayout,
    lengths: NDArray[np.integer],
    shard_tokens: NDArray[np.int64],
    targets: NDArray[np.int64],
    *,
    nearest: bool = False,
) -> ShardLayout:
    """The same epoch order cut where the running token count reaches each of ``targets``.

    ``targets`` is ``(W - 1,)`` non-decreasing token counts; cut ``r`` ends
    rank ``r``'s range at the first sample where the epoch's running token
    count reaches ``targets[r]`` (a target of 0 cuts before the first sample),
    or with ``nearest`` before that sample when the count before it is nearer
    the target; with ``N >= W`` every rank keeps at least one sample. Cost:
    ``O(S + W)`` plus one cumulative sum per shard a cut falls in.
    ``shard_tokens`` is ``(S,)``, in natural order; only ``rank_starts`` change.
    """
    world, total_samples = layout.world_size, layout.num_samples
    epoch_tokens = offsets_from_lengths(shard_tokens[layout.order])  # (S + 1,) token offsets in epoch order
    # the epoch shard holding each cut: epoch_tokens[k] < target <= epoch_tokens[k + 1]
    shard_at = np.searchsorted(epoch_tokens, targets, side="left") - 1  # (W - 1,)
    cuts = np.zeros(world - 1, dtype=np.int64)  # a target of 0 tokens cuts before the first sample
    for k in np.unique(shard_at[shard_at >= 0]).tolist():
        mine = np.flatnonzero(shard_at == k)
        inside = np.cumsum(_shard_lengths(layout, lengths, k))  # (size,) running tokens
        want = targets[mine] - epoch_tokens[k]
        # the first sample whose running count reaches the target ends the range
        at = np.searchsorted(inside, want, side="left")
        if nearest:  # or the one before it, when the count there is nearer
            below = np.where(at > 0, inside[np.maximum(at - 1, 0)], 0)
            at -= (want - below < inside[at] - want).astype(np.int64)
        cuts[mine] = layout.epoch_starts[k] + at + 1
    rank_starts = np.concatenate([[0], cuts, [total_samples]]).astype(np.int64)
    if total_samples >= world:  # no empty rank: cut r lies in [r, N - W + r], cuts strictly increasing
        inner = np.arange(1, world, dtype=np.int64)
        kept = np.maximum.accumulate(np.clip(cuts - inner, 0, total_samples - world))
        rank_starts[1:-1] = inner + kept
    else:
        rank_starts = np.maximum.accumulate(rank_starts)
    return ShardLayout(layout.shard_starts, layout.order, layout.epoch_starts, rank_starts)


def rank_tokens(
    layout: ShardLayout, lengths: NDArray[np.integer], shard_tokens: NDArray[np.int64]
) -> NDArray[np.int64]:
    """``(W,)`` the tokens of each rank's range. Cost: one cumulative sum per shard a rank boundary falls inside."""
    epoch_tokens = offsets_from_lengths(shard_tokens[layout.order])  # (S + 1,)
    bounds = layout.rank_starts  # (W + 1,) epoch positions
    # the epoch shard each bound falls in (S at the end), past any empty shard that ends there
    k = np.searchsorted(layout.epoch_starts, bounds, side="right") - 1  # (W + 1,)
    before = epoch_tokens[k]  # (W + 1,) tokens before each bound, at shard granularity
    inside = bounds - layout.epoch_starts[k]  # samples of that shard before the bound
    for shard in np.unique(k[inside > 0]).tolist():
        mine = np.flatnonzero((k == shard) & (inside > 0))
        running = np.concatenate([[0], np.cumsum(_shard_lengths(layout, lengths, shard))])
        before[mine] += running[inside[mine]]
    return np.diff(before).astype(np.int64)


def _shard_lengths(layout: ShardLayout, lengths: NDArray[np.integer], k: int) -> NDArray[np.int64]:
    """``(size,)`` the lengths of the samples of the ``k``-th shard in epoch order, as int64."""
    first = int(layout.shard_starts[layout.order[k]])
    size = int(layout.epoch_starts[k + 1] - layout.epoch_starts[k])
    return np.asarray(lengths[first : first + size], dtype=np.int64)
