"""Big files split into units (JSON Lines byte ranges, Parquet row groups, Arrow IPC record batches).

The output must not depend on the number of workers, the samples not on the
unit size, and every locator (line or row number) must stay exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardload
from shardload.prepare.sources import SourceOptions, discover, read_unit
from shardload.prepare.sources.jsonl import _lines as jsonl_module
from shardload.prepare.sources.jsonl import line_cuts

REPO = Path(__file__).resolve().parents[2]


def shard_bytes(out: Path) -> dict[str, bytes]:
    """Every file of a set that holds data (shards, lengths index), by name."""
    files = sorted(out.glob("shards/*")) + sorted(out.glob("*.npy"))
    return {str(p.relative_to(out)): p.read_bytes() for p in files}


def all_samples(out: Path) -> list[dict[str, list[Any]]]:
    ds = shardload.open(out)
    # by source position: the shuffle is the same for the same lengths, so sample ids compare directly
    return [{k: np.asarray(v).tolist() for k, v in ds[i].items()} for i in range(len(ds))]


def write_jsonl(path: Path, n: int, seed: int = 0, *, crlf: bool = False, blank_every: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    end = "\r\n" if crlf else "\n"
    with open(path, "w", newline="") as fh:
        for i in range(n):
            tokens = rng.integers(0, 50_000, int(rng.integers(1, 40))).tolist()
            fh.write(json.dumps({"tokens": tokens, "label": i}) + end)
            if blank_every and i % blank_every == 0:
                fh.write(end)
    return path


def units_of(path: Path, unit_bytes: int) -> list[shardload.prepare.sources.SourceUnit]:
    return discover([path], options=SourceOptions(unit_bytes=unit_bytes))


def located(path: Path, unit_bytes: int) -> list[tuple[str, dict[str, list[Any]]]]:
    """Every (locator, sample) of ``path`` read unit after unit."""
    options = SourceOptions(unit_bytes=unit_bytes)
    out = []
    for unit in discover([path], options=options):
        out.extend((where, {k: v.tolist() for k, v in s.items()}) for where, s in read_unit(unit, options))
    return out


# -- JSON Lines ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("crlf", [False, True])
def test_jsonl_units_read_what_the_whole_file_holds(tmp_path: Path, crlf: bool) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", 400, crlf=crlf, blank_every=7)
    assert len(units_of(path, 2000)) > 5
    assert located(path, 2000) == located(path, 1 << 30)


def test_line_cuts_fall_after_newlines_and_count_lines(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", 300, blank_every=5)
    data = path.read_bytes()
    cuts = line_cuts(str(path), len(data), 1000)
    assert cuts[0][0] == 0 and cuts[-1][1] == len(data)
    for (start, stop, lines), nxt in zip(cuts, cuts[1:] + [(len(data), 0, 0)]):
        assert stop == nxt[0] and data[stop - 1 : stop] == b"\n"
        assert lines == data[:start].count(b"\n")


@pytest.mark.parametrize("scan", [1, 7, 64, 1 << 20])
def test_line_cuts_count_lines_whatever_the_scan_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scan: int
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", 120, blank_every=3)
    data = path.read_bytes()
    monkeypatch.setattr(jsonl_module, "_SCAN_BYTES", scan)  # steps that end inside lines, on newlines, past the end
    cuts = line_cuts(str(path), len(data), 500)
    assert len(cuts) > 3
    assert [lines for _, _, lines in cuts] == [data[:start].count(b"\n") for start, _, _ in cuts]


@pytest.mark.parametrize(
    "content",
    [
        b"",  # a 0-byte file
        b'{"t": [1, 2, 3]}',  # one line, no newline at the end
        b'{"t": [1, 2, 3]}\n',  # one line
        b'{"t": [1]}\n{"t": [' + b"7, " * 3000 + b'8]}\n{"t": [2]}\n{"t": [3]}',  # a line longer than a unit
        b'{"t": [1]}\n\n\n\n\n\n\n\n{"t": [2]}\n\n\n\n\n\n{"t": [3]}\n\n\n\n',  # blank lines at the cuts
    ],
)
def test_jsonl_edge_files(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(content)
    for unit_bytes in (1, 2, 3, 5, 11, 64):
        units = units_of(path, unit_bytes)
        starts = [u.part[0] for u in units if u.part is not None]
        assert all(content[s - 1 : s] == b"\n" for s in starts if s)
        assert located(path, unit_bytes) == located(path, 1 << 30)


def test_error_line_number_is_exact_in_a_later_unit(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", 300, blank_every=3)
    lines = path.read_text().split("\n")
    bad = 350  # 1-based line number, far past the first unit
    lines[bad - 1] = '{"tokens": [1, 2], "label": "x"}'
    path.write_text("\n".join(lines))
    assert len(units_of(path, 500)) > 10
    with pytest.raises(shardload.InputError, match=rf"a\.jsonl: line {bad}: field 'label'"):
        shardload.prepare(path, tmp_path / "out", unit_bytes=500, workers=2, progress=False)


def test_empty_lists_after_a_cut_take_the_shape_of_earlier_lines(tmp_path: Path) -> None:
    # an empty list takes the dtype and inner shape of the field's last non-empty list in the file
    rows = [{"pts": [[0.5, 1.0, 2.0]] * 3}] + [{"pts": []}] * 200 + [{"pts": [[1.5, 2.5, 3.5]]}]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    units = units_of(path, 300)
    assert len(units) > 3
    assert all(path.read_bytes()[u.part[0] :].startswith(b'{"pts": []}') for u in units[1:] if u.part)
    options = SourceOptions(unit_bytes=300)
    for unit in units:
        for _, sample in read_unit(unit, options):
            assert sample["pts"].dtype == np.float32 and sample["pts"].shape[1:] == (3,)
    out1, out2 = tmp_path / "o1", tmp_path / "o2"
    shardload.prepare(path, out1, unit_bytes=300, workers=2, num_shards=3, progress=False)
    shardload.prepare(path, out2, unit_bytes=1 << 30, num_shards=3, progress=False)
    assert all_samples(out1) == all_samples(out2)


def test_gzipped_jsonl_is_one_unit(tmp_path: Path) -> None:
    import gzip

    plain = write_jsonl(tmp_path / "a.jsonl", 200)
    gz = tmp_path / "b.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert len(units_of(plain, 500)) > 1
    assert [u.part for u in units_of(gz, 500)] == [None]


@pytest.mark.slow
def test_jsonl_output_is_the_same_bytes_for_any_worker_count(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", 3000, blank_every=11)
    outs = {}
    for workers in (1, 2):
        outs[workers] = tmp_path / f"w{workers}"
        shardload.prepare(path, outs[workers], unit_bytes=4000, workers=workers, num_shards=4, progress=False)
    assert shard_bytes(outs[1]) == shard_bytes(outs[2])
    whole = tmp_path / "whole"
    shardload.prepare(path, whole, unit_bytes=1 << 30, num_shards=4, progress=False)
    assert all_samples(whole) == all_samples(outs[2])  # the unit size changes no sample


# -- Parquet and Arrow IPC ----------------------------------------------------------------------------
def ragged_table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    tokens = [rng.integers(0, 1000, int(rng.integers(1, 30))).tolist() for _ in range(n)]
    # list<list<float>> with empty rows: an empty row takes the width of the last non-empty one of the file
    pts = [[[float(i)] * 2] * (i % 3 + 1) if i % 5 or i == 0 else [] for i in range(n)]
    return pa.table({"tokens": tokens, "pts": pts, "label": list(range(n))})


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_columnar_units_read_what_the_whole_file_holds(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardload.prepare.sources.columnar import _columns as columnar

    looked_back = []
    last_width = columnar._last_width
    monkeypatch.setattr(columnar, "_last_width", lambda arrays: looked_back.append(1) or last_width(arrays))
    table = ragged_table(500)
    path = tmp_path / f"a.{kind}"
    if kind == "parquet":
        pq.write_table(table, path, row_group_size=25)
    else:
        with pa.ipc.new_file(path, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=25):
                writer.write_batch(batch)
    units = units_of(path, 2000)
    assert len(units) > 3 and all(u.part is not None for u in units)
    assert units[0].first == 0 and sorted(u.first for u in units) == [u.first for u in units]
    got = located(path, 2000)
    assert looked_back  # units starting with an empty row took the width of the row before them
    assert got == located(path, 1 << 30)
    assert [w for w, _ in got] == [f"{path}: row {i}" for i in range(500)]


def test_arrow_stream_is_one_unit(tmp_path: Path) -> None:
    table = ragged_table(300)
    path = tmp_path / "a.arrow"
    with pa.ipc.new_stream(path, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=20):
            writer.write_batch(batch)
    assert [u.part for u in units_of(path, 500)] == [None]


def test_parquet_null_row_number_is_exact_in_a_later_unit(tmp_path: Path) -> None:
    tokens: list[list[int] | None] = [[i, i + 1] for i in range(400)]
    tokens[333] = None
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"tokens": tokens}), path, row_group_size=25)
    assert len(units_of(path, 300)) > 3
    with pytest.raises(shardload.InputError, match=r"row 333: column 'tokens' holds a null"):
        shardload.prepare(path, tmp_path / "out", unit_bytes=300, workers=2, progress=False)


@pytest.mark.slow
def test_parquet_output_is_the_same_bytes_for_any_worker_count(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(ragged_table(3000), path, row_group_size=100)
    outs = [tmp_path / "w1", tmp_path / "w2"]
    for workers, out in enumerate(outs, 1):
        shardload.prepare(path, out, unit_bytes=3000, workers=workers, num_shards=3, progress=False)
    assert shard_bytes(outs[0]) == shard_bytes(outs[1])


# -- resume -------------------------------------------------------------------------------------------
PREPARE = """
import sys, shardload
shardload.prepare(sys.argv[1], sys.argv[2], unit_bytes=3000, workers=int(sys.argv[3]), num_shards=3,
                  chunk_bytes=4000, progress=False, resume=True)
"""


def run_prepare(src: Path, out: Path, workers: int, kill_at: str | None = None) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SHARDLOAD_KILL_AT", None)
    if kill_at:
        env["SHARDLOAD_KILL_AT"] = kill_at
    cmd = [sys.executable, "-c", PREPARE, str(src), str(out), str(workers)]
    return subprocess.run(cmd, env=env, timeout=120, capture_output=True).returncode


@pytest.mark.slow
def test_resume_of_split_units_gives_the_uninterrupted_bytes(tmp_path: Path) -> None:
    # short lines, then long ones: the first units stage one chunk each, the later ones two
    path = tmp_path / "a.jsonl"
    lines = [{"tokens": [i, i], "label": i} for i in range(1500)]
    lines += [{"tokens": list(range(i, i + 100)), "label": i} for i in range(200)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    reference = tmp_path / "ref"
    assert run_prepare(path, reference, 1) == 0
    out = tmp_path / "out"
    assert run_prepare(path, out, 1, kill_at="staged:2") != 0  # killed at the first unit of long lines
    staged = list((out / ".prepare" / "staging").glob("*.done"))
    assert staged and len(staged) < len(units_of(path, 3000))
    assert run_prepare(path, out, 2) == 0
    assert shard_bytes(out) == shard_bytes(reference)
