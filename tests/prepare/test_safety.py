"""No silent loss: refusal to overwrite, locking, atomic replace, resume after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.sets.verify import verify
from shardload.testing import synthetic_samples

REPO = Path(__file__).resolve().parents[2]


def checksums(path: Path) -> list[str]:
    return [s.checksum for s in shardload.open(path).shards]


def test_existing_set_is_not_overwritten_without_overwrite(tmp_path: Path, samples: list[dict]) -> None:
    shardload.write(samples, tmp_path / "s", num_shards=2)
    before = checksums(tmp_path / "s")
    with pytest.raises(shardload.OutputExistsError, match="--overwrite"):
        shardload.write(samples[:10], tmp_path / "s", num_shards=2)
    assert checksums(tmp_path / "s") == before


def test_non_empty_foreign_directory_is_refused(tmp_path: Path, samples: list[dict]) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("mine")
    with pytest.raises(shardload.OutputExistsError, match="not empty"):
        shardload.write(samples, tmp_path / "s", overwrite=True)
    assert (tmp_path / "s" / "notes.txt").read_text() == "mine"


def test_overwrite_keeps_old_set_when_new_input_is_bad(tmp_path: Path, samples: list[dict]) -> None:
    shardload.write(samples, tmp_path / "s", num_shards=2)
    before = checksums(tmp_path / "s")
    bad = samples[:20] + [{"tokens": np.zeros(3, np.float64), "features": samples[0]["features"], "label": 1}]
    with pytest.raises(shardload.InputError, match=r"sample 20: field 'tokens' has dtype float64"):
        shardload.write(bad, tmp_path / "s", num_shards=2, overwrite=True)
    # Invariant: the old set is intact and loadable after a failed overwrite
    assert checksums(tmp_path / "s") == before
    assert len(shardload.open(tmp_path / "s")) == len(samples)


def test_overwrite_replaces_the_set(tmp_path: Path, samples: list[dict]) -> None:
    shardload.write(samples, tmp_path / "s", num_shards=4)
    shardload.write(samples[:50], tmp_path / "s", num_shards=2, overwrite=True)
    ds = shardload.open(tmp_path / "s")
    assert len(ds) == 50 and len(ds.shards) == 2
    assert sorted(p.name for p in (tmp_path / "s" / "shards").iterdir()) == ["shard-000000.arrow", "shard-000001.arrow"]


def test_second_prepare_into_the_same_output_is_refused(tmp_path: Path, samples: list[dict]) -> None:
    out = tmp_path / "s"
    out.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import fcntl, sys, time
            fh = open({str(out / ".prepare.lock")!r}, 'a+')
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            print('locked', flush=True)
            time.sleep(30)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(shardload.OutputLockedError, match="another prepare"):
            shardload.write(samples, out)
    finally:
        holder.kill()
        holder.wait(timeout=10)
    shardload.write(samples, out)  # the kernel released the lock with the process
    assert len(shardload.open(out)) == len(samples)


def test_interrupted_output_is_not_a_shard_set_and_needs_resume(tmp_path: Path, samples: list[dict]) -> None:
    out = tmp_path / "s"
    (out / ".prepare" / "staging").mkdir(parents=True)
    (out / ".prepare" / "staging" / "u00000000-000000.arrow").write_bytes(b"staged samples")  # work to resume
    with pytest.raises(shardload.ManifestError, match="--resume"):
        shardload.open(out)
    with pytest.raises(shardload.OutputExistsError, match="--resume"):
        shardload.write(samples, out)


def test_empty_source_is_refused(tmp_path: Path) -> None:
    with pytest.raises(shardload.InputError, match="no samples"):
        shardload.write([], tmp_path / "s")
    assert not (tmp_path / "s" / "manifest.json").exists()


def test_resume_with_different_options_is_refused(tmp_path: Path, samples: list[dict]) -> None:
    out = tmp_path / "s"
    out.mkdir()
    (out / ".prepare").mkdir()
    (out / ".prepare" / "state.json").write_text('{"options": {"seed": 99}}')
    (out / ".prepare" / "staging").mkdir()
    (out / ".prepare" / "staging" / "u00000000-000000.arrow").write_bytes(b"staged samples")  # work to resume
    with pytest.raises(shardload.OutputError, match="different sources or options"):
        shardload.write(samples, out, resume=True)


WRITER = textwrap.dedent(
    """
    import sys
    import shardload
    from shardload.testing import synthetic_samples

    out, seed = sys.argv[1], int(sys.argv[2])
    samples = synthetic_samples(600, seed=seed)
    shardload.write(samples, out, num_shards=6, chunk_bytes=4000, workers=1, resume=True, progress=False)
    """
)


def run_writer(out: Path, *, kill_at: str | None = None, seed: int = 9) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SHARDLOAD_KILL_AT", None)
    if kill_at:
        env["SHARDLOAD_KILL_AT"] = kill_at
    proc = subprocess.run([sys.executable, "-c", WRITER, str(out), str(seed)], env=env, timeout=120)
    return proc.returncode


KILL_POINTS = [
    "staged:1",  # first chunk staged
    "staged:5",  # in the middle of staging
    "shard:0",  # a shard renamed into place, its record not yet written
    "shard:3",
    "index",  # lengths index written, manifest not yet
    "manifest",  # new manifest complete in the work dir, nothing committed
    "commit:old-invalidated",
    "commit:shards-moved",
]


@pytest.mark.slow
def test_resume_after_sigkill_at_every_stage_gives_the_uninterrupted_result(tmp_path: Path) -> None:
    reference = tmp_path / "ref"
    assert run_writer(reference) == 0
    want = checksums(reference)
    want_lengths = np.load(reference / "lengths.npy")
    for point in KILL_POINTS:
        out = tmp_path / point.replace(":", "_")
        # The process really dies by SIGKILL at that point.
        assert run_writer(out, kill_at=point) == -signal.SIGKILL, point
        # Invariant: an interrupted run never looks like a valid shard set
        with pytest.raises(shardload.ManifestError):
            shardload.open(out)
        assert run_writer(out) == 0, point
        assert checksums(out) == want, point
        # Invariant: the resumed set is whole on disk, not only in its manifest (every shard there, every byte)
        report = verify(out, progress=False)
        assert report.ok, (point, [str(p) for p in report.problems])
        np.testing.assert_array_equal(np.load(out / "lengths.npy"), want_lengths)
        assert not (out / ".prepare").exists()
        # A second resume of a finished commit changes nothing (it used to move an empty shards/ in)
        with pytest.raises(shardload.OutputExistsError, match="no interrupted run to resume"):
            shardload.write(synthetic_samples(20, seed=9), out, resume=True, progress=False)
        assert verify(out, progress=False).ok, point


@pytest.mark.slow
def test_killed_while_removing_its_work_dir_leaves_a_whole_set(tmp_path: Path) -> None:
    out = tmp_path / "s"
    assert run_writer(out, kill_at="commit:work-retired") == -signal.SIGKILL
    # The set is complete: only the renamed work dir is left, never a half .prepare taken for an interrupted run
    assert verify(out, progress=False).ok
    assert not (out / ".prepare").exists()
    assert (out / ".prepare.done").is_dir()
    # Any later run into OUT clears what the stop left (it can be as big as the set), even one that is refused
    with pytest.raises(shardload.OutputExistsError, match="no interrupted run to resume"):
        shardload.write(synthetic_samples(20, seed=9), out, resume=True, progress=False)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    assert verify(out, progress=False).ok
    shardload.write(synthetic_samples(20, seed=9), out, overwrite=True, progress=False)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_a_users_own_prepare_done_is_never_removed(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "s"
    shardload.write(synthetic_samples(20, seed=9), out, progress=False)
    mine = out / ".prepare.done"
    if kind == "folder":
        mine.mkdir()
        (mine / "thesis.tex").write_text("mine")
    else:
        mine.write_text("mine")
    for options in ({"resume": True}, {"overwrite": True}, {}):
        # Invariant: prepare removes only the work dir it renamed there (its run record inside), never a user's
        with pytest.raises(shardload.OutputExistsError, match=r"\.prepare\.done is not a folder prepare made"):
            shardload.write(synthetic_samples(20, seed=9), out, progress=False, **options)
        assert (mine / "thesis.tex" if kind == "folder" else mine).read_text() == "mine"
        assert verify(out, progress=False).ok


@pytest.mark.slow
def test_killed_overwrite_keeps_the_old_set_until_the_commit(tmp_path: Path) -> None:
    out = tmp_path / "s"
    assert run_writer(out, seed=1) == 0
    old = checksums(out)
    # Killed before the commit starts: the old set is still there and valid.
    env_point = "shard:2"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SHARDLOAD_KILL_AT": env_point}
    code = subprocess.run(
        [sys.executable, "-c", WRITER.replace("resume=True", "overwrite=True"), str(out), "2"], env=env, timeout=120
    ).returncode
    assert code == -signal.SIGKILL
    assert checksums(out) == old


@pytest.mark.slow
def test_overwrite_after_a_kill_during_the_commit_starts_over_at_once(tmp_path: Path) -> None:
    out = tmp_path / "s"
    assert run_writer(out, kill_at="commit:shards-moved") == -signal.SIGKILL
    # Invariant: --overwrite replaces a half-committed run in one go (it used to fail once, "changed meanwhile")
    shardload.write(synthetic_samples(50, seed=2), out, overwrite=True, progress=False)
    assert len(shardload.open(out)) == 50 and verify(out, progress=False).ok
