"""Plan-driven prefetch of a rank's remote shards into the node cache (docs/remote.md, "Prefetch").

Between the plan and the dataset: the rank's main process computes its shard order (:func:`read_order`),
publishes it for eviction, and runs a :class:`Prefetcher` thread ahead of the rank. Readers fetch a missing
shard themselves under the same per-shard lock, so a shard is downloaded once per node.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from shardload._base import envvars
from shardload._base.redact import get_logger
from shardload.errors import PlanError
from shardload.remote.cache import RemoteSet
from shardload.sets.index import ShardIndex

if TYPE_CHECKING:
    from shardload.plan import RankPlan
    from shardload.sets.mixture import MixedSets
    from shardload.sets.shardset import ShardSet

__all__ = ["Prefetcher", "check_step_fits", "read_order", "read_orders", "start_prefetch"]

logger = get_logger("shardload.remote")


def read_order(
    sample_ids: NDArray[np.int64], batch_offsets: NDArray[np.int64], index: ShardIndex
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(sequence, starts)``: each batch's distinct shards by first use, batch after batch, and where each starts.

    ``sample_ids`` are the plan's, batch after batch, batch ``i`` at ``batch_offsets[i]:batch_offsets[i + 1]``;
    its shards are ``sequence[starts[i]:starts[i + 1]]``.
    """
    num_batches = len(batch_offsets) - 1
    if len(sample_ids) == 0:
        return np.zeros(0, np.int64), np.zeros(num_batches + 1, np.int64)
    shards = index.locate(sample_ids)[0]
    batch = np.repeat(np.arange(num_batches, dtype=np.int64), np.diff(batch_offsets))
    _, first = np.unique(batch * index.num_shards + shards, return_index=True)
    first.sort()
    starts = np.searchsorted(batch[first], np.arange(num_batches + 1), side="left").astype(np.int64)
    return shards[first].astype(np.int64), starts


def check_step_fits(remote: RemoteSet, sequence: NDArray[np.int64], starts: NDArray[np.int64], readers: int) -> None:
    """Refuse a cache limit below what one step of the node holds at once.

    A batch's shards stay cached while it is built, and ``readers`` processes of the node build one each.
    They hold at most every shard of the set, once each: a limit of at least the set's total bytes always fits.

    Raises:
        PlanError: naming the cache limit and the bytes one step needs.
    """
    limit = remote.options.limit
    if limit is None or len(starts) < 2:
        return
    # bytes of each batch's shards from cumulative sums: a batch that reads none of this set's shards counts 0
    total = np.concatenate([[0], np.cumsum(remote._sizes[sequence], dtype=np.int64)])
    worst = int(np.diff(total[starts]).max())
    # readers holding the same shard share one cached copy, so a step never needs more than the whole set
    whole = int(remote._sizes.sum())
    need = min(worst * readers, whole)
    if need > limit:
        capped = f", capped at the whole set's {whole:,} bytes" if need < worst * readers else ""
        raise PlanError(
            f"{remote.url}: the cache limit ({limit:,} bytes) is below what one step needs: a batch touches up "
            f"to {worst:,} bytes of shards, times {readers} batch(es) read at once on this node (workers x ranks "
            f"per node) = {worst * readers:,} bytes{capped}. Raise cache_limit, or read with fewer workers."
        )


class Prefetcher:
    """Downloads one remote set's shards ahead of this rank, in read order (a daemon thread).

    ``sequence`` and ``starts`` are :func:`read_order`'s, restricted to this set (local shard ids). After
    :meth:`advance` it keeps the next ``ahead_bytes`` of distinct shards downloaded, ``prefetch_downloads`` at
    once. A failed prefetch is left to the reader, which fetches the shard itself and raises.
    """

    def __init__(self, remote: RemoteSet, sequence: NDArray[np.int64], starts: NDArray[np.int64]) -> None:
        self.remote = remote
        self.sequence = sequence
        self.starts = starts
        self._position = 0
        self._changed = threading.Condition()
        self._stop = False
        self._pool = ThreadPoolExecutor(max(1, remote.options.prefetch_downloads), thread_name_prefix="shardload-get")
        self._running: dict[int, Future[bool]] = {}
        self._refused: set[int] = set()  # no room for these now: retried when the rank moves on
        remote.publish_sequence(sequence)
        self._thread = threading.Thread(target=self._run, name="shardload-prefetch", daemon=True)
        self._thread.start()

    def advance(self, batch: int) -> None:
        """The rank now reads batch ``batch`` (of the plan this prefetcher was made for)."""
        position = int(self.starts[min(max(batch, 0), len(self.starts) - 1)])
        if position != self._position:
            with self._changed:
                self._position = position
                self._refused.clear()
                self._changed.notify()
            with contextlib.suppress(OSError):
                self.remote.publish_position(position)

    def stop(self, *, wait: bool = True) -> None:
        """Stop downloading ahead; the published order is withdrawn and the downloads not begun are dropped.

        ``wait``: return once the downloads under way have ended (before a fork: no download thread may run
        across it). Without, they end by themselves, within their client's timeouts and the retry policy;
        calling ``stop()`` again waits for them.
        """
        with self._changed:
            self._stop = True
            self._changed.notify()
        self._thread.join()
        self._pool.shutdown(wait=wait, cancel_futures=True)
        self.remote.unpublish()

    def _wanted(self) -> list[int]:
        """The distinct shards from the rank's position on, up to ``ahead_bytes`` (the first always)."""
        budget, seen, out = self.remote.options.ahead_bytes, set(), list[int]()
        for shard in self.sequence[self._position :].tolist():
            if shard in seen:
                continue
            seen.add(shard)
            budget -= int(self.remote._sizes[shard])
            if budget < 0 and out:
                break
            out.append(shard)
        return out

    def _run(self) -> None:
        limit = max(1, self.remote.options.prefetch_downloads)
        while True:
            with self._changed:
                if self._stop:
                    return
                wanted = self._wanted()
            for shard, fut in list(self._running.items()):
                if fut.done():
                    del self._running[shard]
                    if fut.exception() is not None or not fut.result():
                        self._refused.add(shard)
            for shard in wanted:
                if len(self._running) >= limit:
                    break
                if shard in self._running or shard in self._refused or self.remote.cached(shard):
                    continue
                self._running[shard] = self._pool.submit(self._fetch, shard)
            with self._changed:
                if not self._stop:
                    self._changed.wait(0.05)

    def _fetch(self, shard: int) -> bool:
        try:
            return self.remote.download(shard, urgent=False)
        except Exception as exc:  # noqa: BLE001  the reader fetches it again and reports the error
            logger.debug("prefetch of shard %d of %s failed: %s", shard, self.remote.url, exc)
            return False


#: what a rank reads of each remote set this epoch: (remote set, local shard order, batch starts in it)
ReadOrders = list[tuple[RemoteSet, NDArray[np.int64], NDArray[np.int64]]]


def split_order(
    remotes: Sequence[tuple[RemoteSet, int, int]],
    sequence: NDArray[np.int64],
    starts: NDArray[np.int64],
    readers: int,
) -> ReadOrders:
    """Each remote set's part of a (possibly mixed) read order, checked against its cache limit.

    ``remotes`` holds ``(remote set, first global shard, shards)`` of each remote set read.
    """
    batch_of = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    out: ReadOrders = []
    for remote, first, count in remotes:
        mine = (sequence >= first) & (sequence < first + count)
        local = sequence[mine] - first
        local_starts = np.searchsorted(batch_of[mine], np.arange(len(starts)), side="left").astype(np.int64)
        check_step_fits(remote, local, local_starts, readers)
        out.append((remote, local, local_starts))
    return out


def start_prefetch(orders: ReadOrders) -> list[Prefetcher]:
    """One running :class:`Prefetcher` per remote set (none where ``prefetch_downloads`` is 0); call after the fork."""
    return [Prefetcher(remote, seq, starts) for remote, seq, starts in orders if remote.options.prefetch_downloads]


def local_ranks() -> int:
    """Ranks of this job on this node (``LOCAL_WORLD_SIZE``, set by torchrun; else 1)."""
    text = os.environ.get(envvars.LOCAL_WORLD_SIZE, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else 1


def read_orders(read: ShardSet | MixedSets, plan: RankPlan, workers: int) -> ReadOrders:
    """What this rank's ``plan`` reads of each remote set ``read`` holds (nothing for local sets).

    Raises:
        ShardSetChangedError: a remote set was re-prepared since it was opened.
        PlanError: a cache limit below what one step of the node needs (:func:`check_step_fits`).
    """
    from shardload.sets.mixture import MixedSets

    sets = read.sets if isinstance(read, MixedSets) else (read,)
    firsts = read.shard_offsets.tolist() if isinstance(read, MixedSets) else [0]
    remotes = [(s.remote, int(f), len(s.shards)) for s, f in zip(sets, firsts) if s.remote is not None]
    if not remotes:
        return []
    for remote, _, _ in remotes:  # one HEAD each: a re-prepared set is noticed even when every shard is cached
        remote.check_unchanged()
    sequence, starts = read_order(plan.sample_ids, plan.batch_offsets, read.index)
    return split_order(remotes, sequence, starts, max(1, workers) * local_ranks())
