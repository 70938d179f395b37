"""The ``fast-json`` extra (simdjson) on the JSON Lines fast path: the same sets and the same refusals as without it.

Every case runs with the extra as installed and with it taken away; ``tests/prepare/test_columnar_ingest.py``
runs its odd lines with whichever is installed. Without the extra installed, the cases "with simdjson"
cannot run and say so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import shardload
from shardload.errors import InputError
from shardload.prepare.sources.jsonl import _blocks as jsonblocks
from shardload.prepare.sources.jsonl import _simd

from .test_columnar_ingest import ODD_LINES, compare, jsonl_lines, write_lines

PARSERS = [
    pytest.param(
        "simdjson",
        marks=pytest.mark.skipif(not _simd.available(), reason="the fast-json extra (pysimdjson) is not installed"),
    ),
    "pyarrow",
]

#: lines where simdjson alone would give something else than the exact reader: it flattens nested lists,
#: keeps a key given twice, and counts keys rather than naming them
SIMD_ODD_LINES = {
    "nested in a list": ['{"tokens": [1, [2]], "label": 1}'],
    "lists of lists": ['{"tokens": [[1], [2]], "label": 1}'],
    "a bracket in an extra key": ['{"tokens": [1], "label": 1, "a[": 2}'],
    "a bracket in place of a key": ['{"tokens": [1], "a[": 1}'],
    "duplicate key, no other": ['{"tokens": [1], "tokens": [1]}'],
    "beyond int64, negative": ['{"tokens": [-9223372036854775809], "label": 1}'],
    "int64 bounds": ['{"tokens": [-9223372036854775808, 9223372036854775807], "label": -9223372036854775808}'],
    "label beyond int64": ['{"tokens": [1], "label": 9223372036854775808}'],
    "minus zero float": ['{"tokens": [-0.0], "label": 1}'],
    "big exponent integer": ['{"tokens": [1E2], "label": 1}'],
}


def use(parser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if parser == "pyarrow":
        monkeypatch.setattr(_simd, "_simdjson", None)


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("case", [*SIMD_ODD_LINES, *ODD_LINES])
def test_odd_lines_end_as_the_exact_reader(
    parser: str, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(parser, monkeypatch)
    lines = jsonl_lines(300)
    lines[150:150] = {**SIMD_ODD_LINES, **ODD_LINES}[case]
    src = write_lines(tmp_path / "a.jsonl", lines)
    monkeypatch.setattr(jsonblocks, "BLOCK_BYTES", 2000)  # many blocks, one of them holds the odd lines
    compare(monkeypatch, tmp_path, src, unit_bytes=8000, chunk_bytes=3000)


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"tokens": [1], "tokens": [2]}', "twice"),
        ('{"tokens": [1, 9223372036854775808]}', "too large for 64 bits"),
        ('{"tokens": [1, 18446744073709551616]}', "too large for 64 bits"),
    ],
)
def test_refusals_name_the_line(
    parser: str, line: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(parser, monkeypatch)
    lines = [json.dumps({"tokens": list(range(i % 9 + 1))}) for i in range(500)]
    lines[321] = line
    src = write_lines(tmp_path / "a.jsonl", lines)
    with pytest.raises(InputError, match=rf"a\.jsonl: line 322\b.*{says}"):
        shardload.prepare(src, tmp_path / "out", progress=False)


@pytest.mark.skipif(not _simd.available(), reason="the fast-json extra (pysimdjson) is not installed")
def test_simdjson_blocks_are_pyarrow_blocks() -> None:
    """A clean block: simdjson parses it (no fallback), to the arrays pyarrow makes of it."""
    rng = np.random.default_rng(3)
    lines = [
        json.dumps(
            {
                "tokens": rng.integers(-(2**63), 2**63 - 1, int(rng.integers(0, 40)), endpoint=True).tolist(),
                "label": i - 1000,
                "flag": i % 3 == 0,
            }
        )
        for i in range(2_000)
    ]
    block = ("\n".join(lines) + "\n\n  \n").encode()
    schema = pa.schema([("tokens", pa.list_(pa.int64())), ("label", pa.int64()), ("flag", pa.bool_())])
    rows = jsonblocks._object_lines(block)
    assert rows is not None and len(rows) == len(lines)
    fast = _simd.parse_block(block, rows, schema)
    slow = jsonblocks._parse_arrow(block, schema, len(rows))
    assert fast is not None, "a clean block fell back"
    assert slow is not None
    for name in schema.names:
        assert fast[name].values.dtype == slow[name].values.dtype
        assert np.array_equal(fast[name].values, slow[name].values), name
        assert (fast[name].offsets is None) == (slow[name].offsets is None)
        if fast[name].offsets is not None:
            assert np.array_equal(fast[name].offsets, slow[name].offsets)


def test_bool_lists_are_left_to_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = pa.schema([("flags", pa.list_(pa.bool_()))])
    block = b'{"flags": [true, false]}\n'
    assert _simd.parse_block(block, np.array([0]), schema) is None
    src = write_lines(tmp_path / "a.jsonl", ['{"flags": [true, false]}'] * 50)
    seen: list[Any] = []
    real = jsonblocks._parse_arrow
    monkeypatch.setattr(jsonblocks, "_parse_arrow", lambda *a: seen.append(1) or real(*a))
    shardload.prepare(src, tmp_path / "out", progress=False)
    assert seen
