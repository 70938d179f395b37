"""The warnings a prepare run logs, collected into its result (``PrepareResult.warnings``, ``--json``)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec

from shardload._base.redact import get_logger, redact

if TYPE_CHECKING:
    from shardload.prepare.pipeline import PrepareResult

_P = ParamSpec("_P")
#: the logger of prepare (the pipeline's): a warning of a run is logged on it or a logger below it
logger = get_logger("shardload.prepare")


class _WarningsOfThisThread(logging.Handler):
    """Collects the messages of the warnings logged by the thread that made it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.thread = threading.get_ident()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.messages.append(redact(record.getMessage()))


def with_logged_warnings(entry: Callable[_P, PrepareResult]) -> Callable[_P, PrepareResult]:
    """``entry`` (a prepare entry point) with every warning its run logs in ``PrepareResult.warnings``, once each.

    A warning of a run is logged on ``shardload.prepare`` (or a logger below it) where it arises: listing the
    sources, redoing a part, laying out the shards. Collecting them from that logger, rather than each one into
    the result by hand, is what keeps ``--json``'s ``warnings`` from missing one that stderr shows. Only this
    process's warnings, from the calling thread: a warning a worker process logs (``--workers N``) is not seen.
    """

    @functools.wraps(entry)
    def collected(*args: _P.args, **kwargs: _P.kwargs) -> PrepareResult:
        handler = _WarningsOfThisThread()
        logger.addHandler(handler)
        try:
            result = entry(*args, **kwargs)
        finally:
            logger.removeHandler(handler)
        return dataclasses.replace(result, warnings=tuple(dict.fromkeys([*result.warnings, *handler.messages])))

    return collected


__all__ = ["with_logged_warnings"]
