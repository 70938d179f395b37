"""The jobs the prepare pipeline sends to its worker processes, and the records they send back.

One :class:`IngestJob` per source unit (step 1) and one :class:`ShardJob` per shard (step 3) go to a
worker, which returns a :class:`StagedUnit` or a :class:`ShardRecord`. The records are also what a
finished step leaves on disk as JSON, which is how ``--resume`` skips it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload.formats import FormatOptions
from shardload.prepare.options import PrepareOptions
from shardload.prepare.sources import SourceOptions, SourceUnit
from shardload.schema.fields import Schema


@dataclass(frozen=True)
class IngestJob:
    """Stage source unit ``key`` (the name of its staged files, ``u00000003``): read, check, write Arrow chunks."""

    key: str
    unit: SourceUnit
    source_options: SourceOptions
    schema: Schema
    options: PrepareOptions
    staging: Path


@dataclass(frozen=True)
class StagedUnit:
    """A staged source unit (``staging/<unit>.done``): its chunks in order, their samples and payload bytes.

    ``dropped`` counts the records the map function dropped, ``records`` the records read (``None`` in the
    record of an older shardload, which did not count them), ``split`` those the map made several samples
    of, and ``repeated`` the split records that have the same value of a field in every piece, by field.
    """

    unit: str
    chunks: tuple[str, ...]
    samples: int
    bytes: int
    dropped: int = 0
    records: int | None = None
    split: int = 0
    repeated: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The record as written to the ``.done`` file."""
        return {**asdict(self), "chunks": list(self.chunks)}

    @classmethod
    def from_json(cls, obj: Any) -> StagedUnit:
        """The record read back from a ``.done`` file."""
        # ``dropped`` is absent from the records of a run made before maps existed, ``records`` (and the
        # rest) from those of a run made before records were counted
        records = obj.get("records")
        return cls(
            obj["unit"],
            tuple(obj["chunks"]),
            int(obj["samples"]),
            int(obj["bytes"]),
            int(obj.get("dropped", 0)),
            None if records is None else int(records),
            int(obj.get("split", 0)),
            {str(k): int(v) for k, v in obj.get("repeated", {}).items()},
        )


def record_counts(units: Sequence[StagedUnit]) -> tuple[int, int | None, int, dict[str, int]]:
    """``(dropped, records, split, repeated)`` of ``units`` together; ``records`` is None if one did not count."""
    repeated: dict[str, int] = {}
    for u in units:
        for name, n in u.repeated.items():
            repeated[name] = repeated.get(name, 0) + n
    counted = [u.records for u in units]
    records = None if None in counted else sum(n for n in counted if n is not None)
    return sum(u.dropped for u in units), records, sum(u.split for u in units), repeated


@dataclass(frozen=True)
class ShardJob:
    """Write shard ``index`` (step 3) from the staged samples at ``positions``.

    Attributes:
        positions: ``(n,)`` source positions of its samples, in shard order.
        staged_paths: every staged chunk, in source order.
        chunk_starts: ``(num_chunks + 1,)`` first source position of each chunk.
        set_id: the set's id, written into the shard's identity ("" for none).
        first_sample: the global id of its first sample.
    """

    index: int
    positions: NDArray[np.int64]
    tokens: int
    staged_paths: tuple[Path, ...]
    chunk_starts: NDArray[np.int64]
    schema: Schema
    shard_format: FormatOptions
    work: Path
    set_id: str
    first_sample: int


@dataclass(frozen=True)
class ShardRecord:
    """A written shard, as the manifest lists it; recorded as ``done/<shard>.json`` once it is in place.

    ``file`` is its path in the set (``shards/shard-000000.arrow``), ``checksum`` ``sha256:...`` of its
    bytes, ``set_id`` "" for a shard of an older shardload.
    """

    file: str
    samples: int
    bytes: int
    checksum: str
    tokens: int
    set_id: str

    def to_json(self) -> dict[str, Any]:
        """The record as written to the ``done`` file."""
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> ShardRecord:
        """The record read back from a ``done`` file."""
        return cls(
            obj["file"],
            int(obj["samples"]),
            int(obj["bytes"]),
            obj["checksum"],
            int(obj["tokens"]),
            obj.get("set_id", ""),
        )
