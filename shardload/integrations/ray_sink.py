"""Prepare a shard set from a Ray Data dataset: each write task writes one part, the driver merges them.

The prepare step of the flow, run by Ray (docs/parts.md, "Ray Data"). Each task
writes a hidden folder of ``OUT/parts/``; only once *every* task succeeded does the
driver name the parts in task order and merge them (no shard copied), so a failed
write leaves ``OUT`` as it was. Sample ids follow the write tasks' order: the
dataset's under ``preserve_order``, which :func:`write_dataset` sets.

>>> import ray, shardload.integrations.ray_sink                                      # doctest: +SKIP
>>> ds = ray.data.read_parquet("s3://bucket/tokens/")              # doctest: +SKIP
>>> shardload.integrations.ray_sink.write_dataset(ds, "/shared/out", num_shards=64)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from shardload._base.output import withdraw_index
from shardload.errors import InputError, MissingDependencyError, OutputError, OutputExistsError, OutputLockedError
from shardload.formats.manifest import MANIFEST_NAME, Manifest
from shardload.prepare import PrepareOptions
from shardload.prepare.merging import MergeResult, merge
from shardload.prepare.parts import PART_NAME, PARTS_DIR, part_name, part_record
from shardload.prepare.pipeline import run_prepare
from shardload.prepare.remote import refuse_remote_parts
from shardload.remote.url import is_remote, local_path

try:
    # Importing Ray adds warning filters; the caller's stay as they were (a library sets none).
    with warnings.catch_warnings():
        from ray.data import Datasink
        from ray.data.block import Block, BlockAccessor
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        f"shardload.integrations.ray_sink needs Ray Data ({exc}): pip install 'shardload[ray]'", name="ray"
    ) from None

__all__ = ["ShardSink", "write_dataset"]

#: options a sink decides itself (one part per task; the pipeline's own worker processes are allowed)
_REFUSED = ("resume", "overwrite", "progress")


class ShardSink(Datasink["dict[str, Any] | None"]):
    """A Ray Data sink that writes a shard set into ``out``: one part per write task, merged on the driver.

    ``out`` is on storage every Ray node can write (a shared file system); with
    ``overwrite`` the old set there stays intact until every task succeeded.
    ``options`` are :class:`~shardload.prepare.PrepareOptions` (``num_shards``,
    ``shard_size`` per part; ``workers`` are processes inside each task).
    After ``ds.write_datasink(sink)``, :attr:`result` is the merge's
    :class:`~shardload.prepare.merging.MergeResult`.

    Raises:
        InputError: an invalid option (when the sink is made, on the driver).
        OutputExistsError: ``out`` already holds a set or parts, without ``overwrite`` (when the write starts).
        OutputError: ``out`` is a URL: a sink writes parts, which are merged on a shared file system.
    """

    def __init__(self, out: str | os.PathLike[str], *, overwrite: bool = False, **options: Any) -> None:
        given = sorted(set(options) & set(_REFUSED))
        if given:
            raise InputError(
                f"ShardSink: {', '.join(given)} cannot be given: a sink always writes a whole new set "
                "(pass overwrite=True to replace one)"
            )
        PrepareOptions(**options)  # invalid options are refused here, on the driver, before any task runs
        if is_remote(out):
            refuse_remote_parts(os.fsdecode(out), "ShardSink (one part per task, merged on the driver)")
        self.out = Path(local_path(out))
        self.overwrite = overwrite
        self.options = dict(options)
        #: the id of this write, recorded by every part (the merge refuses parts of another write)
        self.run = uuid.uuid4().hex
        self.result: MergeResult | None = None

    # -- on the driver ---------------------------------------------------------------------------------------
    def on_write_start(self, schema: Any = None) -> None:
        """Refuse an ``out`` that holds a set or parts (unless ``overwrite``), and make ``out/parts``."""
        if not self.overwrite and self.out.is_dir():
            old = [p.name for p in _final_parts(self.out)]
            if (self.out / MANIFEST_NAME).exists() or old:
                raise OutputExistsError(
                    f"{self.out}: already holds a shard set or parts ({', '.join(old[:3]) or MANIFEST_NAME}); pass "
                    "overwrite=True to replace it (the old set stays intact until the new one is complete)"
                )
        (self.out / PARTS_DIR).mkdir(parents=True, exist_ok=True)

    def on_write_complete(self, write_result: Any) -> None:
        """Every task succeeded: name the parts in task order and merge them (see the module docstring)."""
        done = sorted((r for r in write_result.write_returns if r is not None), key=lambda r: int(r["task"]))
        n = len(done)
        if n == 0:
            self._cleanup()
            raise InputError(f"{self.out}: the dataset holds no rows; nothing to prepare")
        withdraw_index(self.out / MANIFEST_NAME)  # from here the old set (if any) is no set
        for old in _final_parts(self.out):
            shutil.rmtree(old)
        for k, record in enumerate(done):
            src = self.out / PARTS_DIR / record["dir"]
            manifest = Manifest.load(src)
            options = {**manifest.options, **part_record(k, n, self.run)}
            replace(manifest, options=options).write(src)  # the part's place, now that every part is known
            os.replace(src, self.out / PARTS_DIR / part_name(k, n))
        self._cleanup()
        self.result = merge(self.out)

    def on_write_failed(self, error: Exception) -> None:
        """A task failed: nothing is merged; this write's parts are removed (best effort)."""
        self._cleanup()

    def _cleanup(self) -> None:
        for path in (self.out / PARTS_DIR).glob(f".{self.run}-*"):
            shutil.rmtree(path, ignore_errors=True)

    # -- in each write task ----------------------------------------------------------------------------------
    def write(self, blocks: Iterable[Block], ctx: Any) -> dict[str, Any] | None:
        """Write the rows of ``blocks`` as one part (a hidden folder until the driver names it).

        Returns ``{"task": ctx.task_idx, "dir": folder, "samples": n}``, or ``None`` for a task with no rows.
        """
        rows = _rows(blocks)
        first = next(rows, None)
        if first is None:
            return None
        folder = f".{self.run}-{ctx.task_idx:06d}"
        options = PrepareOptions(**self.options, progress=False)

        def samples() -> Iterator[Mapping[str, Any]]:
            yield first
            yield from rows

        existed = (self.out / PARTS_DIR / folder).exists()  # another attempt's: never removed by this one
        try:
            result = run_prepare(
                self.out / PARTS_DIR / folder,
                options=options,
                samples=samples(),
                describe={"source": "ray.data", **part_record(int(ctx.task_idx), 0, self.run)},
                part=None,
            )
        except BaseException as exc:  # a bad row, or Ray cancelling this task after another failed: leave no part
            if not existed and not isinstance(exc, OutputLockedError):
                shutil.rmtree(self.out / PARTS_DIR / folder, ignore_errors=True)
            raise
        return {"task": int(ctx.task_idx), "dir": folder, "samples": result.samples}


def _rows(blocks: Iterable[Block]) -> Iterator[dict[str, Any]]:
    """Rows of Ray blocks as dicts of numpy arrays (lists, e.g. of an Arrow list column, become arrays)."""
    for block in blocks:
        rows: Iterator[Mapping[str, Any]] = BlockAccessor.for_block(block).iter_rows(public_row_format=True)
        for row in rows:
            yield {name: np.asarray(v) if isinstance(v, (list, tuple)) else v for name, v in row.items()}


def _final_parts(out: Path) -> list[Path]:
    folder = out / PARTS_DIR
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if PART_NAME.fullmatch(p.name))


def write_dataset(ds: Any, out: str | os.PathLike[str], *, overwrite: bool = False, **options: Any) -> MergeResult:
    """Write a ``ray.data.Dataset`` as a shard set in ``out``, its samples in the dataset's order; the merge's result.

    Sets ``preserve_order`` in the dataset's own ``DataContext``, then ``ds.write_datasink(ShardSink(...))``.
    """
    ds.context.execution_options.preserve_order = True
    sink = ShardSink(out, overwrite=overwrite, **options)
    ds.write_datasink(sink)
    if sink.result is None:  # on_write_complete did not run: Ray raises first, this is a safeguard
        raise OutputError(f"{out}: Ray finished the write without completing it; nothing was merged")
    return sink.result
