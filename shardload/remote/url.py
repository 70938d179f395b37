"""Telling a URL from a local path, and opening the filesystem that serves it.

Every entry point that takes a shard set (``shardload.open``, ``make_loader``,
``ShardDataModule``, ``inspect``, ``verify``, ``plan``, ``prepare -o``) asks
:func:`is_remote` first: a local path (``out/``, ``/data/set``,
``file:///data/set``) keeps the local code path untouched; anything else with a
scheme (``s3://``, ``gs://``, ``az://``, ``https://``) goes through fsspec.
"""

from __future__ import annotations

import os
import re
from typing import Any

from shardload.errors import MissingDependencyError

__all__ = ["is_remote", "join_url", "local_path", "open_filesystem"]

# "scheme://" with a scheme as RFC 3986 spells it; a Windows drive ("C:\\") has no "//"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: the package fsspec needs for each scheme, for the install hint
_PACKAGES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
}


def _scheme(path: str | os.PathLike[str]) -> str | None:
    if not isinstance(path, str):
        return None  # a Path is always local
    m = _SCHEME.match(path)
    return m.group(1).lower() if m else None


def is_remote(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names object storage rather than the local file system.

    >>> is_remote("s3://bucket/set"), is_remote("out/set"), is_remote("file:///data/set")
    (True, False, False)
    """
    scheme = _scheme(path)
    return scheme is not None and scheme not in ("file", "local")


def local_path(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``path`` without a ``file://`` prefix (a local path is returned as it is)."""
    if isinstance(path, str) and _scheme(path) in ("file", "local"):
        return path.split("://", 1)[1]
    return path


def join_url(url: str, *names: str) -> str:
    """``url`` with ``names`` appended, one ``/`` between each (``join_url("s3://b/set/", "a.arrow")``)."""
    out = url.rstrip("/")
    for name in names:
        out = f"{out}/{name.strip('/')}"
    return out


def open_filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem serving ``url`` and the path of ``url`` on it.

    Credentials and endpoints come the standard way for each filesystem (the
    environment, config files, instance metadata) or from ``storage_options``
    (for S3: ``{"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}``).

    Raises:
        MissingDependencyError: fsspec, or the package of this scheme (s3fs, gcsfs, adlfs,
            aiohttp for HTTP), is not installed; the message gives the ``pip install`` line.
    """
    scheme = _scheme(url) or "file"
    try:
        import fsspec
    except ImportError as exc:
        raise MissingDependencyError(
            f"reading {url} needs fsspec: pip install 'shardload[remote]' (S3 and HTTP included)"
        ) from exc
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as exc:
        package = _PACKAGES.get(
            scheme, "aiohttp" if scheme in ("http", "https") else f"the fsspec backend of {scheme}://"
        )
        raise MissingDependencyError(
            f"reading {url} needs {package}: pip install {package} (or 'shardload[remote]' for S3 and HTTP)"
        ) from exc
    except ValueError as exc:  # fsspec: "Protocol not known"
        raise MissingDependencyError(
            f"{url}: fsspec knows no filesystem for {scheme}:// ({exc}); use s3://, gs://, az:// or https://"
        ) from exc
    return fs, path
