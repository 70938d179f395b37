"""Read a Zarr shard: offsets eagerly, values lazily, one decoded chunk at a time.

The same :class:`Columns` as the Arrow reader gives; each ``values`` array is a :class:`ZarrValues`,
which decodes only the chunks a slice touches and keeps them in the per-process :class:`ChunkCache`.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import weakref
import zipfile
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload._base.identity import IDENTITY_KEY
from shardload._base.messages import one_line
from shardload._base.setfiles import os_error
from shardload.errors import CorruptShardError, ShardSetError
from shardload.formats.base import Columns, FieldData, ShardReader
from shardload.formats.zarr._chunks import ChunkDecoder, map_read_only
from shardload.formats.zarr.bounds import (
    UNRECORDED_CHUNK_SIZE,
    BoundsError,
    check_array,
    check_chunk_members,
    check_zip,
    manifest_chunk_size,
    max_chunk_bytes,
)
from shardload.formats.zarr.cache import ChunkCache, ChunkTable, chunk_cache
from shardload.formats.zarr.compression import require_zarr
from shardload.formats.zarr.writer import LAYOUT_VERSION, nominal_chunk_rows
from shardload.schema.fields import Field, Schema

_HINT = "Run `shardload verify` on the shard set and re-run prepare for it."


class ZarrShardReader(ShardReader):
    """Opens one Zarr shard (a zip store) and exposes its fields as :class:`Columns`.

    Args:
        cache: where decoded chunks are kept; default: the process-wide
            :func:`~shardload.formats.zarr.cache.chunk_cache`.
        samples: the manifest's sample count; pass it when the shard may be untrusted (without it,
            the shard's own count sizes the offsets decoded at open).
        options: the manifest's options; ``chunk_size`` bounds a decoded chunk
            (:func:`.bounds.manifest_chunk_size`).

    The zip file is reopened after a fork, so columns taken in a parent stay usable in workers.
    """

    def __init__(
        self,
        path: Path,
        schema: Schema,
        *,
        cache: ChunkCache | None = None,
        samples: int | None = None,
        options: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(path, schema, samples=samples, options=options)
        self.cache = cache
        self._chunk_size = UNRECORDED_CHUNK_SIZE
        self._store: Any = None
        self._root: Any = None
        self._zip: zipfile.ZipFile | None = None
        self._mapped: memoryview | None = None  # the shard file, mapped read-only (chunks are slices of it)
        self._arrays: dict[str, Any] = {}
        self._decoders: dict[str, ChunkDecoder | None] = {}
        self._pid = -1
        self._identity: tuple[Hashable, ...] = ()

    def fileno(self) -> int | None:
        fp = None if self._zip is None else self._zip.fp
        return None if fp is None or fp.closed else int(fp.fileno())

    def close(self) -> None:
        super().close()
        self._arrays, self._decoders = {}, {}
        if self._store is not None and self._pid == os.getpid():
            self._store.close()
            if self._zip is not None:
                self._zip.close()
        self._store = self._zip = self._mapped = None  # a chunk still cached keeps the mapping alive

    @classmethod
    def plan_chunk_rows(cls, schema: Schema, options: Mapping[str, object]) -> int | None:
        """Value rows per chunk of the length field (its first variable field when the schema names none)."""
        name = schema.length_field
        if name is None:
            name = next((f.name for f in schema.variable_fields if not f.text), None)
        if name is None:
            return None
        return nominal_chunk_rows(schema.field(name), manifest_chunk_size(options, {}))

    # -- opening ------------------------------------------------------------------------------------
    def _open(self) -> Columns:
        require_zarr()
        try:
            st = self.path.stat()
        except FileNotFoundError:
            raise CorruptShardError(f"shard {self.path} is missing. {_HINT}") from None
        # Cached chunks are keyed by the file's identity, so a rewritten file never meets stale chunks.
        self._identity = (str(self.path), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        group = self._group()
        meta = group.attrs.get("shardload")
        if not isinstance(meta, dict) or not isinstance(meta.get("num_samples"), int) or meta["num_samples"] < 0:
            raise CorruptShardError(f"shard {self.path} has no valid 'shardload' attribute in its root group. {_HINT}")
        if meta.get("layout_version") != LAYOUT_VERSION:
            raise CorruptShardError(
                f"shard {self.path} has zarr layout version {meta.get('layout_version')!r}; this shardload reads "
                f"version {LAYOUT_VERSION}. Upgrade shardload, or re-run prepare."
            )
        n = meta["num_samples"]
        if self.samples is not None and n > self.samples:
            # Checked before the offsets (8 bytes per sample) are decoded; fewer samples than the
            # manifest says is bounded, and left to the callers' count checks (verify's wrong_count).
            raise CorruptShardError(f"shard {self.path} holds {n} samples, the manifest says {self.samples}. {_HINT}")
        self._chunk_size = manifest_chunk_size(self.options, meta)
        self.stored_identity = meta.get(IDENTITY_KEY)
        fields = {f.name: self._field(f, n) for f in self.schema.fields}
        return Columns(num_samples=n, fields=fields)

    def _group(self) -> Any:
        """The root group, (re)opened in this process."""
        zarr = require_zarr()
        if self._store is not None and self._pid == os.getpid():
            return self._root
        # A zip file handle inherited through fork shares its offset with the parent: open our own.
        self._store, self._zip, self._arrays, self._decoders, self._pid = None, None, {}, {}, os.getpid()
        self._mapped = None
        zf: zipfile.ZipFile | None = None
        store: Any = None
        try:
            # The zip's directory is checked before zarr reads any member through its own handle.
            zf = zipfile.ZipFile(self.path, "r")
            self._check_zip(zf)
            store = zarr.storage.ZipStore(self.path, mode="r")
            self._root = zarr.open_group(store, mode="r", zarr_format=3)
        except BaseException as exc:
            for handle in (store, zf):  # a refused shard keeps no file open
                # zarr's ZipStore whose zip never opened (out of descriptors) fails to close: it holds nothing
                with contextlib.suppress(AttributeError):
                    if handle is not None:
                        handle.close()
            if isinstance(exc, FileNotFoundError):
                raise CorruptShardError(f"shard {self.path} is missing. {_HINT}") from None
            if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
                raise os_error(exc, self.path, what="a shard", error=ShardSetError) from None
            if isinstance(exc, CorruptShardError) or not isinstance(exc, Exception):
                raise
            # zipfile, JSON and zarr metadata errors alike mean damage
            raise CorruptShardError(
                f"shard {self.path} cannot be opened as a zipped Zarr group ({one_line(exc)}); it is truncated "
                f"or corrupt. {_HINT}"
            ) from None
        self._zip = zf
        self._store = store
        self._mapped = map_read_only(self.path, zf.fp.fileno()) if zf.fp is not None else None
        return self._root

    def array(self, key: str) -> Any:
        """The zarr array ``key`` (``"<field>/values"`` or ``"<field>/offsets"``) of this shard."""
        root = self._group()
        arr = self._arrays.get(key)
        if arr is None:
            try:
                arr = root[key]
            except KeyError:
                raise CorruptShardError(f"shard {self.path} has no array {key!r}. {_HINT}") from None
            except Exception as exc:  # noqa: BLE001
                raise CorruptShardError(
                    f"shard {self.path}: array {key!r} is unreadable ({one_line(exc)}). {_HINT}"
                ) from None
            self._arrays[key] = arr
        return arr

    def stored_raw(self, key: str) -> bool:
        """Whether array ``key``'s chunks are stored uncompressed (then a chunk is a slice of the mapping)."""
        try:
            codecs = self.array(key).metadata.to_dict()["codecs"]
            return [c["name"] for c in codecs] == ["bytes"]
        except (KeyError, TypeError, AttributeError):
            return False

    # -- bounds: what the shard declares, checked before it is decoded (see bounds.py) -------------------
    def _refuse(self, problem: str) -> CorruptShardError:
        return CorruptShardError(
            f"shard {self.path}: {problem}. Such a shard is not one `shardload prepare` writes (it is damaged, or "
            f"was made another way) and is refused before it is decoded. {_HINT}"
        )

    def _check_zip(self, zf: zipfile.ZipFile) -> None:
        try:
            check_zip(zf, os.fstat(zf.fp.fileno()).st_size if zf.fp is not None else 0)
        except BoundsError as exc:
            raise self._refuse(str(exc)) from None

    def _check_array(self, key: str, arr: Any, rows: int | None, bound: int) -> None:
        """``arr``'s codecs, chunks and chunk members against the format; ``rows``: its expected length."""
        zf = self._zip
        try:
            shape, chunks = tuple(int(d) for d in arr.shape), tuple(int(c) for c in arr.chunks)
            if rows is not None and shape[0] != rows:
                raise BoundsError(f"array {key!r} has {shape[0]} rows, expected {rows}")
            check_array(
                arr.metadata.to_dict(),
                key=key,
                shape=shape,
                chunks=chunks,
                itemsize=np.dtype(arr.dtype).itemsize,
                bound=bound,
            )
            if zf is not None and 0 not in shape[1:]:  # an axis of length 0 has no chunks at all
                check_chunk_members(zf, f"{arr.path}/c/", "/0" * (len(shape) - 1), shape[0], chunks[0])
        except BoundsError as exc:
            raise self._refuse(str(exc)) from None
        except Exception as exc:  # noqa: BLE001  metadata zarr parsed but cannot describe: damage too
            raise self._refuse(f"array {key!r} has unusable metadata ({one_line(exc)})") from None

    def _field(self, f: Field, n: int) -> FieldData:
        key = f"{f.name}/values"
        arr = self.array(key)
        dtype = np.dtype(f.dtype)
        if not hasattr(arr, "chunks") or arr.dtype != dtype or tuple(arr.shape[1:]) != f.inner_shape:
            raise CorruptShardError(
                f"shard {self.path}: array {key!r} is {getattr(arr, 'dtype', '?')} {list(getattr(arr, 'shape', []))}, "
                f"the manifest says {dtype} {['rows', *f.inner_shape]}. {_HINT}"
            )
        row_bytes = math.prod(max(1, d) for d in f.inner_shape) * dtype.itemsize
        self._check_array(key, arr, None if f.variable else n, max_chunk_bytes(self._chunk_size, row_bytes))
        values = ZarrValues(self, key, tuple(arr.shape), dtype, int(arr.chunks[0]))
        if not f.variable:
            if len(values) != n:
                raise CorruptShardError(
                    f"shard {self.path}: array {key!r} has {len(values)} rows, expected {n}. {_HINT}"
                )
            return FieldData(values, None)  # type: ignore[arg-type]  # a lazy array, sliced like an ndarray
        okey = f"{f.name}/offsets"
        oarr = self.array(okey)
        if not hasattr(oarr, "chunks") or oarr.dtype != np.int64 or tuple(oarr.shape) != (n + 1,):
            raise CorruptShardError(
                f"shard {self.path}: array {okey!r} is {getattr(oarr, 'dtype', '?')} "
                f"{list(getattr(oarr, 'shape', []))}, expected int64 [{n + 1}]. {_HINT}"
            )
        self._check_array(okey, oarr, n + 1, (n + 1) * 8)
        if tuple(oarr.chunks) != (n + 1,):
            raise self._refuse(f"array {okey!r} has chunks {list(oarr.chunks)}; the format stores offsets in one chunk")
        offsets = self.read(okey, slice(0, n + 1), chunk=0)
        if offsets.dtype != np.int64 or offsets.shape != (n + 1,):
            raise CorruptShardError(
                f"shard {self.path}: array {okey!r} is {offsets.dtype} {list(offsets.shape)}, expected int64 [{n + 1}]. "
                f"{_HINT}"
            )
        if offsets[0] != 0 or offsets[-1] != len(values) or np.any(np.diff(offsets) < 0):
            raise CorruptShardError(f"shard {self.path}: offsets of {f.name!r} are out of bounds. {_HINT}")
        offsets.flags.writeable = False
        return FieldData(values, offsets)  # type: ignore[arg-type]

    def check_data(self) -> None:
        """Decode every chunk of every ``values`` array once (bypassing the cache), for ``shardload verify``."""
        cols = self.columns()
        for f in self.schema.fields:
            values = cols.fields[f.name].values
            if isinstance(values, ZarrValues):
                for c in range(values.num_chunks):
                    values.decode_chunk(c)

    def read(self, key: str, rows: slice, *, chunk: int) -> np.ndarray:
        """Decode ``rows`` (``slice(None)`` or within chunk ``chunk``) of array ``key``; else CorruptShardError."""
        arr = self.array(key)
        if key not in self._decoders:
            self._decoders[key] = ChunkDecoder.for_array(arr)
        decoder = self._decoders[key]
        try:
            if decoder is not None and self._zip is not None and rows != slice(None):
                start, stop, _ = rows.indices(arr.shape[0])
                return decoder.decode(self._zip, chunk, self._mapped)[: stop - start]
            return np.asarray(arr[rows])
        except Exception as exc:  # noqa: BLE001  a bad CRC, a broken zstd frame, a short read: all damage
            raise CorruptShardError(
                f"shard {self.path}: chunk {chunk} of array {key!r} cannot be decoded ({one_line(exc)}); the file "
                f"is damaged. {_HINT}"
            ) from None


class ZarrValues:
    """The ``values`` of one field of a Zarr shard, ``(rows, *inner)``, decoded chunk by chunk on demand.

    Supports the indexing the loader uses on an ndarray (an integer, a slice or an integer array
    along the first axis, then any further indices) and ``numpy.asarray``. A slice within one chunk
    is a read-only view of the cached chunk; anything wider is a new array.
    """

    def __init__(
        self, reader: ZarrShardReader, key: str, shape: tuple[int, ...], dtype: np.dtype[Any], chunk_rows: int
    ):
        self.reader = reader
        self.key = key
        self.shape = shape
        self.dtype = dtype
        self.chunk_rows = max(1, chunk_rows)
        self._keyed: tuple[ChunkCache, int, ChunkTable] | None = None  # see _cache()

    # -- the ndarray-like surface ------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        """Uncompressed bytes (what the array takes once decoded)."""
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"ZarrValues({self.reader.path.name}:{self.key}, shape={self.shape}, dtype={self.dtype})"

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self._rows(0, len(self))
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, tuple):
            if not key:
                return self._rows(0, len(self))
            head, rest = key[0], key[1:]
            first = self[head]
            return first[rest] if _is_int(head) else first[(slice(None), *rest)]
        if key is Ellipsis:
            return self._rows(0, len(self))
        if _is_int(key):
            i = int(key)
            n = len(self)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for {self.key} with {n} rows")
            i %= n
            c = i // self.chunk_rows
            return self._chunk(c)[i - c * self.chunk_rows]
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                return self._rows(start, max(start, stop))
            span = range(start, stop, step)
            if not span:
                return self._rows(0, 0)
            lo, hi = min(span[0], span[-1]), max(span[0], span[-1]) + 1
            return self._rows(lo, hi)[span[0] - lo :: step]
        return self._take(np.asarray(key))

    # -- decoding ---------------------------------------------------------------------------------
    @property
    def num_chunks(self) -> int:
        """Chunks stored for this array (none when an inner axis has length 0)."""
        if not len(self) or 0 in self.shape[1:]:
            return 0
        return -(-len(self) // self.chunk_rows)

    def decode_chunk(self, c: int) -> np.ndarray:
        """Rows of chunk ``c``, decoded now (not through the cache)."""
        start = c * self.chunk_rows
        stop = min(start + self.chunk_rows, len(self))
        if 0 in self.shape[1:]:  # nothing stored: zarr writes no chunk for an array of zero size
            return np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        return self.reader.read(self.key, slice(start, stop), chunk=c)

    def _cache(self) -> tuple[ChunkCache, int, ChunkTable]:
        """The cache of this array's chunks, the key of its chunk 0 there (chunk ``c`` is key + ``c``), its table.

        The table is held while this object lives, not until its shard is closed (a batch may still
        read a shard closed to open another). Chunks stored raw (slices of the shard's mapping) leave
        the cache with the table, so a closed shard's file is not kept mapped by them.
        """
        reader = self.reader
        cache = reader.cache if reader.cache is not None else chunk_cache()
        if self._keyed is None or self._keyed[0] is not cache:
            base, table = cache.table((reader._identity, self.key), self.num_chunks)
            weakref.finalize(self, cache.release, base, drop=reader.stored_raw(self.key))
            self._keyed = (cache, base, table)
        return self._keyed

    def _chunk(self, c: int) -> np.ndarray:
        cache, base, _ = self._cache()
        return cache.get(base + c, lambda: self.decode_chunk(c))

    def slice_sources(
        self, starts: NDArray[np.int64], stops: NDArray[np.int64]
    ) -> tuple[list[np.ndarray], list[int], list[int]]:
        """``(sources, los, his)``: rows ``starts[i]:stops[i]`` are ``sources[i][los[i]:his[i]]``, for a batch.

        A slice within one chunk (nearly every sample) points into that cached chunk, found in the
        array's :class:`ChunkTable` (only a missing chunk goes through the cache's lock); a slice
        across chunks is its own joined array. See :func:`shardload.load.collate.copy_slices`.
        """
        cr = self.chunk_rows
        first = starts // cr
        los = (starts - first * cr).tolist()
        his = (stops - first * cr).tolist()
        odd = (first != (stops - 1) // cr) | (stops <= starts)  # across chunks, or empty: rare
        across = np.flatnonzero(odd).tolist()
        if len(across) == len(los):
            sources: list[Any] = [None] * len(los)
        else:
            if across:
                first = np.where(odd, first[~odd][0], first)  # a chunk an inside sample reads, replaced below
            cache, _, table = self._cache()
            table.used[first] = 1
            firsts = first.tolist()
            slots = table.slots
            sources = [slots[c] for c in firsts]
            missing = [i for i, chunk in enumerate(sources) if chunk is None]
            loaded: dict[int, np.ndarray] = {}
            for i in missing:
                c = firsts[i]
                if c not in loaded:
                    loaded[c] = self._chunk(c)
                sources[i] = loaded[c]
            cache.hits += len(set(firsts)) - len(loaded)
        for i in across:
            part = self._rows(int(starts[i]), int(stops[i]))
            sources[i], los[i], his[i] = part, 0, len(part)
        return sources, los, his

    def _rows(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.empty((0, *self.shape[1:]), dtype=self.dtype)
        cr = self.chunk_rows
        first, last = start // cr, (stop - 1) // cr
        if first == last:
            return self._chunk(first)[start - first * cr : stop - first * cr]
        parts = [self._chunk(c)[max(start - c * cr, 0) : stop - c * cr] for c in range(first, last + 1)]
        return np.concatenate(parts)

    def _take(self, idx: np.ndarray) -> np.ndarray:
        if idx.dtype == np.bool_:
            if idx.shape != (len(self),):
                raise IndexError(f"boolean index of shape {idx.shape} does not match {self.key} with {len(self)} rows")
            idx = np.flatnonzero(idx)
        if idx.dtype.kind not in "iu":
            raise IndexError(f"{self.key} is indexed by integers, slices or integer arrays, not {idx.dtype}")
        flat = idx.reshape(-1).astype(np.int64)
        n = len(self)
        if flat.size and (flat.min() < -n or flat.max() >= n):
            raise IndexError(f"an index is out of bounds for {self.key} with {n} rows")
        flat = np.where(flat < 0, flat + n, flat)
        out = np.empty((len(flat), *self.shape[1:]), dtype=self.dtype)
        which = flat // self.chunk_rows
        for c in np.unique(which).tolist():
            sel = which == c
            out[sel] = self._chunk(c)[flat[sel] - c * self.chunk_rows]
        return out.reshape(*idx.shape, *self.shape[1:])


def _is_int(key: Any) -> bool:
    return isinstance(key, (int, np.integer)) and not isinstance(key, bool)
