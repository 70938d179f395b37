"""Write one shard as an uncompressed Arrow IPC file with a single record batch."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa

from shardload._base.checksum import DigestingFile
from shardload._base.identity import ARROW_IDENTITY_KEY, ShardIdentity
from shardload.formats.arrow.arrays import arrow_of
from shardload.formats.arrow.options import ArrowOptions
from shardload.formats.arrow.splice import SplicingFile, placeholder
from shardload.formats.base import Columns, FieldData, ShardWriter, concat_columns, concat_offsets
from shardload.schema.fields import Field, Schema

#: key of the Arrow schema metadata that holds the shardload schema as JSON
SCHEMA_METADATA_KEY = b"shardload.schema"


def arrow_type(field: Field) -> pa.DataType:
    """The Arrow type that stores ``field`` (bool is stored as uint8, text as ``large_string``/``large_binary``)."""
    if field.text:
        return pa.large_string() if field.dtype == "str" else pa.large_binary()
    dtype = np.dtype("uint8") if field.dtype == "bool" else np.dtype(field.dtype)
    typ: pa.DataType = pa.from_numpy_dtype(dtype)
    for dim in reversed(field.inner_shape):
        typ = pa.list_(typ, dim)
    return pa.large_list(typ) if field.variable else typ


def arrow_schema(schema: Schema, identity: ShardIdentity | None = None) -> pa.Schema:
    meta = {SCHEMA_METADATA_KEY: json.dumps(schema.to_json()).encode()}
    if identity is not None:
        meta[ARROW_IDENTITY_KEY] = json.dumps(identity.to_json(), sort_keys=True).encode()
    return pa.schema([pa.field(f.name, arrow_type(f), nullable=False) for f in schema.fields], metadata=meta)


def to_arrow(field: Field, values: np.ndarray, offsets: np.ndarray | None) -> pa.Array:
    """Wrap numpy buffers as an Arrow array without a per-sample conversion."""
    if field.text:
        if offsets is None:
            raise ValueError(f"text field {field.name!r} has no offsets")
        data = pa.py_buffer(np.ascontiguousarray(values, dtype=np.uint8))
        starts = pa.py_buffer(np.ascontiguousarray(offsets, dtype=np.int64))
        text: pa.Array = pa.Array.from_buffers(arrow_type(field), len(offsets) - 1, [None, starts, data])
        if field.dtype == "str":
            text.validate(full=True)  # every value UTF-8 (the checks at prepare made it so; a chunk is re-checked)
        return text
    flat = np.ascontiguousarray(values).reshape(-1)
    if field.dtype == "bool":
        flat = flat.view(np.uint8)
    arr = arrow_of(flat)
    for dim in reversed(field.inner_shape):
        arr = pa.FixedSizeListArray.from_arrays(arr, dim)
    if offsets is not None:
        arr = pa.LargeListArray.from_arrays(arrow_of(np.ascontiguousarray(offsets, dtype=np.int64)), arr)
    return arr


def _flat_array(flat: np.ndarray) -> pa.Array:
    """A contiguous 1-d numpy array as the Arrow array ``pa.array(flat)`` makes, from its buffer: ``pa.array``
    imports pandas (0.3 to 1 s in each worker process of ``prepare``)."""
    return pa.Array.from_buffers(pa.from_numpy_dtype(flat.dtype), len(flat), [None, pa.py_buffer(flat)])


class ArrowShardWriter(ShardWriter[ArrowOptions]):
    """Writes :class:`Columns` as one Arrow IPC file, uncompressed so it can be memory-mapped."""

    suffix: ClassVar[str] = ".arrow"
    bounds_field_values: ClassVar[bool] = True

    def write(
        self,
        path: Path,
        columns: Columns,
        *,
        identity: ShardIdentity | None = None,
        through: DigestingFile | SplicingFile | None = None,
    ) -> None:
        """Write ``columns`` to ``path``, or through ``through`` (a sink open on ``path``)."""
        schema = arrow_schema(self.schema, identity)
        arrays = [
            to_arrow(f, columns.fields[f.name].values, columns.fields[f.name].offsets) for f in self.schema.fields
        ]
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        sink = pa.OSFile(str(path), "wb") if through is None else pa.PythonFile(through, mode="w")
        with sink, pa.ipc.new_file(sink, schema) as writer:
            writer.write_batch(batch)

    def write_checksummed(self, path: Path, columns: Columns, *, identity: ShardIdentity | None = None) -> str:
        """:meth:`write`, hashing the bytes on their way to the file (nothing is read back)."""
        with DigestingFile(path) as digesting:
            self.write(path, columns, identity=identity, through=digesting)
            return digesting.checksum

    def write_concatenated(self, path: Path, pieces: Sequence[Columns]) -> None:
        """``write(path, concat_columns(schema, pieces))``, the same bytes, without the concatenation in memory.

        See :mod:`shardload.formats.arrow.splice`; a text field (checked whole as UTF-8) makes it the
        plain concatenation.
        """
        if len(pieces) == 1:
            self.write(path, pieces[0])
            return
        if any(f.text for f in self.schema.fields) or not self._write_spliced(path, pieces):
            self.write(path, concat_columns(self.schema, pieces))

    def _write_spliced(self, path: Path, pieces: Sequence[Columns]) -> bool:
        splices: dict[int, tuple[int, list[np.ndarray]]] = {}
        fields = {}
        for f in self.schema.fields:
            datas = [p.fields[f.name] for p in pieces]
            parts = [np.ascontiguousarray(d.values) for d in datas]
            if any(v.dtype != np.dtype(f.value_dtype) for v in parts):
                return False  # another byte order (or type): only a concatenation converts it
            shape = (sum(len(v) for v in parts), *parts[0].shape[1:])
            if all(shape):
                values = placeholder(shape, parts[0].dtype)
                splices[values.ctypes.data] = (values.nbytes, parts)
            else:  # nothing to write: no placeholder (a mapping cannot be empty)
                values = np.concatenate(parts)
            fields[f.name] = FieldData(values, concat_offsets(datas) if f.has_offsets else None)
        with SplicingFile(path, splices) as splicing:
            self.write(path, Columns(sum(p.num_samples for p in pieces), fields), through=splicing)
        return splicing.complete
