"""A shard file's checksum, computed while the file is written instead of by reading it back.

Used by prepare's write step for the manifest's sha256 of each shard.
:func:`checksum_text` is the one spelling (``"sha256:<hex>"``), so a checksum
made while writing and one read back by :func:`file_checksum` compare equal.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["OVERLAP_BYTES", "DigestingFile", "checksum_text", "file_checksum"]

#: a write at least this large is hashed in a helper thread while it is written; smaller ones in line
OVERLAP_BYTES = 1 << 20


def checksum_text(digest: hashlib._Hash) -> str:
    """The checksum a manifest records for the bytes fed to ``digest`` (a sha256)."""
    return f"{digest.name}:{digest.hexdigest()}"


class DigestingFile:
    """A new (or truncated) file at ``path`` whose :attr:`checksum` is the sha256 of all bytes written.

    It has what ``pyarrow.PythonFile`` needs of a sink, so a pyarrow writer can
    write through it; a failed write (disk full) raises the system call's ``OSError``.
    """

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "wb", buffering=0)  # noqa: SIM115 (closed by close())
        self._digest = hashlib.sha256()
        self._pool: ThreadPoolExecutor | None = None
        self._size = 0

    @property
    def checksum(self) -> str:
        """``"sha256:<hex>"`` of the bytes written so far (as :func:`file_checksum` reads it)."""
        return checksum_text(self._digest)

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def write(self, data: Buffer) -> int:
        """Write all of ``data`` and hash it; a large buffer is hashed in a thread during the write."""
        view = memoryview(data).cast("B")
        if view.nbytes < OVERLAP_BYTES:
            self._digest.update(view)
            self._write_all(view)
            return view.nbytes
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="shardload-sha256")
        hashed = self._pool.submit(self._digest.update, view)
        try:
            self._write_all(view)
        finally:
            hashed.result()  # the buffer stays the caller's: never return while the thread reads it
        return view.nbytes

    def _write_all(self, view: memoryview) -> None:
        done = 0
        while done < view.nbytes:  # a raw write may take less than it was given
            done += os.write(self._fh.fileno(), view[done:])
        self._size += done

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        """Nothing to do: every write goes straight to the file."""

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._fh.close()

    def __enter__(self) -> DigestingFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def file_checksum(file: Path | BinaryIO, chunk: int = 8 << 20) -> str:
    """``"sha256:<hex>"`` of a file's bytes: a path, or a file already open for reading (read to its end)."""
    if not isinstance(file, (str, os.PathLike)):
        return _sha256_of(file, chunk)
    with open(file, "rb") as fh:
        return _sha256_of(fh, chunk)


def _sha256_of(fh: BinaryIO, chunk: int) -> str:
    h = hashlib.sha256()
    while block := fh.read(chunk):
        h.update(block)
    return checksum_text(h)
