"""Telling a URL from a local path, and opening the filesystem that serves it.

Every entry point that takes a shard set (or an output) asks :func:`is_remote` first, which refuses
every URL form shardload cannot read, by name, before any request; a local one then goes through
:func:`local_path` (``file://`` URLs). :func:`normalize_url` is the one spelling of a URL the rest uses
(cache and staging directories too). The forms, decided once (docs/remote.md, "URLs"):

* a local path, or ``file:///abs/path`` (``file://localhost/...``; percent escapes decoded, as
  ``Path.as_uri()`` writes them, RFC 8089);
* ``s3://`` ``s3a://`` (s3fs), ``gs://`` ``gcs://`` (gcsfs), ``az://`` ``abfs://`` ``abfss://`` (adlfs),
  ``http://`` ``https://`` (fsspec's HTTP filesystem, aiohttp; ``user:password@`` is sent as Basic auth).

A query string or fragment is refused for every scheme: a set is a prefix under which shardload joins
file names, and a query (an S3 ``versionId``, a GCS ``generation``, a signature) belongs to one object.
Credentials before ``@`` in an ``s3://``/``gs://`` URL are refused too: s3fs and gcsfs read them as part
of the bucket name. Any other scheme, even one an installed fsspec backend serves, is refused, and so is
a port outside 0-65535 or an ``http://`` URL with no host (``http:///set``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from shardload._base import envvars
from shardload._base.redact import mask_storage_logs, register_secrets, register_url
from shardload.errors import MissingDependencyError, RemoteError

__all__ = [
    "CONNECT_TIMEOUT",
    "READ_TIMEOUT",
    "SCHEMES",
    "is_remote",
    "join_url",
    "local_path",
    "normalize_url",
    "open_filesystem",
]

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
    "http": "aiohttp",
    "https": "aiohttp",
}
#: the schemes of a URL shardload reads and writes, as messages list them (``local://`` is an alias of ``file://``)
SCHEMES = (*_PACKAGES, "file")
_LOCAL = ("file", "local")
#: schemes whose host part is a bucket name, in which s3fs and gcsfs would take ``user:password@`` as part of it
_BUCKETS = ("s3", "s3a", "gs", "gcs")
#: seconds the storage client (S3: botocore; HTTP(S): aiohttp) waits for a connection, and for each read of
#: an answer (its headers, then each piece of its body), before one try fails: a server that accepts and
#: then says nothing ends as a timeout, retried under the RetryPolicy (docs/remote.md, "Timeouts")
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 15.0
#: tries of s3fs's own loop inside each of ours: one, so that throttling (503 SlowDown) is retried with
#: our backoff only, not hammered by an inner loop; a shard download dropped midway is continued from the
#: bytes received by our next try (shardload.remote.download)
S3FS_RETRIES = 1


def _scheme(path: str | os.PathLike[str]) -> str | None:
    if not isinstance(path, str):
        return None  # a Path is always local
    m = _SCHEME.match(path)
    return m.group(1).lower() if m else None


def is_remote(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names object storage rather than the local file system.

    >>> is_remote("s3://bucket/set"), is_remote("out/set"), is_remote("file:///data/set")
    (True, False, False)

    Raises:
        RemoteError: ``path`` is a URL of a form shardload cannot use (module docstring): an unsupported
            scheme, a query string or fragment, credentials in an ``s3://``/``gs://`` URL, a ``file://``
            URL of another host. So every entry point refuses it the same way, before any request.
    """
    scheme = _scheme(path)
    if scheme is None:
        return False
    if scheme in _LOCAL:
        local_path(path)  # refused here if malformed, as a remote URL is
        return False
    normalize_url(str(path))
    return True


def local_path(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """The local path a ``file://`` URL names, by RFC 8089 (as ``Path.as_uri()`` writes it); any other path as it is.

    >>> local_path("file:///data/my%20set"), local_path("file://localhost/data/set"), local_path("out/set")
    ('/data/my set', '/data/set', 'out/set')

    Raises:
        RemoteError: a ``file://`` URL with a host other than ``localhost``, no path, a query or a fragment.
    """
    if not isinstance(path, str) or _scheme(path) not in _LOCAL:
        return path
    register_url(path)
    parts = urlsplit(path)
    _refuse_query(path, parts.query, parts.fragment)
    host = parts.netloc.rpartition("@")[2]  # never the user part: it may hold a password
    if host not in ("", "localhost"):
        raise RemoteError(
            f"{path}: names a file on host '{host}', and shardload reads this machine's files only; "
            f"write file:///ABSOLUTE/PATH (three slashes) for a path here, or mount that host's directory",
            path,
        )
    if "@" in parts.netloc:
        raise RemoteError(f"{path}: a file:// URL takes no user or password; write file:///ABSOLUTE/PATH", path)
    if not parts.path:
        raise RemoteError(f"{path}: names no path; write file:///ABSOLUTE/PATH", path)
    return unquote(parts.path)


def _refuse_query(url: str, query: str, fragment: str) -> None:
    """Refuse a ``?query`` or ``#fragment`` (even an empty one), saying what to write instead."""
    at_query, at_fragment = url.find("?"), url.find("#")
    if at_query < 0 and at_fragment < 0:
        return
    base = url[: min(i for i in (at_query, at_fragment) if i >= 0)]
    # urlsplit's rule: a "?" before any "#" starts the query, a "#" starts the fragment
    what = f"a query string ('?{query}')" if at_query >= 0 and len(base) == at_query else f"a fragment ('#{fragment}')"
    raise RemoteError(
        f"{url}: {what} cannot be part of a shard set's URL: shardload joins file names (manifest.json, "
        "shards/...) onto the set's path, and a query belongs to one object (an S3 versionId, a GCS generation, "
        f"a signature). Write the URL without it (drop it): {base}; give credentials in storage_options or the "
        'environment (docs/remote.md, "URLs")',
        url,
    )


def normalize_url(url: str) -> str:
    """``url`` as shardload spells it: the scheme in lower case (schemes are case-insensitive), no trailing ``/``.

    >>> normalize_url("S3://bucket/sets/train/")
    's3://bucket/sets/train'

    Raises:
        RemoteError: a URL form shardload cannot use (:func:`is_remote`); a port that is not a number from 0
            to 65535 (``urllib.parse``'s rule), an HTTP(S) URL with no host (``http:///set``); the path of an
            object-store URL has an empty segment (``s3://bucket/a//set``, which S3-compatible services answer
            with ``400 Bad Request``) or no bucket (``s3:///set``).
    """
    m = _SCHEME.match(url)
    if m is None:
        return url
    scheme, rest = m.group(1).lower(), url[m.end() :].rstrip("/")
    register_url(url)
    if scheme not in SCHEMES and scheme not in _LOCAL:
        raise RemoteError(
            f"{url}: unsupported URL scheme '{scheme}'; supported: {', '.join(SCHEMES)} (a local path), "
            '(docs/remote.md, "URLs")',
            url,
        )
    parts = urlsplit(url)
    _refuse_query(url, parts.query, parts.fragment)
    try:
        parts.port  # noqa: B018 (urllib.parse's rule: a port is a number from 0 to 65535, checked when read)
    except ValueError as exc:
        raise RemoteError(
            f"{url}: the port is not a number from 0 to 65535 ({exc}); write {scheme}://HOST:PORT/PATH", url
        ) from None
    if scheme in ("http", "https") and not parts.hostname:
        raise RemoteError(f"{url}: no host between '{scheme}://' and the path; write {scheme}://HOST[:PORT]/PATH", url)
    if scheme in _BUCKETS and "@" in parts.netloc:
        bucket = parts.netloc.rsplit("@", 1)[1]
        raise RemoteError(
            f"{url}: credentials cannot be written into {scheme}:// URLs ({_PACKAGES[scheme]} would read "
            f"'...@{bucket}' as the bucket name); write {scheme}://{bucket}{parts.path} and give them in "
            "storage_options (key/secret for S3, token for GCS) or the environment (AWS_ACCESS_KEY_ID, ...)",
            url,
        )
    if scheme not in ("http", "https", "file", "local") and "" in rest.split("/"):
        if rest.startswith("/") or not rest:
            raise RemoteError(
                f"{url}: no bucket (or host) between '{scheme}://' and the path; write {scheme}://BUCKET/PREFIX",
                url,
            )
        fixed = "/".join(part for part in rest.split("/") if part)
        raise RemoteError(
            f"{url}: the path has an empty segment ('//'), which object stores refuse (400 Bad Request); "
            f"write it without one: {scheme}://{fixed}",
            url,
        )
    return f"{scheme}://{rest}"


def join_url(url: str, *names: str) -> str:
    """``url`` with ``names`` appended, one ``/`` between each (``join_url("s3://b/set/", "a.arrow")``)."""
    out = url.rstrip("/")
    for name in names:
        out = f"{out}/{name.strip('/')}"
    return out


def open_filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem serving ``url`` and the path of ``url`` on it.

    For S3, the client's own retries are off (unless ``storage_options`` or ``$AWS_MAX_ATTEMPTS``
    sets botocore's), so that :class:`~shardload.remote.retry.RetryPolicy` is the only retry loop,
    and the timeouts are :data:`CONNECT_TIMEOUT`/:data:`READ_TIMEOUT` unless ``config_kwargs`` gives them.
    For HTTP(S), the same timeouts as aiohttp's ``ClientTimeout(sock_connect=..., sock_read=...)``, with no
    bound on a whole download, unless ``client_kwargs`` gives a ``timeout``.

    Raises:
        RemoteError: a URL form shardload does not take, or an empty path segment (:func:`normalize_url`);
            HTTP(S) credentials both in the URL and in an ``Authorization`` header or ``auth=`` of ``storage_options``.
        MissingDependencyError: fsspec, or the package of this scheme (s3fs, gcsfs, adlfs,
            aiohttp for HTTP), is not installed; the message gives the ``pip install`` line.
    """
    url = normalize_url(url)
    scheme = _scheme(url) or "file"
    register_secrets(storage_options)  # a storage library's message that quotes one is masked like the rest
    mask_storage_logs()
    options = dict(storage_options or {})
    if scheme in ("s3", "s3a"):
        options["config_kwargs"] = _s3_config(options.get("config_kwargs"))
    elif scheme in ("http", "https"):
        _refuse_two_credentials(url, options)
        options["client_kwargs"] = _http_client(options.get("client_kwargs"))
    try:
        import fsspec
    except ImportError as exc:
        raise MissingDependencyError(
            f"reading {url} needs fsspec: pip install 'shardload[remote]' (S3 and HTTP included)"
        ) from exc
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        package = _PACKAGES.get(scheme, f"the fsspec backend of {scheme}://")
        raise MissingDependencyError(
            f"reading {url} needs {package}: pip install {package} (or 'shardload[remote]' for S3 and HTTP)"
        ) from exc
    except ValueError as exc:  # fsspec: "Protocol not known"
        raise MissingDependencyError(
            f"{url}: fsspec knows no filesystem for {scheme}:// ({exc}); use s3://, gs://, az:// or https://"
        ) from exc
    if scheme in ("s3", "s3a") and isinstance(getattr(fs, "retries", None), int):
        fs.retries = S3FS_RETRIES  # s3fs retries throttling and timeouts itself, 5 times, inside each of ours
    return fs, path


def _refuse_two_credentials(url: str, options: Mapping[str, Any]) -> None:
    """Refuse credentials in both the URL (``user:password@``) and an ``Authorization`` header or ``auth=``.

    aiohttp refuses the pair (``ValueError: Cannot combine AUTHORIZATION header with ... credentials encoded
    in URL``) at each request, which fsspec's HTTP filesystem reports as ``FileNotFoundError``: "no
    manifest", not what is wrong. So it is refused here, before any request, naming both places.
    """
    if "@" not in urlsplit(url).netloc:
        return
    client = options.get("client_kwargs")
    places = []
    for where, kwargs in (("storage_options", options), ("storage_options['client_kwargs']", client)):
        if not isinstance(kwargs, Mapping):
            continue
        headers = kwargs.get("headers")
        if isinstance(headers, Mapping) and any(str(k).lower() == "authorization" for k in headers):
            places.append(f"an Authorization header in {where}['headers']")
        if kwargs.get("auth") is not None:
            places.append(f"auth= in {where}")
    if places:
        raise RemoteError(
            f"{url}: credentials are given twice, in the URL's user:password@ and as {' and '.join(places)}, "
            "and the HTTP client (aiohttp) takes one only; keep one of them (write the URL without "
            "user:password@ to send the header)",
            url,
        )


def _s3_config(given: object) -> Any:
    """botocore's ``Config`` keywords for s3fs: one attempt per call and the timeouts, unless given."""
    if given is not None and not isinstance(given, Mapping):
        return given  # not keywords: s3fs says what is wrong with it
    config: dict[str, Any] = dict(given or {})
    if "retries" not in config and not os.environ.get(envvars.AWS_MAX_ATTEMPTS, "").strip():
        config["retries"] = {"total_max_attempts": 1}  # a new dict each time: botocore changes it in place
    config.setdefault("connect_timeout", CONNECT_TIMEOUT)
    config.setdefault("read_timeout", READ_TIMEOUT)
    return config


def _http_client(given: object) -> Any:
    """aiohttp ``ClientSession`` keywords for fsspec's HTTP filesystem: the timeouts, unless given.

    aiohttp's own default (300 s for a whole request, no bound per read) would let a stalled server
    hold a try for five minutes, and cut a large shard's download that is merely slow.
    """
    if given is not None and not isinstance(given, Mapping):
        return given  # not keywords: aiohttp says what is wrong with it
    kwargs: dict[str, Any] = dict(given or {})
    if "timeout" not in kwargs:
        try:
            import aiohttp
        except ImportError:
            return kwargs  # fsspec's import of it fails next, with the install hint
        kwargs["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT)
    return kwargs
