"""Run a multi-process command under a watchdog: a hang fails fast and leaves no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
        os.killpg(proc.pid, signal.SIGABRT)  # every process dumps its threads' stacks (faulthandler)
        try:
            out, _ = proc.communicate(timeout=15)
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


def python(*args: str) -> list[str]:
    return [sys.executable, *args]
