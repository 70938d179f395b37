"""HTTP(S) shard sets under storage faults: the same fault model as S3, and every read bounded in time.

Against Python's ``http.server`` on 127.0.0.1 behind the fault proxy (tests/helpers/faultproxy.py).
Claims tested: a refused connection, a 5xx or a 429 is retried under the ``RetryPolicy`` and ends,
if it lasts, as a :class:`RemoteError` naming the URL and the status (exit 8 from ``inspect``), never
as "not a shard set"; a 404 manifest is "not a shard set"; a server that stalls before the headers
or mid-body is a timeout (:data:`~shardload.remote.url.READ_TIMEOUT`, overridable through aiohttp's
``ClientTimeout`` in ``storage_options``), retried, then a named error; ``https://`` to a plain-HTTP
server says to check the scheme, after one try; a loader with 2 workers and ``timeout=`` over a
stalled shard GET ends with a named :class:`WorkerError` within that timeout. For ``s3://``, a refused
connection or an ``https://`` endpoint to a plain-HTTP server names the endpoint, not the bucket, and where
it is set. docs/reliability.md, "Remote sets".
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import shardload
from shardload.cli import main
from shardload.errors import ManifestError, RemoteError
from shardload.remote import RemoteOptions, RetryPolicy
from shardload.remote.cache import RemoteSet
from shardload.remote.url import CONNECT_TIMEOUT, READ_TIMEOUT, open_filesystem
from tests.distributed.watchdog import python, run_with_watchdog
from tests.helpers.faultproxy import FaultProxy
from tests.helpers.servers import free_port, http_server

FAST = RetryPolicy(tries=3, base_delay=0.01, max_delay=0.02)
#: short enough that a stall test takes about a second, long enough for a loaded machine's honest answer
SHORT = aiohttp.ClientTimeout(sock_connect=2.0, sock_read=0.5)
MANIFEST = r"manifest\.json$"
SHARD = r"shard-000001\.arrow$"


@pytest.fixture
def served(pristine: Path, tmp_path: Path) -> Iterator[FaultProxy]:
    """The pristine set at ``{proxy.url}/set``: Python's http.server behind a fault proxy."""
    root = tmp_path / "www"
    shutil.copytree(pristine, root / "set")
    with http_server(root) as base, FaultProxy(base) as proxy:
        yield proxy


def remote(tmp_path: Path, timeout: aiohttp.ClientTimeout | None = SHORT, **kw: Any) -> RemoteOptions:
    storage = {"client_kwargs": {"timeout": timeout}} if timeout is not None else None
    return RemoteOptions(storage_options=storage, cache_dir=tmp_path / "cache", retry=kw.pop("retry", FAST), **kw)


def opened(url: str, tmp_path: Path, **kw: Any) -> RemoteSet:
    rs = RemoteSet(url, remote(tmp_path, **kw))
    rs.open()
    return rs


def test_a_refused_connection_is_retried_then_a_named_remote_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/set"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(RemoteError) as caught:
        shardload.open(url, remote=remote(tmp_path))
    message = str(caught.value)
    # Invariant: a connection refused is a fault of the server's address, retried, never "not a shard set"
    assert not isinstance(caught.value, ManifestError)
    assert f"{url}/manifest.json" in message and f"failed {FAST.tries} times" in message
    assert "refused" in message and "127.0.0.1" in message
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("fault", ["500", "503", "429"])
def test_a_passing_server_error_is_retried_and_the_set_opens(
    served: FaultProxy, tmp_path: Path, pristine: Path, fault: str
) -> None:
    # an info() is a HEAD then a GET: 2 faults fail one try; the third try passes
    served.inject(fault, path=MANIFEST, times=2 * (FAST.tries - 1))
    ds = shardload.open(f"{served.url}/set", remote=remote(tmp_path))
    # Invariant: a transient status is retried under the policy, and the set reads as the local one
    assert served.hits(fault) == 2 * (FAST.tries - 1)
    assert len(ds) == len(shardload.open(pristine))


@pytest.mark.parametrize("fault", ["500", "503", "429"])
def test_a_lasting_server_error_is_a_remote_error_naming_url_and_status(
    served: FaultProxy, tmp_path: Path, fault: str
) -> None:
    served.inject(fault, path=MANIFEST, times=1000)
    url = f"{served.url}/set"
    with pytest.raises(RemoteError) as caught:
        shardload.open(url, remote=remote(tmp_path))
    message = str(caught.value)
    # Invariant: the error names the URL, the tries and the status, and is not "not a shard set"
    assert not isinstance(caught.value, ManifestError)
    assert f"{url}/manifest.json" in message and f"failed {FAST.tries} times" in message
    assert f"HTTP {fault}" in message


def test_a_lasting_429_exits_8_from_inspect(
    served: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(RemoteOptions, "policy", property(lambda self: FAST))  # the CLI's policy, made fast
    served.inject("429", path=MANIFEST, times=1000)
    url = f"{served.url}/set"
    # Invariant: throttling that lasts is a storage error (exit 8), not a missing manifest (exit 5)
    assert main(["inspect", url, "--cache-dir", str(tmp_path / "cache")]) == 8
    err = capsys.readouterr().err
    assert f"{url}/manifest.json" in err and "HTTP 429" in err


def test_a_404_manifest_is_not_a_shard_set(served: FaultProxy, tmp_path: Path) -> None:
    url = f"{served.url}/no-such-set"
    with pytest.raises(ManifestError, match=r"is not a shard set: it has no manifest\.json"):
        shardload.open(url, remote=remote(tmp_path))
    # Invariant: an answer that the object does not exist is not retried (one HEAD, one GET)
    assert len(served.requests) == 2


def test_a_stall_before_the_headers_is_a_timeout_retried_then_named(served: FaultProxy, tmp_path: Path) -> None:
    served.inject("stall", path=MANIFEST, times=1000, stall_s=30.0)
    url = f"{served.url}/set"
    started = time.monotonic()
    with pytest.raises(RemoteError) as caught:
        shardload.open(url, remote=remote(tmp_path))
    took = time.monotonic() - started
    message = str(caught.value)
    # Invariant: each try is bounded by the read timeout: tries x (HEAD + GET) x 0.5 s, not the stall's 30 s
    assert took < 2 * FAST.tries * SHORT.sock_read + 5.0, took  # type: ignore[operator]
    assert f"{url}/manifest.json" in message and f"failed {FAST.tries} times" in message
    assert "no answer within" in message


def test_a_shard_stalled_before_the_headers_once_is_retried(served: FaultProxy, tmp_path: Path, pristine: Path) -> None:
    rs = opened(f"{served.url}/set", tmp_path)
    served.inject("stall", method="GET", path=SHARD, stall_s=30.0)
    started = time.monotonic()
    assert rs.download(1, urgent=True)
    # Invariant: the stalled try timed out and the next one brought the shard's bytes
    assert time.monotonic() - started < 5.0
    assert served.hits("stall") == 1
    file = rs.manifest.shards[1].file  # type: ignore[union-attr]
    assert (rs.mirror / file).read_bytes() == (pristine / file).read_bytes()


def test_a_shard_stalled_mid_body_once_is_retried(served: FaultProxy, tmp_path: Path, pristine: Path) -> None:
    rs = opened(f"{served.url}/set", tmp_path)
    served.inject("stall-body", method="GET", path=SHARD, stall_s=30.0)
    started = time.monotonic()
    assert rs.download(1, urgent=True)
    # Invariant: a body that stops coming is a read timeout, and the download is tried again
    assert time.monotonic() - started < 5.0
    assert served.hits("stall-body") == 1
    file = rs.manifest.shards[1].file  # type: ignore[union-attr]
    assert (rs.mirror / file).read_bytes() == (pristine / file).read_bytes()


def test_a_shard_stalling_mid_body_every_time_is_a_named_remote_error(served: FaultProxy, tmp_path: Path) -> None:
    rs = opened(f"{served.url}/set", tmp_path)
    served.inject("stall-body", method="GET", path=SHARD, stall_s=30.0, times=1000)
    started = time.monotonic()
    with pytest.raises(RemoteError) as caught:
        rs.download(1, urgent=True)
    # Invariant: bounded by tries x read timeout; the error names the shard's URL and the timeout
    assert time.monotonic() - started < FAST.tries * (SHORT.sock_read or 0) + 5.0
    assert rs.shard_url(1) in str(caught.value) and "no answer within" in str(caught.value)


def test_https_to_a_plain_http_server_says_to_check_the_scheme(served: FaultProxy, tmp_path: Path) -> None:
    url = served.url.replace("http://", "https://") + "/set"
    started = time.monotonic()
    with pytest.raises(RemoteError) as caught:
        shardload.open(
            url, remote=remote(tmp_path, retry=RetryPolicy(tries=5, base_delay=30.0, max_delay=30.0, jitter=0.0))
        )
    message = str(caught.value)
    # Invariant: a TLS handshake answered in plain HTTP is not retried (a retry would wait 30 s first): the
    # scheme is wrong, not the network. The margin is wide: the refusal itself took up to 4 s on a loaded machine
    assert time.monotonic() - started < 20.0
    assert not isinstance(caught.value, ManifestError)
    assert f"{url}/manifest.json" in message
    assert re.search(r"plain HTTP.*http://", message), message


def test_the_http_client_has_connect_and_read_timeouts_unless_given() -> None:
    fs, _ = open_filesystem("https://example.org/set", {"skip_instance_cache": True})
    given = fs.client_kwargs["timeout"]
    # Invariant: no HTTP(S) read waits without a bound, by default
    assert (given.sock_connect, given.sock_read, given.total) == (CONNECT_TIMEOUT, READ_TIMEOUT, None)
    mine = aiohttp.ClientTimeout(sock_read=120)
    fs, _ = open_filesystem(
        "https://example.org/set", {"skip_instance_cache": True, "client_kwargs": {"timeout": mine}}
    )
    assert fs.client_kwargs["timeout"] is mine


_LOADER = """
import sys, time
import aiohttp
import shardload
from shardload.errors import ShardloadError
from shardload.load.options import LoaderOptions
from shardload.remote import RemoteOptions, RetryPolicy
url, cache = sys.argv[1:3]
# one try, whose read times out after 10 s: 5 times the loader's timeout, which must end the wait first;
# the prefetch downloads left running end 10 s in, and the process can exit
storage = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(sock_read=10.0)}}
remote = RemoteOptions(storage_options=storage, cache_dir=cache, retry=RetryPolicy(tries=1))
loader = shardload.make_loader(url, batch_size=8, rank=0, world_size=1, remote=remote,
    loader_options=LoaderOptions(num_workers=2, timeout=2))
started = time.monotonic()
try:
    for _ in loader:
        pass
except ShardloadError as exc:
    print(f"ERROR {type(exc).__name__} after {time.monotonic() - started:.1f} s: {exc}", flush=True)
    sys.exit(3)
print("NO ERROR", flush=True)
"""


@pytest.mark.slow
def test_a_loader_with_workers_and_a_timeout_ends_over_a_stalled_shard(served: FaultProxy, tmp_path: Path) -> None:
    """A read timeout longer than the loader's: the loader's ``timeout=2`` must end the wait, not the download's."""
    RemoteSet(f"{served.url}/set", remote(tmp_path, timeout=None)).open()  # the metadata cached: only shards stall
    served.inject("stall", method="GET", path=r"\.arrow$", times=1000, stall_s=120.0)
    out = run_with_watchdog(python("-c", _LOADER, f"{served.url}/set", str(tmp_path / "cache")), timeout=60)
    # Invariant: a worker stuck on a remote read gives a named WorkerError within the loader's timeout
    assert out.returncode == 3, out.tail()
    found = re.search(r"ERROR (\w+) after ([\d.]+) s", out.output)
    assert found is not None, out.tail()
    # the loader's 2 s, with room for starting two workers on a loaded machine, and well under the read's 10 s
    assert found.group(1) == "WorkerError" and float(found.group(2)) < 8.0, out.tail()
    assert "within timeout=2 s" in out.output, out.tail()


def _s3_remote(tmp_path: Path, endpoint: str) -> RemoteOptions:
    storage = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint}}
    return RemoteOptions(storage_options=storage, cache_dir=tmp_path / "cache", retry=RetryPolicy(tries=1))


def test_an_s3_endpoint_refusing_connections_is_named_not_the_bucket(tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(RemoteError) as caught:
        shardload.open("s3://bucket/set", remote=_s3_remote(tmp_path, f"http://127.0.0.1:{port}"))
    message = str(caught.value)
    # Invariant: the advice names the endpoint that refused, and says to check the endpoint, not the bucket
    assert f"127.0.0.1:{port}" in message and "at bucket" not in message, message
    assert re.search(r"check the endpoint.*endpoint_url.*AWS_ENDPOINT_URL", message), message


def test_an_https_s3_endpoint_to_a_plain_http_server_names_the_endpoint(served: FaultProxy, tmp_path: Path) -> None:
    endpoint = served.url.replace("http://", "https://")
    with pytest.raises(RemoteError) as caught:
        shardload.open("s3://bucket/set", remote=_s3_remote(tmp_path, endpoint))
    message = str(caught.value)
    # Invariant: the endpoint's host and port are named, with the scheme to check, never the bucket as a host
    assert endpoint.split("//")[1] in message and "bucket answered" not in message, message
    assert re.search(r"plain HTTP.*endpoint", message), message
