"""How a remote shard set is reached and cached: one small frozen object, :class:`RemoteOptions`.

Given to ``shardload.open(url, ...)`` as keywords, or as ``remote=`` to the loaders, ``Mixture.open``
and ``verify``; it travels to the workers with the opened set. docs/remote.md, "Options".
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from shardload._base import envvars
from shardload._base.checks import check_real, check_scalar
from shardload._base.envvars import env_int
from shardload._base.redact import redact_options
from shardload.errors import InputError
from shardload.remote.retry import RetryPolicy

__all__ = ["ENV_CACHE_DIR", "ENV_CACHE_LIMIT", "RemoteOptions", "default_cache_dir"]

#: the node-local cache directory (default: ``$XDG_CACHE_HOME/shardload``, else ``~/.cache/shardload``)
ENV_CACHE_DIR = envvars.CACHE_DIR
#: the most bytes of shards one set keeps in the cache (default: no limit); sizes such as ``200GiB``
ENV_CACHE_LIMIT = envvars.CACHE_LIMIT
#: downloads the prefetcher runs at once, per rank
PREFETCH_DOWNLOADS = 4
#: bytes of shards the prefetcher fetches ahead of the rank, unless the cache limit is lower (half of it then)
PREFETCH_BYTES = 2 << 30
#: the longest ``wait_timeout``, in seconds (a week): longer is a hang with extra steps
MAX_WAIT = 7 * 24 * 3600.0


def default_cache_dir() -> Path:
    """``$SHARDLOAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/shardload``, else ``~/.cache/shardload``."""
    given = os.environ.get(ENV_CACHE_DIR, "").strip()
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get(envvars.XDG_CACHE_HOME, "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "shardload"


@dataclass(frozen=True, repr=False)
class RemoteOptions:
    """Storage credentials, the node cache and the prefetcher of a remote shard set.

    Attributes:
        storage_options: keywords of the fsspec filesystem (for S3: ``key``, ``secret``,
            ``client_kwargs={"endpoint_url": ...}``); ``None``: the standard environment
            (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS``, ...).
        cache_dir: the node-local cache (default :func:`default_cache_dir`).
        cache_limit: the most bytes of shards one set keeps in the cache (default
            ``$SHARDLOAD_CACHE_LIMIT``, else no limit); the shards whose next use is farthest go first.
        prefetch_downloads: downloads the prefetcher of one rank runs at once (0: no prefetch).
        prefetch_bytes: bytes of shards fetched ahead of the rank (default 2 GiB, or half the cache limit).
        wait_timeout: seconds a process waits for another one's download of the same shard, or for the
            downloads under way into a full cache, before it gives up with an error naming the shard.
        retry: tries and backoff of every storage call (default :class:`RetryPolicy`).
    """

    storage_options: Mapping[str, Any] | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | None = None
    prefetch_downloads: int = PREFETCH_DOWNLOADS
    prefetch_bytes: int | None = None
    wait_timeout: float = 900.0
    retry: RetryPolicy | None = field(default=None)

    def __post_init__(self) -> None:
        """Every field checked at once: a misused one is an :class:`InputError` naming it and what it takes."""
        if self.storage_options is not None:
            if not isinstance(self.storage_options, Mapping):
                raise InputError(
                    f"RemoteOptions.storage_options must be a dict of the filesystem's keywords, got "
                    f"{type(self.storage_options).__name__}"
                )
            object.__setattr__(self, "storage_options", dict(self.storage_options))
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise InputError(
                f"RemoteOptions.cache_dir must be a directory path, got {self.cache_dir!r} "
                f"({type(self.cache_dir).__name__})"
            )
        if self.cache_limit is not None:
            hint = "bytes, or None for no limit"
            check_scalar(
                "RemoteOptions.cache_limit", self.cache_limit, low=1, high=1 << 62, hint=hint, error=InputError
            )
        check_scalar("RemoteOptions.prefetch_downloads", self.prefetch_downloads, low=0, high=256, error=InputError)
        if self.prefetch_bytes is not None:
            check_scalar("RemoteOptions.prefetch_bytes", self.prefetch_bytes, low=0, high=1 << 62, error=InputError)
        check_real(
            "RemoteOptions.wait_timeout", self.wait_timeout, low=1e-3, high=MAX_WAIT, hint="seconds", error=InputError
        )
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise InputError(
                f"RemoteOptions.retry must be a shardload.remote.RetryPolicy or None, got {type(self.retry).__name__}"
            )

    def __repr__(self) -> str:
        """The fields as the dataclass shows them, with the values of secret-like storage options masked."""
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        shown["storage_options"] = redact_options(self.storage_options)
        return f"RemoteOptions({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @property
    def directory(self) -> Path:
        """The cache directory to use."""
        return Path(self.cache_dir).expanduser() if self.cache_dir is not None else default_cache_dir()

    def directory_setting(self) -> str:
        """The setting that chose :attr:`directory`, and its value, for messages."""
        if self.cache_dir is not None:
            return f"cache_dir={str(self.cache_dir)!r} (--cache-dir on the command line)"
        given = os.environ.get(ENV_CACHE_DIR, "").strip()
        if given:
            return f"${ENV_CACHE_DIR}={given!r}"
        xdg = os.environ.get(envvars.XDG_CACHE_HOME, "").strip()
        if xdg:
            return f"the default, $XDG_CACHE_HOME/shardload with ${envvars.XDG_CACHE_HOME}={xdg!r}"
        return "the default, ~/.cache/shardload"

    def make_directory(self, path: Path) -> None:
        """Create ``path``, inside :attr:`directory`, if need be; refuse a cache the process cannot write to.

        Raises:
            InputError: naming the setting that chose the cache directory, its value, what is in the way
                (a file, no permission, a read-only file system) and what to do.
        """
        try:
            path.mkdir(parents=True, exist_ok=True)
            if not os.access(path, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "not writable by this process")
        except OSError as exc:
            raise InputError(
                f"the node cache {self.directory} ({self.directory_setting()}) cannot be used: "
                f"{_obstacle(path, exc)}. Set it to a directory this process can write to, on this node's "
                f"local disk (cache_dir=, --cache-dir or ${ENV_CACHE_DIR})."
            ) from None

    @property
    def limit(self) -> int | None:
        """The cache limit in bytes (``None``: no limit)."""
        if self.cache_limit is not None:
            return self.cache_limit
        value = env_int(ENV_CACHE_LIMIT, 0, minimum=1, size=True, error=InputError)
        return value or None

    @property
    def ahead_bytes(self) -> int:
        """Bytes the prefetcher fetches ahead: :attr:`prefetch_bytes`, else 2 GiB or half the limit."""
        if self.prefetch_bytes is not None:
            return self.prefetch_bytes
        limit = self.limit
        return PREFETCH_BYTES if limit is None else min(PREFETCH_BYTES, limit // 2)

    @property
    def policy(self) -> RetryPolicy:
        return self.retry or RetryPolicy()


def _obstacle(path: Path, exc: OSError) -> str:
    """Why ``path`` cannot be made or written: the file in the way, if one is, else the system's reason."""
    for p in (path, *path.parents):
        if p.is_symlink() and not p.exists():
            return f"{p} is a broken symbolic link"
        if p.exists():
            if not p.is_dir():
                return f"{p} is a file, not a directory"
            break
    return f"{exc.filename or path}: {exc.strerror or exc}"
