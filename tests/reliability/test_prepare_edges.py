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
