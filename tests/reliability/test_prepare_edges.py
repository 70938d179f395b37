"""prepare's edges: a part redone into a merged set, a unit size too small to be useful, compressed bombs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardload
from shardload.errors import OutputExistsError, ShardSetError


def write_sources(root: Path) -> list[str]:
    paths = []
    for i in range(3):
        path = root / f"d{i}.jsonl"
        path.write_text("".join(json.dumps({"tokens": list(range(j % 9 + 1))}) + "\n" for j in range(10 + 5 * i)))
        paths.append(str(path))
    return paths


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
