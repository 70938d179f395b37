"""The shard table of a shard set: one row per shard, held as columns (numpy arrays).

A :class:`~shardload.formats.manifest.Manifest`'s ``shards`` is a :class:`ShardTable`; a set of
:data:`SHARD_TABLE_MIN_SHARDS` shards or more keeps it in ``shards.arrow`` (format version 3),
read in one go, checked against the manifest's sha256 and validated vectorised (no Python object
per shard). Shard file names follow a :class:`NameRule`. docs/format.md, "Shard table (version 3)".
"""

from __future__ import annotations

import builtins
import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from shardload._base.setfiles import open_regular, os_error
from shardload.errors import ManifestError
from shardload.formats.arrow.ipc import LayoutError, check_ipc_layout

#: the table's file, beside ``manifest.json``
SHARD_TABLE_NAME = "shards.arrow"
#: sets of at least this many shards are written with a shard table (format version 3); smaller ones keep the
#: JSON list of versions 1 and 2, which every shardload reads and opens in well under 0.1 s
SHARD_TABLE_MIN_SHARDS = 1000
#: the integer columns, in file order
INT_COLUMNS = ("samples", "bytes", "first_sample", "tokens")
TABLE_SCHEMA = pa.schema(
    [*(pa.field(name, pa.int64(), nullable=False) for name in INT_COLUMNS)]
    + [pa.field("checksum", pa.binary(32), nullable=False)],
    metadata={"shardload.shard_table": "1"},
)
#: the size of a table file of ``n`` shards is at most this per shard plus :data:`_TABLE_OVERHEAD`
_ROW_BYTES = 8 * len(INT_COLUMNS) + 32
_TABLE_OVERHEAD = 64 << 10
_CHECKSUM = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class ShardInfo:
    """One shard of a set: its file (relative to the set) and what it must contain."""

    file: str
    samples: int
    bytes: int
    checksum: str
    first_sample: int
    tokens: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # the manifest's keys, in field order


@dataclass(frozen=True)
class NameRule:
    """How shard ``k`` is named: ``prefix`` + ``k`` zero-padded to ``digits`` + ``suffix``.

    In a set merged from parts, ``k`` counts inside the shard's part and the
    name is inside the part's folder (:class:`ShardFiles`).
    """

    suffix: str
    prefix: str = "shards/shard-"
    digits: int = 6

    def name(self, k: int) -> str:
        return f"{self.prefix}{k:0{self.digits}d}{self.suffix}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


T = TypeVar("T")


class _Lazy(Sequence[T]):
    """A sequence whose items are made on access by :meth:`item` (from an index already in range)."""

    def item(self, k: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, k: int) -> T: ...
    @overload
    def __getitem__(self, k: slice) -> list[T]: ...
    def __getitem__(self, k: int | slice) -> T | list[T]:
        n = len(self)
        if isinstance(k, slice):
            return [self.item(i) for i in range(*k.indices(n))]
        i = int(k) + n if int(k) < 0 else int(k)
        if not 0 <= i < n:
            raise IndexError(f"shard {k} out of range for {n} shards")
        return self.item(i)


class ShardFiles(_Lazy[str]):
    """The shards' file names, made from a :class:`NameRule` on access (no string per shard is held).

    ``part_starts``: ``(P,)`` first shard of each part (folder ``part_paths[p]``), ascending from 0;
    empty for a set of one run.
    """

    def __init__(
        self, rule: NameRule, count: int, part_starts: Sequence[int] = (), part_paths: Sequence[str] = ()
    ) -> None:
        self.rule, self.n = rule, count
        self.part_starts = np.asarray(part_starts, dtype=np.int64)
        self.part_paths = tuple(part_paths)

    def __len__(self) -> int:
        return self.n

    def item(self, k: int) -> str:
        if not len(self.part_starts):
            return self.rule.name(k)
        p = int(np.searchsorted(self.part_starts, k, side="right")) - 1
        return f"{self.part_paths[p]}/{self.rule.name(k - int(self.part_starts[p]))}"


class HexDigests(_Lazy[str]):
    """``"sha256:<hex>"`` checksums made on access from a ``(n, 32)`` array of raw digests."""

    def __init__(self, raw: NDArray[np.uint8]) -> None:
        self.raw = raw

    def __len__(self) -> int:
        return len(self.raw)

    def item(self, k: int) -> str:
        return "sha256:" + bytes(self.raw[k]).hex()


class ShardTable(_Lazy[ShardInfo]):
    """Every shard of a set as columns; ``table[k]`` is shard ``k``'s :class:`ShardInfo`, built on access.

    ``samples``, ``bytes``, ``first_sample``, ``tokens`` are ``(S,)`` int64 (:data:`INT_COLUMNS`, the
    order ``columns`` gives them in); ``files`` and ``checksums`` are sequences of ``S`` strings.
    """

    samples: NDArray[np.int64]
    bytes: NDArray[np.int64]
    first_sample: NDArray[np.int64]
    tokens: NDArray[np.int64]

    def __init__(self, columns: Sequence[NDArray[np.int64]], files: Sequence[str], checksums: Sequence[str]) -> None:
        for name, col in zip(INT_COLUMNS, columns, strict=True):
            setattr(self, name, col)
        self.files, self.checksums = files, checksums
        self._file: tuple[builtins.bytes, str] | None = None  # (IPC bytes, sha256 hex), once made or read

    @classmethod
    def from_infos(cls, infos: Sequence[ShardInfo]) -> ShardTable:
        """The table of a sequence of :class:`ShardInfo` (e.g. built by a writer)."""
        if isinstance(infos, ShardTable):
            return infos

        def column(name: str) -> NDArray[np.int64]:
            return np.fromiter((getattr(s, name) for s in infos), dtype=np.int64, count=len(infos))

        return cls(
            [column(name) for name in INT_COLUMNS],
            files=[s.file for s in infos],
            checksums=[s.checksum for s in infos],
        )

    def __len__(self) -> int:
        return len(self.samples)

    def item(self, k: int) -> ShardInfo:
        return ShardInfo(
            file=self.files[k],
            samples=int(self.samples[k]),
            bytes=int(self.bytes[k]),
            checksum=self.checksums[k],
            first_sample=int(self.first_sample[k]),
            tokens=int(self.tokens[k]),
        )

    def __iter__(self) -> Iterator[ShardInfo]:
        return (self.item(k) for k in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardTable):
            return NotImplemented
        return (
            len(self) == len(other)
            and all(np.array_equal(getattr(self, c), getattr(other, c)) for c in INT_COLUMNS)
            and list(self.files) == list(other.files)
            and list(self.checksums) == list(other.checksums)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable arrays: like a list, not hashable

    def __repr__(self) -> str:
        return f"ShardTable({len(self)} shards)"

    def ipc(self) -> tuple[builtins.bytes, str]:
        """The table file's bytes and their sha256 (hex); made once (the same columns give the same bytes)."""
        if self._file is None:
            raw = raw_digests(self.checksums)
            if raw is None:
                raise ValueError("a shard table holds sha256 checksums only")
            arrays = [pa.array(getattr(self, c), type=pa.int64()) for c in INT_COLUMNS]
            arrays.append(pa.FixedSizeBinaryArray.from_buffers(pa.binary(32), len(self), [None, pa.py_buffer(raw)]))
            sink = pa.BufferOutputStream()
            with pa.ipc.new_file(sink, TABLE_SCHEMA) as writer:
                writer.write_batch(pa.record_batch(arrays, schema=TABLE_SCHEMA))
            data = sink.getvalue().to_pybytes()
            self._file = (data, hashlib.sha256(data).hexdigest())
        return self._file

    def name_rule(self, part_starts: Sequence[int], part_paths: Sequence[str]) -> NameRule | None:
        """The :class:`NameRule` every shard's file follows (inside its part's folder), or ``None``."""
        if isinstance(self.files, ShardFiles):
            return self.files.rule
        if not len(self):
            return None
        first = self.files[0]
        if len(part_paths):
            first = first.removeprefix(part_paths[0] + "/")
        found = re.fullmatch(r"shards/shard-\d{6}(\.[a-z0-9.]+)", first)
        if not found:
            return None
        rule = NameRule(found.group(1))
        made = ShardFiles(rule, len(self), part_starts, part_paths)
        return rule if all(a == b for a, b in zip(self.files, made, strict=True)) else None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None}  # the file's bytes are made again where needed


def raw_digests(checksums: Sequence[str]) -> NDArray[np.uint8] | None:
    """``(n, 32)`` raw digests of ``"sha256:<hex>"`` checksums; ``None`` if any has another form."""
    if isinstance(checksums, HexDigests):
        return checksums.raw
    if not all(isinstance(c, str) and _CHECKSUM.fullmatch(c) for c in checksums):
        return None
    return np.frombuffer(bytes.fromhex("".join(c[7:] for c in checksums)), dtype=np.uint8).reshape(-1, 32)


def wants_table(table: ShardTable, part_starts: Sequence[int] = (), part_paths: Sequence[str] = ()) -> bool:
    """Whether a set of these shards is written with a shard table (format version 3).

    With :data:`SHARD_TABLE_MIN_SHARDS` shards or more, names following a :class:`NameRule` and
    sha256 checksums (as ``prepare`` writes them).
    """
    return (
        len(table) >= SHARD_TABLE_MIN_SHARDS
        and table.name_rule(part_starts, part_paths) is not None
        and raw_digests(table.checksums) is not None
    )


def read_table(path: Path, *, shards: int, size: int, sha256: str, files: ShardFiles) -> ShardTable:
    """Read and check the shard table file ``path`` that the manifest describes (its rows not yet validated).

    Raises:
        ManifestError: a size or digest other than the manifest's, a layout other than one
            uncompressed batch of :data:`TABLE_SCHEMA`, a row count other than ``shards``, nulls.
    """
    what = f"the shard table {path}"
    if size > shards * _ROW_BYTES + _TABLE_OVERHEAD:
        raise ManifestError(f"{what}: the manifest says it is {size:,} bytes, too large for {shards:,} shards")
    missing = ManifestError(f"{what} is missing; the shard set is incomplete: re-run prepare (or merge)")
    fd, st = open_regular(path, what="the shard table", error=ManifestError, missing=missing)
    with open(fd, "rb") as fh:
        if st.st_size != size:
            raise ManifestError(
                f"{what} is {st.st_size:,} bytes, the manifest says {size:,}: truncated or replaced; "
                "re-run prepare (or merge)"
            )
        try:
            data = fh.read(size + 1)
        except OSError as exc:
            raise os_error(exc, path, what="the shard table", error=ManifestError) from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
        raise ManifestError(
            f"{what} does not match the sha256 that manifest.json records for it: it is damaged or belongs to "
            "another set; re-run prepare (or merge)"
        )
    return parse_table(data, path, shards=shards, files=files, digest=sha256)


def parse_table(data: bytes, path: Path, *, shards: int, files: ShardFiles, digest: str) -> ShardTable:
    """The columns of a table file's bytes, as views of ``data`` (checked before pyarrow reads the batch)."""
    what = f"the shard table {path}"
    try:
        check_ipc_layout(memoryview(data))
        reader = pa.ipc.open_file(pa.py_buffer(data))
        if not reader.schema.equals(TABLE_SCHEMA):
            raise LayoutError(f"its columns are {reader.schema}, expected {TABLE_SCHEMA}")
        batch = reader.get_batch(0)
        batch.validate()
    except (LayoutError, pa.ArrowException, ValueError, OSError) as exc:
        raise ManifestError(f"{what} cannot be read ({exc}); re-run prepare (or merge)") from None
    if batch.num_rows != shards:
        raise ManifestError(f"{what} holds {batch.num_rows:,} shards, the manifest says {shards:,}; re-run prepare")
    if any(col.null_count for col in batch.columns):
        raise ManifestError(f"{what} holds nulls; shardload never writes them. Re-run prepare (or merge)")
    ints = [batch.column(c) for c in INT_COLUMNS]
    cols = [np.frombuffer(c.buffers()[1], dtype="<i8", count=shards, offset=c.offset * 8) for c in ints]
    sums = batch.column("checksum")
    raw = np.frombuffer(sums.buffers()[1], dtype=np.uint8, count=shards * 32, offset=sums.offset * 32)
    table = ShardTable(cols, files=files, checksums=HexDigests(raw.reshape(shards, 32)))
    table._file = (data, digest)
    return table


def check_rows(table: ShardTable, where: str, *, limit: int) -> int:
    """Validate the rows, vectorised; return the sample count.

    Every integer in ``[0, limit]``, and shard ``k`` starts where shard ``k - 1`` ends.
    """
    for name in INT_COLUMNS:
        col = getattr(table, name)
        if len(col) and (int(col.min()) < 0 or int(col.max()) > limit):
            k = int(np.flatnonzero((col < 0) | (col > limit))[0])
            raise ManifestError(f"{where}: shard {k} {name}: expected an integer in [0, {limit}], got {int(col[k])}")
    ends = np.cumsum(table.samples, dtype=np.int64)
    starts = ends - table.samples
    wrong = np.flatnonzero(starts != table.first_sample)
    if len(wrong):
        k = int(wrong[0])
        raise ManifestError(
            f"{where}: shard {k} ({table.files[k]}) starts at sample {int(table.first_sample[k])}, "
            f"expected {int(starts[k])}"
        )
    return int(ends[-1]) if len(ends) else 0
