"""Token-budget batches without bucketing: a greedy fill of the sample order.

Each batch takes the longest run of the next samples within ``max_tokens``
(at least one, at most ``max_rows``): the baseline bucketing improves on, at
about 30x its cost. Counting every rank is vectorised: :func:`greedy_rows`
gives every position's batch at once (binary lifting, ``O(n log K)``), then
the batch starts of all ranks are followed in lockstep (docs/planning.md, "Greedy fill").
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload.plan.batcher import Batcher, Batches
from shardload.plan.options import padded_length

__all__ = ["GreedyTokenBatcher", "greedy_rows"]

_GROUP = 1 << 20  # positions per sparse table: bounds its memory to ~100 MB


def greedy_rows(
    costs: NDArray[np.int64], stop: NDArray[np.int64], budget: int, max_rows: int | None
) -> NDArray[np.int64]:
    """``(n,)`` rows of the greedy batch that would start at each position.

    That is the largest ``k >= 1`` (at most ``max_rows``) with ``k *
    max(costs[p:p+k]) <= budget``, ``1`` if even one row is over budget.
    ``costs`` (padded lengths, ``>= 1``) and ``stop`` (the exclusive end of
    each position's sequence, which a batch never crosses; non-decreasing)
    are ``(n,)``. Works in windows of ``2**20`` positions, so memory stays
    bounded however long the sequence.

    >>> greedy_rows(np.array([4, 4, 8, 2, 2]), np.full(5, 5), 16, None).tolist()
    [2, 2, 2, 2, 1]
    """
    n = len(costs)
    reach = min(budget, max_rows or budget)  # a row costs >= 1, so no batch is longer
    rows = np.empty(n, dtype=np.int64)
    for lo in range(0, n, _GROUP):
        hi = min(n, lo + _GROUP)
        ahead = min(n, hi + reach)
        rows[lo:hi] = _fill_window(costs[lo:ahead], stop[lo:hi] - lo, budget, reach)
    return rows


def _fill_window(costs: NDArray[np.int64], stop: NDArray[np.int64], budget: int, reach: int) -> NDArray[np.int64]:
    """:func:`greedy_rows` for the first ``len(stop)`` positions of ``costs``."""
    n, m = len(costs), len(stop)
    small = budget < np.iinfo(np.int32).max and n < np.iinfo(np.int32).max
    dtype: type[np.signedinteger[Any]] = np.int32 if small else np.int64  # halves memory traffic
    clipped = np.minimum(costs, budget + 1).astype(dtype)  # over budget is over budget
    reach = min(reach, budget // max(1, int(clipped.min())))  # fewer levels below
    here: NDArray[np.signedinteger[Any]] = np.arange(m, dtype=dtype)
    limit = np.minimum(stop - here, reach).astype(dtype)  # (m,) rows allowed; inside costs
    levels = max(1, int(limit.max()).bit_length())
    table = [clipped]  # table[j][p] = max(costs[p : p + 2**j]), clipped at n
    for j in range(1, levels):
        prev, half = table[-1], 1 << (j - 1)
        cur = np.empty_like(prev)
        np.maximum(prev[: n - half], prev[half:], out=cur[: n - half])
        cur[n - half :] = prev[n - half :]
        table.append(cur)
    rows: NDArray[np.signedinteger[Any]] = np.zeros(m, dtype=dtype)  # (m,) rows accepted so far
    run_max: NDArray[np.signedinteger[Any]] = np.zeros(m, dtype=dtype)  # (m,) their max cost
    for j in reversed(range(levels)):
        grown = rows + (1 << j)
        fits = grown <= limit  # then [here + rows, here + grown) lies inside costs
        probe = here + rows
        np.minimum(probe, n - 1, out=probe)
        new_max = np.maximum(run_max, table[j][probe])
        fits &= np.multiply(grown, new_max, dtype=np.int64) <= budget
        np.copyto(rows, grown, where=fits)
        np.copyto(run_max, new_max, where=fits)
    result: NDArray[np.int64] = np.maximum(rows, 1).astype(np.int64)
    return result


class GreedyTokenBatcher(Batcher):
    """Token-budget batches by greedy fill, no bucketing (see the module docstring)."""

    def _costs(self, lens: NDArray[np.int64]) -> NDArray[np.int64]:
        return np.maximum(padded_length(lens, self.batching.pad_to_multiple_of), 1)  # (n,) a row costs >= 1 token

    def _count(self) -> NDArray[np.int64]:
        assert self.batching.max_tokens is not None
        bounds = self.layout.rank_starts  # (W + 1,) epoch positions
        cap = min(self.batching.max_rows or self.batching.max_tokens, _GROUP)
        small = np.uint16 if cap < 1 << 16 else np.int32
        rows_at = np.zeros(self.layout.num_samples, dtype=small)  # (N,) by epoch position
        rank = 0
        while rank < self.layout.world_size:
            last = rank + 1  # group ranks until the group holds about _GROUP samples
            while last < self.layout.world_size and bounds[last + 1] - bounds[rank] <= _GROUP:
                last += 1
            costs = np.concatenate([self._costs(self.rank_order(r)[1]) for r in range(rank, last)])
            sizes = np.diff(bounds[rank : last + 1])
            stop = np.repeat(bounds[rank + 1 : last + 1] - bounds[rank], sizes)
            rows_at[bounds[rank] : bounds[last]] = greedy_rows(
                costs, stop, self.batching.max_tokens, self.batching.max_rows
            )
            rank = last
        # follow every rank's batch starts in lockstep: one step per batch
        pos = bounds[:-1].copy()
        counts = np.zeros(self.layout.world_size, dtype=np.int64)
        active = np.flatnonzero(pos < bounds[1:])
        while active.size:
            pos[active] += rows_at[pos[active]].astype(np.int64)
            counts[active] += 1
            active = active[pos[active] < bounds[1:][active]]
        return counts

    def _cut(self, ids: NDArray[np.int64], lens: NDArray[np.int64]) -> Batches:
        assert self.batching.max_tokens is not None
        rows = greedy_rows(
            self._costs(lens),
            np.full(len(ids), len(ids), dtype=np.int64),
            self.batching.max_tokens,
            self.batching.max_rows,
        ).tolist()
        offsets, pos = [0], 0
        while pos < len(rows):  # one step per batch, not per sample
            pos += rows[pos]
            offsets.append(pos)
        return ids, np.asarray(offsets, dtype=np.int64)
