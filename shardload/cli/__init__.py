"""The ``shardload`` command line: one module per command, each a thin call into the library.

Each command ``NAME`` is a module ``shardload/cli/NAME.py`` listed in
:data:`COMMANDS`, with ``SUMMARY``, ``EPILOG``, ``add_arguments(parser)`` and
``run(args) -> int``; its docstring is its ``--help`` description (how to add
one: docs/cli.md, "Adding a command"). Every module is imported to list the
commands, so each imports the library inside ``run``. Errors become one line
``shardload: error: ...`` and an exit status (:class:`~shardload.cli._common.Exit`);
``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any, NoReturn, TextIO

from shardload._base.interrupts import Interruption
from shardload._base.redact import redact
from shardload.cli._common import EXIT_CODES_HELP, CommandError, Exit, json_stdout
from shardload.errors import (
    InputError,
    MissingDependencyError,
    OutputError,
    PlanError,
    RemoteError,
    ShardloadError,
    ShardSetError,
    WorkerError,
)

__all__ = ["COMMANDS", "Exit", "main"]

#: the registry: command name -> module ``shardload.cli.<name>`` (see ``_MODULE_OF``), in help order
COMMANDS: tuple[str, ...] = ("prepare", "merge", "inspect", "verify", "upload", "plan", "export", "demo")

#: library errors -> exit status, most specific first
ERROR_CODES: tuple[tuple[type[BaseException], Exit], ...] = (
    (InputError, Exit.INPUT),
    (OutputError, Exit.OUTPUT),
    (ShardSetError, Exit.SHARD_SET),
    (PlanError, Exit.PLAN),
    (WorkerError, Exit.LOADER),
    (RemoteError, Exit.REMOTE),
    (MissingDependencyError, Exit.USAGE),
)


def _quiet_teardown() -> None:
    """At exit after an interruption: no noise from work cut short in background threads.

    (Zarr's encoding loop, stopped midway, prints thousands of ``Task was
    destroyed but it is pending!``.) Registered only after an interruption, so
    it runs as the process ends, never inside a program.
    """
    logging.getLogger("asyncio").disabled = True
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # "coroutine ... was never awaited"
    sys.unraisablehook = lambda _info: None
    threading.excepthook = lambda _args: None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shardload`` command line and return its exit status.

    Called with no ``argv`` (the ``shardload`` program, ``python -m shardload``), it is the program: if
    threads that code the command ran (a ``--map``) left running remain once the command is done, it
    ends the process without waiting for them (:func:`_end_without_leftover_threads`).

    >>> main(["verify", "out/"])   # doctest: +SKIP
    0
    """
    try:
        code = _main(argv)
    except KeyboardInterrupt:  # before a command runs (imports, parsing): one line, no traceback
        _error("interrupted")
        code = Exit.INTERRUPTED
    if argv is None:
        _end_without_leftover_threads(code)
    return code


def _end_without_leftover_threads(code: int) -> None:
    """End the program now, with ``code``, if threads other than the main one that are not daemons still run.

    Python would wait for them at exit, forever for a map's ``Thread(target=serve_forever).start()``, after
    the command's work and output are done. The command joins every thread it starts, so such a thread is
    the user's: say so once, naming the user code seen to start threads, then run the exit handlers
    (``atexit``: logging, temporary files) and end the process without joining it.
    """
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not left or threading.current_thread() is not threading.main_thread():
        return
    mapping = sys.modules.get("shardload.prepare.mapping")
    starters = sorted(getattr(mapping, "started_threads", ()))
    by = " or ".join(starters) if starters else "code the command ran"
    names = ", ".join(repr(t.name) for t in left[:3]) + (", ..." if len(left) > 3 else "")
    print(
        f"shardload: warning: not waiting for {len(left)} thread(s) left running by {by} ({names}): the command is "
        "done, and they end with it; code run by a command must not leave threads running (or makes them daemons)",
        file=sys.stderr,
    )
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or the reader went away: nothing more can be said
            pass
    os._exit(code)


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    _tolerant_stdout()
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: argparse has printed them
        return exc.code if isinstance(exc.code, int) else Exit.USAGE
    if getattr(args, "command", None) is None:
        parser.print_help(sys.stderr)
        return Exit.USAGE
    module = _command(args.command)
    # What to do after an interruption: a prepare is finished by rerunning it with --resume, an upload by rerunning it.
    after = {
        "prepare": "; rerun the same command with --resume to continue where it stopped",
        "upload": "; run the same command again to finish the upload (what is already there is not put again)",
    }.get(args.command, "")
    with _masked_output():  # errors, tracebacks (--debug), --json, prints, logs: no credential in any
        return _run(module, args, after)


def _run(module: ModuleType, args: argparse.Namespace, after: str) -> int:
    try:
        with _logging_to_stderr(), _sigterm_raises(), json_stdout(_json_only(args)):
            return int(module.run(args))
    except (KeyboardInterrupt, Terminated) as exc:
        atexit.register(_quiet_teardown)
        how = "interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped by SIGTERM"
        if args.command == "prepare" and _committed(args.output):
            # Stopped after its commit: the set is complete, and a --resume would find nothing to finish.
            print(f"shardload: {how} after {args.output} was complete; nothing to resume", file=sys.stderr)
            return Exit.OK
        _error(f"{how}{after}")
        return Exit.INTERRUPTED if isinstance(exc, KeyboardInterrupt) else Exit.TERMINATED
    except CommandError as exc:
        return _fail(exc, exc.code, args.debug)
    except ShardloadError as exc:
        code = next((c for cls, c in ERROR_CODES if isinstance(exc, cls)), Exit.PROBLEMS)
        return _fail(exc, code, args.debug)
    except BrokenPipeError:  # `shardload inspect OUT | head`
        return Exit.OK
    except MemoryError:  # not a bug: the machine, the process's limit or the options ask too much
        atexit.register(_quiet_teardown)
        message = (
            f"shardload {args.command} ran out of memory. This is the process's memory limit (ulimit -v, a cgroup, "
            "a job's memory request) or the machine's, not damaged data: give the process more memory, or ask "
            "for less at once (prepare: fewer --workers, a smaller --shard-size; loading: fewer workers, a "
            "smaller prefetch)"
        )
        return _fail(CommandError(message + after), Exit.OUTPUT, args.debug)
    except OSError as exc:  # not wrapped by the library: a full disk, a permission, an I/O error
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(CommandError(f"{where}{exc.strerror or exc}"), Exit.OUTPUT, args.debug)
    except Exception as exc:  # noqa: BLE001  the one place where any failure becomes an exit status
        if args.debug:
            traceback.print_exc()
        _error(
            f"internal error: {type(exc).__name__}: {exc}. This is a bug in shardload; rerun with --debug "
            "and report the traceback."
        )
        return Exit.INTERNAL


def _json_only(args: argparse.Namespace) -> bool:
    """Whether stdout carries the one JSON object and nothing else (``--json``; ``demo --json`` prints both)."""
    return bool(getattr(args, "json", False)) and args.command != "demo"


class Terminated(Interruption):
    """Raised in the main thread by SIGTERM while a command runs: ``finally`` blocks run, the exit status is 143.

    An :class:`~shardload._base.interrupts.Interruption`: no ``except Exception`` swallows it, and a guard
    around user code (a ``--map``) lets it through rather than blaming the code.
    """


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` during a command (main thread only); a second one ends the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class _CommandParser(argparse.ArgumentParser):
    """A command's parser, whose usage error for a missing value says how to give one that starts with ``-``.

    argparse reads ``--part -1/3`` as ``--part`` with no value and an option ``-1/3`` (only plain negative
    numbers are taken as values), so ``expected one argument`` alone sends the user looking for a missing value.
    """

    def error(self, message: str) -> NoReturn:
        head, sep, _ = message.partition(": expected one argument")
        if sep and head.startswith("argument "):
            names = head.removeprefix("argument ").split("/")
            flag = next((n for n in names if n.startswith("--")), names[0])
            message += f" (a value that starts with '-' must be joined to the option: {flag}=VALUE)"
        super().error(message)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the command named in ``argv`` gets its options added (``argv=None``: every command).

    So one command's costly or broken option setup never slows down or breaks another.
    """
    from shardload import __version__

    parser = argparse.ArgumentParser(
        prog="shardload",
        description="Prepare variable-length datasets as memory-mapped shard sets, and check, describe and "
        "plan them for distributed training.",
        epilog=EXIT_CODES_HELP + "\n\nRun `shardload COMMAND --help` for the options and an example of each command.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"shardload {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", parser_class=_CommandParser)
    # The command is the first word that is not an option: the global options take no value.
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name in COMMANDS:
        module = _command(name)
        p = sub.add_parser(
            name,
            help=module.SUMMARY,
            description=module.__doc__,
            epilog=module.EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if chosen is None or chosen == name:
            # SUPPRESS: `shardload --debug CMD` is not reset to False by the subcommand's default.
            p.add_argument(
                "--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of an error"
            )
            module.add_arguments(p)
    return parser


def _committed(out: str) -> bool:
    """Whether this process's prepare committed its set into ``out``."""
    from shardload.prepare.workdir import WorkDir
    from shardload.remote.url import local_path

    return WorkDir.committed(local_path(out))


#: commands whose module is named otherwise (a module named ``inspect`` would shadow the standard library's)
_MODULE_OF = {"inspect": "inspect_set"}


def _command(name: str) -> ModuleType:
    return importlib.import_module(f"shardload.cli.{_MODULE_OF.get(name, name)}")


def _fail(exc: BaseException, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    _error(str(exc))
    return code


def _tolerant_stdout() -> None:
    """Escape what stdout cannot encode (a non-UTF-8 path under LANG=C) rather than fail after the work."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError):  # not a text stream we own (pytest's capture, a closed stream)
            pass


class _MaskedStream:
    """A text stream that masks credentials (:func:`~shardload._base.redact.redact`) in all that is written to it."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(redact(text))

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


@contextmanager
def _masked_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` masked for the duration of a command: the last line of the credential mask."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _MaskedStream(out), _MaskedStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def _error(message: str) -> None:
    print(f"shardload: error: {' '.join(message.split())}", file=sys.stderr)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """Writes to whatever ``sys.stderr`` is at the time (pytest's capsys swaps it)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


@contextmanager
def _logging_to_stderr() -> Iterator[None]:
    """INFO logs of the ``shardload`` logger to stderr for the duration of a command."""
    logger = logging.getLogger("shardload")
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
