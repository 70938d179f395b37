"""Writing an Arrow IPC file of several pieces' samples without concatenating them in memory first.

For :meth:`~shardload.formats.arrow.ArrowShardWriter.write_concatenated`: each numeric field goes to
pyarrow as a :func:`placeholder` of the concatenated size (an untouched anonymous mapping), and
:class:`SplicingFile` writes the pieces where a placeholder comes. Only a placeholder handed over
whole is replaced; else (:attr:`SplicingFile.complete`) the caller writes the plain way, so a
pyarrow that copied or cut a buffer costs time, never bytes.
"""

from __future__ import annotations

import mmap
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa

__all__ = ["SplicingFile", "placeholder"]


def placeholder(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` on an anonymous mapping: its pages exist only once touched.

    ``shape[0]`` must be at least 1 and every other dimension too (a mapping has at least one byte).
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    anonymous = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # private: a page read by mistake is not kept shared
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=anonymous), dtype=dtype).reshape(shape)


class SplicingFile:
    """A new file at ``path``, open for writing, where each placeholder buffer is written as its pieces.

    ``splices``: by placeholder address, its size in bytes and the C-contiguous arrays replacing it.
    """

    def __init__(self, path: Path, splices: Mapping[int, tuple[int, Sequence[np.ndarray]]]) -> None:
        self._fh = open(path, "wb")  # noqa: SIM115 (closed by close())
        self._splices = splices
        self._done: set[int] = set()
        self._missed = False

    @property
    def complete(self) -> bool:
        """Whether every placeholder was handed over whole, once, and so replaced by its pieces."""
        return not self._missed and self._done == set(self._splices)

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def write(self, data: pa.Buffer | bytes) -> int:
        if not isinstance(data, pa.Buffer):
            return self._fh.write(data)
        start, size = int(data.address), int(data.size)
        splice = self._splices.get(start)
        if splice is not None and splice[0] == size and start not in self._done:
            self._done.add(start)
            for piece in splice[1]:
                self._fh.write(piece.data.cast("B"))
            return size
        if any(a < start + size and start < a + n for a, (n, _) in self._splices.items()):
            self._missed = True  # a copy, a part or a second write of a placeholder: its bytes are not the data
        return self._fh.write(data)

    def tell(self) -> int:
        return self._fh.tell()

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> SplicingFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
