"""An opened shard set: manifest + lengths index, with shards mapped on demand.

``shardload.open(path)`` reads the manifest and memory-maps the lengths index;
no shard file is touched until a sample in it is asked for, so opening costs
the same whether a rank needs 3 shards of 100,000 or all of them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from shardload._base.checks import check_scalar, with_shortcuts
from shardload._base.identity import FileStamp
from shardload._base.redact import redact
from shardload._base.setfiles import ENV_MAX_OPEN_SHARDS, MAX_OPEN_SHARDS, env_limit
from shardload.errors import CorruptShardError, ShardSetError
from shardload.formats import Columns, ShardReader
from shardload.formats.manifest import ShardInfo
from shardload.formats.origin import SampleOrigin, read_origin
from shardload.plan.request import PlanInputs
from shardload.remote.options import RemoteOptions
from shardload.remote.url import is_remote, local_path
from shardload.schema.fields import Schema
from shardload.schema.text import decode_text
from shardload.sets._integrity import FileChecks
from shardload.sets._readers import ReaderPool
from shardload.sets.index import ShardIndex

if TYPE_CHECKING:
    from shardload.remote.cache import RemoteSet


class ShardSet:
    """A shard set on disk, opened for reading.

    Attributes:
        path: the shard set directory; for a remote set, its mirror in the node cache.
        url: the URL of a remote set (``None`` for a local one): what messages name.
        manifest: the validated manifest.
        index: sample id <-> (shard, row).

    At most ``max_open_shards`` shards stay open (mapped, holding a file
    descriptor) in one process; opening another closes the least recently used
    one. Arrays handed out before stay valid: they keep their mapping alive.

    Examples:
        >>> ds = shardload.open("out/")          # doctest: +SKIP
        >>> len(ds), ds.lengths[:3], ds[0]["tokens"].dtype  # doctest: +SKIP
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_open_shards: int | None = None, remote: RemoteOptions | None = None
    ) -> None:
        self.url: str | None = None
        # a remote set: manifest and lengths in a local mirror (shardload.remote.cache); shards fetched on first use
        self._remote: RemoteSet | None = None
        if is_remote(path):
            from shardload.remote.cache import RemoteSet

            self._remote = RemoteSet(str(path), remote or RemoteOptions())
            self.url = self._remote.url
            path = self._remote.open()
        self.path = Path(local_path(path))
        #: shards kept open in this process (default: $SHARDLOAD_MAX_OPEN_SHARDS, else 128)
        # 0 once meant the default and a negative number closed every shard at each open: both are refused
        self.max_open_shards = (
            env_limit(ENV_MAX_OPEN_SHARDS, MAX_OPEN_SHARDS)
            if max_open_shards is None
            else check_scalar(
                "max_open_shards",
                max_open_shards,
                low=1,
                high=sys.maxsize,
                hint=f"the shards kept open per process; None for ${ENV_MAX_OPEN_SHARDS}, else {MAX_OPEN_SHARDS}",
            )
        )
        self._checks = FileChecks(self.path)
        self.manifest = self._checks.manifest
        self.index = ShardIndex(self.manifest.table.samples)
        self._readers = ReaderPool(self.max_open_shards, self._checks, self._remote)
        self._plan_inputs: PlanInputs | None = None

    @property
    def remote(self) -> RemoteSet | None:
        """The node cache of a remote set (``None`` for a local one)."""
        return self._remote

    # -- metadata, no shard opened ---------------------------------------------------------
    @property
    def schema(self) -> Schema:
        """The fields of every sample (from the manifest)."""
        return self.manifest.schema

    @property
    def shards(self) -> Sequence[ShardInfo]:
        """One manifest entry per shard: file, samples, bytes, checksum, first sample (columns: ``manifest.table``)."""
        return self.manifest.shards

    @property
    def fingerprint(self) -> str:
        """Digest of the schema and every shard's checksum; changes when the set is re-prepared."""
        return self.manifest.fingerprint

    def __len__(self) -> int:
        return self.manifest.total_samples

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}:{f.dtype}{list(f.shape)}" for f in self.schema.fields)
        return f"ShardSet({redact(self.url or str(self.path))!r}, samples={len(self)}, shards={len(self.shards)}, fields=[{fields}])"

    @property
    def lengths(self) -> NDArray[np.integer]:
        """``(num_samples,)`` batching length of every sample, memory-mapped.

        Each access checks (one ``stat``) that the file is still the one mapped:
        a lengths index rewritten or truncated under a live loader is a
        :class:`~shardload.errors.ShardSetChangedError`, never a plan from other
        values or a ``SIGBUS``.
        """
        return self._checks.index(self.manifest.lengths_file, total=self.manifest.total_tokens)

    def plan_inputs(self) -> PlanInputs:
        """What the planner needs of this set: lengths, samples per shard and a digest of them.

        Built once (the lengths are checked once) and reused; each call checks,
        as :attr:`lengths` does, that the lengths index has not changed on disk.
        The digest is the manifest fingerprint, which covers every shard's
        checksum and so the lengths too: the index is never hashed.

        >>> plan = plan_rank(ds.plan_inputs(), EpochSpec(world_size=8), Batching(max_tokens=16384), rank=0)  # doctest: +SKIP
        """
        lengths = self.lengths
        if self._plan_inputs is None or self._plan_inputs.lengths is not lengths:
            chunk_rows = self._checks.reader_cls.plan_chunk_rows(self.schema, self.manifest.options)
            self._plan_inputs = PlanInputs(lengths, self.index.sizes, digest=self.fingerprint, chunk_rows=chunk_rows)
        return self._plan_inputs

    def field_lengths(self, name: str) -> NDArray[np.integer]:
        """``(num_samples,)`` first-axis length of variable field ``name``."""
        f = self.schema.field(name)
        if not f.variable:
            raise KeyError(f"field {name!r} is fixed-shape; it has no lengths")
        file = self.manifest.field_lengths.get(name)
        if file is None:  # a single variable field: the main index is its lengths
            return self.lengths
        return self._checks.index(file)

    # -- samples: opens shards lazily ----------------------------------------------------------
    def shard_columns(self, shard: int) -> Columns:
        """The columns of shard ``shard``, memory-mapped on first use."""
        reader = self._readers.get(shard)
        if reader is None:
            return self._open_shard(shard)
        cols = reader.columns()
        expected = self.manifest.shards[shard].samples
        if cols.num_samples != expected:
            raise CorruptShardError(
                f"shard {shard} ({reader.path}) holds {cols.num_samples} samples, the manifest says {expected}"
            )
        return cols

    def _open_shard(self, shard: int) -> Columns:
        """Map shard ``shard`` after its first-open checks (a remote set's is fetched into the node cache first).

        A remote shard stays held in the node cache while it is mapped here.
        """
        self._readers.make_room(shard)
        if self._remote is None:
            reader, cols, stamp = self._checks.open_shard(shard, self._readers.room_for)
        else:
            reader, cols, stamp = self._open_cached(shard, self._remote)
        self._readers.add(shard, reader, stamp)
        return cols

    def _open_cached(self, shard: int, remote: RemoteSet) -> tuple[ShardReader, Columns, FileStamp]:
        """:meth:`FileChecks.open_shard` of a remote shard, held in the node cache; a damaged copy is fetched again.

        The copy was sha256-checked against the manifest when it was downloaded, so a copy that fails the
        first-open checks (size, identity, sample count, offsets, the format's own) was damaged in the cache: it
        is downloaded again, once (:meth:`RemoteSet.refetch`). A fresh copy that fails too is the stored
        object's fault (:meth:`RemoteSet.damaged_in_storage`). A byte changed in sample values passes these
        checks (loading reads no more than asked): only ``verify`` finds it.
        """
        remote.acquire(shard)
        for fresh in (False, True):
            try:
                return self._checks.open_shard(shard, self._readers.room_for)
            except CorruptShardError as exc:
                if fresh:
                    remote.release(shard)
                    raise remote.damaged_in_storage(shard, exc) from exc
                damage = exc
            except BaseException as exc:
                remote.release(shard)
                if isinstance(exc, ShardSetError) and self.url is not None and self.url not in str(exc):
                    raise type(exc)(f"{self.url}: {exc}") from exc
                raise
            remote.refetch(shard, damage)  # the new copy held, or the stored object named as damaged
        raise AssertionError("unreachable: the second try returns or raises")

    def release_others(self, shards: Iterable[int]) -> None:
        """Close every open shard but ``shards`` when this remote set's cache is bounded (else nothing).

        Called after each batch: a process then holds only the shards of the batch it reads, so the
        cache can evict the rest (see docs/remote.md, "Cache sizing").
        """
        self._readers.release_others(shards)

    def check_shards_unchanged(self, shards: Iterable[int]) -> None:
        """Raise :class:`ShardSetChangedError` if any of these open shards changed since it was mapped."""
        self._readers.check_unchanged(shards)

    @property
    def open_shards(self) -> list[int]:
        """Indices of the shards this process has opened so far (for locality checks)."""
        return sorted(self._readers.opened)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Sample ``i`` as a dict of numpy arrays (zero-copy views for Arrow shards), ``str``/``bytes`` for text."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for a shard set of {n} samples")
        shard, row = self.index.locate(i % n)
        sample: dict[str, Any] = self.shard_columns(int(shard)).sample(int(row))
        for f in self.schema.text_fields:
            sample[f.name] = decode_text(f, sample[f.name], f"{self.path}: sample {i % n}")
        return sample

    def origin(self, sample_id: int) -> SampleOrigin:
        """Where sample ``sample_id`` came from: its source file and the row, line or member in it.

        For a set written by ``write()`` from an iterable, the sample's index in
        the iterable (``kind == "index"``, ``file`` is ``None``). When a map
        split the record into several samples, ``piece`` says which one this is
        (from 0, in the order the map returned them) and ``pieces`` how many
        there are; ``None`` where the set does not record it (docs/api.md).

        Raises:
            TypeError: ``sample_id`` is not an integer (a bool, float or str).
            IndexError: ``sample_id`` is not in ``[0, len(self))``.
            ShardSetError: the set records no origins (prepared by an older shardload).
        """
        options = self.manifest.options  # without a map (a function or a factory), every record is one sample
        mapped = "map" in options or "map_factory" in options
        if self._remote is not None:
            self._remote.fetch_origins(order=mapped)  # on first use only
        parts = [(p.first_sample, p.samples) for p in self.manifest.parts]
        return read_origin(self.path, sample_id, len(self), mapped=mapped, parts=parts)

    def close(self) -> None:
        """Unmap every shard opened so far; later reads map them again."""
        self._readers.close()


def open_shard_set(
    path: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
    remote: RemoteOptions | None = None,
) -> ShardSet:
    """Open a shard set written by ``prepare``/``write``: a directory, or a URL (``s3://``, ``gs://``, ``https://``).

    A remote set's manifest and lengths indexes are fetched into the node cache; each shard is
    downloaded whole on first use, checked against the manifest's sha256, and memory-mapped from
    there (docs/remote.md). A local set is read where it is and no cache is made.

    Args:
        path: the shard set directory or URL.
        storage_options: keywords of the fsspec filesystem (credentials, ``client_kwargs``); default:
            the standard environment variables.
        cache_dir: the node cache (default ``$SHARDLOAD_CACHE_DIR``, else ``~/.cache/shardload``).
        cache_limit: the most bytes of shards the set keeps in the cache (default no limit).
        remote: all remote settings at once (:class:`~shardload.remote.RemoteOptions`); the keywords
            above are shortcuts for its fields and must agree with it.
    """
    options = with_shortcuts(
        remote,
        RemoteOptions,
        "remote",
        storage_options=storage_options,
        cache_dir=cache_dir,
        cache_limit=cache_limit,
    )
    return ShardSet(path, remote=options)
