"""Progress of a long pass over a shard set or its sources: a bar on a terminal, log lines otherwise.

Where it sits: beside the flow; ``prepare`` (reading sources, writing
shards), ``export`` (writing tars) and ``verify`` (checking shards) each show
one :class:`Progress` while they run.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Literal

from shardload._base.redact import get_logger


class Progress:
    """Counts samples and bytes; shows both rates.

    The bar counts ``unit``: samples (prepare, export) or bytes (verify, whose
    work is reading every byte); ``total`` is the expected count, if known.
    ``enabled=None`` shows a tqdm bar if stderr is a terminal; without one, a
    line goes to logger ``log`` every ``every`` seconds and at the end (the
    names ``shardload.prepare``, ``.verify``, ``.export``, ``.upload`` stay when modules
    move, so that a user can quieten one).
    """

    def __init__(
        self,
        desc: str,
        *,
        total: int | None = None,
        unit: Literal["samples", "bytes"] = "samples",
        enabled: bool | None = None,
        every: float = 5.0,
        log: str = "shardload",
    ) -> None:
        self.desc = desc
        self._logger = get_logger(log)
        self.total = total
        self.unit = unit
        self.samples = 0
        self.nbytes = 0
        self.start = time.perf_counter()
        self._last_log = self.start
        self._logged: tuple[int, int] | None = None  # the counts of the last log line
        self._every = every
        self._bar: Any = None
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            from tqdm.auto import tqdm

            bar_unit = " samples" if unit == "samples" else "B"
            self._bar = tqdm(total=total, desc=desc, unit=bar_unit, unit_scale=True, dynamic_ncols=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def rates(self) -> tuple[float, float]:
        """Samples per second and MB per second so far."""
        dt = max(self.elapsed, 1e-9)
        return self.samples / dt, self.nbytes / dt / 1e6

    def update(self, samples: int, nbytes: int) -> None:
        """Count ``samples`` more samples of ``nbytes`` bytes done."""
        self.samples += samples
        self.nbytes += nbytes
        if self._bar is not None:
            if self.unit == "samples":
                self._bar.update(samples)
                self._bar.set_postfix_str(f"{self.rates()[1]:.1f} MB/s", refresh=False)
            else:
                self._bar.update(nbytes)
        elif time.perf_counter() - self._last_log >= self._every:
            self._last_log = time.perf_counter()
            self._log()

    def _log(self) -> None:
        self._logged = (self.samples, self.nbytes)
        sps, mbps = self.rates()
        if self.unit == "samples":
            of = f"/{self.total}" if self.total is not None else ""
            self._logger.info("%s: %d%s samples, %.0f samples/s, %.1f MB/s", self.desc, self.samples, of, sps, mbps)
        else:
            of = f" of {self.total / 1e6:.0f}" if self.total is not None else ""
            if not self.samples:  # bytes of files, not of samples (an upload): no samples to give a rate of
                self._logger.info("%s: %.0f%s MB, %.1f MB/s", self.desc, self.nbytes / 1e6, of, mbps)
                return
            self._logger.info("%s: %.0f%s MB, %.1f MB/s, %.0f samples/s", self.desc, self.nbytes / 1e6, of, mbps, sps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._logged != (self.samples, self.nbytes):  # not the line just logged again
            self._log()
