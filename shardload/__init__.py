"""shardload: rank-aware loading of huge variable-length datasets.

The data flow, one module boundary per arrow::

    raw data (npy, npz, parquet, arrow, jsonl, WebDataset tars, an iterable)
       |  shardload.prepare / shardload.write        (offline, parallel, resumable)
       v
    shard set: manifest.json + shards/*.arrow (or *.zarr.zip) + lengths.npy
       |  shardload.open                             (manifest + lengths only)
       v
    plan: PlanInputs + EpochSpec + Batching -> RankPlan  (pure numpy; equal counts on every rank)
       v
    dataset -> collate -> DataLoader (LoaderOptions) -> ShardDataModule / make_loader
       v
    your model: document_causal_mask (packed batches), ExactMean (exact metrics over ranks)
"""

from __future__ import annotations

import sys as _sys
from typing import TYPE_CHECKING

from shardload._base.version import VERSION as __version__


def _interrupted_while_starting() -> None:
    """Ctrl-C while the ``shardload`` command imports the library: one line and exit 130, no traceback.

    Only when this process is the command (the ``shardload`` script, or
    ``python -m shardload``); a program that imports shardload gets its
    ``KeyboardInterrupt`` as usual.
    """
    import os

    orig = list(getattr(_sys, "orig_argv", []))
    script = os.path.basename(getattr(_sys, "argv", [""])[0] or "")
    as_module = any(orig[i : i + 2] == ["-m", "shardload"] for i in range(len(orig)))
    if script in ("shardload", "shardload.exe") or as_module:
        print("shardload: error: interrupted", file=_sys.stderr)
        raise SystemExit(130)


try:  # the imports below take a few tenths of a second: see _interrupted_while_starting
    from shardload import _compat
    from shardload import errors as _errors
    from shardload.errors import *  # noqa: F403  (the exception tree: every name of errors.__all__)
    from shardload.formats.arrow import ArrowOptions
    from shardload.formats.origin import SampleOrigin
    from shardload.formats.zarr import ZarrOptions
    from shardload.load.stats import LoaderStats  # plain Python: no torch
    from shardload.prepare import PrepareOptions, PrepareResult, prepare, write
    from shardload.prepare.merging import MergeResult, merge
    from shardload.schema.fields import Field, Schema
    from shardload.sets.mixture import Mixture
    from shardload.sets.shardset import ShardSet
    from shardload.sets.shardset import open_shard_set as _open_shard_set
    from shardload.sets.upload import UploadResult, upload_set
except KeyboardInterrupt:
    _interrupted_while_starting()
    raise

if TYPE_CHECKING:  # type checkers see the real objects; at run time they load lazily (below)
    from shardload.integrations.datamodule import ShardDataModule
    from shardload.load.attention import document_block_mask, document_causal_mask, document_mask_mod
    from shardload.load.loader import ShardLoader, make_loader
    from shardload.load.metrics import ExactMean
    from shardload.load.options import LoaderOptions
    from shardload.load.world import World
    from shardload.plan import Batching

# torch and Lightning load only when the loading side is first used, so that
# `import shardload` and the prepare/inspect/verify commands start fast.
_LAZY = {
    "Batching": "shardload.plan",
    "ExactMean": "shardload.load.metrics",
    "LoaderOptions": "shardload.load.options",
    "ShardDataModule": "shardload.integrations.datamodule",
    "ShardLoader": "shardload.load.loader",
    "World": "shardload.load.world",
    "document_block_mask": "shardload.load.attention",
    "document_causal_mask": "shardload.load.attention",
    "document_mask_mod": "shardload.load.attention",
    "make_loader": "shardload.load.loader",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:  # a module of 0.1.0 that moved (shardload.shardset), else an AttributeError
        return _compat.moved_attribute(__name__, name)
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


#: ``shardload.open(path)``: public, but left out of ``__all__`` so that ``from shardload import *`` keeps the
#: builtin ``open``
open = _open_shard_set

_compat.install()  # the module paths of 0.1.0 (shardload.load.loader, ...) stay importable

__all__ = [
    "ArrowOptions",
    "Batching",
    "ExactMean",
    "Field",
    "LoaderOptions",
    "LoaderStats",
    "MergeResult",
    "Mixture",
    "PrepareOptions",
    "PrepareResult",
    "SampleOrigin",
    "Schema",
    "ShardDataModule",
    "ShardLoader",
    "ShardSet",
    "UploadResult",
    "World",
    "ZarrOptions",
    "__version__",
    "document_block_mask",
    "document_causal_mask",
    "document_mask_mod",
    "make_loader",
    "merge",
    "prepare",
    "upload_set",
    "write",
]
__all__ += _errors.__all__  # the exception tree
__all__.sort()  # plain sorted() order (tests/test_public_api.py)
