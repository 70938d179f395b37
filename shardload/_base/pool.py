"""Ordered parallel maps, and the worker processes of ``prepare``: they die with their parent.

:func:`map_in_workers` is the one ordered parallel map of the library: in
process for one worker, else a pool of processes (``prepare``) or threads
(``verify``). Worker processes die with the parent (``PR_SET_PDEATHSIG`` plus a
watchdog thread), never keep the output lock (see :mod:`shardload._base.output`),
are stopped rather than waited for when the parent stops, and a worker that
dies is an :class:`~shardload.errors.OutputError` naming its signal and what to
do: so a killed prepare stays resumable (docs/reliability.md, "prepare").
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TypeVar

from shardload._base.messages import signal_name
from shardload._base.redact import get_logger
from shardload.errors import OutputError

#: prctl option: the signal a process gets when its parent dies (linux/prctl.h)
PR_SET_PDEATHSIG = 1
#: how often a worker's watchdog checks that its parent is alive
WATCHDOG_INTERVAL = 0.5
#: how long stopped workers get to exit on SIGTERM before SIGKILL
STOP_GRACE = 5.0

_Job = TypeVar("_Job")
_Result = TypeVar("_Result")


def map_in_workers(
    fn: Callable[[_Job], _Result],
    jobs: Sequence[_Job],
    workers: int,
    *,
    threads: bool = False,
    out: Path | None = None,
    what: str = "",
    pool: WorkerPool | None = None,
) -> Iterator[_Result]:
    """``fn`` over ``jobs``, results in job order: in-process for one worker, else in a pool (``pool``: that one).

    For processes ``fn`` is a module-level function and ``jobs`` are picklable;
    ``threads`` suits work that releases the GIL. A worker process that dies is
    an :class:`OutputError` naming ``out`` and the step ``what``
    (``"staging the samples"``).
    """
    if pool is not None:
        yield from pool.map(fn, jobs, out=out, what=what)
        return
    if workers <= 1 or len(jobs) <= 1:
        yield from map(fn, jobs)
        return
    if threads:
        with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as threadpool:
            yield from threadpool.map(fn, jobs)
        return
    ctx = multiprocessing.get_context()
    # A forkserver's children are the server's, not ours: they can only watch it (it exits with us).
    parent = None if ctx.get_start_method() == "forkserver" else os.getpid()
    executor = ProcessPoolExecutor(
        max_workers=min(workers, len(jobs)), mp_context=ctx, initializer=_init_worker, initargs=(parent,)
    )
    procs: list[BaseProcess] = []
    finished = False
    try:
        results = executor.map(fn, jobs)
        procs = list(executor._processes.values())  # started by the submits of map(); kept to report or stop them
        yield from results
        finished = True
    except BrokenProcessPool:
        raise worker_died(procs, out, what) from None
    finally:
        if finished:
            executor.shutdown(wait=False)
            end_finished_workers(procs, what)
        else:  # an error, Ctrl-C, SIGTERM, or the consumer stopped: do not wait for the queued jobs
            stop_workers(executor, procs)


class WorkerPool:
    """Worker processes started before their jobs are known, for one or more ordered maps.

    ``prepare`` starts them before it reads its first sample, which one of them reads and maps, so that
    the main process runs no user code before it forks. Used as a context manager: on a clean exit the
    workers end as :func:`map_in_workers`'s do; on an error (or Ctrl-C) they are stopped.
    """

    def __init__(self, workers: int) -> None:
        ctx = multiprocessing.get_context()
        parent = None if ctx.get_start_method() == "forkserver" else os.getpid()
        self._pool: ProcessPoolExecutor | None = ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(parent,)
        )
        self._pool.submit(int)  # starts the processes now (all of them, with fork)
        self._procs: list[BaseProcess] = list(self._pool._processes.values())
        self.workers = workers

    def call(self, fn: Callable[..., _Result], *args: object, out: Path | None = None, what: str = "") -> _Result:
        """``fn(*args)`` in one of the workers."""
        assert self._pool is not None
        try:
            return self._pool.submit(fn, *args).result()
        except BrokenProcessPool:
            raise worker_died(self._procs, out, what) from None

    def map(
        self, fn: Callable[[_Job], _Result], jobs: Sequence[_Job], *, out: Path | None = None, what: str = ""
    ) -> Iterator[_Result]:
        """``fn`` over ``jobs`` in the workers, results in job order."""
        assert self._pool is not None
        try:
            yield from self._pool.map(fn, jobs)
        except BrokenProcessPool:
            raise worker_died(self._procs, out, what) from None

    def close(self, finished: bool = False, what: str = "") -> None:
        """End the workers: once their work is done (``finished``), else now. Closing twice does nothing."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if finished:
            pool.shutdown(wait=False)
            end_finished_workers(self._procs, what)
        else:
            stop_workers(pool, self._procs)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        self.close(finished=kind is None)


def worker_died(procs: Sequence[BaseProcess], out: Path | None, what: str) -> OutputError:
    """The error for a pool whose worker died; names its pid and signal when they can be told."""
    for p in procs:  # the pool reaps them in its own thread: wait for their exit statuses
        p.join(1.0)
    # a pool worker never exits on its own while the pool runs: status 0 is a death too (os._exit(0))
    codes = [(p.pid, p.exitcode) for p in procs if p.exitcode is not None]
    # Once one died, the pool SIGTERMs the others: a code that is not that is the first death. A SIGTERM
    # names its worker only when it is the pool's one worker: the status of a worker reaped by the pool's
    # own thread is not known here, so one SIGTERM seen may be one the pool sent.
    deaths = [pc for pc in codes if pc[1] != -signal.SIGTERM]
    first = deaths or codes
    known = bool(deaths) or len(procs) == 1
    if first:
        pid, code = first[0]
        assert code is not None
        how = f"was killed by {signal_name(-code)}" if code < 0 else f"exited with status {code}"
        if code == -signal.SIGKILL:
            how += " (what the out-of-memory killer sends)"
        elif code >= 0:
            how += " before its work was done (did code it runs, such as a map function, call os._exit?)"
        # with several alike, which one died first cannot be told
        who = (
            f"a worker process of prepare (pid {pid}) {how}"
            if len(first) == 1 and known
            else f"a worker process of prepare {how}"
        )
    else:
        who = "a worker process of prepare died"
    return OutputError(
        f"{out}: {who} while {what}. Nothing finished so far is lost. If memory is short, lower --workers "
        "(or --shard-size); then rerun the same command with --resume to continue where it stopped."
    )


def still_running(p: BaseProcess) -> bool:
    """Whether ``p`` has not exited, read from its sentinel when its exit code is not known.

    The pool's manager thread joins the workers too: when it reaps one first, ``exitcode`` stays ``None`` here for
    a while (``waitpid`` finds no child), though the process is gone and its pid may be another's. The sentinel
    (the read end of a pipe whose write end only the process holds) is ready once it has exited.
    """
    if p.exitcode is not None:
        return False
    return not multiprocessing.connection.wait([p.sentinel], timeout=0)


def end_finished_workers(procs: Sequence[BaseProcess], what: str) -> None:
    """After every result is in: wait :data:`STOP_GRACE` for the workers to exit, then end those still alive.

    A worker that has no work left exits at once, unless code it ran (a map function) left a thread running:
    a process joins its non-daemon threads before it exits, so without this the run would wait for ever on
    threads whose work no one needs. Each one ended so is said once, in a warning.
    """
    deadline = time.monotonic() + STOP_GRACE
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    lingering = [p for p in procs if still_running(p)]
    for p in lingering:
        p.kill()
        p.join(1.0)
    if lingering:
        pids = ", ".join(str(p.pid) for p in lingering)
        get_logger("shardload.prepare").warning(
            "%d worker process(es) of prepare (pid %s) still ran %.0f s after their work %s was done, most "
            "likely waiting on threads that a map function left running; they were ended (nothing is lost). "
            "A map should end the threads it starts, or start them as daemon threads.",
            len(lingering),
            pids,
            STOP_GRACE,
            f"({what})" if what else "",
        )


def stop_workers(pool: ProcessPoolExecutor, procs: Sequence[BaseProcess]) -> None:
    """Cancel the queued jobs and end the running ones now: SIGTERM, then SIGKILL after a grace period."""
    # The pool's manager thread (not a daemon) reaps the workers too: once they are ended it returns at once.
    # Left running, the program would take it for a thread that user code left behind and say so. (Taken
    # before shutdown, which forgets it.)
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    deadline = time.monotonic() + STOP_GRACE
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if still_running(p):
            p.kill()
            p.join(1.0)
    if manager is not None:
        manager.join(1.0)


# -- in the worker ------------------------------------------------------------------------------------
def _init_worker(parent: int | None) -> None:
    """Runs first in every worker: signals as a worker needs them, and die with the parent."""
    # Ctrl-C reaches the whole process group: the parent stops the workers, which must not
    # turn it into a result of their own. SIGTERM ends a worker (the parent's handler, if
    # any was inherited by fork, is for the parent).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent)


def die_with_parent(parent: int | None) -> None:
    """Make this process exit when its parent does.

    ``parent`` (the pid that started this process, ``None`` if unknown) catches
    a parent that died before this was set up.
    """
    _set_pdeathsig(signal.SIGKILL)
    ppid = os.getppid()
    if parent is not None and ppid != parent:
        os._exit(1)  # the parent is already gone (we were adopted before the death signal was set)
    threading.Thread(target=_watch_parent, args=(ppid,), name="shardload-parent-watchdog", daemon=True).start()


def _set_pdeathsig(signum: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, signum)`` where the platform has it; True if it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(ppid: int) -> None:
    """The portable fallback: once the parent is gone the process is adopted, and its parent pid changes."""
    while os.getppid() == ppid:
        time.sleep(WATCHDOG_INTERVAL)
    os._exit(1)
