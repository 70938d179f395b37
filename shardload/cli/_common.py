"""Helpers shared by the command modules: exit codes, option parsers, output."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from enum import IntEnum
from typing import Any, TextIO

from shardload._base.envvars import parse_size_text
from shardload._base.redact import redact


class Exit(IntEnum):
    """Exit status of ``shardload`` (documented in ``shardload --help`` and docs/cli.md)."""

    OK = 0
    PROBLEMS = 1  # verify found problems
    USAGE = 2  # bad command line (argparse's own code), or a missing optional dependency
    INPUT = 3  # InputError: the input to prepare is malformed, or a set cannot be exported as asked
    OUTPUT = 4  # OutputError: cannot write the output where asked (and other OSErrors)
    SHARD_SET = 5  # ShardSetError: the shard set is missing or unusable
    PLAN = 6  # PlanError: batching options are invalid
    LOADER = 7  # WorkerError: a DataLoader worker died or sent no batch within the timeout
    REMOTE = 8  # RemoteError: object storage refused the credentials, kept failing, or rejected a request
    INTERNAL = 70  # an unexpected exception: a bug in shardload (EX_SOFTWARE)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell reports it)
    TERMINATED = 143  # SIGTERM (128 + SIGTERM)


EXIT_CODES_HELP = """\
exit status:
  0   ok
  1   verify found problems in the shard set
  2   usage error (bad options), or a missing optional dependency
  3   bad input (the sources given to prepare are malformed, or a set cannot be
      exported as asked: a field name WebDataset would change)
  4   output problem (the output exists, is locked, or cannot be written; a prepare
      worker died), or another operating-system error (disk full, permission denied)
  5   shard set unusable (missing, not a shard set, damaged manifest or shard)
  6   plan error (invalid batching options)
  7   a DataLoader worker died or sent no batch within the timeout (demo)
  8   object storage (s3://, gs://, https://) refused the credentials, kept
      failing after every retry, or rejected a request (400 Bad Request)
  70  internal error (a bug: rerun with --debug and report the traceback)
  130 interrupted (Ctrl-C); 143 stopped by SIGTERM: rerun an interrupted prepare with --resume"""


class CommandError(Exception):
    """Raised by a command to stop with one error line and an exit code."""

    def __init__(self, message: str, code: int = Exit.USAGE) -> None:
        super().__init__(message)
        self.code = int(code)


def parse_size(text: str) -> int:
    """An argparse type: a positive byte size, by the rule of :func:`~shardload._base.envvars.parse_size_text`."""
    value = parse_size_text(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write e.g. 256MB, 1GiB, 512M or 1000000")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the size must be positive")
    return value


def int_at_least(minimum: int, what: str = "", maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer ``>= minimum`` (and ``<= maximum``); ``what`` says the range in a refusal."""
    what = what or f"at least {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {what}")
        return value

    return parse


positive_int = int_at_least(1)


def add_remote_flags(p: argparse.ArgumentParser) -> None:
    """``--cache-dir`` and ``--cache-limit``: the node cache of a remote set (credentials come from the environment)."""
    g = p.add_argument_group(
        "a remote shard set (s3://, gs://, az://, https://; credentials and endpoint from the environment, "
        "e.g. AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL)"
    )
    g.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="the node-local cache (default: $SHARDLOAD_CACHE_DIR, else $XDG_CACHE_HOME/shardload or "
        "~/.cache/shardload)",
    )
    g.add_argument(
        "--cache-limit",
        type=parse_size,
        metavar="SIZE",
        help="the most bytes of shards kept in the cache, e.g. 50GiB (default: $SHARDLOAD_CACHE_LIMIT, else none)",
    )


def remote_of(args: argparse.Namespace) -> Any:
    """The :class:`~shardload.remote.RemoteOptions` of :func:`add_remote_flags`."""
    from shardload.remote.options import RemoteOptions

    return RemoteOptions(cache_dir=args.cache_dir, cache_limit=args.cache_limit)


def print_json(obj: Any) -> None:
    """One JSON object on one line of stdout (machine-readable: nothing else goes to stdout, see :func:`json_stdout`)."""
    out = _json_out or sys.stdout  # the saved descriptor of json_stdout is not the masked sys.stdout: mask here
    out.write(redact(json.dumps(_finite(obj), allow_nan=False)) + "\n")
    out.flush()


#: while :func:`json_stdout` holds stdout: the stream on the real stdout, for print_json alone
_json_out: TextIO | None = None


@contextmanager
def json_stdout(enabled: bool) -> Iterator[None]:
    """Keep stdout for :func:`print_json` while a ``--json`` command runs; all else written to stdout goes to stderr.

    What the command runs may print: a ``--map`` function, a library, native code, a worker process. Python
    writes to ``sys.stdout`` are redirected to ``sys.stderr``; writes to file descriptor 1 (native code, and
    the worker processes, which inherit it) reach stderr because descriptor 1 is made a copy of 2 for the
    duration (``dup2``), and ``print_json`` writes to a saved copy of the real one.
    """
    global _json_out
    if not enabled:
        yield
        return
    real = sys.stdout
    real.flush()
    try:
        real_fd = real.fileno()
    except (AttributeError, OSError, ValueError):  # not on a file descriptor (an in-memory capture)
        real_fd = -1
    try:
        saved = os.dup(1)
    except OSError:  # descriptor 1 is closed: nothing native can write there either
        saved = -1
    if saved >= 0:
        os.dup2(2, 1)
    if real_fd == 1 and saved >= 0:  # sys.stdout writes to descriptor 1, now stderr: print_json gets the copy
        encoding = getattr(real, "encoding", None) or "utf-8"
        _json_out = open(saved, "w", encoding=encoding, errors="backslashreplace", closefd=False)  # noqa: SIM115
    else:
        _json_out = real
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        out, _json_out = _json_out, None
        out.flush()
        sys.stderr.flush()
        if out is not real:
            out.close()
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)


def _finite(obj: Any) -> Any:
    """NaN/inf become ``null``: strict JSON parsers reject them."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def python_hint(*lines: str) -> str:
    """The closing part of every command's help: how to use the result from Python."""
    return "in Python:\n" + "\n".join(f"  {line}" for line in lines)
