"""Schema of a shard set: the named fields of a sample, their dtypes and shapes.

A sample is a ``dict[str, numpy.ndarray | str | bytes]``; each field is
variable (first axis varies, ``shape[0] is None``), fixed, or text (one ``str``
or ``bytes`` per sample, stored as its bytes, never padded): docs/format.md,
"Samples and fields". The schema is taken from the first sample and every later
sample is checked against it, so bad input fails on the sample that is wrong, by name.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardload._base.messages import one_line
from shardload.errors import InputError
from shardload.schema._nonarray import FIELD_HOLDS, describe_object_array, describe_ragged
from shardload.schema.text import TEXT_DTYPES, TEXT_STORAGE, text_kind, text_to_array

__all__ = [
    "CU_SEQLENS_KEY",
    "DOCUMENT_IDS_KEY",
    "LENGTHS_SUFFIX",
    "MAX_DIMS",
    "MAX_NAME_BYTES",
    "MAX_ROW_ELEMENTS",
    "MAX_SEQLEN_KEY",
    "POSITION_IDS_KEY",
    "SAMPLE_ID_KEY",
    "SAMPLE_START_KEY",
    "SUPPORTED_DTYPES",
    "WEIGHT_KEY",
    "Field",
    "Schema",
    "as_array",
    "dtype_name",
    "lengths_key",
    "name_problem",
    "parse_dtype_overrides",
    "prepare_problems",
    "schema_problems",
]

#: numeric dtypes a field may have; besides them only :data:`TEXT_DTYPES` (object, complex ... are refused).
SUPPORTED_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)

#: bounds on a field's per-sample shape: dimensions, and elements of one row
MAX_DIMS = 8
MAX_ROW_ELEMENTS = 1 << 31
#: longest field name (UTF-8 bytes) prepare accepts: names become file names (``lengths.<name>.npy``,
#: Zarr groups), which most file systems cap at 255 bytes
MAX_NAME_BYTES = 200

#: keys the loader adds to every batch next to the fields (see :mod:`shardload.load.collate`)
SAMPLE_ID_KEY = "sample_id"
WEIGHT_KEY = "weight"
LENGTHS_SUFFIX = "_lengths"
#: keys a packed batch adds besides those (see :mod:`shardload.load.collate_packed`)
POSITION_IDS_KEY = "position_ids"
DOCUMENT_IDS_KEY = "document_ids"
CU_SEQLENS_KEY = "cu_seqlens"
MAX_SEQLEN_KEY = "max_seqlen"
SAMPLE_START_KEY = "sample_start"


def lengths_key(name: str) -> str:
    """The batch key of variable field ``name``'s lengths (``tokens`` -> ``tokens_lengths``)."""
    return name + LENGTHS_SUFFIX


@dataclass(frozen=True)
class Field:
    """One named field of a sample.

    Attributes:
        name: the key in the sample dict.
        dtype: numpy dtype name, one of :data:`SUPPORTED_DTYPES`, or a text
            dtype of :data:`TEXT_DTYPES` (``"str"``, ``"bytes"``).
        shape: the per-sample shape; ``shape[0] is None`` for a variable field,
            ``()`` for a text field.
    """

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    @property
    def variable(self) -> bool:
        """Whether the first axis varies from sample to sample (never for a text field)."""
        return len(self.shape) > 0 and self.shape[0] is None

    @property
    def text(self) -> bool:
        """Whether the field holds one ``str`` or ``bytes`` value per sample."""
        return self.dtype in TEXT_DTYPES

    @property
    def has_offsets(self) -> bool:
        """Whether a shard stores the field as values plus per-sample offsets (variable and text fields)."""
        return self.variable or self.text

    @property
    def value_dtype(self) -> np.dtype:
        """The numpy dtype of the field's stored values (``uint8`` bytes for a text field)."""
        return TEXT_STORAGE if self.text else np.dtype(self.dtype)

    @property
    def inner_shape(self) -> tuple[int, ...]:
        """Shape after the variable axis (or the whole shape if fixed)."""
        dims = self.shape[1:] if self.variable else self.shape
        return tuple(int(d) for d in dims if d is not None)

    @property
    def row_size(self) -> int:
        """Number of scalar elements in one row (one step of the first axis)."""
        return int(np.prod(self.inner_shape, dtype=np.int64))

    def to_json(self) -> dict[str, Any]:
        """The field as stored in ``manifest.json`` (``None`` marks the variable axis)."""
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Field:
        """Rebuild a field from its :meth:`to_json` form."""
        shape = tuple(None if d is None else int(d) for d in obj["shape"])
        return cls(name=str(obj["name"]), dtype=str(obj["dtype"]), shape=shape)


@dataclass(frozen=True)
class Schema:
    """The ordered fields of a sample, plus which field's length drives batching.

    Attributes:
        fields: the fields, in the order of the first sample.
        length_field: the variable field whose first-axis length is the sample
            length in ``lengths.npy``; ``None`` means the longest variable field
            of each sample (the per-field lengths are stored too).
    """

    fields: tuple[Field, ...]
    length_field: str | None = None

    def __post_init__(self) -> None:
        if self.length_field is not None and self.length_field not in self.names:
            raise InputError(
                f"length_field {self.length_field!r} is not a field of the samples (fields: {', '.join(self.names)})"
            )

    @property
    def names(self) -> tuple[str, ...]:
        """Field names, in schema order."""
        return tuple(f.name for f in self.fields)

    @property
    def variable_fields(self) -> tuple[Field, ...]:
        """The fields whose first axis varies, in schema order."""
        return tuple(f for f in self.fields if f.variable)

    @property
    def text_fields(self) -> tuple[Field, ...]:
        """The text (``str``/``bytes``) fields, in schema order."""
        return tuple(f for f in self.fields if f.text)

    @property
    def has_text(self) -> bool:
        """Whether any field is a text field (such a set needs manifest format version 2)."""
        return any(f.text for f in self.fields)

    def field(self, name: str) -> Field:
        """The field called ``name``; ``KeyError`` if there is none."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """The schema as stored in ``manifest.json``."""
        return {"fields": [f.to_json() for f in self.fields], "length_field": self.length_field}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Schema:
        """Rebuild a schema from its :meth:`to_json` form."""
        return cls(fields=tuple(Field.from_json(f) for f in obj["fields"]), length_field=obj.get("length_field"))

    @classmethod
    def infer(
        cls,
        sample: Mapping[str, Any],
        *,
        fixed_fields: Iterable[str] = (),
        length_field: str | None = None,
        where: str = "the first sample",
    ) -> Schema:
        """Infer a schema from one sample.

        Arrays with at least one axis are variable along axis 0 unless named in
        ``fixed_fields``; 0-d values (scalars) are fixed.
        """
        if not isinstance(sample, Mapping) or not sample:
            raise InputError(f"{where}: a sample must be a non-empty dict of named arrays, got {type(sample).__name__}")
        for name in sample:
            if not isinstance(name, str):
                raise InputError(f"{where}: field names must be strings, got {name!r} ({type(name).__name__})")
        fixed = set(fixed_fields)
        unknown = fixed - set(sample)
        if unknown:
            raise InputError(f"fixed_fields names fields the samples do not have: {sorted(unknown)}")
        fields = []
        for name, value in sample.items():
            kind = text_kind(value)
            if kind is not None:
                if name in fixed:
                    raise InputError(f"{where}: fixed_fields names {name!r}, a text field; text is never fixed-shape")
                fields.append(Field(name=str(name), dtype=kind, shape=()))
                continue
            arr = as_array(value, name=name, where=where)
            if arr.ndim == 0 or name in fixed:
                shape: tuple[int | None, ...] = tuple(arr.shape)
            else:
                shape = (None, *arr.shape[1:])
            fields.append(Field(name=str(name), dtype=arr.dtype.name, shape=shape))
        return cls(fields=tuple(fields), length_field=length_field)

    def check(self, sample: Mapping[str, Any], *, where: str) -> dict[str, np.ndarray]:
        """Check one sample against the schema and return it as arrays.

        Raises:
            InputError: naming ``where`` (file and sample) and the field.
        """
        if not isinstance(sample, Mapping):
            raise InputError(f"{where}: a sample must be a dict of named arrays, got {type(sample).__name__}")
        if len(sample) != len(self.fields) or any(f.name not in sample for f in self.fields):
            missing = [n for n in self.names if n not in sample]
            extra = [str(n) for n in sample if n not in self.names]
            raise InputError(
                f"{where}: fields differ from the first sample"
                + (f"; missing {missing}" if missing else "")
                + (f"; unexpected {extra}" if extra else "")
                + ". Every sample must have the same fields."
            )
        out = {}
        for f in self.fields:
            value = sample[f.name]
            kind = text_kind(value)
            if f.text or kind is not None:
                out[f.name] = text_to_array(f, value, kind, where)
                continue
            arr = as_array(value, name=f.name, where=where)
            if dtype_name(arr.dtype) != f.dtype:
                raise InputError(
                    f"{where}: field {f.name!r} has dtype {arr.dtype.name}, but earlier samples have {f.dtype}. "
                    f"Cast it in the source, or choose the dtype explicitly (--dtype {f.name}={f.dtype})."
                )
            shape = arr.shape
            ok = len(shape) == len(f.shape) and all(e is None or e == s for e, s in zip(f.shape, shape))
            if not ok:
                raise InputError(
                    f"{where}: field {f.name!r} has shape {list(shape)}, but the schema says {_shape_text(f.shape)} "
                    "(taken from the first sample). Only the first axis may vary between samples."
                )
            out[f.name] = arr
        return out

    def batch_keys(self, packed: bool = False) -> dict[str, str]:
        """The keys the loader adds to every batch besides the fields, each with what it holds.

        The one list of them, which the collate functions build their keys with
        and :func:`schema_problems` (and, for packed loading, ``PackSpec.check_set``)
        refuse as field names.

        Args:
            packed: also list the keys only packed batches have.
        """
        keys = {lengths_key(f.name): f"the lengths of variable field {f.name!r}" for f in self.variable_fields}
        keys[SAMPLE_ID_KEY] = "the global sample ids"
        keys[WEIGHT_KEY] = "the per-sample weights (0.0 for filler)"
        if packed:
            keys[POSITION_IDS_KEY] = "the position of each token within its document (packed batches)"
            keys[DOCUMENT_IDS_KEY] = "the document of each token, -1 on padding (packed batches)"
            keys[CU_SEQLENS_KEY] = "the cumulative sequence lengths for varlen attention (packed batches)"
            keys[MAX_SEQLEN_KEY] = "the longest sequence of cu_seqlens (packed batches)"
            keys[SAMPLE_START_KEY] = "the token of its sample each document starts at (packed batches)"
        return keys

    def batching_lengths(self, per_field: Mapping[str, np.ndarray], n: int) -> np.ndarray:
        """``(n,)`` int64 batching lengths from each variable field's ``(n,)`` first-axis lengths.

        The one rule for ``lengths.npy`` (prepare writes it, the loader and
        ``verify`` check it): the ``length_field``'s length, else the longest
        variable field of each sample, else 1.
        """
        if self.length_field is not None:
            return np.asarray(per_field[self.length_field], dtype=np.int64)
        if not per_field:
            return np.ones(n, dtype=np.int64)
        longest: np.ndarray = np.max(np.stack([np.asarray(v, dtype=np.int64) for v in per_field.values()]), axis=0)
        return longest


@functools.lru_cache(maxsize=256)
def dtype_name(dtype: np.dtype[Any]) -> str:
    """``dtype.name``, cached: numpy builds the name anew on every call (~2 us, a tenth of checking a sample)."""
    return dtype.name


def as_array(value: Any, *, name: str, where: str) -> np.ndarray:
    """Convert a field value to a numpy array of a supported dtype, or raise.

    A torch tensor is taken as the data it holds, wherever it is: one that
    requires grad or lives on a GPU is detached and copied to the CPU (what
    ``numpy()`` refuses to do by itself). A masked array is refused unless
    nothing is masked: a shard has no mask, so masked values would be stored as
    if they were data.
    """
    if isinstance(value, np.ma.MaskedArray):
        value = _unmasked(value, name, where)
    elif _is_torch_tensor(value):
        value = _tensor_to_numpy(value, name, where)
    if isinstance(value, (bytes, bytearray)) or (isinstance(value, memoryview) and value.format in ("B", "b", "c")):
        size = value.nbytes if isinstance(value, memoryview) else len(value)
        # Raw bytes say nothing of the dtype they hold: numpy would make bytes one string (refused below) but
        # a bytearray or memoryview uint8 values, which may be anything. All are refused alike.
        raise InputError(
            f"{where}: field {name!r} holds raw bytes (a {type(value).__name__} of {size} bytes), not an "
            "array: decode them with the dtype they hold, e.g. np.frombuffer(value, dtype=np.int32), or "
            "np.frombuffer(value, dtype=np.uint8) for bytes"
        )
    if type(value) is np.ndarray:
        arr = value
    elif isinstance(value, np.ndarray):  # a subclass (np.matrix, ...): only its data is stored
        arr = np.asarray(value)
    else:
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError) as exc:
            what = describe_ragged(value) if "inhomogeneous" in str(exc) else f"cannot be made into an array: {exc}"
            raise InputError(f"{where}: field {name!r} is {what}; {FIELD_HOLDS}") from None
    if dtype_name(arr.dtype) not in SUPPORTED_DTYPES:
        if arr.dtype == object:  # None, a dict, an object, or a list holding one: numpy kept them as objects
            what = describe_object_array(value, arr)
            raise InputError(f"{where}: field {name!r} is {what} (unsupported dtype object); {FIELD_HOLDS}")
        raise InputError(
            f"{where}: field {name!r} has unsupported dtype {arr.dtype}; supported: {', '.join(SUPPORTED_DTYPES)}"
        )
    return arr


def _unmasked(value: np.ma.MaskedArray, name: str, where: str) -> np.ndarray:
    masked = int(np.count_nonzero(np.ma.getmaskarray(value)))
    if masked:
        raise InputError(
            f"{where}: field {name!r} is a masked array with {masked} masked value(s); a shard stores no mask, so "
            "they would be stored as data. Fill them (arr.filled(value)) or leave those samples out."
        )
    return np.asarray(value.data)


def _is_torch_tensor(value: Any) -> bool:
    # torch is optional: recognise its tensors without importing it
    return type(value).__module__.partition(".")[0] == "torch" and hasattr(value, "detach")


def _tensor_to_numpy(value: Any, name: str, where: str) -> np.ndarray:
    """A tensor's values as a numpy array, from any device, grad or not; or an InputError saying why not."""
    try:
        arr = value.detach().cpu().resolve_conj().resolve_neg().numpy()
    except Exception as exc:  # noqa: BLE001  (bfloat16, sparse, meta tensors ... raise TypeError or RuntimeError)
        raise InputError(
            f"{where}: field {name!r} is a torch tensor ({value.dtype}, {value.layout}, on {value.device}) that "
            f"numpy cannot hold ({one_line(exc)}); "
            "convert it first, e.g. tensor.to_dense().float()"
        ) from None
    return np.asarray(arr)


def parse_dtype_overrides(items: Sequence[str]) -> dict[str, str]:
    """Parse ``["tokens=int32", ...]`` (the ``--dtype`` option) into a mapping."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, dtype = item.partition("=")
        if not sep or not name or dtype not in SUPPORTED_DTYPES:
            raise InputError(f"--dtype {item!r}: expected FIELD=DTYPE with DTYPE one of {', '.join(SUPPORTED_DTYPES)}")
        out[name] = dtype
    return out


def schema_problems(schema: Schema) -> list[str]:
    """What makes ``schema`` unusable by the loader: one line per problem, empty if none.

    The one check of a schema, by ``Manifest.load`` and by prepare on the first
    sample, before it writes anything (see :func:`prepare_problems`).
    """
    problems = []
    if not schema.fields:
        problems.append("the schema has no fields")
    if len(set(schema.names)) != len(schema.names):
        problems.append(f"the schema names a field twice ({list(schema.names)})")
    for f in schema.fields:
        if f.text:
            if f.shape:
                problems.append(f"text field {f.name!r} has shape {list(f.shape)}; a text field has shape []")
            continue
        if f.dtype not in SUPPORTED_DTYPES:
            problems.append(f"field {f.name!r} has dtype {f.dtype!r}, not one of {', '.join(SUPPORTED_DTYPES)}")
            continue
        dims = f.shape[1:] if f.variable else f.shape
        if len(f.shape) > MAX_DIMS or any(d is None or d < 0 for d in dims):
            problems.append(
                f"field {f.name!r} has shape {list(f.shape)}; only the first axis may be null (vary), the others "
                f"must be non-negative, at most {MAX_DIMS} axes"
            )
        elif math.prod(f.inner_shape) > MAX_ROW_ELEMENTS:
            problems.append(f"field {f.name!r} has shape {_shape_text(f.shape)}, too large for one sample")
    length = schema.length_field
    if length is not None and length in schema.names and not schema.field(length).variable:
        # the batching length is a variable field's first axis: a text or fixed field has none
        variable = ", ".join(f.name for f in schema.variable_fields) or "none"
        if schema.field(length).text:
            problems.append(
                f"length_field {length!r} is a text field ({schema.field(length).dtype}), which never defines a "
                f"sample's length; name a field whose length varies (variable fields: {variable}), or tokenize the "
                "text into a field of token ids first"
            )
        else:
            problems.append(
                f"length_field {length!r} is fixed-shape; name a field whose length varies (variable fields: "
                f"{variable})"
            )
    reserved = schema.batch_keys()
    for f in schema.fields:
        if f.name in reserved:
            problems.append(
                f"field {f.name!r} has the name of a key the loader adds to every batch ({reserved[f.name]}), "
                "which would replace its data in every batch: rename the field"
            )
    return problems


def prepare_problems(schema: Schema) -> list[str]:
    """What prepare refuses in a schema: :func:`schema_problems`, and fields it cannot store.

    Field names become file names (``lengths.<name>.npy``, Zarr groups); staged
    Arrow chunks cannot hold an axis of size 0 after the first.
    """
    problems = schema_problems(schema)
    for f in schema.fields:
        problem = name_problem(f.name)
        if problem:
            problems.append(f"field name {f.name!r}: {problem}")
        if f.dtype in SUPPORTED_DTYPES and 0 in f.inner_shape:
            problems.append(
                f"field {f.name!r} has shape {_shape_text(f.shape)}: an axis of size 0 holds no data and cannot be "
                "stored; drop the field or give the axis a size"
            )
    return problems


def name_problem(name: str) -> str:
    """Why prepare cannot store a field called ``name`` (it names files), or ``""``."""
    if not name:
        return "empty"
    if name in (".", "..") or any(c in name for c in "/\\\0"):
        return "must not be '.' or '..' nor hold '/', '\\' or NUL (it names files)"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "not valid Unicode (a lone surrogate?)"
    if size > MAX_NAME_BYTES:
        return f"{size} bytes long, more than {MAX_NAME_BYTES} (it names files)"
    return ""


def _shape_text(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("L" if d is None else str(d) for d in shape) + "]"
