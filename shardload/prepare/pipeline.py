"""The prepare pipeline: read sources -> stage chunks -> lay out shards -> write -> commit.

1. **ingest** (:mod:`.ingest`): each source unit, in parallel, is read, mapped, checked and staged as Arrow chunks.
2. **layout** (:mod:`.layout`): with every sample's length known, the shard count and which samples go where.
3. **write**: each shard, in parallel, gathers its samples from the chunks, is written, checksummed and renamed.
4. **commit** (:class:`~.workdir.WorkDir`): the indexes, then ``manifest.json`` last, once the set opens.

The checks of each step are in :mod:`.guards`. Every step skips work whose result is already on
disk, which is what makes ``resume`` give the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import numpy as np
from numpy.typing import NDArray

from shardload._base import envvars
from shardload._base.faults import crash_point
from shardload._base.identity import ShardIdentity, set_id_of
from shardload._base.output import atomic_file, atomic_write_text
from shardload._base.pool import WorkerPool, map_in_workers
from shardload._base.progress import Progress
from shardload._base.ranges import offsets_from_lengths
from shardload._base.redact import get_logger
from shardload.errors import InputError, OutputError
from shardload.formats import format_of
from shardload.formats.arrow import ArrowShardReader
from shardload.formats.manifest import Manifest
from shardload.formats.origin import ORIGINS_NAME, write_set_origins
from shardload.formats.shardtable import SHARD_TABLE_NAME
from shardload.prepare.batched import mapped_samples
from shardload.prepare.gather import gather
from shardload.prepare.guards import (
    check_dtype_fields,
    check_inputs,
    check_new_set,
    check_output_path,
    check_schema,
    lay_out,
)
from shardload.prepare.index import new_manifest, write_index
from shardload.prepare.ingest import SampleChecker, cast_fields, ingest, unit_key
from shardload.prepare.jobs import ShardJob, ShardRecord, StagedUnit, record_counts
from shardload.prepare.mapconfig import map_files_changed_since
from shardload.prepare.mapping import MappedSamples, check_sendable, map_name
from shardload.prepare.options import PrepareOptions
from shardload.prepare.parts import (
    finished_part,
    part_record,
    refuse_part_of_another_run,
    run_id,
    split_units,
    withdraw_stale_merge,
)
from shardload.prepare.schedule import pool_size, stage_units
from shardload.prepare.sources import SourceOptions, SourceUnit, read_unit
from shardload.prepare.workdir import WorkDir, output_errors
from shardload.schema.fields import Schema

logger = get_logger("shardload.prepare")
_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(frozen=True)
class PrepareResult:
    """What a prepare run produced (also the CLI's ``--json`` summary)."""

    #: the set: its directory, or its URL when the output is object storage
    path: str
    samples: int
    shards: int
    bytes: int
    tokens: int
    #: the run's wall time; ``0.0`` when it found the set (or part) complete already, and had nothing to do
    seconds: float
    #: this run's rates; ``0.0`` when it had nothing to do (never a rate of no time)
    input_mb_per_s: float
    samples_per_s: float
    #: files of directory or glob sources left out as certainly not data, by reason
    #: (``hidden``, ``marker``, ``checksum``; see :func:`shardload.prepare.sources.not_data`)
    skipped: Mapping[str, int] = field(default_factory=dict)
    #: what the run did other than asked, e.g. fewer shards than ``num_shards`` (each is also logged)
    warnings: tuple[str, ...] = ()
    #: records the map function dropped (it returned None or an empty list)
    dropped: int = 0
    #: bytes this run uploaded, when the output is a URL (a resumed upload counts only what it put)
    uploaded_bytes: int = 0
    #: input records read (a sample of ``write()``'s iterable is a record); ``None`` when the run read none
    #: (the set or part was complete already) or resumed staging of an older shardload, which did not count
    records: int | None = None
    #: records the map made more than one sample of (``None`` as for ``records``)
    split: int | None = None
    #: the set's bytes by field: its values and offsets as a shard stores them (before compression, for a
    #: compressed format), in schema order; empty when the run had nothing to do
    field_bytes: Mapping[str, int] = field(default_factory=dict)
    #: the fields beside the tokens (text, or a variable field other than ``length_field``) whose value the map
    #: repeated in every piece of a record it split, with how many such records: each piece stores it again
    repeated_fields: Mapping[str, int] = field(default_factory=dict)

    @property
    def skipped_files(self) -> int:
        """How many files were left out as certainly not data."""
        return sum(self.skipped.values())

    def to_json(self) -> dict[str, Any]:
        """The result as a plain dict (what ``shardload prepare --json`` prints)."""
        return {
            **self.__dict__,
            "skipped": dict(self.skipped),
            "skipped_files": self.skipped_files,
            "warnings": list(self.warnings),
            "field_bytes": dict(self.field_bytes),
            "repeated_fields": dict(self.repeated_fields),
        }


# -- 1. ingest: the run's side (the step itself is shardload.prepare.ingest) ------------------------
# (the worker's function, and the order of the units: shardload.prepare.schedule)


# -- 2. layout --------------------------------------------------------------------------------------
@dataclass
class Staged:
    """All staged chunks in source order, with every sample's lengths."""

    chunk_paths: list[Path]
    # chunk_starts: (num_chunks + 1,) first source position of each chunk
    chunk_starts: NDArray[np.int64]
    # lengths: (N,) batching length per source position
    lengths: NDArray[np.int64]
    # field_lengths: name -> (N,) first-axis length per source position
    field_lengths: dict[str, NDArray[np.int64]]
    # sample_bytes: (N,) payload bytes per source position
    sample_bytes: NDArray[np.int64]
    # value_bytes: field -> bytes of its values over all samples (offsets not included)
    value_bytes: dict[str, int] = field(default_factory=dict)

    def field_bytes(self, schema: Schema, num_shards: int) -> dict[str, int]:
        """Each field's bytes in a set of ``num_shards`` shards: values, and int64 offsets (``n + 1`` a shard)."""
        n = len(self.lengths)
        return {
            f.name: self.value_bytes[f.name] + (8 * (n + num_shards) if f.has_offsets else 0) for f in schema.fields
        }


def collect_staged(records: Sequence[StagedUnit], schema: Schema, staging: Path) -> Staged:
    paths = [staging / name for r in records for name in r.chunks]
    field_parts: dict[str, list[NDArray[np.int64]]] = {f.name: [] for f in schema.variable_fields}
    counts, bytes_parts = [], []
    value_bytes = dict.fromkeys((f.name for f in schema.fields), 0)
    for path in paths:
        cols = ArrowShardReader(path, schema).columns()
        counts.append(cols.num_samples)
        per_sample = np.zeros(cols.num_samples, dtype=np.int64)
        for f in schema.fields:
            data = cols.fields[f.name]
            row_bytes = f.row_size * f.value_dtype.itemsize
            if f.has_offsets:
                lens = data.lengths()
                if f.variable:
                    field_parts[f.name].append(lens)
                per_sample += lens * row_bytes
                value_bytes[f.name] += int(lens.sum()) * row_bytes
            else:
                per_sample += row_bytes
                value_bytes[f.name] += cols.num_samples * row_bytes
        bytes_parts.append(per_sample)
    starts = offsets_from_lengths(counts)
    field_lengths = {k: _cat(v) for k, v in field_parts.items()}
    lengths = schema.batching_lengths(field_lengths, int(starts[-1]))
    return Staged(paths, starts, lengths, field_lengths, _cat(bytes_parts), value_bytes)


def _cat(parts: Sequence[NDArray[np.int64]]) -> NDArray[np.int64]:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


# -- 3. write shards ----------------------------------------------------------------------------------
def shard_file(k: int, suffix: str) -> str:
    return f"shard-{k:06d}{suffix}"


def write_shard(job: ShardJob) -> ShardRecord:
    """Write shard ``job.index`` unless a finished copy is recorded; with a ``set_id``, its identity goes in."""
    done = job.work / "done" / f"{job.index:06d}.json"
    if done.exists():
        record = ShardRecord.from_json(json.loads(done.read_text()))
        # A shard finished by a run that gave it another identity (an older shardload) is written again.
        if record.set_id == job.set_id:
            return record
    writer_cls = format_of(job.shard_format).writer
    name = shard_file(job.index, writer_cls.suffix)
    final = job.work / "shards" / name
    cols = gather(job.schema, job.positions, list(job.staged_paths), job.chunk_starts)
    identity = ShardIdentity(job.set_id, job.index, job.first_sample, len(job.positions)) if job.set_id else None
    with atomic_file(final, tmp=final.with_name(final.name + ".tmp")) as tmp:
        checksum = writer_cls(job.schema, job.shard_format).write_checksummed(tmp, cols, identity=identity)
        record = ShardRecord(
            file=f"shards/{name}",
            samples=len(job.positions),
            bytes=tmp.stat().st_size,
            checksum=checksum,
            tokens=job.tokens,
            set_id=job.set_id,
        )
    crash_point(f"shard:{job.index}")
    atomic_write_text(done, json.dumps(record.to_json()))
    return record


# -- the whole run ------------------------------------------------------------------------------------


def _out_of_memory_named(run: Callable[_P, _R]) -> Callable[_P, _R]:
    """A MemoryError anywhere in ``run`` (here or raised back by a worker) becomes an error that says what it is
    and which settings bound the memory; sources name the file where they can (:mod:`.sources.columnar`)."""

    @functools.wraps(run)
    def named(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return run(*args, **kwargs)
        except MemoryError as exc:
            raise OutputError(
                f"prepare ran out of memory ({type(exc).__name__}: {exc or 'no memory left'}). Run fewer --workers "
                f"(each holds its own read batches and shard), a smaller --shard-size, or lower "
                f"{envvars.MAX_DECODED_BYTES} / {envvars.MAX_RECORD_BYTES} (the most one piece of a source or one "
                "record may decode to); or give prepare more memory. Then rerun the same command with --resume."
            ) from None

    return named


@_out_of_memory_named
def run_prepare(
    out: str | os.PathLike[str],
    *,
    options: PrepareOptions,
    units: Sequence[SourceUnit] = (),
    source_options: SourceOptions | None = None,
    samples: Iterable[Mapping[str, Any]] | None = None,
    describe: Mapping[str, Any] | None = None,
    part: tuple[int, int] | None = None,
) -> PrepareResult:
    """Run the pipeline over source ``units`` or over an iterable of ``samples``.

    With ``part=(K, N)``, only part K of the units is read, into ``out``; the schema still comes from
    the first sample of all units (every part has the one schema), and a part with no samples is a set of none.
    """
    with contextlib.ExitStack() as stack:  # holds the ingest's worker processes, stopped on any error
        return _run_prepare(out, options, units, source_options, samples, describe, part, stack)


def _run_prepare(
    out: str | os.PathLike[str],
    options: PrepareOptions,
    units: Sequence[SourceUnit],
    source_options: SourceOptions | None,
    samples: Iterable[Mapping[str, Any]] | None,
    describe: Mapping[str, Any] | None,
    part: tuple[int, int] | None,
    stack: contextlib.ExitStack,
) -> PrepareResult:
    source_options = source_options or SourceOptions(fields=options.fields, drop_fields=options.drop_fields)
    started = time.perf_counter()
    check_output_path(out)
    if options.mapper is not None and options.workers > 1 and len(units) > 1:  # else it runs in this process
        check_sendable(options.mapper, options.workers)
    # The schema is checked before anything is created on disk, so that a refused run leaves nothing to
    # clean up; a run killed during its commit needs no sources to finish it.
    finishing = WorkDir.was_committing(out) and not options.overwrite  # --overwrite drops the old commit
    # The workers start first: one of them reads (and maps) the first sample, so no user code runs here before a fork.
    size = 0 if finishing or samples is not None else pool_size(units, options)
    pool = stack.enter_context(WorkerPool(size)) if size > 1 else None
    inferred = None if finishing else _infer_schema(units, source_options, samples, options, pool)
    if part is not None:
        k, num_parts = part
        run = run_id(units, num_parts, {**options.layout_key(), **(describe or {})})
        refuse_part_of_another_run(out, k, num_parts, run)
        describe = {**(describe or {}), **part_record(k, num_parts, run)}
        units = split_units(units, num_parts)[k]
        if options.resume and finished_part(out, k, num_parts, run):
            logger.info("%s: this part was complete already; nothing to resume", out)
            return result_of(Path(out), 0.0, 0)
    with WorkDir(out, resume=options.resume, overwrite=options.overwrite) as wd:
        if wd.committing:  # killed during the commit: everything is built, finish moving it in
            _finish_commit(wd)
            return result_of(wd.out, 0.0, 0)
        if inferred is None:  # another run finished that commit while this one waited for the lock
            raise OutputError(f"{wd.out}: another prepare changed this directory meanwhile; run this one again")
        schema, located = inferred
        state = {
            "options": options.layout_key(),
            "units": [u.describe() for u in units],
            "source": dict(describe or {}),
            "schema": schema.to_json(),
        }
        with output_errors(wd.out, "recording the run's state"):
            wd.check_state(state)
            check_inputs(wd, units, [unit_key(k) for k in range(len(units))])
        records = _ingest_all(wd, units, source_options, schema, options, located, pool)
        changed = map_files_changed_since(options.layout_key().get("map_files"))
        if changed:  # samples from either version of a file: no resume can tell which, so none is offered
            shutil.rmtree(wd.work, ignore_errors=True)
            raise InputError(changed)
        staged = collect_staged(records, schema, wd.staging)
        n = len(staged.lengths)
        if n == 0 and part is None:
            raise InputError(f"the sources hold no samples{_read_from(units)}; nothing to prepare")
        # Same options, sources and staged bytes give the same id, so --resume writes the same shards.
        set_id = set_id_of(state, staged.chunk_paths)
        in_bytes = int(staged.sample_bytes.sum())
        if n:
            order, bounds = lay_out(staged.lengths, staged.field_lengths, schema, options, in_bytes)
        else:  # a part with no samples: no shards
            order, bounds = np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
        shard_records = _write_all(wd, staged, schema, options, order, bounds, set_id)
        with output_errors(wd.out, "writing the lengths index and the manifest", partial=wd.work):
            files = write_index(wd.work, staged.lengths, staged.field_lengths, order)
            origins = write_set_origins(wd.work, staged.chunk_paths, order)
            crash_point("index")
            manifest = new_manifest(schema, options, shard_records, staged.lengths[order], files, describe, set_id)
            manifest.write(wd.work)
            crash_point("manifest")
            check_new_set(wd)
            if part is not None:
                withdraw_stale_merge(out, *part, set_id)
            wd.commit(
                [*files.values(), "origin.npy", origins, *([manifest.shard_table] if manifest.shard_table else [])]
            )
        dropped, read, split, repeated = record_counts(records)
        # not a token field, which pieces share only by chance: text, or a variable field that is not the length
        stored = {f.name for f in schema.fields if f.text or (f.variable and schema.length_field not in (None, f.name))}
        return dataclasses.replace(
            result_of(wd.out, time.perf_counter() - started, in_bytes, dropped),
            records=read,
            split=None if read is None else split,  # counted only where the records were
            field_bytes=staged.field_bytes(schema, len(shard_records)),
            repeated_fields={k: n for k, n in repeated.items() if k in stored},
        )


def _read_from(units: Sequence[SourceUnit]) -> str:
    """`` (read from FILE, ...)``: the files of ``units``, for a message that they held no samples."""
    files = list(dict.fromkeys(f for unit in units for f in unit.files()))
    if not files:
        return ""
    more = f" and {len(files) - 3:,} more" if len(files) > 3 else ""
    return f" (read from {', '.join(files[:3])}{more}: empty, or blank lines only)"


def _infer_schema(
    units: Sequence[SourceUnit],
    source_options: SourceOptions,
    samples: Iterable[Mapping[str, Any]] | None,
    options: PrepareOptions,
    pool: WorkerPool | None = None,
) -> tuple[Schema, MappedSamples | None]:
    """Schema from the first (mapped) sample; for an iterable, also its mapped samples, the first one unread.

    With ``pool``, the first sample of the units is read and mapped in one of its workers.
    """
    if pool is not None and samples is None:
        return pool.call(_infer_schema, units, source_options, None, options, what="reading the first sample")
    first: tuple[str, Mapping[str, Any]] | None = None
    located: MappedSamples | None = None
    dropped = 0
    if samples is not None:
        located = mapped_samples(
            ((f"sample {i}", source_options.selected(s, f"sample {i}")) for i, s in enumerate(samples)),
            options.mapper,
            options.map_batch,
        )
        first = located.peek()
        dropped = located.dropped
    else:
        for unit in units:
            # a batched map gets one record at a time here: only the first sample is needed
            mapped = mapped_samples(read_unit(unit, source_options), options.mapper, options.map_batch and 1)
            first = mapped.peek()
            dropped += mapped.dropped
            if first is not None:
                break
    if first is None and dropped and options.mapper is not None:
        raise InputError(
            f"the sources hold no samples after the map: the map function {map_name(options.mapper)} dropped all "
            f"{dropped:,} records (it returned None or an empty list for each); nothing to prepare: check the map "
            "on a few records"
        )
    if first is None:
        raise InputError(f"the sources hold no samples{_read_from(units)}; nothing to prepare")
    where, sample = first
    check_dtype_fields(sample, options.dtypes, where)
    sample = cast_fields(sample, options.dtypes, where) if options.dtypes else sample
    schema = Schema.infer(sample, fixed_fields=options.fixed_fields, length_field=options.length_field, where=where)
    check_schema(schema, options.format, where)
    return schema, located


def _ingest_all(
    wd: WorkDir,
    units: Sequence[SourceUnit],
    source_options: SourceOptions,
    schema: Schema,
    options: PrepareOptions,
    samples: MappedSamples | None,
    pool: WorkerPool | None,
) -> list[StagedUnit]:
    progress = Progress("read", enabled=options.progress, log=logger.name)
    try:
        if samples is not None:
            rec = ingest("it", samples, SampleChecker(schema, options), wd.staging, options.chunk_bytes)
            progress.update(rec.samples, rec.bytes)
            return [rec]
        return stage_units(wd.out, wd.staging, units, source_options, schema, options, progress, pool)
    finally:
        progress.close()


def _write_all(
    wd: WorkDir,
    staged: Staged,
    schema: Schema,
    options: PrepareOptions,
    order: NDArray[np.int64],
    bounds: NDArray[np.int64],
    set_id: str,
) -> list[ShardRecord]:
    paths = tuple(staged.chunk_paths)
    jobs = []
    for k in range(len(bounds) - 1):
        pos = order[bounds[k] : bounds[k + 1]]
        tokens = int(staged.lengths[pos].sum())
        # shard k holds global ids bounds[k]..bounds[k + 1] - 1
        first = int(bounds[k])
        fmt = options.format_options
        jobs.append(ShardJob(k, pos, tokens, paths, staged.chunk_starts, schema, fmt, wd.work, set_id, first))
    progress = Progress("write", total=len(order), enabled=options.progress, log=logger.name)
    records = []
    try:
        with output_errors(wd.out, "writing shards", partial=wd.shards):
            for rec in map_in_workers(write_shard, jobs, options.workers, out=wd.out, what="writing shards"):
                progress.update(rec.samples, rec.bytes)
                records.append(rec)
    finally:
        progress.close()
    return records


def _finish_commit(wd: WorkDir) -> None:
    names = [p.name for p in wd.work.glob("*.npy")] + [p.name for p in wd.work.glob(ORIGINS_NAME)]
    names += [p.name for p in wd.work.glob(SHARD_TABLE_NAME)]
    wd.commit(names)


def result_of(out: Path, seconds: float, in_bytes: int, dropped: int = 0) -> PrepareResult:
    """The result of a run that committed the set in ``out`` (read from its manifest).

    ``seconds`` is ``0.0`` for a run that found the set complete already: it then has no rates.
    """
    m = Manifest.load(out)
    size = sum(s.bytes for s in m.shards)
    warnings = []
    asked = m.options.get("num_shards")
    if isinstance(asked, int) and asked > len(m.shards):
        warnings.append(
            f"num_shards (--num-shards) asked for {asked:,} shards, but there are only {m.total_samples:,} samples and "
            f"a shard holds at least one: the set has {len(m.shards):,} shards"
        )
    for w in warnings:
        logger.warning("%s", w)
    return PrepareResult(
        path=str(out),
        samples=m.total_samples,
        shards=len(m.shards),
        bytes=size,
        tokens=m.total_tokens,
        seconds=round(seconds, 3),
        input_mb_per_s=round(in_bytes / seconds / 1e6, 1) if seconds > 0 else 0.0,
        samples_per_s=round(m.total_samples / seconds, 1) if seconds > 0 else 0.0,
        warnings=tuple(warnings),
        dropped=dropped,
    )


__all__ = ["PrepareResult", "result_of", "run_prepare"]
