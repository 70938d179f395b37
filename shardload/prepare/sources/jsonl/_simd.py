"""The optional parser of the JSON Lines fast path: simdjson (``pip install shardload[fast-json]``).

``pysimdjson`` parses a line of integer lists several times faster than pyarrow's JSON reader (it
hands a list over as one buffer of int64, with no Python object per number). It is used only where
its result is provably what the exact reader (:mod:`._lines`) gives, the same tests as pyarrow's
path (:mod:`._blocks`) plus its own:

* a field is an int64 or a list of int64 (``as_buffer(of_type="i")``, which refuses a float, a
  bool, a null or a number beyond int64), or a bool; a list of bools is left to pyarrow;
* a key given twice shows as more keys than the schema's (simdjson keeps both), and a key that is
  missing or not the schema's, as a lookup that fails: either way the block goes to the next path;
* simdjson flattens nested lists in ``as_buffer``: the block must hold one ``[`` per list field and
  line, so no list is nested (field names holding ``[``, ``"`` or ``\\`` are not taken).

Anything else gives None, and the block is read by pyarrow, or line by line.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pyarrow as pa

from shardload._base.ranges import offsets_from_lengths
from shardload.formats.base import FieldData

__all__ = ["available", "parse_block"]

try:
    _simdjson: Any = importlib.import_module("simdjson")
except ImportError:  # the fast-json extra is not installed
    _simdjson = None

_INT64 = (-(2**63), 2**63)


def available() -> bool:
    """Whether simdjson is installed (the ``fast-json`` extra)."""
    return _simdjson is not None


def parse_block(block: bytes, lines: np.ndarray, parse_schema: pa.Schema) -> dict[str, FieldData] | None:
    """The fields of the JSON Lines ``block``'s non-blank ``lines`` (indexes from 0, each ``{...}``), or None."""
    if _simdjson is None or not _takes(parse_schema):
        return None
    kinds = {f.name: _kind(f.type) for f in parse_schema}
    lists = [name for name, kind in kinds.items() if kind == "list"]
    if block.count(b"[") != len(lists) * len(lines):
        return None
    names = parse_schema.names
    texts = block.split(b"\n")
    found: dict[str, list[Any]] = {name: [] for name in names}
    parser = _simdjson.Parser()
    for k in lines.tolist():
        if not _one(parser, texts[k], names, kinds, found):
            return None
    fields = {}
    for f in parse_schema:
        got = found[f.name]
        if kinds[f.name] == "list":
            lens = np.fromiter((m.nbytes for m in got), dtype=np.int64, count=len(got)) // 8
            values = np.frombuffer(b"".join(got), dtype=np.int64)
            fields[f.name] = FieldData(values, offsets_from_lengths(lens))
        else:
            fields[f.name] = FieldData(np.array(got, dtype=np.bool_ if kinds[f.name] == "bool" else np.int64), None)
    return fields


def _kind(t: pa.DataType) -> str:
    return "list" if pa.types.is_list(t) else "bool" if pa.types.is_boolean(t) else "int"


def _takes(parse_schema: pa.Schema) -> bool:
    """Whether every field is of a type this parser gives exactly, under a name it can count on."""
    for f in parse_schema:
        if any(c in f.name for c in '["\\'):
            return False
        t = f.type.value_type if pa.types.is_list(f.type) else f.type
        if not (pa.types.is_int64(t) or (pa.types.is_boolean(t) and not pa.types.is_list(f.type))):
            return False
    return True


def _one(parser: Any, text: bytes, names: list[str], kinds: dict[str, str], found: dict[str, list[Any]]) -> bool:
    """Parse one line into ``found``; False if it is not provably what the exact reader gives.

    ``kinds``: per field, ``list`` (of int64), ``int`` or ``bool``. No simdjson object outlives the call
    (the parser refuses to parse again while one lives).
    """
    try:
        obj = parser.parse(text)
        if not isinstance(obj, _simdjson.Object) or len(obj) != len(names):
            return False
        for name in names:
            value, kind = obj[name], kinds[name]
            if kind == "list":
                found[name].append(memoryview(value.as_buffer(of_type="i")))
            elif (kind == "bool" and type(value) is bool) or (
                kind == "int" and type(value) is int and _INT64[0] <= value < _INT64[1]
            ):
                found[name].append(value)
            else:
                return False
        return True
    except Exception:  # noqa: BLE001  (any refusal of simdjson's: the next path reads the block and names the error)
        return False
