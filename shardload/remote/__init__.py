"""Shard sets in object storage (S3, GCS, Azure, HTTP): the storage layer below the shard set.

A remote set is read through `fsspec <https://filesystem-spec.readthedocs.io>`_
and the field's filesystem packages (``s3fs``, ``gcsfs``, ``adlfs``, HTTP), an
optional extra: ``pip install "shardload[remote]"``. Nothing above this layer
changes: a shard is downloaded whole into a node-local cache, checked against
the manifest's sha256, renamed into place, then memory-mapped exactly as a
shard of a local set.

Modules:
    url: telling a URL from a local path, and opening its filesystem.
    retry: which errors may pass, and retrying them with backoff and jitter.
    policy: which cached shards to evict, by the plan's read order (Belady's rule).
    options: RemoteOptions, the credentials, node cache and prefetch settings of a remote set.
    cache: the node-local cache (RemoteSet): a mirror of the set, shards downloaded once per node.
    download: one shard into its ``.part`` file, a try cut midway continued from the bytes received.
    prefetch: the plan-driven prefetcher of a rank's shards.
"""

from __future__ import annotations

from shardload.remote.options import RemoteOptions
from shardload.remote.retry import RetryPolicy, is_transient, with_retries
from shardload.remote.url import is_remote, join_url, open_filesystem

__all__ = ["RemoteOptions", "RetryPolicy", "is_remote", "is_transient", "join_url", "open_filesystem", "with_retries"]
