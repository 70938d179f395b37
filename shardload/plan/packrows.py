"""Row packing: items into rows of at most ``capacity`` tokens, many independent groups at once.

:func:`pack_segments` packs several segments (the ranks of an epoch) in one
set of vectorised passes; each segment is packed exactly as if it were packed
alone (:func:`pack_rows`), so one rank building its rows and every rank
counting all ranks' rows agree. The algorithm is first-fit decreasing by size
classes:

    items, largest first, in classes (c / r^(k+1), c / r^k]      r = CLASS_RATIO
       |  for each class: fill the gaps of existing rows, smallest gaps first (GAP_ROUNDS rounds)
       |                  then open new rows for what is left, fill gaps again, and stack
       |                  the last few into new rows (capacity // largest items each)
       v
    rows: every item whole in one row, no row over capacity

Each step lays the items and the windows (gaps or new rows) end to end and
puts an item in the window it falls in entirely (one ``searchsorted``); an
item that straddles two windows waits for the next round. Segments are kept
apart by spacing them out on that line. No per-item Python loop anywhere.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from shardload.plan.ranges import offsets_from_lengths

__all__ = ["CLASS_RATIO", "GAP_ROUNDS", "pack_rows", "pack_segments"]

#: growth of the size classes: 1.25 fills long-tailed rows to ~99%
CLASS_RATIO = 1.25
#: rounds of filling existing rows' gaps per size class before new rows are opened
GAP_ROUNDS = 6


def _stable_order(keys: NDArray[np.int64], limit: int) -> NDArray[np.int64]:
    """Indices sorting ``keys`` (``0 <= key < limit``) stably: a radix sort when they fit 16 bits."""
    if limit <= (1 << 16):
        return np.argsort(keys.astype(np.uint16), kind="stable")
    return np.argsort(keys, kind="stable")


def _segment_sums(values: NDArray[np.int64], seg: NDArray[np.int64], segments: int) -> NDArray[np.int64]:
    """``(segments,)`` exact integer sums of ``values`` per segment; ``seg`` is non-decreasing."""
    out = np.zeros(segments, dtype=np.int64)
    if len(values):
        starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
        out[seg[starts]] = np.add.reduceat(values, starts)
    return out


def _by_segment_then(
    key: NDArray[np.int64], key_limit: int, seg: NDArray[np.int64], segments: int
) -> NDArray[np.int64]:
    """Indices sorting by ``(seg, key)``, stably (two stable passes)."""
    first = _stable_order(key, key_limit)
    return first[_stable_order(seg[first], segments)]


class _Packer:
    """The state of one :func:`pack_segments` call: items sorted, rows grown in place."""

    def __init__(self, sizes: NDArray[np.int64], seg: NDArray[np.int64], segments: int, capacity: int) -> None:
        self.capacity, self.segments = capacity, segments
        self.order = _by_segment_then(capacity - sizes, capacity + 1, seg, segments)  # (m,) largest first per segment
        self.items = np.asarray(sizes, dtype=np.int64)[self.order]  # (m,)
        self.item_seg = np.asarray(seg, dtype=np.int64)[self.order]  # (m,)
        self.row_of = np.full(len(sizes), -1, dtype=np.int64)  # (m,) in sorted order
        self.used = np.zeros(0, dtype=np.int64)  # (rows,) tokens per row
        self.row_seg = np.zeros(0, dtype=np.int64)  # (rows,) segment of each row
        #: rows that may still take an item (gap >= the smallest item), in row order
        self.open = np.zeros(0, dtype=np.int64)
        positive = self.items[self.items > 0]
        self.smallest_item = int(positive.min()) if len(positive) else capacity + 1

    def windows(
        self, todo: NDArray[np.int64], caps: NDArray[np.int64], win_seg: NDArray[np.int64]
    ) -> NDArray[np.int64]:
        """``(len(todo),)`` the window each item lies in entirely, on the line of its own segment; else -1.

        ``todo`` and the windows are in segment order. Each segment gets a
        stretch of the line as long as the longer of its items and its
        windows, so an item never reaches another segment's window.
        """
        sizes, item_seg, k = self.items[todo], self.item_seg[todo], self.segments
        item_sum = _segment_sums(sizes, item_seg, k)  # (K,)
        cap_sum = _segment_sums(caps, win_seg, k)  # (K,)
        base = offsets_from_lengths(np.maximum(item_sum, cap_sum))[:-1]  # (K,) start of each segment's stretch
        ends = np.cumsum(sizes) - offsets_from_lengths(item_sum)[:-1][item_seg] + base[item_seg]  # (n,)
        cap_ends = np.cumsum(caps) - offsets_from_lengths(cap_sum)[:-1][win_seg] + base[win_seg]  # (k,)
        first = np.searchsorted(cap_ends, ends - sizes, side="right")  # window of the item's first token
        last = np.searchsorted(cap_ends, ends, side="left")  # window of its last token
        inside = (first == last) & (last < len(caps)) & (sizes > 0)
        inside[inside] &= win_seg[last[inside]] == item_seg[inside]
        return np.where(inside, last, -1)

    def fill(self, todo: NDArray[np.int64], caps: NDArray[np.int64], rows: NDArray[np.int64]) -> NDArray[np.int64]:
        """Put the items ``todo`` whole into the windows ``caps`` of ``rows``; return those left."""
        where = self.windows(todo, caps, self.row_seg[rows])
        hit = where >= 0
        target = rows[where[hit]]
        self.row_of[todo[hit]] = target
        np.add.at(self.used, target, self.items[todo[hit]])
        left: NDArray[np.int64] = todo[~hit]
        return left

    def fill_gaps(self, todo: NDArray[np.int64]) -> NDArray[np.int64]:
        """One round: the rows with room for the smallest item of their segment, smallest gaps first."""
        seg = self.item_seg[todo]
        last_of_run = np.r_[seg[1:] != seg[:-1], True]
        smallest = np.full(self.segments, self.capacity + 1, dtype=np.int64)
        smallest[seg[last_of_run]] = self.items[todo[last_of_run]]  # items are largest first in a segment
        gaps = self.capacity - self.used[self.open]
        fits = gaps >= smallest[self.row_seg[self.open]]
        rows, gaps = self.open[fits], gaps[fits]
        if len(rows) == 0:
            return todo
        order = _by_segment_then(gaps, self.capacity + 1, self.row_seg[rows], self.segments)
        return self.fill(todo, gaps[order], rows[order])

    def new_rows(self, per_segment: NDArray[np.int64]) -> NDArray[np.int64]:
        """``per_segment[s]`` new empty rows for each segment, in segment order; their indices."""
        rows = np.arange(len(self.used), len(self.used) + int(per_segment.sum()), dtype=np.int64)
        self.used = np.concatenate([self.used, np.zeros(len(rows), dtype=np.int64)])
        self.row_seg = np.concatenate([self.row_seg, np.repeat(np.arange(self.segments, dtype=np.int64), per_segment)])
        self.open = np.concatenate([self.open, rows])
        return rows

    def open_rows(self, todo: NDArray[np.int64]) -> NDArray[np.int64]:
        """New rows for the items ``todo``, as many per segment as its tokens need; return those left."""
        tokens = _segment_sums(self.items[todo], self.item_seg[todo], self.segments)
        rows = self.new_rows(-(-tokens // self.capacity))
        return self.fill(todo, np.full(len(rows), self.capacity, dtype=np.int64), rows)

    def stack_rows(self, todo: NDArray[np.int64]) -> None:
        """The items ``todo`` into new rows of ``q`` items each, ``q = capacity // the segment's largest``.

        Nothing straddles, so every item is placed in one step: what is left
        after :meth:`open_rows` (items that straddled two new rows; with sizes
        near the capacity, most of them) never opens rows round after round.
        """
        seg = self.item_seg[todo]
        first = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])  # (runs,) each segment's first item (its largest)
        count = np.diff(np.r_[first, len(todo)])  # (runs,)
        per_row = self.capacity // self.items[todo[first]]  # (runs,) >= 1: items of a segment are largest first
        index = np.arange(len(todo)) - np.repeat(first, count)  # (n,) position within its segment
        fresh = np.zeros(self.segments, dtype=np.int64)
        fresh[seg[first]] = -(-count // per_row)
        rows = self.new_rows(fresh)
        row_base = offsets_from_lengths(fresh)[:-1]  # (K,) first new row of each segment
        target = rows[row_base[seg] + index // np.repeat(per_row, count)]
        self.row_of[todo] = target
        np.add.at(self.used, target, self.items[todo])

    def run(self) -> None:
        bounds = [self.capacity]
        while bounds[-1] > 0:
            bounds.append(int(bounds[-1] / CLASS_RATIO))
        # class of each item: 0 for the largest sizes; stable, so each class stays in segment order
        klass = np.searchsorted(-np.asarray(bounds[1:]), -self.items, side="right")
        by_class = _stable_order(klass, len(bounds))
        class_starts = offsets_from_lengths(np.bincount(klass, minlength=len(bounds)))
        for c in range(len(bounds)):
            todo = by_class[class_starts[c] : class_starts[c + 1]]
            todo = todo[self.items[todo] > 0]
            for _ in range(GAP_ROUNDS):
                if len(todo) == 0 or len(self.used) == 0:
                    break
                before = len(todo)
                todo = self.fill_gaps(todo)
                if len(todo) == before:
                    break
            if len(todo):
                todo = self.open_rows(todo)
            if len(todo):
                todo = self.fill_gaps(todo)
            if len(todo):
                self.stack_rows(todo)
            # a row whose gap is below every item's size is full for good: later rounds skip it
            self.open = self.open[self.capacity - self.used[self.open] >= self.smallest_item]

    def result(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """``(row_of, used, row_seg)`` with the rows in use numbered by segment, in the items' input order.

        A window can be left empty between two items that straddled its
        ends: only rows that hold an item count. Items of size 0 go to their
        segment's first row (a segment of only such items gets one row).
        """
        placed = self.row_of >= 0
        holds = np.bincount(self.row_of[placed], minlength=len(self.used)) > 0
        zero_only = np.zeros(self.segments, dtype=bool)
        zero_only[self.item_seg[~placed]] = True
        zero_only[self.row_seg[holds]] = False
        keep = np.flatnonzero(holds)
        rows_seg = np.concatenate([self.row_seg[keep], np.flatnonzero(zero_only)])
        used = np.concatenate([self.used[keep], np.zeros(int(zero_only.sum()), dtype=np.int64)])
        old = np.concatenate([keep, np.full(int(zero_only.sum()), -1, dtype=np.int64)])
        order = _stable_order(rows_seg, self.segments)  # segment by segment, rows in the order they were made
        rows_seg, used, old = rows_seg[order], used[order], old[order]
        new_index = np.full(len(self.used), -1, dtype=np.int64)
        new_index[old[old >= 0]] = np.flatnonzero(old >= 0)
        seg_first_row = np.searchsorted(rows_seg, np.arange(self.segments), side="left")  # (K,)
        row_of = seg_first_row[self.item_seg]
        row_of[placed] = new_index[self.row_of[placed]]
        out = np.empty(len(row_of), dtype=np.int64)
        out[self.order] = row_of
        return out, used, rows_seg


def pack_segments(
    sizes: NDArray[np.integer], seg: NDArray[np.integer], segments: int, capacity: int
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Pack the items of each segment into rows of at most ``capacity`` tokens, segments apart.

    Args:
        sizes: ``(m,)`` item sizes, ``0 <= size <= capacity``.
        seg: ``(m,)`` segment of each item, ``0 <= seg < segments`` (any order).
        segments: Number of segments ``K``.
        capacity: Tokens per row, ``>= 1``.

    Returns:
        ``(row_of, used, row_seg)``: ``(m,)`` the row of each item, ``(rows,)``
        the tokens each row holds and ``(rows,)`` its segment; rows are
        numbered segment by segment.
    """
    packer = _Packer(np.asarray(sizes, dtype=np.int64), np.asarray(seg, dtype=np.int64), segments, capacity)
    packer.run()
    return packer.result()


def pack_rows(sizes: NDArray[np.integer], capacity: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Pack items into rows of at most ``capacity`` tokens (one segment of :func:`pack_segments`).

    Guarantees: no row holds more than ``capacity`` tokens; every item is in
    exactly one row; every row holds at least one item; the result depends
    only on the sizes in sorted order (equal sizes are interchangeable). On
    long-tailed lengths it fills rows to ~99% (docs/benchmarks.md).

    Returns:
        ``(row_of, used)``: ``(m,)`` the row of each item and ``(rows,)`` the
        tokens each row holds.

    >>> row_of, used = pack_rows(np.array([6, 3, 5, 2, 4]), 10)
    >>> used.tolist(), sorted(row_of.tolist())
    ([10, 10], [0, 0, 1, 1, 1])
    """
    row_of, used, _ = pack_segments(sizes, np.zeros(len(sizes), dtype=np.int64), 1, capacity)
    return row_of, used
