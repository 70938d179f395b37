"""The schedule of ingest (shardload.prepare.schedule): largest units first, the last ones in pieces.

The schedule decides only when each unit is read and by how many workers: the sets below are
compared with the sha256s of the same sets prepared by shardload before the schedule existed (every
unit read whole, in unit order), for workers 1 and 2, so that a cut or a join that changed a byte
of a shard, an index, the origins or the manifest fails here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.prepare import schedule
from shardload.prepare.schedule import plan_tasks
from shardload.prepare.sources import SourceOptions, SourceUnit, discover, read_unit

WORDS = ["shard", "load", "token", "pack", "rank", "batch", "length", "the", "a", "of"]


def write_corpus(path: Path, n: int, seed: int) -> Path:
    """``n`` JSON lines ``{"text": ..., "id": ...}`` of 0 to 60 words (some blank lines between)."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as fh:
        for i in range(n):
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(0, 61))))
            fh.write(json.dumps({"text": text, "id": i}) + "\n")
            if i % 97 == 5:
                fh.write("\n")
    return path


def encode(sample: dict[str, Any]) -> Any:
    """A map of the per-sample path: text -> bytes as int32 tokens, in pieces of at most 40; empty text dropped."""
    ids = np.frombuffer(sample["text"].encode(), dtype=np.uint8).astype(np.int32)
    if not len(ids):
        return None
    return [{"tokens": ids[i : i + 40], "id": np.int64(sample["id"])} for i in range(0, len(ids), 40)]


def set_digest(out: Path) -> str:
    """sha256 of every file of the set (the manifest without its creation time), by name."""
    h = hashlib.sha256()
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "manifest.json":
            manifest = json.loads(data)
            del manifest["created"]
            data = json.dumps(manifest, sort_keys=True).encode()
        h.update(f"{path.relative_to(out)}:{hashlib.sha256(data).hexdigest()};".encode())
    return h.hexdigest()


#: the sets of :func:`prepare_cases`, prepared by shardload before the schedule (same for workers 1 and 2)
BEFORE = {
    "plain": "167ee601f4bccb1303a351bf1a4b80a74c3564192c9e20fc5d48062cb47a3997",
    "mapped": "92d0702e6051d57561107c9ddcc4efbfdef3086f2b0eccb650713b3b39ee8a09",
}


def prepare_cases(root: Path, workers: int) -> dict[str, str]:
    """Prepare the cases into ``root`` (the working directory: the sources are named relative to it)."""
    write_corpus(root / "big.jsonl", 6000, seed=1)
    write_corpus(root / "small.jsonl", 900, seed=2)
    # units of about 80 kB, chunks of 30 kB: a unit has several chunks, which a join must cut where a whole read does
    common: dict[str, Any] = {"workers": workers, "progress": False, "unit_bytes": 80_000, "chunk_bytes": 30_000}
    got = {}
    shardload.prepare(["big.jsonl", "small.jsonl"], "plain", num_shards=3, **common)
    got["plain"] = set_digest(root / "plain")
    shardload.prepare(["big.jsonl", "small.jsonl"], "mapped", map=encode, num_shards=4, **common)
    got["mapped"] = set_digest(root / "mapped")
    return got


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of at least 4 kB, so that files of some hundred kB are cut as files of some hundred MB are."""
    monkeypatch.setattr(schedule, "MIN_PIECE_BYTES", 4096)


@pytest.mark.parametrize("workers", [1, 2])
def test_sets_are_the_bytes_of_before_the_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_pieces: None, workers: int
) -> None:
    monkeypatch.chdir(tmp_path)
    assert prepare_cases(tmp_path, workers) == BEFORE


def test_the_cases_are_cut_into_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_pieces: None) -> None:
    """What the comparison above covers: with 2 workers, units read in pieces, several chunks to a unit."""
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "big.jsonl", 6000, seed=1)
    write_corpus(tmp_path / "small.jsonl", 900, seed=2)
    options = SourceOptions(unit_bytes=80_000)
    units = discover(["big.jsonl", "small.jsonl"], options=options)
    sizes = [schedule.unit_bytes(u) for u in units]
    tasks = plan_tasks(units, sizes, 2)
    assert any(t.pieces > 1 for t in tasks) and any(t.pieces == 1 for t in tasks)
    assert max(sizes) > 2 * 30_000  # a unit holds more than two chunks of 30 kB of text


def corpus_units(tmp_path: Path, unit_bytes: int) -> tuple[list[SourceUnit], list[int]]:
    write_corpus(tmp_path / "a.jsonl", 3000, seed=3)
    units = discover([str(tmp_path / "a.jsonl")], options=SourceOptions(unit_bytes=unit_bytes))
    return units, [schedule.unit_bytes(u) for u in units]


def test_one_worker_reads_the_units_whole_in_order(tmp_path: Path, small_pieces: None) -> None:
    units, sizes = corpus_units(tmp_path, 50_000)
    tasks = plan_tasks(units, sizes, 1)
    assert [(t.unit, t.pieces, t.source) for t in tasks] == [(i, 1, u) for i, u in enumerate(units)]


def test_pieces_read_what_their_unit_reads(tmp_path: Path, small_pieces: None) -> None:
    """Every unit is read once, by its pieces in order, with the samples and line numbers of the unit's read."""
    units, sizes = corpus_units(tmp_path, 50_000)
    tasks = plan_tasks(units, sizes, 3)
    assert sorted((t.unit, t.piece) for t in tasks) == sorted(
        (t.unit, j) for t in tasks for j in range(t.pieces) if t.piece == 0
    )
    options = SourceOptions()
    for i, unit in enumerate(units):
        pieces = sorted((t for t in tasks if t.unit == i), key=lambda t: t.piece)
        read = [(w, dict(s)) for p in pieces for w, s in read_unit(p.source, options)]
        assert read == [(w, dict(s)) for w, s in read_unit(unit, options)]


def finish_times(sizes: list[float], workers: int) -> list[float]:
    """When each worker ends, handing tasks of ``sizes`` out in order to the first worker free."""
    free = [0.0] * workers
    for s in sizes:
        k = int(np.argmin(free))
        free[k] += s
    return free


def test_no_worker_idles_at_the_end_of_one_big_file(tmp_path: Path) -> None:
    """A 37 MiB file is units of 16, 16 and 5 MiB: read whole, one of 2 workers idles for the last 5 MiB."""
    path = tmp_path / "big.jsonl"
    line = json.dumps({"text": "x" * 1000}) + "\n"
    with open(path, "w") as fh:
        fh.write(line * ((37 << 20) // len(line)))
    units = discover([str(path)], options=SourceOptions())
    sizes = [schedule.unit_bytes(u) for u in units]
    assert len(units) == 3
    whole = finish_times([float(s) for s in sizes], 2)
    assert max(whole) - min(whole) > 4 << 20  # what the issue measured: one worker alone at the end
    tasks = plan_tasks(units, sizes, 2)
    times = finish_times([float(t.source.nbytes or sizes[t.unit]) for t in tasks], 2)
    assert max(times) - min(times) < 1.5 * schedule.MIN_PIECE_BYTES
    assert max(times) < 0.52 * sum(sizes)


def test_a_unit_an_interrupted_run_began_is_not_cut(tmp_path: Path, small_pieces: None) -> None:
    units, sizes = corpus_units(tmp_path, 50_000)
    cut = plan_tasks(units, sizes, 2)
    assert any(t.pieces > 1 for t in cut)
    kept = plan_tasks(units, sizes, 2, [False] * len(units))
    assert all(t.pieces == 1 for t in kept) and sorted(t.unit for t in kept) == list(range(len(units)))


def record_pid(sample: dict[str, Any]) -> dict[str, Any]:
    """A map that notes which process ran it."""
    with open(os.environ["SHARDLOAD_TEST_PIDS"], "a") as fh:
        fh.write(f"{os.getpid()}\n")
    return sample


def test_with_workers_the_map_runs_in_workers_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first sample, which the schema is taken from, is mapped in a worker: no user code runs in the main
    process before it forks (a tokenizer that used its threads there would have them turned off in the workers)."""
    monkeypatch.setenv("SHARDLOAD_TEST_PIDS", str(tmp_path / "pids"))
    src = [write_corpus(tmp_path / f"{k}.jsonl", 50, seed=k) for k in range(3)]
    result = shardload.prepare(src, tmp_path / "out", map=record_pid, workers=2, progress=False)
    pids = (tmp_path / "pids").read_text().split()
    assert len(pids) == result.samples + 1  # the first sample twice: for the schema, then staged
    assert str(os.getpid()) not in pids


@pytest.mark.parametrize("mapped", [False, True])
def test_prepare_does_not_import_pandas(tmp_path: Path, mapped: bool) -> None:
    """pandas (0.3 to 1 s to import) is not needed to read, map, stage or write: no process of prepare imports it."""
    write_corpus(tmp_path / "a.jsonl", 200, seed=4)
    code = (
        "import sys, shardload\n"
        "from tests.prepare.test_schedule import encode\n"
        f"shardload.prepare({str(tmp_path / 'a.jsonl')!r}, {str(tmp_path / 'out')!r}, progress=False, "
        f"map={'encode' if mapped else 'None'})\n"
        "print('pandas' in sys.modules)\n"
    )
    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


def fail_on_the_last(sample: dict[str, Any]) -> Any:
    """:func:`encode`, raising on record 5999 (the big file's last) while SHARDLOAD_TEST_FAIL is set."""
    if os.environ.get("SHARDLOAD_TEST_FAIL") and sample["id"] == 5999:
        raise ValueError("bad record")
    return encode(sample)


def test_a_resume_that_cuts_the_units_otherwise_gives_the_same_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_pieces: None
) -> None:
    """A run stopped with pieces staged, resumed with other workers (other pieces), makes the set of one run."""
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "big.jsonl", 6000, seed=1)
    write_corpus(tmp_path / "small.jsonl", 900, seed=2)
    common: dict[str, Any] = {"progress": False, "unit_bytes": 80_000, "chunk_bytes": 30_000, "map": fail_on_the_last}
    monkeypatch.setenv("SHARDLOAD_TEST_FAIL", "1")
    with pytest.raises(shardload.InputError, match=r"big\.jsonl: line \d+: the map function .* bad record"):
        shardload.prepare(["big.jsonl", "small.jsonl"], "out", workers=3, **common)
    staged = {p.name for p in (tmp_path / "out" / ".prepare" / "staging").iterdir()}
    assert any("." in name.split("-")[0] for name in staged)  # pieces were staged (u00000003.1234-5678-000000.arrow)
    monkeypatch.delenv("SHARDLOAD_TEST_FAIL")
    shardload.prepare(["big.jsonl", "small.jsonl"], "out", workers=2, resume=True, **common)
    shardload.prepare(["big.jsonl", "small.jsonl"], "fresh", workers=1, **common)
    assert set_digest(tmp_path / "out") == set_digest(tmp_path / "fresh")


def test_a_gzipped_file_is_read_whole(tmp_path: Path, small_pieces: None) -> None:
    import gzip

    data = write_corpus(tmp_path / "a.jsonl", 3000, seed=3).read_bytes()
    (tmp_path / "b.JSONL.GZ").write_bytes(gzip.compress(data))
    units = discover([str(tmp_path / "a.jsonl"), str(tmp_path / "b.JSONL.GZ")], options=SourceOptions())
    tasks = plan_tasks(units, [len(data), len(data) * 4], 2)  # the gzipped file the larger: cut, were it plain
    assert [(t.unit, t.pieces) for t in tasks if t.unit == 1] == [(1, 1)]
    assert any(t.pieces > 1 for t in tasks if t.unit == 0)
