"""A DataLoader worker killed, stopped or starved mid-epoch: an error naming the cause, never a hang."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.distributed.watchdog import Outcome, python, run_with_watchdog

JOB = Path(__file__).with_name("worker_death_job.py")


def run_job(tmp_path: Path, mode: str, timeout: float = 120) -> tuple[Outcome, str]:
    outcome = run_with_watchdog(python(str(JOB), str(tmp_path / "set"), mode), timeout=timeout)
    assert not outcome.hung, outcome.tail()
    killed = re.search(r"KILLED (\d+)", outcome.output)
    assert killed, outcome.output
    # Invariant: the loop raised (never a hang, never a finished epoch with batches missing)
    assert outcome.returncode == 3, outcome.output
    return outcome, killed.group(1)


@pytest.mark.slow
def test_killed_worker_raises_in_the_main_process(tmp_path: Path) -> None:
    outcome, pid = run_job(tmp_path, "KILL")
    # Invariant: the loop raised an error naming the dead worker and the signal (never a bare
    # ConnectionResetError from the tensor transfer); torch's own error may come first
    assert re.search(
        rf"RAISED (WorkerError: DataLoader worker \(pid {pid}\) was killed by SIGKILL: most often the out-of-memory"
        rf"|RuntimeError: DataLoader worker \(pid(\(s\))? {pid}\) (is killed by signal|exited unexpectedly))",
        outcome.output,
    ), outcome.output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("TERM-outside", r"was killed by SIGTERM: it was stopped from outside"),
        # torch's worker exits with status 0 on a SIGTERM from its parent: the message must say SIGTERM
        (
            "TERM-parent",
            r"exited with status 0 without sending its batch: it was stopped by a SIGTERM from the "
            r"training process",
        ),
        ("SEGV", r"was killed by SIGSEGV: a crash in native code"),
    ],
)
def test_a_worker_stopped_by_a_signal_is_reported_by_its_cause(tmp_path: Path, mode: str, expected: str) -> None:
    outcome, pid = run_job(tmp_path, mode)
    # Invariant: the message names the real cause, and does not blame memory
    assert re.search(rf"RAISED WorkerError: DataLoader worker \(pid {pid}\) {expected}", outcome.output), outcome.output
    assert "memory is short" not in outcome.output


@pytest.mark.slow
def test_a_shard_truncated_under_a_worker_is_reported_as_such(tmp_path: Path) -> None:
    outcome, _ = run_job(tmp_path, "truncate")
    raised = re.search(r"RAISED (\w+): (.*)", outcome.output)
    assert raised, outcome.output
    kind, message = raised.groups()
    if kind == "WorkerError":  # SIGBUS in the worker: the shards are checked against the manifest
        assert re.match(r"DataLoader worker \(pid \d+\) was killed by SIGBUS", message), message
        assert "shard-000000" in message and "the manifest says" in message, message
    else:  # or a check at shard open caught the change first
        assert kind in ("ShardSetChangedError", "CorruptShardError"), outcome.output
    # Invariant: a damaged shard is never blamed on memory, and the user is sent to `shardload verify`
    assert "shardload verify" in message, message
    assert "memory is short" not in outcome.output and "shared memory" not in message


@pytest.mark.slow
def test_a_stopped_worker_raises_within_the_timeout(tmp_path: Path) -> None:
    outcome, pid = run_job(tmp_path, "STOP")
    # Invariant: with timeout=3 a stopped worker ends in an error naming it, within seconds, not a hang
    assert re.search(
        rf"RAISED WorkerError: at batch \d+ of epoch 0: no batch came from the DataLoader workers within "
        rf"timeout=3 s \(worker pid {pid} is stopped",
        outcome.output,
    ), outcome.output
    after = re.search(r"AFTER ([\d.]+)", outcome.output)
    assert after and float(after.group(1)) < 3 + 20, outcome.output
    assert "raise timeout" in outcome.output


@pytest.mark.slow
def test_the_job_exits_after_a_stopped_worker_raised(tmp_path: Path) -> None:
    """The job leaves the stopped worker alone: the loader ends it, so the interpreter's exit does not wait on it."""
    outcome, _ = run_job(tmp_path, "STOP-leave", timeout=30)
    assert "RAISED WorkerError" in outcome.output, outcome.output
    # Invariant: when the error reaches the caller the stopped worker is gone (not left for exit to wait on)
    assert re.search(r"WORKER (gone|zombie)", outcome.output), outcome.output


def test_signal_names_and_one_line_errors_have_one_definition() -> None:
    """The loader's and prepare's worker messages name a signal the same way, as every reader words an error."""
    import ast
    import doctest

    import shardload._base.messages

    root = Path(shardload._base.messages.__file__).parent
    defined = {
        (node.name, str(path.relative_to(root)))
        for path in root.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") in ("one_line", "signal_name")
    }
    assert defined == {("one_line", "messages.py"), ("signal_name", "messages.py")}
    assert doctest.testmod(shardload._base.messages).failed == 0
