"""Packed evaluation: rank ranges re-cut so that the ranks need near the same number of batches.

Ranks are cut at equal tokens (:func:`~shardload.plan.assign.balance_by_tokens`),
which balances packing only where every rank fills its rows alike. In natural
order they do not: a rank holding the pieces of long documents (last pieces
that leave gaps no other sample of the rank fits) packs more rows than a rank
of short documents with the same tokens, and every other rank then gets filler
batches to reach its count. :func:`balance_rows` moves the cuts by the rows
each rank actually packs; docs/planning.md ("Packing") has the figures.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths
from shardload.plan.assign import ShardLayout, cut_at_tokens, rank_tokens
from shardload.plan.packing.pack import PackBatcher, rows_at_once

__all__ = ["CUT_ROUNDS", "MAX_ROUNDS", "balance_rows"]

#: re-cuts at equal rows tried at most
CUT_ROUNDS = 3
#: re-cuts tried at most, single-sample moves included (each packs every rank once more)
MAX_ROUNDS = 12


def balance_rows(
    batcher: PackBatcher,
    shard_tokens: NDArray[np.int64],
    *,
    per: int | None = None,
    before: NDArray[np.int64] | None = None,
) -> tuple[PackBatcher, NDArray[np.int64]]:
    """The batcher of the same epoch order with rank ranges re-cut by packed rows, and ``(W,)`` each rank's rows.

    A rank's batches are ``ceil((before + rows) / per)``: ``per`` rows a batch
    (default the batcher's ``rows_per_batch``), after ``before`` ``(W,)`` rows
    of other sources of a mixture (default none). Guarantee: the ranges stay
    contiguous in epoch order (as with any cut), and the result is never
    worse than the cut at equal tokens: of the layouts tried, the one with
    the fewest batches on its largest rank, then the least filler on one
    rank, then in all (filler: a rank's batches below that count). A layout
    whose ranks' counts differ by at most one is kept as it is (every rank
    then gets at most one batch more than its packing needs). Otherwise the
    cuts move, one round at a time, until the counts differ by at most one or
    :data:`MAX_ROUNDS` rounds are spent: the first :data:`CUT_ROUNDS` cut
    again at equal *rows* (the rows of a range read as spread evenly over its
    tokens, interpolated at the old cuts); the later ones move single
    samples: each rank two batches or more below the largest count takes one
    from the nearest rank of that count, the ranks between passing one along.
    Cost: one count of every rank's rows per round. ``shard_tokens``:
    ``(S,)`` tokens of each shard, natural order.
    """
    per = batcher.rows_per_batch if per is None else per
    base = np.zeros(batcher.layout.world_size, dtype=np.int64) if before is None else before
    rows = rows_at_once([batcher])[0]  # (W,)
    best, best_rows = batcher, rows
    for round_ in range(MAX_ROUNDS):
        counts = -(-(base + rows) // per)
        if int(counts.max()) - int(counts.min()) <= 1:
            break
        if round_ < CUT_ROUNDS:
            layout = _cut_at_rows(batcher.layout, rows, base, batcher.lengths, shard_tokens)
        else:
            layout = _move_samples(batcher.layout, counts)
        if np.array_equal(layout.rank_starts, batcher.layout.rank_starts):
            if round_ >= CUT_ROUNDS:
                break
            continue
        batcher = batcher.relaid(layout)
        rows = rows_at_once([batcher])[0]
        if _cost(base + rows, per) < _cost(base + best_rows, per):
            best, best_rows = batcher, rows
    return best, best_rows


def _cost(rows: NDArray[np.int64], per: int) -> tuple[int, int, int]:
    """``(largest count, largest filler, filler)`` of ranks packing ``rows``, ``per`` rows a batch: smaller is better."""
    counts = -(-rows // per)
    top = int(counts.max())
    return top, top - int(counts.min()), int((top - counts).sum())


def _cut_at_rows(
    layout: ShardLayout,
    rows: NDArray[np.integer],
    before: NDArray[np.int64],
    lengths: NDArray[np.integer],
    shard_tokens: NDArray[np.int64],
) -> ShardLayout:
    """``layout``'s epoch order cut where the rows, spread evenly over each old range's tokens, give every rank
    the same rows with ``before`` (as near as rows can: a rank already over gets none).

    ``rows``: ``(W,)`` the rows each of ``layout``'s ranks packs; ``before``: ``(W,)`` rows they hold already.
    """
    at_tokens = offsets_from_lengths(rank_tokens(layout, lengths, shard_tokens)).astype(np.float64)  # (W + 1,)
    at_rows = offsets_from_lengths(np.asarray(rows, dtype=np.int64)).astype(np.float64)  # (W + 1,)
    total = at_rows[-1]
    share = np.maximum((total + before.sum()) / len(before) - before, 0.0)  # (W,) rows each rank should get
    want = np.cumsum(share * (total / share.sum()))[:-1] if share.sum() > 0 else np.zeros(len(before) - 1)
    # rows -> tokens, piecewise linear through the old cuts (a rank of no rows adds no point)
    at_rows, first = np.unique(at_rows, return_index=True)
    targets = np.rint(np.interp(want, at_rows, at_tokens[first])).astype(np.int64)
    return cut_at_tokens(layout, lengths, shard_tokens, np.maximum.accumulate(targets), nearest=True)


def _move_samples(layout: ShardLayout, counts: NDArray[np.int64]) -> ShardLayout:
    """``layout`` with every rank two or more batches below the largest count given one sample from the nearest
    rank of the largest count: each range between them passes one sample along (their cuts move by one).

    ``counts``: ``(W,)`` each rank's batches. With ``N >= W`` every rank keeps a sample.
    """
    world, total = len(counts), layout.num_samples
    top = int(counts.max())
    ranks = np.arange(world)
    # (W,) the nearest rank of the largest count before / after each rank (-1, W: none)
    before = np.maximum.accumulate(np.where(counts == top, ranks, -1))
    after = np.minimum.accumulate(np.where(counts == top, ranks, world)[::-1])[::-1]
    short = np.flatnonzero(counts <= top - 2)
    from_left = (before[short] >= 0) & ((after[short] == world) | (short - before[short] <= after[short] - short))
    # (W + 2,) differences of the cut moves: from the left, cuts before[r] + 1 .. r move one sample left
    moves = np.zeros(world + 2, dtype=np.int64)
    left, right = short[from_left], short[~from_left]
    np.add.at(moves, before[left] + 1, -1)
    np.add.at(moves, left + 1, 1)
    np.add.at(moves, right + 1, 1)  # from the right, cuts r + 1 .. after[r] move one sample right
    np.add.at(moves, after[right] + 1, -1)
    # a cut moves one sample at most: chains that overlap move it once (several at once overshoot)
    cuts = layout.rank_starts[1:-1] + np.clip(np.cumsum(moves)[1:world], -1, 1)  # (W - 1,)
    if total >= world:  # no empty rank, as for any cut (cut_at_tokens)
        inner = np.arange(1, world, dtype=np.int64)
        cuts = inner + np.maximum.accumulate(np.clip(cuts - inner, 0, total - world))
    else:
        cuts = np.maximum.accumulate(np.clip(cuts, 0, total))
    starts = np.concatenate([[0], cuts, [total]]).astype(np.int64)
    return ShardLayout(layout.shard_starts, layout.order, layout.epoch_starts, starts)
