"""Read an Arrow shard through a memory map; every field comes back as numpy views."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa

from shardload._base.identity import ARROW_IDENTITY_KEY
from shardload.errors import CorruptShardError
from shardload.formats.arrow.ipc import LayoutError, check_ipc_layout
from shardload.formats.arrow.writer import arrow_type
from shardload.formats.base import Columns, FieldData, ShardReader
from shardload.schema.fields import Field, Schema


class ArrowShardReader(ShardReader):
    """Memory-maps one Arrow IPC shard and exposes its buffers as numpy views (shared through the page cache)."""

    def __init__(
        self, path: Path, schema: Schema, *, samples: int | None = None, options: Mapping[str, object] | None = None
    ) -> None:
        super().__init__(path, schema, samples=samples, options=options)
        self._mmap: pa.MemoryMappedFile | None = None
        self._fd: int | None = None  # the map's descriptor, asked for twice per shard per batch (stamp checks)

    def fileno(self) -> int | None:
        return self._fd

    def close(self) -> None:
        super().close()
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        self._fd = None

    def _open(self) -> Columns:
        try:
            self._mmap = pa.memory_map(str(self.path), "r")
            self._fd = int(self._mmap.fileno())
            whole = self._check_layout(self._mmap)
            # Read from the buffer, not the map: pyarrow reads a file's footer through its I/O threads,
            # which hold the map for a moment after; a process forked then (a loader worker) inherits
            # that hold from a thread it does not have, and could never unmap the shard.
            reader = pa.ipc.open_file(whole)
            self._check_schema(reader.schema)
            batch = reader.get_batch(0)
            batch.validate()
            self._check_mapped(batch, whole)
            self.stored_identity = (reader.schema.metadata or {}).get(ARROW_IDENTITY_KEY)
        except FileNotFoundError:
            raise CorruptShardError(
                f"shard {self.path} is missing; run `shardload verify` on the shard set and re-run prepare"
            ) from None
        except (pa.ArrowException, OSError, ValueError) as exc:  # any damage, e.g. ArrowNotImplementedError
            raise CorruptShardError(
                f"shard {self.path} cannot be read as Arrow ({exc}); it is truncated or corrupt. "
                "Run `shardload verify` and re-run prepare for this shard set."
            ) from None
        fields = {}
        for f in self.schema.fields:
            try:
                col = batch.column(f.name)
            except KeyError:
                raise CorruptShardError(f"shard {self.path} has no column {f.name!r}") from None
            fields[f.name] = self._field(f, col, batch.num_rows)
        return Columns(num_samples=batch.num_rows, fields=fields)

    # -- the format's contract, checked before (and after) pyarrow reads the batch -------------------
    def _refuse(self, problem: str) -> CorruptShardError:
        return CorruptShardError(
            f"shard {self.path}: {problem}. Shards are uncompressed Arrow IPC files with one record batch, as "
            "`shardload prepare` writes them; run `shardload verify` and re-run prepare for this shard set."
        )

    def _check_layout(self, mmap: pa.MemoryMappedFile) -> pa.Buffer:
        """The whole mapped file, once its IPC metadata is checked (see :mod:`.ipc`); nothing is decoded."""
        mmap.seek(0)
        whole = mmap.read_buffer(mmap.size())  # zero-copy: a view of the mapping (read_at would copy)
        mmap.seek(0)
        try:
            check_ipc_layout(memoryview(whole))
        except LayoutError as exc:
            raise self._refuse(str(exc)) from None
        return whole

    def _check_schema(self, found: pa.Schema) -> None:
        """The file's columns must be exactly the schema's: an extra column could be anything."""
        names = [f.name for f in self.schema.fields]
        if found.names != names:
            raise self._refuse(f"its columns are {found.names}, the manifest's schema has {names}")
        for f, af in zip(self.schema.fields, found, strict=True):
            expected = arrow_type(f)
            if not af.type.equals(expected):
                # Reading the buffers of another type as this one would misread (or overrun) them.
                raise CorruptShardError(
                    f"shard {self.path}: column {f.name!r} is stored as {af.type}, but the manifest's schema "
                    f"({f.dtype} {list(f.shape)}) needs {expected}; the shard does not belong to this manifest"
                )

    def _check_mapped(self, batch: pa.RecordBatch, whole: pa.Buffer) -> None:
        """Every buffer pyarrow returned must be a view of the mapping, not memory it allocated."""
        lo, hi = whole.address, whole.address + whole.size
        for name, col in zip(batch.schema.names, batch.columns, strict=True):
            for buf in col.buffers():
                if buf is not None and buf.size and not lo <= buf.address <= hi - buf.size:
                    raise self._refuse(f"column {name!r} was copied out of the file by pyarrow instead of mapped")

    def _field(self, f: Field, col: pa.Array, n: int) -> FieldData:
        if f.text:
            return self._text_field(f, col, n)
        offsets = None
        if f.variable:
            # buffers(): [validity, offsets, ...child buffers]; offsets are int64 for large_list.
            buf = col.buffers()[1]
            offsets = np.frombuffer(buf, dtype=np.int64, count=n + 1, offset=col.offset * 8)
            col = col.values
        flat = self._flat_view(f, col)
        try:
            values = flat.reshape(-1, *f.inner_shape)
        except ValueError:
            raise CorruptShardError(
                f"shard {self.path}: column {f.name!r} holds {flat.size} values, not a multiple of its inner "
                f"shape {list(f.inner_shape)}"
            ) from None
        if offsets is not None:
            rows = len(values)
            if n and (offsets[0] < 0 or offsets[-1] > rows or np.any(np.diff(offsets) < 0)):
                raise CorruptShardError(f"shard {self.path}: offsets of column {f.name!r} are out of bounds")
        elif len(values) != n:
            raise CorruptShardError(f"shard {self.path}: column {f.name!r} has {len(values)} rows, expected {n}")
        return FieldData(values, offsets)

    def _text_field(self, f: Field, col: pa.Array, n: int) -> FieldData:
        """A ``large_string``/``large_binary`` column as its bytes and int64 offsets (views of the mapping).

        UTF-8 of a ``str`` field is checked as each value is decoded.
        """
        if col.null_count:
            raise CorruptShardError(f"shard {self.path}: column {f.name!r} holds nulls; shardload never writes them")
        _, starts, data = col.buffers()
        offsets = np.frombuffer(starts, dtype=np.int64, count=n + 1, offset=col.offset * 8)
        size = 0 if data is None else data.size
        if offsets[0] != 0 or offsets[-1] > size or np.any(np.diff(offsets) < 0):
            raise CorruptShardError(f"shard {self.path}: offsets of column {f.name!r} are out of bounds")
        values = np.frombuffer(data, dtype=np.uint8, count=int(offsets[-1])) if size else np.zeros(0, np.uint8)
        return FieldData(values, offsets)

    def _flat_view(self, f: Field, col: pa.Array) -> np.ndarray:
        """The primitive values under ``col`` (fixed-size lists, type checked) as one flat view of the mapped file.

        Not ``flatten()``/``to_numpy()``: their first call imports pyarrow.compute and pandas
        (0.4-1.3 s, paid again by every DataLoader worker).
        """
        start, count = col.offset, len(col)
        while pa.types.is_fixed_size_list(col.type):
            size = col.type.list_size
            start, count = start * size, count * size
            col = col.values  # unsliced child: element j is at physical position j + child.offset
            start += col.offset
        if col.null_count:
            raise CorruptShardError(f"shard {self.path}: column {f.name!r} holds nulls; shardload never writes them")
        dtype = np.dtype("uint8") if f.dtype == "bool" else np.dtype(f.dtype)
        data = col.buffers()[1]
        if data is None or (start + count) * dtype.itemsize > data.size:
            raise CorruptShardError(
                f"shard {self.path}: column {f.name!r} needs {count} values from position {start}, "
                f"but its data buffer is {0 if data is None else data.size} bytes"
            )
        flat = np.frombuffer(data, dtype=dtype, count=count, offset=start * dtype.itemsize)
        return flat.view(np.bool_) if f.dtype == "bool" else flat
