"""Step 1 of prepare, ingest: check one unit's samples against the schema and stage them as Arrow chunks.

Each chunk is renamed when complete, so that a resumed run skips it. :class:`SampleChecker` is the
per-sample check, :func:`~shardload.prepare.staging.check_batch` its whole-column form.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shardload._base.faults import crash_point
from shardload._base.output import atomic_file, atomic_write_text
from shardload.errors import InputError
from shardload.formats import Columns
from shardload.formats.arrow import ArrowOptions, ArrowShardReader, ArrowShardWriter
from shardload.formats.origin import run_origins, write_chunk_origins
from shardload.prepare.bootmark import staged_durably
from shardload.prepare.guards import check_sample_size, skip_staged
from shardload.prepare.jobs import StagedUnit
from shardload.prepare.mapping import MappedSamples
from shardload.prepare.options import PrepareOptions
from shardload.prepare.sources import SampleBatch
from shardload.prepare.staging import ChunkStager, check_batch
from shardload.prepare.workdir import output_errors
from shardload.schema.cast import CastError, cast_exact
from shardload.schema.fields import Schema, as_array

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SampleChecker", "cast_fields", "chunk_name", "ingest", "unit_key"]


class SampleChecker:
    """Casts, checks and measures samples against one schema."""

    def __init__(self, schema: Schema, options: PrepareOptions) -> None:
        self.schema = schema
        self.dtypes = dict(options.dtypes)
        self.reject_nonfinite = options.reject_nonfinite

    def __call__(self, sample: Mapping[str, Any], where: str) -> dict[str, np.ndarray]:
        if self.dtypes:
            sample = cast_fields(sample, self.dtypes, where)
        checked = self.schema.check(sample, where=where)
        check_sample_size(checked, where)
        if self.reject_nonfinite:
            for name, arr in checked.items():
                if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                    raise InputError(f"{where}: field {name!r} holds NaN or inf (--reject-nonfinite is set)")
        return checked


def cast_fields(sample: Mapping[str, Any], dtypes: Mapping[str, str], where: str) -> dict[str, Any]:
    """Apply ``dtypes`` overrides with :func:`~shardload.schema.cast.cast_exact`: a cast never changes a value."""
    if not isinstance(sample, Mapping):
        return sample  # Schema.check reports it
    out = dict(sample)
    for name, dtype in dtypes.items():
        if name not in out:
            continue
        arr = as_array(out[name], name=name, where=where)
        try:
            out[name] = cast_exact(arr, dtype)
        except CastError as exc:
            raise InputError(f"{where}: field {name!r} cannot be cast to {dtype}: {exc}") from None
    return out


def unit_key(k: int) -> str:
    """The name of source unit ``k``'s staged files."""
    return f"u{k:08d}"


def chunk_name(unit_key: str, j: int) -> str:
    return f"{unit_key}-{j:06d}.arrow"


def ingest(
    unit_key: str,
    samples: MappedSamples,
    check: SampleChecker,
    staging: Path,
    chunk_bytes: int,
    source: str = "the iterable given to write()",
    files: Sequence[str] = (),
    batches: Iterator[SampleBatch] | None = None,
) -> StagedUnit:
    """Stage one unit's samples as Arrow chunks; resume after complete chunks.

    ``source`` names the input in messages; ``files`` (the unit's paths) are what sample origins name.
    With ``batches`` (the same samples as column batches), ``samples`` is not read: a batch is staged
    whole where :func:`~shardload.prepare.staging.check_batch` accepts it, else sample by sample.
    """
    done = staging / f"{unit_key}.done"
    if done.exists():
        return StagedUnit.from_json(json.loads(done.read_text()))
    schema = check.schema
    writer = ArrowShardWriter(schema, ArrowOptions())
    # Chunks finished by an interrupted run are kept; their samples are skipped (one by one).
    chunks: list[str] = []
    skip = 0
    it: Iterator[tuple[str, Mapping[str, Any]]] = iter(samples)
    if batches is not None and (staging / chunk_name(unit_key, 0)).exists():
        it, batches = itertools.chain.from_iterable(b.samples() for b in batches), None
    for j in itertools.count():
        path = staging / chunk_name(unit_key, j)
        if not path.exists():
            break
        chunks.append(path.name)
        skip += skip_staged(it, ArrowShardReader(path, schema).columns(), check, source, skip)

    durable = staged_durably()  # else a resume on another boot stages again (prepare.bootmark)

    def write(pieces: list[Columns], origins: list[pa.Table]) -> None:
        path = staging / chunk_name(unit_key, len(chunks))
        with output_errors(staging.parents[1], f"staging the samples of {source}"):
            write_chunk_origins(path, origins, durable=durable)  # before the chunk, whose presence means done
            with atomic_file(path, tmp=path.with_suffix(".tmp"), durable=durable) as tmp:
                writer.write_concatenated(tmp, pieces)
        chunks.append(path.name)
        crash_point(f"staged:{len(chunks)}")

    stager = ChunkStager(schema, chunk_bytes, files, write)
    for batch in batches if batches is not None else [SampleBatch(None, lambda: it)]:
        if batch.columns is not None and batch.where is not None:
            checked = check_batch(batch.columns, schema, check.dtypes, check.reject_nonfinite)
            if checked is not None:
                stager.add_batch(checked, run_origins(*batch.where))
                continue
        for where, sample in batch.samples():
            stager.add_sample(check(sample, where), where)
    stager.flush()
    count = skip + stager.samples
    # without a map, each record is one sample (and the batches path reads no record through ``samples``)
    records = samples.records if samples.mapping else count
    record = StagedUnit(
        unit_key, tuple(chunks), count, stager.nbytes, samples.dropped, records, samples.split, samples.repeated
    )
    with output_errors(staging.parents[1], f"staging the samples of {source}"):
        atomic_write_text(done, json.dumps(record.to_json()), durable=durable)
    return record
