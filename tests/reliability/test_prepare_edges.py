"""prepare's edges: a part redone into a merged set, a unit size too small to be useful, compressed bombs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardload
from shardload.errors import OutputExistsError, ShardSetError
from tests.prepare.test_parts_misuse import write_sources


def merged_set(root: Path) -> tuple[list[str], Path]:
    sources, out = write_sources(root), root / "out"
    for k in range(3):
        shardload.prepare(sources, out, part=(k, 3), progress=False)
    shardload.merge(out)
    return sources, out


def files_of(out: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("order", ["reversed", "rotated"])
def test_a_part_of_another_run_into_a_merged_set_is_refused_before_anything_changes(tmp_path: Path, order: str) -> None:
    """Sources in another order make another run: its part could never merge with the others, so none is written."""
    sources, out = merged_set(tmp_path)
    before = files_of(out)
    other = sources[::-1] if order == "reversed" else sources[1:] + sources[:1]
    with pytest.raises(OutputExistsError, match=r"merged from 3 parts of another run.*same sources in the same order"):
        shardload.prepare(other, out, part=(1, 3), overwrite=True, progress=False)
    # Invariant: a refused part leaves the merged set byte for byte as it was, and loadable
    assert files_of(out) == before
    assert len(shardload.open(out)) == 45


def test_a_part_redone_with_other_data_leaves_a_set_that_says_merge_again(tmp_path: Path) -> None:
    """Same command, changed input: the part is replaced, and the merged set says to merge again, then loads."""
    sources, out = merged_set(tmp_path)
    Path(sources[1]).write_text("".join(json.dumps({"tokens": [7] * (j % 5 + 1)}) + "\n" for j in range(15)))
    shardload.prepare(sources, out, part=(1, 3), overwrite=True, progress=False)
    # Invariant: never a set whose shards contradict its manifest; loading names the command that fixes it
    with pytest.raises(ShardSetError, match=r"parts.*shardload merge"):
        ds = shardload.open(out)
        [ds[i] for i in range(len(ds))]
    shardload.merge(out)
    assert len(shardload.open(out)) == 45


def test_the_same_part_redone_keeps_the_merged_set(tmp_path: Path) -> None:
    sources, out = merged_set(tmp_path)
    shardload.prepare(sources, out, part=(1, 3), overwrite=True, progress=False)
    # Invariant: the same command and input give the same part, so the merged set stays whole
    assert len(shardload.open(out)) == 45


# -- a unit size too small to be useful -----------------------------------------------------------------
def test_a_tiny_unit_size_makes_a_bounded_number_of_units_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--unit-size 1`` once cut a 1.6 MB file into a unit per line (20,000: minutes instead of a second)."""
    from shardload.prepare.sources import MAX_UNITS_PER_FILE, SourceOptions, discover

    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"tokens": list(range(i % 40 + 1))}) + "\n" for i in range(4000)))
    with caplog.at_level("WARNING", logger="shardload.prepare"):
        units = discover([src], options=SourceOptions(unit_bytes=1))
    # Invariant: one file is cut into at most MAX_UNITS_PER_FILE units, whatever --unit-size asks
    assert 1 < len(units) <= MAX_UNITS_PER_FILE
    assert sum(u.nbytes for u in units) == src.stat().st_size
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "--unit-size 1 B" in warning and f"at most {MAX_UNITS_PER_FILE} units" in warning and "a.jsonl" in warning
    # Invariant: the samples are those of one unit, in order
    whole = tmp_path / "whole"
    shardload.prepare(src, whole, shuffle=False, progress=False)
    cut = tmp_path / "cut"
    shardload.prepare(src, cut, shuffle=False, unit_bytes=1, progress=False)
    a, b = shardload.open(whole), shardload.open(cut)
    assert [list(a[i]["tokens"]) for i in range(len(a))] == [list(b[i]["tokens"]) for i in range(len(b))]


def test_the_unit_cap_bounds_parquet_row_group_runs_too(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardload.prepare.sources import MAX_UNITS_PER_FILE, SourceOptions, discover

    src = tmp_path / "a.parquet"
    table = pa.table({"tokens": [list(range(i % 7 + 1)) for i in range(3000)]})
    pq.write_table(table, src, row_group_size=5)  # 600 row groups
    units = discover([src], options=SourceOptions(unit_bytes=1))
    # Invariant: a file of many row groups is cut into at most MAX_UNITS_PER_FILE runs of them
    assert 1 < len(units) <= MAX_UNITS_PER_FILE


# -- compressed sources that decode to gigabytes ----------------------------------------------------------
def write_bomb(path: Path, values: int) -> Path:
    """One row holding ``values`` zeros (int64), zstd-compressed: a few KB on disk, ``8 * values`` bytes decoded."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    column = pa.ListArray.from_arrays(pa.array([0, values], pa.int32()), pa.array(np.zeros(values, np.int64)))
    table = pa.table({"tokens": column})
    if path.suffix == ".parquet":
        pq.write_table(table, path, compression="zstd")
    elif path.suffix == ".feather":
        feather.write_feather(table, path, compression="zstd")
    else:
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_stream(path, table.schema, options=options) as writer:
            writer.write_table(table)
    return path


@pytest.mark.parametrize("name", ["bomb.parquet", "bomb.feather", "bomb.arrow"])
def test_a_piece_that_decodes_beyond_the_bound_is_refused_before_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Parquet row, Feather (IPC file) and IPC stream record batch: sizes from the metadata, nothing decoded."""
    from shardload.errors import InputError

    src = write_bomb(tmp_path / name, 4_000_000)
    assert src.stat().st_size < 64_000
    monkeypatch.setenv("SHARDLOAD_MAX_DECODED_BYTES", "16MiB")
    # Invariant: the file, what it decodes to and the setting to raise are named; nothing is written
    with pytest.raises(InputError, match=rf"{name}: .* decodes to 32,000,0\d\d bytes .* SHARDLOAD_MAX_DECODED_BYTES="):
        shardload.prepare(src, tmp_path / "out", progress=False)
    monkeypatch.setenv("SHARDLOAD_MAX_DECODED_BYTES", "64MiB")
    # Invariant: raised as the message says, the same file is read, value for value
    ds = shardload.open(shardload.prepare(src, tmp_path / "out", progress=False).path)
    assert len(ds) == 1 and len(ds[0]["tokens"]) == 4_000_000 and not ds[0]["tokens"].any()


BOMB_JOB = """
import resource, sys
cap = int(1.5 * 2**30)
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
from shardload.cli import main
sys.exit(main(["prepare", sys.argv[1], "-o", sys.argv[2], "--no-progress"]))
"""


def run_capped(src: Path, out: Path) -> tuple[int, str]:
    """``shardload prepare src -o out`` in a process of at most 1.5 GiB of address space (watchdog: 120 s)."""
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", BOMB_JOB, str(src), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(Path(shardload.__file__).parent.parent)},
    )
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, err


def test_bombs_under_a_memory_cap_are_named_never_corrupt_or_exit_70(tmp_path: Path) -> None:
    """A 20 KB zstd Feather of 2 GB and a 4 KB Parquet dictionary column of 1.9 GB, in 1.5 GiB of address space."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    feather = write_bomb(tmp_path / "bomb.feather", 250_000_000)
    code, err = run_capped(feather, tmp_path / "o1")
    # Invariant: refused from the metadata, by name, with the setting: exit 3, not "corrupt", not 70
    assert code == 3, err
    assert "bomb.feather: record batch 0 decodes to 2,000,000,008 bytes" in err and "SHARDLOAD_MAX_DECODED_BYTES" in err
    assert "corrupt" not in err

    # a dictionary column: one 95 MB value for 20 rows; the metadata gives the dictionary's size only
    value = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(),
        1,
        [None, pa.array([0, 95_000_000], pa.int64()).buffers()[1], pa.py_buffer(np.zeros(95_000_000, np.uint8))],
    )
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(20, np.int32)), value)
    parquet = tmp_path / "dict.parquet"
    pq.write_table(pa.table({"text": column}), parquet, compression="zstd")
    code, err = run_capped(parquet, tmp_path / "o2")
    # Invariant: memory running out is named as that, with the file and the settings: never exit 70, never "corrupt"
    assert code == 3, err
    assert "dict.parquet: ran out of memory" in err and "SHARDLOAD_MAX_DECODED_BYTES" in err
    assert "corrupt" not in err


def test_a_memory_error_anywhere_in_prepare_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardload.errors import OutputError
    from shardload.prepare import pipeline

    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(pipeline, "lay_out", no_memory)
    # Invariant: a MemoryError is an OutputError (exit 4) naming memory and the settings that bound it
    with pytest.raises(OutputError, match=r"prepare ran out of memory .* --workers .* SHARDLOAD_MAX_DECODED_BYTES"):
        shardload.prepare(write_sources(tmp_path), tmp_path / "out", progress=False)


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_compressed_tables_read_as_before(tmp_path: Path, compression: str) -> None:
    """Row groups of dictionary text and lists, record batches with dictionaries: every value as written."""
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    rows = 5000
    table = pa.table(
        {
            "tokens": [list(range(i % 13)) for i in range(rows)],
            "label": pa.array([f"l{i % 3}" for i in range(rows)]).dictionary_encode(),
            "x": [float(i) for i in range(rows)],
        }
    )
    pq.write_table(table, tmp_path / "a.parquet", compression=compression, row_group_size=700)
    feather.write_feather(
        table,
        tmp_path / "a.feather",
        compression=compression if compression != "none" else "uncompressed",
        chunksize=900,
    )
    for name in ("a.parquet", "a.feather"):
        ds = shardload.open(
            shardload.prepare(tmp_path / name, tmp_path / f"out-{name}", shuffle=False, progress=False).path
        )
        # Invariant: every value as written, in order
        assert [list(ds[i]["tokens"]) for i in range(rows)] == table.column("tokens").to_pylist()
        assert [ds[i]["label"] for i in range(rows)] == table.column("label").to_pylist()
        assert [float(ds[i]["x"][()]) for i in range(rows)] == table.column("x").to_pylist()
