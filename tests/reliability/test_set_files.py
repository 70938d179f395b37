"""The files of a shard set as the loader, inspect and verify open them.

Special files (FIFOs, devices) in place of a set file, a manifest too large to
be one, permission denied, running out of file descriptors, paths too long or
through a file, non-UTF-8 paths, and hostile lengths indexes: each ends in a
:class:`~shardload.ShardSetError` naming the file and what to do, never a hang,
a memory blow-up, a raw ``OSError`` or a report of corruption.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.sets.describe import describe
from shardload.sets.verify import verify

from .conftest import read_all, read_manifest, shard_file, write_manifest

SET_FILES = ["manifest.json", "lengths.npy", "lengths.tokens.npy", "shard"]


@contextmanager
def no_hang(seconds: float = 5, fifo: Path | Sequence[Path] | None = None) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the body blocks for ``seconds``.

    A read blocked on a FIFO in C code cannot be interrupted by a signal, so the
    watchdog also opens ``fifo`` (or each of several) for writing and closes it:
    the reader wakes up with end of file, and the test fails for having hung.
    """
    fifos = [] if fifo is None else [fifo] if isinstance(fifo, Path) else list(fifo)
    hung, done = threading.Event(), threading.Event()

    def unblock() -> None:
        if done.wait(seconds):
            return
        hung.set()
        while fifos and not done.wait(0.05):  # every blocked open of a FIFO, until the body ends
            for path in fifos:
                try:
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass

    watchdog = threading.Thread(target=unblock, daemon=True)
    watchdog.start()
    try:
        with memory_cap():
            yield
    finally:
        done.set()
        watchdog.join()
        assert not hung.is_set(), f"blocked for more than {seconds} s"


@contextmanager
def memory_cap(extra: int = 2 << 30) -> Iterator[None]:
    """At most ``extra`` more bytes of address space: reading /dev/zero fails fast instead of filling the machine."""
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    old = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)


def set_file(root: Path, name: str) -> Path:
    return shard_file(root, 1) if name == "shard" else root / name


def every_reader(root: Path) -> list[Callable[[], object]]:
    """Opening, inspecting, reading every sample, and verifying: what must not hang or crash."""
    return [
        lambda: read_all(root),
        lambda: describe(root),
        lambda: shardload.open(root).field_lengths("tokens"),
        lambda: verify(root),
    ]


def assert_only_clean_errors(root: Path, match: str, fifo: Path | None = None) -> None:
    """Every reader of the set either succeeds or raises a ShardSetError matching ``match``; at least one raises."""
    raised = 0
    for read in every_reader(root):
        with no_hang(fifo=fifo):
            try:
                out = read()
            except shardload.ShardSetError as exc:
                assert not isinstance(exc, shardload.CorruptShardError) or "missing" in str(exc)
                assert any(s in str(exc) for s in match.split("|")), str(exc)
                raised += 1
                continue
        if isinstance(out, shardload.sets.verify.VerifyReport):
            assert not out.ok
            assert any(any(s in p.detail for s in match.split("|")) for p in out.problems), out.problems
            raised += 1
    assert raised >= 2


# -- 1. special files ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SET_FILES)
def test_fifo_in_place_of_a_set_file_is_refused_without_hanging(damaged: Path, name: str) -> None:
    path = set_file(damaged, name)
    path.unlink()
    os.mkfifo(path)
    assert_only_clean_errors(damaged, "FIFO (named pipe), not a regular file", fifo=path)


@pytest.mark.parametrize("name", ["manifest.json", "lengths.npy", "lengths.tokens.npy"])
def test_link_to_a_device_in_place_of_a_set_file_is_refused(damaged: Path, name: str) -> None:
    # verify read indexes through links out of the set; the manifest has no such rule at all
    path = set_file(damaged, name)
    path.unlink()
    path.symlink_to("/dev/zero")
    assert_only_clean_errors(damaged, "character device|outside the shard set")


def test_directory_in_place_of_the_manifest_is_refused(damaged: Path) -> None:
    (damaged / "manifest.json").unlink()
    (damaged / "manifest.json").mkdir()
    with pytest.raises(shardload.ManifestError, match=r"manifest \(.*manifest\.json\) is a directory"):
        shardload.open(damaged)


# -- 2. bounded reads ------------------------------------------------------------------------------------
def test_manifest_larger_than_the_cap_is_refused_naming_the_cap(damaged: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    size = (damaged / "manifest.json").stat().st_size
    monkeypatch.setenv("SHARDLOAD_MAX_MANIFEST_BYTES", str(size - 1))
    with pytest.raises(
        shardload.ManifestError,
        match=rf"is {size:,} bytes, more than the {size - 1:,} bytes.*SHARDLOAD_MAX_MANIFEST_BYTES",
    ):
        shardload.open(damaged)
    monkeypatch.setenv("SHARDLOAD_MAX_MANIFEST_BYTES", str(size))
    assert read_all(damaged) == 120
    monkeypatch.setenv("SHARDLOAD_MAX_MANIFEST_BYTES", "lots")
    with pytest.raises(shardload.ShardSetError, match="SHARDLOAD_MAX_MANIFEST_BYTES='lots' is not a positive integer"):
        shardload.open(damaged)


# -- 3. file descriptors ---------------------------------------------------------------------------------
def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_shards_are_bounded_and_views_of_closed_ones_stay_valid(damaged: Path) -> None:
    expected = [shardload.open(damaged)[i]["tokens"].copy() for i in range(120)]
    ds = shardload.ShardSet(damaged, max_open_shards=2)
    for f in ds.schema.variable_fields:
        ds.field_lengths(f.name)  # the lengths indexes stay mapped (and open) for good: not shards
    assert len(ds.lengths) == 120  # the batching index too: the first open of a shard checks its slice of it
    before = open_fds()
    views = [ds[i]["tokens"] for i in range(120)]  # 4 shards, opened in turn; 2 closed on the way
    assert open_fds() - before <= 2
    assert len(ds._readers) == 2
    assert ds.open_shards == [0, 1, 2, 3]
    for got, want in zip(views, expected, strict=True):
        np.testing.assert_array_equal(got, want)  # views of closed shards: still mapped, same data
    ds.close()
    assert open_fds() <= before


def test_max_open_shards_from_the_environment(damaged: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDLOAD_MAX_OPEN_SHARDS", "1")
    ds = shardload.open(damaged)
    assert read_all(damaged) == 120
    for i in range(0, 120, 30):
        ds[i]
    assert len(ds._readers) == 1


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "8"])
def test_max_open_shards_that_is_not_a_positive_integer_is_refused(damaged: Path, value: Any) -> None:
    # before: 0 silently meant the default, -1 closed every shard at each open, 1.5 and "8" failed at the first read
    with pytest.raises(shardload.PlanError, match=r"max_open_shards must be .*shards kept open per process"):
        shardload.ShardSet(damaged, max_open_shards=value)


def fail_open_of(monkeypatch: pytest.MonkeyPatch, target: Path, code: int) -> None:
    """``os.open`` of ``target`` fails with ``code`` (as the kernel would), other files open normally."""
    real = os.open

    def fake(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.path.realpath(path) == os.path.realpath(target):
            raise OSError(code, os.strerror(code), str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake)


def test_out_of_file_descriptors_is_not_reported_as_corruption(damaged: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fail_open_of(monkeypatch, shard_file(damaged, 2), errno.EMFILE)
    with pytest.raises(shardload.ShardSetError, match=r"shard 2 .*too many open files.*ulimit -n") as info:
        read_all(damaged)
    assert not isinstance(info.value, shardload.CorruptShardError)


@pytest.mark.slow
def test_low_fd_limit_still_reads_every_sample(tmp_path: Path) -> None:
    # A real RLIMIT_NOFILE below the number of shards: least recently used shards are closed to make room.
    out = tmp_path / "set"
    shardload.write(shardload.testing.synthetic_samples(200, seed=1), out, num_shards=40, progress=False)
    code = (
        "import resource, shardload\n"
        "used = len(__import__('os').listdir('/proc/self/fd'))\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (used + 12, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        f"ds = shardload.open({str(out)!r})\n"
        "print(sum(int(ds[i]['tokens'].sum()) for i in range(len(ds))))\n"
    )
    want = sum(int(s["tokens"].sum()) for s in shardload.testing.synthetic_samples(200, seed=1))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) == want


# -- 4. permissions ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SET_FILES)
def test_permission_denied_is_a_permission_problem_not_corruption(
    damaged: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = set_file(damaged, name)
    if os.geteuid() == 0:  # root reads anything: make the kernel's answer the one a user would get
        fail_open_of(monkeypatch, path, errno.EACCES)
    else:
        path.chmod(0)
    assert_only_clean_errors(damaged, "permission denied. Fix its permissions")


# -- 5. verify follows the loader's path rules --------------------------------------------------------------
@pytest.mark.parametrize("name", ["lengths.npy", "lengths.tokens.npy"])
def test_verify_refuses_a_lengths_index_linked_out_of_the_set(damaged: Path, tmp_path: Path, name: str) -> None:
    os.replace(damaged / name, tmp_path / name)
    (damaged / name).symlink_to(tmp_path / name)
    report = verify(damaged)
    assert [(p.file, p.reason) for p in report.problems] == [(name, "outside_set")]
    assert "outside the shard set" in report.problems[0].detail


# -- 6. odd paths --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("shards/" + "x" * 300 + ".arrow", "too long"),
        ("/".join(["d" * 200] * 30), "too long"),
        ("shards/\ud800.arrow", "not a valid file name"),
    ],
    ids=["name-over-255-bytes", "path-over-4096-bytes", "lone-surrogate"],
)
def test_manifest_paths_no_file_can_have_are_manifest_errors(damaged: Path, value: str, error: str) -> None:
    m = read_manifest(damaged)
    m["shards"][0]["file"] = value
    write_manifest(damaged, m)
    with pytest.raises(shardload.ManifestError, match=error):
        read_all(damaged)


def test_manifest_path_through_a_file_is_a_missing_shard(damaged: Path) -> None:
    m = read_manifest(damaged)
    m["shards"][0]["file"] = "lengths.npy/shard.arrow"
    write_manifest(damaged, m)
    with pytest.raises(shardload.CorruptShardError, match=r"shard 0 .*is missing"):
        read_all(damaged)
    assert [p.reason for p in verify(damaged).problems] == ["missing"]


def test_loop_of_links_is_a_shard_set_error(damaged: Path) -> None:
    path = shard_file(damaged, 0)
    path.unlink()
    path.symlink_to(path.name)
    with pytest.raises(shardload.ShardSetError, match=r"shard 0 .*cannot be resolved"):
        read_all(damaged)
    assert [p.reason for p in verify(damaged).problems] == ["unreadable"]


def test_set_directory_path_too_long(tmp_path: Path) -> None:
    with pytest.raises(shardload.ManifestError, match="path is too long"):
        shardload.open(tmp_path / ("x" * 300))


@pytest.fixture
def non_utf8_set(pristine: Path, tmp_path: Path) -> Path:
    out = tmp_path / os.fsdecode(b"set-\xff")
    shutil.copytree(pristine, out)
    return out


def test_non_utf8_set_directory_is_named_not_reported_as_corrupt(non_utf8_set: Path) -> None:
    ds = shardload.open(non_utf8_set)
    assert len(ds.lengths) == 120
    with pytest.raises(shardload.ShardSetError, match="not valid UTF-8.*rename") as info:
        ds[0]
    assert not isinstance(info.value, shardload.CorruptShardError)
    assert {p.reason for p in verify(non_utf8_set).problems} == {"unreadable"}


def cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "shardload", *map(os.fsencode, args)],
        capture_output=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(("command", "code"), [("inspect", 0), ("verify", 1)])
def test_cli_on_a_non_utf8_set_with_an_ascii_stdout(non_utf8_set: Path, command: str, code: int) -> None:
    run = cli(command, non_utf8_set, env={"PYTHONIOENCODING": "ascii"})
    assert run.returncode == code, run.stderr.decode(errors="replace")
    assert b"internal error" not in run.stderr


@pytest.mark.parametrize("command", ["inspect", "verify", "plan"])
def test_cli_on_a_set_with_a_fifo_manifest_exits_5(damaged: Path, command: str) -> None:
    (damaged / "manifest.json").unlink()
    os.mkfifo(damaged / "manifest.json")
    extra = ["--max-tokens", "500", "--world-size", "2"] if command == "plan" else []
    run = cli(command, damaged, *extra)
    assert run.returncode == 5, run.stderr
    assert b"FIFO" in run.stderr


# -- 7. hostile lengths indexes ------------------------------------------------------------------------------
def long_samples(lengths: list[int]) -> list[dict[str, np.ndarray]]:
    return [{"tokens": np.full(n, 7, dtype=np.int32)} for n in lengths]


@pytest.fixture(scope="module")
def long_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One variable field, lengths up to 70,000 (beyond int16)."""
    out = tmp_path_factory.mktemp("long") / "set"
    shardload.write(long_samples([100, 40_000, 70_000, 5, 200]), out, num_shards=2, shuffle=False, progress=False)
    return out


def save_npy(path: Path, arr: np.ndarray) -> None:
    path.unlink()
    np.save(path, arr, allow_pickle=False)


HOSTILE_INDEXES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "uint64-above-int64-max": lambda a: np.where(np.arange(len(a)) == 1, 2**63 + 5, a).astype(np.uint64),
    "negative": lambda a: np.where(np.arange(len(a)) == 3, -5, a).astype(np.int64),
    "int16-wrapped-negative": lambda a: a.astype(np.int16),  # 40,000 -> -25,536
    "int16-wrapped-positive": lambda a: np.where(a == 40_000, 1, a).astype(np.int16),  # only 70,000 -> 4,464
    "int8-wrapped": lambda a: a.astype(np.int8),
}


@pytest.mark.parametrize("hostile", list(HOSTILE_INDEXES))
def test_hostile_lengths_index_is_refused_on_open(long_set: Path, tmp_path: Path, hostile: str) -> None:
    root = Path(shutil.copytree(long_set, tmp_path / "set"))
    want = np.load(root / "lengths.npy")
    save_npy(root / "lengths.npy", HOSTILE_INDEXES[hostile](want))
    with pytest.raises(shardload.ManifestError, match=r"lengths\.npy"):
        _ = shardload.open(root).lengths
    assert [p.file for p in verify(root).problems if p.shard is None] == ["lengths.npy"]
    # the same values in any other integer layout are read correctly
    for layout in (want.astype(">i8"), np.asfortranarray(want.astype("<u4")), want.astype("<i8")):
        save_npy(root / "lengths.npy", layout)
        np.testing.assert_array_equal(shardload.open(root).lengths, want)
        assert read_all(root) == 5
        assert verify(root).ok


def test_lengths_index_with_trailing_bytes_is_refused(long_set: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(long_set, tmp_path / "set"))
    with open(root / "lengths.npy", "ab") as fh:
        fh.write(b"\0" * 8)
    with pytest.raises(shardload.ManifestError, match=r"lengths\.npy.*bytes.*truncated or damaged"):
        _ = shardload.open(root).lengths
