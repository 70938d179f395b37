"""Where each sample of a shard set came from: the source file and the row, line or member in it.

``prepare`` records the origins next to each staged chunk (:func:`write_chunk_origins`), then in
shard order as the set's ``origins.arrow`` (:func:`write_set_origins`), from which
:meth:`shardload.ShardSet.origin` reads one :class:`SampleOrigin` (:func:`read_origin`).

``origins.arrow`` is an Arrow IPC file with one row per sample, in sample-id order: ``file``
(dictionary-encoded string, ``""`` for samples given to ``write()``), ``kind`` (dictionary-encoded
string), ``position`` (int64, -1 when none) and ``key`` (string, ``""`` when none).

Which piece of its record a sample is (a map may return several samples for one record) is not
stored: the pieces of a record are consecutive in source order, so ``origin.npy`` (each sample's
source position) and the origins tell it (:func:`record_pieces`), for sets made before too.
"""

from __future__ import annotations

import ast
import mmap
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from shardload._base.output import atomic_file
from shardload._base.setfiles import open_index, reason_of
from shardload.errors import ShardSetError
from shardload.formats.arrow.arrays import arrow_of, one_string, strings

ORIGINS_NAME = "origins.arrow"
#: each sample's position in the source order (prepare's ``order``), int64 [N]
ORDER_NAME = "origin.npy"
#: the key of the origin of a sample staged by a run of an older shardload (:func:`write_set_origins`)
_NOT_RECORDED = "not recorded"
#: source positions read at a time when looking for a record's pieces in ``origin.npy``
_SCAN_CHUNK = 1 << 20
#: what a :class:`SampleOrigin`'s ``position`` / ``key`` is
OriginKind = Literal["row", "line", "member", "file", "index", "other"]

_ROW_OR_LINE = re.compile(r"^(?P<file>.*): (?P<kind>row|line) (?P<n>\d+)$", re.S)
_MEMBER = re.compile(r"^(?P<file>.*): sample (?P<key>'.*'|\".*\")$", re.S)
_INDEX = re.compile(r"^sample (?P<n>\d+)$")
#: what the map step adds to a locator (shardload.prepare.mapping): a piece of a split, and the function (a
#: factory's name ends in "()": ``tok:make_encoder()``)
_MAPPED = re.compile(r"^(?P<locator>.*?)(?:, piece \d+ of \d+)? \(mapped by [^()]*(?:\(\))?\)$", re.S)


@dataclass(frozen=True)
class SampleOrigin:
    """Where one sample came from (what :meth:`shardload.ShardSet.origin` returns).

    Attributes:
        file: the source file as prepare was given it (found by listing), or
            ``None`` for a sample of an iterable given to ``write()``.
        kind: what ``position`` / ``key`` count: ``"row"`` (Parquet/Arrow row,
            from 0), ``"line"`` (JSON Lines line, from 1), ``"member"``
            (WebDataset sample: ``key`` is its key, the member names without
            their extensions), ``"file"`` (a one-sample file, ``.npy``/``.npz``),
            ``"index"`` (the position in ``write()``'s iterable, from 0) or
            ``"other"`` (``key`` holds the locator text as prepare wrote it).
        position: the row, line or index; ``None`` for the other kinds.
        key: the WebDataset key, or the locator text of kind ``"other"``; else ``None``.
        piece: which of the samples made of this record this one is, from 0, in
            the order the map returned them (0 for a record a map did not split,
            and in a set prepared without a map); ``None`` when not recorded.
        pieces: how many samples the record became (1 unless a map returned a
            list of several); ``None`` when not recorded: a sample staged by an
            older shardload (kind ``"other"``), or a set without ``origin.npy``.

    Every piece of a record has the record's ``file``, ``kind``, ``position`` and
    ``key``; ``str()`` names the piece as prepare's messages do (``data/a.jsonl:
    line 3, piece 2 of 4``, counted from 1).
    """

    file: str | None
    kind: OriginKind
    position: int | None = None
    key: str | None = None
    piece: int | None = 0
    pieces: int | None = 1

    def __str__(self) -> str:
        at = {"row": f"row {self.position}", "line": f"line {self.position}", "member": f"sample {self.key!r}"}
        if self.kind == "index":
            text = f"sample {self.position} of the iterable given to write()"
        elif self.kind == "other":
            text = str(self.key)
        else:
            text = f"{self.file}: {at[self.kind]}" if self.kind in at else str(self.file)
        if self.piece is not None and self.pieces is not None and self.pieces > 1:
            text += f", piece {self.piece + 1} of {self.pieces}"
        return text


def parse_locator(locator: str, files: Sequence[str]) -> SampleOrigin:
    """The :class:`SampleOrigin` a reader's locator text names (``files``: the paths of its unit).

    A sample made by the map step has the origin of its record (every piece of a split the same).
    """
    mapped = _MAPPED.match(locator)
    if mapped:
        locator = mapped["locator"]
    if locator in files:
        return SampleOrigin(locator, "file")
    found = _ROW_OR_LINE.match(locator)
    if found and found["file"] in files:
        kind: OriginKind = "row" if found["kind"] == "row" else "line"
        return SampleOrigin(found["file"], kind, int(found["n"]))
    found = _MEMBER.match(locator)
    if found and found["file"] in files:
        return SampleOrigin(found["file"], "member", key=str(ast.literal_eval(found["key"])))
    found = _INDEX.match(locator)
    if found and not files:
        return SampleOrigin(None, "index", int(found["n"]))
    return SampleOrigin(None, "other", key=locator)


def _table(origins: Sequence[SampleOrigin]) -> pa.Table:
    n = len(origins)
    positions = np.fromiter((-1 if o.position is None else o.position for o in origins), np.int64, n)
    return pa.table(
        {
            "file": _dictionary([o.file or "" for o in origins], pa.large_string()),
            "kind": _dictionary([o.kind for o in origins], pa.string()),
            "position": arrow_of(positions),
            "key": strings([o.key or "" for o in origins], large=True),
        }
    )


def _dictionary(values: Sequence[str], kind: pa.DataType) -> pa.DictionaryArray:
    """``values`` dictionary-encoded as ``dictionary_encode()`` does (first seen first, int32 indices)."""
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(v, len(index)) for v in values), np.int32, len(values))
    return pa.DictionaryArray.from_arrays(arrow_of(codes), strings(list(index), large=kind == pa.large_string()))


def _write(path: Path, table: pa.Table, *, durable: bool = True) -> None:
    with (
        atomic_file(path, tmp=path.with_name(path.name + ".tmp"), durable=durable) as tmp,
        open(tmp, "wb") as sink,  # Python opens any path; pyarrow's own files take UTF-8 paths only
        pa.ipc.new_file(sink, table.schema) as writer,
    ):
        writer.write_table(table)


def _read(path: Path) -> pa.RecordBatchFileReader:
    """An Arrow IPC file's reader over a memory map of ``path`` (any path: pyarrow's own maps take UTF-8 only).

    Raises:
        OSError: it cannot be opened or mapped (an empty file cannot be mapped).
        pyarrow.ArrowException: it is not an Arrow IPC file.
    """
    with open(path, "rb") as fh:
        try:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # an empty file
            raise OSError(f"cannot be mapped: {exc}") from None
    return pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapped)))


def chunk_origins_path(chunk: Path) -> Path:
    """The file that holds the origins of staged chunk ``chunk`` (written before the chunk)."""
    return chunk.with_name(chunk.name + ".origins")


def read_chunk_origins(chunk: Path) -> pa.Table:
    """The origins :func:`write_chunk_origins` recorded for staged chunk ``chunk`` (memory-mapped)."""
    return _read(chunk_origins_path(chunk)).read_all()


def locator_origins(locators: Sequence[str], files: Sequence[str]) -> pa.Table:
    """The origins of samples read one by one, from their locators (``files``: the paths of their unit)."""
    return _table([parse_locator(w, files) for w in locators])


def run_origins(file: str, kind: OriginKind, positions: NDArray[np.int64]) -> pa.Table:
    """The origins of samples read as a column batch: rows or lines ``positions`` of ``file``.

    The rows :func:`locator_origins` makes of their locators, built from the numbers directly.
    """
    n = len(positions)
    zeros = arrow_of(np.zeros(n, dtype=np.int32))
    return pa.table(
        {
            "file": pa.DictionaryArray.from_arrays(zeros, one_string(file, large=True)),
            "kind": pa.DictionaryArray.from_arrays(zeros, one_string(kind, large=False)),
            "position": arrow_of(np.ascontiguousarray(positions, dtype=np.int64)),
            "key": pa.LargeStringArray.from_buffers(
                n, pa.py_buffer(np.zeros(n + 1, dtype=np.int64)), pa.py_buffer(b"")
            ),
        }
    )


def write_chunk_origins(chunk: Path, origins: Sequence[pa.Table], *, durable: bool = True) -> None:
    """Record the origins of staged chunk ``chunk``'s samples, in sample order (``durable``: fsynced)."""
    whole = pa.concat_tables(origins).unify_dictionaries().combine_chunks() if len(origins) > 1 else origins[0]
    _write(chunk_origins_path(chunk), whole, durable=durable)


def write_set_origins(work: Path, chunks: Sequence[Path], order: np.ndarray) -> str:
    """Write ``origins.arrow`` into ``work``: the staged chunks' origins (in source order) taken in shard ``order``."""
    tables = []
    for chunk in chunks:
        if not chunk_origins_path(chunk).exists():  # staged by a run of an older shardload, now resumed
            rows = _read(chunk).get_batch(0).num_rows
            unknown = SampleOrigin(None, "other", key=f"{_NOT_RECORDED} (staged by an older shardload: {chunk.name})")
            tables.append(_table([unknown] * rows))
            continue
        tables.append(_read(chunk_origins_path(chunk)).read_all())
    if not tables:  # a set of no samples (a part with no units)
        tables.append(_table([]))
    whole = pa.concat_tables(tables).unify_dictionaries().combine_chunks()
    _write(work / ORIGINS_NAME, whole.take(arrow_of(np.ascontiguousarray(order, dtype=np.int64))))
    return ORIGINS_NAME


def write_merged_origins(root: Path, parts: Sequence[Path]) -> bool:
    """Write ``root/origins.arrow``: the ``parts``' origins, in part order; False (nothing written) if one has none."""
    if not all((part / ORIGINS_NAME).is_file() for part in parts):
        return False
    tables = [_read(part / ORIGINS_NAME).read_all() for part in parts]
    _write(root / ORIGINS_NAME, pa.concat_tables(tables).unify_dictionaries().combine_chunks())
    return True


def read_origins(root: Path, total: int, *, every_row: bool = False) -> pa.Table:
    """The set's ``origins.arrow`` (memory-mapped), checked: ``total`` rows, the columns :func:`_table` writes.

    ``every_row`` (for ``verify``) also checks every row's kind, one pass over the file.

    Raises:
        ShardSetError: it is missing, unreadable or not what prepare writes.
    """
    path = root / ORIGINS_NAME
    try:
        table = _read(path).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise ShardSetError(f"{path}: cannot be read ({exc}); re-run prepare") from None
    if table.num_rows != total:
        raise ShardSetError(f"{path}: {table.num_rows} entries for {total} samples; re-run prepare")
    if table.column_names != ["file", "kind", "position", "key"]:
        raise ShardSetError(f"{path}: has the columns {table.column_names}, not those prepare writes; re-run prepare")
    kinds = set(table.column("kind").unique().cast(pa.string()).to_pylist()) if every_row else set()
    kinds -= set(get_args(OriginKind))
    if kinds:
        raise ShardSetError(f"{path}: holds the unknown origin kinds {sorted(map(str, kinds))}; re-run prepare")
    return table


def read_origin(
    root: Path, sample_id: int, total: int, *, mapped: bool = False, parts: Sequence[tuple[int, int]] = ()
) -> SampleOrigin:
    """Entry ``sample_id`` of the set's ``origins.arrow``, with the piece of its record it is.

    ``mapped``: the set was prepared with a map (only then may a record have several pieces, found
    with ``origin.npy``: :func:`record_pieces`); ``parts``: ``(first sample, samples)`` of each part of
    a set merged from parts (a record's pieces never cross a part).

    Raises:
        TypeError: ``sample_id`` is not an integer (a bool, float or str).
        IndexError: ``sample_id`` is not in ``[0, total)``.
        ShardSetError: the set has no origins (prepared by an older shardload) or they are damaged.
    """
    if isinstance(sample_id, bool) or not isinstance(sample_id, (int, np.integer)):
        raise TypeError(f"sample id must be an integer, got {type(sample_id).__name__} {sample_id!r}")
    if not 0 <= sample_id < total:
        raise IndexError(f"sample id {sample_id!r} is out of range for a shard set of {total} samples (0..{total - 1})")
    if not (root / ORIGINS_NAME).is_file():
        raise ShardSetError(
            f"{root} records no sample origins (no {ORIGINS_NAME}: prepared by an older shardload); "
            "re-run prepare to record them"
        )
    table = read_origins(root, total)
    row = table.slice(int(sample_id), 1).to_pylist()[0]
    kind: OriginKind = row["kind"]
    if kind == "other" and row["key"].startswith(_NOT_RECORDED):
        piece: tuple[int | None, int | None] = (None, None)
    elif not mapped:
        piece = (0, 1)
    else:
        piece = record_pieces(root, table, int(sample_id), total, parts)
    return SampleOrigin(
        file=row["file"] or None,
        kind=kind,
        position=None if row["position"] < 0 else int(row["position"]),
        key=row["key"] or None,
        piece=piece[0],
        pieces=piece[1],
    )


def record_pieces(
    root: Path, origins: pa.Table, sample_id: int, total: int, parts: Sequence[tuple[int, int]] = ()
) -> tuple[int | None, int | None]:
    """``(piece, pieces)`` of sample ``sample_id``: its place among the samples made of its record, and their number.

    A map's samples of one record are staged one after the other, so they are the run of consecutive
    source positions (``origin.npy``) around the sample's whose origins are its record's; the run
    stays inside the sample's part (``parts``: ``(first sample, samples)`` of each; sample ids and
    source positions of a part cover the same range). Within one prepare, two records never have the
    same origin (a file is read once), so the run is exactly the record's pieces.

    ``origin.npy`` is read in a window around the sample's position, widened until the run ends
    inside it: ``O(N)`` time per window, a few MB of memory. ``(None, None)`` when the set has no
    ``origin.npy`` (not recorded).

    Raises:
        ShardSetError: ``origin.npy`` is damaged (unreadable, or not one source position per sample).
    """
    path = root / ORDER_NAME
    try:
        order = open_index(path, what="the sample order index", samples=total)
    except ShardSetError as exc:
        if reason_of(exc) == "missing":
            return None, None
        raise
    lo, hi = 0, total
    for first, count in parts:
        if first <= sample_id < first + count:
            lo, hi = first, first + count
    at = int(order[sample_id])
    if not lo <= at < hi:
        raise ShardSetError(
            f"{path}: says sample {sample_id} is at source position {at}, outside [{lo}, {hi}): the file is "
            "damaged; re-run prepare"
        )
    want = origins.slice(sample_id, 1).to_pylist()[0]
    width = 16
    while True:
        a, b = max(lo, at - width), min(hi, at + width + 1)
        same = [row == want for row in origins.take(arrow_of(_ids_at(order, a, b, path))).to_pylist()]
        first = last = at - a  # the run of the record, as indices into [a, b)
        while first > 0 and same[first - 1]:
            first -= 1
        while last + 1 < len(same) and same[last + 1]:
            last += 1
        if (first > 0 or a == lo) and (last + 1 < len(same) or b == hi):
            return at - a - first, last - first + 1
        width *= 4


def _ids_at(order: NDArray[np.integer], a: int, b: int, path: Path) -> NDArray[np.int64]:
    """``(b - a,)`` the sample at each source position ``a .. b - 1`` (``order``: each sample's position)."""
    ids = np.full(b - a, -1, dtype=np.int64)
    for start in range(0, len(order), _SCAN_CHUNK):
        chunk = np.asarray(order[start : start + _SCAN_CHUNK])
        found = np.flatnonzero((chunk >= a) & (chunk < b))
        ids[chunk[found] - a] = found + start
    if (ids < 0).any():
        raise ShardSetError(
            f"{path}: no sample is at source position {a + int(np.flatnonzero(ids < 0)[0])}: the file is not one "
            "source position per sample (damaged); re-run prepare"
        )
    return ids


def check_order(root: Path, total: int, parts: Sequence[tuple[int, int]] = ()) -> None:
    """Check the set's ``origin.npy``, which :func:`record_pieces` reads: one source position per sample.

    The header and size as the lengths indexes' are checked, then the values: each sample of a part
    (``parts``: ``(first sample, samples)`` of each, the whole set when empty) at a position inside
    the part, no position held twice. A set without the file passes (its pieces are not recorded).
    ``O(N)`` time, ``N`` bytes of memory, the file read once in chunks.

    Raises:
        ShardSetError: the file is unreadable, of another size, or not one source position per sample.
    """
    path = root / ORDER_NAME
    try:
        order = open_index(path, what="the sample order index", samples=total)
    except ShardSetError as exc:
        if reason_of(exc) == "missing":
            return
        raise
    held = np.zeros(total, dtype=bool)  # held[p]: some sample is at source position p
    for first, count in parts or [(0, total)]:
        for start in range(first, first + count, _SCAN_CHUNK):
            stop = min(first + count, start + _SCAN_CHUNK)
            chunk = np.asarray(order[start:stop], dtype=np.int64)
            outside = np.flatnonzero((chunk < first) | (chunk >= first + count))
            if len(outside):
                i = start + int(outside[0])
                raise ShardSetError(
                    f"{path}: says sample {i} is at source position {int(order[i])}, outside "
                    f"[{first}, {first + count}); the file is damaged; re-run prepare"
                )
            if held[chunk].any() or len(np.unique(chunk)) < len(chunk):
                raise ShardSetError(
                    f"{path}: two samples are at one source position: the file is not one source position per "
                    "sample (damaged); re-run prepare"
                )
            held[chunk] = True
