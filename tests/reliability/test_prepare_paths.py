"""Paths given to prepare and the run around them: every file once, nothing left behind, true messages.

One area per section: how source directories and globs are listed (linked
folders, loops, the output directory, a file named twice, an empty name), the
output path and what a refused or failed run leaves, the open-files limit,
options that did nothing or the wrong thing without a word, and Ctrl-C while
the command starts.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.cli import main

REPO = Path(__file__).resolve().parents[2]


def tok(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int32)


def npy_files(folder: Path, lengths: list[int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for k, n in enumerate(lengths):
        np.save(folder / f"{k}.npy", tok(n))


def lengths_of(out: Path) -> list[int]:
    ds = shardload.open(out)
    return sorted(len(ds[i]["data"]) for i in range(len(ds)))


def jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- listing: linked folders, loops, the output directory, the same file twice -----------------------
def test_a_linked_folder_in_a_source_directory_is_read(tmp_path: Path) -> None:
    npy_files(tmp_path / "real", [10, 11, 12, 13, 14])
    npy_files(tmp_path / "top", [1, 2])
    (tmp_path / "top" / "linked").symlink_to("../real")
    result = shardload.prepare(tmp_path / "top", tmp_path / "out", progress=False)
    # Its 5 files are read, as a glob over the same tree reads them (it gave 2 samples, without a word).
    assert result.samples == 7 and result.skipped_files == 0
    assert lengths_of(tmp_path / "out") == [1, 2, 10, 11, 12, 13, 14]
    globbed = shardload.prepare(str(tmp_path / "top" / "**" / "*.npy"), tmp_path / "glob", progress=False)
    assert globbed.samples == 7


@pytest.mark.parametrize("target", ["..", ".", "/"], ids=["parent", "itself", "root"])
def test_a_symbolic_link_loop_is_refused_by_name(tmp_path: Path, target: str) -> None:
    npy_files(tmp_path / "src" / "d", [3])
    (tmp_path / "src" / "d" / "up").symlink_to(target)
    for source in (tmp_path / "src", str(tmp_path / "src" / "**" / "*.npy")):
        with pytest.raises(shardload.InputError, match=r"d/up: a symbolic link loop"):
            shardload.prepare(source, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_folders_nested_too_deeply_are_an_input_error(tmp_path: Path) -> None:
    deep = tmp_path / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY)
    try:  # 1100 levels, made relative to a descriptor (a path that long would be refused by the system)
        for _ in range(1100):
            os.mkdir("a", dir_fd=fd)
            fd, old = os.open("a", os.O_RDONLY, dir_fd=fd), fd
            os.close(old)
    finally:
        os.close(fd)
    try:  # It was a RecursionError: exit 70, "a bug in shardload".
        with pytest.raises(shardload.InputError, match=r"deep: folders nested too deeply to list"):
            shardload.prepare(deep, tmp_path / "out", progress=False)
    finally:  # one level at a time: shutil.rmtree (pytest's clean-up) recurses as deep
        while (deep / "a").exists():
            (deep / "a").rename(tmp_path / "up")
            if (tmp_path / "up" / "a").exists():
                (tmp_path / "up" / "a").rename(deep / "a")
            (tmp_path / "up").rmdir()


def test_a_folder_reached_twice_is_refused(tmp_path: Path) -> None:
    npy_files(tmp_path / "data" / "v2", [1, 2])
    (tmp_path / "data" / "latest").symlink_to("v2")
    with pytest.raises(shardload.InputError, match=r"data/v2: leads to the folder .*data/latest a second time"):
        shardload.prepare(tmp_path / "data", tmp_path / "out", progress=False)


def test_the_same_file_named_twice_is_refused(tmp_path: Path) -> None:
    a = jsonl(tmp_path / "v.jsonl", [{"t": [1, 2]}, {"t": [3]}])
    (tmp_path / "link.jsonl").symlink_to("v.jsonl")
    jsonl(tmp_path / "w.jsonl", [{"t": [4]}])
    twice = [
        ([str(a), str(tmp_path / "." / "v.jsonl")], "named twice"),
        ([str(a), str(tmp_path / "link.jsonl")], "reached again through a link"),
        ([str(tmp_path / "[vw].jsonl"), str(a)], "named twice"),
    ]
    for sources, how in twice:
        with pytest.raises(shardload.InputError, match=rf"is the same file as .*v.jsonl \({how}\)"):
            shardload.prepare(sources, tmp_path / "out", progress=False)


def test_a_glob_over_the_output_leaves_the_set_out_and_counts_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    io = tmp_path / "io"
    npy_files(io, [1, 2, 3, 4, 5])
    pattern = str(io / "**" / "*.npy")
    shardload.prepare(pattern, io / "out", field="t", progress=False)
    # The rerun once read the set's own lengths.npy and origin.npy as 2 more samples.
    args = ["prepare", pattern, "-o", str(io / "out"), "--field", "t", "--overwrite", "--json", "--no-progress"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples"] == 5
    assert summary["skipped"] == {"output": 2} and summary["skipped_files"] == 2
    # A directory source over it: every file of the set is counted, and the counts add up.
    result = shardload.prepare(io, io / "out", field="t", overwrite=True, progress=False)
    assert result.samples == 5
    set_files = [p for p in (io / "out").rglob("*") if p.is_file()]
    assert result.skipped == {"output": len(set_files)} and result.skipped_files == len(set_files)


def test_a_source_that_is_the_output_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "in2"
    folder.mkdir()
    jsonl(folder / "a.jsonl", [{"t": [1]}])
    for source in (folder, folder / "a.jsonl"):
        with pytest.raises(shardload.InputError, match=r"in2.*output directory"):
            shardload.prepare(source, folder, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == ["a.jsonl"]  # no .prepare.lock left in the user's folder


def test_an_empty_source_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    jsonl(tmp_path / "a.jsonl", [{"t": [1]}])  # '' once listed the current directory and read this
    with pytest.raises(shardload.InputError, match=r"an empty source name"):
        shardload.prepare("", tmp_path / "out", progress=False)
    assert main(["prepare", "", "-o", str(tmp_path / "cli")]) == 3
    assert not (tmp_path / "out").exists() and not (tmp_path / "cli").exists()


# -- the output path, and what a refused or failed run leaves -----------------------------------------
def test_a_refused_run_leaves_no_lock_file(tmp_path: Path) -> None:
    src = jsonl(tmp_path / "a.jsonl", [{"t": [1, 2]}])
    user = tmp_path / "notes"
    user.mkdir()
    (user / "readme.txt").write_text("mine")
    with pytest.raises(shardload.OutputExistsError, match="not empty and is not a shard set"):
        shardload.prepare(src, user, progress=False)
    assert sorted(p.name for p in user.iterdir()) == ["readme.txt"]
    shardload.prepare(src, tmp_path / "set", progress=False)
    with pytest.raises(shardload.OutputExistsError, match="already holds a shard set"):
        shardload.prepare(src, tmp_path / "set", progress=False)
    assert not (tmp_path / "set" / ".prepare.lock").exists()
    # Checked before the lock is taken, a run in progress is still named as one, not as an interrupted run.
    with pytest.raises(KeyboardInterrupt):
        shardload.write(interrupted_after(3), tmp_path / "busy", chunk_bytes=1, progress=False)
    with open(tmp_path / "busy" / ".prepare.lock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(shardload.OutputLockedError, match="another prepare is writing"):
            shardload.write(interrupted_after(3), tmp_path / "busy", progress=False)


def interrupted_after(n: int) -> Any:
    for k in range(10):
        if k == n:
            raise KeyboardInterrupt
        yield {"t": tok(k + 1)}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: (d / "out").symlink_to("nowhere"), r"out: is a symbolic link to 'nowhere', which does not exist"),
        (lambda d: (d / "out").symlink_to("out"), r"out: is a symbolic link to 'out', a loop of links"),
        (lambda d: (d / "f").write_text("x"), r"cannot create the output directory \(Not a directory\)"),
    ],
    ids=["dangling-link", "link-loop", "under-a-file"],
)
def test_an_output_that_cannot_be_created_says_so_without_resume(tmp_path: Path, make: Any, message: str) -> None:
    src = jsonl(tmp_path / "a.jsonl", [{"t": [1]}])
    make(tmp_path)
    out = tmp_path / "f" / "sub" if (tmp_path / "f").exists() else tmp_path / "out"
    with pytest.raises(shardload.OutputError, match=message) as info:
        shardload.prepare(src, out, progress=False)
    assert "--resume" not in str(info.value) and "File exists" not in str(info.value)


def test_bad_input_after_staging_says_so_in_open_and_in_the_rerun(tmp_path: Path) -> None:
    rows = [{"t": list(range(300))} for _ in range(3000)] + [{"t": "x"}]
    src = jsonl(tmp_path / "a.jsonl", rows)
    out = tmp_path / "out"
    with pytest.raises(shardload.InputError, match=r"a.jsonl: line 3001"):
        shardload.prepare(src, out, chunk_bytes=1 << 16, progress=False)
    assert list((out / ".prepare" / "staging").glob("*.arrow"))  # some chunks were staged
    # A bare "rerun it with --resume" would fail the same way: both messages say why it stopped.
    with pytest.raises(shardload.ManifestError, match=r"stopped on bad input \(.*a.jsonl: line 3001.*fix the input"):
        shardload.open(out)
    with pytest.raises(shardload.OutputExistsError, match=r"stopped on bad input \(.*line 3001.*Fix the input"):
        shardload.prepare(src, out, chunk_bytes=1 << 16, progress=False)
    # Fixed, the resume finishes; the record of the failure goes with the work dir.
    jsonl(src, rows[:-1] + [{"t": [1]}])
    assert shardload.prepare(src, out, chunk_bytes=1 << 16, progress=False, resume=True).samples == 3001


def test_disk_full_while_staging_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardload.formats.arrow import ArrowShardWriter

    def full(self: Any, path: Path, columns: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(ArrowShardWriter, "write", full)
    src = jsonl(tmp_path / "a.jsonl", [{"t": [1]}])
    with pytest.raises(shardload.OutputError) as info:
        shardload.prepare(src, tmp_path / "out", progress=False)
    assert str(info.value).startswith(f"{tmp_path / 'out'}: staging the samples of {src} failed")  # not u00000000


def test_resume_of_write_counts_from_the_start_of_the_input(tmp_path: Path) -> None:
    data = [{"t": tok(50)} for _ in range(40)]
    out = tmp_path / "out"

    def stop_after(n: int) -> Any:
        for k, s in enumerate(data):
            if k == n:
                raise KeyboardInterrupt
            yield s

    with pytest.raises(KeyboardInterrupt):
        shardload.write(stop_after(35), out, chunk_bytes=2000, progress=False)
    with pytest.raises(shardload.OutputError) as info:
        shardload.write(data[:12], out, chunk_bytes=2000, progress=False, resume=True)
    msg = str(info.value)
    # Chunks hold 10 samples: the input ends at sample 12 of its whole, not "sample 2 of a chunk".
    assert "the iterable given to write() now ends before sample 12" in msg and "staged 20 samples" in msg


# -- the open-files limit ---------------------------------------------------------------------------
def run_with_fd_limit(code: str, limit: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))\n" + textwrap.dedent(
        code
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4096, reason="needs a hard limit >= 4096")
def test_many_shards_are_checked_one_at_a_time_before_the_commit(tmp_path: Path) -> None:
    jsonl(tmp_path / "n.jsonl", [{"t": list(range(k % 5 + 1))} for k in range(700)])
    # 600 shards under a limit of 256: the pre-commit open kept every shard mapped and failed as "corrupt".
    proc = run_with_fd_limit(
        """
        import shardload
        r = shardload.prepare("n.jsonl", "out", num_shards=600, progress=False)
        print(r.shards)
        """,
        256,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["600"]


def test_running_out_of_descriptors_says_ulimit_and_keeps_the_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jsonl(tmp_path / "w.jsonl", [{f"f{k}": list(range(i + 1)) for k in range(300)} for i in range(3)])
    # 300 variable fields: the loader maps 300 lengths indexes, more than a limit of 200 allows.
    proc = run_with_fd_limit(
        """
        import shardload
        try:
            shardload.prepare("w.jsonl", "out", progress=False)
        except shardload.OutputError as exc:
            print("OutputError:", exc)
        """,
        200,
        tmp_path,
    )
    out = proc.stdout
    assert out.startswith("OutputError:"), proc.stdout + proc.stderr
    assert "ulimit -n` is 200" in out and "rerun the same command with --resume" in out and "corrupt" not in out
    assert (tmp_path / "out" / ".prepare" / "manifest.json").exists()  # the finished work waits for the resume
    monkeypatch.chdir(tmp_path)
    assert shardload.prepare("w.jsonl", "out", progress=False, resume=True).samples == 3


def test_descriptors_running_out_while_reading_says_ulimit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardload.prepare import pipeline, schedule

    real = pipeline.read_unit
    calls = []

    def no_descriptors(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # the first sample, read for the schema before anything is created
            return real(*args)
        try:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        except OSError:
            raise shardload.InputError("a.jsonl: cannot be read (Too many open files)") from None

    src = jsonl(tmp_path / "a.jsonl", [{"t": [1]}])
    shardload.prepare(src, tmp_path / "ref", progress=False)
    monkeypatch.setattr(pipeline, "read_unit", no_descriptors)
    monkeypatch.setattr(schedule, "read_unit", no_descriptors)  # where the units are staged
    with pytest.raises(shardload.OutputError, match=r"ran out of file descriptors.*`ulimit -n`.*--resume"):
        shardload.prepare(src, tmp_path / "ref", overwrite=True, progress=False)
    assert not (tmp_path / "ref" / ".prepare" / "FAILED").exists()  # not recorded as bad input


# -- options that did nothing, or the wrong thing, without a word ------------------------------------
def test_more_shards_than_samples_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = jsonl(tmp_path / "a.jsonl", [{"t": [1, 2]}, {"t": [3]}, {"t": [4]}])
    assert main(["prepare", str(src), "-o", str(tmp_path / "out"), "--num-shards", "5", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["shards"] == 3
    assert summary["warnings"] == [
        "num_shards (--num-shards) asked for 5 shards, but there are only 3 samples and a shard holds at least "
        "one: the set has 3 shards"
    ]
    assert "asked for 5 shards" in captured.err


def test_a_field_given_two_dtypes_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = jsonl(tmp_path / "a.jsonl", [{"a": [1]}])
    args = ["prepare", str(src), "-o", str(tmp_path / "out"), "--dtype", "a=int32", "--dtype", "a=int8"]
    assert main(args) == 2
    assert "--dtype names field 'a' twice (int32, then int8)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_field_without_npy_sources_is_refused(tmp_path: Path) -> None:
    src = jsonl(tmp_path / "a.jsonl", [{"a": [1]}])
    with pytest.raises(shardload.InputError, match=r"--field 'x' names the one array of .npy files.*\(jsonl"):
        shardload.prepare(src, tmp_path / "out", field="x", progress=False)
    np.save(tmp_path / "b.npy", tok(3))  # with .npy files it names their field
    assert shardload.prepare(tmp_path / "b.npy", tmp_path / "ok", field="x", progress=False).samples == 1
    assert shardload.open(tmp_path / "ok").schema.names == ("x",)


# -- a shard gone because the set was re-prepared -----------------------------------------------------
def test_a_shard_removed_by_a_re_prepare_is_a_changed_set(tmp_path: Path) -> None:
    out = tmp_path / "set"
    shardload.write([{"t": tok(k + 1)} for k in range(8)], out, num_shards=4, progress=False)
    ds = shardload.open(out)
    shardload.write([{"t": tok(k + 1)} for k in range(8)], out, num_shards=2, overwrite=True, progress=False)
    assert not (out / ds.shards[3].file).exists()
    with pytest.raises(shardload.ShardSetChangedError, match="re-prepared"):
        ds.shard_columns(3)


# -- Ctrl-C while the command starts ---------------------------------------------------------------
CTRL_C_DURING_IMPORTS = """
import builtins, os, signal, sys
real = builtins.__import__
def hook(name, *args, **kwargs):
    if name == "numpy":  # the library is importing: press Ctrl-C now
        builtins.__import__ = real
        os.kill(os.getpid(), signal.SIGINT)
    return real(name, *args, **kwargs)
builtins.__import__ = hook
sys.argv = [os.path.join(os.path.dirname(sys.executable), "shardload"), "--version"]
from shardload.cli import main   # what the installed `shardload` script does
sys.exit(main())
"""


def test_ctrl_c_while_the_command_imports_exits_130_without_a_traceback() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run(code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
        )

    proc = run(CTRL_C_DURING_IMPORTS)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert proc.stderr.strip() == "shardload: error: interrupted"
    # A program of the user's that imports shardload gets its KeyboardInterrupt as usual.
    program = CTRL_C_DURING_IMPORTS.replace("sys.argv = [", "unused = [").replace(
        "from shardload.cli import main", "import shardload"
    )
    proc = run(program.replace("sys.exit(main())", ""))
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in proc.stderr


def test_stopped_after_the_commit_says_the_set_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardload.prepare import pipeline

    def stopped(*args: Any) -> Any:
        raise KeyboardInterrupt  # Ctrl-C (or SIGTERM) once the set is committed and the work dir removed

    monkeypatch.setattr(pipeline, "result_of", stopped)
    src = jsonl(tmp_path / "a.jsonl", [{"t": [1, 2]}, {"t": [3]}])
    out = tmp_path / "out"
    # It said "interrupted; rerun ... with --resume" (exit 130), and that resume was refused: the set was complete.
    assert main(["prepare", str(src), "-o", str(out), "--no-progress"]) == 0
    assert f"interrupted after {out} was complete; nothing to resume" in capsys.readouterr().err
    assert len(shardload.open(out)) == 2 and not (out / ".prepare").exists()


def test_a_new_set_unreadable_for_a_reason_of_the_system_keeps_the_work_for_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Permission denied or an I/O error while the finished set is opened before the commit says nothing
    # about its content: the work is kept and named, and --resume commits it once the cause is fixed.
    from shardload._base.setfiles import os_error
    from shardload.errors import CorruptShardError
    from shardload.sets.shardset import ShardSet

    real = ShardSet.shard_columns

    def denied(self: Any, k: int) -> Any:
        path = self.path / "shards" / "shard-000000.arrow"
        raise os_error(
            PermissionError(errno.EACCES, "Permission denied"), path, what="shard 0", error=CorruptShardError
        )

    monkeypatch.setattr(ShardSet, "shard_columns", denied)
    src = jsonl(tmp_path / "a.jsonl", [{"t": [1, 2]}, {"t": [3]}])
    out = tmp_path / "out"
    with pytest.raises(shardload.OutputError, match=r"shard-000000\.arrow.*permission denied.*--resume") as info:
        shardload.prepare(src, out, progress=False)
    assert "Fix the input" not in str(info.value)
    assert (out / ".prepare" / "manifest.json").exists()
    assert not (out / ".prepare" / "FAILED").exists()  # not recorded as bad input
    monkeypatch.setattr(ShardSet, "shard_columns", real)
    assert shardload.prepare(src, out, resume=True, progress=False).samples == 2
    assert sorted(s["t"].tolist() for s in (shardload.open(out)[i] for i in range(2))) == [[1, 2], [3]]
