"""A fault-injecting HTTP proxy on 127.0.0.1, in front of the test S3 or HTTP server.

Requests pass through unchanged (the ``Host`` header included, so S3 signatures
stay valid) unless a fault was injected for them; each injected fault hits the
next ``times`` matching requests, then the proxy is transparent again::

    with FaultProxy(s3.endpoint) as proxy:
        proxy.inject("503", path=r"shards/", times=2)   # two S3 SlowDown answers
        proxy.inject("corrupt", method="GET", path=r"\\.arrow$")
        ...  # point the client at proxy.url
        assert proxy.hits("503") == 2

Faults:
    ``"503"``: an S3 ``SlowDown`` error (status 503, XML body), upstream not asked.
    ``"500"``: an S3 ``InternalError`` (status 500).
    ``"400"``: an S3 ``InvalidRequest`` (status 400): an answer no retry changes.
    ``"429"``: ``Too Many Requests`` (status 429, ``Retry-After: 1``), as HTTP servers and CDNs throttle.
    ``"stall"``: wait ``stall_s`` seconds, then answer normally (a client timeout shorter than that fires).
    ``"stall-body"``: send the headers with the full length and half the body (or ``keep=`` bytes), wait
    ``stall_s`` seconds, then send the rest (a client read timeout shorter than that fires mid-body).
    ``"drop"``: close the connection without any answer.
    ``"truncate"``: send the headers with the full length, half the body, then close.
    ``"truncate-corrupt"``: as ``"truncate"``, with one byte of the half sent changed.
    ``"corrupt"``: answer normally with one byte of the body changed (same length).
    ``"ignore-range"``: answer a ranged GET with ``200`` and the whole body (a server that ignores
    ranges; the body is the one of the last whole GET of that path through the proxy).
    ``"wrong-range"``: answer a ranged GET with a ``206`` of the right length holding the object's
    first bytes instead of the range asked for (same source of the body).

``keep=`` (``"truncate"``, ``"truncate-corrupt"``, ``"stall-body"``): the bytes of the body sent before the
connection is closed, instead of half (a negative count is from the end: ``-1``, all but the
last byte).

Each request is logged with its ``Range`` header (``None`` without one), so a test can tell a
whole GET from a ranged one and see where a ranged one starts.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from types import TracebackType

FAULTS = (
    "503",
    "500",
    "400",
    "429",
    "stall",
    "stall-body",
    "drop",
    "truncate",
    "truncate-corrupt",
    "corrupt",
    "ignore-range",
    "wrong-range",
)
_ERROR_BODIES = {
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "400": (400, "InvalidRequest", "The request is not valid for this service."),
    "429": (429, "TooManyRequests", "Too many requests; slow down."),
}
# hop-by-hop headers and those the proxy recomputes
_SKIP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


@dataclass
class _Fault:
    kind: str
    method: str | None
    path: re.Pattern[str]
    times: int
    stall_s: float
    skip: int = 0
    keep: int | None = None
    ranged: bool | None = None
    hits: int = 0


@dataclass
class Request:
    """One request the proxy saw, the fault it got (``None``: passed through) and its ``Range`` header."""

    method: str
    path: str
    fault: str | None
    range: str | None = None

    @property
    def range_start(self) -> int | None:
        """The first byte a ``bytes=N-...`` range asks for (``None``: a whole GET)."""
        if self.range is None:
            return None
        return int(self.range.removeprefix("bytes=").split("-", 1)[0])


@dataclass
class _State:
    upstream: tuple[str, int]
    faults: list[_Fault] = field(default_factory=list)
    log: list[Request] = field(default_factory=list)
    bodies: dict[str, bytes] = field(default_factory=dict)  # path -> the body of its last whole GET
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, method: str, path: str, range_: str | None) -> _Fault | None:
        with self.lock:
            taken = None
            for f in self.faults:
                if (
                    (f.method is None or f.method == method)
                    and (f.ranged is None or f.ranged == (range_ is not None))
                    and f.path.search(path)
                ):
                    if f.skip > 0:  # every matching request counts, whichever fault it gets
                        f.skip -= 1
                    elif taken is None and f.hits < f.times:
                        f.hits += 1
                        taken = f
            self.log.append(Request(method, path, taken.kind if taken else None, range_))
            return taken


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: _State  # set on the subclass made per proxy

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self) -> None:
        body = self._body()
        fault = self.state.take(self.command, urllib.parse.urlsplit(self.path).path, self.headers.get("Range"))
        kind = fault.kind if fault else None
        if kind == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if kind in _ERROR_BODIES:
            status, code, text = _ERROR_BODIES[kind]
            xml = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{text}</Message>'
                f"<Resource>{self.path}</Resource></Error>"
            ).encode()
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml) if self.command != "HEAD" else 0))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(xml)
            return
        if kind == "stall" and fault is not None:
            time.sleep(fault.stall_s)
        path = urllib.parse.urlsplit(self.path).path
        status, headers, payload = self._misanswer(kind, path, *self._upstream(body))
        sent = len(payload) // 2
        if fault is not None and fault.keep is not None:
            sent = max(0, fault.keep if fault.keep >= 0 else len(payload) + fault.keep)
        if kind in ("corrupt", "truncate-corrupt") and payload:
            i = len(payload) // 2 if kind == "corrupt" else min(sent // 2, len(payload) - 1)  # within what is sent
            payload = payload[:i] + bytes([payload[i] ^ 0xFF]) + payload[i + 1 :]
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in _SKIP_HEADERS:
                self.send_header(name, value)
        length = int(dict((k.lower(), v) for k, v in headers).get("content-length", len(payload)))
        self.send_header("Content-Length", str(length if self.command == "HEAD" else len(payload)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if kind in ("truncate", "truncate-corrupt"):
            self.wfile.write(payload[:sent])
            self.wfile.flush()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if kind == "stall-body" and fault is not None:
            self.wfile.write(payload[:sent])
            self.wfile.flush()
            time.sleep(fault.stall_s)
            self.close_connection = True
            with contextlib.suppress(OSError):  # the client gave up meanwhile and closed the connection
                self.wfile.write(payload[sent:])
            return
        self.wfile.write(payload)

    def _upstream(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        host, port = self.state.upstream
        conn = http.client.HTTPConnection(host, port, timeout=60)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _SKIP_HEADERS:
                    conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            payload = resp.read()
            return resp.status, resp.getheaders(), payload
        finally:
            conn.close()

    def _misanswer(
        self, kind: str | None, path: str, status: int, headers: list[tuple[str, str]], payload: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Remember whole bodies; answer a ranged GET as a server ignoring ranges or misreading them would.

        The request itself is forwarded unchanged (its S3 signature covers the ``Range`` header), and the
        answer built from the object's whole body, seen on an earlier whole GET through this proxy.
        """
        if self.command != "GET":
            return status, headers, payload
        if self.headers.get("Range") is None and status == 200:
            with self.state.lock:
                self.state.bodies[path] = payload
            return status, headers, payload
        whole = self.state.bodies.get(path)
        if kind not in ("ignore-range", "wrong-range") or status not in (200, 206) or whole is None:  # rclone: 200
            return status, headers, payload
        kept = [(k, v) for k, v in headers if k.lower() != "content-range"]
        if kind == "ignore-range":
            return 200, kept, whole
        wrong = whole[: len(payload)]
        return 206, [*kept, ("Content-Range", f"bytes 0-{len(wrong) - 1}/{len(whole)}")], wrong

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


class FaultProxy:
    """A proxy on 127.0.0.1 in front of ``upstream`` (``http://127.0.0.1:PORT``), faults on demand."""

    def __init__(self, upstream: str) -> None:
        parts = urllib.parse.urlsplit(upstream)
        if parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
            raise ValueError(f"the fault proxy only fronts servers on 127.0.0.1, got {upstream}")
        self._state = _State(("127.0.0.1", parts.port))
        handler = type("Handler", (_Handler,), {"state": self._state})
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def inject(
        self,
        kind: str,
        *,
        method: str | None = None,
        path: str = "",
        times: int = 1,
        stall_s: float = 5.0,
        skip: int = 0,
        keep: int | None = None,
        ranged: bool | None = None,
    ) -> None:
        """Make the next ``times`` requests whose path matches ``path`` (a regex) get fault ``kind``.

        ``skip``: let that many matching requests pass first (or get the faults injected before).
        ``keep``: for a truncation, the bytes of the body sent (negative: from the end); default half.
        ``ranged``: match only requests with (``True``) or without (``False``) a ``Range`` header.
        """
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {FAULTS}")
        with self._state.lock:
            self._state.faults.append(_Fault(kind, method, re.compile(path), times, stall_s, skip, keep, ranged))

    def clear(self) -> None:
        """Forget the faults not yet used, and the request log."""
        with self._state.lock:
            self._state.faults.clear()
            self._state.log.clear()

    @property
    def requests(self) -> list[Request]:
        """Every request seen so far, in order."""
        with self._state.lock:
            return list(self._state.log)

    def hits(self, kind: str | None = None) -> int:
        """Requests that got fault ``kind`` (any fault if ``None``)."""
        return sum(1 for r in self.requests if r.fault is not None and (kind is None or r.fault == kind))

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
