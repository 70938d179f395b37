"""Row packing: items into rows of at most ``capacity`` tokens, best-fit decreasing over size histograms.

Best-fit decreasing (BFD) takes the items largest first and puts each in the
row with the smallest gap it fits, opening a new row when none has room. Two
facts make it cheap on long-tailed lengths, where a rank holds ~100k items but
only a few thousand distinct sizes:

* items of equal size are interchangeable, and for ``n`` items of size ``s``
  BFD fills the rows with the smallest gaps ``g >= s`` first, ``g // s`` items
  each (after the first item a row's gap is still the smallest that fits), so
  one step per distinct size places them all;
* rows of equal gap are interchangeable too, so the rows of a segment are
  kept as groups ``(gap, count)``, not one by one.

One :class:`BestFit` run packs many segments (the ranks of an epoch) at once,
one vectorised step per distinct size, each segment as if it were alone::

    sizes of every segment  --size_runs-->  (segment, size, count), largest size first
       |  per size s (one step, all segments):
       |    wake the groups whose gap is now >= s (parked until then, by gap)
       |    each segment: its groups with gap >= s, smallest gap first, take g // s items a row
       |    what is left opens new rows of capacity // s items
       v
    rows per segment (counting), or, with rows tracked one by one, the row of every item (building)

Counting every rank and building one rank run the same steps, so they agree
exactly (tests/plan/test_pack.py). On the planner's long-tailed lengths BFD
fills rows to within 0.01% of the ``ceil(tokens / capacity)`` lower bound.
The work is one step per distinct size (at most ``capacity``), plus the
groups each step touches: a few per segment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["BestFit", "SizeRuns", "count_rows", "pack_rows", "pack_segments"]

_EMPTY = np.zeros(0, dtype=np.int64)
_TRUE = np.ones(1, dtype=bool)


def _run_starts(*keys: NDArray[np.int64]) -> NDArray[np.int64]:
    """Indices where a run of equal ``keys`` (compared together) starts; ``keys`` non-empty."""
    change = keys[0][1:] != keys[0][:-1]
    for key in keys[1:]:
        change |= key[1:] != key[:-1]
    return np.flatnonzero(np.concatenate([_TRUE, change]))


#: bins of a dense histogram built with one bincount (beyond: a sort of the items)
_DENSE_BINS = 1 << 24


@dataclass(frozen=True)
class SizeRuns:
    """Items as ``(segment, size, count)`` runs, largest size first, then by segment.

    Attributes:
        seg: ``(n,)`` segment of each run.
        size: ``(n,)`` item size, ``0 <= size <= capacity``, non-increasing.
        count: ``(n,)`` items of that size in that segment, ``>= 1``.
    """

    seg: NDArray[np.int64]
    size: NDArray[np.int64]
    count: NDArray[np.int64]

    @classmethod
    def of(
        cls,
        sizes: NDArray[np.integer],
        seg: NDArray[np.integer],
        segments: int,
        capacity: int,
        *,
        counts: NDArray[np.integer] | None = None,
    ) -> SizeRuns:
        """The runs of items ``sizes`` in segments ``seg`` (``0 <= seg < segments``, any order).

        ``counts``: ``(m,)`` how many items each entry stands for (default: one each).
        """
        sizes = np.asarray(sizes, dtype=np.int64)
        key = (capacity - sizes) * segments + np.asarray(seg, dtype=np.int64)  # size descending, then segment
        bins = segments * (capacity + 1)
        if bins <= max(_DENSE_BINS, 4 * len(key)):
            hist = np.bincount(key, weights=counts, minlength=bins).astype(np.int64)
            runs = np.flatnonzero(hist)
            count = hist[runs]
        else:
            runs, inverse = np.unique(key, return_inverse=True)
            count = np.bincount(inverse, weights=counts, minlength=len(runs)).astype(np.int64)
            runs, count = runs[count > 0], count[count > 0]
        return cls(runs % segments, capacity - runs // segments, count)

    @classmethod
    def of_lengths(
        cls, lengths: NDArray[np.integer], seg: NDArray[np.integer], segments: int, capacity: int
    ) -> SizeRuns:
        """The runs of the pieces of samples cut into rows of ``capacity`` tokens.

        A sample of ``n >= 1`` tokens is ``ceil(n / capacity) - 1`` full pieces
        and a last one of the rest (``1..capacity`` tokens); a sample of length 0
        is one empty piece. Without cutting (every length ``<= capacity``) each
        sample is one piece, as ``PackBatcher`` makes them.
        """
        lengths = np.asarray(lengths)
        seg = np.asarray(seg, dtype=np.int64)
        full = np.maximum(lengths - 1, 0) // capacity  # (m,) full pieces before the last
        last = lengths - full * capacity  # (m,) 0..capacity
        key = seg - last.astype(np.int64) * segments  # + capacity * segments: size descending, then segment
        key += capacity * segments
        bins = segments * (capacity + 1)
        if bins <= max(_DENSE_BINS, 4 * len(key)):
            hist = np.bincount(key, minlength=bins)
            long = np.flatnonzero(full)
            if len(long):
                hist[:segments] += np.bincount(seg[long], weights=full[long], minlength=segments).astype(np.int64)
            runs = np.flatnonzero(hist)
            return cls(runs % segments, capacity - runs // segments, hist[runs])
        sizes = np.concatenate([last, np.full(int(np.count_nonzero(full)), capacity)])
        cut = np.flatnonzero(full)
        counts = np.concatenate([np.ones(len(seg), dtype=np.int64), full[cut]])
        return cls.of(sizes, np.concatenate([seg, seg[cut]]), segments, capacity, counts=counts)

    @classmethod
    def concat(cls, parts: list[SizeRuns]) -> SizeRuns:
        """Runs of several disjoint groups of segments, in the runs' order again."""
        seg = np.concatenate([p.seg for p in parts]) if parts else _EMPTY
        size = np.concatenate([p.size for p in parts]) if parts else _EMPTY
        count = np.concatenate([p.count for p in parts]) if parts else _EMPTY
        order = np.lexsort((seg, -size))
        return cls(seg[order], size[order], count[order])


class BestFit:
    """One BFD run over the runs of many segments (see the module docstring).

    Rows are kept as groups of equal gap: *active* groups (gap at least the
    size being placed), sorted by ``(segment, gap)``, and *parked* ones (gap
    below it), filed by gap and woken when the sizes come down to their gap.

    Args:
        segments: Number of segments ``K``.
        capacity: Tokens per row, ``>= 1``.
        track_rows: Also follow every row one by one (one segment only), to
            give each item its row (:func:`pack_rows`).
    """

    def __init__(self, segments: int, capacity: int, *, track_rows: bool = False) -> None:
        self.segments, self.capacity = segments, capacity
        self.rows = np.zeros(segments, dtype=np.int64)  # (K,) rows opened
        self.parked: dict[int, list[tuple[NDArray[np.int64], NDArray[np.int64]]]] = {}
        self.a_seg, self.a_gap, self.a_cnt = _EMPTY, _EMPTY, _EMPTY
        self.need = np.zeros(segments, dtype=np.int64)  # (K,) items of the current size, scratch
        self.track = track_rows
        # tracking rows one by one, mirroring the groups: gap and segment of each row (grown by doubling),
        # the rows with gap >= the current size, the others filed by gap; (rows, items) placed at each step
        self.num_rows = 0
        self.row_gap, self.row_seg = np.zeros(64, dtype=np.int64), np.zeros(64, dtype=np.int64)
        self.active_rows = _EMPTY
        self.parked_rows: dict[int, list[NDArray[np.int64]]] = {}
        self.placed: list[tuple[NDArray[np.int64], NDArray[np.int64]]] = []

    def run(self, runs: SizeRuns) -> NDArray[np.int64]:
        """Place every run (largest size first); ``(K,)`` rows per segment (a segment of only empty items: 1)."""
        positive = runs.size > 0
        seg, size, count = runs.seg[positive], runs.size[positive], runs.count[positive]
        starts = _run_starts(size) if len(size) else _EMPTY
        ends = np.append(starts[1:], len(size))
        woken_below = self.capacity + 1
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            s = int(size[lo])
            self._wake(s, woken_below)
            woken_below = s
            self._step(s, seg[lo:hi], count[lo:hi])
        only_empty = np.zeros(self.segments, dtype=bool)
        only_empty[runs.seg[~positive]] = True
        return np.where(only_empty & (self.rows == 0), 1, self.rows)

    def _wake(self, s: int, below: int) -> None:
        """Make the parked groups with gaps in ``[s, below)`` active."""
        if self.track:
            rows = [part for g in range(s, below) for part in self.parked_rows.pop(g, ())]
            if rows:
                self.active_rows = np.concatenate([self.active_rows, *rows])
        woken = [(g, part) for g in range(s, below) for part in self.parked.pop(g, ())]
        if woken:
            self._set_active(
                np.concatenate([self.a_seg, *(p[0] for _, p in woken)]),
                np.concatenate([self.a_gap, *(np.full(len(p[0]), g, dtype=np.int64) for g, p in woken)]),
                np.concatenate([self.a_cnt, *(p[1] for _, p in woken)]),
            )

    def _set_active(self, seg: NDArray[np.int64], gap: NDArray[np.int64], cnt: NDArray[np.int64]) -> None:
        """Keep the non-empty groups, sorted by ``(segment, gap)``, equal ones merged."""
        keep = cnt > 0
        seg, gap, cnt = seg[keep], gap[keep], cnt[keep]
        if len(seg) > 1:
            order = np.lexsort((gap, seg))
            seg, gap, cnt = seg[order], gap[order], cnt[order]
            starts = _run_starts(seg, gap)
            if len(starts) < len(seg):
                seg, gap, cnt = seg[starts], gap[starts], np.add.reduceat(cnt, starts)
        self.a_seg, self.a_gap, self.a_cnt = seg, gap, cnt

    def _park(self, seg: NDArray[np.int64], gap: NDArray[np.int64], cnt: NDArray[np.int64]) -> None:
        """File groups whose gap is below the current size, by gap."""
        keep = cnt > 0
        seg, gap, cnt = seg[keep], gap[keep], cnt[keep]
        if len(gap) == 0:
            return
        if len(gap) > 1:
            order = np.argsort(gap, kind="stable")
            seg, gap, cnt = seg[order], gap[order], cnt[order]
        starts = _run_starts(gap).tolist()
        for lo, hi in zip(starts, [*starts[1:], len(gap)]):
            self.parked.setdefault(int(gap[lo]), []).append((seg[lo:hi], cnt[lo:hi]))

    def _step(self, s: int, segs: NDArray[np.int64], n: NDArray[np.int64]) -> None:
        """Place ``n[i]`` items of size ``s`` in segment ``segs[i]`` (``segs`` increasing)."""
        need = self.need
        need[segs] = n
        touched = np.flatnonzero(need[self.a_seg] > 0)  # groups of the segments with items of size s
        e_seg, e_gap, e_cnt = self.a_seg[touched], self.a_gap[touched], self.a_cnt[touched]
        per_row = e_gap // s  # >= 1: active gaps are >= s
        slots = e_cnt * per_row
        before = np.cumsum(slots) - slots  # slots of the segment's smaller gaps
        if len(e_seg) and self.segments > 1:
            first = _run_starts(e_seg)
            before -= np.repeat(before[first], np.diff(np.append(first, len(e_seg))))
        take = np.clip(need[e_seg] - before, 0, slots)  # items each group takes, smallest gaps first
        full = take // per_row  # rows that take per_row items
        part = take - full * per_row  # items of the one row that takes fewer (0: none)
        taken = np.zeros(self.segments, dtype=np.int64)
        np.add.at(taken, e_seg, take)
        left = n - taken[segs]
        new_per_row = self.capacity // s
        new_full = left // new_per_row
        new_part = left - new_full * new_per_row
        if self.track:
            self._track(s, segs, (e_seg, e_gap, full, per_row, part), (new_full, new_per_row, new_part))
        need[segs] = 0
        self.rows[segs] += new_full + (new_part > 0)
        a_cnt = self.a_cnt.copy()
        a_cnt[touched] = e_cnt - full - (part > 0)
        some, fresh = part > 0, new_part > 0
        self._set_active(  # the rows that took fewer items keep a gap >= s
            np.concatenate([self.a_seg, e_seg[some], segs[fresh]]),
            np.concatenate([self.a_gap, e_gap[some] - part[some] * s, self.capacity - new_part[fresh] * s]),
            np.concatenate([a_cnt, np.ones(int(some.sum()) + int(fresh.sum()), dtype=np.int64)]),
        )
        self._park(  # full rows: gap below s
            np.concatenate([e_seg, segs]),
            np.concatenate([e_gap - per_row * s, np.full(len(segs), self.capacity - new_per_row * s)]),
            np.concatenate([full, new_full]),
        )

    def _track(
        self,
        s: int,
        segs: NDArray[np.int64],
        groups: tuple[NDArray[np.int64], ...],
        new: tuple[NDArray[np.int64], int, NDArray[np.int64]],
    ) -> None:
        """Follow the step row by row: which rows take how many items of size ``s``.

        ``groups`` are the step's touched groups ``(seg, gap, full, per_row,
        part)``: in each, the first ``full`` rows (by row number) take
        ``per_row`` items and the next one ``part``; ``new`` is ``(full,
        per_row, part)`` of the new rows of each segment of ``segs``.
        """
        e_seg, e_gap, full, per_row, part = groups
        new_full, new_per_row, new_part = new
        width = self.capacity + 1
        act = self.active_rows
        mine = self.need[self.row_seg[act]] > 0
        fits, others = act[mine], act[~mine]
        fits = fits[np.lexsort((fits, self.row_gap[fits], self.row_seg[fits]))]  # by segment, gap, row
        key = self.row_seg[fits] * width + self.row_gap[fits]
        group = np.searchsorted(e_seg * width + e_gap, key)  # each row's group (groups are sorted the same way)
        index = np.arange(len(fits)) - np.searchsorted(key, key, side="left")  # its place in the group
        k = full[group]
        items = np.where(index < k, per_row[group], np.where(index == k, part[group], 0))
        # new rows: new_full rows of new_per_row items and one of new_part, per segment
        fresh = new_full + (new_part > 0)
        first = self._new_rows(np.repeat(segs, fresh))
        new_items = np.full(int(fresh.sum()), new_per_row, dtype=np.int64)
        new_items[(np.cumsum(fresh) - 1)[new_part > 0]] = new_part[new_part > 0]
        got = items > 0
        ids = np.concatenate([fits[got], np.arange(first, first + len(new_items))])
        counts = np.concatenate([items[got], new_items])
        by_seg = np.argsort(self.row_seg[ids], kind="stable")  # per segment: old rows, then new ones
        ids, counts = ids[by_seg], counts[by_seg]
        self.row_gap[ids] -= counts * s
        self.placed.append((ids, counts))
        changed = np.concatenate([fits, np.arange(first, first + len(new_items))])
        still = self.row_gap[changed] >= s
        self.active_rows = np.concatenate([others, changed[still]])
        done = changed[~still]
        if len(done):
            done = done[np.argsort(self.row_gap[done], kind="stable")]
            gaps = self.row_gap[done]
            starts = _run_starts(gaps).tolist()
            for lo, hi in zip(starts, [*starts[1:], len(done)]):
                self.parked_rows.setdefault(int(gaps[lo]), []).append(done[lo:hi])

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


def count_rows(runs: SizeRuns, segments: int, capacity: int) -> NDArray[np.int64]:
    """``(segments,)`` rows BFD packs each segment's items into, each segment as if alone.

    Args:
        runs: Every segment's items (:meth:`SizeRuns.of`), sizes ``<= capacity``.
        segments: Number of segments.
        capacity: Tokens per row, ``>= 1``.
    """
    return BestFit(segments, capacity).run(runs)


def pack_segments(
    sizes: NDArray[np.integer], seg: NDArray[np.integer], segments: int, capacity: int
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Pack the items of each segment into rows of at most ``capacity`` tokens, each segment as if alone.

    Args:
        sizes: ``(m,)`` item sizes, ``0 <= size <= capacity``.
        seg: ``(m,)`` segment of each item, ``0 <= seg < segments`` (any order).
        segments: Number of segments ``K``.
        capacity: Tokens per row, ``>= 1``.

    Returns:
        ``(row_of, used, row_seg)``: ``(m,)`` the row of each item, ``(rows,)``
        the tokens each row holds and ``(rows,)`` its segment; rows are
        numbered segment by segment, each segment's in the order they were
        opened, so a segment's rows and items are exactly :func:`pack_rows`'s
        of that segment alone.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    seg = np.asarray(seg, dtype=np.int64)
    fit = BestFit(segments, capacity, track_rows=True)
    rows = fit.run(SizeRuns.of(sizes, seg, segments, capacity))
    # every segment's rows in the order they were opened; a segment of only empty items gets one
    opened = np.argsort(fit.row_seg[: fit.num_rows], kind="stable")
    empty_only = np.flatnonzero(rows > np.bincount(fit.row_seg[: fit.num_rows], minlength=segments))
    row_seg = np.concatenate([fit.row_seg[opened], empty_only])
    used = np.concatenate([capacity - fit.row_gap[opened], np.zeros(len(empty_only), dtype=np.int64)])
    by_seg = np.argsort(row_seg, kind="stable")
    row_seg, used = row_seg[by_seg], used[by_seg]
    number = np.empty(fit.num_rows, dtype=np.int64)  # new number of each opened row
    number[opened] = np.flatnonzero(by_seg < fit.num_rows)
    # items largest first, then by segment: the order the steps place them
    order = np.lexsort((seg, -sizes))
    row_of = np.searchsorted(row_seg, seg)  # items of size 0: their segment's first row
    placed = [np.repeat(ids, counts) for ids, counts in fit.placed]
    if placed:
        row_of[order[: sum(len(p) for p in placed)]] = number[np.concatenate(placed)]
    return row_of, used, row_seg


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
