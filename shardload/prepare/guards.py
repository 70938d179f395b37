"""Checks that keep prepare from writing what the loader would refuse, and from mixing old and new input.

They run at the edges of a run, never per value: before anything is created (output path, options,
the first sample's schema by the rules ``Manifest.load`` applies), per sample (its size), on resume
(:func:`check_inputs`, :func:`skip_staged`), at the layout (:func:`lay_out`) and before the commit
(:func:`check_new_set`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload._base.output import atomic_write_text
from shardload._base.setfiles import os_level
from shardload.errors import InputError, OutputError, ShardSetError
from shardload.formats import Columns, ShardFormat
from shardload.prepare.fingerprint import changed_input, fingerprint_units
from shardload.prepare.layout import assign_samples, count_shards
from shardload.prepare.options import PrepareOptions
from shardload.prepare.sources import SourceUnit
from shardload.prepare.workdir import WorkDir, fd_limit_hint, fd_limit_reached
from shardload.schema.fields import Schema, name_problem, prepare_problems
from shardload.schema.text import text_kind

#: most values (scalar elements) of one field in one staged chunk or Arrow shard: Arrow IPC cannot write
#: a longer array. A test lowers it to try the limit on small data.
MAX_FIELD_VALUES = 2**31 - 1

#: how to rename a field, per kind of source (prepare has no rename option: names come from the source)
RENAME_HINT = (
    "Rename the field in the source: the dict key (write), the column (Parquet, Arrow), the key (JSON Lines), "
    "the array name (.npz), the member suffix (WebDataset) or --field (.npy)."
)


def check_output_path(out: str | os.PathLike[str]) -> None:
    """Refuse an output path that shard files cannot be written under (before creating anything)."""
    text = os.fsdecode(out)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise OutputError(
            f"{text!r}: the output path is not valid UTF-8; Arrow and Zarr cannot open files under it. Choose "
            "an output directory whose path is UTF-8."
        ) from None


def check_dtype_fields(sample: Any, dtypes: Mapping[str, str], where: str) -> None:
    """Refuse ``dtypes`` (``--dtype``) naming a text field, or a field the first sample does not have."""
    if not isinstance(sample, Mapping) or not dtypes:
        return  # Schema.infer reports a sample that is not a dict
    for name, dtype in dtypes.items():
        kind = text_kind(sample.get(name))
        if kind is not None:
            raise InputError(
                f"{where}: --dtype {name}={dtype} names a text field ({kind}), which is stored as it is: leave "
                f"--dtype out for {name!r}, or turn the text into numbers with --map"
            )
    unknown = sorted(set(dtypes) - {str(k) for k in sample})
    if unknown:
        raise InputError(
            f"--dtype names {'fields' if len(unknown) > 1 else 'a field'} the samples do not have: "
            f"{', '.join(map(repr, unknown))} (fields of {where}: {', '.join(map(repr, map(str, sample)))})"
        )


def check_schema(schema: Schema, shard_format: ShardFormat, where: str) -> None:
    """Refuse, on the first sample, a schema the loader would refuse or misread, or prepare cannot store."""
    shard_format.writer.check_schema(schema)  # the format's own rules (Zarr: node names), now, not per shard
    problems = prepare_problems(schema)
    if problems:
        renaming = any(name_problem(n) or n in schema.batch_keys() for n in schema.names)
        raise InputError(f"{where}: {'; '.join(problems)}." + (f" {RENAME_HINT}" if renaming else ""))


def check_sample_size(checked: Mapping[str, np.ndarray], where: str) -> None:
    """Refuse a sample with a field longer than one Arrow array can be."""
    for name, arr in checked.items():
        if arr.size > MAX_FIELD_VALUES:
            raise InputError(
                f"{where}: field {name!r} holds {arr.size:,} values, more than a shard can hold in one field "
                f"({MAX_FIELD_VALUES:,}, the length limit of an Arrow array); split the sample into smaller ones"
            )


def check_inputs(wd: WorkDir, units: Sequence[SourceUnit], keys: Sequence[str]) -> None:
    """Refuse to resume over a source file that changed since its samples were staged (naming it).

    Only units staged whole are compared by fingerprint (a unit staged in part is compared sample by
    sample in :func:`skip_staged`), so a file fixed after the run stopped on it can be resumed over.
    """
    inputs = fingerprint_units(units)
    path = wd.work / "inputs.json"
    done = [k for k, key in enumerate(keys) if (wd.staging / f"{key}.done").exists()]
    if done:
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):  # missing or damaged: nothing proves the input is the same
            old = None
        change = changed_input(old, inputs, done)
        if change is not None:
            raise OutputError(
                f"{wd.out}: cannot resume: {change}; its staged samples would mix old and new data. Restore the "
                "sources, or rerun with --overwrite to start over."
            )
    atomic_write_text(path, json.dumps(inputs))


def skip_staged(
    it: Iterator[tuple[str, Mapping[str, Any]]],
    staged: Columns,
    check: Callable[[Mapping[str, Any], str], dict[str, np.ndarray]],
    unit: str,
    first: int = 0,
) -> int:
    """Skip the samples of one ``staged`` chunk of an interrupted run from ``it``, checking they are the same.

    Otherwise the set would mix old and new samples without a word. ``check`` casts a sample as ingest
    does; ``unit`` names the input and ``first`` counts the unit's samples before the chunk, for messages.
    """
    for i in range(staged.num_samples):
        item = next(it, None)
        if item is None:
            raise OutputError(
                f"cannot resume: {unit} now ends before sample {first + i:,}, but the interrupted run staged "
                f"{first + staged.num_samples:,} samples from it; resume needs the same samples in the same order. Rerun "
                "with --overwrite to start over."
            )
        where, sample = item
        got, want = check(sample, where), staged.sample(i)
        if any(not np.array_equal(got[k], want[k], equal_nan=got[k].dtype.kind == "f") for k in want):
            raise OutputError(
                f"cannot resume: {where} differs from the sample the interrupted run staged at that place; "
                "resume needs the same samples in the same order. Rerun with --overwrite to start over."
            )
    return staged.num_samples


def lay_out(
    lengths: NDArray[np.int64],
    field_lengths: Mapping[str, NDArray[np.int64]],
    schema: Schema,
    options: PrepareOptions,
    in_bytes: int,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Order and shard bounds; Arrow shards get more of them if a field would exceed an array's length."""
    n = len(lengths)
    num_shards = count_shards(n, in_bytes, shard_size=options.shard_size, num_shards=options.num_shards)
    while True:
        order, bounds = assign_samples(
            lengths, num_shards, balance=options.balance, shuffle=options.shuffle, seed=options.seed
        )
        if not options.format.writer.bounds_field_values:
            return order, bounds
        worst, name, shard = _most_values(field_lengths, schema, order, bounds)
        if worst <= MAX_FIELD_VALUES:
            return order, bounds
        if options.num_shards is not None:
            raise InputError(
                f"shard {shard} would hold {worst:,} values of field {name!r}, more than an Arrow shard can hold in "
                f"one field ({MAX_FIELD_VALUES:,}); pass a larger num_shards (--num-shards), or leave it out"
            )
        # Deterministic, and ends: at one sample per shard every shard fits (each sample was checked).
        num_shards = min(n, max(num_shards + 1, -(-num_shards * worst // MAX_FIELD_VALUES)))


def _most_values(
    field_lengths: Mapping[str, NDArray[np.int64]], schema: Schema, order: NDArray[np.int64], bounds: NDArray[np.int64]
) -> tuple[int, str, int]:
    """The largest number of values of one field in one shard: ``(values, field, shard)``."""
    best = (0, "", 0)
    starts = bounds[:-1]
    for f in schema.fields:
        if f.variable:
            per_shard = np.add.reduceat(field_lengths[f.name][order], starts) * f.row_size
        else:
            per_shard = np.diff(bounds) * f.row_size
        k = int(np.argmax(per_shard))
        if int(per_shard[k]) > best[0]:
            best = (int(per_shard[k]), f.name, k)
    return best


def check_new_set(wd: WorkDir) -> None:
    """Open the finished set in the work dir as the loader will, so the commit only replaces valid with valid.

    Raises:
        InputError: the set would not open; the work dir is removed (a resume would end the same way).
        OutputError: out of file descriptors, or an error of the operating system (permission denied,
            I/O); the work dir is kept, so a resume once the cause is fixed commits the set.
    """
    from shardload.sets.shardset import ShardSet

    try:
        shard_set = ShardSet(wd.work)
        try:
            shard_set.lengths  # noqa: B018  (loads and checks the index)
            for f in shard_set.schema.variable_fields:
                shard_set.field_lengths(f.name)
            for k in range(len(shard_set.shards)):
                shard_set.shard_columns(k)
                shard_set.close()  # one shard mapped at a time: any number of shards needs a few descriptors
        finally:
            shard_set.close()
    except ShardSetError as exc:
        if fd_limit_reached(exc):  # the set may well be valid: keep the work, so that a resume commits it
            raise OutputError(
                f"{wd.out}: opening the new shard set before the commit ran out of file descriptors ({exc}). "
                f"{fd_limit_hint()}"
            ) from None
        if os_level(exc):  # permission denied, an I/O error: not the content's fault, keep the work
            raise OutputError(
                f"{wd.out}: opening the new shard set before the commit failed: {str(exc).rstrip('.')}. The finished work is kept "
                f"in {wd.work}; once the cause is fixed, rerun the same command with --resume to commit it."
            ) from None
        shutil.rmtree(wd.work, ignore_errors=True)
        raise InputError(
            f"{wd.out}: the new shard set would not open, so it was not committed ({exc}). Nothing was "
            f"replaced: {wd.out} holds what it held before. Fix the input, then run prepare again."
        ) from None
