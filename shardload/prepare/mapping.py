"""The map step of ``prepare``/``write``: a user function applied to every sample as it is read.

Where it sits: prepare -> (read a source unit -> **map** -> check against the schema -> stage) -> lay
out -> write shards. The map runs in the ingest worker processes
(:func:`shardload.prepare.pipeline._ingest_unit`), before the schema check, so the schema is that of
the first *mapped* sample.

Guarantees: a run is identified by the function (:func:`map_identity`: ``module:qualname`` and a hash
of its source), so ``--resume`` refuses a run whose map changed; a function that cannot be pickled by
name to the workers (a lambda, a nested function) is refused up front (:func:`check_sendable`). The
user's code runs under :func:`user_code` (importing its module too), wherever it runs (this process or
a worker): an ``os._exit`` or ``sys.exit`` of it is an :class:`InputError` naming the function and the
record, and a change of the working directory is undone after each call. A returned field that no array
can be (``None``, a dict) is refused naming the map. What the function may return and how its samples
are located: docs/cli.md, "shardload prepare" (``--map``).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib
import inspect
import logging
import os
import pickle
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NoReturn

import numpy as np

from shardload._base.interrupts import Interruption
from shardload.errors import InputError
from shardload.schema._nonarray import FIELD_HOLDS, describe_non_array

logger = logging.getLogger("shardload.prepare")

__all__ = [
    "MapFunction",
    "MappedSamples",
    "check_record",
    "check_sendable",
    "load_map",
    "map_identity",
    "map_name",
    "sendable",
]

#: a map: one sample dict in; a dict, None (drop) or a list of dicts out
MapFunction = Callable[[dict[str, Any]], Any]

#: what a map must return, for messages
RETURNS = "a map returns one sample (a dict of field name -> array), None to drop the sample, or a list of such dicts"


def map_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of ``fn`` (of its class for a callable object, of the function of a partial); a
    configured map (:mod:`shardload.prepare.mapconfig`) says its own ``map_label``."""
    label = getattr(fn, "map_label", None)
    if isinstance(label, str):
        return label
    target = fn.func if isinstance(fn, functools.partial) else fn
    if not hasattr(target, "__qualname__"):
        target = type(target)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"


def map_identity(fn: Callable[..., Any]) -> dict[str, Any]:
    """What ``--resume`` compares and the manifest records: the function's name and a hash of its source.

    The hash covers the source of the function (or of a callable object's class) and the arguments of
    a :func:`functools.partial`; ``None`` when the source cannot be found (a built-in, a REPL function).
    A change in what the function calls (another function, a tokenizer file, a package) is not seen.
    """
    target = fn.func if isinstance(fn, functools.partial) else fn
    code = target if inspect.isfunction(target) or inspect.ismethod(target) else type(target)
    try:
        source: str | None = inspect.getsource(code)
    except (OSError, TypeError):
        source = None
    if source is not None and isinstance(fn, functools.partial):
        source += f"\n# partial: {fn.args!r} {sorted(fn.keywords.items())!r}"
    digest = None if source is None else "sha256:" + hashlib.sha256(source.encode()).hexdigest()
    return {"function": map_name(fn), "code": digest}


def raised(exc: BaseException) -> str:
    """What the user's code did, for an error message: ``raised KeyError: 'x'``, or ``called sys.exit(0)``
    (a ``SystemExit`` left to propagate would end prepare with no message, maybe with status 0)."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r}) (a map returns or raises; it must not exit)"
    if isinstance(exc, UserCodeExited):
        return f"called os._exit({exc.status!r}) (a map returns or raises; it must not exit)"
    return f"raised {type(exc).__name__}" + (f": {exc}" if str(exc) else "")


class UserCodeExited(BaseException):
    """Raised in place of ``os._exit`` called by the user's code under :func:`user_code`.

    A ``BaseException``, as ``SystemExit`` is, so that the user's own ``except Exception`` does not swallow it.
    """

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


#: the (process, thread) pairs running user code under :func:`user_code` (each may nest); a forked child
#: of user code is neither, so its ``os._exit`` is the real one
_guarded: dict[tuple[int, int], int] = {}
_guard_lock = threading.Lock()
_real_exit = os._exit
#: copies of descriptors 0, 1 and 2 (-1: closed), taken at this process's first user code, to put back one it closes
_std_copies: dict[int, int] = {}
#: the user code (by name) seen to start threads, for the command's warning about threads left running at its end
started_threads: set[str] = set()
_STREAM_NAMES = {0: "0 (stdin)", 1: "1 (stdout)", 2: "2 (stderr)"}


def _exit_of_user_code(status: int) -> NoReturn:
    """``os._exit`` while user code runs: in its process and thread it raises :class:`UserCodeExited`; elsewhere it exits."""
    if (os.getpid(), threading.get_ident()) in _guarded:
        raise UserCodeExited(status)
    _real_exit(status)


def _forget_guards_in_child() -> None:
    """In a forked child (a map that forks, ``multiprocessing``'s fork start method): ``os._exit`` is the real one.

    The child's thread has the ident of the parent's thread that forked, inside the map: without this, the
    child's own ``os._exit(0)`` (how a forked child ends) would raise instead, and the child would run on.
    """
    global _guard_lock
    _guard_lock = threading.Lock()  # another thread of the parent may have held it at the fork
    _guarded.clear()
    os._exit = _real_exit


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_guards_in_child)


def _is_open(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        return False
    return True


class user_code:
    """Run the user's code (a map, the import of its module) where what it does to the process is seen.

    In this process and thread, ``os._exit`` raises :class:`UserCodeExited` (which callers report with
    :func:`raised`, as they do ``SystemExit``) instead of ending the process with no message, maybe with
    status 0; other threads, and processes the code forks, exit as before. The working directory is put
    back after the call, so that prepare's relative paths (the sources, the output) keep meaning what they
    meant; ``moved_to`` is then where the code went (else ``None``). A descriptor 0, 1 or 2 the code closed
    is put back (so that the error can be printed) and named in ``closed_streams``. A thread the code
    started adds ``name`` to :data:`started_threads`. A child the code forked that comes back out of it
    (returns, or raises ``SystemExit``) ends there, with the real ``os._exit``, rather than run on as a
    second copy of prepare. About 2.5 us a call (a class: ``@contextmanager``
    costs 1 us more).

    Not caught: ``os._exit`` under another name (``posix._exit``, or bound by code imported before),
    ``exit()`` from native code, a signal; in a worker process the pool reports that death
    (``--workers 2`` and up), in the main process it ends prepare (docs/cli.md, ``--map``).
    """

    __slots__ = ("_cwd", "_key", "_threads", "closed_streams", "moved_to", "name")

    def __init__(self, name: str = "") -> None:
        self.name = name

    def __enter__(self) -> user_code:
        self.moved_to: str | None = None
        self.closed_streams: list[str] = []
        try:
            self._cwd: str | None = os.getcwd()
        except OSError:  # the working directory was removed: nothing to put back
            self._cwd = None
        if not _std_copies:
            for fd in (0, 1, 2):
                _std_copies[fd] = os.dup(fd) if _is_open(fd) else -1  # os.dup: not inherited by an exec
        self._key = key = (os.getpid(), threading.get_ident())
        self._threads = threading.active_count()
        with _guard_lock:
            _guarded[key] = _guarded.get(key, 0) + 1
            os._exit = _exit_of_user_code
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        key = self._key
        if os.getpid() != key[0]:
            # A child the code forked came back out of it (it returned, or raised SystemExit) instead of ending:
            # it must not run on as a second copy of prepare. It ends here, as a forked child ends.
            _real_exit(_child_status(error))
        with _guard_lock:
            depth = _guarded.get(key)
            if depth == 1:
                del _guarded[key]
            elif depth is not None:  # None: a forked child, whose guards were dropped at the fork
                _guarded[key] = depth - 1
            if not _guarded and os._exit is _exit_of_user_code:
                os._exit = _real_exit
        if threading.active_count() > self._threads:
            started_threads.add(self.name)
        for fd, copy in _std_copies.items():
            if copy >= 0 and not _is_open(fd):
                os.dup2(copy, fd)
                self.closed_streams.append(_STREAM_NAMES[fd])
        cwd = self._cwd
        if cwd is None:
            return
        try:
            now = os.getcwd()
        except OSError:
            now = "a directory since removed"
        if now != cwd:
            self.moved_to = now
            os.chdir(cwd)


def _child_status(error: BaseException | None) -> int:
    """The exit status of a forked child that left user code with ``error`` (``None``: it returned)."""
    if error is None:
        return 0
    if isinstance(error, SystemExit):
        code = error.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 1


def closed_streams(call: user_code) -> str | None:
    """What to say of the streams ``call`` closed (for an error naming the code), ``None`` if it closed none."""
    if not call.closed_streams:
        return None
    return (
        f"closed file descriptor {' and '.join(call.closed_streams)} (put back; user code must not close the "
        "command's standard streams)"
    )


def interrupts(exc: BaseException) -> bool:
    """Whether ``exc``, raised in user code, interrupts the run (Ctrl-C, SIGTERM) rather than being the code's failure."""
    return isinstance(exc, (KeyboardInterrupt, Interruption))


def load_map(spec: str, flag: str = "--map") -> MapFunction:
    """The function named by ``spec``, ``module:attr`` (``mypkg.tok:encode``; ``attr`` may be dotted).

    The module is imported as Python imports it (from ``sys.path``; the command
    line puts the current directory first, as ``python -m`` does). ``flag`` is
    the option messages name (``--map``, ``--map-factory``).

    Raises:
        InputError: a spec that is not ``module:attr``, a module that is not
            found or fails to import, a missing attribute, or one that is not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr or ":" in attr:
        raise InputError(
            f"{flag} {spec!r}: name the function as MODULE:FUNCTION, e.g. {flag} mypkg.tok:encode (the module is "
            "imported from the current directory or the installed packages), or as FILE.py:FUNCTION"
        )
    path = None
    if module_name.endswith(".py"):  # a file: its folder goes first on sys.path (workers inherit it)
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise InputError(f"{flag} {spec!r}: no file {module_name} (FILE.py:FUNCTION names a Python file)")
        module_name = os.path.basename(path)[: -len(".py")]
        if os.path.dirname(path) not in sys.path:
            sys.path.insert(0, os.path.dirname(path))
    try:
        with user_code(f"the map module {module_name}") as call:
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise InputError(
                f"{flag} {spec!r}: no module named {exc.name!r} (looked in the current directory and the installed "
                "packages); run from the directory that holds it, name its file (--map path/to/tok.py:encode), or "
                "install its package"
            ) from exc
        raise InputError(f"{flag} {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    except BaseException as exc:  # anything the user's module raised, but Ctrl-C or SIGTERM: its import failed
        if interrupts(exc):
            raise
        detail = raised(exc) if isinstance(exc, (SystemExit, UserCodeExited)) else f"{type(exc).__name__}: {exc}"
        raise InputError(f"{flag} {spec!r}: importing {module_name!r} failed: {detail}") from exc
    closed = closed_streams(call)
    if closed is not None:
        raise InputError(f"{flag} {spec!r}: importing {module_name!r} {closed}")
    found = getattr(module, "__file__", None)
    if path is not None and (found is None or not os.path.samefile(found, path)):
        raise InputError(
            f"{flag} {spec!r}: a module named {module_name!r} is imported from {found} already; rename {path}"
        )
    fn: Any = module
    for i, part in enumerate(attr.split(".")):
        try:
            fn = getattr(fn, part)
        except AttributeError:
            where = module_name + "".join(f".{p}" for p in attr.split(".")[:i])
            raise InputError(f"{flag} {spec!r}: {where} has no attribute {part!r}") from None
    if not callable(fn):
        raise InputError(f"{flag} {spec!r}: {module_name}:{attr} is a {type(fn).__name__}, not a function")
    return fn  # type: ignore[no-any-return]


def sendable(fn: MapFunction) -> bool:
    """Whether ``fn`` can be pickled to worker processes (see :func:`check_sendable`)."""
    try:
        check_sendable(fn, 2)
    except InputError:
        return False
    return True


def check_sendable(fn: MapFunction, workers: int) -> None:
    """Refuse a map that cannot be pickled to worker processes, before any worker starts.

    Raises:
        InputError: naming the function and how to make it sendable.
    """
    try:
        pickle.dumps(fn)
    except Exception as exc:  # pickle raises PicklingError, AttributeError, TypeError, ...
        raise InputError(
            f"the map function {map_name(fn)} cannot be sent to the {workers} worker processes ({exc}): a worker "
            "gets the function by its module and name, so it must be defined at the top level of a module, not "
            "be a lambda, a nested function or a closure. Move it into a module, or run with workers=1 "
            "(--workers 1), where it runs in this process."
        ) from exc


def check_record(where: str, sample: object) -> None:
    """Refuse a record that is no dict before a map gets it (``write()`` takes any iterable), as unmapped."""
    if not isinstance(sample, Mapping):
        raise InputError(f"{where}: a sample must be a dict of named arrays, got {type(sample).__name__}")


class MappedSamples:
    """The ``(locator, sample)`` pairs of a reader, passed lazily through a map (or not, for ``fn=None``)."""

    def __init__(
        self, samples: Iterable[tuple[str, Mapping[str, Any]]], fn: MapFunction | None = None, name: str | None = None
    ) -> None:
        self._it = iter(samples)
        self._fn = fn
        self._name = name if name is not None else "" if fn is None else map_name(fn)
        self._pending: list[tuple[str, Mapping[str, Any]]] = []
        #: records the map dropped (it returned None or an empty list)
        self.dropped = 0
        #: records given to the map, and those it split (made more than one sample of)
        self.records = 0
        self.split = 0
        #: field -> split records that have the same value of it in every piece
        self.repeated: dict[str, int] = {}
        self._moved = False  # the map changed the working directory (said once)

    @property
    def mapping(self) -> bool:
        """Whether the samples pass through a map (else ``records`` counts nothing: each record is a sample)."""
        return self._fn is not None

    def __iter__(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        return self

    def __next__(self) -> tuple[str, Mapping[str, Any]]:
        while not self._pending:
            where, sample = next(self._it)
            if self._fn is None:
                return where, sample
            check_record(where, sample)
            self._pending = self._apply(where, sample)[::-1]
        return self._pending.pop()

    def peek(self) -> tuple[str, Mapping[str, Any]] | None:
        """The next mapped sample, left in place; None at the end."""
        try:
            item = next(self)
        except StopIteration:
            return None
        self._pending.append(item)
        return item

    def _apply(self, where: str, sample: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
        out = self._call(where, sample if isinstance(sample, dict) else dict(sample))
        return self._results(where, out)

    def _call(self, where: str, arg: Any) -> Any:
        """The map called on ``arg`` (a sample, or a batch read at ``where``) as user code; a failure names ``where``."""
        assert self._fn is not None
        name = self._name
        try:
            with user_code(f"the map function {name}") as call:
                out = self._fn(arg)
        except (
            BaseException
        ) as exc:  # anything the user's function raised, but Ctrl-C or SIGTERM: named with the sample
            if interrupts(exc):
                raise
            raise InputError(f"{where}: the map function {name} {raised(exc)}") from exc
        closed = closed_streams(call)
        if closed is not None:
            raise InputError(f"{where}: the map function {name} {closed}")
        if call.moved_to is not None and not self._moved:
            self._moved = True
            logger.warning(
                "%s: the map function %s changed the working directory (to %s); prepare changes it back after "
                "each call, as it names its sources and output relative to it",
                where,
                name,
                call.moved_to,
            )
        return out

    def _results(self, where: str, out: Any) -> list[tuple[str, Mapping[str, Any]]]:
        """The samples the map made of the record read at ``where`` (``out``: what it returned for it), checked."""
        name = self._name
        self.records += 1
        if out is None:
            self.dropped += 1
            return []
        if isinstance(out, Mapping):
            _check_fields(out, where, name)
            return [(f"{where} (mapped by {name})", out)]
        if not isinstance(out, list):
            raise InputError(
                f"{where}: the map function {name} returned a value of type {type(out).__name__}; {self.returns}"
            )
        for j, piece in enumerate(out):
            if not isinstance(piece, Mapping):
                raise InputError(
                    f"{where}: the map function {name} returned a list whose item {j} is a value of type {type(piece).__name__}; "
                    f"{self.returns}"
                )
            _check_fields(piece, f"{where}, piece {j + 1} of {len(out)}", name)
        if not out:
            self.dropped += 1
        if len(out) > 1:
            self._count_split(out)
        n = len(out)
        return [(f"{where}, piece {j + 1} of {n} (mapped by {name})", piece) for j, piece in enumerate(out)]

    def _count_split(self, pieces: list[Mapping[str, Any]]) -> None:
        """Count a split record, and each field whose value every piece repeats (text kept beside tokens)."""
        self.split += 1
        first, rest = pieces[0], pieces[1:]
        for key, value in first.items():
            if all(key in p and same_value(p[key], value) for p in rest):
                self.repeated[key] = self.repeated.get(key, 0) + 1

    #: what the map returns, for messages
    returns = RETURNS


def same_value(a: Any, b: Any) -> bool:
    """Whether two values a map returned for one field hold the same data (arrays: same dtype, shape and values)."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        return x.dtype == y.dtype and x.shape == y.shape and bool(np.array_equal(x, y))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001  == gave no truth value (numpy, torch raise their own kinds): not the same
        return False


def _check_fields(sample: Mapping[str, Any], where: str, name: str) -> None:
    """Refuse a returned field that no array can be (``None``, a dict, a set), naming the map that returned it."""
    for key, value in sample.items():
        what = describe_non_array(value)
        if what is not None:
            raise InputError(f"{where}: the map function {name} returned field {key!r} = {what}; {FIELD_HOLDS}")
