"""Keeping credentials out of every text shardload lets out: one mask, applied where text leaves.

:func:`redact` masks, in any text, the password of a URL's ``user:password@``, the value of a
secret-like query parameter (``X-Amz-Signature=...``, ``sig=...``) and every secret registered by
:func:`register_secrets` (the values of secret-like ``storage_options`` keys, which a storage library's
exception may quote verbatim) or :func:`register_url`. :func:`redact_options` masks the values of
secret-like keys in an options mapping (nested ``client_kwargs``, ``config_kwargs``, ``headers`` too).

Applied by: :class:`~shardload.errors.ShardloadError` (its message and ``url``, so every error, the CLI's
too), ``RemoteOptions``' and ``ShardSet``'s reprs, the ``shardload.*`` loggers (:func:`get_logger`), the
results that name a set (``describe``, ``verify``), and the CLI's stdout and stderr. docs/remote.md,
"Credentials in messages".
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from shardload.errors import _install_mask

__all__ = ["MASK", "get_logger", "mask_storage_logs", "redact", "redact_options", "register_secrets", "register_url"]

MASK = "***"
#: words of an option or query-parameter name that make its value a secret (matched whole, any case)
_SECRET_WORDS = frozenset(
    {
        "auth",
        "authorization",
        "cookie",
        "credential",
        "credentials",
        "key",
        "passphrase",
        "passwd",
        "password",
        "pwd",
        "secret",
        "sig",
        "signature",
        "token",
    }
)
#: names that hold a secret without a secret word (Azure's connection string holds the account key)
_SECRET_NAMES = frozenset({"connection_string", "sas"})
#: values of gcsfs's ``token`` that choose a method, not a secret; registering them would mask plain words
_NOT_SECRETS = frozenset({"anon", "browser", "cache", "cloud", "google_default"})
#: a registered value shorter than this is masked under its key only: a short one would mask ordinary words
MIN_REGISTERED = 8
_MAX_REGISTERED = 256

# "scheme://user:password@": the password ends at the last "@" before the path (passwords may hold "@")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@?#]*:)[^\s/?#]*@")
# "?name=value" / "&name=value" in a URL's query
_QUERY_PARAM = re.compile(r"([?&;])([^=&#\s]+)=([^&#\s'\"]*)")

_registered: set[str] = set()
_lock = threading.Lock()
_pattern: re.Pattern[str] | None = None


def is_secret_name(name: object) -> bool:
    """Whether an option or parameter called ``name`` holds a secret (``secret``, ``account_key``, ``X-Amz-Signature``).

    >>> [is_secret_name(n) for n in ("secret", "sas_token", "aws_access_key_id", "endpoint_url", "anon")]
    [True, True, True, False, False]
    """
    if not isinstance(name, str):
        return False
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()  # camelCase too: AccountKey, sasToken
    return bool(set(re.split(r"[^a-z0-9]+", words)) & _SECRET_WORDS) or words.replace("-", "_") in _SECRET_NAMES


def redact_options(options: Any) -> Any:
    """``options`` with the value of every secret-like key masked, nested mappings and lists included.

    >>> redact_options({"key": "AKIA", "client_kwargs": {"endpoint_url": "http://h", "aws_session_token": "t"}})
    {'key': '***', 'client_kwargs': {'endpoint_url': 'http://h', 'aws_session_token': '***'}}
    """
    if isinstance(options, Mapping):
        return {k: MASK if is_secret_name(k) and v is not None else redact_options(v) for k, v in options.items()}
    if isinstance(options, (list, tuple)):
        return type(options)(redact_options(v) for v in options)
    if isinstance(options, str):
        return redact(options)
    return options


def register_secrets(options: Any) -> None:
    """Remember the string values of secret-like keys in ``options`` (nested too), for :func:`redact` to mask."""
    found: list[str] = []

    def walk(value: Any, secret: bool) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, secret or is_secret_name(k))
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v, secret)
        elif secret and isinstance(value, str):
            found.append(value)

    walk(options, False)
    _register(found)


def register_url(url: str) -> None:
    """Remember the password of ``url``'s ``user:password@``, if any, for :func:`redact` to mask wherever it is."""
    try:
        password = urlsplit(url).password
    except ValueError:  # a malformed port or host: the userinfo rule of redact() still masks it
        return
    if password:
        _register([password])


def _register(values: list[str]) -> None:
    global _pattern
    new = {v for v in values if len(v) >= MIN_REGISTERED and v.lower() not in _NOT_SECRETS} - _registered
    if not new:
        return
    with _lock:
        if len(_registered) + len(new) > _MAX_REGISTERED:
            _registered.clear()  # bounded: a process that opens sets with ever new credentials keeps the latest
        _registered.update(new)
        # longest first, so that a secret holding another is masked whole
        _pattern = re.compile("|".join(re.escape(v) for v in sorted(_registered, key=len, reverse=True)))


def redact(text: str) -> str:
    """``text`` with URL passwords, secret query values and every registered secret masked.

    >>> redact("http://user:pw@host/set?X-Amz-Signature=abc&part=1: not found")
    'http://user:***@host/set?X-Amz-Signature=***&part=1: not found'
    """
    if not isinstance(text, str) or not text:
        return text
    pattern = _pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    if "@" in text:
        text = _USERINFO.sub(rf"\1{MASK}@", text)
    if "=" in text:
        text = _QUERY_PARAM.sub(
            lambda m: m.group(0) if not is_secret_name(m.group(2)) else f"{m[1]}{m[2]}={MASK}", text
        )
    return text


class _RedactFilter(logging.Filter):
    """Masks a record's message (its arguments merged in first) before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


_FILTER = _RedactFilter()


#: the loggers of the storage libraries shardload drives, which log request URLs at DEBUG (fsspec.http)
STORAGE_LOGGERS = ("fsspec", "fsspec.http", "s3fs", "gcsfs", "adlfs", "aiohttp.client", "botocore.endpoint")


def mask_storage_logs() -> None:
    """The mask on the storage libraries' own loggers too (:data:`STORAGE_LOGGERS`), once a URL is opened."""
    for name in STORAGE_LOGGERS:
        get_logger(name)


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with the mask on: every shardload logger is made here.

    A filter of the logger itself, as a logger's filters see only the records it makes, not its children's.
    """
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger


_install_mask(redact)
