"""A per-process cache of decoded Zarr chunks, bounded in bytes.

Samples that sit next to each other in a shard share a chunk; without a cache
a batch of neighbours would decompress that chunk once per sample. Every
:class:`~shardload.formats.zarr.ZarrShardReader` of a process shares one
:class:`ChunkCache` (least recently used chunks are evicted first) unless it
is given its own.

The bound is ``SHARDLOAD_ZARR_CACHE_BYTES`` (bytes, default 64 MiB, ``0``
turns caching off), read when the shared cache is first used; change it
later with :func:`set_chunk_cache_bytes`. Each DataLoader worker is a process
with its own cache, so the total is the bound times the number of workers.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from functools import partial

import numpy as np

from shardload.envvars import env_int
from shardload.errors import InputError

DEFAULT_CACHE_BYTES = 64 << 20
CACHE_ENV = "SHARDLOAD_ZARR_CACHE_BYTES"

_caches: weakref.WeakSet[ChunkCache] = weakref.WeakSet()


class ChunkCache:
    """Decoded chunks by key, least recently used evicted first, at most ``max_bytes`` in all.

    A chunk larger than the whole bound is returned but not kept. Cached
    arrays are read-only, since every reader of the process shares them.

    Attributes:
        max_bytes: the bound on the bytes of the chunks held.
        nbytes: bytes held now.
        hits: lookups answered from the cache.
        loads: chunks decoded (cache misses).
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise InputError(f"the chunk cache bound must be at least 0 bytes, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.nbytes = 0
        self.hits = 0
        self.loads = 0
        self._chunks: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        _caches.add(self)

    def get(self, key: Hashable, load: Callable[[], np.ndarray]) -> np.ndarray:
        """The chunk under ``key``, decoded by ``load()`` when it is not cached."""
        with self._lock:
            chunk = self._chunks.get(key)
            if chunk is not None:
                self._chunks.move_to_end(key)
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
            while self.nbytes > self.max_bytes:
                _, old = self._chunks.popitem(last=False)
                self.nbytes -= old.nbytes
        return chunk

    def get_many(self, keys: Sequence[Hashable], load: Callable[[int], np.ndarray]) -> list[np.ndarray]:
        """The chunks under ``keys``, in order; ``load(i)`` decodes ``keys[i]`` when it is not cached.

        One lock taken for all the cached ones (a batch's gather asks for every
        chunk it touches at once); the missing ones go through :meth:`get`.
        """
        with self._lock:
            found = [self._chunks.get(key) for key in keys]
            for key, chunk in zip(keys, found):
                if chunk is not None:
                    self._chunks.move_to_end(key)
            self.hits += sum(chunk is not None for chunk in found)
        return [
            self.get(key, partial(load, i)) if chunk is None else chunk
            for i, (key, chunk) in enumerate(zip(keys, found))
        ]

    def resize(self, max_bytes: int) -> None:
        """Change the bound, evicting chunks until the cache fits."""
        if max_bytes < 0:
            raise InputError(f"the chunk cache bound must be at least 0 bytes, got {max_bytes}")
        with self._lock:
            self.max_bytes = int(max_bytes)
            while self.nbytes > self.max_bytes:
                _, old = self._chunks.popitem(last=False)
                self.nbytes -= old.nbytes

    def clear(self) -> None:
        """Drop every chunk and reset the counters."""
        with self._lock:
            self._chunks.clear()
            self.nbytes = self.hits = self.loads = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def _after_fork(self) -> None:
        # A thread of the parent may have held the lock at the fork; the child starts with a free one.
        self._lock = threading.Lock()


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
