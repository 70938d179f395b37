"""A DataLoader worker that never starts is replaced, not waited for forever.

torch forks its workers from the training process, which by then runs other threads: gloo's, Lightning's, the
queue feeders of an earlier iterator. A lock that one of them held at the instant of the fork stays held in the
child, with no thread left to release it, and a child that needs it on its way out of ``fork()`` stops there,
before it runs any Python. torch cannot tell such a worker from a slow one: it is alive, so the loader waits for
its batch for ever (and in a DDP fit the other ranks wait in their next collective).

So every worker, as its first act, marks its slot on a board in shared memory (:class:`MarkStart`, the
``worker_init_fn`` torch calls, wrapping the user's own). Before it asks new workers for a batch, the loader
waits for every mark (:func:`await_start`); a worker left unmarked while asleep without using the CPU for
:data:`START_PATIENCE` seconds is stuck, and the loader ends these workers and forks new ones. No batch has been
taken from them yet, so the new ones serve exactly the same batches. docs/loading.md, "A worker stuck at its
start", has the user's side.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["START_ATTEMPTS", "START_PATIENCE", "MarkStart", "await_start", "new_board"]

#: seconds an unmarked worker may sleep without using any CPU before it counts as stuck at its start
START_PATIENCE = 15.0
#: how many times the loader starts a pass's workers before it gives up and raises
START_ATTEMPTS = 3


def new_board(workers: int, context: Any) -> Any:
    """A zeroed shared byte per worker, made before the workers fork (so that they inherit it, or are sent it)."""
    return (context or multiprocessing).RawArray("b", workers)


class MarkStart:
    """The ``worker_init_fn`` of new workers: mark the worker's slot, then run the user's ``worker_init_fn``.

    The mark comes first, so a slow or failing user function is not taken for a worker stuck at its start.
    """

    def __init__(self, board: Any, then: Callable[[int], Any] | None) -> None:
        self.board = board
        self.then = then

    def __call__(self, worker_id: int) -> None:
        self.board[worker_id] = 1
        if self.then is not None:
            self.then(worker_id)


def await_start(workers: Sequence[Any], board: Any, *, patience: float | None = None) -> list[Any]:
    """Wait until every worker of ``workers`` (torch's list, in worker-id order) has marked ``board``.

    Returns the workers stuck at their start: unmarked, asleep (``/proc`` state ``S``) and without one more tick
    of CPU for ``patience`` seconds (default :data:`START_PATIENCE`); ``[]`` once every live worker has marked.
    A worker that exited is not waited for: torch reports it at the first batch, as before.
    """
    patience = START_PATIENCE if patience is None else patience
    seen: dict[int, tuple[int | None, float]] = {}  # pid -> (CPU ticks, when they last changed)
    pause = 0.001
    while True:
        waiting = [w for i, w in enumerate(workers) if not board[i] and w.exitcode is None]
        if not waiting:
            return []
        now = time.monotonic()
        stuck = []
        for w in waiting:
            state, ticks = _state_and_ticks(w.pid)
            last, since = seen.get(w.pid, (None, now))
            if ticks != last or state != "S":
                seen[w.pid] = (ticks, now)
            elif now - since >= patience:
                stuck.append(w)
        if stuck:
            return stuck
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _state_and_ticks(pid: int) -> tuple[str | None, int | None]:
    """A process's ``/proc/<pid>/stat`` state letter and user + system CPU ticks (``None``: it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None, None
    # "pid (comm) S ppid ...": comm may hold spaces and parentheses; utime and stime are fields 14 and 15
    rest = stat[stat.rfind(")") + 2 :].split()
    if len(rest) < 13:
        return None, None
    return rest[0], int(rest[11]) + int(rest[12])
