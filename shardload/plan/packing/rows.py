"""Row packing: items into rows of at most ``capacity`` tokens, best-fit decreasing over size histograms.

One :class:`BestFit` run packs many segments (the ranks of an epoch), each as if alone, one step per
distinct size; the algorithm: docs/planning.md, "Batching" (**Packing**).

Guarantee: counting (:func:`count_rows`) and building (:mod:`~shardload.plan.packing.track`, the same
run following every row) take the same steps, so they agree exactly, and both are textbook BFD
(tests/plan/test_pack.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths, range_positions

__all__ = ["BestFit", "SizeRuns", "Waiting", "count_rows", "pieces_per_sample"]

_EMPTY = np.zeros(0, dtype=np.int64)
_TRUE = np.ones(1, dtype=bool)


def _run_starts(*keys: NDArray[np.int64]) -> NDArray[np.int64]:
    """Indices where a run of equal ``keys`` (compared together) starts; ``keys`` non-empty."""
    change = keys[0][1:] != keys[0][:-1]
    for key in keys[1:]:
        change |= key[1:] != key[:-1]
    return np.flatnonzero(np.concatenate([_TRUE, change]))


class Waiting:
    """Entries filed by the step that wakes them, in blocks: ``pop(step)`` the blocks of ``step``.

    Entries are woken at multiples of :data:`WAKE_EVERY` (:meth:`BestFit._next_use`; the step right
    after the filing one is not filed), so what is filed in between is sorted by step once, when the
    next such step comes: one sort and one pass over the steps per :data:`WAKE_EVERY` steps.
    """

    def __init__(self) -> None:
        self.by_step: dict[int, list[NDArray[np.int64]]] = {}
        self.unsorted: list[NDArray[np.int64]] = []  # (1 + arrays, n) blocks: when, then the arrays

    def __bool__(self) -> bool:
        return bool(self.by_step or self.unsorted)

    def file(self, when: NDArray[np.int64], *arrays: NDArray[np.int64]) -> None:
        """File the entries of ``arrays`` (each ``(n,)``) under the step ``when`` (``(n,)``, multiples of
        :data:`WAKE_EVERY`) that wakes them."""
        if len(when):
            self.unsorted.append(np.stack([when, *arrays]))

    def pop(self, step: int) -> list[NDArray[np.int64]] | None:
        """The ``(arrays, k)`` blocks filed under ``step`` (``None``: none), entries in their filing order."""
        if self.unsorted and step % WAKE_EVERY == 0:
            block = self.unsorted[0] if len(self.unsorted) == 1 else np.concatenate(self.unsorted, axis=1)
            self.unsorted = []
            when = block[0]
            # steps are below 2**16 unless a row holds more sizes: numpy's radix sort of 16-bit keys
            order = np.argsort(when.astype(np.uint16) if when.max() < 1 << 16 else when, kind="stable")
            when, block = when[order], block[1:, order]
            starts = _run_starts(when)
            for at, part in zip(when[starts].tolist(), np.split(block, starts[1:], axis=1)):
                self.by_step.setdefault(at, []).append(part)
        return self.by_step.pop(step, None)


#: bins of a dense histogram built with one bincount (beyond: a sort of the items)
_DENSE_BINS = 1 << 24
#: rows wait for the step that fits them rounded down to a multiple of this (see BestFit._next_use)
WAKE_EVERY = 8
#: runs step 0 opens rows for at once (bounds its temporaries, about 300 bytes a run; see BestFit._open)
OPEN_CHUNK = 1 << 19


def _key_runs(
    key: NDArray[np.int64], bins: int, counts: NDArray[np.integer] | None = None
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(runs, count)``: the distinct keys (``0 <= key < bins``) in order, and the items of each.

    ``counts``: how many items each entry stands for (default: one each; a
    key whose entries count 0 in all is no run). A dense histogram (one
    ``bincount``) when ``bins`` is small enough, else a sort of the keys.
    """
    if bins <= max(_DENSE_BINS, 4 * len(key)):
        hist = np.bincount(key, weights=counts, minlength=bins).astype(np.int64)
        runs = np.flatnonzero(hist)
        return runs, hist[runs]
    runs, found = np.unique(key, return_inverse=True)
    count = np.bincount(found, weights=counts, minlength=len(runs)).astype(np.int64)
    some = count > 0  # only counts of 0 (weights): their entries are no items
    return runs[some], count[some]


def pieces_per_sample(lengths: NDArray[np.integer], capacity: int) -> NDArray[np.int64]:
    """``(n,)`` the pieces ``pack_split`` cuts each sample into: ``ceil(length / capacity)``, 1 for length 0.

    The one rule for counting (:meth:`SizeRuns.of_lengths`), building
    (``PackBatcher``) and resuming (``plan/resume.py``); lengths are read as
    int64 whatever their dtype (an unsigned 0 must not wrap).

    >>> pieces_per_sample(np.array([0, 1, 4, 5, 9], dtype=np.uint16), 4).tolist()
    [1, 1, 1, 2, 3]
    """
    return np.maximum(-(-np.asarray(lengths, dtype=np.int64) // capacity), 1)


@dataclass(frozen=True)
class SizeRuns:
    """Items as ``(segment, size, count)`` runs, by segment, then largest size first.

    Attributes:
        seg: ``(n,)`` segment of each run, non-decreasing.
        size: ``(n,)`` item size, ``0 <= size <= capacity``, decreasing within a segment.
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
        width = capacity + 1
        key = np.asarray(seg, dtype=np.int64) * width + (capacity - np.asarray(sizes, dtype=np.int64))
        runs, count = _key_runs(key, segments * width, counts)
        return cls(runs // width, capacity - runs % width, count)

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
        lengths = np.asarray(lengths, dtype=np.int64)
        seg = np.asarray(seg, dtype=np.int64)
        full = pieces_per_sample(lengths, capacity) - 1  # (m,) full pieces before the last
        last = lengths - full * capacity  # (m,) 0..capacity
        width = capacity + 1
        bins = segments * width
        if bins <= max(_DENSE_BINS, 4 * len(seg)):
            key = seg * width  # by segment, then size descending
            key += capacity
            key -= last
            hist = np.bincount(key, minlength=bins)
            long = np.flatnonzero(full)
            if len(long):  # full pieces: size capacity, each segment's first bin
                hist[::width] += np.bincount(seg[long], weights=full[long], minlength=segments).astype(np.int64)
            runs = np.flatnonzero(hist)
            return cls(runs // width, capacity - runs % width, hist[runs])
        sizes = np.concatenate([last, np.full(int(np.count_nonzero(full)), capacity)])
        cut = np.flatnonzero(full)
        counts = np.concatenate([np.ones(len(seg), dtype=np.int64), full[cut]])
        return cls.of(sizes, np.concatenate([seg, seg[cut]]), segments, capacity, counts=counts)

    @classmethod
    def concat(cls, parts: list[SizeRuns]) -> SizeRuns:
        """Runs of several groups of segments, each group's segments after the previous group's."""
        seg = np.concatenate([p.seg for p in parts]) if parts else _EMPTY
        size = np.concatenate([p.size for p in parts]) if parts else _EMPTY
        count = np.concatenate([p.count for p in parts]) if parts else _EMPTY
        return cls(seg, size, count)


@dataclass(frozen=True)
class Placement:
    """What one best-fit step (1 and later) places, group by group: what :meth:`BestFit._follow` is given.

    Attributes:
        segs: ``(s,)`` the segments placing items, increasing.
        touched: ``(g,)`` indices of their active groups that can take items (before the step), by segment.
        full: ``(g,)`` its first ``full`` rows (by row number) take ``per_row`` items each...
        per_row: ``(g,)`` ...
        part: ``(g,)`` ... and the next one ``part`` (0: none).
        new_full: ``(s,)`` new rows of each segment of ``segs``: ``new_full`` of ``new_per_row`` items...
        new_per_row: ``(s,)`` ...
        new_part: ``(s,)`` ... and one of ``new_part`` (0: none).
    """

    step: int
    segs: NDArray[np.int64]
    touched: NDArray[np.int64]
    full: NDArray[np.int64]
    per_row: NDArray[np.int64]
    part: NDArray[np.int64]
    new_full: NDArray[np.int64]
    new_per_row: NDArray[np.int64]
    new_part: NDArray[np.int64]


class BestFit:
    """One BFD run over the runs of ``K = segments`` segments (the steps: the module docstring).

    Rows are kept as groups of equal gap: *active* groups, sorted by
    ``(segment, gap)``, and *waiting* ones, filed by the step that wakes them
    (groups whose segment has no size that small left are dropped). Sizes in
    ``runs`` are ``<= capacity``; ``capacity >= 1``.
    """

    def __init__(self, runs: SizeRuns, segments: int, capacity: int) -> None:
        self.segments, self.capacity, self.width = segments, capacity, capacity + 1
        empty = np.flatnonzero(runs.size == 0)
        self.only_empty = np.zeros(segments, dtype=bool)
        self.only_empty[runs.seg[empty]] = True
        self.r_seg, self.r_size, self.r_count = runs.seg, runs.size, runs.count
        if len(empty):  # (a copy of every run only when some are of empty items)
            positive = runs.size > 0
            self.r_seg, self.r_size, self.r_count = runs.seg[positive], runs.size[positive], runs.count[positive]
        seg_runs = np.bincount(self.r_seg, minlength=segments)  # (K,)
        self.seg_first = np.cumsum(seg_runs) - seg_runs  # (K,) each segment's first run
        # step 0 opens a row for every item larger than half a row (no row ever has room for one: BFD opens
        # them one by one, largest first); each later step places one run of every segment. A segment's run
        # `i` is placed at step max(i - lead, 0), `lead` (K,): its runs of such items, less one
        big = np.bincount(self.r_seg[self.r_size * 2 > capacity], minlength=segments)
        self.lead = big - 1
        #: (runs,) step at which each run is placed
        self.r_step = np.arange(len(self.r_seg))  # (in place: one run-sized temporary, not two)
        self.r_step -= np.repeat(self.seg_first + self.lead, seg_runs)
        np.maximum(self.r_step, 0, out=self.r_step)
        self.seg_steps = seg_runs - self.lead  # (K,) a segment's steps are 0 .. seg_steps - 1
        # (K * buckets,) runs of each segment whose size is in a higher bucket of 2**shift gaps than each
        # bucket: the first step that can fit a gap, or an earlier one (see _next_use)
        self.shift, limit = 0, min(_DENSE_BINS, max(4 * len(self.r_seg), 1 << 16))
        while segments * ((capacity >> self.shift) + 1) > limit and capacity >> self.shift:
            self.shift += 1
        self.buckets = (capacity >> self.shift) + 1
        key = self.r_seg * self.buckets  # (runs,) in place below: no run-sized temporaries
        key += self.buckets - 1
        key -= self.r_size >> self.shift
        per_bucket = np.bincount(key, minlength=segments * self.buckets)
        del key
        above = np.zeros(len(per_bucket), dtype=np.int64)
        np.cumsum(per_bucket[:-1], out=above[1:])
        del per_bucket
        above -= np.repeat(self.seg_first, self.buckets)
        # half the memory of the lookups of _next_use (random reads) when it fits
        self.runs_above = above.astype(np.int32) if len(self.r_seg) < 1 << 31 else above
        del above
        self.rows = np.zeros(segments, dtype=np.int64)  # (K,) rows opened
        self.a_key = _EMPTY  # (groups,) segment * width + gap of each active group, increasing
        self.a_cnt = _EMPTY  # (groups,) rows of each (0: the group leaves at the next merge)
        self.waiting = Waiting()  # (2, k) blocks: key, cnt
        self.size_of = np.zeros(segments, dtype=np.int64)  # (K,) the size being placed, 0 if none; scratch
        self.need = np.zeros(segments, dtype=np.int64)  # (K,) items of that size; scratch
        self.by_step = _EMPTY  # (runs,) the runs in the order the steps place them (set by run)

    def run(self) -> NDArray[np.int64]:
        """Place every run; ``(K,)`` rows per segment (a segment of only empty items: one)."""
        # step by step, segments in order (steps are below 2**16 unless a row holds more sizes: numpy's radix sort)
        step_key = self.r_step.astype(np.uint16) if self.width <= 1 << 16 else self.r_step
        self.by_step = by_step = np.argsort(step_key, kind="stable")
        steps = int(self.seg_steps.max(initial=0))
        bounds = offsets_from_lengths(np.bincount(self.r_step, minlength=steps)[:steps]).tolist()
        self.r_step = _EMPTY  # (not needed past here: a run's worth of memory)
        self._open(by_step[bounds[0] : bounds[1]] if len(bounds) > 1 else _EMPTY)
        for step, (lo, hi) in enumerate(itertools.pairwise(bounds[1:]), start=1):
            self._wake(step)
            self._step(step, by_step[lo:hi])
        return np.where(self.only_empty & (self.rows == 0), 1, self.rows)

    def _open(self, runs: NDArray[np.int64]) -> None:
        """Step 0: the runs ``runs`` of items larger than half a row (by segment, largest first), a row each.

        Opened :data:`OPEN_CHUNK` runs at a time, in order: the same rows, groups and filing order as all at
        once (a merge keeps one group per key, sorted), with a chunk's temporaries rather than all runs'.
        """
        for lo in range(0, max(len(runs), 1), OPEN_CHUNK):
            part = runs[lo : lo + OPEN_CHUNK]
            segs, sizes, n = self.r_seg[part], self.r_size[part], self.r_count[part]
            self.rows += np.bincount(segs, weights=n, minlength=self.segments).astype(np.int64)
            self._opened(segs, sizes, n)
            self._merge(*self._file(0, segs, self.capacity - sizes, n))

    def _wake(self, step: int) -> None:
        """Make the groups waiting for this step active."""
        parts = self.waiting.pop(step)
        if parts is not None:
            key, cnt = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
            self._merge(key, cnt)

    def _merge(self, key: NDArray[np.int64], cnt: NDArray[np.int64]) -> None:
        """Add groups (``key``: segment * width + gap, any order) to the active ones, and drop the active groups
        left without rows; the active ones stay sorted by key, one group per key.

        The new groups are few: inserting them (one pass over the active ones) is cheaper than re-sorting.
        """
        if len(key) > 1:
            order = np.argsort(key, kind="stable")
            key, cnt = key[order], cnt[order]
            starts = _run_starts(key)
            if len(starts) < len(key):  # sums of equal groups (a cumsum: faster than reduceat)
                total = np.cumsum(cnt)[np.append(starts[1:], len(cnt)) - 1]
                key, cnt = key[starts], np.diff(total, prepend=0)
        at = np.searchsorted(self.a_key, key)
        hit = at < len(self.a_key)
        hit[hit] = self.a_key[at[hit]] == key[hit]
        if hit.any():
            self.a_cnt[at[hit]] += cnt[hit]
        new = ~hit
        key, cnt, at = key[new], cnt[new], at[new]
        gone = self.a_cnt == 0
        if not len(key) and not gone.any():
            return
        # np.insert and np.delete in one: the kept groups and the new ones land in key order (`at` non-decreasing)
        kept = np.flatnonzero(~gone)
        if len(key) and len(kept) < len(gone):  # `at` among the kept groups: less the gone ones before it
            at -= np.concatenate([[0], np.cumsum(gone)])[at]
        size = len(kept) + len(key)
        place = at + np.arange(len(key))  # where the new groups land
        old = np.ones(size, dtype=bool)
        old[place] = False
        a_key, a_cnt = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64)
        a_key[place], a_cnt[place] = key, cnt
        a_key[old], a_cnt[old] = self.a_key[kept], self.a_cnt[kept]
        self.a_key, self.a_cnt = a_key, a_cnt

    def _segment_groups(self, keys: NDArray[np.int64], segs: NDArray[np.int64], scale: int = 1) -> NDArray[np.int64]:
        """Indices of the entries of sorted ``keys`` (``(segment * width + gap) * scale + ...``) of segments ``segs``."""
        lo = np.searchsorted(keys, segs * self.width * scale)
        return range_positions(lo, np.searchsorted(keys, (segs + 1) * self.width * scale) - lo)

    def _next_use(self, step: int, seg: NDArray[np.int64], gap: NDArray[np.int64]) -> NDArray[np.int64]:
        """``(n,)`` the step at which rows of gap ``gap`` in segment ``seg`` wake (past the last: never).

        The first later step whose size fits the gap, or a few steps before
        it: the sizes are looked up by buckets of ``2**shift`` tokens (1 when
        segments * capacity is small) and the step is rounded down to a
        multiple of :data:`WAKE_EVERY`. Waking early costs a row a few steps
        in which it takes nothing; it files far fewer groups.
        """
        fits = self.runs_above[seg * self.buckets + (self.buckets - 1 - (gap >> self.shift))]  # (n,) a run
        fits = np.maximum(fits - self.lead[seg], 0)  # its step
        never = self.seg_steps[seg]  # no size of the segment fits: never wake (rounding down would)
        return np.where(fits < never, np.maximum(fits // WAKE_EVERY * WAKE_EVERY, step + 1), never)

    def _file(
        self, step: int, seg: NDArray[np.int64], gap: NDArray[np.int64], cnt: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """File groups of rows by the step that wakes them, drop those no later size fits; return the next
        step's ``(key, cnt)``."""
        when = self._next_use(step, seg, gap)
        keep = (cnt > 0) & (when < self.seg_steps[seg])
        key, cnt, when = seg[keep] * self.width + gap[keep], cnt[keep], when[keep]
        now = when == step + 1
        later = ~now
        self.waiting.file(when[later], key[later], cnt[later])
        return key[now], cnt[now]

    def _step(self, step: int, runs: NDArray[np.int64]) -> None:
        """Place the runs ``runs`` (one per segment, segments increasing): each segment's next size."""
        segs, sizes, n = self.r_seg[runs], self.r_size[runs], self.r_count[runs]
        self.size_of[segs], self.need[segs] = sizes, n
        # each segment's groups that can take items: from its first gap that fits the size, one item at least each
        first_fit = np.searchsorted(self.a_key, segs * self.width + sizes)
        touched = range_positions(
            first_fit, np.minimum(n, np.searchsorted(self.a_key, (segs + 1) * self.width) - first_fit)
        )
        e_key, e_cnt = self.a_key[touched], self.a_cnt[touched]
        e_seg = e_key // self.width
        e_gap = e_key - e_seg * self.width
        s = self.size_of[e_seg]  # (g,) the size each group's segment places
        per_row = e_gap // s  # 0 for a gap below it
        slots = e_cnt * per_row
        before = np.cumsum(slots) - slots  # slots of the segment's smaller gaps
        if len(e_seg) and self.segments > 1:
            first = _run_starts(e_seg)
            before -= np.repeat(before[first], np.diff(np.append(first, len(e_seg))))
        take = np.clip(self.need[e_seg] - before, 0, slots)  # items each group takes, smallest gaps first
        full = take // np.maximum(per_row, 1)  # rows that take per_row items
        part = take - full * per_row  # items of the one row that takes fewer (0: none)
        taken = np.zeros(self.segments, dtype=np.int64)
        np.add.at(taken, e_seg, take)
        left = n - taken[segs]
        new_per_row = self.capacity // sizes
        new_full = left // new_per_row
        new_part = left - new_full * new_per_row
        self._follow(Placement(step, segs, touched, full, per_row, part, new_full, new_per_row, new_part))
        self.need[segs] = 0
        self.rows[segs] += new_full + (new_part > 0)
        # rows that took nothing stay active, their gaps fit what comes next; none once their segment is done
        left_rows = e_cnt - full - (part > 0)
        self.a_cnt[touched] = left_rows
        done = segs[step + 1 >= self.seg_steps[segs]]
        self.a_cnt[self._segment_groups(self.a_key, done)] = 0  # dropped by the merge below
        some, fresh, moved = part > 0, new_part > 0, full > 0  # most touched groups take nothing: not filed
        now = self._file(  # rows that took items, new rows: active again when a size of their segment fits
            step,
            np.concatenate([e_seg[moved], e_seg[some], segs, segs[fresh]]),
            np.concatenate(
                [
                    (e_gap - per_row * s)[moved],
                    e_gap[some] - (part * s)[some],
                    self.capacity - new_per_row * sizes,
                    (self.capacity - new_part * sizes)[fresh],
                ]
            ),
            np.concatenate(
                [
                    full[moved],
                    np.ones(int(some.sum()), dtype=np.int64),
                    new_full,
                    np.ones(int(fresh.sum()), dtype=np.int64),
                ]
            ),
        )
        self._merge(*now)

    def _opened(self, segs: NDArray[np.int64], sizes: NDArray[np.int64], n: NDArray[np.int64]) -> None:
        """Called by step 0: ``n`` rows of one item of ``sizes`` open in segments ``segs``, in that order."""

    def _follow(self, placed: Placement) -> None:
        """Called by each step before the groups change (rows followed one by one: ``track.TrackedBestFit``)."""


def count_rows(runs: SizeRuns, segments: int, capacity: int) -> NDArray[np.int64]:
    """``(segments,)`` rows BFD packs each segment's items into, each as if alone (sizes ``<= capacity``)."""
    return BestFit(runs, segments, capacity).run()
