"""Row tracking: the best-fit run of :mod:`~shardload.plan.packing.rows` followed row by row.

Counting needs only the rows each rank opens; building a rank or a group of
ranks (``PackBatcher``) needs the row of every item. :class:`TrackedBestFit`
runs the same steps as :class:`~shardload.plan.packing.rows.BestFit` and
follows the rows one by one, so the rows built are exactly the rows counted.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths, range_positions
from shardload.errors import PlanError
from shardload.plan.packing.rows import _EMPTY, BestFit, Placement, SizeRuns, Waiting, _run_starts

__all__ = ["TrackedBestFit", "TrackedRows", "largest_first", "pack_rows", "pack_segments", "track_runs"]


class TrackedBestFit(BestFit):
    """A :class:`~shardload.plan.packing.rows.BestFit` run that also follows every row one by one.

    Rows mirror the groups, as keys ``(segment, gap, row)`` (:meth:`_row_keys`):
    the active ones sorted, so that each active group's rows are a slice in row
    order. ``placed`` holds the ``(rows, items)`` each step placed.

    Raises:
        PlanError: when ``segments * (capacity + 1) * (items + 1)`` does not fit a row key (``2**63``).
    """

    def __init__(self, runs: SizeRuns, segments: int, capacity: int) -> None:
        super().__init__(runs, segments, capacity)
        self.num_rows = 0
        self.row_gap, self.row_seg = np.zeros(64, dtype=np.int64), np.zeros(64, dtype=np.int64)
        self.row_bound = int(self.r_count.sum()) + 1  # more than the rows the items can open
        if segments * self.width * self.row_bound >= 1 << 63:
            raise PlanError(
                f"packing {segments} segments of {self.row_bound - 1} items into rows of {capacity} tokens "
                "at once is past what the row keys hold; pack fewer segments at a time"
            )
        self.active_keys = _EMPTY
        self.pending_keys: list[NDArray[np.int64]] = []
        self.waiting_rows = Waiting()  # (1, k) blocks: row keys
        self.placed: list[tuple[NDArray[np.integer], NDArray[np.integer]]] = []
        #: the dtype of placements kept (row ids and item counts are below ``row_bound``): int32 when it fits
        self.pair_dtype = np.int32 if self.row_bound < 1 << 31 else np.int64

    def _wake(self, step: int) -> None:
        parts = self.waiting_rows.pop(step)
        if parts is not None:
            self.pending_keys.extend(part[0] for part in parts)
        super()._wake(step)

    def _follow(self, placed: Placement) -> None:
        """Follow the step row by row: which rows take how many items (only those rows and the new ones are touched)."""
        step, segs, full, per_row, part = placed.step, placed.segs, placed.full, placed.per_row, placed.part
        new_full, new_per_row, new_part = placed.new_full, placed.new_per_row, placed.new_part
        first = (np.cumsum(self.a_cnt) - self.a_cnt)[placed.touched]  # each touched group's first active row
        if self.pending_keys:  # a long sorted run and a few new keys: merged in about linear time
            self.active_keys = np.sort(np.concatenate([self.active_keys, *self.pending_keys]), kind="stable")
            self.pending_keys = []
        keys = self.active_keys
        some = part > 0
        takers = full + some  # the group's first rows take items
        at = range_positions(first, takers)  # (taking rows,) their places among the active rows
        items = np.repeat(per_row, takers)
        items[(np.cumsum(takers) - 1)[some]] = part[some]
        fresh = new_full + (new_part > 0)  # new rows: new_full of new_per_row items and one of new_part
        opened = self._new_rows(np.repeat(segs, fresh))
        new_items = np.repeat(new_per_row, fresh)
        new_items[(np.cumsum(fresh) - 1)[new_part > 0]] = new_part[new_part > 0]
        ids = np.concatenate([keys[at] % self.row_bound, np.arange(opened, opened + len(new_items))])
        counts = np.concatenate([items, new_items])
        by_seg = np.argsort(self.row_seg[ids], kind="stable")  # per segment: old rows, then new ones
        ids, counts = ids[by_seg], counts[by_seg]
        seg = self.row_seg[ids]
        self.row_gap[ids] -= counts * self.size_of[seg]
        self.placed.append((ids.astype(self.pair_dtype), counts.astype(self.pair_dtype)))
        # the rows that took items leave the active ones (all rows of a segment that is done)
        drop = np.zeros(len(keys), dtype=bool)
        drop[at] = True
        drop[self._segment_groups(keys, segs[step + 1 >= self.seg_steps[segs]], self.row_bound)] = True
        self.active_keys = keys[~drop]
        self._file_rows(step, ids)

    def _opened(self, segs: NDArray[np.int64], sizes: NDArray[np.int64], n: NDArray[np.int64]) -> None:
        first = self._new_rows(np.repeat(segs, n))
        ids = np.arange(first, self.num_rows)
        self.row_gap[ids] -= np.repeat(sizes, n)
        self.placed.append((ids.astype(self.pair_dtype), np.ones(len(ids), dtype=self.pair_dtype)))
        self._file_rows(0, ids)

    def _file_rows(self, step: int, ids: NDArray[np.int64]) -> None:
        """File rows that took items or are new: active again when a size of their segment fits their gap."""
        seg, gap = self.row_seg[ids], self.row_gap[ids]
        when = self._next_use(step, seg, gap)
        keep = when < self.seg_steps[seg]
        changed, when = self._row_keys(seg[keep], gap[keep], ids[keep]), when[keep]
        now = when == step + 1
        self.pending_keys.append(changed[now])
        self.waiting_rows.file(when[~now], changed[~now])

    def _row_keys(self, seg: NDArray[np.int64], gap: NDArray[np.int64], row: NDArray[np.int64]) -> NDArray[np.int64]:
        """``(n,)`` keys ordering rows by segment, gap, then row number (``key % row_bound`` is the row)."""
        return (seg * self.width + gap) * self.row_bound + row

    def _new_rows(self, seg: NDArray[np.int64]) -> int:
        """Number new empty rows of segments ``seg``; the first one's number."""
        first, self.num_rows = self.num_rows, self.num_rows + len(seg)
        if self.num_rows > len(self.row_gap):
            size = max(self.num_rows, 2 * len(self.row_gap))
            self.row_gap = np.resize(self.row_gap, size)
            self.row_seg = np.resize(self.row_seg, size)
        self.row_gap[first : self.num_rows] = self.capacity
        self.row_seg[first : self.num_rows] = seg
        return first


def _stable_order(key: NDArray[np.int64], bound: int) -> NDArray[np.int64]:
    """Indices that sort ``key`` (``0 <= key < bound``) stably: numpy's radix sort, 16 bits at a time."""
    if bound <= 1 << 16:
        return np.argsort(key.astype(np.uint16), kind="stable")
    if bound <= 1 << 32:
        order = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
        return order[np.argsort((key[order] >> 16).astype(np.uint16), kind="stable")]
    return np.argsort(key, kind="stable")


@dataclass(frozen=True)
class TrackedRows:
    """The rows of every segment from one tracked run, and what each step placed in them, segment by segment.

    Rows are numbered segment by segment, each segment's in the order they
    were opened (a segment of only empty items gets one, empty).

    Attributes:
        used: ``(rows,)`` tokens each row holds.
        row_seg: ``(rows,)`` segment of each row, non-decreasing.
        row_bounds: ``(K + 1,)`` each segment's first row.
        rows: ``(pairs,)`` the row of each placement, a segment's placements in step order...
        counts: ``(pairs,)`` ... and the items it placed (its items largest first, stably, fill them in turn).
        pair_bounds: ``(K + 1,)`` each segment's first placement.
    """

    used: NDArray[np.int64]
    row_seg: NDArray[np.int64]
    row_bounds: NDArray[np.int64]
    rows: NDArray[np.integer]
    counts: NDArray[np.integer]
    pair_bounds: NDArray[np.int64]

    def place(self, k: int, order: NDArray[np.int64], out: NDArray[np.int64]) -> None:
        """Write into ``out`` (``(m,)``) the row of each of segment ``k``'s ``m`` items.

        ``order``: ``(m,)`` the items largest first, stably (:func:`largest_first`); items of size 0 go
        to the segment's first row. Rows are numbered as in :attr:`used`.
        """
        lo, hi = int(self.pair_bounds[k]), int(self.pair_bounds[k + 1])
        placed = np.repeat(self.rows[lo:hi], self.counts[lo:hi])
        out[order[: len(placed)]] = placed
        out[order[len(placed) :]] = self.row_bounds[k]


def largest_first(sizes: NDArray[np.int64], capacity: int) -> NDArray[np.int64]:
    """``(m,)`` indices of ``sizes`` (``0..capacity``) largest first, stably: the order a segment's items are placed."""
    return _stable_order(capacity - sizes, capacity + 1)


def track_runs(runs: SizeRuns, segments: int, capacity: int) -> TrackedRows:
    """One :class:`TrackedBestFit` run over ``runs``: every segment's rows, each segment packed as if alone.

    Only the runs are needed, not the items: a segment's items, largest first,
    fill the placements in turn (:meth:`TrackedRows.place`).
    """
    fit = TrackedBestFit(runs, segments, capacity)
    rows = fit.run()
    # every segment's rows in the order they were opened; a segment of only empty items gets one
    opened = _stable_order(fit.row_seg[: fit.num_rows], segments)
    empty_only = np.flatnonzero(rows > np.bincount(fit.row_seg[: fit.num_rows], minlength=segments))
    row_seg = np.concatenate([fit.row_seg[opened], empty_only])
    used = np.concatenate([capacity - fit.row_gap[opened], np.zeros(len(empty_only), dtype=np.int64)])
    number = np.empty(fit.num_rows, dtype=np.int64)  # new number of each opened row
    if len(empty_only):
        by_seg = _stable_order(row_seg, segments)
        row_seg, used = row_seg[by_seg], used[by_seg]
        number[opened] = np.flatnonzero(by_seg < fit.num_rows)
    else:
        number[opened] = np.arange(fit.num_rows)
    # (row, items) the steps placed, segment by segment: a segment's steps in order place its runs in order
    ids = np.concatenate([ids for ids, _ in fit.placed]) if fit.placed else _EMPTY
    counts = np.concatenate([counts for _, counts in fit.placed]) if fit.placed else _EMPTY
    fit.placed = []
    pair_seg = fit.row_seg[ids]
    pairs = _stable_order(pair_seg, segments)
    pair_bounds = offsets_from_lengths(np.bincount(pair_seg, minlength=segments))
    del pair_seg
    ids = number[ids[pairs]].astype(fit.pair_dtype)
    row_bounds = offsets_from_lengths(np.bincount(row_seg, minlength=segments))
    return TrackedRows(used, row_seg, row_bounds, ids, counts[pairs], pair_bounds)


def pack_segments(
    sizes: NDArray[np.integer], seg: NDArray[np.integer], segments: int, capacity: int
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Pack the items of each segment into rows of at most ``capacity`` tokens, each segment as if alone.

    ``sizes`` and ``seg`` are ``(m,)``, ``0 <= size <= capacity``, ``0 <= seg < segments`` (any order).

    Returns:
        ``(row_of, used, row_seg)``: ``(m,)`` the row of each item, ``(rows,)``
        the tokens each row holds and ``(rows,)`` its segment; rows are
        numbered segment by segment, each segment's in the order they were
        opened, so a segment's rows and items are exactly :func:`pack_rows`'s
        of that segment alone.
    """
    sizes64: NDArray[np.int64] = np.asarray(sizes, dtype=np.int64)
    seg64: NDArray[np.int64] = np.asarray(seg, dtype=np.int64)
    if len(seg64) > 1 and not (seg64[1:] >= seg64[:-1]).all():  # items segment by segment, then back
        by_seg = _stable_order(seg64, segments)
        row_of, used, row_seg = pack_segments(sizes64[by_seg], seg64[by_seg], segments, capacity)
        back = np.empty_like(row_of)
        back[by_seg] = row_of
        return back, used, row_seg
    bounds = np.searchsorted(seg64, np.arange(segments + 1)).tolist()  # (K + 1,) each segment's first item
    order, runs = _runs_by_segment(sizes64, bounds, capacity)
    tracked = track_runs(runs, segments, capacity)
    row_of = np.empty(len(seg64), dtype=np.int64)
    for k in range(segments):  # in cache: a segment's items, its runs' rows
        lo, hi = bounds[k], bounds[k + 1]
        if hi > lo:
            tracked.place(k, order[lo:hi], row_of[lo:hi])
    return row_of, tracked.used, tracked.row_seg


def _runs_by_segment(sizes: NDArray[np.int64], bounds: list[int], capacity: int) -> tuple[NDArray[np.int64], SizeRuns]:
    """``(order, runs)``: each segment's items largest first (stably, ``(m,)`` indices within the segment) and
    its size runs; ``bounds``: ``(K + 1,)`` each segment's first item (items given segment by segment).
    """
    order = np.empty(len(sizes), dtype=np.int64)
    seg, size, count = [], [], []
    for k, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        if hi > lo:
            key = capacity - sizes[lo:hi]  # largest first
            mine = _stable_order(key, capacity + 1)  # largest_first
            order[lo:hi] = mine
            key = key[mine]
            starts = _run_starts(key)
            seg.append(np.full(len(starts), k, dtype=np.int64))
            size.append(capacity - key[starts])
            count.append(np.diff(starts, append=hi - lo))
    return order, SizeRuns.concat([SizeRuns(*parts) for parts in zip(seg, size, count)])


def pack_rows(sizes: NDArray[np.integer], capacity: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Pack items into rows of at most ``capacity`` tokens, best-fit decreasing (one segment of :func:`pack_segments`).

    Guarantees: no row holds more than ``capacity`` tokens; every item is in
    exactly one row; every row holds at least one item (items of size 0 go
    to the first row; only such items: one row); the result depends only on
    the sizes in their order, and its row count is :func:`count_rows`'s.

    Returns:
        ``(row_of, used)``: ``(m,)`` the row of each item and ``(rows,)`` the
        tokens each row holds.

    >>> row_of, used = pack_rows(np.array([6, 3, 5, 2, 4]), 10)
    >>> used.tolist(), sorted(row_of.tolist())
    ([10, 10], [0, 0, 1, 1, 1])
    """
    row_of, used, _ = pack_segments(sizes, np.zeros(len(sizes), dtype=np.int64), 1, capacity)
    return row_of, used
