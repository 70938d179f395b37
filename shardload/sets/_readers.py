"""The shards one process holds open for a :class:`~shardload.sets.shardset.ShardSet`: a bounded reader pool.

See docs/loading.md, "Open files per process"; the checks of each shard's file are
:mod:`shardload.sets._integrity`'s.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from shardload._base.identity import FileStamp
from shardload._base.setfiles import reason_of
from shardload.errors import ShardSetError
from shardload.formats import ShardReader
from shardload.sets._integrity import FileChecks

if TYPE_CHECKING:
    from shardload.remote.cache import RemoteSet

T = TypeVar("T")


class ReaderPool:
    """The open readers of one shard set in this process, least recently used first.

    At most ``limit`` are kept open; ``remote``, the node cache of a remote set, holds each shard while it is
    open here. Pickled empty: a worker process maps the shards it reads itself.
    """

    def __init__(self, limit: int, checks: FileChecks, remote: RemoteSet | None) -> None:
        self.limit = limit
        self.checks = checks
        self.remote = remote
        self.readers: OrderedDict[int, ShardReader] = OrderedDict()
        self.stamps: dict[int, FileStamp] = {}  # stamp of each open shard when it was mapped
        self.opened: set[int] = set()  # every shard opened in this process, closed since or not
        self.pid = os.getpid()  # the process the open readers belong to (see forget_inherited)

    def __len__(self) -> int:
        return len(self.readers)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "readers": OrderedDict(), "stamps": {}, "opened": set()}

    def get(self, shard: int) -> ShardReader | None:
        """The open reader of ``shard``, its file checked unchanged (``None``: not open in this process)."""
        if self.remote is not None and self.pid != os.getpid():
            self.forget_inherited()
        reader = self.readers.get(shard)
        if reader is not None:
            self.check_stamp(shard, reader)  # before any page of a possibly truncated file is touched
            self.readers.move_to_end(shard)
        return reader

    def check_stamp(self, shard: int, reader: ShardReader) -> None:
        """Raise :class:`~shardload.errors.ShardSetChangedError` if open shard ``shard``'s file changed."""
        old = self.stamps.get(shard)
        if old is not None:
            self.stamps[shard] = self.checks.check_stamp(shard, reader, old)

    def check_unchanged(self, shards: Iterable[int]) -> None:
        """:meth:`check_stamp` of each of ``shards`` that is open."""
        for shard in shards:
            reader = self.readers.get(shard)
            if reader is not None:
                self.check_stamp(shard, reader)

    def add(self, shard: int, reader: ShardReader, stamp: FileStamp) -> None:
        """Hold ``reader``, just opened and checked, as shard ``shard``'s."""
        self.readers[shard] = reader
        self.stamps[shard] = stamp
        self.opened.add(shard)

    def forget_inherited(self) -> None:
        """In a process forked from the one that mapped shards (a loader worker): let go of its copies.

        Of a remote set only: the node cache deletes a shard once no process holds it, but the worker's
        copies of its parent's mappings and descriptors would keep the deleted file's space in use for as
        long as the worker lives. The worker closes its copies (the parent's locks and mappings stay as they
        are) and maps what it reads under locks of its own.
        """
        self.pid = os.getpid()
        readers, self.readers = self.readers, OrderedDict()
        self.stamps = {}
        for reader in readers.values():
            reader.close()
        if self.remote is not None:
            self.remote.forget_inherited()

    def make_room(self, shard: int) -> None:
        """Close shards until ``shard`` can be opened within ``limit`` (and a bounded node cache's limit)."""
        self.evict(self.limit - 1)
        if self.remote is None or self.remote.options.limit is None:
            return
        # Without this, random access (``ds[i]`` over every shard) would keep shards open that only this
        # process holds and then wait ``wait_timeout`` for room that it alone keeps taken.
        shards = self.checks.manifest.shards
        held = sum(shards[k].bytes for k in self.readers)
        while self.readers and held + shards[shard].bytes > self.remote.options.limit:
            oldest = next(iter(self.readers))
            held -= shards[oldest].bytes
            self.close_shard(oldest)

    def room_for(self, attempt: Callable[[], T]) -> T:
        """``attempt()``; if it runs out of file descriptors, close the older half of the open shards and retry once."""
        try:
            return attempt()
        except ShardSetError as exc:
            if reason_of(exc) != "fd_limit" or not self.readers:
                raise
        self.evict(len(self.readers) // 2)  # free descriptors of our own, then try once more
        return attempt()

    def evict(self, keep: int) -> None:
        """Close the least recently used shards until at most ``keep`` stay open.

        Closing releases the file descriptor; arrays already handed out keep
        their memory mapping alive until they are freed, so they stay valid.
        """
        while len(self.readers) > max(keep, 0):
            self.close_shard(next(iter(self.readers)))

    def close_shard(self, shard: int) -> None:
        reader = self.readers.pop(shard)
        self.stamps.pop(shard, None)  # a reopen stamps (and checks) the file afresh
        reader.close()
        if self.remote is not None:
            self.remote.release(shard)  # the node cache may evict it now

    def release_others(self, shards: Iterable[int]) -> None:
        """Close every open shard but ``shards`` when the remote set's cache is bounded (else nothing)."""
        if self.remote is None or self.remote.options.limit is None:
            return
        keep = set(shards)
        for shard in [s for s in self.readers if s not in keep]:
            self.close_shard(shard)

    def close(self) -> None:
        """Close every open shard."""
        for shard in list(self.readers):
            self.close_shard(shard)
