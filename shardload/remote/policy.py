"""Which cached shards to evict: Belady's rule, driven by the epoch's plan.

The plan says exactly which shards every rank reads, in which order, this epoch
(:func:`shardload.plan.reads.read_sequence`), so a full cache can evict the shard whose next
use is farthest (Belady: optimal for equal sizes, and close for shards cut to balanced byte
sizes). Pure numpy, no I/O::

    plan -> read_sequence (shard ids in read order, per step)
         -> NextUseTable / next_uses   each shard's next use from the current position
         -> choose_victims             the shards to delete for ``need_bytes``
         -> the cache deletes them (never one in use: the caller pins those)

Positions index a rank's read sequence; a *step* is one batch of every rank. Over the ranks
sharing a node's cache, the next use is the nearest in steps (:func:`node_next_uses`), or
exactly, one step of every rank after the other (:func:`node_sequence`).

>>> seq = np.array([0, 1, 2, 0, 1, 3])
>>> nu = next_uses(seq, 2, num_shards=4)
>>> nu.tolist() == [3, 4, 2, 5]
True
>>> choose_victims(np.array([0, 1]), np.ones(4, np.int64), nu, need_bytes=1).tolist()  # 1 is needed later than 0
[1]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from shardload.errors import PlanError

__all__ = ["NEVER", "NextUseTable", "choose_victims", "next_uses", "node_next_uses", "node_sequence"]

#: the next use of a shard that is not read again (farther than any position or step)
NEVER: int = 2**62


def _check_sequence(sequence: NDArray[np.int64], num_shards: int) -> NDArray[np.int64]:
    """``sequence`` as int64 after checking it is 1-D with shard ids in ``[0, num_shards)``."""
    seq = np.asarray(sequence)
    if seq.ndim != 1 or (seq.size and not np.issubdtype(seq.dtype, np.integer)):
        raise PlanError(f"sequence: expected a 1-D array of shard ids, got shape {seq.shape} of {seq.dtype}")
    if num_shards < 0:
        raise PlanError(f"num_shards={num_shards}: must be >= 0")
    if seq.size and (int(seq.min()) < 0 or int(seq.max()) >= num_shards):
        raise PlanError(
            f"sequence holds shard ids {int(seq.min())}..{int(seq.max())}, outside 0..{num_shards - 1}: "
            "pass the number of shards of the set (or mixture) the sequence was made from"
        )
    return seq.astype(np.int64, copy=False)


def _check_position(name: str, position: int, length: int) -> int:
    if not 0 <= position <= length:
        raise PlanError(f"{name}={position}: must be in 0..{length} (the length of the read sequence)")
    return int(position)


def next_uses(sequence: NDArray[np.int64], position: int, num_shards: int) -> NDArray[np.int64]:
    """Each shard's next use: its first index in ``sequence`` at or after ``position``.

    Args:
        sequence: ``(n,)`` shard ids in read order (a shard may appear many times).
        position: Index into ``sequence`` of the next read (``0 .. n``).
        num_shards: Number of shards ``S``; every id is below it.

    Returns:
        ``(S,)`` int64: the index of each shard's next use, :data:`NEVER` if it
        is not read again. ``O(n - position)``; call it at every step through
        :class:`NextUseTable` instead.

    Raises:
        PlanError: If the sequence holds an id outside ``0 .. S - 1`` or the
            position is outside ``0 .. n``.
    """
    seq = _check_sequence(sequence, num_shards)
    position = _check_position("position", position, len(seq))
    out = np.full(num_shards, NEVER, dtype=np.int64)
    np.minimum.at(out, seq[position:], np.arange(position, len(seq), dtype=np.int64))
    return out


def _following(seq: NDArray[np.int64]) -> NDArray[np.int64]:
    """``(n,)`` index of the next entry of the same shard after each entry, :data:`NEVER` after its last."""
    order = np.argsort(seq, kind="stable")  # (n,) entries grouped by shard, in sequence order within a shard
    same = seq[order[1:]] == seq[order[:-1]]  # (n - 1,) whether the next entry in a group is the same shard
    out = np.full(len(seq), NEVER, dtype=np.int64)
    out[order[:-1][same]] = order[1:][same]
    return out


class NextUseTable:
    """Every shard's next use as a rank moves through its read sequence, updated in place.

    :meth:`at` with a position at or after the previous one costs the entries
    passed since (each shard read in between gets its following use), so
    walking a whole epoch costs ``O(n)`` in all; an earlier position rebuilds
    the table (``O(n)``). Memory: two ``(n,)`` and one ``(S,)`` int64 arrays.

    Args:
        sequence: ``(n,)`` shard ids in read order.
        num_shards: Number of shards ``S``.
        step_offsets: ``(T + 1,)`` offsets of each step's reads in
            ``sequence`` (:func:`shardload.plan.reads.read_sequence` gives
            them); needed by :meth:`steps_at` only.

    Raises:
        PlanError: On a bad id, position or step.

    >>> table = NextUseTable(np.array([2, 0, 2, 1]), num_shards=3, step_offsets=np.array([0, 2, 4]))
    >>> table.at(1).tolist(), table.at(3).tolist() == [NEVER, 3, NEVER]
    ([1, 3, 2], True)
    >>> table.steps_at(2).tolist() == [NEVER, 1, 1]
    True
    """

    def __init__(
        self, sequence: NDArray[np.int64], num_shards: int, step_offsets: NDArray[np.int64] | None = None
    ) -> None:
        self.sequence = _check_sequence(sequence, num_shards)
        self.num_shards = num_shards
        self.step_offsets = None if step_offsets is None else np.asarray(step_offsets, dtype=np.int64)
        if self.step_offsets is not None and (
            self.step_offsets.ndim != 1
            or len(self.step_offsets) == 0
            or self.step_offsets[0] != 0
            or self.step_offsets[-1] != len(self.sequence)
            or bool((np.diff(self.step_offsets) < 0).any())
        ):
            raise PlanError(
                f"step_offsets: expected non-decreasing offsets from 0 to {len(self.sequence)} (the sequence's "
                "length), as read_sequence returns them"
            )
        self._following = _following(self.sequence)
        self._table = next_uses(self.sequence, 0, num_shards)
        self._position = 0

    def at(self, position: int) -> NDArray[np.int64]:
        """``(S,)`` each shard's next use at or after ``position``, as :func:`next_uses` gives it.

        The array is the table itself, read-only, and changes at the next
        call: copy it to keep it.
        """
        position = _check_position("position", position, len(self.sequence))
        if position < self._position:
            self._table = next_uses(self.sequence, position, self.num_shards)
        else:
            passed = slice(self._position, position)
            follow = self._following[passed]
            last = follow >= position  # the last entry of each shard read in between: its use after them
            self._table.setflags(write=True)
            self._table[self.sequence[passed][last]] = follow[last]
        self._position = position
        self._table.setflags(write=False)
        return self._table

    def steps_at(self, position: int) -> NDArray[np.int64]:
        """``(S,)`` the step of each shard's next use at or after ``position``; :data:`NEVER` if none.

        Steps are comparable across ranks (they advance one batch per step
        together), positions are not: :func:`node_next_uses` takes the
        minimum of this over the ranks of a node, each at its own position.
        """
        if self.step_offsets is None:
            raise PlanError("NextUseTable.steps_at needs the step_offsets of the sequence (read_sequence gives them)")
        uses = self.at(position)
        steps = np.searchsorted(self.step_offsets, uses, side="right") - 1
        out: NDArray[np.int64] = np.where(uses == NEVER, NEVER, steps).astype(np.int64)
        return out


def node_next_uses(tables: Sequence[NextUseTable], positions: Sequence[int]) -> NDArray[np.int64]:
    """``(S,)`` the nearest next use, in steps, of each shard over the ranks sharing one cache.

    The elementwise minimum of :meth:`NextUseTable.steps_at` over the ranks of
    the node (one table per rank, each with its ``step_offsets``, each at the
    rank's own position in its sequence): the shards a rank of the node reads
    soon are kept, a shard no rank reads again goes first. Shards next used at
    the same step compare equal (:func:`choose_victims` breaks the tie): a
    little coarser than the exact order of :func:`node_sequence` with one table,
    which needs the ranks' reads in a fixed interleaving.

    Raises:
        PlanError: If ``tables`` is empty, the counts differ, or a position is out of range.
    """
    if not tables or len(tables) != len(positions):
        raise PlanError(f"node_next_uses: {len(tables)} tables and {len(positions)} positions (one per rank, >= 1)")
    if len({t.num_shards for t in tables}) != 1:
        raise PlanError("node_next_uses: the tables count different numbers of shards; build them for one set")
    out = tables[0].steps_at(positions[0]).copy()
    for table, position in zip(tables[1:], positions[1:]):
        np.minimum(out, table.steps_at(position), out=out)
    return out


def node_sequence(
    sequences: Sequence[NDArray[np.int64]], step_offsets: Sequence[NDArray[np.int64]]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The reads of several ranks sharing a cache, in one sequence: step by step, rank by rank.

    Step ``t`` of the result is rank 0's reads of its batch ``t``, then rank
    1's, and so on: what a node reads when its ranks advance one batch per step
    together. Its next uses (:func:`next_uses`, :class:`NextUseTable`) are
    those of the node, at the resolution of single reads.

    Args:
        sequences: One ``(n_r,)`` read sequence per rank.
        step_offsets: One ``(T + 1,)`` offsets array per rank (the same ``T``).

    Returns:
        ``(sequence, offsets)``: ``(sum n_r,)`` shard ids and ``(T + 1,)``
        offsets of each step in it.

    Raises:
        PlanError: If the counts differ (ranks, or steps between ranks).

    >>> seq, offs = node_sequence([np.array([0, 1, 2]), np.array([5, 6])], [np.array([0, 2, 3]), np.array([0, 1, 2])])
    >>> seq.tolist(), offs.tolist()
    ([0, 1, 5, 2, 6], [0, 3, 5])
    """
    if len(sequences) != len(step_offsets) or not sequences:
        raise PlanError(
            f"node_sequence: {len(sequences)} sequences and {len(step_offsets)} step offsets (one per rank)"
        )
    offsets = [np.asarray(o, dtype=np.int64) for o in step_offsets]
    if len({len(o) for o in offsets}) != 1:
        raise PlanError("node_sequence: the ranks have different numbers of steps; plan them for one epoch")
    steps = np.concatenate([np.repeat(np.arange(len(o) - 1), np.diff(o)) for o in offsets])  # step of each read
    ranks = np.concatenate([np.full(int(o[-1]), r) for r, o in enumerate(offsets)])
    order = np.lexsort((ranks, steps), axis=0)  # stable: a rank's reads of a step stay in order
    merged = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences])[order]
    counts = np.sum([np.diff(o) for o in offsets], axis=0)  # (T,) reads of each step over the ranks
    node_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=node_offsets[1:])
    return merged, node_offsets


def choose_victims(
    cached: NDArray[np.int64],
    sizes: NDArray[np.int64],
    next_use: NDArray[np.int64],
    need_bytes: int,
    pinned: NDArray[np.bool_] | None = None,
) -> NDArray[np.int64]:
    """The cached shards to delete to free ``need_bytes``: farthest next use first.

    Ties go to the larger shard first, then the higher id, so the choice is
    deterministic. A pinned shard (in use) is never chosen; when the unpinned
    ones cannot free ``need_bytes``, all of them are returned (the caller
    decides whether to wait or fail).

    Args:
        cached: ``(c,)`` distinct ids of the shards in the cache.
        sizes: ``(S,)`` bytes of every shard, by shard id.
        next_use: ``(S,)`` next use of every shard (:func:`next_uses`,
            :meth:`NextUseTable.at`, :func:`node_next_uses`: any unit that
            orders uses, :data:`NEVER` for none).
        need_bytes: Bytes to free (nothing is chosen for ``<= 0``).
        pinned: ``(S,)`` True for the shards that must stay, or ``None``.

    Returns:
        ``(k,)`` shard ids in eviction order; their sizes add up to at least
        ``need_bytes`` unless every unpinned shard is in it.

    Raises:
        PlanError: If the arrays do not fit together (lengths, ids).
    """
    cached = np.asarray(cached, dtype=np.int64)
    sizes, next_use = np.asarray(sizes, dtype=np.int64), np.asarray(next_use, dtype=np.int64)
    num_shards = len(sizes)
    if len(next_use) != num_shards or (pinned is not None and len(pinned) != num_shards):
        raise PlanError(
            f"choose_victims: sizes ({num_shards},), next_use ({len(next_use)},) and pinned "
            f"({'-' if pinned is None else len(pinned)},) must all have one entry per shard"
        )
    if cached.size and (int(cached.min()) < 0 or int(cached.max()) >= num_shards):
        raise PlanError(f"choose_victims: cached holds ids outside 0..{num_shards - 1}")
    if need_bytes <= 0:
        return np.zeros(0, dtype=np.int64)
    if pinned is not None:
        cached = cached[~np.asarray(pinned, dtype=bool)[cached]]
    order = np.lexsort((-cached, -sizes[cached], -next_use[cached]))  # last key first: farthest, largest, highest
    ranked = cached[order]
    freed = np.cumsum(sizes[ranked])
    count = int(np.searchsorted(freed, need_bytes, side="left")) + 1
    return ranked[:count]
