"""Which URL forms name a shard set, parsed by the storage libraries' rules; every other form refused by name.

Claims tested: ``file:///abs/path`` (and ``file://localhost/...``, percent escapes as ``Path.as_uri()``
writes them) is the local path everywhere a path is taken: ``open``, ``make_loader``, ``describe``,
``verify``, ``inspect``/``verify``/``plan`` and ``prepare -o``/``write``; a ``file://`` URL on another
host is refused. A query string or fragment (``s3://bucket/set?versionId=1``, ``http://host/set?x=1``)
is a ``RemoteError`` saying to drop it, before any request, never "damaged set, re-run prepare". An
unsupported scheme (``ftp://``, ``memory://``, ``foo://``) is a ``RemoteError`` "unsupported URL scheme
'ftp'; supported: ..." before any request (CLI exit 8), from every entry point. Credentials written
into an ``s3://``/``gs://`` URL, which s3fs and gcsfs read as part of the bucket name, are refused; so
are a port outside 0-65535 and an HTTP URL with no host, and credentials both in an HTTP URL and in an
``Authorization`` header (aiohttp's ``ValueError``, which fsspec hid as "no manifest"), before any request.
Any other setting the HTTP client refuses is named with its reason, never "not a shard set".
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.cli import main
from shardload.errors import RemoteError
from shardload.remote import RemoteOptions
from shardload.sets.describe import describe
from shardload.sets.verify import verify
from shardload.testing import synthetic_samples
from tests.helpers.servers import free_port, http_server

SUPPORTED = "s3, s3a, gs, gcs, az, abfs, abfss, http, https, file"


@pytest.fixture
def local_set(pristine: Path, tmp_path: Path) -> Path:
    """A copy of the pristine set under a directory whose name needs percent escapes in a URL."""
    return Path(shutil.copytree(pristine, tmp_path / "my set"))


@pytest.fixture
def http_set(pristine: Path, tmp_path: Path) -> Iterator[str]:
    """The pristine set served over HTTP on 127.0.0.1; yields its URL."""
    root = tmp_path / "www"
    shutil.copytree(pristine, root / "set")
    with http_server(root) as base:
        yield f"{base}/set"


def _entry_points(cache: Path) -> dict[str, Callable[[str], Any]]:
    remote = RemoteOptions(cache_dir=cache)
    return {
        "open": lambda url: shardload.open(url, remote=remote),
        "describe": lambda url: describe(url, remote=remote),
        "verify": lambda url: verify(url, remote=remote, progress=False),
        "make_loader": lambda url: shardload.make_loader(url, batch_size=4, rank=0, world_size=1, remote=remote),
        "write": lambda url: shardload.write(synthetic_samples(4, seed=1), url, progress=False, staging=cache / "s"),
    }


@pytest.mark.parametrize("form", ["file:///{path}", "file://localhost/{path}", "FILE:///{path}"])
def test_a_file_url_is_the_local_path_everywhere(local_set: Path, tmp_path: Path, form: str) -> None:
    url = form.format(path=local_set.as_uri()[len("file:///") :])
    want = shardload.open(local_set)
    got = shardload.open(url)
    # Invariant: a file:// URL opens the very directory it names, with no node cache
    assert got.url is None and got.path == local_set and got.fingerprint == want.fingerprint
    assert describe(url)["fingerprint"] == want.fingerprint
    assert verify(url, progress=False).ok
    batches = list(shardload.make_loader(url, batch_size=8, rank=0, world_size=1))
    assert sum(len(b["tokens"]) for b in batches) == len(want)
    assert not (tmp_path / "cache").exists()


def test_a_file_url_works_in_every_command(local_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = local_set.as_uri()
    assert main(["inspect", url, "--json"]) == 0
    assert main(["verify", url, "--no-progress"]) == 0
    assert main(["plan", url, "--world-size", "2", "--batch-size", "4", "--json"]) == 0
    src = tmp_path / "src.npy"
    np.save(src, np.arange(12, dtype=np.int32).reshape(3, 4))
    out = tmp_path / "out dir"
    assert main(["prepare", str(src), "-o", out.as_uri(), "--no-progress"]) == 0
    capsys.readouterr()
    # Invariant: prepare -o file://... writes the set into that directory, never into a folder named "file:"
    assert (out / "manifest.json").is_file() and not Path("file:").exists()
    shardload.write(synthetic_samples(5, seed=2), (tmp_path / "w").as_uri(), progress=False)
    assert len(shardload.open(tmp_path / "w")) == 5


def test_a_file_url_on_another_host_is_refused(local_set: Path) -> None:
    with pytest.raises(RemoteError, match=r"file://otherhost/.*names a file on host 'otherhost'.*file:///"):
        shardload.open(f"file://otherhost{local_set}")


@pytest.mark.parametrize(
    "url",
    [
        "s3://bucket/set?versionId=1",
        "s3://bucket/set#frag",
        "gs://bucket/set?generation=5",
        "file:///data/set?x=1",
    ],
)
@pytest.mark.parametrize("entry", ["open", "describe", "verify", "make_loader", "write"])
def test_a_query_or_fragment_is_refused_before_any_request(url: str, entry: str, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"query string|fragment") as err:
        _entry_points(tmp_path / "cache")[entry](url)
    message = str(err.value)
    # Invariant: the URL form is named with what to write instead, and never blamed on the set
    assert url.split("?")[0].split("#")[0] in message and "drop" in message
    assert "re-run prepare" not in message and "damaged" not in message
    assert time.monotonic() - started < 5 and not (tmp_path / "cache").exists()


def test_an_http_query_string_is_refused_not_reported_as_a_damaged_set(http_set: str, tmp_path: Path) -> None:
    assert len(shardload.open(http_set, cache_dir=tmp_path / "cache"))  # the set itself reads
    for url in (f"{http_set}?x=1", f"{http_set}#top"):
        with pytest.raises(RemoteError, match=r"query string|fragment") as err:
            shardload.open(url, cache_dir=tmp_path / "cache2")
        assert "re-run prepare" not in str(err.value) and "damaged" not in str(err.value)


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:{port}/set", "FTP://host.invalid/set", "memory://set", "foo://x/y"])
@pytest.mark.parametrize("entry", ["open", "describe", "verify", "make_loader", "write"])
def test_an_unsupported_scheme_is_refused_by_name(url: str, entry: str, tmp_path: Path) -> None:
    url = url.format(port=free_port())
    scheme = url.split("://")[0].lower()
    started = time.monotonic()
    with pytest.raises(RemoteError) as err:
        _entry_points(tmp_path / "cache")[entry](url)
    # Invariant: the scheme is named with the list of supported ones, before any request (no DNS, no connect)
    assert f"unsupported URL scheme '{scheme}'; supported: {SUPPORTED}" in str(err.value)
    assert "Name or service" not in str(err.value)
    assert time.monotonic() - started < 5 and not (tmp_path / "cache").exists()


def test_an_unsupported_scheme_exits_8_from_every_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src.npy"
    np.save(src, np.arange(12, dtype=np.int32).reshape(3, 4))
    url = "ftp://host.invalid/set"
    for argv in (
        ["inspect", url],
        ["verify", url],
        ["plan", url, "--world-size", "2", "--batch-size", "4"],
        ["prepare", str(src), "-o", url, "--no-progress"],
    ):
        assert main([*argv, "--cache-dir", str(tmp_path / "c")] if argv[0] != "prepare" else argv) == 8, argv
        err = capsys.readouterr().err
        assert "unsupported URL scheme 'ftp'" in err and "internal error" not in err, err


@pytest.mark.parametrize("url", ["s3://KEY:SECRET@bucket/set", "gs://user@bucket/set"])
def test_credentials_in_an_object_store_url_are_refused(url: str, tmp_path: Path) -> None:
    with pytest.raises(RemoteError, match=r"storage_options") as err:
        shardload.open(url, cache_dir=tmp_path / "cache")
    assert "SECRET" not in str(err.value)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("http://127.0.0.1:99999/set", r"port .*99999.* out of range|port.*0-65535"),
        ("https://host.invalid:0x50/set", r"port"),
        ("http:///set", r"no host"),
        ("https://:8080/set", r"no host"),
    ],
)
@pytest.mark.parametrize("entry", ["open", "write"])
def test_a_malformed_http_url_is_refused_by_name_before_any_request(
    url: str, named: str, entry: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RemoteError, match=named) as err:
        _entry_points(tmp_path / "cache")[entry](url)
    # Invariant: the URL is named, never blamed on the set or the storage service
    assert url in str(err.value) and "not a shard set" not in str(err.value) and "rejected" not in str(err.value)
    assert not (tmp_path / "cache").exists()
    assert main(["inspect", url]) == 8
    assert "not a shard set" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "given",
    [
        {"headers": {"Authorization": "Bearer X"}},
        {"client_kwargs": {"headers": {"authorization": "Bearer X"}}},
    ],
)
def test_credentials_in_the_url_and_an_authorization_header_are_refused_up_front(
    http_set: str, given: dict[str, Any], tmp_path: Path
) -> None:
    """aiohttp refuses the pair (``ValueError``), which fsspec hid as "no manifest": refused before any request."""
    url = http_set.replace("http://", "http://u:pw@")
    with pytest.raises(RemoteError) as err:
        shardload.open(url, storage_options=given, cache_dir=tmp_path / "cache")
    message = str(err.value)
    # Invariant: both places the credentials came from are named, and the set is not blamed
    assert "Authorization" in message and "user:password@" in message and "storage_options" in message, message
    assert "not a shard set" not in message


def test_a_credential_in_an_object_store_url_message_has_the_right_article(tmp_path: Path) -> None:
    for url in ("gs://user:x@bucket/set", "s3://KEY:SECRET@bucket/set"):
        with pytest.raises(RemoteError) as err:
            shardload.open(url, cache_dir=tmp_path / "cache")
        assert "an gs://" not in str(err.value) and "a s3://" not in str(err.value)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # aiohttp 3.x deprecates auth=, which still reaches it
def test_options_the_http_client_refuses_are_named_not_a_missing_set(http_set: str, tmp_path: Path) -> None:
    """Any client-side refusal fsspec hides as ``FileNotFoundError`` (here aiohttp's header + ``auth=``)."""
    import aiohttp

    given = {"headers": {"Authorization": "Bearer X"}, "auth": aiohttp.BasicAuth("u", "pw")}
    with pytest.raises(RemoteError) as err:
        shardload.open(http_set, storage_options=given, cache_dir=tmp_path / "cache")
    message = str(err.value)
    # Invariant: the client's own reason is named with where to fix it, never "not a shard set"
    assert "Cannot combine" in message and "storage_options" in message and "not a shard set" not in message, message
