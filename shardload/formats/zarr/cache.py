"""A per-process cache of decoded Zarr chunks, bounded in bytes, evicting by second chance.

Neighbouring samples share a chunk: without a cache a batch would decompress it once per sample.
Every Zarr reader of a process shares one :class:`ChunkCache` unless given its own, bounded by
``SHARDLOAD_ZARR_CACHE_BYTES`` (default 64 MiB, ``0``: off) or :func:`set_chunk_cache_bytes`.
docs/format.md, "How shardload reads a Zarr shard".
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

from shardload._base import envvars
from shardload._base.envvars import env_int
from shardload.errors import InputError

DEFAULT_CACHE_BYTES = 64 << 20
CACHE_ENV = envvars.ZARR_CACHE_BYTES

_caches: weakref.WeakSet[ChunkCache] = weakref.WeakSet()


#: chunk numbers take the low bits of an array's integer keys (:meth:`ChunkCache.table`)
_CHUNK_BITS = 40


class ChunkTable:
    """The chunks of one array that its cache holds now, by chunk number: the gather's fast path.

    ``slots[c]`` is chunk ``c`` while cached, else ``None``; ``used[c]`` is set when a batch used it and
    cleared when eviction passes over it. Reading ``slots`` takes no lock: a chunk stays valid once evicted.
    """

    __slots__ = ("slots", "used")

    def __init__(self, chunks: int) -> None:
        self.slots: list[np.ndarray | None] = [None] * chunks
        self.used = np.zeros(chunks, dtype=np.uint8)

    def grow(self, chunks: int) -> None:
        """Make room for ``chunks`` chunks, in place (a reader holding this table keeps seeing it)."""
        if chunks > len(self.slots):
            self.slots.extend([None] * (chunks - len(self.slots)))
            self.used = np.concatenate([self.used, np.zeros(chunks - len(self.used), dtype=np.uint8)])


class ChunkCache:
    """Decoded chunks by key, at most ``max_bytes`` in all, the oldest unused since last passed over evicted first.

    Second chance (CLOCK): chunks are kept in load order, and one used since eviction last passed
    over it goes to the back instead; marking it used is one store in its array's :class:`ChunkTable`.
    A chunk larger than the whole bound is returned but not kept. Cached arrays are read-only
    (every reader of the process shares them). ``hits`` counts chunks found, ``loads`` chunks decoded.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise InputError(f"the chunk cache bound must be at least 0 bytes, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.nbytes = 0
        self.hits = 0
        self.loads = 0
        self._chunks: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        # Each array's name, base key and chunk table, kept while a reader uses the table or chunks of the
        # array are cached (so a process that reads many shards in turn does not keep one per shard ever read).
        self._spaces: dict[Hashable, int] = {}  # name -> base key
        self._names: dict[int, Hashable] = {}  # base key -> name
        self._tables: dict[int, ChunkTable] = {}  # base key -> table, while a reader holds it
        self._users: dict[int, int] = {}  # base key -> readers holding its table
        self._counts: dict[int, int] = {}  # base key -> chunks cached under it
        self._next_space = 1
        self._lock = threading.Lock()
        _caches.add(self)

    def table(self, name: Hashable, chunks: int) -> tuple[int, ChunkTable]:
        """The base key and the :class:`ChunkTable` of array ``name`` (one array of one file), of ``chunks`` chunks.

        Chunk ``c`` is cached under ``base + c``. The caller holds the table until :meth:`release`.
        """
        with self._lock:
            base = self._spaces.get(name)
            if base is None:
                base = self._next_space << _CHUNK_BITS
                self._next_space += 1
                self._spaces[name], self._names[base] = base, name
            table = self._tables.get(base)
            if table is None:
                table = self._tables[base] = ChunkTable(chunks)
            table.grow(chunks)
            self._users[base] = self._users.get(base, 0) + 1
            return base, table

    def release(self, base: int, *, drop: bool = False) -> None:
        """A reader is done with the table of ``base``: the last one drops it.

        Its cached chunks stay, by key (a reopened shard finds them), unless ``drop``.
        """
        with self._lock:
            users = self._users.get(base, 0) - 1
            if users > 0:
                self._users[base] = users
                return
            self._users.pop(base, None)
            table = self._tables.pop(base, None)
            if drop and table is not None:
                for c, chunk in enumerate(table.slots):
                    if chunk is not None and self._chunks.pop(base + c, None) is not None:
                        self.nbytes -= chunk.nbytes
                        self._counts[base] -= 1
            if not self._counts.get(base):
                self._forget(base)

    def _forget(self, base: int) -> None:
        """No table and no chunk under ``base`` any more: drop its name (the lock held)."""
        self._spaces.pop(self._names.pop(base, None), None)
        self._counts.pop(base, None)

    def _slot(self, key: Hashable) -> tuple[int, ChunkTable | None, int]:
        """The base key, the table (if held) and the chunk number of ``key``; base -1 for a key of no array."""
        if type(key) is not int:
            return -1, None, 0
        base, c = key >> _CHUNK_BITS << _CHUNK_BITS, key & ((1 << _CHUNK_BITS) - 1)
        if base not in self._names:
            return -1, None, 0
        table = self._tables.get(base)
        return (base, table, c) if table is not None and c < len(table.slots) else (base, None, 0)

    def get(self, key: Hashable, load: Callable[[], np.ndarray]) -> np.ndarray:
        """The chunk under ``key``, decoded by ``load()`` when it is not cached."""
        with self._lock:
            chunk = self._chunks.get(key)
            if chunk is not None:
                _, table, c = self._slot(key)
                if table is not None:  # the table may be new (its shard reopened): it gets the chunk back
                    table.slots[c] = chunk
                    table.used[c] = 1
                self.hits += 1
                return chunk
        # Decode outside the lock: other threads keep reading cached chunks meanwhile.
        chunk = load()
        chunk.flags.writeable = False
        with self._lock:
            self.loads += 1
            if chunk.nbytes > self.max_bytes or key in self._chunks:
                return chunk
            self._chunks[key] = chunk
            self.nbytes += chunk.nbytes
            base, table, c = self._slot(key)
            if base >= 0:
                self._counts[base] = self._counts.get(base, 0) + 1
            if table is not None:
                table.slots[c] = chunk
                table.used[c] = 1
            self._evict()
        return chunk

    def _evict(self) -> None:
        """Evict until the cache fits its bound (the lock held)."""
        while self.nbytes > self.max_bytes and self._chunks:
            key, old = self._chunks.popitem(last=False)
            base, table, c = self._slot(key)
            if table is not None and table.used[c]:
                table.used[c] = 0  # its second chance: to the back, unmarked
                self._chunks[key] = old
                continue
            if table is not None:
                table.slots[c] = None
            self.nbytes -= old.nbytes
            if base >= 0:
                self._counts[base] -= 1
                if not self._counts[base] and base not in self._users:
                    self._forget(base)

    def resize(self, max_bytes: int) -> None:
        """Change the bound, evicting chunks until the cache fits."""
        if max_bytes < 0:
            raise InputError(f"the chunk cache bound must be at least 0 bytes, got {max_bytes}")
        with self._lock:
            self.max_bytes = int(max_bytes)
            self._evict()

    def clear(self) -> None:
        """Drop every chunk and reset the counters."""
        with self._lock:
            self._chunks.clear()
            for table in self._tables.values():
                table.slots[:] = [None] * len(table.slots)
                table.used[:] = 0
            self._counts.clear()
            for base in [b for b in self._names if b not in self._users]:
                self._forget(base)
            self.nbytes = self.hits = self.loads = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def _after_fork(self) -> None:
        # A thread of the parent may have held the lock at the fork (even in the middle of an eviction):
        # the child starts with a free lock and totals recounted from the chunks it holds.
        self._lock = threading.Lock()
        self.nbytes = sum(chunk.nbytes for chunk in self._chunks.values())
        counts: dict[int, int] = {}
        for key in self._chunks:
            base, _, _ = self._slot(key)
            if base >= 0:
                counts[base] = counts.get(base, 0) + 1
        self._counts = counts


_shared: ChunkCache | None = None


def chunk_cache() -> ChunkCache:
    """The cache shared by this process's Zarr readers (created on first use)."""
    global _shared
    if _shared is None:
        _shared = ChunkCache(_bytes_from_env())
    return _shared


def set_chunk_cache_bytes(max_bytes: int) -> None:
    """Bound the shared cache to ``max_bytes`` (``0``: no caching)."""
    chunk_cache().resize(max_bytes)


def _bytes_from_env() -> int:
    return env_int(CACHE_ENV, DEFAULT_CACHE_BYTES, minimum=0, size=True, error=InputError)


def _reset_locks_after_fork() -> None:
    for cache in list(_caches):
        cache._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_after_fork)
