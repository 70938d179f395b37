"""Staged chunks are written without fsync, and trusted by a resume only on the boot that wrote them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import shardload
from shardload._base import output
from shardload.prepare import bootmark, workdir

from .test_same_bytes import set_digest

REPO = Path(__file__).resolve().parents[2]
OPTIONS: dict[str, Any] = {"unit_bytes": 20_000, "chunk_bytes": 8_000, "num_shards": 2}


def write_source(path: Path, n: int = 400) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write('{"tokens": [' + ", ".join(str((i * 7 + j) % 1000) for j in range(i % 50 + 1)) + "]}\n")
    return path


def fsynced_paths(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    paths: list[Path] = []
    real = output.fsync_file

    def recording(path: Path) -> None:
        paths.append(Path(path))
        real(path)

    monkeypatch.setattr(output, "fsync_file", recording)
    return paths


def staged_inodes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in (out / ".prepare" / "staging").glob("*.arrow")}


def killed_while_staging(src: Path, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path]), "SHARDLOAD_KILL_AT": "staged:2"}
    script = "import sys, shardload; shardload.prepare(sys.argv[1], sys.argv[2], progress=False, **eval(sys.argv[3]))"
    code = subprocess.run([sys.executable, "-c", script, str(src), str(out), repr(OPTIONS)], env=env, timeout=120)
    assert code.returncode == -signal.SIGKILL
    assert staged_inodes(out), "killed before any chunk was staged"


@pytest.mark.skipif(bootmark.boot_id() is None, reason="this system gives no boot id: staged files are fsynced")
def test_staged_files_are_not_fsynced_where_the_boot_is_known(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_source(tmp_path / "a.jsonl")
    paths = fsynced_paths(monkeypatch)
    shardload.prepare(src, tmp_path / "out", progress=False, **OPTIONS)
    staged = [p for p in paths if p.parent.name == "staging" and bootmark.MARK not in p.name]
    assert staged == [], f"staged files were fsynced: {staged}"
    assert [p for p in paths if bootmark.MARK in p.name], "the mark, written before any chunk, is durable"
    # what the set is made of still is, each file before its rename
    assert sum(p.parent.name == "shards" for p in paths) == 2


def test_without_a_boot_id_staged_files_are_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bootmark, "boot_id", lambda: None)
    src = write_source(tmp_path / "a.jsonl")
    paths = fsynced_paths(monkeypatch)
    shardload.prepare(src, tmp_path / "out", progress=False, **OPTIONS)
    staged = {p.name for p in paths if p.parent.name == "staging"}
    chunks = {p.name for p in paths if p.suffix == ".tmp" and p.parent.name == "staging"}
    assert chunks and any(name.endswith(".done") or ".done" in name for name in staged)
    assert not (tmp_path / "out" / ".prepare").exists()


@pytest.mark.parametrize(
    ("case", "kept"),
    [("same boot", True), ("another boot", False), ("no mark (an older shardload)", True), ("damaged mark", False)],
)
def test_a_resume_keeps_staged_chunks_only_from_this_boot(
    case: str, kept: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_source(tmp_path / "a.jsonl")
    whole = tmp_path / "whole"
    shardload.prepare(src, whole, progress=False, **OPTIONS)
    out = tmp_path / "out"
    killed_while_staging(src, out)
    mark = out / ".prepare" / "staging" / bootmark.MARK
    if bootmark.boot_id() is not None:
        assert mark.read_text().strip() == bootmark.boot_id()
    if case == "another boot":
        monkeypatch.setattr(bootmark, "boot_id", lambda: "another-boot")
    elif case == "no mark (an older shardload)":
        mark.unlink()
    elif case == "damaged mark":
        mark.write_bytes(b"\xff\xfe")
    before = staged_inodes(out)
    after: dict[str, int] = {}
    real = bootmark.mark_staging

    def watching(staging: Path) -> None:  # what the resume finds once the staging is marked
        real(staging)
        after.update(staged_inodes(staging.parents[1]))

    monkeypatch.setattr(workdir, "mark_staging", watching)
    shardload.prepare(src, out, progress=False, resume=True, **OPTIONS)
    assert (after == before) is kept and (after == {}) is not kept
    assert set_digest(out)[0] == set_digest(whole)[0]  # the uninterrupted run's set, byte for byte


def test_a_run_that_staged_nothing_leaves_nothing_to_resume(tmp_path: Path) -> None:
    """The mark alone is not staged work: a run stopped before its first chunk is simply run again."""
    src = tmp_path / "a.jsonl"
    src.write_text('{"tokens": [1, 2]}\n{"tokens": "two"}\n')
    with pytest.raises(shardload.ShardloadError, match="line 2"):
        shardload.prepare(src, tmp_path / "out", progress=False)
    src.write_text('{"tokens": [1, 2]}\n{"tokens": [3]}\n')
    assert shardload.prepare(src, tmp_path / "out", progress=False).samples == 2
