"""Damaged shards: found when a shard is first opened (cheap checks) and by ``verify`` (checksums).

Every case ends in a :class:`~shardload.CorruptShardError` (or a verify problem)
naming the shard, never in wrong samples.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.formats.arrow import ArrowShardReader
from shardload.plan import Batching
from shardload.sets.verify import verify
from shardload.testing import synthetic_samples

from .conftest import read_all, read_manifest, shard_file, write_manifest


def reasons(path: Path, shard: int) -> set[str]:
    return {p.reason for p in verify(path).problems if p.shard == shard}


def test_missing_shard_is_named_at_load_and_by_verify(damaged: Path) -> None:
    shard_file(damaged, 2).unlink()
    ds = shardload.open(damaged)  # opening reads no shard
    ds[0]
    with pytest.raises(shardload.CorruptShardError, match=r"shard 2 .*shard-000002\.arrow.* is missing.*verify"):
        ds[int(ds.index.starts[2])]
    assert reasons(damaged, 2) == {"missing"}


def test_truncated_shard_is_named_at_load_and_by_verify(damaged: Path) -> None:
    path = shard_file(damaged, 1)
    path.write_bytes(path.read_bytes()[:-100])
    ds = shardload.open(damaged)
    with pytest.raises(shardload.CorruptShardError, match=r"shard 1 .* bytes, the manifest says .*truncated"):
        ds[int(ds.index.starts[1])]
    assert "truncated" in reasons(damaged, 1)


def offsets_position(path: Path, field: str) -> tuple[int, np.ndarray]:
    """Byte position of ``field``'s offsets buffer inside the shard file, and the offsets."""
    m = read_manifest(path.parents[1])
    schema = shardload.Schema.from_json(m["schema"])
    offsets = ArrowShardReader(path, schema).columns().fields[field].offsets
    assert offsets is not None
    pos = path.read_bytes().find(offsets.astype("<i8").tobytes())
    assert pos > 0
    return pos, offsets.copy()


def test_flipped_byte_in_offsets_is_caught_when_the_shard_is_opened(damaged: Path) -> None:
    # A low bit flipped in one offset keeps the offsets monotone and inside the values
    # buffer, so the Arrow structure checks alone accept the shard and two samples
    # silently change length. The check against the lengths index catches it.
    path = shard_file(damaged, 1)
    pos, offsets = offsets_position(path, "tokens")
    gaps = np.diff(offsets)
    k = int(np.flatnonzero((gaps[:-1] >= 2) & (gaps[1:] >= 2))[0]) + 1  # offsets[k] may move by one
    data = bytearray(path.read_bytes())
    data[pos + 8 * k] ^= 0x01
    path.write_bytes(bytes(data))
    schema = shardload.open(damaged).schema
    # The structure is still valid Arrow: this is the gap the lengths check closes.
    ArrowShardReader(path, schema).columns()
    first = read_manifest(damaged)["shards"][1]["first_sample"]
    ds = shardload.open(damaged)
    with pytest.raises(shardload.CorruptShardError) as info:
        ds[first]
    msg = str(info.value)
    for fragment in ("shard 1", "shard-000001.arrow", "'tokens'", f"sample {first + k - 1}", "verify"):
        assert fragment in msg, msg
    # Invariant: the shard stays unusable (not half-opened) on a second try
    with pytest.raises(shardload.CorruptShardError):
        ds[first]
    assert ds.open_shards == []
    assert "checksum_mismatch" in reasons(damaged, 1)


def test_flipped_byte_in_the_footer_is_caught_when_the_shard_is_opened(damaged: Path) -> None:
    path = shard_file(damaged, 3)
    data = bytearray(path.read_bytes())
    data[-12] ^= 0xFF  # inside the footer's length / metadata
    path.write_bytes(bytes(data))
    ds = shardload.open(damaged)
    with pytest.raises(shardload.CorruptShardError, match=r"shard-000003\.arrow"):
        ds[len(ds) - 1]
    assert "checksum_mismatch" in reasons(damaged, 3)


def test_flipped_byte_in_sample_data_is_found_by_verify(damaged: Path) -> None:
    # Loading reads no more than the samples asked for, so it cannot see this: verify does.
    path = shard_file(damaged, 0)
    data = bytearray(path.read_bytes())
    values_at = data.find(np.asarray(shardload.open(damaged)[5]["tokens"]).tobytes())
    assert values_at > 0
    data[values_at] ^= 0x10
    path.write_bytes(bytes(data))
    report = verify(damaged)
    assert [(p.shard, p.reason) for p in report.problems] == [(0, "checksum_mismatch")]
    assert "shard 0 (shards/shard-000000.arrow): checksum_mismatch" in str(report.problems[0])


def test_lengths_index_edited_to_disagree_is_caught_at_load(damaged: Path) -> None:
    lengths = np.load(damaged / "lengths.tokens.npy")
    lengths[40] += 1
    np.save(damaged / "lengths.tokens.npy", lengths)
    ds = shardload.open(damaged)
    with pytest.raises(shardload.CorruptShardError, match=r"shard 1 .*'tokens'.*sample 40 "):
        ds[40]


def test_shard_that_is_a_symlink_out_of_the_set_is_refused(damaged: Path, tmp_path: Path) -> None:
    path = shard_file(damaged, 0)
    outside = tmp_path / "elsewhere.arrow"
    os.replace(path, outside)
    path.symlink_to(outside)
    ds = shardload.open(damaged)
    with pytest.raises(shardload.ShardSetError, match=r"shard 0 .*symbolic link.*outside the shard set"):
        ds[0]
    # a link that stays inside the set is fine
    os.replace(outside, damaged / "shards" / "real.arrow")
    path.unlink()
    path.symlink_to("real.arrow")
    assert read_all(damaged) == 120


def test_shards_directory_linked_out_of_the_set_is_refused(damaged: Path, tmp_path: Path) -> None:
    os.replace(damaged / "shards", tmp_path / "shards")
    (damaged / "shards").symlink_to(tmp_path / "shards")
    with pytest.raises(shardload.ShardSetError, match="outside the shard set"):
        shardload.open(damaged)[0]


def test_lengths_index_linked_out_of_the_set_is_refused(damaged: Path, tmp_path: Path) -> None:
    os.replace(damaged / "lengths.npy", tmp_path / "lengths.npy")
    (damaged / "lengths.npy").symlink_to(tmp_path / "lengths.npy")
    with pytest.raises(shardload.ShardSetError, match="lengths index .*outside the shard set"):
        _ = shardload.open(damaged).lengths


def test_wrong_sample_count_in_the_manifest_is_caught_at_load(damaged: Path) -> None:
    # Counts that add up (so the manifest parses) but do not match the files.
    m = read_manifest(damaged)
    m["shards"][0]["samples"] += 1
    m["shards"][1]["samples"] -= 1
    m["shards"][1]["first_sample"] += 1
    write_manifest(damaged, m)
    ds = shardload.open(damaged)
    with pytest.raises(shardload.CorruptShardError, match=r"shard 0 .*holds 30 samples, the manifest says 31"):
        ds[0]


# -- a set re-prepared while a job has it open ------------------------------------------------------
def same_sizes_other_values(seed: int) -> list[dict[str, np.ndarray]]:
    """Samples with the lengths of the fixture's but other values: every shard keeps its size."""
    return [
        {"tokens": s["tokens"] + 1, "features": s["features"] * 2, "label": s["label"] + 1}
        for s in synthetic_samples(120, seed=seed)
    ]


def test_reprepared_set_is_detected_by_an_open_shard_set(damaged: Path) -> None:
    ds = shardload.open(damaged)
    old_first = ds[0]["tokens"].copy()
    shardload.write(same_sizes_other_values(3), damaged, num_shards=4, shuffle=False, overwrite=True, progress=False)
    # sizes all match, so only the manifest identity tells old shards from new ones
    assert [s.bytes for s in shardload.open(damaged).shards] == [s.bytes for s in ds.shards]
    with pytest.raises(shardload.ShardSetChangedError, match=r"re-prepared.*Restart the job"):
        ds[len(ds) - 1]
    np.testing.assert_array_equal(ds[0]["tokens"], old_first)  # a shard mapped before stays the old one


def test_rewritten_manifest_with_the_same_content_is_not_a_change(damaged: Path) -> None:
    ds = shardload.open(damaged)
    text = (damaged / "manifest.json").read_text()
    (damaged / "manifest.json").unlink()
    (damaged / "manifest.json").write_text(text)
    assert read_all(damaged) == 120
    assert ds[len(ds) - 1] is not None


def test_reprepared_set_is_detected_by_a_running_loader(damaged: Path) -> None:
    loader = shardload.make_loader(
        damaged, rank=0, world_size=1, stage="val", batching=Batching(batch_size=30, bucketing=False)
    )
    it = iter(loader)
    next(it)
    shardload.write(same_sizes_other_values(3), damaged, num_shards=4, shuffle=False, overwrite=True, progress=False)
    with pytest.raises(shardload.ShardSetChangedError, match="re-prepared"):
        for _ in it:
            pass
