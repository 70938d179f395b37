"""Prepare under faults: kill -9, a full disk, an unwritable output, inputs vanishing mid-run.

Each ends in a clear error (or a correct resume); none leaves something that
looks like a shard set, and none touches the input.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.formats.arrow import ArrowShardWriter
from shardload.testing import synthetic_samples
from tests.prepare.test_safety import checksums, run_writer

WRITER_ARGS = {"num_shards": 6, "chunk_bytes": 4000, "workers": 1, "progress": False}


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, to show that a run left it untouched."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_not_a_shard_set(out: Path, *, committing: bool = False) -> None:
    # Invariant: an unfinished output is never taken for a shard set
    with pytest.raises(shardload.ManifestError, match="not a shard set.*--resume"):
        shardload.open(out)
    assert not (out / "manifest.json").exists()
    if not committing:  # during the commit, shards move in before the manifest (the last step)
        assert not list(out.glob("shards/*.arrow"))


# -- kill -9, then a rerun with and without --resume ------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("point", ["staged:3", "shard:1", "manifest", "commit:before-manifest"])
def test_killed_prepare_is_refused_without_resume_and_finished_with_it(tmp_path: Path, point: str) -> None:
    reference = tmp_path / "ref"
    assert run_writer(reference) == 0
    out = tmp_path / "out"
    assert run_writer(out, kill_at=point) == -signal.SIGKILL
    assert_not_a_shard_set(out, committing=point.startswith("commit"))
    # Without --resume the leftovers are neither reused nor silently replaced.
    with pytest.raises(shardload.OutputExistsError, match="interrupted.*--resume.*--overwrite"):
        shardload.write(synthetic_samples(600, seed=9), out, **WRITER_ARGS)
    assert_not_a_shard_set(out, committing=point.startswith("commit"))
    assert run_writer(out) == 0  # the writer passes resume=True
    assert checksums(out) == checksums(reference)
    assert not (out / ".prepare").exists() and not (out / ".prepare.lock").exists()


@pytest.mark.slow
def test_kill_right_after_the_manifest_lands_leaves_a_complete_set(tmp_path: Path) -> None:
    reference = tmp_path / "ref"
    assert run_writer(reference) == 0
    out = tmp_path / "out"
    assert run_writer(out, kill_at="commit:manifest-moved") == -signal.SIGKILL
    # The manifest is the last thing to arrive: once it is there, the set is whole.
    assert checksums(out) == checksums(reference)
    assert len(shardload.open(out)) == 600
    with pytest.raises(shardload.OutputExistsError, match="--resume"):
        shardload.write(synthetic_samples(600, seed=9), out, **WRITER_ARGS)
    assert run_writer(out) == 0  # --resume tidies up the work directory
    assert checksums(out) == checksums(reference)
    assert not (out / ".prepare").exists()


# -- disk full ---------------------------------------------------------------------------------------
@pytest.fixture
def jsonl_input(tmp_path: Path) -> Path:
    """A directory of JSON Lines files (the input whose safety is checked)."""
    src = tmp_path / "input"
    src.mkdir()
    samples = synthetic_samples(300, seed=4)
    for part in range(3):
        lines = [
            json.dumps({"tokens": s["tokens"].tolist(), "label": int(s["label"])})
            for s in samples[part * 100 : (part + 1) * 100]
        ]
        (src / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    return src


def disk_full_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """Make the ``writes``-th Arrow file write run out of space half way through the file."""
    real = ArrowShardWriter.write
    count = iter(range(1, 10**6))

    def write(self: ArrowShardWriter, path: Path, columns: object, **kwargs: Any) -> None:
        real(self, path, columns, **kwargs)  # type: ignore[arg-type]
        if next(count) == writes:
            size = path.stat().st_size
            with open(path, "r+b") as fh:
                fh.truncate(size // 2)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(ArrowShardWriter, "write", write)


@pytest.mark.parametrize(("writes", "stage"), [(2, "staging the samples"), (5, "writing shards")])
def test_disk_full_is_an_output_error_and_resume_finishes(
    tmp_path: Path, jsonl_input: Path, monkeypatch: pytest.MonkeyPatch, writes: int, stage: str
) -> None:
    # 3 input files are staged as 3 chunks (writes 1-3), then 4 shards are written (writes 4-7).
    reference = tmp_path / "ref"
    shardload.prepare(jsonl_input, reference, num_shards=4, progress=False)
    before = tree_digest(jsonl_input)
    out = tmp_path / "out"
    disk_full_after(monkeypatch, writes)
    with pytest.raises(shardload.OutputError) as info:
        shardload.prepare(jsonl_input, out, num_shards=4, progress=False)
    msg = str(info.value)
    for fragment in (str(out), stage, "No space left on device", ".tmp", "disk is full", "--resume"):
        assert fragment in msg, msg
    assert_not_a_shard_set(out)
    # the half-written file is gone (its space is back), and the input is untouched
    assert not list(out.rglob("*.tmp"))
    assert tree_digest(jsonl_input) == before
    monkeypatch.undo()  # space freed
    shardload.prepare(jsonl_input, out, num_shards=4, progress=False, resume=True)
    assert checksums(out) == checksums(reference)


def test_disk_full_while_writing_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardload.formats.manifest as manifest_module

    real = manifest_module.atomic_write_text

    def full(path: Path, text: str) -> None:
        if path.name == "manifest.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, text)

    monkeypatch.setattr(manifest_module, "atomic_write_text", full)
    out = tmp_path / "out"
    samples = synthetic_samples(80, seed=2)
    with pytest.raises(shardload.OutputError, match=r"writing the lengths index and the manifest failed.*disk is full"):
        shardload.write(samples, out, num_shards=2, progress=False)
    assert_not_a_shard_set(out)
    monkeypatch.undo()
    shardload.write(samples, out, num_shards=2, progress=False, resume=True)
    assert len(shardload.open(out)) == 80


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB filesystem, where the machine lets us mount one (root with CAP_SYS_ADMIN)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here; test_disk_full_is_an_output_error_and_resume_finishes covers ENOSPC")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_really_full_disk(small_tmpfs: Path, tmp_path: Path) -> None:
    samples = [{"x": np.full(20_000, i, dtype=np.int64)} for i in range(20)]  # 3.2 MB, the disk holds 1 MiB
    with pytest.raises(shardload.OutputError, match="No space left on device.*disk is full"):
        shardload.write(samples, small_tmpfs / "out", num_shards=4, progress=False)
    assert_not_a_shard_set(small_tmpfs / "out")
    assert not list(small_tmpfs.rglob("*.tmp"))


# -- output not writable, input vanishing --------------------------------------------------------------
@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """An existing directory nobody may write into (chmod, plus the immutable flag for root)."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    immutable = False
    if os.access(d, os.W_OK):  # root ignores permissions
        immutable = subprocess.run(["chattr", "+i", str(d)], capture_output=True, check=False).returncode == 0
        if not immutable:
            d.chmod(0o755)
            pytest.skip("cannot make a directory unwritable here")
    try:
        yield d
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(d)], check=True)
        d.chmod(0o755)


def test_unwritable_output_directory(read_only_dir: Path) -> None:
    with pytest.raises(shardload.OutputError, match=r"ro: cannot write into the output directory.*not writable"):
        shardload.write(synthetic_samples(10), read_only_dir, progress=False)
    with pytest.raises(shardload.OutputError, match=r"cannot create the output directory.*not writable"):
        shardload.write(synthetic_samples(10), read_only_dir / "sub", progress=False)


def test_output_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(shardload.OutputError, match="exists and is not a directory"):
        shardload.write(synthetic_samples(10), tmp_path / "f", progress=False)
    with pytest.raises(shardload.OutputError, match="cannot create the output directory"):
        shardload.write(synthetic_samples(10), tmp_path / "f" / "sub", progress=False)


def make_inputs(src: Path, kind: str) -> list[Path]:
    """Three one-or-more-sample files of ``kind``; returns them in the order prepare reads them."""
    import io
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    src.mkdir()
    paths = []
    for i in range(3):
        x = np.arange(i + 2, dtype=np.int64)
        if kind == "npy":
            p = src / f"{i}.npy"
            np.save(p, x)
        elif kind == "npz":
            p = src / f"{i}.npz"
            np.savez(p, x=x)
        elif kind == "parquet":
            p = src / f"{i}.parquet"
            pq.write_table(pa.table({"x": pa.array([x])}), p)
        elif kind == "arrow":
            p = src / f"{i}.arrow"
            table = pa.table({"x": pa.array([x])})
            with pa.OSFile(str(p), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        elif kind == "jsonl":
            p = src / f"{i}.jsonl"
            p.write_text(json.dumps({"x": x.tolist()}) + "\n")
        else:
            p = src / f"{i}.tar"
            buf = io.BytesIO()
            np.save(buf, x)
            with tarfile.open(p, "w") as tf:
                info = tarfile.TarInfo(f"k{i}.x.npy")
                info.size = len(buf.getvalue())
                tf.addfile(info, io.BytesIO(buf.getvalue()))
        paths.append(p)
    return paths


@pytest.mark.parametrize("kind", ["npy", "npz", "parquet", "jsonl", "webdataset"])
def test_input_deleted_between_listing_and_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    prepare_module = importlib.import_module("shardload.prepare")  # the package, not the function
    paths = make_inputs(tmp_path / "in", kind)
    real_discover = prepare_module.discover

    def discover_then_delete(*args: object, **kw: object) -> object:
        units = real_discover(*args, **kw)  # type: ignore[arg-type]
        paths[2].unlink()  # gone after it was listed, before it is read
        return units

    monkeypatch.setattr(prepare_module, "discover", discover_then_delete)
    out = tmp_path / "out"
    with pytest.raises(
        shardload.InputError, match=rf"{paths[2].name}: file not found \(was it deleted while prepare ran\?\)"
    ):
        shardload.prepare(tmp_path / "in", out, progress=False)
    assert_not_a_shard_set(out)


# -- a FIFO or a device among the inputs ---------------------------------------------------------------
@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail instead of hanging: SIGALRM interrupts a blocked open() or read() after ``seconds``."""

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s: prepare hangs")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("how", ["glob", "directory", "path"])
def test_a_fifo_among_the_sources_is_refused_by_name(tmp_path: Path, how: str) -> None:
    make_inputs(tmp_path / "in", "npy")
    fifo = tmp_path / "in" / "3.npy"
    os.mkfifo(fifo)
    source = {"glob": str(tmp_path / "in" / "*.npy"), "directory": tmp_path / "in", "path": fifo}[how]
    # Invariant: never a hang (opening a FIFO waits for a writer), never a silent skip
    with (
        deadline(20),
        pytest.raises(shardload.InputError, match=r"3\.npy: is a FIFO \(named pipe\), not a regular file"),
    ):
        shardload.prepare(source, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # refused while listing, before the output is touched


@pytest.mark.parametrize("kind", ["npy", "npz", "parquet", "arrow", "jsonl", "webdataset"])
def test_input_replaced_by_a_fifo_after_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    prepare_module = importlib.import_module("shardload.prepare")
    paths = make_inputs(tmp_path / "in", kind)
    real_discover = prepare_module.discover

    def discover_then_swap(*args: object, **kw: object) -> object:
        units = real_discover(*args, **kw)  # type: ignore[arg-type]
        paths[2].unlink()
        os.mkfifo(paths[2])  # listed as a file, a pipe when it is read
        return units

    monkeypatch.setattr(prepare_module, "discover", discover_then_swap)
    with deadline(20), pytest.raises(shardload.InputError, match=rf"{paths[2].name}: is a FIFO"):
        shardload.prepare(tmp_path / "in", tmp_path / "out", progress=False)
    assert_not_a_shard_set(tmp_path / "out")


def test_devices_and_broken_links_are_refused_by_name(tmp_path: Path) -> None:
    src = tmp_path / "in"
    make_inputs(src, "jsonl")
    (src / "zero.jsonl").symlink_to("/dev/zero")  # read as a file, it never ends
    with deadline(20), pytest.raises(shardload.InputError, match=r"zero\.jsonl: is a character device"):
        shardload.prepare(src, tmp_path / "out", progress=False)
    (src / "zero.jsonl").unlink()
    (src / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")  # skipped without a word before
    with pytest.raises(shardload.InputError, match=r"gone\.jsonl: a symbolic link to .*nowhere\.jsonl.*does not exist"):
        shardload.prepare(src, tmp_path / "out", progress=False)
