"""Run a multi-process command under a watchdog: a hang fails fast and leaves no orphans."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
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


def run_with_watchdog(args: list[str], *, timeout: float, env: dict[str, str] | None = None) -> Outcome:
    """Run ``args`` in its own process group; on timeout kill the whole group."""
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
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        order = dump_stacks(proc.pid)
        try:
            out, _ = proc.communicate(timeout=15)
            out += "\n--- the watchdog aborted, in this order: " + "; ".join(order) + "\n"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        code = None
    # No orphans: whatever the command started (ranks, loader workers) is gone.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return Outcome(code, out)


def dump_stacks(group: int) -> list[str]:
    """Make every process of ``group`` print its threads' stacks (faulthandler), one at a time.

    The group is frozen first, so no rank reacts to a peer's death before its own stack is taken, and
    the dumps, written to one pipe, do not interleave. Returns each aborted process's pid and command.
    """
    os.killpg(group, signal.SIGSTOP)
    order = []
    for pid in sorted(_members(group), reverse=True):  # children (later pids) before their parents
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            os.kill(pid, signal.SIGABRT)
            os.kill(pid, signal.SIGCONT)
        except (ProcessLookupError, FileNotFoundError):
            continue
        order.append(f"pid {pid}: {cmd[:120].strip()}")
        time.sleep(0.5)
    os.killpg(group, signal.SIGCONT)
    return order


def _members(group: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == group:
                    pids.append(int(entry.name))
            except ProcessLookupError:
                pass
    return pids


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def together(commands: list[list[str]], envs: list[dict[str, str]] | None = None) -> list[str]:
    """One command that runs ``commands`` side by side and exits with the first non-zero status.

    Each is waited for by its own pid: ``wait -n`` loses a child that exited before it was called
    (status 127 though every rank succeeded).
    """
    envs = envs or [{} for _ in commands]
    parts = []
    for i, (cmd, env) in enumerate(zip(commands, envs, strict=True)):
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        parts.append(f"{assigns} {shlex.join(cmd)} & p{i}=$!")
    waits = "; ".join(f"wait $p{i}; r{i}=$?" for i in range(len(commands)))
    first = "".join(f"[ $r{i} -ne 0 ] && exit $r{i}; " for i in range(len(commands)))
    return ["bash", "-c", "; ".join(parts) + "; " + waits + "; " + first + "exit 0"]


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
