"""The columnar ingest path together with sample origins, field choice, text fields and split files.

Each test prepares through the column batches (Parquet/Arrow record batches,
JSON Lines blocks) and checks that what a sample-by-sample prepare records
holds as well: every sample's ``origin(i)``, only the chosen fields read, text
columns, and a split JSON Lines file truncated while prepare reads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import shardload
from shardload.cli import main
from shardload.errors import InputError
from shardload.prepare.sources import SourceOptions
from shardload.prepare.sources.jsonl import JsonlSource
from shardload.prepare.sources.jsonl import _blocks as jsonblocks
from shardload.schema.fields import Schema

from .test_columnar_ingest import WRITERS, Counted, compare, jsonl_lines, table, write_lines


def identity(sample: dict[str, Any]) -> dict[str, Any]:
    """A map that changes nothing: it makes prepare read every sample one by one."""
    return sample


def origins(out: Path) -> list[shardload.SampleOrigin]:
    ds = shardload.open(out)
    return [ds.origin(i) for i in range(len(ds))]


def labelled_sources(tmp_path: Path, kind: str, n: int) -> Path:
    """A file of ``n`` samples whose ``label`` is the sample's row (tables) or line (JSON Lines)."""
    if kind == "jsonl":
        lines = jsonl_lines(n)
        for k in range(0, n, 7):  # blank lines among the samples: line numbers and sample numbers differ
            lines.insert(k, "" if k % 2 else "  ")
        numbered = [json.dumps({**json.loads(s), "label": i + 1}) if s.strip() else s for i, s in enumerate(lines)]
        return write_lines(tmp_path / "a.jsonl", numbered)
    tab = table(n)
    tab = tab.set_column(tab.schema.get_field_index("label"), "label", pa.array(np.arange(n), pa.int64()))
    return WRITERS[kind](tmp_path / f"a.{kind}", tab)


@pytest.mark.parametrize("kind", ["parquet", "arrow", "jsonl"])
@pytest.mark.parametrize("kw", [{}, {"unit_bytes": 3000, "chunk_bytes": 2500, "shuffle": True}])
def test_batch_path_records_the_origins_the_sample_path_does(
    kind: str, kw: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonblocks, "BLOCK_BYTES", 2000)  # many blocks, each starting at another line
    src = labelled_sources(tmp_path, kind, 600)
    counted = Counted(monkeypatch)
    shardload.prepare(src, tmp_path / "batches", progress=False, **kw)
    assert counted.samples == 0  # every sample went through the columnar path
    shardload.prepare(src, tmp_path / "samples", progress=False, map=identity, **kw)
    assert counted.samples == 600  # the map reads every sample one by one
    got = origins(tmp_path / "batches")
    assert got == origins(tmp_path / "samples")
    ds = shardload.open(tmp_path / "batches")
    want_kind = "line" if kind == "jsonl" else "row"
    for i, origin in enumerate(got):
        assert (origin.file, origin.kind, origin.key) == (str(src), want_kind, None)
        assert origin.position == int(ds[i]["label"])


@pytest.mark.parametrize("kind", list(WRITERS))
def test_fields_on_the_batch_path_read_only_those_columns(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tab = table(500)
    # a text column and one of a type prepare refuses: neither is read when left out
    tab = tab.append_column("name", pa.array([f"s{i}" for i in range(500)]))
    tab = tab.append_column("when", pa.array(np.arange(500), pa.timestamp("s")))
    src = WRITERS[kind](tmp_path / f"a.{kind}", tab)
    counted = Counted(monkeypatch)
    out = tmp_path / "out"
    argv = [str(src), "-o", str(out), "--fields", "tokens,label", "--workers", "1", "--no-progress"]
    assert main(["prepare", *argv]) == 0
    assert counted.samples == 0  # the chosen columns went through the columnar path
    ds = shardload.open(out)
    assert sorted(ds.schema.names) == ["label", "tokens"]
    rows = [origin.position for origin in origins(out)]  # the set's order is not the file's
    assert sorted(rows) == list(range(500))  # type: ignore[type-var]
    labels, tokens = tab.column("label").to_pylist(), tab.column("tokens").to_pylist()
    for i, row in enumerate(rows):
        assert row is not None and int(ds[i]["label"]) == labels[row] and ds[i]["tokens"].tolist() == tokens[row]
    compare(monkeypatch, tmp_path / "fields", src, fields=["tokens", "label"], unit_bytes=4000)
    compare(monkeypatch, tmp_path / "drop", src, drop_fields=["name", "when"], unit_bytes=4000)


def test_fields_on_json_lines_stage_the_chosen_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [json.dumps({**json.loads(s), "note": f"n{i}", "x": [1.5]}) for i, s in enumerate(jsonl_lines(300))]
    src = write_lines(tmp_path / "a.jsonl", lines)
    got = compare(monkeypatch, tmp_path, src, fields=["tokens", "label"], unit_bytes=4000)
    assert isinstance(got, dict)
    assert sorted(shardload.open(tmp_path / "columnar").schema.names) == ["label", "tokens"]
    compare(monkeypatch, tmp_path / "drop", src, drop_fields=["note", "x"], unit_bytes=4000)


@pytest.mark.parametrize("kind", list(WRITERS))
def test_text_columns_are_staged_sample_by_sample(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tab = table(300).append_column("name", pa.array([f"s{i}" * (i % 4) for i in range(300)]))
    tab = tab.append_column("raw", pa.array([bytes([i % 256]) * (i % 3) for i in range(300)], pa.binary()))
    src = WRITERS[kind](tmp_path / f"a.{kind}", tab)
    counted = Counted(monkeypatch)
    compare(monkeypatch, tmp_path, src, unit_bytes=3000)
    assert counted.samples == 2 * 300  # the exact run and the text table's: both one by one
    ds = shardload.open(tmp_path / "columnar")
    names, raw = tab.column("name").to_pylist(), tab.column("raw").to_pylist()
    for i, origin in enumerate(origins(tmp_path / "columnar")):
        assert origin.position is not None and (ds[i]["name"], ds[i]["raw"]) == (
            names[origin.position],
            raw[origin.position],
        )


def test_text_in_json_lines_is_read_line_by_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [json.dumps({**json.loads(s), "note": f"n{i}"}) for i, s in enumerate(jsonl_lines(200))]
    src = write_lines(tmp_path / "a.jsonl", lines)
    compare(monkeypatch, tmp_path, src, unit_bytes=3000)
    ds = shardload.open(tmp_path / "columnar")
    for i, origin in enumerate(origins(tmp_path / "columnar")):
        assert origin.position is not None and ds[i]["note"] == f"n{origin.position - 1}"


@pytest.mark.parametrize("cut", ["mid-line", "at-a-newline", "at-the-unit-start"])
def test_a_split_jsonl_truncated_mid_run_is_a_changed_file_on_the_block_path(
    tmp_path: Path, cut: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonblocks, "BLOCK_BYTES", 300)
    src = write_lines(tmp_path / "a.jsonl", [json.dumps({"tokens": [i, i]}) for i in range(400)])
    options = SourceOptions(unit_bytes=2000)
    units = JsonlSource.make_units([str(src)], options)
    assert len(units) > 2
    middle = units[1]
    assert middle.part is not None
    start, stop = middle.part
    data = src.read_bytes()
    end = {
        "mid-line": (start + stop) // 2,
        "at-a-newline": data.rindex(b"\n", start, (start + stop) // 2) + 1,
        "at-the-unit-start": start,
    }[cut]
    src.write_bytes(data[:end])
    schema = Schema.infer({"tokens": np.zeros(2, np.int64)})
    batches = JsonlSource.read_batches(middle, options, schema)
    with pytest.raises(InputError, match=r"a\.jsonl: line \d+: the file changed while prepare read it"):
        for batch in batches:  # as ingest reads them: the columns, or else the samples one by one
            if batch.columns is None:
                list(batch.samples())
