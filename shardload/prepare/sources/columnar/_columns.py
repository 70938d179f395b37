"""How Arrow columns become fields: the type rules of docs/format.md, "Parquet and Arrow", checked once
per file, and the values of each record batch, converted with a few vectorised numpy calls (flat values +
offsets).

A row is then a slice (a view) of those arrays, never a Python object per
value: :func:`batch_samples` gives one sample at a time, :func:`column_batches`
whole columns for the columnar ingest path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from shardload.errors import InputError
from shardload.formats.arrow.arrays import numpy_of
from shardload.formats.base import Columns, FieldData
from shardload.prepare.sources.base import Sample, SampleBatch

RowOf = Callable[[int], int]  # element index at some nesting level -> row of the batch


# -- types: checked once per file, before any row is read ------------------------------------------
def _element_ok(t: pa.DataType) -> bool:
    """A type that converts to a dense block (primitive or fixed-size list of such)."""
    if pa.types.is_fixed_size_list(t):
        return _element_ok(t.value_type)
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _leaf(t: pa.DataType) -> pa.DataType:
    while _is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_dictionary(t):
        t = t.value_type
    return t


def _is_text(t: pa.DataType) -> bool:
    """A column type whose values become a text field (``str`` or ``bytes``: ``to_pylist`` gives them)."""
    return bool(
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        # view types exist from pyarrow 16 on
        or getattr(pa.types, "is_string_view", lambda _: False)(t)
        or getattr(pa.types, "is_binary_view", lambda _: False)(t)
    )


def check_column_type(path: str, name: str, t: pa.DataType) -> None:
    """Raise if column ``name`` of type ``t`` cannot become a numeric or text field."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    ok = (
        _is_text(t)
        or _element_ok(t)
        or (
            _is_list(t)
            and (_element_ok(t.value_type) or (_is_list(t.value_type) and _element_ok(t.value_type.value_type)))
        )
    )
    if ok:
        return
    leaf = _leaf(t)
    if _is_text(leaf):
        raise InputError(
            f"{path}: column {name!r} ({t}) holds lists of text, which is not numeric, and a text field is one "
            f"string per row. Drop the column (--drop-fields {name}, or pyarrow: "
            f"table.drop_columns([{name!r}])), or join each row's strings into one."
        )
    if pa.types.is_null(leaf):
        raise InputError(f"{path}: column {name!r} ({t}) holds only nulls; drop the column or fill in values")
    if _leaf(t) is not t and (_element_ok(leaf)):
        raise InputError(
            f"{path}: column {name!r} has type {t}: lists may nest at most two deep "
            "(list<list<T>> -> T[rows, C]); flatten the inner levels or use fixed_size_list"
        )
    raise InputError(
        f"{path}: column {name!r} has type {t}, which is not supported; "
        "cast it to an integer or float type (or lists of them), or drop it"
    )


def check_schema(path: str, schema: pa.Schema) -> None:
    if len(schema) == 0:
        raise InputError(f"{path}: the table has no columns")
    seen = set()
    for f in schema:
        if f.name in seen:
            raise InputError(f"{path}: column {f.name!r} appears twice; rename one of them")
        seen.add(f.name)
        check_column_type(path, f.name, f.type)


# -- values: vectorised, once per record batch ------------------------------------------------------
class _NullFound(Exception):
    def __init__(self, row: int) -> None:
        self.row = row


def _check_nulls(arr: pa.Array, row_of: RowOf) -> None:
    if arr.null_count:
        first = int(np.flatnonzero(numpy_of(arr.is_null()))[0])
        raise _NullFound(row_of(first))


def _dense(arr: pa.Array, row_of: RowOf) -> np.ndarray:
    """Primitive or fixed-size-list ``arr`` as one array of shape ``(len(arr), *inner)``."""
    _check_nulls(arr, row_of)
    t = arr.type
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        inner = _dense(arr.flatten(), lambda j: row_of(j // size) if size else 0)
        return inner.reshape(len(arr), size, *inner.shape[1:])
    return numpy_of(arr)


def _offsets(arr: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """List ``arr``'s offsets, rebased to start at 0, and its child values in that range."""
    off = np.asarray(numpy_of(arr.offsets), dtype=np.int64)
    child = arr.values.slice(int(off[0]), int(off[-1] - off[0]))
    return off - off[0], child


def _top(i: int) -> int:
    return i


def _row_of_child(offsets: np.ndarray, row_of: RowOf) -> RowOf:
    return lambda j: row_of(int(np.searchsorted(offsets, j, side="right")) - 1)


@dataclass
class _Rows:
    """The rows of one column of one batch, each a view into a few flat arrays."""

    values: np.ndarray
    # starts, ends: (num_rows,) first-axis range of each row in values, or None (fixed: row i is values[i])
    starts: np.ndarray | None = None
    ends: np.ndarray | None = None
    # widths: (num_rows,) inner width of each row (list<list<T>> only): values are split into [-1, width]
    widths: np.ndarray | None = None
    # text: the rows of a string/binary column (then values is unused)
    text: list[str] | list[bytes] | None = None

    def row(self, i: int) -> np.ndarray | str | bytes:
        if self.text is not None:
            return self.text[i]
        if self.starts is None or self.ends is None:
            return self.values[i, ...]
        part = self.values[self.starts[i] : self.ends[i]]
        if self.widths is None:
            return part
        w = int(self.widths[i])
        rows = part.shape[0] // w if w else 0
        return part.reshape(rows, w, *part.shape[1:])


#: the column's arrays of the file's batches before a unit, last first (for the inner width of empty rows)
EarlierArrays = Callable[[str], Iterator[pa.Array]]


class _ColumnConverter:
    """Converts one column, batch after batch (it remembers the last inner width for empty rows; a unit
    that does not start the file looks it up in ``earlier``, as a whole-file read would have it)."""

    def __init__(self, path: str, name: str, earlier: EarlierArrays | None = None) -> None:
        self.path, self.name = path, name
        self.last_width: int | None = 0 if earlier is None else None
        self.earlier = earlier

    def _width_before(self) -> int:
        if self.last_width is None:
            assert self.earlier is not None
            self.last_width = _last_width(self.earlier(self.name))
        return self.last_width

    def __call__(self, arr: pa.Array, first_row: int) -> _Rows:
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        try:
            return self._convert(arr, first_row)
        except _NullFound as null:
            raise InputError(
                f"{self.path}: row {first_row + null.row}: column {self.name!r} holds a null; "
                "fill in the value or drop the row before prepare"
            ) from None

    def _convert(self, arr: pa.Array, first_row: int) -> _Rows:
        if _is_text(arr.type):
            _check_nulls(arr, _top)
            return _Rows(np.zeros(0), text=arr.to_pylist())  # one str/bytes per row, as the field holds them
        if not _is_list(arr.type):
            return _Rows(_dense(arr, _top))
        _check_nulls(arr, _top)
        off, child = _offsets(arr)
        if not _is_list(child.type):
            return _Rows(_dense(child, _row_of_child(off, _top)), off[:-1], off[1:])
        # list<list<T>>: each row is [rows, width]; its inner lists must be equally long
        _check_nulls(child, _row_of_child(off, _top))
        inner_off, values = _offsets(child)
        dense = _dense(values, _row_of_child(inner_off, _row_of_child(off, _top)))
        widths = np.diff(inner_off)  # (num_inner_lists,)
        n = len(arr)
        differs = widths[1:] != widths[:-1]
        if differs.any():
            row_start = np.zeros(len(widths) + 1, dtype=bool)
            row_start[off[:-1]] = True
            bad = np.flatnonzero(differs & ~row_start[1:-1])
            if len(bad):
                k = int(bad[0])
                row = int(np.searchsorted(off, k + 1, side="right")) - 1
                raise InputError(
                    f"{self.path}: row {first_row + row}: column {self.name!r} holds inner lists of lengths "
                    f"{widths[k]} and {widths[k + 1]}; the inner lists of one row must be equally long "
                    "(they become the rows of a [rows, C] array). Pad them, or use fixed_size_list."
                )
        nonempty = off[1:] > off[:-1]
        row_width = np.zeros(n, dtype=np.int64)
        row_width[nonempty] = widths[off[:-1][nonempty]]
        # empty rows take the width of the previous non-empty row (of this batch, else of the file)
        last = np.maximum.accumulate(np.where(nonempty, np.arange(n), -1)) if n else np.zeros(0, np.int64)
        before = self._width_before() if n and last[0] < 0 else 0
        row_width = np.where(last >= 0, row_width[np.maximum(last, 0)], before)
        if n and nonempty.any():
            self.last_width = int(row_width[-1])
        return _Rows(dense, inner_off[off[:-1]], inner_off[off[1:]], row_width)


def _last_width(arrays: Iterator[pa.Array]) -> int:
    """The inner width of the last non-empty row of a ``list<list<T>>`` column's ``arrays`` (last first); 0 if none."""
    for arr in arrays:
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        off, child = _offsets(arr)
        nonempty = np.flatnonzero(off[1:] > off[:-1])
        if len(nonempty):
            inner_off, _ = _offsets(child)
            k = int(off[nonempty[-1]])
            return int(inner_off[k + 1] - inner_off[k])
    return 0


def batch_samples(
    batches: Iterator[pa.RecordBatch],
    path: str,
    schema: pa.Schema,
    first: int = 0,
    earlier: EarlierArrays | None = None,
) -> Iterator[tuple[str, Sample]]:
    """Yield ``(locator, sample)`` for every row of ``batches``, numbering rows from ``first``."""
    names = schema.names
    check_schema(path, schema)
    converters = [_ColumnConverter(path, n, earlier) for n in names]
    for batch in batches:
        cols = [conv(batch.column(n), first) for n, conv in zip(names, converters)]
        for i in range(batch.num_rows):
            yield f"{path}: row {first + i}", {name: col.row(i) for name, col in zip(names, cols)}
        first += batch.num_rows


def _columnar(t: pa.DataType) -> bool:
    """A column type whose batches go whole through the columnar ingest path (not text, list of lists, dictionary)."""
    return _element_ok(t) or (_is_list(t) and _element_ok(t.value_type))


def column_batches(
    batches: Iterator[pa.RecordBatch],
    path: str,
    schema: pa.Schema,
    first: int = 0,
    earlier: EarlierArrays | None = None,
) -> Iterator[SampleBatch]:
    """The rows of ``batches`` as :class:`SampleBatch` runs, one per record batch, numbering rows from ``first``.

    A table with a column that :func:`_columnar` refuses is one run read row by row.
    """
    check_schema(path, schema)
    if not all(_columnar(t) for t in schema.types):
        yield SampleBatch(None, lambda: batch_samples(batches, path, schema, first, earlier))
        return
    converters = [_ColumnConverter(path, n) for n in schema.names]
    for batch in batches:
        fields = {}
        for j, conv in enumerate(converters):
            rows = conv(batch.column(j), first)
            offsets = None
            if rows.starts is not None and rows.ends is not None:
                offsets = np.append(rows.starts, rows.ends[-1:]) if batch.num_rows else np.zeros(1, np.int64)
            fields[schema.names[j]] = FieldData(rows.values, offsets)
        yield SampleBatch(
            Columns(batch.num_rows, fields),
            lambda batch=batch, first=first: batch_samples(iter([batch]), path, schema, first),  # type: ignore[misc]
            (path, "row", np.arange(first, first + batch.num_rows, dtype=np.int64)),
        )
        first += batch.num_rows
