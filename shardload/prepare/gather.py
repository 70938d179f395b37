"""Gather one shard's samples out of the staged chunks (the layout shuffles them), in memory of about the shard."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from shardload._base.ranges import offsets_from_lengths, range_positions
from shardload.formats.arrow import ArrowShardReader
from shardload.formats.base import Columns, FieldData
from shardload.schema.fields import Schema

#: rows copied per vectorized step of :func:`gather`: bounds its temporaries (three int64 index
#: arrays and the rows themselves) to a few MiB, whatever the size of the shard
GATHER_BLOCK_ROWS = 1 << 18
#: a block of samples of at least this many rows each on average is copied one slice per sample: a
#: slice copy costs about what building and applying an index of 64 rows does, and needs no index
SLICE_MIN_ROWS = 64


def gather(
    schema: Schema, positions: NDArray[np.int64], chunk_paths: Sequence[Path], chunk_starts: NDArray[np.int64]
) -> Columns:
    """The samples at source ``positions`` (in that order), copied out of the staged chunks.

    Memory is the shard itself plus per-sample index arrays and temporaries of at most
    :data:`GATHER_BLOCK_ROWS` rows, whatever the dtype (no int64 index per element, no copy in chunk
    order); chunks are mapped one at a time, so their pages do not pile up.
    """
    positions = np.asarray(positions, dtype=np.int64)
    n = len(positions)
    chunk_of = np.searchsorted(chunk_starts, positions, side="right") - 1
    by_chunk = np.argsort(chunk_of, kind="stable")  # output slots, grouped by the chunk they come from
    cuts = np.flatnonzero(np.diff(chunk_of[by_chunk])) + 1
    groups = [(int(chunk_of[g[0]]), g) for g in np.split(by_chunk, cuts) if len(g)]
    variable = [f for f in schema.fields if f.has_offsets]
    # pass 1: every sample's length, to lay the output out
    lens = {f.name: np.zeros(n, dtype=np.int64) for f in variable}
    for c, slots in groups:
        with _mapped(chunk_paths[c], schema) as cols:
            rows = positions[slots] - chunk_starts[c]
            for f in variable:
                offsets = cols.fields[f.name].offsets
                assert offsets is not None
                lens[f.name][slots] = offsets[rows + 1] - offsets[rows]
    out: dict[str, FieldData] = {}
    for f in schema.fields:
        if f.has_offsets:
            offsets = offsets_from_lengths(lens[f.name])
            out[f.name] = FieldData(np.empty((int(offsets[-1]), *f.inner_shape), dtype=f.value_dtype), offsets)
        else:
            out[f.name] = FieldData(np.empty((n, *f.inner_shape), dtype=f.value_dtype), None)
    # pass 2: copy, one chunk at a time
    for c, slots in groups:
        with _mapped(chunk_paths[c], schema) as cols:
            rows = positions[slots] - chunk_starts[c]
            for f in schema.fields:
                src, dst = cols.fields[f.name], out[f.name]
                if src.offsets is None:
                    _copy_samples(src.values, rows, dst.values, slots)
                else:
                    assert dst.offsets is not None
                    _copy_ranges(src.values, src.offsets[rows], dst.values, dst.offsets[slots], lens[f.name][slots])
    return Columns(num_samples=n, fields=out)


@contextmanager
def _mapped(path: Path, schema: Schema) -> Iterator[Columns]:
    """A staged chunk's columns, unmapped on exit (the caller keeps no view of them)."""
    reader = ArrowShardReader(path, schema)
    try:
        yield reader.columns()
    finally:
        reader.close()


def _copy_samples(src: np.ndarray, rows: NDArray[np.int64], dst: np.ndarray, slots: NDArray[np.int64]) -> None:
    """``dst[slots] = src[rows]`` for fixed-shape samples, in blocks of bounded size."""
    row_elems = max(1, int(np.prod(src.shape[1:], dtype=np.int64)))
    step = max(1, GATHER_BLOCK_ROWS // row_elems)
    for i in range(0, len(rows), step):
        dst[slots[i : i + step]] = src[rows[i : i + step]]


def _copy_ranges(
    src: np.ndarray,
    starts: NDArray[np.int64],
    dst: np.ndarray,
    dst_starts: NDArray[np.int64],
    lens: NDArray[np.int64],
) -> None:
    """``dst[dst_starts[k]:+lens[k]] = src[starts[k]:+lens[k]]`` for every k, in blocks of bounded size.

    Runs of short samples are copied with one fancy index per block of about :data:`GATHER_BLOCK_ROWS`
    rows; a block whose samples average :data:`SLICE_MIN_ROWS` rows or more, and a sample longer than
    a block, one slice per sample (no index array, no temporary).
    """
    ends = np.cumsum(lens)
    i, m = 0, len(lens)
    while i < m:
        before = int(ends[i - 1]) if i else 0
        j = max(i + 1, int(np.searchsorted(ends, before + GATHER_BLOCK_ROWS, side="right")))
        if j == i + 1 or int(ends[j - 1]) - before >= SLICE_MIN_ROWS * (j - i):
            for s, d, k in zip(starts[i:j].tolist(), dst_starts[i:j].tolist(), lens[i:j].tolist()):
                dst[d : d + k] = src[s : s + k]
        else:
            block = lens[i:j]
            dst[range_positions(dst_starts[i:j], block)] = src[range_positions(starts[i:j], block)]
        i = j
