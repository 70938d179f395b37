"""The columnar ingest path: whole record batches (Parquet, Arrow IPC) and blocks of JSON Lines.

Every test compares with the exact per-sample path (readers' ``read_batches``
switched off), which is what prepare did before: the same shard bytes, or the
same error message, for clean and for damaged input. Tests that a batch really
went through the columnar path count the samples checked one by one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardload
from shardload.errors import ShardloadError
from shardload.formats.base import Columns, concat_columns
from shardload.formats.origin import run_origins
from shardload.prepare import pipeline, schedule, staging
from shardload.prepare.sources.jsonl import _blocks as jsonblocks
from shardload.schema.fields import Schema

from .test_split import shard_bytes


class Counted:
    """Counts the samples ingest checks one by one (the per-sample path)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.samples = 0
        original = pipeline.SampleChecker.__call__

        def counting(checker: pipeline.SampleChecker, sample: Any, where: str) -> dict[str, np.ndarray]:
            self.samples += 1
            return original(checker, sample, where)

        monkeypatch.setattr(pipeline.SampleChecker, "__call__", counting)


def outcome(src: Path, out: Path, **kw: Any) -> dict[str, bytes] | str:
    """The data files of the set prepared from ``src`` and its samples' origins, or the error message."""
    try:
        shardload.prepare(src, out, progress=False, **kw)
    except ShardloadError as exc:
        return f"{type(exc).__name__}: {exc}"
    with pa.memory_map(str(out / "origins.arrow"), "r") as source:
        origins = pa.ipc.open_file(source).read_all().to_pylist()
    return {**shard_bytes(out), "origins": repr(origins).encode()}


def exact_outcome(monkeypatch: pytest.MonkeyPatch, src: Path, out: Path, **kw: Any) -> dict[str, bytes] | str:
    """:func:`outcome` with every unit read sample by sample (as before the columnar path)."""
    with monkeypatch.context() as m:
        m.setattr(schedule, "read_unit_batches", lambda *a: None)
        return outcome(src, out, **{**kw, "workers": 1})


def compare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, src: Path, **kw: Any) -> dict[str, bytes] | str:
    want = exact_outcome(monkeypatch, src, tmp_path / "exact", **kw)
    got = outcome(src, tmp_path / "columnar", **kw)
    assert got == want
    return got


# -- JSON Lines -------------------------------------------------------------------------------------------
def jsonl_lines(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        json.dumps({"tokens": rng.integers(0, 50_000, int(rng.integers(0, 30))).tolist(), "label": i}) for i in range(n)
    ]


def write_lines(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_bytes((end.join(lines) + end).encode("utf-8"))
    return path


#: lines put among clean ones (at line 150 of 300): each must end exactly as the exact reader ends it
ODD_LINES = {
    "clean": [],
    "blank and spaces": ["", "   ", "\t", " \r"],
    "empty list": ['{"tokens": [], "label": 1}'],
    "minus zero": ['{"tokens": [-0, 1], "label": -0}'],
    "escaped key": ['{"\\u0074okens": [1], "label": 1}'],
    "leading spaces": ['   {"tokens": [1], "label": 1}'],
    "float": ['{"tokens": [1.0, 2], "label": 1}'],
    "exponent": ['{"tokens": [1e2, 2], "label": 1}'],
    "float label": ['{"tokens": [1, 2], "label": 0.5}'],
    "beyond int64": ['{"tokens": [9223372036854775808], "label": 1}'],
    "beyond uint64": ['{"tokens": [1], "label": 18446744073709551616}'],
    "huge float": ['{"tokens": [1e400], "label": 1}'],
    "infinity": ['{"tokens": [Infinity], "label": 1}'],
    "duplicate key": ['{"tokens": [1], "label": 1, "label": 2}'],
    "duplicate key, one escaped": ['{"tokens": [1], "label": 1, "\\u006cabel": 2}'],
    "duplicate list key": ['{"tokens": [1], "tokens": [2], "label": 1}'],
    "missing field": ['{"tokens": [1]}'],
    "extra field": ['{"tokens": [1], "label": 1, "x": 2}'],
    "null in list": ['{"tokens": [1, null], "label": 1}'],
    "null field": ['{"tokens": null, "label": 1}'],
    "string": ['{"tokens": [1], "label": "1"}'],
    "bool in list": ['{"tokens": [true, 2], "label": 1}'],
    "bool label": ['{"tokens": [1], "label": true}'],
    "nested list": ['{"tokens": [[1]], "label": 1}'],
    "scalar for list": ['{"tokens": 1, "label": 1}'],
    "two objects on a line": ['{"tokens": [1], "label": 1}{"tokens": [2], "label": 2}'],
    "two objects, a carriage return between": ['{"tokens": [1], "label": 1}\r{"tokens": [2], "label": 2}'],
    "object over two lines": ['{"tokens": [1,', '2], "label": 1}'],
    "objects split oddly": ['{"tokens": [1,', '2], "label": 1}{"tokens": [3], "label": 3}'],
    "a list": ["[1, 2]"],
    "trailing text": ['{"tokens": [1], "label": 1} x'],
    "not JSON": ["{tokens: [1]}"],
    "byte-order mark": ['\ufeff{"tokens": [1], "label": 1}'],
    "form feed line": ["\x0c"],
    "empty object": ["{}"],
}


@pytest.mark.parametrize("case", list(ODD_LINES))
def test_jsonl_blocks_end_as_the_exact_reader(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = jsonl_lines(300)
    lines[150:150] = ODD_LINES[case]
    src = write_lines(tmp_path / "a.jsonl", lines)
    monkeypatch.setattr(jsonblocks, "BLOCK_BYTES", 2000)  # many blocks, one of them holds the odd lines
    compare(monkeypatch, tmp_path, src, unit_bytes=8000, chunk_bytes=3000)


@pytest.mark.slow
def test_jsonl_damaged_bytes_end_as_the_exact_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random bytes of a clean file replaced by bytes that matter to JSON: the same outcome either way."""
    clean = write_lines(tmp_path / "clean.jsonl", jsonl_lines(60)).read_bytes()
    rng = np.random.default_rng(7)
    monkeypatch.setattr(jsonblocks, "BLOCK_BYTES", 700)
    errors = 0
    for k in range(40):
        data = bytearray(clean)
        for pos in rng.integers(0, len(data), int(rng.integers(1, 4))):
            data[pos] = rng.choice(list(b'{}[],":.e-+ \n\r0tn\\\xef'))
        src = tmp_path / f"m{k}.jsonl"
        src.write_bytes(bytes(data))
        got = compare(monkeypatch, tmp_path / f"o{k}", src, unit_bytes=2000, chunk_bytes=1500)
        errors += isinstance(got, str)
    assert 0 < errors < 40  # both kinds of outcome were compared


@pytest.mark.parametrize(
    "dtypes",
    [{}, {"tokens": "int32"}, {"tokens": "uint16", "label": "int16"}, {"tokens": "float32"}, {"tokens": "int8"}],
)
@pytest.mark.parametrize("shuffle", [False, True])
def test_jsonl_dtypes_and_shuffle(
    dtypes: dict[str, str], shuffle: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_lines(tmp_path / "a.jsonl", jsonl_lines(400), end="\r\n")
    got = compare(monkeypatch, tmp_path, src, dtypes=dtypes, shuffle=shuffle, unit_bytes=10_000, workers=2)
    assert isinstance(got, dict) or dtypes == {"tokens": "int8"}


def test_jsonl_clean_blocks_take_the_columnar_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_lines(tmp_path / "a.jsonl", ["", *jsonl_lines(500), " "])
    counted = Counted(monkeypatch)
    result = shardload.prepare(src, tmp_path / "out", progress=False, unit_bytes=20_000)
    assert result.samples == 500
    assert counted.samples == 0


def test_jsonl_a_bad_block_alone_is_read_line_by_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = jsonl_lines(500)
    lines[400] = (
        '{"tokens": [1.0], "label": 1}'  # a float: pyarrow's int64 refuses the block, the exact reader the line
    )
    src = write_lines(tmp_path / "a.jsonl", lines)
    monkeypatch.setattr(jsonblocks, "BLOCK_BYTES", 3000)
    counted = Counted(monkeypatch)
    with pytest.raises(ShardloadError, match="line 401: field 'tokens' has dtype float32"):
        shardload.prepare(src, tmp_path / "out", progress=False)
    assert 0 < counted.samples < 100


@pytest.mark.parametrize(
    "rows",
    [
        [{"flags": [True, False], "x": 1}, {"flags": [], "x": 2}, {"flags": [False], "x": 3}],
        [{"flags": [True], "x": True}, {"flags": [False, True], "x": False}],
        [{"v": [0.5, 1.5], "x": 1}, {"v": [1e-50], "x": 2}],
        [{"m": [[1, 2], [3, 4]], "x": 1}, {"m": [], "x": 2}, {"m": [[5, 6]], "x": 3}],
    ],
    ids=["bool lists with an empty one", "bools", "floats", "2-D lists"],
)
def test_jsonl_other_kinds_of_fields(
    rows: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_lines(tmp_path / "a.jsonl", [json.dumps(r) for r in rows * 50])
    compare(monkeypatch, tmp_path, src, unit_bytes=1000)


def test_jsonl_a_line_longer_than_a_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = jsonl_lines(50)
    lines[20] = json.dumps({"tokens": list(range(3000)), "label": 0})
    src = write_lines(tmp_path / "a.jsonl", lines)
    monkeypatch.setattr(jsonblocks, "BLOCK_BYTES", 1000)
    compare(monkeypatch, tmp_path, src)
    counted = Counted(monkeypatch)
    assert shardload.prepare(src, tmp_path / "again", progress=False).samples == 50
    assert counted.samples == 0


# -- Parquet and Arrow IPC --------------------------------------------------------------------------------
def table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 40, n)
    return pa.table(
        {
            "tokens": pa.array([rng.integers(0, 50_000, k).tolist() for k in lens], pa.list_(pa.int32())),
            "label": pa.array(rng.integers(0, 5, n), pa.int64()),
            "emb": pa.array(rng.standard_normal((n, 3)).astype(np.float32).tolist(), pa.list_(pa.float32(), 3)),
            "w": pa.array(rng.random(n), pa.float64()),
            "ok": pa.array(rng.random(n) > 0.5),
        }
    )


def write_parquet(path: Path, tab: pa.Table) -> Path:
    pq.write_table(tab, path, row_group_size=50)
    return path


def write_ipc(path: Path, tab: pa.Table) -> Path:
    with pa.ipc.new_file(path, tab.schema) as w:
        for b in tab.to_batches(max_chunksize=40):
            w.write_batch(b)
    return path


WRITERS: dict[str, Callable[[Path, pa.Table], Path]] = {"parquet": write_parquet, "arrow": write_ipc}


@pytest.mark.parametrize("kind", list(WRITERS))
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"workers": 2, "unit_bytes": 5000, "chunk_bytes": 4000},
        {"dtypes": {"tokens": "int64", "w": "float32"}, "shuffle": True},
        {"dtypes": {"tokens": "uint16"}, "fixed_fields": ["emb"], "chunk_bytes": 2000},
        {"dtypes": {"tokens": "int8"}},
        {"dtypes": {"label": "bool"}},
        {"reject_nonfinite": True},
    ],
)
def test_tables_stage_as_the_exact_path(
    kind: str, kw: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = WRITERS[kind](tmp_path / f"a.{kind}", table(700))
    compare(monkeypatch, tmp_path, src, **kw)


@pytest.mark.parametrize("kind", list(WRITERS))
def test_tables_take_the_columnar_path(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = WRITERS[kind](tmp_path / f"a.{kind}", table(700))
    counted = Counted(monkeypatch)
    assert shardload.prepare(src, tmp_path / "out", progress=False).samples == 700
    assert counted.samples == 0


@pytest.mark.parametrize(
    "column",
    [
        pa.array([[1, 2], None, [3]] * 100, pa.list_(pa.int64())),
        pa.array([[1, None], [2], [3]] * 100, pa.list_(pa.int64())),
        pa.array([[[1, 2]], [], [[3, 4], [5, 6]]] * 100, pa.list_(pa.list_(pa.int64()))),
        pa.array([1.0, float("nan"), 2.0] * 100, pa.float32()),
        pa.array([[1, 2], [1, 2, 3]] * 150, pa.list_(pa.uint64())),
    ],
    ids=["null row", "null value", "list of lists", "nan", "uint64"],
)
@pytest.mark.parametrize("kind", list(WRITERS))
def test_tables_with_odd_columns(column: pa.Array, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tab = pa.table({"x": pa.array(np.arange(len(column))), "c": column})
    src = WRITERS[kind](tmp_path / f"a.{kind}", tab)
    dtypes = {"c": "int64"} if kind == "arrow" else {}
    compare(monkeypatch, tmp_path, src, reject_nonfinite=True, dtypes=dtypes, unit_bytes=300)


# -- chunks ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_bytes", [1, 100, 1000, 10**9])
def test_batches_cut_chunks_where_samples_do(chunk_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staging, "MAX_FIELD_VALUES", 100)
    rng = np.random.default_rng(1)
    samples = [
        {"t": np.arange(int(k), dtype=np.int32), "y": np.int64(i)} for i, k in enumerate(rng.integers(0, 60, 300))
    ]
    schema = Schema.infer(samples[0])
    files = ("f.parquet",)
    by_sample: list[tuple[Columns, list[pa.Table]]] = []
    # a chunk comes as the pieces it is cut from; what it holds is their concatenation
    one = staging.ChunkStager(schema, chunk_bytes, files, lambda c, o: by_sample.append((concat_columns(schema, c), o)))
    for i, s in enumerate(samples):
        one.add_sample({"t": s["t"], "y": np.asarray(s["y"])}, f"f.parquet: row {i}")
    one.flush()
    by_batch: list[tuple[Columns, list[pa.Table]]] = []
    whole = staging.ChunkStager(
        schema, chunk_bytes, files, lambda c, o: by_batch.append((concat_columns(schema, c), o))
    )
    one_by_one = [{"t": s["t"], "y": np.asarray(s["y"])} for s in samples[:7]]
    for i, s in enumerate(one_by_one):  # a few samples first, then batches of various sizes
        whole.add_sample(s, f"f.parquet: row {i}")
    start = 7
    for size in (1, 50, 0, 120, 122):
        cols = Columns.from_samples(schema, samples[start : start + size])
        checked = staging.check_batch(cols, schema, {}, False)
        assert checked is not None
        whole.add_batch(checked, run_origins("f.parquet", "row", np.arange(start, start + size)))
        start += size
    whole.flush()
    assert start == 300
    assert [c.num_samples for c, _ in by_batch] == [c.num_samples for c, _ in by_sample]
    for (_, o_a), (_, o_b) in zip(by_batch, by_sample):  # each chunk's origins: its samples', in order
        assert pa.concat_tables(o_a).to_pylist() == pa.concat_tables(o_b).to_pylist()
    for a, b in ((a, b) for (a, _), (b, _) in zip(by_batch, by_sample)):
        for name in ("t", "y"):
            assert a.fields[name].values.tobytes() == b.fields[name].values.tobytes()
            off_a, off_b = a.fields[name].offsets, b.fields[name].offsets
            assert (off_a is None) == (off_b is None)
            assert off_a is None or off_a.tolist() == off_b.tolist()
    assert whole.samples == one.samples == 300
    assert whole.nbytes == one.nbytes
