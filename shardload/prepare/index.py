"""Step 4 of prepare: the lengths indexes and the manifest of the new set, written into the work directory
once every shard is written (:class:`~shardload.prepare.workdir.WorkDir` then commits them)."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload._base.output import atomic_file
from shardload._base.version import VERSION
from shardload.formats.manifest import LENGTHS_NAME, Manifest, ShardInfo
from shardload.prepare.jobs import ShardRecord
from shardload.prepare.options import PrepareOptions
from shardload.schema.fields import Schema


def _index_dtype(max_value: int) -> type[np.signedinteger[Any]]:
    return np.int32 if max_value < 2**31 else np.int64


def write_index(
    work: Path,
    lengths: NDArray[np.int64],
    field_lengths: Mapping[str, NDArray[np.int64]],
    order: NDArray[np.int64],
) -> dict[str, str]:
    """Write the lengths index (and per-field indexes when several fields vary) in shard order, and ``origin.npy``;
    return the files written, by field (``""``: the batching lengths).

    Args:
        lengths: ``(N,)`` batching length per source position.
        field_lengths: field -> ``(N,)`` first-axis length per source position, for the variable fields.
        order: ``(N,)`` source position of each sample, in shard order.
    """
    files = {"": LENGTHS_NAME}
    arrays = {"": lengths}
    if len(field_lengths) > 1:
        for name, lens in field_lengths.items():
            files[name] = f"lengths.{name}.npy"
            arrays[name] = lens
    for key, lens in arrays.items():
        dtype = _index_dtype(int(lens.max(initial=0)))
        _save_npy(work / files[key], lens[order].astype(dtype))
    _save_npy(work / "origin.npy", order)
    return files


def _save_npy(path: Path, arr: np.ndarray) -> None:
    with atomic_file(path, tmp=path.with_name(path.name + ".tmp")) as tmp, open(tmp, "wb") as fh:
        np.save(fh, arr, allow_pickle=False)


def length_stats(lengths: NDArray[np.integer]) -> dict[str, Any]:
    """The manifest's ``stats``: quantiles and mean of the batching lengths."""
    if len(lengths) == 0:
        return {}
    q = np.quantile(lengths, [0.0, 0.5, 0.9, 0.99, 1.0])
    return {
        "min": int(q[0]),
        "p50": float(q[1]),
        "p90": float(q[2]),
        "p99": float(q[3]),
        "max": int(q[4]),
        "mean": float(np.mean(lengths)),
    }


def new_manifest(
    schema: Schema,
    options: PrepareOptions,
    records: Sequence[ShardRecord],
    lengths: NDArray[np.int64],
    files: Mapping[str, str],
    describe: Mapping[str, Any] | None,
    set_id: str = "",
) -> Manifest:
    """The manifest of the new set: its shards in order, with the run's options and ``describe`` recorded."""

    shards, first = [], 0
    for r in records:
        shards.append(ShardInfo(r.file, r.samples, r.bytes, r.checksum, first, r.tokens))
        first += r.samples
    opts = options.layout_key()
    opts.update(describe or {})
    return Manifest(
        schema=schema,
        shard_format=options.format.name,
        shards=tuple(shards),
        total_samples=first,
        total_tokens=int(lengths.sum()),
        lengths_file=files[""],
        field_lengths={k: v for k, v in files.items() if k},
        options=opts,
        stats=length_stats(lengths),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        shardload_version=VERSION,
        set_id=set_id,
    ).with_table_form()
