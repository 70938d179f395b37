"""The order in which ingest's workers stage the source units, and the pieces the last units are cut into.

Where it sits: prepare -> **schedule** -> ingest (step 1 of :mod:`.pipeline`) -> lay out -> write shards.

The units (their cut, their keys, their staged chunks) depend on the sources only, never on
``workers``: they are what the run's state, the set's id and so the shards' bytes are made of. This
module decides only *when* each unit is read and by how many workers: units are handed out largest
first, and a unit that would leave workers idle at the end (one larger than a fair share of what is
left) is read as :class:`Task` pieces, byte ranges at line boundaries that several workers stage at
once. :func:`join_pieces` then stages the pieces' samples again, in order, as the unit's own chunks,
with the one rule that cuts chunks (:class:`~shardload.prepare.staging.ChunkStager`): the unit's
chunks are the same bytes as when one worker reads it whole, so the set does not depend on the
schedule (docs/design.md, "Prepare in stages").
"""

from __future__ import annotations

import json
import math
import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from shardload._base.output import atomic_file, atomic_write_text
from shardload._base.pool import WorkerPool, map_in_workers
from shardload._base.progress import Progress
from shardload.formats import Columns
from shardload.formats.arrow import ArrowOptions, ArrowShardReader, ArrowShardWriter
from shardload.formats.origin import read_chunk_origins, write_chunk_origins
from shardload.prepare.batched import mapped_samples
from shardload.prepare.ingest import SampleChecker, chunk_name, ingest, unit_key
from shardload.prepare.jobs import IngestJob, StagedUnit, record_counts
from shardload.prepare.mapping import sendable
from shardload.prepare.options import PrepareOptions
from shardload.prepare.parts import unit_bytes
from shardload.prepare.sources import SourceOptions, SourceUnit, read_unit, read_unit_batches
from shardload.prepare.staging import CheckedBatch, ChunkStager
from shardload.prepare.workdir import output_errors
from shardload.schema.fields import Schema

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "MIN_PIECE_BYTES",
    "Task",
    "ingest_unit",
    "join_pieces",
    "piece_key",
    "plan_tasks",
    "pool_size",
    "stage_units",
]

#: the smallest piece a unit is cut into (below it, a task costs more to hand out than it saves)
MIN_PIECE_BYTES = 1 << 20
#: the most pieces one unit is cut into
MAX_PIECES = 16


@dataclass(frozen=True)
class Task:
    """Stage ``source``: unit ``unit`` whole (``pieces == 1``), or its piece ``piece`` of ``pieces``."""

    unit: int
    piece: int
    pieces: int
    source: SourceUnit


def piece_key(unit_key: str, piece: SourceUnit) -> str:
    """The name of a piece's staged files (``u00000003.1048576-2097152``: its byte range), removed once the
    unit is joined. Named by its range, so that a resumed run that cuts the unit otherwise does not take
    the chunks of another piece for its own."""
    assert piece.part is not None
    return f"{unit_key}.{piece.part[0]}-{piece.part[1]}"


def plan_tasks(
    units: Sequence[SourceUnit], sizes: Sequence[int], workers: int, cuttable: Sequence[bool] | None = None
) -> list[Task]:
    """The tasks of ingest in the order they are handed out: largest unit first; the last ones in pieces.

    ``sizes`` are the units' input bytes (0 for a unit staged already). A unit is cut when it holds
    more than ``1/workers`` of the bytes not yet handed out, into pieces of about ``1/(2 * workers)``
    of them (at least :data:`MIN_PIECE_BYTES`), so that the tasks get smaller towards the end and
    every worker stays busy until the last few seconds. Only a plain JSON Lines unit can be cut (by
    byte ranges that start a line), and none that ``cuttable`` marks False; one worker reads the units
    whole, in their order.
    """
    if workers <= 1:
        return [Task(i, 0, 1, u) for i, u in enumerate(units)]
    order = sorted(range(len(units)), key=lambda i: (-sizes[i], i))
    left = float(sum(sizes))
    tasks: list[Task] = []
    for i in order:
        size = sizes[i]
        ranges = None
        cut = cuttable is None or cuttable[i]
        if cut and size > left / workers and size >= 2 * MIN_PIECE_BYTES and _can_cut(units[i]):
            piece = max(float(MIN_PIECE_BYTES), left / (2 * workers))
            n = min(MAX_PIECES, math.ceil(size / piece))
            ranges = _line_ranges(units[i], size, n) if n > 1 else None
        if ranges is None or len(ranges) < 2:
            tasks.append(Task(i, 0, 1, units[i]))
        else:
            tasks.extend(Task(i, j, len(ranges), src) for j, src in enumerate(ranges))
        left -= size
    return tasks


def _can_cut(unit: SourceUnit) -> bool:
    """Whether ``unit`` can be read in byte ranges: a plain JSON Lines file (a gzipped one is read through gzip)."""
    return unit.kind == "jsonl" and len(unit.paths) == 1 and not unit.paths[0].lower().endswith(".gz")


def _line_ranges(unit: SourceUnit, size: int, n: int) -> list[SourceUnit] | None:
    """``unit`` as up to ``n`` byte ranges of about equal size, each starting a line; None if it cannot be read."""
    path = unit.paths[0]
    start, stop = unit.part if unit.part is not None else (0, size)
    if stop - start < 2:
        return None
    pieces = []
    first = unit.first
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if len(mm) < stop:
                return None  # the file changed since it was cut: the whole unit's read reports it
            a = start
            for j in range(1, n):
                nl = mm.find(b"\n", max(a, start + (stop - start) * j // n) - 1, stop - 1)
                if nl < 0:
                    break
                b = nl + 1
                if b <= a:
                    continue
                pieces.append(SourceUnit(unit.kind, unit.paths, (a, b), first, b - a))
                first += _newlines(mm, a, b)
                a = b
            pieces.append(SourceUnit(unit.kind, unit.paths, (a, stop), first, stop - a))
    except (OSError, ValueError):
        return None
    return pieces


def _newlines(mm: mmap.mmap, a: int, b: int) -> int:
    data = np.frombuffer(mm, dtype=np.uint8, count=b - a, offset=a)
    try:
        return sum(int(np.count_nonzero(data[k : k + (1 << 20)] == 10)) for k in range(0, len(data), 1 << 20))
    finally:
        del data  # no view may outlive the mapping


def _staged_batch(columns: Columns) -> CheckedBatch:
    """A staged chunk's samples as a batch to stage again: each sample's bytes and values as
    :meth:`~shardload.prepare.staging.ChunkStager.add_sample` counts them (its arrays' ``nbytes``, ``size``)."""
    n = columns.num_samples
    sizes = np.zeros(n, dtype=np.int64)
    most = np.zeros(n, dtype=np.int64)
    for data in columns.fields.values():
        row = int(np.prod(data.values.shape[1:], dtype=np.int64))
        count = (
            np.full(n, row, dtype=np.int64) if data.offsets is None else np.diff(data.offsets).astype(np.int64) * row
        )
        sizes += count * data.values.dtype.itemsize
        np.maximum(most, count, out=most)
    return CheckedBatch(columns, sizes, most)


def join_pieces(
    unit_key: str,
    pieces: Sequence[StagedUnit],
    schema: Schema,
    staging: Path,
    chunk_bytes: int,
    files: Sequence[str],
    source: str,
) -> StagedUnit:
    """Stage the samples of ``pieces`` (in order) as the chunks of unit ``unit_key``, then remove the pieces.

    The chunks are cut as staging the unit whole cuts them; the unit's ``.done`` record is written
    before any piece is removed, so an interruption anywhere leaves a run that resumes.
    """
    writer = ArrowShardWriter(schema, ArrowOptions())
    chunks: list[str] = []

    def write(parts: list[Columns], origins: list[pa.Table]) -> None:
        path = staging / chunk_name(unit_key, len(chunks))
        with output_errors(staging.parents[1], f"staging the samples of {source}"):
            write_chunk_origins(path, origins)
            with atomic_file(path, tmp=path.with_suffix(".tmp")) as tmp:
                writer.write_concatenated(tmp, parts)
        chunks.append(path.name)

    stager = ChunkStager(schema, chunk_bytes, files, write)
    readers = [ArrowShardReader(staging / name, schema) for p in pieces for name in p.chunks]
    try:  # the chunks stay mapped until written: what the stager holds are views of them
        for reader in readers:
            stager.add_batch(_staged_batch(reader.columns()), read_chunk_origins(reader.path))
        stager.flush()
    finally:
        for reader in readers:
            reader.close()
    record = StagedUnit(unit_key, tuple(chunks), stager.samples, stager.nbytes, *record_counts(pieces))
    with output_errors(staging.parents[1], f"staging the samples of {source}"):
        atomic_write_text(staging / f"{unit_key}.done", json.dumps(record.to_json()))
    for p in pieces:
        for name in (*p.chunks, *(c + ".origins" for c in p.chunks), f"{p.unit}.done"):
            (staging / name).unlink(missing_ok=True)
    return record


def pool_size(units: Sequence[SourceUnit], options: PrepareOptions) -> int:
    """How many worker processes ingest uses: ``workers``, fewer for fewer tasks; 1 (none) where a unit
    alone cannot be cut, or the map cannot be sent to a worker (it then runs in this process)."""
    if options.workers <= 1 or not units:
        return 1
    if len(units) == 1:
        if not (_can_cut(units[0]) and unit_bytes(units[0]) >= 2 * MIN_PIECE_BYTES):
            return 1
        if options.mapper is not None and not sendable(options.mapper):
            return 1
        return min(options.workers, MAX_PIECES)
    return min(options.workers, len(units) * MAX_PIECES)


def stage_units(
    out: Path,
    staging: Path,
    units: Sequence[SourceUnit],
    source_options: SourceOptions,
    schema: Schema,
    options: PrepareOptions,
    progress: Progress,
    pool: WorkerPool | None = None,
) -> list[StagedUnit]:
    """Stage every unit (step 1) by the tasks of :func:`plan_tasks`, in ``pool``'s workers (else in this
    process); their records in unit order. The pool is closed once every unit is staged."""
    keys = [unit_key(k) for k in range(len(units))]
    done = [(staging / f"{key}.done").exists() for key in keys]
    sizes = [0 if d else unit_bytes(u) for u, d in zip(units, done)]
    # a unit an interrupted run began to stage whole is finished whole (its chunks are checked sample by sample)
    cuttable = [not d and not (staging / chunk_name(key, 0)).exists() for key, d in zip(keys, done)]
    workers = 1 if pool is None else pool.workers
    tasks = plan_tasks(units, sizes, workers, cuttable)
    jobs = [
        IngestJob(
            keys[t.unit] if t.pieces == 1 else piece_key(keys[t.unit], t.source),
            t.source,
            source_options,
            schema,
            options,
            staging,
        )
        for t in tasks
    ]
    records: list[StagedUnit | None] = [None] * len(units)
    pieces: dict[int, list[StagedUnit | None]] = {}
    for task, rec in zip(
        tasks, map_in_workers(ingest_unit, jobs, workers, out=out, what="staging the samples", pool=pool)
    ):
        progress.update(rec.samples, rec.bytes)
        if task.pieces == 1:
            records[task.unit] = rec
            continue
        got = pieces.setdefault(task.unit, [None] * task.pieces)
        got[task.piece] = rec
        if all(p is not None for p in got):
            unit = units[task.unit]
            source = unit.paths[0] if len(unit.paths) == 1 else unit.describe()
            records[task.unit] = join_pieces(
                keys[task.unit],
                [p for p in got if p is not None],
                schema,
                staging,
                options.chunk_bytes,
                unit.paths,
                source,
            )
    if pool is not None:
        pool.close(finished=True, what="staging the samples")
    assert all(r is not None for r in records)
    return [r for r in records if r is not None]


def ingest_unit(job: IngestJob) -> StagedUnit:
    """Stage one source unit or piece (in a worker process), as column batches where its reader can and no map applies."""
    check = SampleChecker(job.schema, job.options)
    unit = job.unit
    source = unit.paths[0] if len(unit.paths) == 1 else unit.describe()
    samples = mapped_samples(read_unit(unit, job.source_options), job.options.mapper, job.options.map_batch)
    batches = None if job.options.mapper is not None else read_unit_batches(unit, job.source_options, job.schema)
    return ingest(job.key, samples, check, job.staging, job.options.chunk_bytes, source, unit.paths, batches)
