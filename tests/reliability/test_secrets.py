"""No credential is ever printed: a URL's password and secret storage options are masked in every text.

Claims tested, against real servers on 127.0.0.1 (the stdlib HTTP server ignores the Basic auth that
``http://user:SECRETPW@host/set`` sends; rclone S3 checks its key and secret): ``inspect``, ``verify``,
``plan`` (human and ``--json``, with ``--debug``) and ``prepare -o URL``, on a working set, a missing one,
a damaged one and an unwritable URL, print ``user:***@`` and never the password; the Python entry points
(``open``, ``describe``, ``verify``, ``make_loader``) never show it in a repr, a result, an exception's
``str``/``repr``/``url``/traceback, a warning or a log record (DEBUG included); nor do the cache's and
the staging's files on disk. ``repr(RemoteOptions)`` masks secret-like storage options, nested ones too,
and a secret given in storage_options that a storage library's message quotes is masked as well. Nor is
one shown from a ``file://`` URL's user part, a token as a URL's lone user (``https://TOKEN@host``), a
fragment's ``#token=``, any storage library's DEBUG log (botocore's ``x-amz-security-token``, rclone S3) or
the storage errors chained behind a shardload error (``__cause__``/``__context__``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.cli import main
from shardload.errors import RemoteError, ShardloadError
from shardload.remote import RemoteOptions, RetryPolicy, open_filesystem
from shardload.sets.describe import describe
from shardload.sets.verify import verify
from tests.helpers.servers import SECRET, S3Server, free_port, http_server

PASSWORD = "SECRETPW"
MASKED = "***"
FAST = RetryPolicy(tries=2, base_delay=0.01, max_delay=0.02)


@pytest.fixture
def www(pristine: Path, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A good set (``set``) and a damaged one (``bad``) over HTTP; yields the root and ``http://user:PASSWORD@host``."""
    root = tmp_path / "www"
    shutil.copytree(pristine, root / "set")
    shutil.copytree(pristine, root / "bad")
    (root / "bad" / "manifest.json").write_text("{not json")
    with http_server(root) as base:
        yield root, base.replace("http://", f"http://user:{PASSWORD}@")


def _no_secret(texts: list[str], *secrets: str) -> None:
    for text in texts:
        for secret in secrets:
            # Invariant: no credential in any text shardload let out
            assert secret not in text, text


def test_the_cli_never_prints_a_url_password(
    www: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    _, base = www
    cache = ["--cache-dir", str(tmp_path / "cache")]
    src = tmp_path / "src.npy"
    np.save(src, np.arange(12, dtype=np.int32).reshape(3, 4))
    runs = {
        ("inspect", f"{base}/set"): 0,
        ("inspect", f"{base}/set", "--json"): 0,
        ("verify", f"{base}/set"): 0,
        ("verify", f"{base}/set", "--json"): 0,
        ("plan", f"{base}/set", "--world-size", "2", "--batch-size", "4"): 0,
        ("plan", f"{base}/set", "--world-size", "2", "--batch-size", "4", "--json"): 0,
        ("--debug", "inspect", f"{base}/missing"): 5,
        ("--debug", "verify", f"{base}/bad"): 5,
        ("plan", f"{base}/bad", "--world-size", "2", "--batch-size", "4", "--json"): 5,
        ("--debug", "inspect", f"{base}/set?token={PASSWORD}"): 8,
    }
    texts: list[str] = []
    caplog.set_level(logging.DEBUG)
    for argv, code in runs.items():
        assert main([*argv, *cache]) == code, (argv, capsys.readouterr())
        out, err = capsys.readouterr()
        texts += [out, err]
    assert main(["--debug", "prepare", str(src), "-o", f"{base}/out", "--staging", str(tmp_path / "st")]) != 0
    texts += [*capsys.readouterr(), *(r.getMessage() for r in caplog.records)]
    _no_secret(texts, PASSWORD)
    # Invariant: the URL is still named, with its password masked
    assert sum("user:***@127.0.0.1" in t for t in texts) >= len(runs)
    files = [p.read_bytes().decode("utf-8", "replace") for p in tmp_path.rglob("*") if p.is_file()]
    _no_secret([*files, *(str(p) for p in tmp_path.rglob("*"))], PASSWORD)


def test_python_entry_points_never_show_a_url_password(
    www: tuple[Path, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, base = www
    caplog.set_level(logging.DEBUG)
    remote = RemoteOptions(cache_dir=tmp_path / "cache", retry=FAST)
    texts: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ss = shardload.open(f"{base}/set", remote=remote)
        texts += [repr(ss), str(ss.path), describe(f"{base}/set", remote=remote)["path"]]
        report = verify(f"{base}/set", remote=remote, progress=False)
        texts += [report.path, str(report.to_json())]
        loader = shardload.make_loader(f"{base}/set", batch_size=8, rank=0, world_size=1, remote=remote)
        assert sum(len(b["tokens"]) for b in loader) == len(ss)
        closed = f"http://user:{PASSWORD}@127.0.0.1:{free_port()}/set"
        for url in (f"{base}/missing", f"{base}/bad", closed, f"ftp://user:{PASSWORD}@host/set"):
            with pytest.raises(ShardloadError) as err:
                shardload.open(url, remote=remote)
            texts += [str(err.value), repr(err.value), getattr(err.value, "url", "")]
            texts += traceback.format_exception(err.value)
    texts += [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    _no_secret(texts, PASSWORD)
    assert "user:***@127.0.0.1" in repr(ss)


def test_remote_options_and_s3_errors_never_show_storage_secrets(s3: S3Server, tmp_path: Path) -> None:
    local = tmp_path / "set"
    shardload.write([{"tokens": np.arange(5, dtype=np.int32)}] * 4, local, progress=False)
    url = s3.upload(local, "secrets/set")
    given = {**s3.storage_options, "client_kwargs": {**s3.storage_options["client_kwargs"], "aws_session_token": "T"}}
    remote = RemoteOptions(storage_options=given, cache_dir=tmp_path / "cache", retry=FAST)
    texts = [repr(remote), str(remote), repr(shardload.open(url, remote=remote))]
    assert "'secret': '***'" in repr(remote) and "'aws_session_token': '***'" in repr(remote)
    wrong = RemoteOptions(storage_options={**given, "secret": "WRONG-SECRET-9f8e7d"}, cache_dir=tmp_path / "c2")
    with pytest.raises(RemoteError) as err:
        shardload.open(url, remote=wrong)
    texts += [str(err.value), repr(err.value), repr(wrong), *traceback.format_exception(err.value)]
    _no_secret(texts, SECRET, "WRONG-SECRET-9f8e7d")


def test_a_storage_secret_quoted_by_a_library_message_is_masked(tmp_path: Path) -> None:
    token = "tok-" + "a1b2c3d4e5f6"
    # the secret reaches the storage library (a real fsspec filesystem); its message may quote it
    open_filesystem("http://127.0.0.1/set", {"headers": {"Authorization": f"Bearer {token}"}})
    err = RemoteError(f"the store said: invalid token Bearer {token} for http://127.0.0.1/set")
    assert token not in str(err) and "invalid token *** for" in str(err)
    with pytest.raises(RemoteError):
        shardload.open(f"gs://{token}:x@bucket/set", cache_dir=tmp_path / "cache")


def test_json_on_the_real_stdout_of_the_command_is_masked(www: tuple[Path, str], tmp_path: Path) -> None:
    """``--json`` writes to a saved copy of descriptor 1 (so that a map's prints go to stderr): masked there too."""
    _, base = www
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for command in ("inspect", "verify"):
        argv = [sys.executable, "-m", "shardload", command, f"{base}/set", "--json", "--cache-dir", str(tmp_path)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        # Invariant: the one JSON line names the URL with its password masked, in a real process's stdout
        assert json.loads(done.stdout)["path"] == f"{base}/set".replace(PASSWORD, "***"), done.stdout
        _no_secret([done.stdout, done.stderr], PASSWORD)


def _chain(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and every exception chained behind it (``__cause__``, ``__context__``), as an error reporter walks it."""
    found: list[BaseException] = []
    while exc is not None and exc not in found:
        found.append(exc)
        exc = exc.__cause__ or exc.__context__
    return found


def test_a_file_url_with_a_password_never_prints_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src.npy"
    np.save(src, np.arange(12, dtype=np.int32).reshape(3, 4))
    assert main(["inspect", f"file://u:{PASSWORD}123@localhost/tmp/x"]) == 8
    assert main(["prepare", str(src), "-o", f"file://u:{PASSWORD}456@h/tmp/out"]) == 8
    out, err = capsys.readouterr()
    _no_secret([out, err], PASSWORD)
    # Invariant: the host is still named, without its userinfo
    assert "on host 'h'" in err, err


def test_a_token_written_as_the_user_name_is_masked(www: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    """``https://TOKEN@host/set``, as GitHub tokens are written: the lone user part of a URL is masked whole."""
    _, base = www
    token = "ghp_" + "Z9y8X7w6V5u4T3s2"
    url = base.replace(f"user:{PASSWORD}@", f"{token}@")
    assert main(["inspect", f"{url}/missing", "--cache-dir", str(www[0].parent / "cache")]) == 5
    out, err = capsys.readouterr()
    _no_secret([out, err], token)
    # Invariant: the URL is still named, with its user part masked
    assert f"http://***@{url.split('@')[1]}/missing" in err, err


def test_a_secret_in_a_fragment_is_masked_like_one_in_a_query(capsys: pytest.CaptureFixture[str]) -> None:
    for url in (f"http://127.0.0.1:9/set#token={PASSWORD}", f"http://127.0.0.1:9/set#access_token={PASSWORD}&x=1"):
        assert main(["inspect", url]) == 8
        out, err = capsys.readouterr()
        _no_secret([out, err], PASSWORD)
        # Invariant: the parameter is named, masked, and the message goes on after the URL
        assert f"{url.replace(PASSWORD, MASKED)}: a fragment" in err, err


def test_storage_library_logs_never_show_a_token_or_an_endpoint_password(
    s3: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """DEBUG logging of botocore (``x-amz-security-token:`` in its canonical request), aiobotocore and the rest."""
    local = tmp_path / "set"
    shardload.write([{"tokens": np.arange(5, dtype=np.int32)}] * 4, local, progress=False)
    url = s3.upload(local, "logs/set")
    endpoint = s3.endpoint.replace("http://", f"http://user:{PASSWORD}77@")
    given = {**s3.storage_options, "token": "TOPSECRETTOKEN", "client_kwargs": {"endpoint_url": endpoint}}
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ShardloadError):  # rclone refuses a session token it did not issue, or the endpoint's user
        shardload.open(url, remote=RemoteOptions(storage_options=given, cache_dir=tmp_path / "cache", retry=FAST))
    names = {r.name.split(".")[0] for r in caplog.records}
    # Invariant: the storage libraries did log the requests at DEBUG (else this test proves nothing)
    assert {"botocore", "aiobotocore"} <= names, names
    _no_secret([caplog.text, *(r.getMessage() for r in caplog.records)], "TOPSECRETTOKEN", PASSWORD, SECRET)


def test_header_style_secrets_are_masked_in_log_records() -> None:
    from shardload._base.redact import redact_log

    text = "CanonicalRequest:\nGET\n/b\n\nhost:h\nx-amz-security-token:TOK123\n" + (
        "headers={'X-Amz-Security-Token': b'TOK456', 'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIA/x, "
        "Signature=ab12'}\nAuthorization: Bearer TOK789"
    )
    masked = redact_log(text)
    # Invariant: a header whose name is secret-like has its value masked, in a log line or a dict's repr
    _no_secret([masked], "TOK123", "TOK456", "TOK789", "AKIA", "ab12")
    assert "host:h" in masked and "x-amz-security-token:***" in masked


def test_the_storage_errors_chained_behind_an_error_are_masked(www: tuple[Path, str], tmp_path: Path) -> None:
    """An error reporter (Sentry) shows ``__cause__``/``__context__`` too: fsspec's ``FileNotFoundError(url)``."""
    _, base = www
    remote = RemoteOptions(cache_dir=tmp_path / "cache", retry=FAST)
    closed = f"http://user:{PASSWORD}@127.0.0.1:{free_port()}/set"
    for url in (f"{base}/missing", closed):
        with pytest.raises(ShardloadError) as err:
            shardload.open(url, remote=remote)
        chained = _chain(err.value)
        # Invariant: the storage library's error is still chained (the cause is kept), with its URL masked
        assert len(chained) > 1
        texts = [f"{e!s} {e!r} {e.args!r} {getattr(e, 'filename', '')}" for e in chained]
        _no_secret(texts, PASSWORD)


@pytest.mark.parametrize("name", ["apikey", "accesstoken", "clientSecret", "dbpassword"])
def test_glued_secret_names_are_masked_in_queries_and_options(name: str) -> None:
    value = "GLUEDSECRET99"
    with pytest.raises(RemoteError) as info:
        shardload.open(f"http://127.0.0.1:9/set?{name}={value}")
    texts = [str(info.value), repr(info.value)]
    texts.append(repr(RemoteOptions(storage_options={"headers": {name: value}})))
    # Headers may be given as a list of (name, value) pairs: masked as a mapping's
    texts.append(
        repr(RemoteOptions(storage_options={"headers": [(name, value), ("Authorization", f"Bearer {value}")]}))
    )
    # Invariant: a secret word glued to another still marks its value as a secret, in every form
    _no_secret(texts, value)
    assert f"?{name}=***" in texts[0], texts[0]
