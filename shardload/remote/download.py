"""Downloading one shard into its ``.part`` file, continuing a try cut midway from the bytes received.

Called by :class:`~shardload.remote.cache.RemoteSet`, which holds the shard's lock and then checks
the part's size and sha256: that check decides, this module only makes a cut try cheaper. The rules:
docs/remote.md, "The node cache" ("A download cut midway"). A continuation that cannot be trusted
(size not the manifest's, ranges ignored, no seek, the object changed) restarts from byte 0 with no
range; a download ends after at most ``policy.tries * (size / CHUNK + 2)`` tries.
"""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Any

from shardload.remote.retry import RetryPolicy, with_retries

__all__ = ["CHUNK", "fetch_to"]

#: bytes asked for (and held in memory) by each ranged read of a continuation
CHUNK = 8 << 20
#: a continuation try that appended nothing halves the reads of the next, down to CHUNK / this (256 KiB)
MIN_CHUNK_DIVISOR = 32


class _Restart(Exception):
    """The continuation cannot be trusted to append the right bytes: download from byte 0 instead."""


def _expired_errors() -> tuple[type[BaseException], ...]:
    """fsspec's error for an object that changed while a file of it was open (its ETag differs)."""
    try:
        from fsspec.exceptions import FileExpired
    except ImportError:  # pragma: no cover  an fsspec without it
        return ()
    return (FileExpired,)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class _Download:
    """The state of one :func:`fetch_to` call across its tries."""

    def __init__(self, fs: Any, remote_path: str, part: Path, size: int, ranges: bool) -> None:
        self.fs, self.remote, self.part, self.size = fs, remote_path, part, size
        self.tries = 0
        self.ranges = ranges  # False once the server was seen ignoring a range
        self.chunk = CHUNK  # bytes per ranged read, halved after a continuation that appended nothing
        self.whole_kw: dict[str, Any] = {}
        with contextlib.suppress(AttributeError, TypeError, ValueError):  # not an async filesystem, or no signature
            if "max_concurrency" in inspect.signature(fs._get_file).parameters:
                self.whole_kw["max_concurrency"] = 1  # one stream, written in order (s3fs, adlfs)

    def progress(self) -> int:
        """How many :data:`CHUNK`-byte pieces the part has reached (a piece begun counts; capped at the end).

        In chunks, not bytes, so the policy's count restarts at most ``size / CHUNK + 1`` times.
        """
        return -(-min(_size(self.part), self.size) // CHUNK)

    def attempt(self) -> None:
        """One try: the whole object on the first, else a continuation where it can be trusted."""
        self.tries += 1
        have = _size(self.part)
        if self.tries > 1 and self.ranges and 0 < have < self.size:
            try:
                self._continue(have)
                return
            except _Restart:
                self.ranges = False  # restart, and this download asks for no range again
            except Exception:
                if _size(self.part) == have:  # not one read of this try arrived: ask for fewer bytes next
                    self.chunk = max(self.chunk // 2, CHUNK // MIN_CHUNK_DIVISOR, 1)
                raise
        self.fs.get_file(self.remote, str(self.part), **self.whole_kw)

    def _continue(self, have: int) -> None:
        """Append the object's bytes from ``have`` on to the part, ``self.chunk`` bytes per ranged read.

        Raises:
            _Restart: the object's size is not the manifest's, ranges are not honoured, the file
                cannot seek, or the object changed meanwhile.
        """
        try:
            with self.fs.open(self.remote, "rb", block_size=self.chunk, cache_type="none") as src:
                if getattr(src, "size", None) != self.size:
                    raise _Restart  # not the manifest's object (or a size the server does not give)
                src.seek(have)
                with open(self.part, "ab") as out:
                    while have < self.size:
                        want = min(self.chunk, self.size - have)
                        data = src.read(want)
                        if len(data) > want:  # a server that ignored the range: never append a whole body
                            raise _Restart
                        if not data:
                            return  # the object ended early: the caller's size check says so
                        out.write(data)
                        have += len(data)
        except ValueError as exc:  # fsspec: "doesn't appear to support range requests", "Cannot seek"
            raise _Restart from exc
        except _expired_errors() as exc:
            raise _Restart from exc


def fetch_to(
    fs: Any, remote_path: str, part: Path, size: int, *, url: str, what: str, policy: RetryPolicy, ranges: bool = True
) -> None:
    """Download ``remote_path`` of ``fs`` into ``part`` (rewritten from byte 0), continuing cut tries.

    A continuation never reads past ``size`` (the manifest's). ``ranges=False`` restarts each try
    from byte 0 (the download after a mismatch: a proxy answering ranges wrongly must not spoil it).

    Raises:
        RemoteError: ``policy.tries`` tries in a row failed without getting further, or the store
            answered with an error another try would not change.
        RemoteAccessError: the credentials were refused.
        FileNotFoundError: the object does not exist.
    """
    with open(part, "wb"):
        pass  # a new download starts from byte 0, whatever an earlier one left
    job = _Download(fs, remote_path, part, size, ranges)
    with_retries(job.attempt, url=url, what=what, policy=policy, progress=job.progress)
