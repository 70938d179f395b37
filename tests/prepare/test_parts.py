"""prepare --part K/N and merge: parts merged into one set equal a single prepare of the same input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.errors import InputError, MergeError, OutputExistsError
from shardload.formats.manifest import Manifest
from shardload.prepare.parts import parse_part, split_units
from shardload.prepare.sources import SourceUnit
from shardload.sets.describe import describe
from shardload.sets.verify import verify

REPO = Path(__file__).resolve().parents[2]


def write_sources(root: Path, files: int = 6) -> list[str]:
    """``files`` JSON Lines files of different sizes, samples of lengths 1..40."""
    rng = np.random.default_rng(7)
    paths = []
    for i in range(files):
        path = root / f"data-{i:02d}.jsonl"
        with open(path, "w") as fh:
            for _ in range(10 + 7 * i):
                n = int(rng.integers(1, 40))
                fh.write(json.dumps({"tokens": rng.integers(0, 1000, n).tolist(), "label": int(rng.integers(9))}))
                fh.write("\n")
        paths.append(str(path))
    return paths


OPTIONS = {"dtypes": {"tokens": "int32"}, "num_shards": 2}


def prepare_parts(sources: list[str], out: Path, n: int, **options: object) -> None:
    for k in range(n):
        shardload.prepare(sources, out, part=(k, n), **{**OPTIONS, **options})  # type: ignore[arg-type]


def samples_of(path: Path) -> list[tuple[list[int], int]]:
    ds = shardload.open(path)
    return [(ds[i]["tokens"].tolist(), int(ds[i]["label"])) for i in range(len(ds))]


@pytest.fixture
def sources(tmp_path: Path) -> list[str]:
    src = tmp_path / "src"
    src.mkdir()
    return write_sources(src)


# -- the split --------------------------------------------------------------------------------------
def test_split_is_contiguous_and_balanced_by_bytes(tmp_path: Path) -> None:
    sizes = [100, 100, 100, 700, 100, 100, 100, 100]
    units = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"{i}.jsonl"
        path.write_bytes(b"x" * size)
        units.append(SourceUnit("jsonl", (str(path),)))
    parts = split_units(units, 3)
    assert [u for p in parts for u in p] == units  # contiguous, in order, every unit once
    # thirds of 1400 bytes end at 467 and 933: the big unit (middle byte 650) fills the second alone,
    # the units after it (middles 1050..1350) are the third: 300, 700 and 400 bytes
    assert [len(p) for p in parts] == [3, 1, 4]
    assert split_units(units, 3) == parts  # deterministic
    many = split_units(units[:2], 5)
    assert sum(len(p) for p in many) == 2 and sum(1 for p in many if not p) == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [("3", "expected K/N"), ("a/b", "expected K/N"), ("3/3", r"K must be in 0\.\.2"), ("0/0", "N must be in")],
)
def test_bad_part_is_refused(value: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_part(value)


def test_part_as_tuple() -> None:
    assert parse_part((2, 5)) == parse_part("2/5") == (2, 5)
    with pytest.raises(InputError, match="two integers"):
        parse_part((1.0, 2))  # type: ignore[arg-type]


# -- parts + merge == one prepare ---------------------------------------------------------------------
def test_parts_merged_equal_one_prepare(sources: list[str], tmp_path: Path) -> None:
    out, single = tmp_path / "out", tmp_path / "single"
    prepare_parts(sources, out, 3, shuffle=False)
    result = shardload.merge(out)
    shardload.prepare(sources, single, shuffle=False, **OPTIONS)  # type: ignore[arg-type]
    assert (result.parts, result.changed) == (3, True)
    merged, one = shardload.open(out), shardload.open(single)
    assert len(merged) == len(one) == result.samples
    assert samples_of(out) == samples_of(single)  # same samples in the same order
    assert np.array_equal(np.asarray(merged.lengths), np.asarray(one.lengths))
    assert merged.manifest.total_tokens == one.manifest.total_tokens == result.tokens
    # origin: the source position of each sample, as one run numbers them
    assert np.array_equal(np.load(out / "origin.npy"), np.load(single / "origin.npy"))
    # every shard is a part's own file: nothing copied
    assert all(s.file.startswith("parts/") for s in merged.shards)
    assert not (out / "shards").exists()
    report = verify(out)
    assert report.ok, report.problems
    assert report.shards == len(merged.shards) == 6


def test_shuffled_parts_hold_the_same_samples(sources: list[str], tmp_path: Path) -> None:
    out, single = tmp_path / "out", tmp_path / "single"
    prepare_parts(sources, out, 4, seed=3)
    shardload.merge(out)
    shardload.prepare(sources, single, **OPTIONS)  # type: ignore[arg-type]
    got, want = samples_of(out), samples_of(single)
    assert got != want  # shuffled (within each part)
    assert sorted(map(str, got)) == sorted(map(str, want))
    ds = shardload.open(out)
    assert [len(t) for t, _ in got] == np.asarray(ds.lengths).tolist()


def test_merged_set_loads_and_plans(sources: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_parts(sources, out, 2)
    shardload.merge(out)
    loader = shardload.make_loader(out, max_tokens=256, num_workers=0, rank=0, world_size=1)
    seen = sorted(int(i) for batch in loader for i in batch["sample_id"])
    assert seen == list(range(len(shardload.open(out))))


def test_merge_twice_is_a_no_op(sources: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_parts(sources, out, 2)
    first = shardload.merge(out)
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    stamp = (out / "manifest.json").stat().st_mtime_ns
    again = shardload.merge(out)
    assert (first.changed, again.changed) == (True, False)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == files
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    # Removing the merged files and merging again gives the same bytes (created is the parts', not the clock's).
    for name in files:
        (out / name).unlink()
    shardload.merge(out)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == files


def test_more_parts_than_units(sources: list[str], tmp_path: Path) -> None:
    out, single = tmp_path / "out", tmp_path / "single"
    n = len(sources) + 3
    prepare_parts(sources, out, n, shuffle=False)
    empty = [k for k in range(n) if shardload.open(out / "parts" / f"{k:05d}-of-{n:05d}").manifest.total_samples == 0]
    assert len(empty) == 3
    assert verify(out / "parts" / f"{empty[0]:05d}-of-{n:05d}").ok
    result = shardload.merge(out)
    shardload.prepare(sources, single, shuffle=False, **OPTIONS)  # type: ignore[arg-type]
    assert result.parts == n and samples_of(out) == samples_of(single)
    info = describe(out)
    assert info["part_balance"]["parts"] == n and info["part_balance"]["samples"]["min"] == 0


def test_inspect_reports_the_parts(sources: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_parts(sources, out, 3)
    shardload.merge(out)
    info = describe(out)
    per_part = [shardload.open(p).manifest.total_samples for p in sorted((out / "parts").iterdir())]
    assert info["part_balance"]["samples"] == {"min": min(per_part), "max": max(per_part)}
    assert info["part_balance"]["shards"] == {"min": 2, "max": 2}
    assert "per part   3 parts" in shardload.sets.describe.format_description(info)


# -- refusals -------------------------------------------------------------------------------------------
@pytest.fixture
def three_parts(sources: list[str], tmp_path: Path) -> Path:
    out = tmp_path / "out"
    prepare_parts(sources, out, 3)
    return out


def test_missing_part_is_refused(three_parts: Path) -> None:
    shutil.rmtree(three_parts / "parts" / "00001-of-00003")
    with pytest.raises(MergeError, match=r"parts/00001-of-00003 is missing.*--part 1/3"):
        shardload.merge(three_parts)
    assert not (three_parts / "manifest.json").exists()


def test_uncommitted_part_is_refused(three_parts: Path) -> None:
    part = three_parts / "parts" / "00002-of-00003"
    (part / "manifest.json").unlink()
    (part / ".prepare").mkdir()
    with pytest.raises(MergeError, match=r"parts/00002-of-00003: was interrupted \(not committed\).*--resume"):
        shardload.merge(three_parts)


def test_part_of_another_part_count_is_refused(sources: list[str], three_parts: Path) -> None:
    shardload.prepare(sources, three_parts, part=(1, 4), **OPTIONS)  # type: ignore[arg-type]
    with pytest.raises(MergeError, match=r"parts/00001-of-00004 is a part of a run in 4 parts \(foreign"):
        shardload.merge(three_parts)


def test_part_of_another_run_is_refused(sources: list[str], three_parts: Path) -> None:
    shardload.prepare(sources, three_parts, part=(1, 3), overwrite=True, seed=5, **OPTIONS)  # type: ignore[arg-type]
    with pytest.raises(MergeError, match=r"parts/00001-of-00003: is from another run"):
        shardload.merge(three_parts)


def test_part_with_other_options_is_refused(three_parts: Path) -> None:
    # The same run id, but another schema (a part edited or written by another tool): named by what differs.
    path = three_parts / "parts" / "00002-of-00003"
    m = json.loads((path / "manifest.json").read_text())
    m["options"]["balance"] = "tokens"
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(MergeError, match=r"parts/00002-of-00003: was prepared with other options.*balance"):
        shardload.merge(three_parts)


def test_copied_part_is_refused(three_parts: Path) -> None:
    parts = three_parts / "parts"
    shutil.rmtree(parts / "00001-of-00003")
    shutil.copytree(parts / "00000-of-00003", parts / "00001-of-00003")
    with pytest.raises(MergeError, match=r"parts/00001-of-00003: holds part 0/3 .* copied or renamed"):
        shardload.merge(three_parts)
    (parts / "00000-of-00003").rename(parts / "000000-of-00003")  # the same part twice under two names
    shutil.copytree(parts / "000000-of-00003", parts / "00000-of-00003")
    with pytest.raises(MergeError, match=r"part 0/3 is there twice"):
        shardload.merge(three_parts)


def test_stray_folder_is_refused(three_parts: Path) -> None:
    (three_parts / "parts" / "notes").mkdir()
    with pytest.raises(MergeError, match=r"parts/notes: is not a part"):
        shardload.merge(three_parts)


def test_merge_never_replaces_a_set_of_one_run(sources: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    shardload.prepare(sources, out, **OPTIONS)  # type: ignore[arg-type]
    # prepare --part into such an out is refused (test_parts_misuse.py): parts copied in by hand
    shardload.prepare(sources, tmp_path / "other", part=(0, 1), **OPTIONS)  # type: ignore[arg-type]
    shutil.copytree(tmp_path / "other" / "parts", out / "parts")
    before = (out / "manifest.json").read_bytes()
    with pytest.raises(MergeError, match="already holds a shard set prepared in one run"):
        shardload.merge(out)
    assert (out / "manifest.json").read_bytes() == before
    with pytest.raises(MergeError, match="has no parts/ folder"):
        shardload.merge(tmp_path / "src")


def test_resume_of_a_merged_set_is_refused(sources: list[str], three_parts: Path) -> None:
    shardload.merge(three_parts)
    with pytest.raises(OutputExistsError, match=r"merged from 3 parts.*--part K/3 --resume"):
        shardload.prepare(sources, three_parts, resume=True, **OPTIONS)  # type: ignore[arg-type]


def test_a_swapped_shard_is_found(three_parts: Path) -> None:
    shardload.merge(three_parts)
    parts = sorted((three_parts / "parts").iterdir())
    a, b = parts[0] / "shards" / "shard-000000.arrow", parts[1] / "shards" / "shard-000000.arrow"
    a.write_bytes(b.read_bytes())
    report = verify(three_parts)
    assert report.damaged_shards == [0]
    assert {p.reason for p in report.problems} >= {"misplaced"}
    with pytest.raises(shardload.ShardSetError, match="shard 0"):
        shardload.open(three_parts)[0]


def test_manifest_parts_must_cover_the_shards(three_parts: Path) -> None:
    shardload.merge(three_parts)
    m = json.loads((three_parts / "manifest.json").read_text())
    m["parts"][1]["shards"] += 1
    with pytest.raises(shardload.ManifestError, match="part 1"):
        Manifest.from_json(m)


# -- a killed part ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_killed_part_is_finished_by_resume(sources: list[str], tmp_path: Path) -> None:
    out, single = tmp_path / "out", tmp_path / "single"
    args = [sys.executable, "-m", "shardload", "prepare", *sources, "-o", str(out), "--no-shuffle", "--no-progress"]
    args += ["--dtype", "tokens=int32", "--num-shards", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for k in (0, 2):
        subprocess.run([*args, "--part", f"{k}/3"], env=env, check=True, capture_output=True, timeout=120)
    killed = subprocess.run(
        [*args, "--part", "1/3"], env={**env, "SHARDLOAD_KILL_AT": "shard:1"}, capture_output=True, timeout=120
    )
    assert killed.returncode == -9
    with pytest.raises(MergeError, match=r"parts/00001-of-00003: was interrupted"):
        shardload.merge(out)
    subprocess.run([*args, "--part", "1/3", "--resume"], env=env, check=True, capture_output=True, timeout=120)
    shardload.merge(out)
    shardload.prepare(sources, single, shuffle=False, **OPTIONS)  # type: ignore[arg-type]
    assert samples_of(out) == samples_of(single)
    assert verify(out).ok


# -- the command line -------------------------------------------------------------------------------------
def test_cli_part_and_merge(sources: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardload.cli import main

    out = str(tmp_path / "out")
    assert main(["prepare", *sources, "-o", out, "--part", "0/2", "--no-progress", "--dtype", "tokens=int32"]) == 0
    assert "shardload merge" in capsys.readouterr().out
    assert main(["merge", out]) == 5
    assert "parts/00001-of-00002 is missing" in capsys.readouterr().err
    assert main(["prepare", *sources, "-o", out, "--part", "2/2"]) == 3
    assert "K must be in 0..1" in capsys.readouterr().err
    assert main(["prepare", *sources, "-o", out, "--part", "1/2", "--no-progress", "--dtype", "tokens=int32"]) == 0
    capsys.readouterr()
    assert main(["merge", out, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["parts"], result["changed"], result["samples"]) == (2, True, len(shardload.open(out)))
    assert main(["merge", out]) == 0
    assert "already merged, unchanged" in capsys.readouterr().out


def test_parts_of_one_big_file_split_into_units(tmp_path: Path) -> None:
    """One JSON Lines file split into byte-range units is spread over the parts by those units' own bytes."""
    src = tmp_path / "big.jsonl"
    with open(src, "w") as fh:
        for i in range(400):
            fh.write(json.dumps({"tokens": list(range(i % 30 + 1)), "label": i % 9}) + "\n")
    out, single = tmp_path / "out", tmp_path / "single"
    prepare_parts([str(src)], out, 3, shuffle=False, unit_bytes=4096)
    sizes = [len(shardload.open(p)) for p in sorted((out / "parts").iterdir())]
    assert all(s > 0 for s in sizes) and sum(sizes) == 400, sizes  # every part got a share of the one file
    shardload.merge(out)
    shardload.prepare([str(src)], single, shuffle=False, unit_bytes=4096, **OPTIONS)  # type: ignore[arg-type]
    assert samples_of(out) == samples_of(single)


def test_a_merged_set_tells_each_samples_origin(sources: list[str], tmp_path: Path) -> None:
    out, single = tmp_path / "out", tmp_path / "single"
    prepare_parts(sources, out, 3, shuffle=False)
    shardload.merge(out)
    shardload.prepare(sources, single, shuffle=False, **OPTIONS)  # type: ignore[arg-type]
    merged, one = shardload.open(out), shardload.open(single)
    origins = [merged.origin(i) for i in range(len(merged))]
    assert origins == [one.origin(i) for i in range(len(one))]
    assert origins[0].file == sources[0] and origins[0].kind == "line" and origins[-1].file == sources[-1]
