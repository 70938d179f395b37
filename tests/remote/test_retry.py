"""Which storage errors are retried, how long the waits are, and the error after the last try."""

from __future__ import annotations

import random
import ssl

import pytest

from shardload.errors import InputError, RemoteError
from shardload.remote import RetryPolicy, is_transient, with_retries


class _ClientError(Exception):
    """Shaped like botocore's ClientError: a response dict with a code and a status."""

    def __init__(self, code: str, status: int) -> None:
        super().__init__(f"An error occurred ({code})")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class _ResponseError(Exception):
    """Shaped like aiohttp's ClientResponseError: a ``status`` attribute."""

    def __init__(self, status: int) -> None:
        super().__init__(f"status {status}")
        self.status = status


def _wrapped(inner: BaseException) -> OSError:
    try:
        raise inner
    except BaseException as exc:  # noqa: BLE001
        try:
            raise OSError("wrapped by the filesystem") from exc
        except OSError as outer:
            return outer


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (_ClientError("SlowDown", 503), True),
        (_ClientError("InternalError", 500), True),
        # botocore retried these itself before its retries were turned off: ours must
        (_ClientError("XAmzContentSHA256Mismatch", 400), True),
        (_ClientError("BadDigest", 400), True),
        (_ClientError("RequestThrottled", 400), True),
        (_ClientError("BandwidthLimitExceeded", 400), True),
        (_ResponseError(509), True),
        (_ClientError("InvalidArgument", 400), False),
        (_ClientError("NoSuchKey", 404), False),
        (_ClientError("AccessDenied", 403), False),
        (_ResponseError(503), True),
        (_ResponseError(429), True),
        (_ResponseError(404), False),
        (_wrapped(_ClientError("SlowDown", 503)), True),
        (_wrapped(ValueError("bad")), False),
        (FileNotFoundError("s3://bucket/x"), False),
        (PermissionError("denied"), False),
        (ValueError("a bug"), False),
    ],
)
def test_transient_or_not(exc: BaseException, expected: bool) -> None:
    assert is_transient(exc) is expected


def test_retries_until_success_with_growing_waits() -> None:
    waits: list[float] = []
    calls = iter([TimeoutError(), _ClientError("SlowDown", 503), "ok"])

    def call() -> str:
        item = next(calls)
        if isinstance(item, BaseException):
            raise item
        return item

    policy = RetryPolicy(tries=5, base_delay=1.0, max_delay=100.0, jitter=0.0)
    assert with_retries(call, url="s3://b/k", what="reading k", policy=policy, sleep=waits.append) == "ok"
    assert waits == [1.0, 2.0]


def test_last_error_names_url_and_tries() -> None:
    waits: list[float] = []

    def call() -> None:
        raise _ResponseError(503)

    with pytest.raises(RemoteError, match=r"reading k \(s3://b/k\) failed 3 times.*503") as info:
        with_retries(call, url="s3://b/k", what="reading k", policy=RetryPolicy(tries=3), sleep=waits.append)
    assert info.value.url == "s3://b/k"
    assert len(waits) == 2
    assert isinstance(info.value, OSError)


def test_tries_that_get_further_start_the_count_afresh() -> None:
    waits: list[float] = []
    received = iter([0, 10, 20, 30, 30, 30, 30])  # before the first try, then after each failed one

    def call() -> None:
        raise TimeoutError("cut")

    policy = RetryPolicy(tries=4, base_delay=1.0, max_delay=100.0, jitter=0.0)
    with pytest.raises(RemoteError, match=r"failed 6 times \(the last 4 without getting further\); the last"):
        with_retries(
            call, url="s3://b/k", what="reading k", policy=policy, sleep=waits.append, progress=lambda: next(received)
        )
    assert waits == [1.0, 1.0, 1.0, 2.0, 4.0]  # the waits start again after each try that got further


def test_tries_that_get_no_further_end_after_the_policys_tries() -> None:
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        raise TimeoutError("cut")

    with pytest.raises(RemoteError, match=r"failed 3 times; the last"):
        with_retries(
            call,
            url="s3://b/k",
            what="reading k",
            policy=RetryPolicy(tries=3),
            sleep=lambda s: None,
            progress=lambda: 5,
        )
    assert len(calls) == 3


def test_permanent_error_is_not_retried() -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise FileNotFoundError("s3://b/missing")

    with pytest.raises(FileNotFoundError):
        with_retries(call, url="s3://b/missing", what="reading", sleep=lambda s: None)
    assert calls == [1]


def test_jitter_stays_in_bounds_and_caps() -> None:
    policy = RetryPolicy(tries=12, base_delay=0.5, max_delay=4.0, jitter=0.5)
    waits = list(policy.delays(random.Random(0)))
    assert len(waits) == 11
    for k, w in enumerate(waits):
        cap = min(4.0, 0.5 * 2**k)
        assert cap / 2 <= w <= cap


@pytest.mark.parametrize("bad", [{"tries": 0}, {"jitter": 1.5}, {"base_delay": -1.0}])
def test_policy_refuses_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**bad)  # type: ignore[arg-type]


def test_describe_names_the_status_s3fs_hides() -> None:
    from botocore.exceptions import ClientError

    from shardload.remote.retry import describe

    def wrapped(code: str, text: str) -> OSError:
        cause = ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject")
        try:
            raise OSError(16, text) from cause
        except OSError as exc:
            return exc

    got = describe(wrapped("SlowDown", "Please reduce your request rate."))
    assert got == "OSError: [Errno 16] Please reduce your request rate (HTTP 503 SlowDown)"
    assert describe(wrapped("503", "Service Unavailable")).endswith("Service Unavailable (HTTP 503)")  # a HEAD
    assert describe(TimeoutError("read timed out")) == "TimeoutError: read timed out"


@pytest.mark.parametrize(
    ("bad", "field", "accepted"),
    [
        ({"tries": 0}, "tries", "from 1"),
        ({"tries": -3}, "tries", "from 1"),
        ({"tries": 2.5}, "tries", "an integer"),
        ({"tries": True}, "tries", "an integer"),
        ({"tries": 10**6}, "tries", "at most 1,000"),
        ({"base_delay": -1.0}, "base_delay", "between 0 and 3600"),
        ({"base_delay": float("nan")}, "base_delay", "between 0 and 3600"),
        ({"max_delay": float("inf")}, "max_delay", "between 0 and 3600"),
        ({"max_delay": "5"}, "max_delay", "a number"),
        ({"jitter": float("nan")}, "jitter", "between 0 and 1"),
        ({"jitter": 1.5}, "jitter", "between 0 and 1"),
    ],
)
def test_policy_names_the_field_and_its_range(bad: dict[str, object], field: str, accepted: str) -> None:
    with pytest.raises(InputError, match=rf"RetryPolicy\.{field} must be .*{accepted}"):
        RetryPolicy(**bad)  # type: ignore[arg-type]


def _s3fs_wrapped(status: int, code: str, text: str, errno: int) -> OSError:
    """What s3fs raises for a botocore ClientError it has no Python error for: OSError(errno, text) from it."""
    from botocore.exceptions import ClientError

    cause = ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "HeadObject")
    try:
        raise OSError(errno, text) from cause
    except OSError as exc:
        return exc


def test_a_permanent_answer_of_the_store_is_a_remote_error_naming_url_call_and_status() -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise _s3fs_wrapped(400, "400", "Bad Request", 22)

    with pytest.raises(
        RemoteError, match=r"reading k \(s3://b/k\) failed: OSError: .*Bad Request \(HTTP 400\)"
    ) as info:
        with_retries(call, url="s3://b/k", what="reading k", sleep=lambda s: None)
    assert calls == [1] and info.value.url == "s3://b/k" and not isinstance(info.value, FileNotFoundError)


@pytest.mark.parametrize(
    "exc",
    [OSError(28, "No space left on device"), InputError("shardload's own"), KeyError("a bug"), FileNotFoundError("x")],
)
def test_errors_that_are_not_the_stores_answer_pass_as_they_are(exc: Exception) -> None:
    def call() -> None:
        raise exc

    with pytest.raises(type(exc)) as info:
        with_retries(call, url="s3://b/k", what="reading k", sleep=lambda s: None)
    assert info.value is exc


@pytest.mark.parametrize("module", ["shardload.remote.retry", "shardload.remote.url", "shardload._base.redact"])
def test_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize(
    ("bad", "field", "accepted"),
    [
        ({"wait_timeout": float("inf")}, "wait_timeout", "between 0.001 and 604800"),
        ({"wait_timeout": 0}, "wait_timeout", "between 0.001"),
        ({"wait_timeout": "60"}, "wait_timeout", "a number"),
        ({"cache_limit": 0}, "cache_limit", ">= 1"),
        ({"cache_limit": 1.5e9}, "cache_limit", "an integer"),
        ({"prefetch_downloads": -1}, "prefetch_downloads", ">= 0"),
        ({"prefetch_bytes": True}, "prefetch_bytes", "an integer"),
        ({"storage_options": "key=x"}, "storage_options", "a dict"),
        ({"cache_dir": 3}, "cache_dir", "a directory path"),
        ({"retry": {"tries": 3}}, "retry", "a shardload.remote.RetryPolicy"),
    ],
)
def test_remote_options_name_the_field_and_what_it_takes(bad: dict[str, object], field: str, accepted: str) -> None:
    from shardload.remote import RemoteOptions

    with pytest.raises(InputError, match=rf"RemoteOptions\.{field} must be .*{accepted}"):
        RemoteOptions(**bad)  # type: ignore[arg-type]


def _not_found(cause: BaseException) -> FileNotFoundError:
    """Shaped like fsspec's HTTP filesystem: ``FileNotFoundError(url) from`` whatever made info() fail."""
    try:
        raise FileNotFoundError("https://h/set/manifest.json") from cause
    except FileNotFoundError as exc:
        return exc


@pytest.mark.parametrize(
    ("cause", "fault"),
    [
        (_ResponseError(404), False),
        (_ResponseError(410), False),
        (_ClientError("NoSuchKey", 404), False),
        (StopIteration(), False),  # ftp's info(): a listing without the name
        (_ResponseError(500), True),
        (_ResponseError(429), True),
        (ConnectionRefusedError(111, "Connect call failed"), True),
        (TimeoutError(), True),
    ],
)
def test_a_not_found_hiding_another_answer_or_a_failed_request_is_that_fault(cause: BaseException, fault: bool) -> None:
    from shardload.remote.retry import fault_behind

    exc = _not_found(cause)
    # Invariant: only "no such object" (404/410, or nothing behind it) stays a FileNotFoundError
    assert (fault_behind(exc) is cause) is fault
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        raise _not_found(cause)

    policy = RetryPolicy(tries=3, base_delay=0.0)
    expected = RemoteError if fault else FileNotFoundError
    with pytest.raises(expected):
        with_retries(call, url="https://h/set/manifest.json", what="reading", policy=policy, sleep=lambda _: None)
    assert len(calls) == (policy.tries if fault and is_transient(cause) else 1)


def _tls_error(reason: str) -> ssl.SSLError:
    """Shaped like OpenSSL's: the reason is an attribute (aiohttp's error wraps it)."""
    exc = ssl.SSLError(1, f"[SSL: {reason}] ({reason.lower()})")
    exc.reason = reason
    return exc


def _certificate_error() -> ssl.SSLCertVerificationError:
    exc = ssl.SSLCertVerificationError(1, "certificate verify failed")
    exc.verify_message = "self-signed certificate"
    return exc


@pytest.mark.parametrize(
    ("exc", "transient", "said"),
    [
        (_tls_error("WRONG_VERSION_NUMBER"), False, "h:443 answered the TLS handshake in plain HTTP"),
        (_certificate_error(), False, "The TLS certificate of h:443 was not accepted (self-signed certificate)"),
        (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), True, ""),  # a handshake cut by the network
        (_tls_error("DECRYPTION_FAILED_OR_BAD_RECORD_MAC"), True, ""),  # a record damaged in transit
    ],
)
def test_a_tls_error_is_retried_only_when_the_network_may_be_the_cause(
    exc: BaseException, transient: bool, said: str
) -> None:
    from shardload.remote.retry import advice

    wrapped = _wrapped(ConnectionError("Cannot connect to host h:443 ssl:default"))
    wrapped.__cause__.__cause__ = exc  # type: ignore[union-attr]
    # Invariant: a scheme or certificate mismatch is not retried, and the message says which
    assert is_transient(wrapped) is transient
    assert advice(wrapped, "https://h:443/set/manifest.json").startswith(said)
