"""Module paths from before the package was arranged in layers, kept importable.

Version 0.1.0 had most modules side by side at the top of ``shardload/``;
they now live in the folder of their layer (docs/design.md, "The flow and the package
tree"). A program that imports an old path (``from shardload.loader import
make_loader``) still works: the old name is the new module itself
(``sys.modules`` holds it under both), with a ``DeprecationWarning`` that
names the new path. So the objects are the same ones (``isinstance`` holds, a
pickle that names an old path loads, patching through the old path patches
the module). A name that moved to a sibling module while the package was
arranged stays importable from its old module where it was that module's own
(``with_shortcuts``, ``file_checksum``); names a module only imported are not
part of it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

#: the real specs of the modules being aliased, put back once the import system has set the alias's
_SPECS: dict[str, importlib.machinery.ModuleSpec | None] = {}

#: the packages of 0.1.0 whose names now live in one module (their submodules moved too)
_PACKAGES = {"shardload.export"}

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
    """Answers an import of an old path with the new module itself: ``sys.modules`` holds it under both names.

    So everything a program does through the old name reaches the real module: a ``mock.patch`` of
    ``shardload.shardset.MAX_OPEN_SHARDS``, ``from shardload.loader import *``, ``importlib.reload``.
    """

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in _PACKAGES)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} is now {new}; the old path keeps working but may go in a later version",
            DeprecationWarning,
            stacklevel=2,
        )
        if spec.name in _PACKAGES:  # a package of 0.1.0 whose names are one module now: forward to it
            module = types.ModuleType(spec.name, importlib.import_module(new).__doc__)
            module.__dict__["__getattr__"] = lambda name: _forward(spec.name, new, name)
            return module
        module = importlib.import_module(new)
        _SPECS[new] = module.__spec__  # the import system sets __spec__ to the alias's; exec_module puts it back
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ in MOVED:
            return  # the forwarding module of a package
        module.__spec__ = _SPECS.pop(module.__name__)


def _forward(old: str, new: str, name: str) -> object:
    """Attribute ``name`` of the package ``old`` that became module ``new``: its name, or a moved submodule."""
    try:
        return getattr(importlib.import_module(new), name)
    except AttributeError:
        return moved_attribute(old, name)


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
