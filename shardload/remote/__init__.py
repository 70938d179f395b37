"""Shard sets in object storage (S3, GCS, Azure, HTTP): the storage layer below the shard set.

A remote set is read through fsspec and the scheme's filesystem package, an optional extra
(``pip install "shardload[remote]"``). Nothing above this layer changes: a shard is downloaded
whole into a node-local cache (:mod:`.cache`), checked against the manifest's sha256, renamed
into place, then memory-mapped as a shard of a local set. docs/remote.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardload.remote.options import RemoteOptions
from shardload.remote.retry import RetryPolicy, is_transient, with_retries
from shardload.remote.url import is_remote, join_url, open_filesystem

__all__ = ["RemoteOptions", "RetryPolicy", "is_remote", "is_transient", "join_url", "open_filesystem", "with_retries"]


if not TYPE_CHECKING:  # hidden from type checkers, which would take any attribute as this one's

    def __getattr__(name: str) -> object:
        """A submodule of 0.1.0 that moved (``shardload.remote.prefetch``), as before an attribute of this package."""
        from shardload._compat import moved_attribute

        return moved_attribute(__name__, name)
