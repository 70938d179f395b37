"""The test watchdog itself: a stuck job is stopped soon after its timeout with every process's stack, a
busy one only at its limit, and ranks run together report the first failure at once."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.distributed.watchdog import python, run_with_watchdog, together

SLEEP = "import time, threading; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
WRITE_R = "import os; os.write(1, (os.environ['R'] + '\\n').encode())"
#: starts ``CODE`` in a session of its own, as torchrun starts its ranks, says its pid, and waits for it
IN_NEW_SESSION = (
    "import subprocess, sys\n"
    "p = subprocess.Popen([sys.executable, '-c', CODE], start_new_session=True)\n"
    "print('pid', p.pid, flush=True)\n"
    "sys.exit(p.wait())"
)
SPIN = "import time\nt = time.time()\nwhile time.time() - t < 60: pass"


def test_an_idle_job_is_stopped_after_its_timeout_with_the_stacks_of_each_process() -> None:
    started = time.monotonic()
    res = run_with_watchdog(together([python("-c", SLEEP), python("-c", SLEEP)]), timeout=2)
    assert res.hung and time.monotonic() - started < 30  # ~6 s: 2 s, the idle window, a dump per process
    assert res.output.count("Fatal Python error: Aborted") == 3  # both ranks and the supervisor
    assert "idle" in res.output and "stacks at the watchdog" in res.tail()


def test_a_busy_job_runs_to_the_busy_limit() -> None:
    started = time.monotonic()
    res = run_with_watchdog(python("-c", SPIN), timeout=2, busy_limit=4)
    took = time.monotonic() - started
    assert res.hung and 8 <= took < 25, took
    assert "using the CPU" in res.output


def test_a_slow_job_that_keeps_working_is_not_called_a_hang() -> None:
    res = run_with_watchdog(python("-c", SPIN.replace("60", "4") + "\nprint('done')"), timeout=2, busy_limit=10)
    assert res.returncode == 0 and "done" in res.output


def test_ranks_together_report_the_first_failure_at_once() -> None:
    started = time.monotonic()
    res = run_with_watchdog(together([python("-c", "raise SystemExit(3)"), python("-c", SLEEP)]), timeout=30)
    assert res.returncode == 3 and time.monotonic() - started < 20  # not the 60 s of the sleeping rank
    ok = run_with_watchdog(
        # One write each: the ranks share the pipe unbuffered, where print's two writes may interleave.
        together([python("-c", WRITE_R)] * 2, [{"R": "a"}, {"R": "b"}]),
        timeout=30,
    )
    assert ok.returncode == 0 and sorted(ok.output.split()) == ["a", "b"]


def test_processes_in_sessions_of_their_own_are_watched_and_killed() -> None:
    # Work done by a descendant outside the process group (torchrun's ranks) keeps a slow job alive...
    busy = SPIN.replace("60", "4") + "\nprint('done')"
    res = run_with_watchdog(python("-c", IN_NEW_SESSION.replace("CODE", repr(busy))), timeout=1, busy_limit=10)
    assert res.returncode == 0 and "done" in res.output, res.tail()
    # ... and a stuck one is stopped with its stack, and does not outlive the job.
    res = run_with_watchdog(python("-c", IN_NEW_SESSION.replace("CODE", repr(SLEEP))), timeout=2)
    assert res.hung and res.output.count("Fatal Python error: Aborted") == 2, res.tail()
    pid = int(res.output.split("pid ", 1)[1].split()[0])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), f"the watchdog left process {pid} running"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z" and os.getpid() != pid
