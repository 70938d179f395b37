"""shardload.sets.verify: every kind of damage is reported against the right shard, never raised."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import shardload
from shardload._base.checksum import file_checksum
from shardload._base.identity import ShardIdentity
from shardload.errors import ManifestError
from shardload.formats.arrow import ArrowOptions, ArrowShardReader, ArrowShardWriter
from shardload.sets.verify import REASONS, Problem, recompute_lengths, verify


@pytest.fixture
def shard_set(damageable_set: Path) -> Path:
    """A private copy of the set, free to damage."""
    return damageable_set


def manifest_of(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def shard_path(path: Path, k: int) -> Path:
    return path / manifest_of(path)["shards"][k]["file"]


def reasons(report, shard: int | None) -> set[str]:
    return {p.reason for p in report.problems if p.shard == shard}


def test_clean_set_verifies(shard_set: Path) -> None:
    report = verify(shard_set)
    assert report.ok and report.problems == ()
    assert (report.shards, report.samples) == (4, 200)
    # every byte of every shard was read
    assert report.bytes == sum(s["bytes"] for s in manifest_of(shard_set)["shards"])
    assert report.to_json()["ok"] is True


def test_flipped_byte_is_a_checksum_mismatch_of_that_shard(shard_set: Path) -> None:
    path = shard_path(shard_set, 2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    report = verify(shard_set)
    assert not report.ok
    assert "checksum_mismatch" in reasons(report, 2)
    assert report.damaged_shards == [2]
    line = next(str(p) for p in report.problems if p.reason == "checksum_mismatch")
    assert line.startswith("shard 2 (shards/") and "checksum_mismatch" in line


def test_truncated_shard(shard_set: Path) -> None:
    path = shard_path(shard_set, 1)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    report = verify(shard_set)
    assert "truncated" in reasons(report, 1)
    assert report.damaged_shards == [1]


def test_grown_shard_is_a_size_mismatch(shard_set: Path) -> None:
    path = shard_path(shard_set, 0)
    with open(path, "ab") as fh:
        fh.write(b"\0" * 16)
    assert "size_mismatch" in reasons(verify(shard_set), 0)


def test_deleted_shard_is_missing(shard_set: Path) -> None:
    shard_path(shard_set, 3).unlink()
    report = verify(shard_set)
    assert reasons(report, 3) == {"missing"}
    assert report.damaged_shards == [3]


def test_shard_linked_from_outside_the_set_is_not_read(shard_set: Path, tmp_path: Path) -> None:
    path = shard_path(shard_set, 1)
    outside = tmp_path / "elsewhere.arrow"
    shutil.move(path, outside)
    path.symlink_to(outside)  # identical bytes, but outside the set
    report = verify(shard_set)
    assert reasons(report, 1) == {"outside_set"}
    assert report.bytes == sum(s["bytes"] for i, s in enumerate(manifest_of(shard_set)["shards"]) if i != 1)


def test_directory_in_place_of_a_shard_is_unreadable(shard_set: Path) -> None:
    path = shard_path(shard_set, 2)
    path.unlink()
    path.mkdir()
    assert reasons(verify(shard_set), 2) == {"unreadable"}


def test_every_damaged_shard_is_listed_in_one_run(shard_set: Path) -> None:
    shard_path(shard_set, 0).unlink()
    shard_path(shard_set, 3).write_bytes(b"not arrow")
    report = verify(shard_set)
    assert report.damaged_shards == [0, 3]
    assert reasons(report, 3) >= {"truncated", "unreadable"}


def test_edited_lengths_index_is_a_lengths_mismatch(shard_set: Path) -> None:
    lengths = np.load(shard_set / "lengths.npy")
    lengths[120] += 3
    np.save(shard_set / "lengths.npy", lengths)
    report = verify(shard_set)
    shard = int(np.searchsorted(np.cumsum([s["samples"] for s in manifest_of(shard_set)["shards"]]), 120, "right"))
    assert "lengths_mismatch" in reasons(report, shard)
    detail = next(p.detail for p in report.problems if p.shard == shard)
    assert "sample 120" in detail
    # the total no longer matches either: a set-level problem naming the index file
    assert any(p.shard is None and p.file == "lengths.npy" for p in report.problems)


def test_edited_per_field_index_is_a_lengths_mismatch(shard_set: Path) -> None:
    name = manifest_of(shard_set)["lengths"]["per_field"]["features"]
    lengths = np.load(shard_set / name)
    lengths[5] += 1
    np.save(shard_set / name, lengths)
    report = verify(shard_set)
    assert [p.reason for p in report.problems] == ["lengths_mismatch"]
    assert name in report.problems[0].detail


def test_short_or_missing_lengths_index(shard_set: Path) -> None:
    np.save(shard_set / "lengths.npy", np.load(shard_set / "lengths.npy")[:-1])
    report = verify(shard_set)
    assert [(p.shard, p.reason) for p in report.problems] == [(None, "lengths_mismatch")]
    (shard_set / "lengths.npy").unlink()
    report = verify(shard_set)
    assert [(p.shard, p.file, p.reason) for p in report.problems] == [(None, "lengths.npy", "missing")]


def test_consistent_file_with_wrong_count(shard_set: Path) -> None:
    # A shard rewritten with one sample less, whose size and checksum were "fixed up" in
    # the manifest: only opening it shows that it is short.
    m = manifest_of(shard_set)
    schema = shardload.open(shard_set).schema
    path = shard_path(shard_set, 1)
    reader = ArrowShardReader(path, schema)
    cols = reader.columns()
    short = cols.take(np.arange(cols.num_samples - 1))
    identity = ShardIdentity.parse(reader.stored_identity, where="1")  # still in its place: only the count is wrong
    path.unlink()
    ArrowShardWriter(schema, ArrowOptions()).write(path, short, identity=identity)
    m["shards"][1].update(bytes=path.stat().st_size, checksum=file_checksum(path))
    (shard_set / "manifest.json").write_text(json.dumps(m))
    assert reasons(verify(shard_set), 1) == {"wrong_count"}


@pytest.mark.parametrize("end", [0, -1], ids=["offsets start after the values", "offsets end before them"])
def test_offsets_that_do_not_fit_the_values_are_found_as_the_loader_finds_them(shard_set: Path, end: int) -> None:
    """One rule for offsets: a shard the loader refuses at first open never verifies as ok.

    The first (or last) offset of shard 1's ``tokens`` is moved by a few rows inside the file, and the
    indexes and the manifest are rewritten to agree with the lengths the offsets now give, so that only
    the offsets' fit to the values is wrong.
    """
    m = manifest_of(shard_set)
    info = m["shards"][1]
    path = shard_path(shard_set, 1)
    with pa.memory_map(str(path)) as mm:
        whole = mm.read_buffer(mm.size())
        mm.seek(0)
        col = pa.ipc.open_file(mm).get_batch(0).column("tokens")
        buf = col.buffers()[1]
        offsets = np.frombuffer(buf, dtype=np.int64, count=len(col) + 1, offset=col.offset * 8).copy()
        at = buf.address - whole.address + col.offset * 8 + (end % len(offsets)) * 8
    move = 3 if end == 0 else -3  # inside the first (last) sample, which has more rows than that
    assert abs(offsets[1 if end == 0 else -2] - offsets[end]) > 3
    with path.open("r+b") as f:
        f.seek(at)
        f.write(np.int64(offsets[end] + move).tobytes())
    schema = shardload.open(shard_set).schema
    reader = ArrowShardReader(path, schema)
    lengths = recompute_lengths(schema, reader.columns())
    reader.close()
    lo, hi = info["first_sample"], info["first_sample"] + info["samples"]
    files = {"": m["lengths"]["file"], **m["lengths"]["per_field"]}
    for key, file in files.items():
        index = np.load(shard_set / file)
        index[lo:hi] = lengths[key]
        np.save(shard_set / file, index)
    tokens = int(lengths[""].sum())
    m["total_tokens"] += tokens - info["tokens"]
    info.update(bytes=path.stat().st_size, checksum=file_checksum(path), tokens=tokens)
    (shard_set / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(shardload.CorruptShardError, match=r"field 'tokens': offsets (start at 3|end at)"):
        shardload.open(shard_set)[lo]
    report = verify(shard_set)
    assert not report.ok
    assert reasons(report, 1) & {"lengths_mismatch", "unreadable"}, report.problems
    assert any("field 'tokens': offsets" in p.detail for p in report.problems), report.problems


def test_bad_manifest_total_raises(shard_set: Path) -> None:
    m = manifest_of(shard_set)
    m["total_samples"] += 1
    (shard_set / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="total_samples"):
        verify(shard_set)


def test_not_a_shard_set_raises(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="not a shard set"):
        verify(tmp_path)


def test_threads_give_the_same_report(shard_set: Path) -> None:
    shard_path(shard_set, 2).unlink()
    assert verify(shard_set, workers=3).problems == verify(shard_set).problems


def test_problem_text_and_reason_codes() -> None:
    p = Problem(3, "shards/shard-000003.arrow", "checksum_mismatch", "content differs")
    assert str(p) == "shard 3 (shards/shard-000003.arrow): checksum_mismatch: content differs"
    assert str(Problem(None, "lengths.npy", "missing", "gone")) == "lengths.npy: missing: gone"
    assert set(REASONS) == {
        "missing",
        "outside_set",
        "truncated",
        "size_mismatch",
        "checksum_mismatch",
        "wrong_count",
        "unreadable",
        "misplaced",
        "lengths_mismatch",
    }
