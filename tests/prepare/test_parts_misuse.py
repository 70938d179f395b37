"""prepare --part K/N used as schedulers use it: a task rerun after it finished, files of unequal sizes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.errors import InputError, MergeError, OutputExistsError
from shardload.prepare.parts import part_dir, split_units
from shardload.prepare.sources import SourceUnit


def units_of_sizes(root: Path, sizes: list[int]) -> list[SourceUnit]:
    units = []
    for i, size in enumerate(sizes):
        path = root / f"{i:03d}.jsonl"
        path.write_bytes(b"x" * size)
        units.append(SourceUnit("jsonl", (str(path),)))
    return units


def test_no_part_is_empty_when_there_are_as_many_units(tmp_path: Path) -> None:
    # a big first file once took the middle part's share: parts [big], [], [two small] (one machine idle)
    parts = split_units(units_of_sizes(tmp_path, [1241, 660, 377]), 3)
    assert [len(p) for p in parts] == [1, 1, 1]


@pytest.mark.parametrize("seed", range(20))
def test_split_is_contiguous_and_fills_every_part_it_can(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 12))
    sizes = [int(s) for s in rng.integers(1, 5000, m) ** int(rng.integers(1, 3))]
    units = units_of_sizes(tmp_path, sizes)
    for n in range(1, 14):
        parts = split_units(units, n)
        assert len(parts) == n
        assert [u for p in parts for u in p] == units  # contiguous, in order, each unit once
        assert sum(1 for p in parts if not p) == max(0, n - m)  # only parts beyond the units are empty
        assert split_units(units, n) == parts  # deterministic


def write_sources(root: Path) -> list[str]:
    paths = []
    for i in range(3):
        path = root / f"d{i}.jsonl"
        path.write_text("".join(json.dumps({"tokens": list(range(j % 9 + 1))}) + "\n" for j in range(10 + 5 * i)))
        paths.append(str(path))
    return paths


def test_resume_of_a_finished_part_changes_nothing(tmp_path: Path) -> None:
    """A requeued array task (``--resume``, as the SLURM example runs it) whose part had finished: done, not an error."""
    sources, out = write_sources(tmp_path), tmp_path / "out"
    first = shardload.prepare(sources, out, part=(1, 2), resume=True, progress=False)
    part = part_dir(out, 1, 2)
    before = {p: p.read_bytes() for p in sorted(part.rglob("*")) if p.is_file()}
    again = shardload.prepare(sources, out, part=(1, 2), resume=True, progress=False)
    assert (again.samples, again.shards, again.tokens) == (first.samples, first.shards, first.tokens)
    assert {p: p.read_bytes() for p in sorted(part.rglob("*")) if p.is_file()} == before
    for k in (0,):
        shardload.prepare(sources, out, part=(k, 2), resume=True, progress=False)
    assert shardload.merge(out).samples == 10 + 15 + 20


def test_resume_of_a_finished_part_of_another_run_is_still_refused(tmp_path: Path) -> None:
    sources, out = write_sources(tmp_path), tmp_path / "out"
    shardload.prepare(sources, out, part=(1, 2), progress=False)
    with pytest.raises(OutputExistsError, match=r"no interrupted run to resume"):
        shardload.prepare(sources, out, part=(1, 2), resume=True, seed=5, progress=False)
    with pytest.raises(OutputExistsError, match=r"already holds a shard set"):
        shardload.prepare(sources, out, part=(1, 2), progress=False)  # without --resume: as before


def test_merge_says_a_part_stopped_on_bad_input_not_that_it_was_interrupted(tmp_path: Path) -> None:
    sources, out = write_sources(tmp_path), tmp_path / "out"
    bad = Path(sources[2])
    bad.write_text(bad.read_text() + '{"tokens": "not numbers"}\n')
    for k in (0, 1):
        shardload.prepare(sources, out, part=(k, 3), progress=False)
    with pytest.raises(InputError):
        shardload.prepare(sources, out, part=(2, 3), progress=False)
    with pytest.raises(MergeError, match=r"parts/00002-of-00003: stopped on bad input \(.*d2\.jsonl: line 21.*\)"):
        shardload.merge(out)


def test_a_copied_part_is_replaced_as_the_merge_says(tmp_path: Path) -> None:
    sources, out = write_sources(tmp_path), tmp_path / "out"
    shardload.prepare(sources, out, part=(0, 2), progress=False)
    shutil.copytree(part_dir(out, 0, 2), part_dir(out, 1, 2))
    with pytest.raises(MergeError, match=r"copied or renamed") as info:
        shardload.merge(out)
    # the merge's advice, followed, works (--resume of the copy was refused: it holds a finished set)
    assert "--part 1/2 --overwrite`" in str(info.value)
    shardload.prepare(sources, out, part=(1, 2), overwrite=True, progress=False)
    assert shardload.merge(out).samples == 45


def test_a_part_into_a_set_of_one_run_is_refused_before_it_is_prepared(tmp_path: Path) -> None:
    sources, out = write_sources(tmp_path), tmp_path / "out"
    shardload.prepare(sources, out, progress=False)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    # it once prepared the part into out/parts/ of that set, for a merge that refuses such an out
    with pytest.raises(OutputExistsError, match=r"holds a shard set prepared in one run .* part 0/2 could never"):
        shardload.prepare(sources, out, part=(0, 2), progress=False)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert len(shardload.open(out)) == 45


def test_a_part_with_damaged_origins_is_refused_before_out_is_touched(tmp_path: Path) -> None:
    sources, out = write_sources(tmp_path), tmp_path / "out"
    for k in range(2):
        shardload.prepare(sources, out, part=(k, 2), progress=False)
    (part_dir(out, 1, 2) / "origins.arrow").write_bytes(b"not an arrow file")
    with pytest.raises(MergeError, match=r"00001-of-00002.*origins\.arrow.*--overwrite"):
        shardload.merge(out)
    assert sorted(p.name for p in out.iterdir()) == ["parts"]  # nothing of the merge written


@pytest.mark.parametrize("record", [5, [1], "1/2"])
def test_a_part_whose_manifest_records_a_malformed_part_is_refused_by_name(tmp_path: Path, record: object) -> None:
    sources, out = write_sources(tmp_path), tmp_path / "out"
    for k in range(2):
        shardload.prepare(sources, out, part=(k, 2), progress=False)
    path = part_dir(out, 1, 2) / "manifest.json"
    obj = json.loads(path.read_text())
    obj["options"]["part"] = record
    path.write_text(json.dumps(obj))
    with pytest.raises(MergeError, match=rf"00001-of-00002: holds part {re.escape(repr(record))} .*copied or renamed"):
        shardload.merge(out)
