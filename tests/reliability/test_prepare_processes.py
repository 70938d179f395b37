"""Prepare's processes: workers die with the main process, the lock dies with the run, a dead worker is named.

Every run here is a real ``shardload prepare --workers 2`` in its own process
group, with a timeout; whatever is left of a group is killed in teardown.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardload
from shardload.formats.arrow import ArrowOptions, ArrowShardWriter
from shardload.formats.base import Columns
from shardload.prepare import gather as gather_module
from shardload.schema.fields import Schema
from shardload.testing import synthetic_samples

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--workers", "2", "--num-shards", "6", "--no-progress"]
RUN_TIMEOUT = 60.0


# -- running prepare in its own process group ----------------------------------------------------------
class Run:
    """One ``shardload prepare`` process (its own session), output to files so no orphan can block a pipe."""

    def __init__(self, src: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.log = out.with_name(out.name + f".{time.monotonic_ns()}.log")
        full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        for name in ("SHARDLOAD_KILL_AT", "SHARDLOAD_PAUSE_AT"):
            if not env or name not in env:
                full_env.pop(name, None)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "shardload", "prepare", str(src), "-o", str(out), *ARGS, *extra],
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pgid = self.proc.pid
        RUNS.append(self)

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        return self.proc.wait(timeout=timeout)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def workers(self) -> list[int]:
        return [pid for pid, ppid, _ in processes() if ppid == self.proc.pid]

    def left(self) -> list[int]:
        """Live (not zombie) processes of the run's group."""
        return [pid for pid, _, pgrp in processes() if pgrp == self.pgid]

    def kill_group(self) -> None:
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)


RUNS: list[Run] = []


@pytest.fixture(autouse=True)
def _no_orphans() -> Iterator[None]:
    yield
    while RUNS:
        RUNS.pop().kill_group()


def processes() -> list[tuple[int, int, int]]:
    """``(pid, ppid, pgrp)`` of every live process (zombies are dead: only their exit status is left)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] not in ("Z", "X"):
            found.append((int(entry), int(fields[1]), int(fields[2])))
    return found


def wait_for(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def digest(out: Path) -> dict[str, str]:
    """sha256 of every shard and index file of a finished set."""
    ds = shardload.open(out)
    files = [out / s.file for s in ds.shards] + sorted(out.glob("*.npy"))
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight JSON Lines files (eight units of work), 1,600 samples."""
    d = tmp_path_factory.mktemp("processes") / "in"
    d.mkdir()
    samples = synthetic_samples(1600, seed=5)
    for part in range(8):
        lines = [
            json.dumps({"tokens": s["tokens"].tolist(), "label": int(s["label"])})
            for s in samples[part * 200 : (part + 1) * 200]
        ]
        (d / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    return d


@pytest.fixture(scope="module")
def reference(src: Path) -> dict[str, str]:
    out = src.parent / "reference"
    run = Run(src, out)
    try:
        assert run.wait() == 0, run.output
    finally:
        run.kill_group()
    return digest(out)


def paused_run(src: Path, out: Path, point: str = "staged:1") -> Run:
    """A run whose two workers have both stopped at ``point`` (the main process is still waiting on them)."""
    run = Run(src, out, env={"SHARDLOAD_PAUSE_AT": point})
    staging = out / ".prepare" / "staging"
    wait_for(lambda: len(list(staging.glob("*.arrow"))) >= 2 or run.proc.poll() is not None, 30, "two staged chunks")
    assert run.proc.poll() is None, run.output
    assert len(run.workers()) == 2, run.output
    return run


def assert_resume_gives_the_reference(src: Path, out: Path, reference: dict[str, str]) -> None:
    resumed = Run(src, out, "--resume")
    code = resumed.wait()
    assert code == 0, resumed.output  # never "another prepare is writing": the lock died with the run
    assert digest(out) == reference
    assert not (out / ".prepare").exists() and not (out / ".prepare.lock").exists()


# -- the main process killed: its workers follow, the lock is free ------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "code", "message"),
    [
        (signal.SIGKILL, -signal.SIGKILL, None),
        (signal.SIGTERM, 143, "stopped by SIGTERM; rerun the same command with --resume"),
        (signal.SIGINT, 130, "interrupted; rerun the same command with --resume"),
    ],
    ids=["SIGKILL", "SIGTERM", "SIGINT"],
)
def test_killing_the_main_process_ends_its_workers_and_frees_the_output(
    src: Path, reference: dict[str, str], tmp_path: Path, signum: int, code: int, message: str | None
) -> None:
    out = tmp_path / "out"
    run = paused_run(src, out)
    workers = run.workers()
    os.kill(run.proc.pid, signum)  # the main process only, as the OOM killer or an orchestrator would
    assert run.wait(timeout=30) == code, run.output
    if message:
        assert f"shardload: error: {message}" in run.output, run.output
    assert "internal error" not in run.output
    # Invariant: no worker outlives the main process (each would hold the output for ever)
    wait_for(lambda: not run.left(), 10, f"workers {workers} to exit")
    assert_resume_gives_the_reference(src, out, reference)


def test_a_forked_child_does_not_keep_the_output_lock(tmp_path: Path) -> None:
    # Any child forked while the lock is held (by a user's code as much as by the pool) lets go of it.
    script = f"""
import os, signal, sys, time
from shardload.prepare.workdir import WorkDir
with WorkDir({str(tmp_path / "out")!r}, resume=True, overwrite=False):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    print("forked", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"forked"
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert [pid for pid, _, pgrp in processes() if pgrp == proc.pid], "the forked child is still running"
        from shardload.prepare.workdir import WorkDir

        with WorkDir(tmp_path / "out", resume=True, overwrite=False):  # not OutputLockedError
            pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- a worker killed: the main process says which and what to do --------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("point", ["staged:1", "shard:0"], ids=["staging", "writing shards"])
def test_a_killed_worker_is_named_with_its_signal(
    src: Path, reference: dict[str, str], tmp_path: Path, signum: int, point: str
) -> None:
    out = tmp_path / "out"
    if point == "staged:1":
        run = paused_run(src, out, point)
    else:
        run = Run(src, out, env={"SHARDLOAD_PAUSE_AT": point})
        wait_for(lambda: (out / ".prepare" / "shards" / "shard-000000.arrow").exists(), 30, "shard 0")
    victim = run.workers()[0]
    os.kill(victim, signum)
    assert run.wait(timeout=30) == 4, run.output  # OutputError, never 70 (a bug) nor a hang
    name = signal.Signals(signum).name
    step = "staging the samples" if point == "staged:1" else "writing shards"
    # the pid is named unless the pool's own SIGTERMs to the other workers make it ambiguous
    assert re.search(rf"a worker process of prepare (\(pid {victim}\) )?was killed by {name}", run.output), run.output
    if signum == signal.SIGKILL:
        assert f"(pid {victim})" in run.output, run.output
    assert step in run.output and "--resume" in run.output, run.output
    assert ("out-of-memory killer" in run.output) == (signum == signal.SIGKILL), run.output
    wait_for(lambda: not run.left(), 10, "the other worker to exit")
    assert_resume_gives_the_reference(src, out, reference)


# -- the main process killed at random moments --------------------------------------------------------------
@pytest.mark.slow
def test_main_process_killed_at_random_moments(src: Path, reference: dict[str, str], tmp_path: Path) -> None:
    """SIGKILL or SIGTERM of the main process only, anywhere in a run, then ``--resume``.

    Zero processes left over, zero hangs, zero exit 70, and the resumed set is
    byte-identical to an uninterrupted run.
    """
    start = time.monotonic()
    full = Run(src, tmp_path / "timing")
    assert full.wait() == 0, full.output
    duration = time.monotonic() - start
    rng = random.Random(13)
    for k in range(6):
        signum = (signal.SIGKILL, signal.SIGTERM)[k % 2]
        delay = rng.uniform(0.3, duration)
        out = tmp_path / f"out{k}"
        run = Run(src, out)
        time.sleep(delay)
        os.kill(run.proc.pid, signum)
        code = run.wait(timeout=30)
        where = f"kill {k}: {signal.Signals(signum).name} after {delay:.2f} s of {duration:.2f} s"
        # 0: it had finished; -SIGTERM: killed before the command installed its handler
        assert code in (0, -signal.SIGKILL, -signal.SIGTERM, 143), f"{where}: exit {code}\n{run.output}"
        assert "internal error" not in run.output, where
        wait_for(lambda run=run: not run.left(), 10, f"{where}: the workers to exit")  # type: ignore[misc]
        if code == 0:  # it had finished before the signal
            assert digest(out) == reference, where
        elif (out / "manifest.json").exists() and not (out / ".prepare").exists():
            # The signal landed during or right after the commit: the set is whole, and a resume says so.
            assert digest(out) == reference, where
            resumed = Run(src, out, "--resume")
            assert resumed.wait() == 4 and "no interrupted run to resume" in resumed.output, resumed.output
        else:
            assert_resume_gives_the_reference(src, out, reference)


# -- memory of writing a shard ----------------------------------------------------------------------------
def stage(
    tmp_path: Path, samples: list[dict[str, np.ndarray]], per_chunk: int
) -> tuple[Schema, list[Path], np.ndarray]:
    """Stage ``samples`` as Arrow chunks of ``per_chunk`` samples, as prepare does."""
    schema = Schema.infer(samples[0])
    paths, starts = [], [0]
    for k in range(0, len(samples), per_chunk):
        part = samples[k : k + per_chunk]
        path = tmp_path / f"chunk-{k:06d}.arrow"
        ArrowShardWriter(schema, ArrowOptions()).write(
            path, Columns.from_samples(schema, [schema.check(s, where="test") for s in part])
        )
        paths.append(path)
        starts.append(starts[-1] + len(part))
    return schema, paths, np.asarray(starts, dtype=np.int64)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=60),
    per_chunk=st.integers(1, 25),
    block=st.sampled_from([1, 3, 16, 1 << 18]),
    slice_min=st.sampled_from([1, 8, 1 << 30]),
    dtype=st.sampled_from(["uint8", "int32", "float32", "bool"]),
    seed=st.integers(0, 2**16),
)
def test_gather_returns_every_sample_in_the_asked_order(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lengths: list[int],
    per_chunk: int,
    block: int,
    slice_min: int,
    dtype: str,
    seed: int,
) -> None:
    monkeypatch.setattr(gather_module, "GATHER_BLOCK_ROWS", block)  # short samples in blocks and long ones alone
    monkeypatch.setattr(gather_module, "SLICE_MIN_ROWS", slice_min)  # blocks copied by slices, by index, or mixed
    rng = np.random.default_rng(seed)
    samples = [
        {
            "x": rng.integers(0, 2, size=(n, 3)).astype(dtype),
            "t": rng.integers(0, 200, size=n).astype(dtype),
            "label": np.asarray(rng.integers(0, 9, size=2), dtype=np.int64),
        }
        for n in lengths
    ]
    d = tmp_path / f"g{time.monotonic_ns()}"
    d.mkdir()
    schema, paths, starts = stage(d, samples, per_chunk)
    positions = rng.permutation(len(samples))[: rng.integers(1, len(samples) + 1)].astype(np.int64)
    cols = gather_module.gather(schema, positions, paths, starts)
    assert cols.num_samples == len(positions)
    for k, p in enumerate(positions):
        got = cols.sample(k)
        for name, want in samples[int(p)].items():
            np.testing.assert_array_equal(got[name], want)


@pytest.mark.parametrize("dtype", ["uint8", "int32", "float32"])
def test_gathering_a_shard_needs_memory_close_to_the_shard(tmp_path: Path, dtype: str) -> None:
    # 16 MB of data in short variable-length samples, spread over 8 chunks, gathered shuffled
    itemsize = np.dtype(dtype).itemsize
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 400, size=(16 << 20) // itemsize // 200)
    samples = [{"t": np.full(n, 7, dtype=dtype)} for n in lengths]
    schema, paths, starts = stage(tmp_path, samples, len(samples) // 8 + 1)
    shard = sum(s["t"].nbytes for s in samples)
    positions = rng.permutation(len(samples)).astype(np.int64)
    del samples
    tracemalloc.start()  # numpy reports its buffers to tracemalloc
    try:
        cols = gather_module.gather(schema, positions, paths, starts)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cols.fields["t"].values.nbytes == shard
    # Invariant: the shard, its offsets and bounded temporaries; not an int64 position per element
    # (that was 8-18x the shard for uint8)
    assert peak < 1.25 * shard + 16 * len(positions) * 8 + (16 << 20), (peak / shard, dtype)


class _Reaped:
    """A worker as the error sees it: its pid and its exit status, None where another thread reaped it."""

    def __init__(self, pid: int, exitcode: int | None) -> None:
        self.pid, self.exitcode = pid, exitcode

    def join(self, timeout: float | None = None) -> None:
        pass


@pytest.mark.parametrize(
    ("codes", "named"),
    [
        ([-signal.SIGTERM, None], None),  # the one SIGTERM seen may be the pool's own: no pid
        ([None, -signal.SIGTERM], None),
        ([-signal.SIGTERM, -signal.SIGTERM], None),
        ([-signal.SIGKILL, -signal.SIGTERM], 100),  # not the pool's signal: the first death
        ([None, -signal.SIGKILL], 101),
        ([-signal.SIGTERM], 100),  # the pool's one worker
    ],
)
def test_the_error_names_a_pid_only_where_it_is_the_first_death(codes: list[int | None], named: int | None) -> None:
    from shardload._base.pool import worker_died

    procs = [_Reaped(100 + k, code) for k, code in enumerate(codes)]
    message = str(worker_died(procs, Path("out"), "writing shards"))  # type: ignore[arg-type]
    assert "was killed by SIG" in message, message
    assert ("(pid " in message) == (named is not None), message
    if named is not None:
        assert f"(pid {named})" in message, message


def _exit_at_once() -> None:
    pass


@pytest.mark.parametrize("stop", [False, True], ids=["finished", "stopped"])
def test_a_worker_reaped_by_another_thread_is_not_taken_for_one_left_running(
    caplog: pytest.LogCaptureFixture, stop: bool
) -> None:
    import multiprocessing

    from shardload._base import pool as pool_module

    # The pool's manager thread joins the workers too. When it reaps one first, that worker's exitcode stays
    # None in this thread (waitpid finds no child): the same state as a worker reaped here by hand.
    p = multiprocessing.get_context("fork").Process(target=_exit_at_once)
    p.start()
    os.waitpid(p.pid, 0)
    assert p.exitcode is None  # the state the race leaves
    start = time.monotonic()
    with caplog.at_level("WARNING", logger="shardload"):
        if stop:

            class Done:  # stop_workers shuts its pool down first
                def shutdown(self, wait: bool, cancel_futures: bool) -> None:
                    pass

            pool_module.stop_workers(Done(), [p])  # type: ignore[arg-type]
        else:
            pool_module.end_finished_workers([p], "staging the samples")
    # Invariant: an exited worker is not waited for, not killed (its pid may be another's) and not blamed on a map
    assert time.monotonic() - start < 2.0
    assert not [r for r in caplog.records if "still ran" in r.getMessage()]
    assert not pool_module.still_running(p)
