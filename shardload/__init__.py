"""shardload: rank-aware loading of huge variable-length datasets.

The data flow, one module boundary per arrow::

    raw data (npy, npz, parquet, arrow, jsonl, WebDataset tars, an iterable)
       |  shardload.prepare / shardload.write        (offline, parallel, resumable)
       v
    shard set: manifest.json + shards/*.arrow + lengths.npy
       |  shardload.open                             (manifest + lengths only)
       v
    plan(epoch, seed, rank, world_size, batching)    (pure numpy; equal counts on every rank)
       v
    dataset -> collate -> DataLoader -> ShardDataModule / make_loader
"""

from __future__ import annotations

__version__ = "0.1.0"

from shardload.errors import (
    CorruptShardError,
    InputError,
    ManifestError,
    OutputError,
    OutputExistsError,
    OutputLockedError,
    PlanError,
    PlanMismatchError,
    ShardloadError,
    ShardSetChangedError,
    ShardSetError,
)
from shardload.prepare import PrepareOptions, PrepareResult, prepare, write
from shardload.schema import Field, Schema
from shardload.shardset import ShardSet
from shardload.shardset import open_shard_set as open

__all__ = [
    "CorruptShardError",
    "Field",
    "InputError",
    "ManifestError",
    "OutputError",
    "OutputExistsError",
    "OutputLockedError",
    "PlanError",
    "PlanMismatchError",
    "PrepareOptions",
    "PrepareResult",
    "Schema",
    "ShardSet",
    "ShardSetChangedError",
    "ShardSetError",
    "ShardloadError",
    "__version__",
    "open",
    "prepare",
    "write",
]
