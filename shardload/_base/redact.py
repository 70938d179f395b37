"""Keeping credentials out of every text shardload lets out: one mask, applied where text leaves.

:func:`redact` masks, in any text, the password of a URL's ``user:password@``, the value of a
secret-like query parameter (``X-Amz-Signature=...``, ``sig=...``) and every secret registered by
:func:`register_secrets` (the values of secret-like ``storage_options`` keys, which a storage library's
exception may quote verbatim) or :func:`register_url`. :func:`redact_options` masks the values of
secret-like keys in an options mapping (nested ``client_kwargs``, ``config_kwargs``, ``headers`` too).

Applied by: :class:`~shardload.errors.ShardloadError` (its message and ``url``, so every error, the CLI's
too), ``RemoteOptions``' and ``ShardSet``'s reprs, the ``shardload.*`` loggers (:func:`get_logger`), every
logger of the storage libraries (:func:`mask_storage_logs`, with header values: :func:`redact_log`), the
storage errors chained behind shardload's (:func:`mask_exception`), the results that name a set
(``describe``, ``verify``), and the CLI's stdout and stderr. docs/remote.md, "Credentials in messages".
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from shardload.errors import _install_mask

__all__ = [
    "MASK",
    "get_logger",
    "mask_exception",
    "mask_storage_logs",
    "redact",
    "redact_log",
    "redact_options",
    "register_secrets",
    "register_url",
]

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
#: endings of a glued word that make it a secret name (``apikey``, ``accesstoken``, ``dbpassword``)
_GLUED_ENDINGS = ("key", "token", "secret", "password", "passwd", "credential", "credentials", "signature")
#: names that hold a secret without a secret word (Azure's connection string holds the account key)
_SECRET_NAMES = frozenset({"connection_string", "sas"})
#: values of gcsfs's ``token`` that choose a method, not a secret; registering them would mask plain words
_NOT_SECRETS = frozenset({"anon", "browser", "cache", "cloud", "google_default"})
#: a registered value shorter than this is masked under its key only: a short one would mask ordinary words
MIN_REGISTERED = 8
_MAX_REGISTERED = 256

# "scheme://user:password@": the password ends at the last "@" before the path (passwords may hold "@")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@?#]*:)[^\s/?#]*@")
# "scheme://user@" with no password: a lone user part is how tokens are written (https://TOKEN@github.com/...),
# so it is masked whole
_LONE_USER = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/:@?#]+@")
# "?name=value" / "&name=value" in a URL's query, "#name=value" in its fragment (OAuth's #access_token=); the
# value stops before a ": " that ends the URL in a message ("URL: what is wrong")
_QUERY_PARAM = re.compile(r"([?&;#])([^=&#\s]+)=([^&#\s'\"]*?)(?=[&#\s'\"]|:\s|:$|$)")
# a header in a log line ("x-amz-security-token:TOKEN", botocore's canonical request) or in a dict's repr
# ("'Authorization': b'AWS4-HMAC-SHA256 Credential=...'", botocore's request): masked in log records only, as
# an error's or a result's "key: ..." is prose or data
_HEADER_LINE = re.compile(r"(?im)^([ \t]*)([a-z][\w-]*)([ \t]*:[ \t]*)(\S[^\r\n]*)")
_HEADER_ITEM = re.compile(r"""(?i)(['"])([a-z][\w-]*)\1(\s*:\s*b?)(['"])(.*?)\4""")

_registered: set[str] = set()
_lock = threading.Lock()
_pattern: re.Pattern[str] | None = None


def is_secret_name(name: object) -> bool:
    """Whether an option or parameter called ``name`` holds a secret (``secret``, ``account_key``, ``X-Amz-Signature``).

    A word glued to another (``apikey``, ``accesstoken``, ``clientsecret``) counts by its ending.

    >>> [is_secret_name(n) for n in ("secret", "sas_token", "aws_access_key_id", "endpoint_url", "anon", "apikey")]
    [True, True, True, False, False, True]
    """
    if not isinstance(name, str):
        return False
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()  # camelCase too: AccountKey, sasToken
    split = set(re.split(r"[^a-z0-9]+", words))
    return (
        bool(split & _SECRET_WORDS)
        or any(w.endswith(_GLUED_ENDINGS) for w in split)
        or words.replace("-", "_") in _SECRET_NAMES
    )


def redact_options(options: Any) -> Any:
    """``options`` with the value of every secret-like key masked, nested mappings and lists included.

    >>> redact_options({"key": "AKIA", "client_kwargs": {"endpoint_url": "http://h", "aws_session_token": "t"}})
    {'key': '***', 'client_kwargs': {'endpoint_url': 'http://h', 'aws_session_token': '***'}}
    """
    if isinstance(options, Mapping):
        return {k: MASK if is_secret_name(k) and v is not None else redact_options(v) for k, v in options.items()}
    if isinstance(options, tuple) and len(options) == 2 and is_secret_name(options[0]) and options[1] is not None:
        return (options[0], MASK)  # a (name, value) pair: headers given as a list of pairs
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
        elif isinstance(value, tuple) and len(value) == 2 and is_secret_name(value[0]):
            walk(value[1], True)  # a (name, value) pair: headers given as a list of pairs
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v, secret)
        elif secret and isinstance(value, str):
            found.append(value)

    walk(options, False)
    _register(found)


def register_url(url: str) -> None:
    """Remember the password of ``url``'s ``user:password@`` (a lone user part: a token), for :func:`redact` to mask."""
    try:
        parts = urlsplit(url)
        secret = parts.password or (parts.username if "@" in parts.netloc else None)
    except ValueError:  # a malformed port or host: the userinfo rule of redact() still masks it
        return
    if secret:
        _register([secret])  # a lone user part is a token (https://TOKEN@host), as redact() masks it


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
    """``text`` with URL passwords (a lone user part too), secret query values and every registered secret masked.

    >>> redact("http://user:pw@host/set?X-Amz-Signature=abc&part=1: not found")
    'http://user:***@host/set?X-Amz-Signature=***&part=1: not found'
    >>> redact("https://ghp_TOKEN@github.com/o/r.git#token=abc")
    'https://***@github.com/o/r.git#token=***'
    """
    if not isinstance(text, str) or not text:
        return text
    pattern = _pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    if "@" in text:
        text = _LONE_USER.sub(rf"\1{MASK}@", _USERINFO.sub(rf"\1{MASK}@", text))
    if "=" in text:
        text = _QUERY_PARAM.sub(
            lambda m: m.group(0) if not is_secret_name(m.group(2)) else f"{m[1]}{m[2]}={MASK}", text
        )
    return text


def redact_log(text: str) -> str:
    """:func:`redact`, and the values of secret-like headers (``x-amz-security-token:...``, ``Authorization: ...``).

    >>> redact_log("host:h\\nx-amz-security-token:T0K")
    'host:h\\nx-amz-security-token:***'
    """
    text = redact(text)
    if ":" not in text:
        return text
    text = _HEADER_LINE.sub(lambda m: m[0] if not is_secret_name(m[2]) else f"{m[1]}{m[2]}{m[3]}{MASK}", text)
    return _HEADER_ITEM.sub(
        lambda m: m[0] if not is_secret_name(m[2]) else f"{m[1]}{m[2]}{m[1]}{m[3]}{m[4]}{MASK}{m[4]}", text
    )


def _mask_record(record: logging.LogRecord) -> None:
    """Mask ``record``'s message (its arguments merged in first) and the exception it carries."""
    try:
        message = record.getMessage()
    except (
        TypeError,
        ValueError,
        KeyError,
    ):  # arguments that do not fit the format: logging reports that itself when it emits
        return
    masked = redact_log(message)
    if masked != message:
        record.msg, record.args = masked, None
    if record.exc_info and record.exc_info[1] is not None:
        mask_exception(record.exc_info[1])


class _RedactFilter(logging.Filter):
    """Masks a record before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        _mask_record(record)
        return True


_FILTER = _RedactFilter()


#: the top-level loggers of the storage libraries shardload drives (and of their HTTP clients and auth
#: libraries), which log request URLs, endpoints, headers and signing input at DEBUG; every logger under them
#: is masked (botocore.auth's canonical request holds the session token)
STORAGE_LOGGERS = frozenset(
    {
        "fsspec",
        "s3fs",
        "gcsfs",
        "adlfs",
        "botocore",
        "aiobotocore",
        "boto3",
        "urllib3",
        "requests",
        "aiohttp",
        "google",
        "azure",
    }
)


def mask_storage_logs() -> None:
    """The mask on every record of the storage libraries' loggers (:data:`STORAGE_LOGGERS` and all under them).

    A logger's filter sees only the records that logger makes, not its children's (``botocore.auth`` under
    ``botocore``), and handlers are the user's: so the mask is in the log record factory, which every logger
    of the process uses, wrapped around the one installed before (once; a later factory that does not call
    the one it replaces drops it). A record is masked when made, before any filter or handler sees it.
    """
    with _lock:
        previous = logging.getLogRecordFactory()
        if getattr(previous, "masks_storage_logs", False):
            return

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if record.name.partition(".")[0] in STORAGE_LOGGERS:
                _mask_record(record)
            return record

        factory.masks_storage_logs = True  # type: ignore[attr-defined]
        logging.setLogRecordFactory(factory)


def mask_exception(exc: BaseException) -> None:
    """Mask, in place, the text of ``exc`` and of every exception chained behind it (``__cause__``, ``__context__``).

    Error reporters (Sentry, ``traceback``) show a chain whole: the storage library's
    ``FileNotFoundError('http://user:password@host/set/manifest.json')`` behind a shardload error too. Its
    arguments, an ``OSError``'s ``strerror``/``filename`` and botocore's ``kwargs`` (``endpoint_url``) are
    masked; the chain itself is kept, for the cause it explains.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        try:
            args = tuple(redact(a) if isinstance(a, str) else a for a in e.args)
            if args != e.args:
                e.args = args
            names = ("strerror", "filename", "filename2") if isinstance(e, OSError) else ()
            for name in names:
                value = getattr(e, name, None)
                if isinstance(value, str) and redact(value) != value:
                    setattr(e, name, redact(value))
            kwargs = getattr(e, "kwargs", None)
            if isinstance(kwargs, dict):
                for k, v in kwargs.items():
                    if isinstance(v, str):
                        kwargs[k] = redact(v)
        except (AttributeError, TypeError):  # an exception type with read-only fields: the rest still masked
            pass
        e = e.__cause__ or e.__context__


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with the mask on: every shardload logger is made here.

    A filter of the logger itself, as a logger's filters see only the records it makes, not its children's.
    """
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger


_install_mask(redact)
