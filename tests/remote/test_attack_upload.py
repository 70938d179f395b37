"""``prepare -o s3://...`` used carelessly: what a run must refuse before it writes or removes anything."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.errors import OutputError, OutputExistsError
from shardload.remote import RetryPolicy
from tests.helpers.servers import S3Server

FAST = RetryPolicy(tries=2, base_delay=0.01, max_delay=0.02)


def _samples(n: int = 20) -> list[dict[str, np.ndarray]]:
    return [{"tokens": np.arange(i % 7 + 1, dtype=np.int32)} for i in range(n)]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"s3://bucket/attack/{tmp_path.name}/set"


@pytest.mark.parametrize("flags", [{}, {"overwrite": True}, {"resume": True}])
def test_an_object_at_the_url_itself_is_refused(s3: S3Server, tmp_path: Path, url: str, flags: dict[str, bool]) -> None:
    """An object named as the URL is not a prefix: refused at once (rclone's store, like a hierarchical one,
    answered every upload under it with an error that was retried for minutes), and the object stays."""
    (tmp_path / "obj").write_bytes(b"hello")
    s3.upload(tmp_path / "obj", url.removeprefix("s3://bucket/"))
    with pytest.raises(OutputExistsError, match="is an object itself"):
        shardload.write(
            _samples(),
            url,
            storage_options=s3.storage_options,
            staging=tmp_path / "staging",
            retry=FAST,
            progress=False,
            **flags,
        )
    assert s3.filesystem().cat_file(url.removeprefix("s3://")) == b"hello"
    assert not (tmp_path / "staging").exists()


@pytest.mark.parametrize("mine", [["run.json"], ["uploaded.log", "notes.txt"], ["set/keep.txt"]])
def test_a_staging_directory_with_files_of_the_user_is_refused(
    s3: S3Server, tmp_path: Path, url: str, mine: list[str]
) -> None:
    """``--staging .`` (or a data folder) once had its ``run.json`` / ``uploaded.log`` overwritten, then
    deleted with the folder after the upload: a staging directory must be empty, new or a run's own."""
    staging = tmp_path / "mine"
    for name in mine:
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_text(f"precious {name}")
    with pytest.raises(OutputError, match="staging directory holds files"):
        shardload.write(_samples(), url, storage_options=s3.storage_options, staging=staging, progress=False)
    assert {n: (staging / n).read_text() for n in mine} == {n: f"precious {n}" for n in mine}
    assert not s3.filesystem().exists(url.removeprefix("s3://"))


def test_a_kept_staging_directory_is_still_accepted(s3: S3Server, tmp_path: Path, url: str) -> None:
    """The refusal above spares a run's own staging: kept, then resumed (only the manifest goes again)."""
    staging = tmp_path / "staging"
    shardload.write(_samples(), url, storage_options=s3.storage_options, staging=staging, keep_staging=True)
    assert json.loads((staging / "run.json").read_text())["url"] == url
    again = shardload.write(
        _samples(), url, storage_options=s3.storage_options, staging=staging, resume=True, keep_staging=True
    )
    assert again.uploaded_bytes == (staging / "set" / "manifest.json").stat().st_size
    assert len(shardload.open(url, storage_options=s3.storage_options, cache_dir=tmp_path / "cache")) == 20
