"""Careless or hostile use of remote sets: credentials, objects gone after open, a cache of one shard.

Each test reproduces a defect found by attacking the documented behaviour against the
rclone S3 server on 127.0.0.1 (tests/helpers/servers.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.errors import CorruptShardError, RemoteAccessError
from tests.helpers.servers import S3Server

ROOT = Path(__file__).resolve().parents[2]


def _set(tmp_path: Path, s3: S3Server, prefix: str) -> tuple[str, list[np.ndarray]]:
    rng = np.random.default_rng(7)
    tokens = [rng.integers(0, 1000, size=int(rng.integers(1, 50))).astype(np.int32) for _ in range(40)]
    local = tmp_path / "set"
    shardload.write(({"tokens": t} for t in tokens), local, num_shards=4)
    return s3.upload(local, prefix), tokens


def test_wrong_secret_names_the_url(tmp_path: Path, s3: S3Server) -> None:
    url, _ = _set(tmp_path, s3, "attack/cred")
    bad = {**s3.storage_options, "secret": "not-the-secret"}
    with pytest.raises(RemoteAccessError, match=r"s3://bucket/attack/cred/manifest\.json\) was refused") as info:
        shardload.open(url, storage_options=bad, cache_dir=tmp_path / "cache")
    assert isinstance(info.value, PermissionError)  # callers catching PermissionError still do


def test_cli_without_credentials_exits_8_not_internal(tmp_path: Path, s3: S3Server) -> None:
    url, _ = _set(tmp_path, s3, "attack/nocred")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        PYTHONPATH=str(ROOT),
        AWS_ENDPOINT_URL=s3.endpoint,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    done = subprocess.run(
        [sys.executable, "-m", "shardload", "inspect", url, "--cache-dir", str(tmp_path / "cache")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 8, done.stderr  # object storage refused: RemoteAccessError, a RemoteError
    assert "was refused" in done.stderr and url in done.stderr and "AWS_ACCESS_KEY_ID" in done.stderr


def test_shard_deleted_after_open_is_a_damaged_set(tmp_path: Path, s3: S3Server) -> None:
    url, _ = _set(tmp_path, s3, "attack/deleted")
    ds = shardload.open(url, storage_options=s3.storage_options, cache_dir=tmp_path / "cache")
    s3.filesystem().rm(f"{url[5:]}/{ds.manifest.shards[0].file}")
    with pytest.raises(CorruptShardError, match=r"shard 0 \(s3://bucket/attack/deleted/shards/.*\) is missing"):
        ds[0]


def test_random_access_with_a_cache_of_one_shard(tmp_path: Path, s3: S3Server) -> None:
    """A process alone, a limit of exactly the largest shard: it reads every sample, no wait for itself."""
    url, tokens = _set(tmp_path, s3, "attack/oneshard")
    probe = shardload.open(url, storage_options=s3.storage_options, cache_dir=tmp_path / "probe")
    largest = max(s.bytes for s in probe.manifest.shards)
    ds = shardload.open(
        url,
        remote=shardload.remote.RemoteOptions(
            storage_options=s3.storage_options, cache_dir=tmp_path / "cache", cache_limit=largest, wait_timeout=20
        ),
    )
    got = [ds[i]["tokens"] for i in range(len(ds))]
    assert sorted(g.tolist() for g in got) == sorted(t.tolist() for t in tokens)  # prepare may reorder


def test_download_killed_midway_leaves_no_part_file(tmp_path: Path, s3: S3Server) -> None:
    """A process SIGKILLed while downloading leaves its ``.part`` file; the next download removes it."""
    url, _ = _set(tmp_path, s3, "attack/killed")
    ds = shardload.open(url, storage_options=s3.storage_options, cache_dir=tmp_path / "cache")
    assert ds.remote is not None
    shard = ds.remote.mirror / ds.manifest.shards[0].file
    shard.parent.mkdir(parents=True, exist_ok=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = shard.with_name(f".{shard.name}.{int(dead.stdout)}.part")
    left.write_bytes(b"half a shard")  # what a download killed midway leaves (no cache limit: no scan)
    assert len(ds[0]["tokens"]) > 0
    assert shard.is_file() and not left.exists()


def test_a_zero_cache_limit_in_the_environment_suggests_a_valid_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardload.errors import InputError
    from shardload.remote.options import ENV_CACHE_LIMIT, RemoteOptions

    monkeypatch.setenv(ENV_CACHE_LIMIT, "0")
    with pytest.raises(InputError, match=f"{ENV_CACHE_LIMIT}='0' is not a positive size") as info:
        _ = RemoteOptions().limit
    assert f"set e.g. {ENV_CACHE_LIMIT}=100GiB" in str(info.value)  # never the refused value itself


@pytest.mark.parametrize(
    ("sequence", "starts", "worst"),
    [
        ([0, 1], [0, 2, 2], 30),  # the last batch reads none of this set's shards (a mixture's other source)
        ([], [0, 0, 0], 0),  # no batch reads this set
        ([1], [0, 0, 1], 20),  # the first batch reads none
    ],
)
def test_step_size_of_batches_that_read_none_of_the_set(sequence: list[int], starts: list[int], worst: int) -> None:
    from types import SimpleNamespace

    from shardload.errors import PlanError
    from shardload.load.prefetch import check_step_fits

    def remote(limit: int) -> Any:
        return SimpleNamespace(options=SimpleNamespace(limit=limit), _sizes=np.array([10, 20]), url="s3://b/set")

    seq, st = np.array(sequence, np.int64), np.array(starts, np.int64)
    check_step_fits(remote(max(worst, 1)), seq, st, readers=1)  # fits exactly
    if worst:
        with pytest.raises(PlanError, match=f"up to {worst:,} bytes"):
            check_step_fits(remote(worst - 1), seq, st, readers=1)
