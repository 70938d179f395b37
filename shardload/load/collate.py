"""Turn the samples of one planned batch into padded numpy arrays (contract: docs/loading.md, "The batch contract").

It first works out every output's shape (a :data:`Layout`), then asks an :data:`Allocate` callable for the
arrays (separate numpy arrays, or views of one shared-memory :class:`~shardload.load.dataset.BatchArena` in a
DataLoader worker) and copies each sample once, as a slice, straight into its row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise, repeat
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from shardload.errors import PlanError
from shardload.formats import Columns
from shardload.formats.base import ChunkedValues
from shardload.plan.options import padded_length
from shardload.schema.cast import CastError, cast_exact
from shardload.schema.fields import SAMPLE_ID_KEY, WEIGHT_KEY, Schema, lengths_key
from shardload.schema.text import decode_text

#: ``(name, shape, dtype, zeroed)`` of each output array, in output order; ``zeroed``: it must start as zeros.
Layout = list[tuple[str, tuple[int, ...], np.dtype, bool]]
#: Makes writable arrays for a layout, keyed by name: zeros where asked, otherwise uninitialised.
Allocate = Callable[[Layout], dict[str, np.ndarray]]


PadValue = int | float | bool


@dataclass(frozen=True)
class PadSpec:
    """How to pad variable fields.

    Construction checks what it can without the shard set; :meth:`for_schema` checks the rest against the
    set's schema. Both raise :class:`~shardload.errors.PlanError`.

    Attributes:
        pad_values: pad value per field name (default 0 for every field).
        pad_to_multiple_of: round ``L_pad`` up to a multiple of this.
        fields: load only these fields (default: all).
    """

    pad_values: Mapping[str, PadValue] = field(default_factory=dict)
    pad_to_multiple_of: int = 1
    fields: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        from shardload._base.checks import check_scalar
        from shardload.plan.options import MAX_PAD_MULTIPLE

        if not isinstance(self.pad_values, Mapping):
            raise PlanError(
                f"pad_values must be a mapping of field name to pad value, e.g. {{'tokens': -1}}; "
                f"got {type(self.pad_values).__name__}"
            )
        for name, value in self.pad_values.items():
            if not isinstance(name, str):
                raise PlanError(f"pad_values: keys must be field names (str), got {name!r}")
            if not isinstance(value, (int, float, np.integer, np.floating, np.bool_)):
                raise PlanError(
                    f"pad_values[{name!r}] = {value!r}: a pad value must be a number, not {type(value).__name__}"
                )
        object.__setattr__(self, "pad_values", dict(self.pad_values))
        check_scalar("pad_to_multiple_of", self.pad_to_multiple_of, low=1, high=MAX_PAD_MULTIPLE)
        object.__setattr__(self, "fields", check_fields(self.fields))

    def for_schema(self, schema: Schema, where: str = "the shard set") -> PadSpec:
        """This spec checked against ``schema``, with each pad value converted to its field's dtype.

        Raises:
            PlanError: a loaded field is not in the schema; a pad value names a
                field that is not loaded or has no variable axis (it would
                never be used), or does not fit the field's dtype (0.5 or NaN
                on an integer field, 1e10 on int32, -1 on an unsigned field,
                1e5 on float16).
        """
        names = schema.names
        if self.fields is not None:
            unknown = [f for f in self.fields if f not in names]
            if unknown:
                raise PlanError(f"fields {unknown} are not in {where} (its fields: {', '.join(names)})")
        loaded = self.fields if self.fields is not None else names
        fitted: dict[str, PadValue] = {}
        for name, value in self.pad_values.items():
            if name not in names:
                raise PlanError(
                    f"pad_values names {name!r}, which is not a field of {where} (its fields: "
                    f"{', '.join(names)}); check the spelling"
                )
            f = schema.field(name)
            if f.text:
                raise PlanError(
                    f"pad_values[{name!r}]: field {name!r} is a text field ({f.dtype}); batches hold it as a list, "
                    "never padded: remove it from pad_values"
                )
            if not f.variable:
                raise PlanError(
                    f"pad_values[{name!r}]: field {name!r} has a fixed shape {list(f.shape)} and is never padded; "
                    "remove it from pad_values"
                )
            if name not in loaded:
                raise PlanError(
                    f"pad_values[{name!r}]: field {name!r} is not among the loaded fields {list(loaded)}; "
                    "add it to fields or remove it from pad_values"
                )
            try:
                fitted[name] = fit_pad_value(name, value, np.dtype(f.dtype))
            except PlanError as exc:
                raise PlanError(f"{exc} (the field of {where})") from None
        return PadSpec(fitted, self.pad_to_multiple_of, self.fields)


def check_fields(fields: object) -> tuple[str, ...] | None:
    """``fields`` as a tuple of distinct names (or None), else :class:`PlanError`."""
    if fields is None:
        return None
    if isinstance(fields, (str, bytes)):
        raise PlanError(
            f"fields must be a sequence of field names, got the string {fields!r}: write fields=({fields!r},)"
        )
    if not isinstance(fields, Iterable):
        raise PlanError(f"fields must be a sequence of field names, got {type(fields).__name__}")
    names: tuple[object, ...] = tuple(fields)
    for name in names:
        if not isinstance(name, str):
            raise PlanError(f"fields: each entry must be a field name (str), got {name!r}")
    dups = sorted({str(n) for n in names if names.count(n) > 1})
    if dups:
        raise PlanError(f"fields lists {dups} more than once; each field is loaded once")
    return tuple(str(n) for n in names)


def fit_pad_value(name: str, value: object, dtype: np.dtype) -> PadValue:
    """``value`` as a Python scalar that ``dtype`` holds exactly, else :class:`PlanError` naming field and dtype.

    The rule is :func:`shardload.schema.cast.cast_exact`, the one prepare applies to data (``-1.0`` fits an
    integer field; ``16777217`` and ``1e-50`` do not fit float32; NaN and +-inf are kept as markers), except
    that a bool is refused on a number field.
    """
    where = f"pad_values[{name!r}] = {value!r} for field {name!r} of dtype {dtype}"
    if isinstance(value, (bool, np.bool_)):
        if dtype.kind != "b":  # True is 1 to Python: on a number field it is a mistake, as for every option
            raise PlanError(f"{where}: a bool pads bool fields only; give a number (e.g. 1 or 0)")
        value = int(value)
    if not isinstance(value, (int, float, np.integer, np.floating)):
        raise PlanError(f"{where}: a pad value must be a number, not {type(value).__name__}")
    # The wordings users meet most, before the general rule.
    if dtype.kind == "f":
        limit = float(np.finfo(dtype).max)
        try:
            number = float(value)
        except OverflowError:  # an int beyond float64
            number = math.inf
        if abs(number) > limit and (math.isfinite(number) or isinstance(value, (int, np.integer))):
            raise PlanError(f"{where}: out of the range of {dtype} (largest {limit:g}); it would pad with inf")
    elif isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise PlanError(f"{where}: {dtype} cannot hold NaN or inf; pick an integer pad value such as -1 or 0")
        if not float(value).is_integer():
            raise PlanError(f"{where}: {dtype} holds integers only; {value!r} would be truncated")
        value = int(value)
    if dtype.kind == "b" and int(value) not in (0, 1):
        raise PlanError(f"{where}: a bool field pads with False or True (0 or 1)")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not int(info.min) <= int(value) <= int(info.max):
            raise PlanError(f"{where}: out of the range of {dtype} [{int(info.min)}, {int(info.max)}]")
    try:
        out = cast_exact(_scalar_array(value, dtype, where), dtype)
    except CastError as err:
        raise PlanError(f"{where}: {err}") from None
    fitted: PadValue = out.item()
    return fitted


def _scalar_array(value: int | float | np.integer | np.floating, dtype: np.dtype, where: str) -> np.ndarray:
    """``value`` as a 0-d array of a dtype that holds it exactly, for :func:`cast_exact`."""
    if isinstance(value, (float, np.floating)):
        return np.array(value, dtype=np.float64 if isinstance(value, float) else value.dtype)
    number = int(value)
    for dt in (np.int64, np.uint64):
        info = np.iinfo(dt)
        if int(info.min) <= number <= int(info.max):
            return np.array(number, dtype=dt)
    # Beyond 64 bits only a float field can take it (the ranges were checked), if it holds the value exactly;
    # float64 -> a narrower float rounds by the rule, so the integer is compared with what the field stores.
    with np.errstate(over="ignore"):
        stored = np.array(float(number), dtype=dtype).item()
    if not math.isfinite(stored) or int(stored) != number:
        raise PlanError(f"{where}: values do not fit {dtype}: {number} would become {stored!r}")
    as_float = float(number)
    return np.array(as_float, dtype=np.float64)


def allocate_separately(layout: Layout) -> dict[str, np.ndarray]:
    """One ``np.zeros`` or ``np.empty`` per output (the default :data:`Allocate`)."""
    return {name: (np.zeros if zeroed else np.empty)(shape, dtype=dtype) for name, shape, dtype, zeroed in layout}


def group_by_shard(shards: NDArray[np.int64]) -> list[tuple[int, NDArray[np.int64] | None]]:
    """``(shard, positions)`` per distinct shard of a batch; ``positions`` is None when it is the only one.

    A batch usually touches one or two shards, so offsets and fixed fields are
    gathered per shard with numpy, not sample by sample.
    """
    n = len(shards)
    if n == 0:
        return []
    first = shards[0]
    if (shards == first).all():
        return [(int(first), None)]
    # one stable sort: each shard's positions come out contiguous and in batch order
    order = shards.argsort(kind="stable")
    ordered = shards[order]
    cuts = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), n]
    return [(int(ordered[a]), order[a:b]) for a, b in pairwise(cuts)]


def collate_batch(
    schema: Schema,
    columns_of: Callable[[int], Columns],
    shards: NDArray[np.int64],
    rows: NDArray[np.int64],
    sample_ids: NDArray[np.int64],
    weights: NDArray[np.float32],
    pad: PadSpec,
    allocate: Allocate = allocate_separately,
) -> dict[str, Any]:
    """Build one batch: the arrays ``allocate`` made, filled, in contract order, then a list per text field.

    ``columns_of`` maps a shard index to its (memory-mapped) columns; ``shards``, ``rows``, ``sample_ids`` and
    ``weights`` are ``(B,)``, from the plan.
    """
    b = len(sample_ids)
    groups = group_by_shard(shards)
    cols = {s: columns_of(s) for s, _ in groups}
    fields = schema.fields if pad.fields is None else [schema.field(name) for name in pad.fields]
    layout: Layout = []
    # each variable field: its bounds in the shard's values, its lengths, and whether it is padded first
    variable: dict[str, tuple[tuple[NDArray[np.int64], NDArray[np.int64]], NDArray[np.int64], bool]] = {}
    for f in fields:
        if f.text:
            continue  # a list, made after the arrays (text_lists)
        inner = f.inner_shape
        if not f.variable:
            layout.append((f.name, (b, *inner), np.dtype(f.dtype), False))
            continue
        starts, ends = sample_bounds(cols, groups, f.name, rows)
        lengths = ends - starts
        total = int(lengths.sum())
        l_pad = padded_length(int(lengths.max(initial=0)), pad.pad_to_multiple_of)
        # Where padding is most of the array (random batches of long-tailed lengths), the whole array
        # is padded first and each sample copied over it: one numpy call per sample; zero padding then
        # comes from zeroed memory, which the kernel provides without a pass over it. Otherwise
        # (bucketed batches) each row's tail is padded after its sample, so no byte is written twice.
        fill_first = b * l_pad - total > total
        variable[f.name] = (starts, ends), lengths, fill_first
        zeroed = fill_first and pad.pad_values.get(f.name, 0) == 0
        layout.append((f.name, (b, l_pad, *inner), np.dtype(f.dtype), zeroed))
        layout.append((lengths_key(f.name), (b,), np.dtype(np.int64), False))
    # the keys besides the fields: Schema.batch_keys() lists them, and no field may have one of their names
    layout += plan_layout(b)

    out = allocate(layout)
    for f in fields:
        if f.text:
            continue
        name, arr = f.name, out[f.name]
        if name not in variable:
            gather_fixed(arr, cols, groups, name, rows)
            continue
        bounds, lengths, fill_first = variable[name]
        out[lengths_key(name)][:] = lengths
        pad_value = pad.pad_values.get(name, 0)
        if fill_first and pad_value != 0:
            arr.fill(pad_value)
        flat = arr.reshape(b * arr.shape[1], *arr.shape[2:])  # a view: rows addressed by one slice each
        dst = np.arange(b, dtype=np.int64) * arr.shape[1]
        copy_slices(flat, cols, groups, name, bounds, dst, None if fill_first else dst + arr.shape[1], pad_value)
    fill_plan_keys(out, sample_ids, weights)
    if any(f.text for f in fields):
        out.update(text_lists(schema, [f.name for f in fields], cols, groups, rows))
    return out


def text_lists(
    schema: Schema,
    names: Iterable[str],
    cols: Mapping[int, Columns],
    groups: list[tuple[int, NDArray[np.int64] | None]],
    rows: NDArray[np.int64],
) -> dict[str, Any]:
    """Each loaded text field as a list of ``str``/``bytes``, one per sample in the order of ``rows``.

    The one place batches get text, for both collates (a packed batch lists
    its documents in the order of its rows).
    """
    out: dict[str, Any] = {}
    for f in (schema.field(n) for n in names):
        if not f.text:
            continue
        starts, ends = sample_bounds(cols, groups, f.name, rows)
        shard_of = np.zeros(len(rows), dtype=np.int64)
        for s, pos in groups:
            shard_of[slice(None) if pos is None else pos] = s
        out[f.name] = [
            decode_text(f, cols[s].fields[f.name].values[lo:hi], f"shard {s}, row {int(r)}")
            for s, lo, hi, r in zip(shard_of.tolist(), starts.tolist(), ends.tolist(), rows)
        ]
    return out


def plan_layout(b: int) -> Layout:
    """The layout of the per-sample keys taken from the plan (``sample_id``, ``weight``), last in every batch."""
    return [(SAMPLE_ID_KEY, (b,), np.dtype(np.int64), False), (WEIGHT_KEY, (b,), np.dtype(np.float32), False)]


def fill_plan_keys(out: dict[str, np.ndarray], sample_ids: NDArray[np.int64], weights: NDArray[np.float32]) -> None:
    """Write the keys of :func:`plan_layout`."""
    out[SAMPLE_ID_KEY][:] = sample_ids
    out[WEIGHT_KEY][:] = weights


def gather_fixed(
    arr: np.ndarray,
    cols: Mapping[int, Columns],
    groups: list[tuple[int, NDArray[np.int64] | None]],
    name: str,
    rows: NDArray[np.int64],
) -> None:
    """Fill ``arr`` (``[B, *shape]``) with fixed field ``name`` of each sample, one indexing per shard."""
    for s, pos in groups:
        values = cols[s].fields[name].values
        if pos is None:
            arr[:] = values[rows]  # values may be lazy (Zarr): index it, never np.take it
        else:
            arr[pos] = values[rows[pos]]


def sample_bounds(
    cols: Mapping[int, Columns],
    groups: list[tuple[int, NDArray[np.int64] | None]],
    name: str,
    rows: NDArray[np.int64],
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Start and end offset of each sample's values in its shard's values buffer."""
    if len(groups) == 1 and groups[0][1] is None:
        offsets = cols[groups[0][0]].fields[name].offsets
        assert offsets is not None
        return offsets[rows], offsets[rows + 1]
    starts = np.empty(len(rows), dtype=np.int64)
    ends = np.empty(len(rows), dtype=np.int64)
    for s, pos in groups:
        offsets = cols[s].fields[name].offsets
        assert offsets is not None and pos is not None
        r = rows[pos]
        starts[pos] = offsets[r]
        ends[pos] = offsets[r + 1]
    return starts, ends


def copy_slices(
    flat: np.ndarray,
    cols: Mapping[int, Columns],
    groups: list[tuple[int, NDArray[np.int64] | None]],
    name: str,
    src: tuple[NDArray[np.int64], NDArray[np.int64]],
    dst: NDArray[np.int64],
    pad_to: NDArray[np.int64] | None = None,
    pad_value: float = 0,
) -> None:
    """Copy each sample's values into its place of ``flat``, then pad after it up to ``pad_to`` (if given).

    The one copy loop of both collates: sample ``i`` (``groups``: :func:`group_by_shard`) holds
    ``values[src[0][i]:src[1][i]]`` of field ``name``; it goes to ``flat[dst[i]:dst[i] + n]`` (``flat``: the
    output with its row and length axes merged), one slice copy per sample, and ``flat[dst[i] + n:pad_to[i]]``
    is set to ``pad_value``. ``src``, ``dst`` and ``pad_to`` are ``(B,)``.
    """
    for s, pos in groups:
        values = cols[s].fields[name].values
        sel: slice | NDArray[np.int64] = slice(None) if pos is None else pos
        sources: Iterable[np.ndarray]
        if isinstance(values, np.ndarray):  # one buffer (Arrow)
            sources, los, his = repeat(values), src[0][sel].tolist(), src[1][sel].tolist()
        else:  # chunked values (Zarr): each chunk the group touches looked up once
            sources, los, his = cast(ChunkedValues, values).slice_sources(src[0][sel], src[1][sel])
        dsts = dst[sel].tolist()
        if pad_to is None:
            for values, st, en, lo in zip(sources, los, his, dsts):
                flat[lo : lo + en - st] = values[st:en]
            continue
        for values, st, en, lo, end in zip(sources, los, his, dsts, pad_to[sel].tolist()):
            hi = lo + en - st
            flat[lo:hi] = values[st:en]
            if hi < end:
                flat[hi:end] = pad_value
