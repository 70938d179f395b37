"""Run a multi-process command under a watchdog: a hang fails fast and leaves no orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Outcome:
    returncode: int | None  # None: killed by the watchdog
    output: str

    @property
    def hung(self) -> bool:
        return self.returncode is None

    def tail(self, chars: int = 3000) -> str:
        """What to show when a check fails: the end of the output, and after a hang every thread's stack.

        A hang is decided by where *each* process waited, and the dumps of several ranks and workers
        run far past a plain tail: each thread's stack is kept to its innermost frames instead.
        """
        if not self.hung:
            return self.output[-chars:]
        return self.output[-chars:] + "\n--- stacks at the watchdog's SIGABRT ---\n" + stacks(self.output)


def run_with_watchdog(
    args: list[str], *, timeout: float, env: dict[str, str] | None = None, busy_limit: float = 3.0
) -> Outcome:
    """Run ``args`` in its own process group; when it is stuck past ``timeout``, kill the whole group.

    Stuck means idle: a deadlock (a collective without a partner, a worker that never answers)
    waits without using the CPU, while a job that is only slow, on a machine shared with other
    work, keeps using it. Past ``timeout`` the group is killed as soon as its processes used less
    than :data:`IDLE_CPU` seconds of CPU over the last :data:`WINDOW` seconds (or as much of them
    as ``timeout``, in proportion); a group still
    busy is given up to ``busy_limit * timeout`` (a spinning hang ends there).
    """
    # PYTHONFAULTHANDLER: on a hang, SIGABRT makes every Python process of the group (ranks, loader
    # workers) print the stack of each of its threads before it dies, so a hang says where it waited.
    full_env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",
        **(env or {}),
    }
    proc = subprocess.Popen(
        args, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    chunks: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    cpu = _GroupCpu(proc.pid)
    began = time.monotonic()
    why = ""
    window = min(WINDOW, timeout)
    # As communicate() does: done when the output ends (every process holding it exited) and the command exited.
    while reader.is_alive() or proc.poll() is None:
        reader.join(timeout=1.0)
        cpu.sample()
        waited = time.monotonic() - began
        if waited > timeout and cpu.used(window) < IDLE_CPU * window / WINDOW:
            why = f"idle (under {IDLE_CPU * window / WINDOW:.2g} s of CPU in {window:.0f} s) after {waited:.0f} s"
        elif waited > busy_limit * timeout:
            why = f"still running, and using the CPU, after {waited:.0f} s ({busy_limit:g} x the timeout)"
        if why:
            break
    code: int | None = proc.returncode
    if why:
        order = dump_stacks(proc.pid)
        reader.join(timeout=15)
        code = None
        chunks.append(f"\n--- the watchdog stopped the job: {why}. It aborted, in this order: " + "; ".join(order))
    # No orphans: whatever the command started (ranks, loader workers, torchrun's ranks in their own
    # sessions) is gone, including processes seen earlier whose parent has died since.
    cpu.sample()
    for pid, started in cpu.seen.items():
        _kill(pid, started, signal.SIGKILL)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    reader.join(timeout=15)
    proc.wait()
    return Outcome(code, "".join(chunks))


#: seconds of CPU, over :data:`WINDOW` seconds, below which a process group past its timeout is stuck
IDLE_CPU = 0.5
WINDOW = 10.0


class _GroupCpu:
    """CPU time used by a command and every process it started, sampled from ``/proc``.

    The command's processes are its process group and its descendants: torchrun starts each rank in a
    session of its own, outside the group, and a job that is only slow must not read as idle because
    the ranks doing its work were not counted.
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self.ticks: dict[int, int] = {}
        self.seen: dict[int, int] = {}  # pid -> start time: every process of the job seen so far
        self.total = 0.0
        self.history: list[tuple[float, float]] = []

    def sample(self) -> None:
        for pid, stat in _processes(self.root).items():
            self.seen[pid] = stat.started
            self.total += max(0, stat.ticks - self.ticks.get(pid, 0)) / os.sysconf("SC_CLK_TCK")
            self.ticks[pid] = stat.ticks
        self.history.append((time.monotonic(), self.total))

    def used(self, window: float) -> float:
        """CPU seconds used over the last ``window`` seconds (infinite until that much was watched)."""
        now, total = self.history[-1]
        if now - self.history[0][0] < window:
            return float("inf")
        then = next(t for when, t in reversed(self.history) if now - when >= window)
        return total - then


def dump_stacks(root: int) -> list[str]:
    """Make every process of the job started as ``root`` print its threads' stacks (faulthandler), one at a time.

    The job is frozen first, so no rank reacts to a peer's death before its own stack is taken, and
    the dumps, written to one pipe, do not interleave. Returns each aborted process's pid and command.
    """
    members = _processes(root)
    for pid, stat in members.items():
        _kill(pid, stat.started, signal.SIGSTOP)
    order = []
    for pid in sorted(members, reverse=True):  # children (later pids) before their parents
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            os.kill(pid, signal.SIGABRT)
            os.kill(pid, signal.SIGCONT)
        except (ProcessLookupError, FileNotFoundError):
            continue
        order.append(f"pid {pid}: {cmd[:120].strip()}")
        time.sleep(0.5)
    for pid, stat in members.items():
        _kill(pid, stat.started, signal.SIGCONT)
    return order


@dataclass(frozen=True)
class _Stat:
    parent: int
    group: int
    ticks: int  # user + system CPU, in clock ticks
    started: int  # in clock ticks after boot: with the pid, names one process (pids are reused)


def _stat(pid: int) -> _Stat | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    # fields[k] is field k + 3 of proc(5): ppid 4, pgrp 5, utime 14, stime 15, starttime 22
    return _Stat(int(fields[1]), int(fields[2]), int(fields[11]) + int(fields[12]), int(fields[19]))


def _processes(root: int) -> dict[int, _Stat]:
    """The process group ``root`` leads and every descendant of ``root``, by pid."""
    table = {int(e.name): st for e in Path("/proc").iterdir() if e.name.isdigit() and (st := _stat(int(e.name)))}
    children: dict[int, list[int]] = {}
    for pid, st in table.items():
        children.setdefault(st.parent, []).append(pid)
    found = {pid for pid, st in table.items() if st.group == root}
    todo = [pid for pid in found | {root} if pid in table]
    visited: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid not in visited:
            visited.add(pid)
            todo.extend(children.get(pid, []))
    return {pid: table[pid] for pid in found | visited}


def _kill(pid: int, started: int, sig: signal.Signals) -> None:
    """Send ``sig`` to ``pid`` if it is still the process that started at ``started``."""
    now = _stat(pid)
    if now is not None and now.started == started:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def together(commands: list[list[str]], envs: list[dict[str, str]] | None = None) -> list[str]:
    """One command that runs ``commands`` side by side; the first to fail stops the others and sets the status.

    A small Python supervisor polls each process: bash's ``wait -n`` loses a child that exited before
    it was called (status 127 though every rank succeeded), and waiting for the ranks in order turns a
    rank 0 that failed while rank 1 waits for it into a hang with no status.
    """
    envs = envs or [{} for _ in commands]
    jobs = [{"args": cmd, "env": env} for cmd, env in zip(commands, envs, strict=True)]
    return [sys.executable, "-c", _SUPERVISE, json.dumps(jobs)]


_SUPERVISE = """
import json, os, subprocess, sys, time
procs = [subprocess.Popen(j["args"], env={**os.environ, **j["env"]}) for j in json.loads(sys.argv[1])]
while procs:
    for p in list(procs):
        code = p.poll()
        if code is None:
            continue
        procs.remove(p)
        if code != 0:
            for other in procs:
                other.kill()
            sys.exit(code if code > 0 else 128 - code)
    time.sleep(0.05)
"""


def stacks(output: str, *, frames: int = 10) -> str:
    """The faulthandler dumps in ``output``, each thread cut to its ``frames`` innermost frames."""
    kept: list[str] = []
    depth = frames
    for line in output.splitlines():
        if line.startswith(("Fatal Python error", "Thread 0x", "Current thread 0x", "Extension modules")):
            kept.append(line[:200])
            depth = 0
        elif line.startswith("  File ") and depth < frames:
            kept.append(line)
            depth += 1
    return "\n".join(kept)
