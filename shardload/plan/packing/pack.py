"""Packing: a rank's samples laid end to end in rows of ``pack_length`` tokens, ``rows_per_batch`` rows a batch.

The fourth batching strategy (docs/planning.md, "Packing"): a rank's samples
(``pack_split``: pieces of at most ``pack_length`` tokens) are packed best-fit
decreasing (:mod:`~shardload.plan.packing.rows`), the rows ranked heaviest
first, equalised into exactly ``target`` batches (:meth:`PackBatcher.build_packed`)
and placed at the step positions every rank shares
(:func:`~shardload.plan.steps.step_positions`). A rank's row count depends only
on the multiset of its sizes, so counting every rank and building one give the same rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths, range_positions
from shardload.errors import PlanError
from shardload.plan.assign import ShardLayout
from shardload.plan.batcher import Batcher, Batches
from shardload.plan.options import Batching
from shardload.plan.packing.rows import SizeRuns, count_rows, pieces_per_sample
from shardload.plan.packing.track import TrackedRows, largest_first, pack_segments, track_runs
from shardload.plan.steps import step_positions

__all__ = ["PackBatcher", "PackedBatches", "RankRows", "count_at_once", "refuse_long_samples", "rows_at_once"]

#: samples whose sizes are gathered at once when counting every rank (bounds the memory of counting)
COUNT_CHUNK = 1 << 22
#: histogram bins (ranks * (pack_length + 1)) gathered at once when counting
COUNT_BINS = 1 << 24
#: histogram bins of several epochs counted at once (:func:`count_at_once`; 8 bytes a bin)
JOINT_BINS = 1 << 26
#: samples whose ranks are packed in one best-fit run when building every rank (``EpochPlanner.plans``):
#: fewer, larger runs cost less per step (about 100 bytes a sample while packing)
BUILD_CHUNK = 1 << 24
#: most pieces ``pack_split`` may add to one rank beyond its samples (building a rank costs ~170 bytes an entry)
MAX_CUT_PIECES = 1 << 26


@dataclass(frozen=True)
class RankRows:
    """One rank's entries (documents) packed into rows, before the rows become batches.

    Attributes:
        ids: ``(E,)`` sample of each entry, in the rank's epoch order.
        starts: ``(E,)`` first token of the sample each entry holds (0 unless it is a piece).
        row_of: ``(E,)`` row of each entry.
        used: ``(rows,)`` tokens each row holds.
        rng: The rank's generator after drawing its sample order (``None``: not shuffling).
    """

    ids: NDArray[np.int64]
    starts: NDArray[np.int64]
    row_of: NDArray[np.int64]
    used: NDArray[np.int64]
    rng: np.random.Generator | None


@dataclass(frozen=True)
class PackedBatches:
    """One rank's packed batches: entries (documents) in batch order.

    Attributes:
        sample_ids: ``(E,)`` the sample each entry holds (filler included).
        weights: ``(E,)`` 1.0 for a real entry, 0.0 for filler.
        batch_offsets: ``(num_batches + 1,)`` offsets of batches into the entries.
        rows: ``(E,)`` int32 row of each entry within its batch, non-decreasing in a batch.
        starts: ``(E,)`` first token of the sample the entry holds (0 unless it is a piece).
        planned: The rank's batch count before equalising (``ceil(rows / rows_per_batch)``).
    """

    sample_ids: NDArray[np.int64]
    weights: NDArray[np.float32]
    batch_offsets: NDArray[np.int64]
    rows: NDArray[np.int32]
    starts: NDArray[np.int64]
    planned: int


class PackBatcher(Batcher):
    """Packed rows, ``rows_per_batch`` a batch (see the module docstring)."""

    def _prepare(self) -> None:
        b = self.batching
        assert b.pack_length is not None and b.rows_per_batch is not None
        self.capacity, self.rows_per_batch = b.pack_length, b.rows_per_batch
        refuse_long_samples(self.lengths, self.max_length, b)

    def _pieces(
        self, ids: NDArray[np.int64], lens: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64] | None]:
        """``(ids, starts, sizes, pieces)`` of the entries: one per sample, or per piece of a long one.

        ``pieces`` is ``(n,)`` the entries of each sample, ``None`` when no sample is cut.
        """
        cap = self.capacity
        if not self.batching.pack_split or len(lens) == 0 or int(lens.max()) <= cap:
            return ids, np.zeros(len(ids), dtype=np.int64), lens, None
        pieces = pieces_per_sample(lens, cap)  # (n,) a sample of length 0 is one (empty) piece
        piece = range_positions(np.zeros(len(ids), dtype=np.int64), pieces)  # (E,) piece index within its sample
        starts = piece * cap
        return np.repeat(ids, pieces), starts, np.minimum(np.repeat(lens, pieces) - starts, cap), pieces

    def rank_groups(self, chunk: int = COUNT_CHUNK) -> Iterator[range]:
        """The ranks in groups of about ``chunk`` samples (at least one rank) and a bounded number of histogram bins."""
        world = self.layout.world_size
        rank_items = np.cumsum(self.layout.rank_sizes)  # (W,) samples of the ranks up to each one
        max_ranks = max(1, COUNT_BINS // (self.capacity + 1))
        rank = 0
        while rank < world:
            before = int(rank_items[rank - 1]) if rank else 0
            end = int(np.searchsorted(rank_items, before + chunk, side="right"))
            end = min(max(end, rank + 1), rank + max_ranks, world)
            yield range(rank, end)
            rank = end

    def relaid(self, layout: ShardLayout) -> PackBatcher:
        """The same batcher over other rank ranges of the same epoch order (:mod:`~shardload.plan.packing.balance`)."""
        return PackBatcher(
            self.lengths,
            layout,
            self.batching,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
            max_length=self.max_length,
            chunks=self.chunks,
        )

    def _count(self) -> NDArray[np.int64]:
        """Every rank's ``ceil(rows / rows_per_batch)``, from one best-fit run; equal to the built counts."""
        return count_at_once([self])[0]

    def _cuts(self) -> bool:
        """Whether ``pack_split`` cuts a sample of the set into pieces."""
        return bool(self.batching.pack_split) and self.max_length > self.capacity

    def _refuse_many_pieces(self, pieces: NDArray[np.integer] | NDArray[np.floating]) -> None:
        """Refuse a rank to which ``pack_split`` adds more than :data:`MAX_CUT_PIECES` pieces, naming the longest sample.

        ``pieces``: ``(W,)`` each rank's pieces. One sample of ``10**9`` tokens in rows of 8 would need ~20 GB
        to build.
        """
        extra = pieces - self.layout.rank_sizes
        if extra.max() <= MAX_CUT_PIECES:
            return
        sample = int(np.argmax(self.lengths))
        raise PlanError(
            f"sample {sample} has {self.max_length} tokens: pack_split would cut it into "
            f"{-(-self.max_length // self.capacity):,} pieces of pack_length={self.capacity} (rank "
            f"{int(np.argmax(extra))} would get {int(extra.max()):,} pieces more than samples, over the "
            f"{MAX_CUT_PIECES:,} a plan is built with); raise pack_length, or cut or drop such samples "
            "before preparing the set"
        )

    def size_runs(self) -> SizeRuns:
        """Every rank's pieces as size runs: one histogram of all ranks when it is small, else a group at a time."""
        if self.layout.world_size * (self.capacity + 1) <= COUNT_BINS:
            return self._size_runs_by_id()
        starts, sizes, ranks = self.layout.pieces()
        by_rank = np.lexsort((starts, ranks))
        starts, sizes, ranks = starts[by_rank], sizes[by_rank], ranks[by_rank]
        runs = []
        for group in self.rank_groups():
            lo, hi = np.searchsorted(ranks, [group.start, group.stop])
            ids = range_positions(starts[lo:hi], sizes[lo:hi])
            seg = np.repeat(ranks[lo:hi] - group.start, sizes[lo:hi])
            lens = np.asarray(self.lengths[ids], dtype=np.int64)  # any integer dtype: int64 before `length - 1`
            part = SizeRuns.of_lengths(lens, seg, len(group), self.capacity)
            runs.append(SizeRuns(part.seg + group.start, part.size, part.count))
        return SizeRuns.concat(runs)

    def _size_runs_by_id(self, chunk: int = COUNT_CHUNK) -> SizeRuns:
        """:meth:`size_runs` in one histogram of every rank, reading the lengths in id order, ``chunk`` at a time.

        A sample's bin is ``rank * (capacity + 1) + capacity - last`` (``last``: the
        size of its last piece, :meth:`SizeRuns.of_lengths`); the ranks of a run of
        ids come from the layout's pieces, so the lengths are read in contiguous
        slices and nothing is gathered or sorted per sample.
        """
        hist = np.zeros(self.layout.world_size * (self.capacity + 1), dtype=np.int64)
        self._histogram(hist, chunk)
        runs = np.flatnonzero(hist)
        width = self.capacity + 1
        return SizeRuns(runs // width, self.capacity - runs % width, hist[runs])

    def _histogram(self, hist: NDArray[np.int64], chunk: int = COUNT_CHUNK) -> None:
        """Add every rank's pieces to ``hist`` (``(W * (capacity + 1),)``): :meth:`_size_runs_by_id`'s bins."""
        cap, world = self.capacity, self.layout.world_size
        width = cap + 1
        starts, sizes, ranks = self.layout.pieces()  # sorted by id, tiling [0, N)
        ends = starts + sizes
        base = ranks * width + cap  # (P,) the bin of an empty last piece of each piece's rank
        full_pieces = np.zeros(world, dtype=np.int64)
        cut = self.batching.pack_split and self.max_length > cap
        total = self.layout.num_samples
        for lo in range(0, total, chunk):
            hi = min(lo + chunk, total)
            first, stop = np.searchsorted(ends, lo, side="right"), np.searchsorted(starts, hi, side="left")
            span = np.minimum(ends[first:stop], hi) - np.maximum(starts[first:stop], lo)
            key = np.repeat(base[first:stop], span)  # (hi - lo,)
            lens = np.asarray(self.lengths[lo:hi])
            if lens.dtype.kind != "i" and lens.dtype.itemsize >= 8:  # an unsigned 64-bit length: int64 first
                lens = lens.astype(np.int64)
            np.subtract(key, lens, out=key)
            if cut:  # a sample longer than a row: full pieces, and its last piece's bin
                long = np.flatnonzero(lens > cap)
                if len(long):
                    n = np.asarray(lens[long], dtype=np.int64)
                    full = (n - 1) // cap
                    key[long] += full * cap
                    full_pieces += np.bincount(key[long] // width, weights=full, minlength=world).astype(np.int64)
            hist += np.bincount(key, minlength=len(hist))
        hist[::width] += full_pieces  # full pieces: size capacity, each rank's first bin

    def pack_ranks(self, ranks: range) -> list[RankRows]:
        """The rows of several ranks, packed in one run (each exactly as :meth:`build_packed` packs it alone)."""
        orders = [self.rank_order(rank) for rank in ranks]
        pieces = [self._pieces(ids, lens) for ids, lens, _ in orders]
        seg = np.repeat(np.arange(len(ranks)), [len(p[2]) for p in pieces])
        sizes = np.concatenate([p[2] for p in pieces]) if pieces else np.zeros(0, dtype=np.int64)
        row_of, used, row_seg = pack_segments(sizes, seg, len(ranks), self.capacity)
        item_bounds = offsets_from_lengths(np.bincount(seg, minlength=len(ranks)))
        row_bounds = offsets_from_lengths(np.bincount(row_seg, minlength=len(ranks)))
        return [
            RankRows(
                ids=e_ids,
                starts=e_starts,
                row_of=row_of[item_bounds[k] : item_bounds[k + 1]] - row_bounds[k],
                used=used[row_bounds[k] : row_bounds[k + 1]],
                rng=rng,
            )
            for k, ((_, _, rng), (e_ids, e_starts, _, _)) in enumerate(zip(orders, pieces))
        ]

    def track_all(self) -> TrackedRows | None:
        """Every rank's rows from one tracked run over all ranks' size runs (:meth:`rows_of` gives a rank's items
        theirs): far fewer steps than packing the ranks a group at a time. ``None`` when the row keys of one
        run cannot hold every rank (:class:`~shardload.plan.packing.track.TrackedBestFit`): pack groups then."""
        runs = self.size_runs()
        world, width = self.layout.world_size, self.capacity + 1
        if world * width * (int(runs.count.sum()) + 1) >= 1 << 63:
            return None
        return track_runs(runs, world, self.capacity)

    def rows_of(self, rank: int, tracked: TrackedRows) -> RankRows:
        """One rank's rows, from :meth:`track_all`'s run: the same as :meth:`pack_ranks` packing it alone."""
        ids, lens, rng = self.rank_order(rank)
        e_ids, e_starts, sizes, _ = self._pieces(ids, lens)
        row_of = np.empty(len(sizes), dtype=np.int64)
        tracked.place(rank, largest_first(sizes, self.capacity), row_of)
        lo, hi = int(tracked.row_bounds[rank]), int(tracked.row_bounds[rank + 1])
        row_of -= lo
        return RankRows(ids=e_ids, starts=e_starts, row_of=row_of, used=tracked.used[lo:hi], rng=rng)

    def _cut(self, ids: NDArray[np.int64], lens: NDArray[np.int64]) -> Batches:
        raise AssertionError("packed batches are built by build_packed")  # pragma: no cover

    def build_batches(self, rank: int) -> Batches:
        """The rank's packed batches before equalising, as ``(sample_ids, offsets)``."""
        packed = self.build_packed(rank, target=None, filler_id=0)
        return packed.sample_ids, packed.batch_offsets

    def build_packed(
        self, rank: int, *, target: int | None, filler_id: int, packed: RankRows | None = None
    ) -> PackedBatches:
        """One rank's ``target`` packed batches (``None``: as many as its rows make, not equalised).

        Guarantees, whatever ``target`` is (``uneven``): no row holds more than
        ``pack_length`` tokens, no batch more than ``rows_per_batch`` rows or
        fewer than one; with ``"split"`` and ``"pad"`` every entry of the rank
        is in exactly one batch. A rank short of batches: ``"split"`` first
        spreads its rows, then moves documents of multi-document rows into rows
        of their own, and only when it has fewer documents than ``target``
        adds filler batches (one document, weight 0); ``"pad"`` adds filler
        batches at once; ``"drop"`` drops the lightest rows past
        ``target * rows_per_batch``. ``packed``: the rank's rows when already
        packed (:meth:`pack_ranks`).
        """
        if packed is None:
            packed = self.pack_ranks(range(rank, rank + 1))[0]
        e_ids, e_starts, row_of, used, rng = packed.ids, packed.starts, packed.row_of, packed.used, packed.rng
        rows = len(used)
        planned = -(-rows // self.rows_per_batch)
        if target is None:
            target = planned
        new_row = self._rank_rows(used, rng)
        e_row = new_row[row_of] if len(row_of) else row_of  # (E,)
        order = np.argsort(e_row, kind="stable")
        e_ids, e_starts, e_row = e_ids[order], e_starts[order], e_row[order]
        batch_of_row, e_row, real = self._equalize(e_row, rows, target)
        keep = batch_of_row[e_row] >= 0
        e_ids, e_starts, e_row = e_ids[keep], e_starts[keep], e_row[keep]
        e_batch = batch_of_row[e_row]
        filler = target - real  # filler batches, after the real ones
        e_batch = np.concatenate([e_batch, np.arange(real, target)])
        e_ids = np.concatenate([e_ids, np.full(filler, filler_id, dtype=np.int64)])
        e_starts = np.concatenate([e_starts, np.zeros(filler, dtype=np.int64)])
        e_row = np.concatenate([e_row, np.full(filler, -1, dtype=np.int64)])
        weights = np.concatenate([np.ones(len(e_ids) - filler, np.float32), np.zeros(filler, np.float32)])
        position = self._positions(target)
        order = np.lexsort((e_row, position[e_batch]))  # by batch position, then row
        e_ids, e_starts, e_row, weights = e_ids[order], e_starts[order], e_row[order], weights[order]
        e_batch = position[e_batch][order]
        sizes_per_batch = np.bincount(e_batch, minlength=target)
        offsets = offsets_from_lengths(sizes_per_batch)
        # row within its batch: rank of the entry's row among the batch's rows
        first_of_batch = offsets[:-1][e_batch]
        new_row_start = np.ones(len(e_row), dtype=bool)
        new_row_start[1:] = (e_row[1:] != e_row[:-1]) | (e_batch[1:] != e_batch[:-1])
        row_index = np.cumsum(new_row_start) - 1  # global row counter
        row_in_batch = row_index - row_index[first_of_batch] if len(e_row) else row_index
        return PackedBatches(e_ids, weights, offsets, row_in_batch.astype(np.int32), e_starts, planned)

    def _row_batches(self, rows: int, target: int) -> tuple[NDArray[np.int64], int] | None:
        """Rows (heaviest first) -> batches without cutting a row: ``(batch_of_row, real_batches)``, dropped rows -1.

        ``None`` when the rank must cut rows (``"split"``, fewer rows than ``target``: :meth:`_equalize`).
        """
        per = self.rows_per_batch
        have = -(-rows // per)
        if have >= target:  # equal, or "drop": the lightest rows past target batches go
            batch_of_row = np.arange(rows, dtype=np.int64) // per
            batch_of_row[batch_of_row >= target] = -1
            return batch_of_row, min(have, target)
        if self.batching.uneven == "pad":
            return np.arange(rows, dtype=np.int64) // per, have
        if rows < target:
            return None
        # spread the rows over `target` batches: sizes q or q + 1, heaviest batches first
        sizes = np.full(target, rows // target, dtype=np.int64)
        sizes[: rows % target] += 1
        return np.repeat(np.arange(target, dtype=np.int64), sizes), target

    def _rank_rows(self, used: NDArray[np.int64], rng: np.random.Generator | None) -> NDArray[np.int64]:
        """``(rows,)`` the place of each row, heaviest first; ties (mostly full rows) in random order when training."""
        rows = len(used)
        tie = rng.permutation(rows) if rng is not None else np.arange(rows)
        ranked = tie[np.argsort(-used[tie], kind="stable")]  # (rows,) old row at each new position
        new_row = np.empty(rows, dtype=np.int64)
        new_row[ranked] = np.arange(rows)
        return new_row

    def _positions(self, target: int) -> NDArray[np.int64]:
        """``(target,)`` the position in the epoch of each batch (heaviest first), as for every strategy."""
        return step_positions(target, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch)

    def consumed(
        self, rank: int, *, target: int, batches: int, packed: RankRows
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(ids, starts)`` of the real entries in the first ``batches`` batches of :meth:`build_packed`'s plan.

        The same entries as slicing the built plan, in another order, without
        sorting the rank's entries (a rank that must cut rows is built).
        """
        rows = len(packed.used)
        uncut = self._row_batches(rows, target)
        if uncut is None:
            built = self.build_packed(rank, target=target, filler_id=0, packed=packed)
            end = int(built.batch_offsets[batches])
            real = built.weights[:end] > 0
            return built.sample_ids[:end][real], built.starts[:end][real]
        batch_of_row = uncut[0][self._rank_rows(packed.used, packed.rng)]  # (rows,) by old row number
        position = np.append(self._positions(target), target)  # a dropped row (-1): never consumed
        taken = position[batch_of_row] < batches
        mine = taken[packed.row_of]
        return packed.ids[mine], packed.starts[mine]

    def _equalize(
        self, e_row: NDArray[np.int64], rows: int, target: int
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
        """Rows -> batches: ``(batch_of_row, e_row, real_batches)``; rows may be cut, dropped rows get -1.

        ``e_row`` comes back renumbered when rows are cut (a cut document gets a row of its own).
        """
        uncut = self._row_batches(rows, target)
        if uncut is not None:
            return uncut[0], e_row, uncut[1]
        # too few rows: cut documents off rows that hold several, each into a row of its own
        spare = np.bincount(e_row, minlength=rows) - 1  # (rows,) entries a row can give up
        budget = np.minimum(np.cumsum(spare), target - rows)
        take = np.diff(np.r_[0, budget])  # (rows,) entries each row gives up, first rows first
        moved = _position_from_end(e_row) < take[e_row]  # the last `take` entries of each row
        e_row = e_row.copy()
        e_row[moved] = rows + np.arange(int(moved.sum()))
        rows += int(moved.sum())  # <= target: one row per batch, filler batches for the rest
        return np.arange(rows, dtype=np.int64), e_row, rows


def count_at_once(batchers: list[PackBatcher]) -> list[NDArray[np.int64]]:
    """Each batcher's :meth:`~PackBatcher.count_batches`, from one best-fit run over the ranks of all.

    The batchers pack into rows of the same capacity (several epochs of one request); each rank of
    each is a segment of its own, packed as if alone, so the counts are those of counting each
    batcher alone, and the run's steps (one per distinct size) are paid once.
    """
    rows = rows_at_once(batchers)
    return [-(-r // b.rows_per_batch) for b, r in zip(batchers, rows)]


def rows_at_once(batchers: list[PackBatcher]) -> list[NDArray[np.int64]]:
    """``(W,)`` each rank's packed rows of each batcher, from one best-fit run (:func:`count_at_once`)."""
    if not batchers:
        return []
    capacity = batchers[0].capacity
    assert all(b.capacity == capacity for b in batchers)
    width = capacity + 1
    bounds = np.cumsum([0, *(b.layout.world_size for b in batchers)])
    segments = int(bounds[-1])
    if all(b.layout.world_size * width <= COUNT_BINS for b in batchers) and segments * width <= JOINT_BINS:
        # one histogram of the ranks of all (each batcher's a slice): no runs of each to concatenate
        hist = np.zeros(segments * width, dtype=np.int64)
        for batcher, lo, hi in zip(batchers, bounds[:-1], bounds[1:]):
            mine = hist[lo * width : hi * width]
            batcher._histogram(mine)
            if batcher._cuts():
                batcher._refuse_many_pieces(mine.reshape(-1, width).sum(axis=1))
        at = np.flatnonzero(hist)
        count = hist[at]
        del hist  # (in place below: the histogram and the runs' temporaries are not kept together)
        seg = at // width
        size = seg * width
        np.subtract(at, size, out=size)
        del at
        np.subtract(capacity, size, out=size)
        runs = SizeRuns(seg, size, count)
    else:
        parts = []
        for batcher, lo in zip(batchers, bounds[:-1].tolist()):
            part = batcher.size_runs()
            if batcher._cuts():
                batcher._refuse_many_pieces(
                    np.bincount(part.seg, weights=part.count, minlength=batcher.layout.world_size)
                )
            parts.append(SizeRuns(part.seg + lo, part.size, part.count) if lo else part)
        runs = SizeRuns.concat(parts) if len(parts) > 1 else parts[0]
    rows = count_rows(runs, segments, capacity)
    return [rows[lo:hi] for lo, hi in itertools.pairwise(bounds.tolist())]


def refuse_long_samples(lengths: NDArray[np.integer], max_length: int, batching: Batching) -> None:
    """Refuse a set with a sample longer than a row, unless ``pack_split`` cuts it (the one rule, for both callers).

    The planner applies it before packing; the loader when it is built, so the
    error comes where the options were written. ``max_length`` is
    ``lengths.max()`` (0 for an empty set).

    Raises:
        PlanError: naming the first such sample, its length and ``pack_length``.
    """
    cap = batching.pack_length
    assert cap is not None
    if not batching.pack_split and max_length > cap:
        sample = int(np.argmax(np.asarray(lengths) > cap))
        raise PlanError(
            f"sample {sample} has {int(lengths[sample])} tokens, more than pack_length={cap}: "
            "raise pack_length, or pass pack_split=True to cut samples longer than a row into row-sized "
            "pieces (each its own document)"
        )


def _position_from_end(e_row: NDArray[np.int64]) -> NDArray[np.int64]:
    """``(E,)`` for entries grouped by row: how many entries of the same row follow each one."""
    if len(e_row) == 0:
        return e_row
    starts = np.r_[True, e_row[1:] != e_row[:-1]]
    group = np.cumsum(starts) - 1
    ends = np.r_[np.flatnonzero(starts)[1:], len(e_row)]  # (groups,) exclusive end of each row's run
    out: NDArray[np.int64] = ends[group] - 1 - np.arange(len(e_row))
    return out
