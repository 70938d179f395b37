"""Write one shard as a Zarr v3 group packed in a single uncompressed zip file.

Fixed timestamps and sorted member names: the same samples and options always give the same bytes
(what lets ``prepare --resume`` finish with the checksums an uninterrupted run would have had).
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from shardload._base.identity import IDENTITY_KEY, ShardIdentity
from shardload.errors import InputError
from shardload.formats.base import Columns, ShardWriter
from shardload.formats.zarr.compression import compressors_for, require_zarr
from shardload.formats.zarr.options import ZarrOptions
from shardload.plan.chunks import even_chunk_rows
from shardload.schema.fields import Field, Schema

#: version of the layout inside a Zarr shard, in the root group's ``shardload`` attribute
LAYOUT_VERSION = 1
#: zip timestamps are fixed (the earliest a zip can hold) so that a shard's bytes depend on its content only
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def nominal_chunk_rows(f: Field, chunk_size: int) -> int:
    """Rows of ``f``'s values in about ``chunk_size`` uncompressed bytes (at least one row)."""
    row_bytes = math.prod(f.inner_shape) * np.dtype(f.dtype).itemsize
    return max(1, chunk_size // max(1, row_bytes))


def chunk_rows(rows: int, f: Field, chunk_size: int) -> int:
    """Rows per chunk of ``f``'s ``rows`` values: about ``chunk_size`` bytes, evened out over ``rows``.

    The planner predicts chunks by the same rule (:func:`~shardload.plan.chunks.even_chunk_rows`).
    """
    return even_chunk_rows(rows, nominal_chunk_rows(f, chunk_size))


def check_node_name(name: str) -> None:
    """Refuse a field name that cannot be a Zarr node name (it names a group in the store)."""
    if not name or "/" in name or name in (".", "..") or name.startswith("__"):
        raise InputError(
            f"field name {name!r} cannot name a Zarr group (no '/', not '.' or '..', no leading '__'); "
            "rename the field or use the arrow format"
        )


class ZarrShardWriter(ShardWriter[ZarrOptions]):
    """Writes :class:`Columns` as a Zarr v3 group inside one zip file (``.zarr.zip``)."""

    suffix: ClassVar[str] = ".zarr.zip"

    @classmethod
    def check_schema(cls, schema: Schema) -> None:
        """Refuse a field name that cannot name a Zarr group, and text fields (checked by ``prepare`` on the first sample)."""
        for f in schema.fields:
            check_node_name(f.name)
            if f.text:
                raise InputError(
                    f"field {f.name!r} holds text ({f.dtype}), which the zarr shard format does not store; "
                    f"prepare with --format arrow, or leave the field out (--drop-fields {f.name})"
                )

    def write(self, path: Path, columns: Columns, *, identity: ShardIdentity | None = None) -> None:
        zarr = require_zarr()
        members: dict[str, Any] = {}
        store = zarr.storage.MemoryStore(store_dict=members)
        attributes = self._attributes(columns)
        if identity is not None:
            attributes[IDENTITY_KEY] = identity.to_json()
        root = zarr.open_group(store, mode="w", zarr_format=3, attributes={"shardload": attributes})
        for f in self.schema.fields:
            data = columns.fields[f.name]
            group = root.create_group(f.name)
            self._array(group, "values", f, np.asarray(data.values))
            if data.offsets is not None:
                offsets = np.asarray(data.offsets, dtype=np.int64)
                self._store(group, "offsets", offsets, chunks=(len(offsets),))
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for key in sorted(members):
                info = zipfile.ZipInfo(key, date_time=_ZIP_EPOCH)
                info.compress_type = zipfile.ZIP_STORED
                info.external_attr = 0o644 << 16
                zf.writestr(info, members[key].to_bytes())

    def _attributes(self, columns: Columns) -> dict[str, Any]:
        return {
            "layout_version": LAYOUT_VERSION,
            "num_samples": columns.num_samples,
            "schema": self.schema.to_json(),
            **self.options.to_json(),
        }

    def _array(self, group: Any, name: str, f: Field, values: np.ndarray) -> None:
        rows = chunk_rows(len(values), f, self.options.chunk_size)
        self._store(group, name, values, chunks=(rows, *(max(1, d) for d in f.inner_shape)))

    def _store(self, group: Any, name: str, values: np.ndarray, *, chunks: tuple[int, ...]) -> None:
        arr = group.create_array(
            name,
            shape=values.shape,
            dtype=values.dtype,
            chunks=chunks,
            compressors=compressors_for(
                self.options.compression, self.options.compression_level, values.dtype.itemsize
            ),
            filters=None,
            fill_value=np.zeros((), dtype=values.dtype)[()],
            # Every chunk is stored, even an all-zero one: a chunk missing from a shard is then always damage.
            config={"write_empty_chunks": True},
        )
        if values.size:
            arr[...] = values
