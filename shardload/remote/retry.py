"""Retrying object-storage calls that may pass: backoff with jitter, then one clear error.

:func:`with_retries`, through which every remote call of shardload goes, retries what
:func:`is_transient` finds among the exception's causes (HTTP 5xx, throttling, timeouts, a dropped
connection; fsspec backends wrap botocore and aiohttp errors in ``OSError``), and raises the rest
at once. A ``FileNotFoundError`` means "no such object" only when nothing else is behind it: fsspec's
HTTP filesystem raises one for *any* failure of ``info()`` (a 500, a refused connection, a timeout),
and :func:`with_retries` treats such an error as the fault it wraps, for every scheme alike. The last
message says what to check for the fault found (a refused connection, a timeout, ``https://`` to a
plain-HTTP server, a certificate). docs/remote.md, "Failure messages".
"""

from __future__ import annotations

import asyncio
import errno
import random
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from shardload._base.checks import check_real, check_scalar
from shardload._base.redact import mask_exception
from shardload.errors import InputError, RemoteAccessError, RemoteError, ShardloadError
from shardload.remote.url import CONNECT_TIMEOUT, READ_TIMEOUT

__all__ = [
    "RetryPolicy",
    "advice",
    "describe",
    "fault_behind",
    "is_refused",
    "is_storage_error",
    "is_transient",
    "with_retries",
]

T = TypeVar("T")

#: HTTP statuses worth another try: timeouts, throttling and server-side failures
TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 509})
#: error codes of S3-like services that mean "try again later": botocore's throttling and transient codes
#: (which it retried itself before its retries were turned off), and the body checksums an upload can fail
#: in transit (a 400 that s3fs and botocore retry)
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "TransactionInProgressException",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
        "RequestTimeout",
        "RequestTimeoutException",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "XAmzContentSHA256Mismatch",
        "BadDigest",
    }
)
#: class names (of botocore, aiohttp, urllib3, requests, fsspec) whose errors are network trouble
_TRANSIENT_NAMES = frozenset(
    {
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "IncompleteReadError",
        "IncompleteRead",
        "ResponseStreamingError",
        "HTTPClientError",
        "ProtocolError",
        "ResponseParserError",
        "ServerDisconnectedError",
        "ClientConnectionError",
        "ClientConnectorError",
        "ClientOSError",
        "ClientPayloadError",
        "ServerTimeoutError",
        "ContentLengthError",
        "TransferEncodingError",
        "FSTimeoutError",
        "ChunkedEncodingError",
    }
)
_TRANSIENT_ERRNOS = frozenset(
    {errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EPIPE, errno.EHOSTUNREACH}
)
#: the most tries and the longest wait a RetryPolicy accepts (more is a mistake, not patience)
MAX_TRIES = 1000
MAX_DELAY = 3600.0
#: errors that never pass by waiting, even when a transient one is among their causes
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
#: HTTP statuses that say the object does not exist (a FileNotFoundError caused by another is a fault)
MISSING_STATUSES = frozenset({404, 410})
#: OpenSSL's reasons for a handshake with a server that does not speak TLS there (plain HTTP, another
#: protocol): like a refused certificate, no retry changes them; other TLS errors (a cut connection, a
#: damaged record) are network trouble
NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "RECORD_LAYER_FAILURE", "UNKNOWN_PROTOCOL"})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a remote call is retried.

    Attributes:
        tries: calls in all, the first included (1 = no retry; at most :data:`MAX_TRIES`).
        base_delay: seconds before the second try; each later wait doubles, up to ``max_delay``.
        max_delay: longest single wait, in seconds (at most :data:`MAX_DELAY`).
        jitter: each wait is drawn uniformly from ``[(1 - jitter) * d, d]`` ("full jitter" at 1.0), so
            that the processes of a node that failed together do not retry together.

    Raises:
        InputError: a field is not a number, or out of its range (named in the message).
    """

    tries: int = 6
    base_delay: float = 0.5
    max_delay: float = 20.0
    jitter: float = 1.0

    def __post_init__(self) -> None:
        check_scalar(
            "RetryPolicy.tries",
            self.tries,
            low=1,
            high=MAX_TRIES,
            hint=f"calls in all, from 1 (no retry) to {MAX_TRIES}",
            error=InputError,
        )
        for name in ("base_delay", "max_delay"):
            check_real(
                f"RetryPolicy.{name}", getattr(self, name), low=0.0, high=MAX_DELAY, hint="seconds", error=InputError
            )
        check_real("RetryPolicy.jitter", self.jitter, low=0.0, high=1.0, hint="1.0 = full jitter", error=InputError)

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The ``tries - 1`` waits between tries, in seconds."""
        rng = rng or random.Random()
        for k in range(self.tries - 1):
            d = min(self.max_delay, self.base_delay * (2**k))
            yield rng.uniform((1.0 - self.jitter) * d, d)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _status(e: BaseException) -> tuple[int | None, str | None]:
    """HTTP status and service error code an exception carries, if any (botocore, aiohttp, requests)."""
    response: Any = getattr(e, "response", None)
    if isinstance(response, dict):  # botocore.exceptions.ClientError
        meta = response.get("ResponseMetadata") or {}
        code = (response.get("Error") or {}).get("Code")
        status = meta.get("HTTPStatusCode")
        return (int(status) if isinstance(status, int) else None, str(code) if code is not None else None)
    status = getattr(e, "status", None)  # aiohttp.ClientResponseError
    if isinstance(status, int):
        return status, None
    status = getattr(response, "status_code", None)  # requests.HTTPError
    return (status if isinstance(status, int) else None), None


def fault_behind(exc: BaseException) -> BaseException:
    """The error ``exc`` stands for: ``exc`` itself, unless it is a ``FileNotFoundError`` hiding a fault.

    fsspec's HTTP filesystem raises ``FileNotFoundError(url) from exc`` for any failure of ``info()``
    or ``open()``: an answer other than ``404``/``410`` or a failure to connect among its causes is
    returned instead (the one rule, for every scheme, of "not found" against a fault).

    >>> try:
    ...     raise FileNotFoundError("https://h/set/manifest.json") from ConnectionRefusedError(111, "refused")
    ... except FileNotFoundError as exc:
    ...     type(fault_behind(exc)).__name__
    'ConnectionRefusedError'
    """
    if not isinstance(exc, FileNotFoundError) or exc.__cause__ is None:
        return exc
    for e in _chain(exc.__cause__):
        status, code = _status(e)
        if status is not None or code is not None:
            return exc if status in MISSING_STATUSES or (status is None and code in ("NoSuchKey", "404")) else e
    # no answer came: a request that failed (to connect, in TLS, in time) or that the client refused to send
    # (aiohttp's ValueError for two credentials) is a fault; a lookup that found nothing (ftp's StopIteration)
    # is what it says
    failed = any(
        isinstance(e, (OSError, asyncio.TimeoutError, ValueError, TypeError)) or _from_storage_package(e)
        for e in _chain(exc.__cause__)
    )
    return exc.__cause__ if failed else exc


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it wraps) is a failure that may pass on another try.

    >>> is_transient(TimeoutError()), is_transient(FileNotFoundError("s3://b/x"))
    (True, False)
    """
    if isinstance(exc, _PERMANENT):
        return False
    if _tls_mismatch(exc)[0]:
        return False  # what to fix is the URL or the trust, not the network
    for e in _chain(exc):
        status, code = _status(e)
        if code is not None and code in TRANSIENT_CODES:
            return True
        if status is not None:
            return status in TRANSIENT_STATUSES
        if isinstance(e, (TimeoutError, asyncio.TimeoutError, ConnectionError)):
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return True
        if type(e).__name__ in _TRANSIENT_NAMES or any(c.__name__ in _TRANSIENT_NAMES for c in type(e).__mro__):
            return True
        # s3fs turns a throttled or failed call into OSError(errno, "SlowDown ...") or similar
        text = str(e)
        if any(code in text for code in ("SlowDown", "Service Unavailable", "ServiceUnavailable", "Throttl")):
            return True
    return False


def describe(exc: BaseException) -> str:
    """``exc`` in one line for a message, with the HTTP status and service code found among its causes.

    s3fs's ``OSError(EBUSY, "Please reduce your request rate.")`` gets the ``503 SlowDown`` it wraps.
    """
    text = f"{type(exc).__name__}: {str(exc).rstrip('. ')}"
    for e in _chain(exc):
        status, code = _status(e)
        if isinstance(status, int) and isinstance(getattr(e, "message", None), str):
            # aiohttp's ClientResponseError: its text repeats the URL, which the caller names already
            return f"{type(e).__name__}: HTTP {status} {getattr(e, 'message', '')}".rstrip()
        if status is not None or code is not None:
            # a HEAD answer has no body: botocore then gives the status as the code ("503")
            said = " ".join(dict.fromkeys(str(x) for x in (status, code) if x is not None))
            return text if said in text else f"{text} (HTTP {said})"
    return text


def _server(url: str) -> str:
    """``host:port`` of ``url`` (never its user or password)."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # not a number: the URL says so itself
        port = None
    return f"{parts.hostname or url}:{port}" if port is not None else parts.hostname or url


#: where the endpoint of an object store is set, by scheme, for the advice on a fault of that endpoint
_ENDPOINT_SETTINGS = {
    "s3": "storage_options={'client_kwargs': {'endpoint_url': ...}}, or AWS_ENDPOINT_URL",
    "s3a": "storage_options={'client_kwargs': {'endpoint_url': ...}}, or AWS_ENDPOINT_URL",
    "gs": "storage_options={'endpoint_url': ...}, or STORAGE_EMULATOR_HOST",
    "gcs": "storage_options={'endpoint_url': ...}, or STORAGE_EMULATOR_HOST",
}


def _where(exc: BaseException, url: str) -> tuple[str, str]:
    """``(server, what to check)`` for a fault reaching the server of ``url``.

    For ``http(s)://`` the server is the URL's; an object store's (``s3://bucket/...``) is its endpoint,
    not the bucket: the one the client named (botocore's ``endpoint_url``, aiohttp's ``host``/``port``).
    """
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme in ("http", "https", "file", ""):
        return _server(url), "the URL"
    server = ""
    for e in _chain(exc):
        kwargs = getattr(e, "kwargs", None)
        endpoint = kwargs.get("endpoint_url") if isinstance(kwargs, dict) else None
        host, port = getattr(e, "host", None), getattr(e, "port", None)
        if isinstance(endpoint, str) and endpoint:
            server = _server(endpoint)
        elif isinstance(host, str) and host and not server:
            server = f"{host}:{port}" if isinstance(port, int) else host
        if server:
            break
    settings = _ENDPOINT_SETTINGS.get(scheme, "storage_options")
    return server or f"the endpoint of {scheme}://", f"the endpoint ({settings})"


def _tls_mismatch(exc: BaseException) -> tuple[str, str]:
    """``("certificate" | "not TLS" | "", OpenSSL's reason)`` of the TLS error among ``exc``'s causes, if any.

    aiohttp's TLS errors are ``ssl.SSLError`` too, without OpenSSL's reason: that is on the one they wrap.
    """
    tls = [e for e in _chain(exc) if isinstance(e, ssl.SSLError)]
    reason = next((str(r) for e in tls if (r := getattr(e, "verify_message", None) or getattr(e, "reason", None))), "")
    if any(isinstance(e, ssl.SSLCertVerificationError) for e in tls):
        return "certificate", reason
    return ("not TLS" if tls and reason in NOT_TLS_REASONS else ""), reason


def advice(exc: BaseException, url: str) -> str:
    """What to check for the network fault ``exc`` (or one it wraps) names, or "" for none of these.

    ``https://`` to a plain-HTTP server, a certificate refused, a refused connection, a timeout; each names
    the server (an object store's endpoint, not its bucket) and where it is set.
    """
    chain = list(_chain(exc))
    kind, reason = _tls_mismatch(exc)
    server, check = _where(exc, url)
    if kind == "certificate":
        return (
            f"The TLS certificate of {server} was not accepted ({reason}): check the host name in {check}; "
            "for a private certificate authority, give the client its bundle "
            "(storage_options={'ssl': ssl.create_default_context(cafile=...)} for https://)"
        )
    if kind == "not TLS":
        return (
            f"{server} answered the TLS handshake in plain HTTP: {check} says https:// where the server "
            f"speaks plain HTTP. Check the scheme (http:// instead of https://) and the port of {check}"
        )
    if any(isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED for e in chain):
        return (
            f"Nothing accepts connections at {server} (connection refused): check {check}, its host and port, "
            "and that the server runs"
        )
    if any(isinstance(e, (TimeoutError, asyncio.TimeoutError)) or "Timeout" in type(e).__name__ for e in chain):
        return (
            f"{server} gave no answer within the client's timeout (by default {CONNECT_TIMEOUT:g} s to "
            f'connect, {READ_TIMEOUT:g} s for each read of an answer; docs/remote.md, "Timeouts"): check that '
            "the server is up and not overloaded, and the network; on a slow link, raise the timeout"
        )
    return ""


#: HTTP statuses and service error codes of a refused or missing credential
REFUSED_STATUSES = frozenset({401, 403})
REFUSED_CODES = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "AllAccessDisabled"}
)
#: class names (botocore, google-auth, azure-core) of a client that found no usable credentials
_REFUSED_NAMES = frozenset(
    {
        "NoCredentialsError",
        "PartialCredentialsError",
        "CredentialRetrievalError",
        "DefaultCredentialsError",
        "ClientAuthenticationError",
    }
)


def is_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it wraps) is a refused or missing credential.

    A local ``PermissionError`` (one naming a file: the cache directory is not writable) is not one.

    >>> is_refused(PermissionError("Forbidden")), is_refused(FileNotFoundError("s3://b/x"))
    (True, False)
    """
    for e in _chain(exc):
        if type(e).__name__ in _REFUSED_NAMES or (isinstance(e, PermissionError) and e.filename is None):
            return True
        status, code = _status(e)
        if status in REFUSED_STATUSES or code in REFUSED_CODES:
            return True
    return False


#: the packages whose errors are the storage service's answer (or its client's), not a local failure or a bug
_STORAGE_PACKAGES = frozenset(
    {"botocore", "aiobotocore", "s3fs", "gcsfs", "adlfs", "fsspec", "aiohttp", "requests", "urllib3", "google", "azure"}
)


def _from_storage_package(e: BaseException) -> bool:
    return type(e).__module__.split(".")[0] in _STORAGE_PACKAGES


def is_storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it wraps) is an answer of the storage service or its client.

    An HTTP status, service code or storage package's error class among its causes, or an ``OSError``
    with neither errno nor file name (fsspec's for the store); not a local failure (a full disk carries
    an errno), an error of shardload or a bug.

    >>> is_storage_error(OSError("Bad Request")), is_storage_error(OSError(28, "No space left on device"))
    (True, False)
    """
    if isinstance(exc, ShardloadError):
        return False
    for e in _chain(exc):
        if _status(e) != (None, None) or _from_storage_package(e):
            return True
        if isinstance(e, OSError) and e.errno is None and e.filename is None:
            return True
    return False


def with_retries(
    call: Callable[[], T],
    *,
    url: str,
    what: str,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    progress: Callable[[], int] | None = None,
) -> T:
    """``call()``, retried on transient errors with backoff and jitter.

    The one place where an error of the storage service becomes one of shardload's. ``url`` and
    ``what`` (``"downloading shard 3"``) name the call in messages; ``sleep`` and ``rng`` are for tests.

    ``progress`` (bounded: how far a resumable transfer has got) is read before the first try and
    after each failed one; a try that got further than all before restarts the policy's count and
    waits, so only ``policy.tries`` tries in a row without getting further end in ``RemoteError``.

    Raises:
        RemoteError: every try failed with a transient error, or the store gave an answer another try
            would not change (a ``400``, a ``405``...), or the storage client refused its settings before
            any request (a ``ValueError`` or ``TypeError`` fsspec hid as ``FileNotFoundError``); names ``url``,
            the tries or the status.
        RemoteAccessError: the credentials were refused or missing; names ``url``.
        FileNotFoundError: the object (or bucket) does not exist: the caller says what that means there.
        Exception: any other error, as it is (a local one, such as a full disk, or a bug).
    """
    policy = policy or RetryPolicy()
    delays = policy.delays(rng)
    tries = counted = 0  # every try; the tries counted against the policy (since the last progress)
    best = progress() if progress is not None else 0
    while True:
        tries += 1
        counted += 1
        try:
            return call()
        except Exception as raised:
            mask_exception(raised)  # chained behind the error raised here, where error reporters show it
            exc = fault_behind(raised)
            if is_refused(exc):
                raise RemoteAccessError(
                    f"{what} ({url}) was refused: {type(exc).__name__}: {exc}. Check the credentials (for S3: "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile or an instance role; or "
                    "storage_options) and that they may read (for prepare: write) this bucket and prefix.",
                    url,
                ) from exc
            if not is_transient(exc):
                if exc is not raised and isinstance(exc, (ValueError, TypeError)):
                    raise RemoteError(
                        f"{what} ({url}) failed before any request: the storage client refused its settings: "
                        f"{describe(exc)}. Check storage_options (and the credentials in the URL) against the "
                        "storage library's documentation.",
                        url,
                    ) from exc
                if isinstance(exc, FileNotFoundError) or not is_storage_error(exc):
                    raise
                hint = advice(exc, url)
                raise RemoteError(
                    f"{what} ({url}) failed: {describe(exc)}. "
                    + (
                        f"{hint}."
                        if hint
                        else "The storage service rejected the request, and another try would not change its "
                        "answer: check the URL (bucket and prefix), the endpoint (AWS_ENDPOINT_URL, or "
                        "storage_options) and that the service supports the call; if the objects of the set were "
                        "changed by hand, upload the set again (shardload upload SET URL --force, or prepare -o URL --overwrite)."
                    ),
                    url,
                ) from exc
            if progress is not None and (got := progress()) > best:
                best, counted, delays = got, 1, policy.delays(rng)
            delay = next(delays, None)
            if delay is None:
                since = f" (the last {counted} without getting further)" if counted < tries else ""
                raise RemoteError(
                    f"{what} ({url}) failed {tries} time{'s' if tries > 1 else ''}{since}; the last error: "
                    f"{describe(exc)}. "
                    + (
                        advice(exc, url)
                        or "The storage service is unreachable, throttling or failing: check the endpoint and "
                        "the network"
                    )
                    + ", then rerun (a prepare upload resumes with --resume).",
                    url,
                ) from exc
            sleep(delay)
