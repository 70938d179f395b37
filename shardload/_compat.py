"""Module paths from before the package was arranged in layers, kept importable.

Version 0.1.0 had most modules side by side at the top of ``shardload/``;
they now live in the folder of their layer (docs/design.md, "The package
tree"). A program that imports an old path (``from shardload.loader import
make_loader``) still works: the old name is an alias of the new module, with a
``DeprecationWarning`` that names the new path. The objects are the same ones
(``isinstance`` holds, a pickle that names an old path loads).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

#: old module path -> the module that holds its names now
MOVED: dict[str, str] = {
    "shardload.checksum": "shardload._base.checksum",
    "shardload.envvars": "shardload._base.envvars",
    "shardload.identity": "shardload._base.identity",
    "shardload.messages": "shardload._base.messages",
    "shardload.output": "shardload._base.output",
    "shardload.progress": "shardload._base.progress",
    "shardload.setfiles": "shardload._base.setfiles",
    "shardload.plan.validate": "shardload._base.checks",
    "shardload.plan.ranges": "shardload._base.ranges",
    "shardload.prepare.workers": "shardload._base.pool",
    "shardload.prepare.faults": "shardload._base.faults",
    "shardload.text": "shardload.schema.text",
    "shardload.cast": "shardload.schema.cast",
    "shardload.plan.pack": "shardload.plan.packing.pack",
    "shardload.plan.packrows": "shardload.plan.packing.rows",
    "shardload.plan.packtrack": "shardload.plan.packing.track",
    "shardload.plan.mixbatch": "shardload.plan.mix.batcher",
    "shardload.plan.mixreport": "shardload.plan.mix.report",
    "shardload.manifest": "shardload.formats.manifest",
    "shardload.shardtable": "shardload.formats.shardtable",
    "shardload.origin": "shardload.formats.origin",
    "shardload.formats.zarr.codecs": "shardload.formats.zarr.compression",
    "shardload.shardset": "shardload.sets.shardset",
    "shardload.mixture": "shardload.sets.mixture",
    "shardload.verify": "shardload.sets.verify",
    "shardload.inspect": "shardload.sets.describe",
    "shardload.index": "shardload.sets.index",
    "shardload.merging": "shardload.prepare.merging",
    "shardload.collate_packed": "shardload.load.collate_packed",
    "shardload.collate": "shardload.load.collate",
    "shardload.dataset": "shardload.load.dataset",
    "shardload.loader_options": "shardload.load.options",
    "shardload.loader_state": "shardload.load.state",
    "shardload.loader": "shardload.load.loader",
    "shardload.workers": "shardload.load.workers",
    "shardload.world": "shardload.load.world",
    "shardload.remote.prefetch": "shardload.load.prefetch",
    "shardload._lightning": "shardload.integrations.trainer",
    "shardload.datamodule": "shardload.integrations.datamodule",
    "shardload.ray": "shardload.integrations.ray_sink",
    "shardload.export": "shardload.integrations.webdataset_export",
    "shardload.export.webdataset": "shardload.integrations.webdataset_export",
    "shardload.cli.inspect": "shardload.cli.inspect_set",
    "shardload.prepare.sources.jsonblocks": "shardload.prepare.sources.jsonl._blocks",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an import of an old path with a module that forwards every name to the new one."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def exec_module(self, module: types.ModuleType) -> None:
        new = MOVED[module.__name__]
        warnings.warn(
            f"{module.__name__} is now {new}; the old path keeps working but may go in a later version",
            DeprecationWarning,
            stacklevel=2,
        )
        target = importlib.import_module(new)
        module.__doc__ = target.__doc__
        module.__dict__["__getattr__"] = lambda name: getattr(target, name)
        module.__dict__["__dir__"] = lambda: dir(target)
        if hasattr(target, "__all__"):
            module.__dict__["__all__"] = list(target.__all__)


def moved_attribute(package: str, name: str) -> types.ModuleType:
    """``package.name`` where it named a 0.1.0 module that moved (``shardload.shardset`` after ``import shardload``).

    Raises:
        AttributeError: ``package.name`` was no module of 0.1.0 either.
    """
    old = f"{package}.{name}"
    if old not in MOVED:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return importlib.import_module(old)


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
