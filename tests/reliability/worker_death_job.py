"""Kill, stop or starve one DataLoader worker mid-epoch; the loop must raise, not hang.

Run by test_worker_death.py under a watchdog, as ``worker_death_job.py OUT MODE``:

* ``KILL``, ``SEGV``: that signal, sent by the training process;
* ``TERM-outside``: SIGTERM sent by another process (a scheduler), ``TERM-parent`` by the training process;
* ``truncate``: the shard files are truncated under the worker's mappings (SIGBUS in the worker);
* ``STOP``: the worker is stopped; the loader has ``timeout=3``;
* ``STOP-leave``: as ``STOP``, but the job leaves the stopped worker to the loader (prints ``WORKER <state>``
  once the loader raised): the job must still exit.

Prints ``KILLED <pid>`` just before the worker is hit, ``RAISED <type>: <message>`` and
``AFTER <seconds>`` when the loader raised, ``FINISHED`` if the epoch somehow completed.
A stopped worker is resumed and killed before the job exits (but for ``STOP-leave``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

import shardload
from shardload.testing import synthetic_samples

TIMEOUT = 3.0


def hit(worker: psutil.Process, mode: str, out: str) -> None:
    if mode == "truncate":
        for shard in sorted(Path(out, "shards").iterdir()):
            os.truncate(shard, 1000)
    elif mode == "TERM-outside":
        subprocess.run(["kill", "-TERM", str(worker.pid)], check=True, timeout=10)
    elif mode == "TERM-parent":
        os.kill(worker.pid, signal.SIGTERM)
    else:
        os.kill(worker.pid, getattr(signal, "SIG" + mode.removesuffix("-leave")))


def main(out: str, mode: str) -> None:
    shardload.write(synthetic_samples(400, seed=5), out, num_shards=2, shuffle=False, progress=False)
    loader = shardload.make_loader(
        out,
        rank=0,
        world_size=1,
        batch_size=4,
        stage="val",  # in order: after a truncation the next batches read the truncated part
        loader_options=shardload.LoaderOptions(
            num_workers=2, prefetch_factor=2, timeout=TIMEOUT if mode.startswith("STOP") else 0
        ),
    )
    workers: list[psutil.Process] = []
    start = 0.0
    try:
        for i, _batch in enumerate(loader):
            if i == 2:
                workers = psutil.Process().children()
                assert len(workers) == 2, workers
                if mode != "KILL":
                    # torch's SIGCHLD handler raises its own error in whatever frame runs when a worker dies
                    # (here this loop's body, outside the loader) if the signal comes before the next batch is
                    # asked for: a race. Without it the loader's next batch finds the dead worker and says
                    # why, which is what these modes test; KILL keeps the handler and accepts either error.
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                print(f"KILLED {workers[0].pid}", flush=True)
                start = time.monotonic()
                hit(workers[0], mode, out)
    except Exception as exc:  # noqa: BLE001  report whatever came out, then exit non-zero
        print(f"AFTER {time.monotonic() - start:.1f}", flush=True)
        # One line: torch re-raises a worker's error with the worker's traceback and message below its first line.
        one_line = " | ".join(str(exc).splitlines())
        print(f"RAISED {type(exc).__name__}: {one_line}", flush=True)
        if mode == "STOP-leave":
            try:
                print(f"WORKER {workers[0].status()}", flush=True)
            except psutil.NoSuchProcess:
                print("WORKER gone", flush=True)
        sys.exit(3)
    finally:
        # torch's SIGCHLD handler would raise in this frame when the workers below die: the job reports above.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for w in workers if mode != "STOP-leave" else ():  # a stopped worker must not outlive the job
            try:
                w.send_signal(signal.SIGCONT)
                w.kill()
            except psutil.NoSuchProcess:
                pass
    print("FINISHED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "KILL")
