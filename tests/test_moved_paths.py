"""The module paths of 0.1.0 and every path the docs name keep importing (shardload/_compat.py).

Version 0.1.0 had most modules at the top of the package; they now live in
the folder of their layer. A program written against 0.1.0 keeps working,
with a DeprecationWarning naming the new path; the docs name the new paths.
"""

from __future__ import annotations

import importlib
import pickle
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import shardload
from shardload._compat import MOVED

ROOT = Path(__file__).resolve().parents[1]

#: every dotted ``shardload.*`` path the 0.1.0 docs (docs/*.md but the changelog, README.md) named
OLD_PATHS = (
    "shardload.LoaderOptions",
    "shardload.Mixture",
    "shardload.ShardDataModule",
    "shardload.ShardSet",
    "shardload.ZarrOptions",
    "shardload.cast.cast_exact",
    "shardload.cli._common.CommandError",
    "shardload.datamodule.ShardDataModule",
    "shardload.errors",
    "shardload.export",
    "shardload.export.to_webdataset",
    "shardload.formats.arrow.options.ArrowOptions",
    "shardload.formats.zarr.options.ZarrOptions",
    "shardload.formats.zarr.set_chunk_cache_bytes",
    "shardload.inspect",
    "shardload.inspect.describe",
    "shardload.loader.PlanSampler",
    "shardload.loader.ShardLoader",
    "shardload.loader.make_loader",
    "shardload.loader_options.LoaderOptions",
    "shardload.make_loader",
    "shardload.merge",
    "shardload.merging.MergeResult",
    "shardload.merging.merge",
    "shardload.mixture.Mixture",
    "shardload.open",
    "shardload.origin.SampleOrigin",
    "shardload.plan",
    "shardload.plan.Batching",
    "shardload.plan.EpochSpec",
    "shardload.plan.MixInputs",
    "shardload.plan.length.EpochLengthWarning",
    "shardload.plan.options.Batching",
    "shardload.plan.planner.RankPlan",
    "shardload.plan.planner.plan_rank",
    "shardload.plan.reads.cache_bytes",
    "shardload.plan.reads.read_sequence",
    "shardload.plan.reads.step_bytes",
    "shardload.plan.request.EpochSpec",
    "shardload.plan.request.PlanInputs",
    "shardload.plan.resume.ResumeInputs",
    "shardload.plan.summarize_plan",
    "shardload.plan.summary.PlanSummary",
    "shardload.plan.summary.summarize_plan",
    "shardload.prepare",
    "shardload.prepare.mapping.load_map",
    "shardload.prepare.options.PrepareOptions",
    "shardload.prepare.pipeline.PrepareResult",
    "shardload.prepare.prepare",
    "shardload.prepare.write",
    "shardload.ray",
    "shardload.ray.ShardSink",
    "shardload.ray.write_dataset",
    "shardload.remote",
    "shardload.remote.RemoteOptions",
    "shardload.remote.options.RemoteOptions",
    "shardload.remote.policy.NEVER",
    "shardload.remote.policy.NextUseTable",
    "shardload.remote.policy.choose_victims",
    "shardload.remote.policy.next_uses",
    "shardload.remote.policy.node_next_uses",
    "shardload.remote.policy.node_sequence",
    "shardload.remote.with_retries",
    "shardload.schema",
    "shardload.schema.Field",
    "shardload.schema.Schema",
    "shardload.schema.schema_problems",
    "shardload.shardset.ShardSet",
    "shardload.shardset.open_shard_set",
    "shardload.testing.synthetic_samples",
    "shardload.verify",
    "shardload.verify.verify",
    "shardload.world.World",
    "shardload.write",
)

#: dotted names in the docs that are not module paths (Arrow schema metadata keys)
NOT_PATHS = {"shardload.shard", "shardload.shard_table"}


def resolve(path: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def documented_paths() -> set[str]:
    pages = [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "changelog.md"] + [ROOT / "README.md"]
    found = set()
    for page in pages:
        found |= set(re.findall(r"shardload(?:\.[A-Za-z_]\w*)+", page.read_text()))
    return found - NOT_PATHS


@pytest.mark.parametrize("path", OLD_PATHS)
def test_a_path_of_0_1_0_still_names_its_object(path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = resolve(path)
    # Invariant: the old path names the very object the new tree holds (isinstance and pickles agree)
    module = getattr(old, "__module__", None)
    name = getattr(old, "__qualname__", None)
    if module and name and module.startswith("shardload"):
        assert resolve(f"{module}.{name}") is old
    assert old is not None


def test_every_path_the_docs_name_imports_without_a_warning() -> None:
    paths = documented_paths()
    assert len(paths) > 40
    problems = []
    for path in sorted(paths):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            try:
                resolve(path)
            except (ImportError, AttributeError, DeprecationWarning) as exc:
                problems.append(f"{path}: {exc!r}")
    # Invariant: the docs name paths that exist, in the new tree
    assert problems == []


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_warns_and_forwards_every_name(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)  # the alias of an earlier import: import it afresh
    with pytest.warns(DeprecationWarning, match=re.escape(MOVED[old])):
        module = importlib.import_module(old)
    names = getattr(new, "__all__", None) or [n for n in vars(new) if not n.startswith("_")]
    for name in names:
        # Invariant: the old module gives the new module's objects
        assert getattr(module, name) is getattr(new, name), name
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_a_pickle_that_names_an_old_module_loads() -> None:
    from shardload.load.world import World

    # a pickle written by 0.1.0 names the class by its old module
    payload = pickle.dumps(World(1, 4, "test"), protocol=0).replace(b"shardload.load.world", b"shardload.world")
    assert b"shardload.world" in payload
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        loaded = pickle.loads(payload)
    assert loaded == World(1, 4, "test") and type(loaded) is World


def test_the_public_names_are_the_same_objects_as_their_modules() -> None:
    assert shardload.ShardSet is resolve("shardload.sets.shardset.ShardSet")
    assert shardload.make_loader is resolve("shardload.load.loader.make_loader")
    assert shardload.ShardDataModule is resolve("shardload.integrations.datamodule.ShardDataModule")


def test_an_old_module_is_an_attribute_of_the_package_as_before() -> None:
    # 0.1.0's `import shardload` imported shardset, merging, mixture, ...: code reached them as attributes
    for name in ("shardload.shardset", "shardload.loader_options"):  # as in a fresh process
        sys.modules.pop(name, None)
        vars(shardload).pop(name.split(".")[1], None)
    with pytest.warns(DeprecationWarning, match="shardload.sets.shardset"):
        assert shardload.shardset.open_shard_set is shardload.open  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="shardload.load.options"):
        from shardload import loader_options  # type: ignore[attr-defined]
    assert loader_options.LoaderOptions is resolve("shardload.load.options.LoaderOptions")
    with pytest.raises(AttributeError, match="no attribute 'no_such_module'"):
        shardload.no_such_module  # type: ignore[attr-defined]  # noqa: B018


def test_an_old_path_is_the_module_itself_so_patching_and_star_imports_reach_it() -> None:
    from unittest import mock

    import shardload.sets.shardset as shardset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("shardload.shardset")
        star: dict[str, Any] = {}
        exec("from shardload.world import *", star)  # load/world.py has no __all__
        with mock.patch("shardload.shardset.MAX_OPEN_SHARDS", 2):
            # Invariant: a patch through the old path is a patch of the module the code reads
            assert shardset.MAX_OPEN_SHARDS == 2
    assert old is shardset and old.__spec__ is not None and old.__spec__.name == "shardload.sets.shardset"
    assert star["World"] is resolve("shardload.load.world.World")


def test_a_package_of_0_1_0_and_its_submodule_import() -> None:
    for name in ("shardload.export", "shardload.export.webdataset"):
        sys.modules.pop(name, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import shardload.export.webdataset as webdataset  # type: ignore[import-not-found]

        export = importlib.import_module("shardload.export")
    assert (
        webdataset.to_webdataset
        is export.to_webdataset
        is resolve("shardload.integrations.webdataset_export.to_webdataset")
    )
    assert export.webdataset is webdataset


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("shardload.loader_options", "with_shortcuts", "shardload._base.checks"),
        ("shardload.manifest", "file_checksum", "shardload._base.checksum"),
        ("shardload.schema", "text_kind", "shardload.schema.text"),
        ("shardload.plan.mix", "MAX_EPOCH_SIZE", "shardload.plan.mix.inputs"),
    ],
)
def test_a_name_that_moved_to_a_sibling_module_is_still_in_its_old_one(old: str, name: str, new: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize(
    ("package", "name"),
    [("shardload.plan", "pack"), ("shardload.plan", "validate"), ("shardload.remote", "prefetch"),
     ("shardload.formats.zarr", "codecs"), ("shardload.prepare.sources", "jsonblocks")],
)  # fmt: skip
def test_a_moved_submodule_is_still_an_attribute_of_its_old_package(package: str, name: str) -> None:
    parent = importlib.import_module(package)
    vars(parent).pop(name, None)  # as in a fresh process, where nothing imported the old path yet
    sys.modules.pop(f"{package}.{name}", None)
    with pytest.warns(DeprecationWarning, match=re.escape(MOVED[f"{package}.{name}"])):
        module = getattr(parent, name)
    assert module is importlib.import_module(MOVED[f"{package}.{name}"])
    with pytest.raises(AttributeError, match="no attribute 'no_such_module'"):
        parent.no_such_module  # noqa: B018
