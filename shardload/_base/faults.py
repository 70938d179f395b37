"""Named crash points for testing that prepare survives ``kill -9`` anywhere.

Set ``SHARDLOAD_KILL_AT`` to a comma-separated list of point names (e.g.
``staged:2,commit:old-removed``) and the process kills itself with SIGKILL
when it reaches one. ``SHARDLOAD_PAUSE_AT`` makes it stop there for good
instead (to kill its parent at a known moment). Unset (always, outside tests),
this costs two dict lookups.
"""

from __future__ import annotations

import os
import signal
import time

from shardload._base import envvars


def crash_point(name: str) -> None:
    wanted = os.environ.get(envvars.KILL_AT)
    if wanted and name in wanted.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
    paused = os.environ.get(envvars.PAUSE_AT)
    if paused and name in paused.split(","):
        while True:
            time.sleep(60)
