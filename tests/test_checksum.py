"""Checksums made while a shard is written equal the ones made by reading the file back."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload._base import checksum as checksum_module
from shardload._base.checksum import OVERLAP_BYTES, DigestingFile, file_checksum
from shardload.formats.arrow import ArrowOptions, ArrowShardWriter
from shardload.formats.base import Columns
from shardload.formats.manifest import Manifest
from shardload.schema.fields import Schema


def test_digesting_file_hashes_exactly_what_it_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    pieces: list[bytes] = [b"", b"ARROW1", rng.bytes(OVERLAP_BYTES - 1), rng.bytes(OVERLAP_BYTES), rng.bytes(3 << 20)]
    path = tmp_path / "f.bin"
    with DigestingFile(path) as out:
        for piece in pieces:  # as bytes, and as a buffer of another type (numpy), as pyarrow may hand it
            assert out.write(piece) == len(piece)
            assert out.write(np.frombuffer(piece, dtype=np.uint8)[::-1].copy()) == len(piece)
        size = out.tell()
    want = hashlib.sha256(b"".join(p + p[::-1] for p in pieces)).hexdigest()
    assert path.stat().st_size == size == 2 * sum(map(len, pieces))
    assert out.checksum == file_checksum(path) == f"sha256:{want}"


def disk_full_on_large_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write of at least OVERLAP_BYTES (the hashed-in-a-thread ones) writes half, then fails ENOSPC."""
    real = os.write

    def half_then_full(fd: int, data: memoryview) -> int:
        if len(data) < OVERLAP_BYTES:
            return real(fd, data)
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checksum_module.os, "write", half_then_full)


def test_a_failed_write_raises_its_os_error_and_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk_full_on_large_writes(monkeypatch)
    with pytest.raises(OSError) as info, DigestingFile(tmp_path / "f.bin") as out:
        out.write(b"x" * 10)
        out.write(bytes(OVERLAP_BYTES * 2))  # the helper thread's hash is waited for, not left running
    assert info.value.errno == errno.ENOSPC
    assert out.closed


def test_partial_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write
    monkeypatch.setattr(checksum_module.os, "write", lambda fd, data: real(fd, data[:1000]))  # a short write each time
    data = np.random.default_rng(1).bytes(OVERLAP_BYTES + 12345)
    with DigestingFile(tmp_path / "f.bin") as out:
        out.write(data)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert out.checksum == "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("n", [1, 50, 5000])
def test_arrow_shard_checksummed_while_written_is_the_same_file_and_checksum(tmp_path: Path, n: int) -> None:
    rng = np.random.default_rng(n)
    samples = [{"tokens": rng.integers(0, 1000, size=int(k)), "label": np.int64(k)} for k in rng.integers(1, 900, n)]
    schema = Schema.infer(samples[0])
    cols = Columns.from_samples(schema, [schema.check(s, where="test") for s in samples])
    writer = ArrowShardWriter(schema, ArrowOptions())
    writer.write(tmp_path / "plain.arrow", cols)
    got = writer.write_checksummed(tmp_path / "hashed.arrow", cols)
    assert (tmp_path / "hashed.arrow").read_bytes() == (tmp_path / "plain.arrow").read_bytes()
    assert got == file_checksum(tmp_path / "plain.arrow")


def test_prepared_shards_carry_the_checksum_of_their_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    samples = [{"tokens": rng.integers(0, 50_000, size=int(k))} for k in rng.integers(1, 3000, 600)]
    out = tmp_path / "set"
    shardload.write(samples, out, num_shards=3, workers=2, progress=False)
    shards = Manifest.load(out).shards
    assert len(shards) == 3
    for s in shards:
        assert s.checksum == file_checksum(out / s.file)


def test_disk_full_while_a_shard_is_hashed_and_written_leaves_no_half_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(4)
    samples = [{"tokens": rng.integers(0, 50_000, size=int(k))} for k in rng.integers(1000, 3000, 800)]
    out = tmp_path / "set"
    disk_full_on_large_writes(monkeypatch)  # shards only: staged chunks are not written through DigestingFile
    with pytest.raises(shardload.OutputError) as info:
        shardload.write(samples, out, num_shards=2, progress=False)
    assert "writing shards" in str(info.value) and "No space left on device" in str(info.value)
    assert not list(out.rglob("*.tmp")) and not list(out.rglob("shard-*"))
    assert not (out / "manifest.json").exists()
    monkeypatch.undo()
    shardload.write(samples, out, num_shards=2, progress=False, resume=True)
    assert len(shardload.open(out)) == len(samples)
    for s in Manifest.load(out).shards:
        assert s.checksum == file_checksum(out / s.file)
