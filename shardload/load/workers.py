"""What went wrong with a DataLoader worker, in words a user can act on.

When a batch does not arrive, :class:`~shardload.load.loader.ShardLoader` raises
:class:`~shardload.errors.WorkerError` with this module's answer: a dead worker's signal and what it usually
means, or each live worker's ``/proc/<pid>/stat`` state after ``timeout`` (docs/loading.md, "A stuck worker").
Nothing here runs while batches flow.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shardload._base.messages import signal_name
from shardload.sets.shardset import ShardSet

__all__ = ["dead_worker", "describe_exit", "describe_stall", "end_workers", "shards_changed_on_disk"]


def dead_worker(iterator: Any, wait: float = 2.0) -> Any:
    """The first worker process of a DataLoader iterator that has exited, or ``None``.

    A worker that just died may not be reaped yet, so this polls for up to ``wait`` seconds.
    """
    workers = list(getattr(iterator, "_workers", ()))
    deadline = time.monotonic() + wait
    while workers:
        for w in workers:
            if w.exitcode is not None:
                return w
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    return None


def shards_changed_on_disk(shard_set: ShardSet, limit: int = 3) -> list[str]:
    """Shards whose file is missing or no longer has the size the manifest records (one ``stat`` each)."""
    found: list[str] = []
    for k, info in enumerate(shard_set.manifest.shards):
        path = shard_set.path / info.file
        try:
            size = path.stat().st_size
        except OSError as exc:
            found.append(f"shard {k} ({path}): {exc.strerror or exc}")
        else:
            if size != info.bytes:
                found.append(f"shard {k} ({path}) now has {size} bytes, the manifest says {info.bytes}")
        if len(found) >= limit:
            break
    return found


def describe_exit(exitcode: int, shard_sets: Sequence[ShardSet]) -> str:
    """Why a worker that exited with ``exitcode`` (negative: killed by that signal) died, and what to do.

    ``shard_sets``: the sets the worker read (one, or each source of a mixture).
    """
    paths = [str(s.path) for s in shard_sets]
    verify = (
        f"run `shardload verify {paths[0]}`" if len(paths) == 1 else f"run `shardload verify` on {', '.join(paths)}"
    )
    if exitcode < 0:
        sig = -exitcode
        name = signal_name(sig)
        head = f"was killed by {name}"
        if sig == signal.SIGBUS:
            changed = [line for s in shard_sets for line in shards_changed_on_disk(s)]
            if changed:
                return (
                    f"{head}: a memory-mapped shard file shrank or was replaced while the worker read it "
                    f"({'; '.join(changed)}). The shard set was truncated or rewritten under the job: {verify}, "
                    "re-run prepare if it reports damage, then restart from the last checkpoint."
                )
            return (
                f"{head} (a read past the end of a mapped file): either a shard file was truncated or "
                f"replaced while mapped ({verify}), or shared memory for batches ran out (check `df -h /dev/shm`; "
                "in a container raise --shm-size). Restart from the last checkpoint."
            )
        if sig == signal.SIGKILL:
            return (
                f"{head}: most often the out-of-memory killer (look for 'Out of memory: Killed process' in "
                "`dmesg` or `journalctl -k`; then lower num_workers or prefetch_factor, or give the job more "
                "memory), else the job's scheduler or a user. Restart from the last checkpoint."
            )
        if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            return (
                f"{head}: it was stopped from outside (a scheduler preempting or ending the job, a user, a "
                "shutdown), not by a problem in the data or memory. Restart from the last checkpoint."
            )
        if sig in (signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGABRT):
            return (
                f"{head}: a crash in native code in the worker (a library used in a transform, or a damaged "
                f"shard read through a mapping: {verify}). Rerun with num_workers=0 to get a traceback in the "
                "training process."
            )
        return f"{head}. Restart from the last checkpoint; rerun with num_workers=0 to see a traceback."
    if exitcode == 0:
        # torch's SIGTERM handler in a worker exits with status 0 when the signal comes from the parent (so that
        # its own shutdown is not reported as a crash): after the fact, that cannot be told from an exit(0).
        return (
            "exited with status 0 without sending its batch: it was stopped by a SIGTERM from the training "
            "process (torch workers exit with status 0, not 'killed by SIGTERM', when their parent sends it: "
            "code or a signal handler in the training process, or a shutdown under way), or code running in the "
            "worker called exit(0). Nothing points at the data or at memory. Restart from the last checkpoint."
        )
    return (
        f"exited with status {exitcode}: an error in the worker that it could not report (its output above "
        "says more). Rerun with num_workers=0 to get the traceback in the training process."
    )


_STATES = {
    "T": "is stopped (SIGSTOP or job control): find who stopped it",
    "t": "is stopped by a debugger or tracer: detach it",
    "D": "is blocked in disk or network I/O (a slow or hung filesystem holding the shards?)",
    "Z": "has exited and is waiting to be reaped",
}


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ')'
    return stat[stat.rfind(")") + 2 :][:1] or None


def describe_stall(workers: Sequence[Any], timeout: float) -> str:
    """Why no batch came from ``workers`` within ``timeout`` seconds, and what to do."""
    notes = []
    for w in workers:
        pid = getattr(w, "pid", None)
        state = _proc_state(pid) if isinstance(pid, int) and pid != os.getpid() else None
        if state in _STATES:
            notes.append(f"worker pid {pid} {_STATES[state]}")
    found = "; ".join(notes) if notes else "no worker is stopped; they may be stuck or just slow"
    return (
        f"no batch came from the DataLoader workers within timeout={timeout:g} s ({found}). "
        "If batches can legitimately take longer (cold network storage, a heavy transform), raise timeout; "
        "otherwise see what a worker waits for (`py-spy dump --pid PID` while it hangs: the loader ends its "
        "workers when it raises this). Restart from the last checkpoint."
    )


def end_workers(iterator: Any) -> None:
    """End the workers of a DataLoader iterator now, after a failure: a stopped or stuck one included, at once.

    Left to torch, they end when the iterator is collected, and the iterator lives on in the traceback of the
    error: a stopped worker never handles torch's SIGTERM, and at interpreter exit ``multiprocessing`` joins it
    forever; torch's own shutdown waits ``MP_STATUS_CHECK_INTERVAL`` (5 s) for each worker stuck in its work (a
    stalled remote read), which would stretch the loader's ``timeout`` by 5 s a worker. The iteration has failed
    and nothing its workers hold is needed, so: torch stops watching their exits (as its shutdown does last), they
    are killed (a stopped one first continued, so that it can die), and torch's shutdown then closes the queues
    and the pinning thread, its joins finding the workers gone. Checked against torch 2.13
    (``_MultiProcessingDataLoaderIter._shutdown_workers``; absent from the single-process iterator).
    """
    workers = [w for w in getattr(iterator, "_workers", ()) if w.exitcode is None]
    if getattr(iterator, "_worker_pids_set", False):
        from torch.utils.data._utils import signal_handling

        # a killed worker must not raise in this process
        signal_handling._remove_worker_pids(id(iterator))  # type: ignore[attr-defined]
        iterator._worker_pids_set = False
    for w in workers:
        if _proc_state(w.pid) == "T":
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGCONT)
        w.kill()
    for w in workers:
        w.join(timeout=5)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
