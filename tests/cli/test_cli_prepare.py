"""`shardload prepare`: options reach the library, results and errors come back right."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.cli import Exit


def test_prepare_npy_dir_json(cli, npy_dir, tmp_path) -> None:
    out = tmp_path / "out"
    r = cli(
        "prepare",
        npy_dir,
        "-o",
        out,
        "--field",
        "tokens",
        "--num-shards",
        "3",
        "--no-shuffle",
        "--dtype",
        "tokens=int32",
        "--json",
        "--no-progress",
    )
    assert r.code == 0, r.err
    result = r.json()
    assert result["samples"] == 60 and result["shards"] == 3 and result["path"] == str(out)
    ds = shardload.open(out)
    assert ds.schema.names == ("tokens",) and ds.schema.field("tokens").dtype == "int32"
    # --no-shuffle keeps source order: sample 0 is the first file
    np.testing.assert_array_equal(ds[0]["tokens"], np.load(sorted(npy_dir.iterdir())[0]))


def test_prepare_human_output_and_options(cli, npy_dir, tmp_path) -> None:
    out = tmp_path / "out"
    r = cli(
        "prepare",
        str(npy_dir / "*.npy"),
        "-o",
        out,
        "--shard-size",
        "1kB",
        "--balance",
        "tokens",
        "--seed",
        "3",
        "--workers",
        "2",
        "--no-progress",
    )
    assert r.code == 0, r.err
    assert r.out.startswith(f"prepared {out}: 60 samples in ") and "shardload.open(" in r.out
    m = json.loads((out / "manifest.json").read_text())
    assert len(m["shards"]) > 1  # 1 kB shards
    assert m["options"]["balance"] == "tokens" and m["options"]["seed"] == 3 and m["options"]["shuffle"] is True


def test_existing_output_is_exit_4(cli, npy_dir, shard_set) -> None:
    r = cli("prepare", npy_dir, "-o", shard_set, "--no-progress")
    assert r.code == Exit.OUTPUT == 4
    assert r.err.startswith("shardload: error: ") and "--overwrite" in r.err


def test_overwrite_replaces(cli, npy_dir, shard_set) -> None:
    r = cli("prepare", npy_dir, "-o", shard_set, "--overwrite", "--json", "--no-progress")
    assert r.code == 0 and r.json()["samples"] == 60


def test_bad_input_is_exit_3(cli, tmp_path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.arange(5, dtype=np.int64))
    np.save(src / "b.npy", np.arange(5, dtype=np.float32))  # dtype differs from the first sample
    r = cli("prepare", src, "-o", tmp_path / "out", "--no-progress")
    assert r.code == Exit.INPUT == 3
    last = r.err.splitlines()[-1]  # (progress log lines may precede it)
    assert last.startswith("shardload: error: ") and "b.npy" in last and "Traceback" not in r.err


def test_missing_source_is_exit_3(cli, tmp_path) -> None:
    r = cli("prepare", tmp_path / "nothing-here", "-o", tmp_path / "out")
    assert r.code == 3 and "no such file" in r.err


def test_usage_errors_are_exit_2(cli, npy_dir, tmp_path) -> None:
    out = tmp_path / "out"
    assert cli("prepare", npy_dir).code == 2  # no -o
    assert cli("prepare", npy_dir, "-o", out, "--shard-size", "lots").code == 2
    assert cli("prepare", npy_dir, "-o", out, "--dtype", "tokens").code == 2
    assert cli("prepare", npy_dir, "-o", out, "--dtype", "tokens=complex64").code == 2
    assert cli("prepare", npy_dir, "-o", out, "--resume", "--overwrite").code == 2
    r = cli("prepare", npy_dir, "-o", out, "--workers", "0")
    assert r.code == 2 and "at least 1" in r.err
    assert not out.exists()


@pytest.fixture
def in_map_dir(tmp_path, monkeypatch) -> Path:
    """The current directory holds ``evens.py``, as for a user's map; the current directory is not on sys.path."""
    (tmp_path / "evens.py").write_text(
        "def keep(sample):\n    return sample if len(sample['tokens']) % 2 == 0 else None\n\nNOT_A_FUNCTION = 3\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "evens", raising=False)
    return tmp_path


def test_prepare_map_from_the_current_directory_reports_drops(cli, npy_dir, in_map_dir) -> None:
    odd = sum(len(np.load(p)) % 2 for p in npy_dir.iterdir())
    args = ("prepare", npy_dir, "--field", "tokens", "--map", "evens:keep", "--no-progress")
    r = cli(*args, "-o", in_map_dir / "out")
    assert r.code == 0, r.err
    assert f"the map dropped {odd} records" in r.out
    r = cli(*args, "-o", in_map_dir / "out2", "--json")
    assert r.json()["dropped"] == odd > 0 and r.json()["samples"] == 60 - odd
    assert all(len(shardload.open(in_map_dir / "out2")[i]["tokens"]) % 2 == 0 for i in range(60 - odd))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("evens", "name the function as MODULE:FUNCTION"),
        ("nowhere:keep", "no module named 'nowhere'"),
        ("evens:kept", "evens has no attribute 'kept'"),
        ("evens:NOT_A_FUNCTION", "is a int, not a function"),
    ],
)
def test_prepare_bad_map_is_exit_3(cli, npy_dir, in_map_dir, spec, message) -> None:
    r = cli("prepare", npy_dir, "-o", in_map_dir / "out", "--map", spec, "--no-progress")
    assert r.code == Exit.INPUT and message in r.err and f"--map {spec!r}" in r.err
    assert not (in_map_dir / "out").exists()


def test_one_shard_reads_in_the_singular(cli, npy_dir, tmp_path) -> None:
    out = tmp_path / "out"
    r = cli("prepare", npy_dir, "-o", out, "--field", "tokens", "--num-shards", "1", "--no-progress")
    assert r.code == 0, r.err
    assert "60 samples in 1 shard," in r.out
    r = cli("inspect", out)
    assert "in 1 shard," in r.out
    per_shard = next(line for line in r.out.splitlines() if line.startswith("per shard"))
    size = per_shard.split("bytes ")[1]
    assert "-" not in size  # one shard: its size once, not "135.8 MB-135.8 MB"


def test_unit_size_reaches_the_library(cli, tmp_path, monkeypatch) -> None:
    from shardload.prepare.sources import jsonl

    cuts = []
    line_cuts = jsonl.line_cuts
    monkeypatch.setattr(jsonl, "line_cuts", lambda *a: cuts.append(a[2]) or line_cuts(*a))
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"tokens": list(range(i % 9 + 1))}) + "\n" for i in range(300)))
    r = cli("prepare", src, "-o", tmp_path / "out", "--unit-size", "1k", "--workers", "2", "--no-progress", "--json")
    assert r.code == 0, r.err
    assert r.json()["samples"] == 300 and cuts == [1024]
    r = cli("prepare", src, "-o", tmp_path / "o2", "--unit-size", "0", "--no-progress")
    assert r.code != 0


def test_a_shard_set_as_source_is_named(cli, shard_set, tmp_path) -> None:
    r = cli("prepare", shard_set, "-o", tmp_path / "again", "--no-progress")
    assert r.code == Exit.INPUT
    assert "is already a shard set" in r.err and "shardload.open(" in r.err and "cannot tell" not in r.err


def write_jsonl(path: Path, lines: int) -> Path:
    path.write_text("".join(json.dumps({"tokens": list(range(i % 9 + 1))}) + "\n" for i in range(lines)))
    return path


def test_a_run_that_finds_the_work_done_prints_no_rate(cli, tmp_path) -> None:
    """A finished part resumed printed ``(0.0 s, 0.0 MB/s, 40,000,000,000 samples/s)``: a rate of no time."""
    src = write_jsonl(tmp_path / "d.jsonl", 40)
    out = tmp_path / "out"
    assert cli("prepare", src, "-o", out, "--part", "1/3", "--no-progress").code == 0
    r = cli("prepare", src, "-o", out, "--part", "1/3", "--resume", "--no-progress")
    assert r.code == 0, r.err
    # Invariant: no rate is printed for a run that did no work; it says the part was prepared before
    assert "samples/s" not in r.out and "MB/s" not in r.out and "already prepared by an earlier run" in r.out
    r = cli("prepare", src, "-o", out, "--part", "1/3", "--resume", "--no-progress", "--json")
    assert r.json()["samples_per_s"] == 0 and r.json()["input_mb_per_s"] == 0


def test_every_warning_of_the_run_reaches_json_warnings(cli, tmp_path) -> None:
    """The --unit-size warning went to stderr while ``--json`` said ``"warnings": []``."""
    src = write_jsonl(tmp_path / "a.jsonl", 30)  # over 256 bytes: --unit-size 1 is raised, with a warning
    r = cli("prepare", src, "-o", tmp_path / "out", "--unit-size", "1", "--num-shards", "40", "--json")
    assert r.code == 0, r.err
    warnings = r.json()["warnings"]
    # Invariant: each warning the run logged is in the result, once
    assert len(warnings) == 2, warnings
    assert any("--unit-size 1 B" in w for w in warnings) and any("num_shards" in w for w in warnings)
    r = cli("prepare", src, "-o", tmp_path / "quiet", "--json")
    assert r.json()["warnings"] == []


def test_a_part_number_that_starts_with_a_dash_says_how_to_write_it(cli, tmp_path) -> None:
    """``--part -1/3`` is read by argparse as an option: the message says to join it, which is then exit 3."""
    src = write_jsonl(tmp_path / "d.jsonl", 10)
    r = cli("prepare", src, "-o", tmp_path / "out", "--part", "-1/3", "--no-progress")
    assert r.code == Exit.USAGE
    # Invariant: the usage error says how to give a value that starts with '-'
    assert "--part=" in r.err, r.err
    r = cli("prepare", src, "-o", tmp_path / "out", "--part=-1/3", "--no-progress")
    assert r.code == Exit.INPUT and "expected K/N" in r.err


@pytest.mark.parametrize("killed", [False, True])
def test_overwriting_a_merged_set_leaves_none_of_its_parts(cli, tmp_path, killed) -> None:
    """``prepare -o OUT --overwrite`` of a merged set left ``OUT/parts/`` (the old set's shards) behind."""
    src = write_jsonl(tmp_path / "d.jsonl", 40)
    out = tmp_path / "out"
    for k in range(3):
        assert cli("prepare", src, "-o", out, "--part", f"{k}/3", "--no-progress").code == 0
    assert cli("merge", out).code == 0
    if killed:  # stopped right after the old manifest went: the resumed commit must still know whose parts they were
        import os
        import signal
        import subprocess

        from shardload._base.envvars import KILL_AT

        repo = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": str(repo), KILL_AT: "commit:old-invalidated"}
        argv = [sys.executable, "-m", "shardload", "prepare", str(src), "-o", str(out), "--overwrite", "--no-progress"]
        assert subprocess.run(argv, env=env, timeout=60, capture_output=True).returncode == -signal.SIGKILL
        r = cli("prepare", src, "-o", out, "--resume", "--no-progress")
    else:
        r = cli("prepare", src, "-o", out, "--overwrite", "--no-progress")
    assert r.code == 0, r.err
    # Invariant: after an overwrite OUT holds the new set and nothing of the old one
    assert not (out / "parts").exists()
    assert len(shardload.open(out)) == 40 and not shardload.open(out).manifest.parts
