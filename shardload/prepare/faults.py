"""Named crash points for testing that prepare survives ``kill -9`` anywhere.

Set ``SHARDLOAD_KILL_AT`` to a comma-separated list of point names (e.g.
``staged:2,commit:old-removed``) and the process kills itself with SIGKILL
when it reaches one. Unset (always, outside tests), this costs one dict lookup.
"""

from __future__ import annotations

import os
import signal


def crash_point(name: str) -> None:
    wanted = os.environ.get("SHARDLOAD_KILL_AT")
    if wanted and name in wanted.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
