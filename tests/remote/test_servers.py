"""The test servers themselves work: objects put through S3 come back whole and by range."""

from __future__ import annotations

from pathlib import Path

from shardload.remote import is_remote, join_url, open_filesystem
from tests.helpers.servers import S3Server


def test_s3_round_trip(s3: S3Server, tmp_path: Path) -> None:
    f = tmp_path / "x.bin"
    f.write_bytes(bytes(range(256)) * 100)
    url = s3.upload(f, "servers/x.bin")
    fs, path = open_filesystem(url, s3.storage_options)
    assert fs.cat_file(path) == f.read_bytes()
    assert fs.cat_file(path, start=10, end=20) == f.read_bytes()[10:20]


def test_http_whole_get(http_root: tuple[Path, str]) -> None:
    root, base = http_root
    (root / "a.txt").write_text("hello")
    fs, path = open_filesystem(join_url(base, "a.txt"))
    assert fs.cat_file(path) == b"hello"


def test_url_or_path() -> None:
    assert is_remote("s3://b/set") and is_remote("https://h/set") and is_remote("gs://b/x")
    assert not is_remote("out/set") and not is_remote("file:///tmp/set") and not is_remote(Path("s3://x"))
    assert join_url("s3://b/set/", "/shards/", "a.arrow") == "s3://b/set/shards/a.arrow"


def test_missing_backend_names_the_package() -> None:
    import importlib.util

    import pytest

    from shardload.errors import MissingDependencyError, RemoteError

    if importlib.util.find_spec("gcsfs") is None:  # the test extra does not install gcsfs
        with pytest.raises(MissingDependencyError, match="pip install gcsfs"):
            open_filesystem("gs://bucket/set")
    # Invariant: a scheme outside the supported list is refused by name before fsspec is asked
    with pytest.raises(RemoteError, match="unsupported URL scheme 'nosuch'; supported: s3, "):
        open_filesystem("nosuch://bucket/set")
