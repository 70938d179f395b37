"""Remote shard sets read through the node cache, against real servers on 127.0.0.1 (rclone S3, HTTP).

Claims tested: batches of a remote set equal those of the same set on disk (0 and 2 workers, S3 and
HTTP); each shard is downloaded once per node when the cache holds the working set; a bounded cache
never holds more than its limit; a too-small limit is refused naming both sizes; a damaged object is
downloaded twice then reported naming its URL and both checksums; a re-prepared remote set is noticed;
a local set makes no cache; the CLI reads URLs.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.cli import main
from shardload.errors import CorruptShardError, PlanError, ShardSetChangedError, ShardSetError
from shardload.remote import RemoteOptions, cache
from shardload.remote.cache import RemoteSet
from shardload.testing import synthetic_samples
from tests.helpers.servers import S3Server


def make_set(root: Path, name: str = "set", n: int = 120, shards: int = 6, seed: int = 1) -> Path:
    path = root / name
    shardload.write(synthetic_samples(n, seed=seed), path, num_shards=shards, progress=False)
    return path


def options(s3: S3Server, cache: Path, **kw: Any) -> RemoteOptions:
    return RemoteOptions(storage_options=s3.storage_options, cache_dir=cache, **kw)


def batches(
    path: Any, remote: RemoteOptions | None = None, batch_size: int = 8, **kw: Any
) -> list[dict[str, np.ndarray]]:
    loader = shardload.make_loader(path, batch_size=batch_size, rank=0, world_size=1, remote=remote, **kw)
    return [{k: v.numpy().copy() for k, v in b.items()} for b in loader]


def assert_same(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def downloads(cache: Path) -> Counter[int]:
    """Shard -> downloads on this node, from the cache's own log (every mirror of the cache)."""
    lines = [line for log in cache.glob("sets/*/*/.downloads") for line in log.read_text().splitlines()]
    return Counter(int(line.split()[0]) for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_s3_batches_equal_local_and_each_shard_downloaded_once(s3: S3Server, tmp_path: Path, workers: int) -> None:
    local = make_set(tmp_path)
    url = s3.upload(local, f"equal{workers}/set")
    cache = tmp_path / "cache"
    remote = options(s3, cache)
    for epoch in range(2):
        assert_same(batches(url, remote, num_workers=workers, epoch=epoch), batches(local, epoch=epoch, num_workers=0))
    assert downloads(cache) == Counter(range(6))  # every shard once, over two epochs and every process
    ss = shardload.open(url, remote=remote)
    assert ss.url == url and ss.path.is_relative_to(cache) and ss.fingerprint == shardload.open(local).fingerprint
    assert not (ss.path / "origins.arrow").exists()  # fetched lazily
    assert ss.origin(7) == shardload.open(local).origin(7)


def test_http_set_reads_like_local(http_root: tuple[Path, str], tmp_path: Path) -> None:
    root, base = http_root
    local = make_set(tmp_path, n=60, shards=3)
    shutil.copytree(local, root / "set")
    remote = RemoteOptions(cache_dir=tmp_path / "cache")
    ss = shardload.open(f"{base}/set", remote=remote)
    assert len(ss) == 60
    np.testing.assert_array_equal(ss[59]["tokens"], shardload.open(local)[59]["tokens"])
    assert_same(batches(f"{base}/set", remote), batches(local))


def halves(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """A map that splits every record into two pieces."""
    tokens = sample["tokens"]
    return [{"tokens": tokens[: len(tokens) // 2]}, {"tokens": tokens[len(tokens) // 2 :]}]


def test_http_set_tells_each_pieces_place_as_local(http_root: tuple[Path, str], tmp_path: Path) -> None:
    root, base = http_root
    local = tmp_path / "mapped"
    shardload.write(synthetic_samples(30, seed=2), local, map=halves, num_shards=3, progress=False)
    shutil.copytree(local, root / "mapped")
    ss = shardload.open(f"{base}/mapped", remote=RemoteOptions(cache_dir=tmp_path / "cache"))
    assert not (ss.path / "origin.npy").exists()  # fetched with the origins, on first use
    origins = [ss.origin(i) for i in range(len(ss))]
    assert origins == [shardload.open(local).origin(i) for i in range(len(ss))]
    assert sorted((o.position, o.piece, o.pieces) for o in origins) == [(k, j, 2) for k in range(30) for j in (0, 1)]


def test_local_set_makes_no_cache(tmp_path: Path) -> None:
    local = make_set(tmp_path, n=30, shards=2)
    cache = tmp_path / "cache"
    remote = RemoteOptions(cache_dir=cache, cache_limit=1)
    ss = shardload.open(local, remote=remote)
    assert ss.url is None and ss.remote is None
    assert batches(local, remote)
    assert not cache.exists()


def cache_bytes(cache: Path) -> int:
    return sum(
        p.stat().st_size
        for p in cache.rglob("*")
        if p.is_file() and (p.suffix == ".arrow" or p.name.endswith(".part")) and p.name != "origins.arrow"
    )


@pytest.mark.slow
def test_tight_cache_stays_under_its_limit(s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = make_set(tmp_path, n=160, shards=8)
    url = s3.upload(local, "tight/set")
    sizes = [s.bytes for s in shardload.open(local).shards]
    sampled: list[int] = []
    orig = RemoteSet._reserve

    def watched(self: RemoteSet, shard: int, urgent: bool) -> Any:
        part = orig(self, shard, urgent)
        sampled.append(cache_bytes(tmp_path / "cache"))  # right after a reservation: the fullest moment
        return part

    monkeypatch.setattr(RemoteSet, "_reserve", watched)
    limit = 3 * max(sizes)
    remote = options(s3, tmp_path / "cache", cache_limit=limit)
    got = batches(url, remote, stage="val", batching=shardload.Batching(batch_size=8, bucketing=False))
    assert_same(got, batches(local, stage="val", batching=shardload.Batching(batch_size=8, bucketing=False)))
    assert sampled and max(sampled) <= limit, (max(sampled), limit)
    assert sum(downloads(tmp_path / "cache").values()) > 3  # it did evict and fetch again


@pytest.mark.slow
def test_too_small_limits_are_refused_with_both_sizes(s3: S3Server, tmp_path: Path) -> None:
    local = make_set(tmp_path, n=60, shards=3)
    url = s3.upload(local, "small/set")
    largest = max(s.bytes for s in shardload.open(local).shards)
    with pytest.raises(ShardSetError, match=rf"cache limit \({largest - 1:,} bytes\).*\({largest:,} bytes\)"):
        shardload.open(url, remote=options(s3, tmp_path / "c1", cache_limit=largest - 1))
    # room for the largest shard, not for a step that reads two shards in each of two workers
    loader = shardload.make_loader(
        url,
        batch_size=60,
        rank=0,
        world_size=1,
        remote=options(s3, tmp_path / "c2", cache_limit=largest),
        num_workers=2,
    )
    with pytest.raises(
        PlanError, match=rf"cache limit \({largest:,} bytes\) is below what one step needs.*times 2 batch"
    ):
        next(iter(loader))


@pytest.mark.slow
def test_a_limit_that_holds_the_whole_set_is_never_refused(s3: S3Server, tmp_path: Path) -> None:
    local = make_set(tmp_path, n=60, shards=3)
    url = s3.upload(local, "whole/set")
    total = sum(s.bytes for s in shardload.open(local).shards)
    # each step reads every shard, in each of two workers: twice the set, yet nothing ever needs evicting
    got = batches(url, options(s3, tmp_path / "cache", cache_limit=total), num_workers=2, batch_size=60)
    # Invariant: a cache limit of at least the set's total bytes always fits, whatever the workers or batch size
    assert_same(got, batches(local, num_workers=0, batch_size=60))


@pytest.mark.slow
def test_damaged_object_is_fetched_twice_then_reported(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = make_set(tmp_path, n=40, shards=2)
    info = shardload.open(local).shards[1]
    damaged = tmp_path / "damaged"
    shutil.copytree(local, damaged)
    data = bytearray((damaged / info.file).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: only the checksum tells
    (damaged / info.file).write_bytes(bytes(data))
    url = s3.upload(damaged, "damaged/set")  # uploaded once: rclone can stall on an overwrite
    gets: list[str] = []
    orig = cache.fetch_to

    def counted(*args: Any, what: str, **kw: Any) -> None:  # each download of a shard, from byte 0
        gets.append(what)
        orig(*args, what=what, **kw)

    monkeypatch.setattr(cache, "fetch_to", counted)
    ss = shardload.open(url, remote=options(s3, tmp_path / "cache"))
    ss[0]  # the sound shard
    with pytest.raises(CorruptShardError) as err:
        ss[39]
    assert gets.count("downloading shard 1") == 2
    message = str(err.value)
    assert f"{url}/{info.file}" in message and info.checksum in message and "sha256:" in message.split("it is")[1]
    assert not list((ss.path / "shards").glob("*.part")) and not (ss.path / info.file).exists()


def test_reprepared_remote_set_is_noticed(http_root: tuple[Path, str], tmp_path: Path) -> None:
    root, base = http_root
    first, second = make_set(tmp_path, "a", n=120, seed=1), make_set(tmp_path, "b", n=90, seed=2)
    shutil.copytree(first, root / "set")
    remote = RemoteOptions(cache_dir=tmp_path / "cache")
    old = shardload.open(f"{base}/set", remote=remote)
    shutil.rmtree(root / "set")
    shutil.copytree(second, root / "set")  # re-prepared in place on the server
    new = shardload.open(f"{base}/set", remote=remote)
    assert new.fingerprint == shardload.open(second).fingerprint != old.fingerprint
    assert new.path != old.path and len(new) == 90
    with pytest.raises(ShardSetChangedError, match="re-prepared"):
        old[0]  # its shards on the server are the new set's now


def test_reprepared_between_epochs_is_noticed_with_every_shard_cached(
    http_root: tuple[Path, str], tmp_path: Path
) -> None:
    root, base = http_root
    first, second = make_set(tmp_path, "a", n=120, seed=1), make_set(tmp_path, "b", n=90, seed=2)
    shutil.copytree(first, root / "set")
    remote = RemoteOptions(cache_dir=tmp_path / "cache")
    loader = shardload.make_loader(f"{base}/set", batch_size=8, rank=0, world_size=1, num_workers=0, remote=remote)
    assert sum(len(b["sample_id"]) for b in loader) == 120  # every shard is now in the cache
    shutil.rmtree(root / "set")
    shutil.copytree(second, root / "set")  # re-prepared in place on the server
    loader.set_epoch(1)
    with pytest.raises(ShardSetChangedError, match="re-prepared since this job opened it"):
        next(iter(loader))


@pytest.mark.slow
def test_cli_reads_urls_with_settings_from_the_environment(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    local = make_set(tmp_path, n=50, shards=3)
    url = s3.upload(local, "cli/set")
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    cache = tmp_path / "cache"
    assert main(["inspect", url, "--json", "--cache-dir", str(cache)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == url and info["samples"] == 50
    assert main(["plan", url, "--world-size", "2", "--batch-size", "4", "--json", "--cache-dir", str(cache)]) == 0
    assert json.loads(capsys.readouterr().out)
    assert not downloads(cache)  # inspect and plan read no shard
    assert main(["verify", url, "--json", "--cache-dir", str(cache), "--cache-limit", "1GiB"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["path"] == url and report["shards"] == 3
    assert downloads(cache) == Counter(range(3))
