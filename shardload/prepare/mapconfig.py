"""A configured map: keyword arguments for it, a factory that makes it once per process, and files it reads.

Where it sits: :class:`~shardload.prepare.options.PrepareOptions` makes a :class:`ConfiguredMap` of
``map_args=``, ``map_factory=`` and ``map_files=`` (``--map-arg``, ``--map-factory``, ``--map-file``) and
sends it to the ingest workers in place of the bare function; :func:`shardload.prepare.batched.mapped_samples`
turns it into the function each process applies (:meth:`ConfiguredMap.function`).

Guarantees: a factory is called in the process that maps (a worker; this process with one worker or in
``write()``), once per process and configuration, never per record, under
:class:`~shardload.prepare.mapping.user_code`; what it raises or returns instead of a function is an
:class:`InputError` naming the factory and its arguments. The arguments are JSON values and each map
file's sha256 is taken when the options are made; both are part of the options record
(``map_args``, ``map_files``), so ``--resume`` refuses other arguments or a changed file, naming it. The
keywords are checked against the function's signature before any worker starts. The conventions, and
what is and is not compared: docs/cli.md, ``--map-factory``.
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import json
import math
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shardload.errors import InputError
from shardload.prepare.mapping import MapFunction, closed_streams, interrupts, map_name, raised, user_code

__all__ = [
    "ConfiguredMap",
    "checked_map_args",
    "map_file_digests",
    "map_files_change",
    "map_files_changed_since",
    "parse_map_arg",
]

_ARGS_HINT = "--map-arg KEY=VALUE on the command line, map_args={KEY: VALUE} in Python"

#: per process, the functions factories made: (label, arguments) -> (pid, factory, file digests, function)
_made: dict[tuple[str, str], tuple[int, object, tuple[str, ...], MapFunction]] = {}


def parse_map_arg(text: str, flag: str = "--map-arg") -> tuple[str, Any]:
    """``KEY=VALUE`` as ``(KEY, VALUE)``: the value read as JSON where it parses (``2048``, ``true``, ``[1, 2]``,
    ``"12"``), else kept as the text itself (``tokenizer.json``); for ``--map-file``, always the text (a path).

    Raises:
        InputError: no ``=``, a key that is no keyword name, or a JSON value no record can hold (a number beyond a
            float's range, lists nested deeper than the JSON reader goes).
    """
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise InputError(
            f"{flag} {_short(text)}: write KEY=VALUE with KEY a keyword of the map (a Python name), e.g. "
            f"{flag} max_tokens=2048; VALUE is read as JSON where it parses, else kept as text"
        )
    if flag == "--map-file":
        return key, value
    try:
        return key, json.loads(value, parse_constant=_no_constant, parse_float=_finite_float)
    except _OutOfRange as exc:
        number = str(exc)[:40]
        raise InputError(
            f"{flag} {_short(text)}: the number {number} is beyond the range of a float, so no record could compare "
            f"it: give a smaller number, or pass it as text in JSON quotes ({flag} '{key}=\"{number}\"')"
        ) from None
    except RecursionError:  # nested deeper than the JSON reader goes: neither a value it can read nor meant as text
        raise InputError(
            f"{flag} {key}=...: the value's JSON nests lists or dicts too deeply to be read ({len(value):,} "
            "characters); give a flatter value, or put it in a file the map reads (--map-file KEY=PATH)"
        ) from None
    except ValueError:  # not JSON (or NaN/Infinity, which a record could not compare): the text itself
        return key, value


class _OutOfRange(Exception):
    """A JSON number a float cannot hold (``1e999``), which JSON reads as inf."""


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutOfRange(text)
    return value


def checked_map_args(args: object, what: str = "map_args") -> dict[str, Any]:
    """``args`` as the map gets them and the record holds them: keyword names sorted, values as JSON reads them
    back (a tuple becomes a list), so that Python and the command line give the map the same values.

    Raises:
        InputError: not a mapping of keyword names, or a value that is no finite JSON value.
    """
    if not isinstance(args, Mapping):
        raise InputError(f"{what} must map keyword names to values, got {type(args).__name__} {args!r}")
    out = {}
    for key, value in args.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise InputError(f"{what}: {key!r} is not a keyword name (a Python name, e.g. max_tokens)")
        try:
            text = json.dumps(value, allow_nan=False, sort_keys=True)
        except RecursionError:
            raise InputError(
                f"{what}[{key!r}] nests lists or dicts too deeply to be recorded: give a flatter value, or put it in a "
                "file the map reads (map_files=, --map-file KEY=PATH)"
            ) from None
        except (TypeError, ValueError) as exc:
            raise InputError(
                f"{what}[{key!r}] = {_short(value)} is not a JSON value ({exc}): a map's arguments are recorded so that "
                "--resume can compare them. Pass text, a number, a bool, or lists and dicts of those (a path the map "
                "opens rather than the object it makes), or bind the object with functools.partial (recorded by a "
                "hash of its repr only)"
            ) from None
        try:  # the record is UTF-8 JSON: a lone surrogate (command-line bytes that are not UTF-8) has no place there
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(
                f"{what}[{key!r}] = {_short(value)} holds text that is not valid Unicode (a lone surrogate: on the "
                "command line, bytes that are not UTF-8), which the record of the run cannot hold: give UTF-8 text "
                "(a file with such a name: --map-file KEY=PATH)"
            ) from None
        out[key] = json.loads(text)
    return dict(sorted(out.items()))


def map_file_digests(files: object) -> dict[str, dict[str, str]]:
    """``{keyword: {"path": path, "sha256": hex}}`` of the map's files (``map_files``), each hashed whole now.

    Raises:
        InputError: not a mapping of keyword names to paths, or a file that cannot be read.
    """
    if not isinstance(files, Mapping):
        raise InputError(f"map_files must map keyword names to file paths, got {type(files).__name__} {files!r}")
    out = {}
    for key, path in files.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise InputError(f"map_files: {key!r} is not a keyword name (a Python name, e.g. tokenizer)")
        if not isinstance(path, (str, os.PathLike)):
            raise InputError(f"map_files[{key!r}] must be a file path, got {type(path).__name__} {path!r}")
        name = os.fsdecode(path)
        try:
            sha256 = _sha256_of(name)
        except OSError as exc:
            raise InputError(
                f"the map file {name} (--map-file {key}={name}, map_files[{key!r}]) cannot be read: "
                f"{exc.strerror or exc}. Name a file the map reads (a directory: name its files one by one)"
            ) from None
        out[key] = {"path": name, "sha256": sha256}
    return dict(sorted(out.items()))


def _sha256_of(name: str) -> str:
    """The sha256 of the regular file ``name``; anything else is an OSError saying what it is, never read (a FIFO
    would wait for a writer for ever, ``/dev/zero`` never end)."""
    digest = hashlib.sha256()
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device), which prepare does not read")
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def map_files_change(old: object, new: object) -> str:
    """What changed in the recorded map files between an interrupted run (``old``) and this one, for a message."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return f"map_files was {old!r}, now {new!r}"
    said = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict) and a.get("path") == b.get("path"):
            said.append(
                f"the map file {b.get('path')} (map_files[{key!r}]) changed since the interrupted run (sha256 "
                f"{str(a.get('sha256'))[:16]}... then, {str(b.get('sha256'))[:16]}... now): put the file it read back"
            )
        else:
            was, now = (x.get("path") if isinstance(x, dict) else x for x in (a, b))
            said.append(f"the map file map_files[{key!r}] was {was!r}, now {now!r}")
    return "; ".join(said)


def map_files_changed_since(record: object) -> str | None:
    """What changed in the map files since ``record`` (the options' ``map_files`` record, hashed when the run
    started) as an error message for a run that read them meanwhile, or None when every file is as it was."""
    if not isinstance(record, dict):
        return None
    said = []
    for key, was in record.items():
        try:
            now = _sha256_of(was["path"])
        except OSError as exc:  # deleted, or made unreadable, during the run
            said.append(f"{was['path']} (map_files[{key!r}]) cannot be read any more ({exc.strerror or exc})")
            continue
        if now != was["sha256"]:
            said.append(
                f"{was['path']} (map_files[{key!r}]) changed while prepare ran (sha256 {was['sha256'][:16]}... when "
                f"it started, {now[:16]}... now)"
            )
    if not said:
        return None
    return (
        f"the map file {'; '.join(said)}: the samples may not all come from the file recorded when the run started, "
        "so nothing was committed and the work staged is discarded (no --resume could tell which do). Keep a map's "
        "files as they are while prepare runs (give it a copy of a file being edited), then run prepare again"
    )


@dataclass(frozen=True)
class ConfiguredMap:
    """A map with its arguments, or a factory that makes the map, as sent to the worker processes.

    Attributes:
        fn: the map (called ``fn(sample, **kwargs)``), or with ``factory`` the factory (``fn(**kwargs)``
            returns the map).
        factory: whether ``fn`` is a factory.
        kwargs: the keyword arguments, map files included (their paths).
        digests: the sha256 of each map file, so that a process makes the map again for a changed file.
    """

    fn: Callable[..., Any]
    factory: bool
    kwargs: Mapping[str, Any]
    digests: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_keywords(self.fn, self.factory, self.kwargs, self.map_label)

    @property
    def map_label(self) -> str:
        """How messages name the map: ``mod:encode``, or a factory's ``mod:make_encoder()`` (read by ``map_name``)."""
        name = map_name(self.fn)
        return f"{name}()" if self.factory else name

    def __call__(self, sample: Any) -> Any:
        """The map with its arguments (a factory's map: :meth:`function`)."""
        return self.fn(sample, **self.kwargs)

    def function(self) -> MapFunction:
        """The function this process applies: the map with its arguments, or the factory's map, made here once."""
        if not self.factory:
            return self
        key = (self.map_label, repr(sorted(self.kwargs.items())))
        pid = os.getpid()
        have = _made.get(key)
        # A map made in another process (inherited through a fork) or by another factory object (a module
        # reloaded in this process) or for other file contents is made again.
        if have is not None and have[0] == pid and have[1] is self.fn and have[2] == self.digests:
            return have[3]
        made = self._make()
        _made[key] = (pid, self.fn, self.digests, made)
        return made

    def _make(self) -> MapFunction:
        name = map_name(self.fn)
        called = _called_with(self.kwargs)
        try:
            with user_code(f"the map factory {name}") as call:
                made = self.fn(**self.kwargs)
        except BaseException as exc:  # anything the factory raised, but Ctrl-C or SIGTERM: named with its arguments
            if interrupts(exc):
                raise
            raise InputError(
                f"the map factory {name} {raised(exc)}, called {called} (once per worker process, before its first "
                f"record): fix the factory or its arguments ({_ARGS_HINT}), then rerun with --resume"
            ) from exc
        closed = closed_streams(call)
        if closed is not None:
            raise InputError(f"the map factory {name}, called {called}, {closed}")
        if not callable(made):
            raise InputError(
                f"the map factory {name}, called {called}, returned {type(made).__name__} {_short(made)}, not a "
                "function: a factory returns the function prepare applies to each sample (or each batch, with "
                "--map-batch). To apply the function itself to each sample, name it with --map (map=) instead"
            )
        return made  # type: ignore[no-any-return]


def _called_with(kwargs: Mapping[str, Any]) -> str:
    if not kwargs:
        return "with no arguments"
    return "with " + ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items())


def _short(value: object, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters with ``...`` (a path stays whole)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_keywords(fn: Callable[..., Any], factory: bool, kwargs: Mapping[str, Any], label: str) -> None:
    """Refuse arguments the function (or factory) cannot take, before any worker starts and any record is read."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a built-in without a signature: its first call says it
        return
    try:
        if factory:
            signature.bind(**kwargs)
        else:
            signature.bind(None, **kwargs)  # the sample (or batch) first
    except TypeError as exc:
        what = f"the map factory {map_name(fn)}" if factory else f"the map function {label}"
        given = ", ".join(kwargs) or "none"
        raise InputError(
            f"{what} cannot be called with the map arguments given ({given}): {exc}. Its parameters are "
            f"{signature}; give the arguments it takes ({_ARGS_HINT}; a file: --map-file KEY=PATH, map_files=)"
        ) from None
