"""Progress of long prepare stages: a bar on a terminal, log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

logger = logging.getLogger("shardload.prepare")


class Progress:
    """Counts samples and bytes; shows samples/s and MB/s.

    Args:
        desc: what is being done ("read", "write").
        total: expected samples, if known.
        enabled: show a tqdm bar; ``None`` means "if stderr is a terminal".
            When no bar is shown, a log line is emitted every ``every`` seconds.
    """

    def __init__(self, desc: str, *, total: int | None = None, enabled: bool | None = None, every: float = 5.0):
        self.desc = desc
        self.total = total
        self.samples = 0
        self.nbytes = 0
        self.start = time.perf_counter()
        self._last_log = self.start
        self._every = every
        self._bar: Any = None
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=" samples", unit_scale=True, dynamic_ncols=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def rates(self) -> tuple[float, float]:
        dt = max(self.elapsed, 1e-9)
        return self.samples / dt, self.nbytes / dt / 1e6

    def update(self, samples: int, nbytes: int) -> None:
        self.samples += samples
        self.nbytes += nbytes
        if self._bar is not None:
            self._bar.update(samples)
            self._bar.set_postfix_str(f"{self.rates()[1]:.1f} MB/s", refresh=False)
        elif time.perf_counter() - self._last_log >= self._every:
            self._last_log = time.perf_counter()
            self._log()

    def _log(self) -> None:
        sps, mbps = self.rates()
        of = f"/{self.total}" if self.total is not None else ""
        logger.info("%s: %d%s samples, %.0f samples/s, %.1f MB/s", self.desc, self.samples, of, sps, mbps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._log()
