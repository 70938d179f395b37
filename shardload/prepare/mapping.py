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

import functools
import hashlib
import importlib
import inspect
import logging
import os
import pickle
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NoReturn

from shardload.errors import InputError
from shardload.schema._nonarray import FIELD_HOLDS, describe_non_array

logger = logging.getLogger("shardload.prepare")

__all__ = ["MapFunction", "MappedSamples", "check_sendable", "load_map", "map_identity", "map_name"]

#: a map: one sample dict in; a dict, None (drop) or a list of dicts out
MapFunction = Callable[[dict[str, Any]], Any]

#: what a map must return, for messages
RETURNS = "a map returns one sample (a dict of field name -> array), None to drop the sample, or a list of such dicts"


def map_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of ``fn`` (of its class for a callable object, of the function of a partial)."""
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
    return f"raised {type(exc).__name__}: {exc}"


class UserCodeExited(BaseException):
    """Raised in place of ``os._exit`` called by the user's code under :func:`user_code`.

    A ``BaseException``, as ``SystemExit`` is, so that the user's own ``except Exception`` does not swallow it.
    """

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


#: the threads running user code under :func:`user_code` (each may nest), and the ``os._exit`` they replaced
_guarded: dict[int, int] = {}
_guard_lock = threading.Lock()
_real_exit = os._exit


def _exit_of_user_code(status: int) -> NoReturn:
    """``os._exit`` while user code runs: in its thread it raises :class:`UserCodeExited`; elsewhere it exits."""
    if threading.get_ident() in _guarded:
        raise UserCodeExited(status)
    _real_exit(status)


class user_code:
    """Run the user's code (a map, the import of its module) where what it does to the process is seen.

    In this thread, ``os._exit`` raises :class:`UserCodeExited` (which callers report with :func:`raised`,
    as they do ``SystemExit``) instead of ending the process with no message, maybe with status 0; other
    threads exit as before. The working directory is put back after the call, so that prepare's relative
    paths (the sources, the output) keep meaning what they meant; ``moved_to`` is then where the code
    went (else ``None``). About 2 us a call (a class: ``@contextmanager`` costs 1 us more).

    Not caught: ``os._exit`` under another name (``posix._exit``, or bound by code imported before),
    ``exit()`` from native code, a signal; in a worker process the pool reports that death
    (``--workers 2`` and up), in the main process it ends prepare (docs/cli.md, ``--map``).
    """

    __slots__ = ("_cwd", "_me", "moved_to")

    def __enter__(self) -> user_code:
        self.moved_to: str | None = None
        try:
            self._cwd: str | None = os.getcwd()
        except OSError:  # the working directory was removed: nothing to put back
            self._cwd = None
        self._me = me = threading.get_ident()
        with _guard_lock:
            _guarded[me] = _guarded.get(me, 0) + 1
            os._exit = _exit_of_user_code
        return self

    def __exit__(self, *exc: object) -> None:
        me = self._me
        with _guard_lock:
            _guarded[me] -= 1
            if not _guarded[me]:
                del _guarded[me]
            if not _guarded and os._exit is _exit_of_user_code:
                os._exit = _real_exit
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


def load_map(spec: str) -> MapFunction:
    """The function named by ``spec``, ``module:attr`` (``mypkg.tok:encode``; ``attr`` may be dotted).

    The module is imported as Python imports it (from ``sys.path``; the command
    line puts the current directory first, as ``python -m`` does).

    Raises:
        InputError: a spec that is not ``module:attr``, a module that is not
            found or fails to import, a missing attribute, or one that is not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr or ":" in attr:
        raise InputError(
            f"--map {spec!r}: name the function as MODULE:FUNCTION, e.g. --map mypkg.tok:encode (the module is "
            "imported from the current directory or the installed packages)"
        )
    try:
        with user_code():
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise InputError(
                f"--map {spec!r}: no module named {exc.name!r} (looked in the current directory and the installed "
                "packages); run from the directory that holds it, or install its package"
            ) from exc
        raise InputError(f"--map {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    except (Exception, SystemExit, UserCodeExited) as exc:  # any error of the user's module: its import failed
        detail = raised(exc) if isinstance(exc, (SystemExit, UserCodeExited)) else f"{type(exc).__name__}: {exc}"
        raise InputError(f"--map {spec!r}: importing {module_name!r} failed: {detail}") from exc
    fn: Any = module
    for i, part in enumerate(attr.split(".")):
        try:
            fn = getattr(fn, part)
        except AttributeError:
            where = module_name + "".join(f".{p}" for p in attr.split(".")[:i])
            raise InputError(f"--map {spec!r}: {where} has no attribute {part!r}") from None
    if not callable(fn):
        raise InputError(f"--map {spec!r}: {module_name}:{attr} is a {type(fn).__name__}, not a function")
    return fn  # type: ignore[no-any-return]


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


class MappedSamples:
    """The ``(locator, sample)`` pairs of a reader, passed lazily through a map (or not, for ``fn=None``)."""

    def __init__(self, samples: Iterable[tuple[str, Mapping[str, Any]]], fn: MapFunction | None = None) -> None:
        self._it = iter(samples)
        self._fn = fn
        self._name = "" if fn is None else map_name(fn)
        self._pending: list[tuple[str, Mapping[str, Any]]] = []
        #: records the map dropped (it returned None or an empty list)
        self.dropped = 0
        self._moved = False  # the map changed the working directory (said once)

    def __iter__(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        return self

    def __next__(self) -> tuple[str, Mapping[str, Any]]:
        while not self._pending:
            where, sample = next(self._it)
            if self._fn is None:
                return where, sample
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
        assert self._fn is not None
        name = self._name
        try:
            with user_code() as call:
                out = self._fn(sample if isinstance(sample, dict) else dict(sample))
        except (
            Exception,
            SystemExit,
            UserCodeExited,
        ) as exc:  # any error of the user's function, named with the sample
            raise InputError(f"{where}: the map function {name} {raised(exc)}") from exc
        if call.moved_to is not None and not self._moved:
            self._moved = True
            logger.warning(
                "%s: the map function %s changed the working directory (to %s); prepare changes it back after "
                "each call, as it names its sources and output relative to it",
                where,
                name,
                call.moved_to,
            )
        if out is None:
            self.dropped += 1
            return []
        if isinstance(out, Mapping):
            _check_fields(out, where, name)
            return [(f"{where} (mapped by {name})", out)]
        if not isinstance(out, list):
            raise InputError(
                f"{where}: the map function {name} returned a value of type {type(out).__name__}; {RETURNS}"
            )
        for j, piece in enumerate(out):
            if not isinstance(piece, Mapping):
                raise InputError(
                    f"{where}: the map function {name} returned a list whose item {j} is a value of type {type(piece).__name__}; "
                    f"{RETURNS}"
                )
            _check_fields(piece, f"{where}, piece {j + 1} of {len(out)}", name)
        if not out:
            self.dropped += 1
        n = len(out)
        return [(f"{where}, piece {j + 1} of {n} (mapped by {name})", piece) for j, piece in enumerate(out)]


def _check_fields(sample: Mapping[str, Any], where: str, name: str) -> None:
    """Refuse a returned field that no array can be (``None``, a dict, a set), naming the map that returned it."""
    for key, value in sample.items():
        what = describe_non_array(value)
        if what is not None:
            raise InputError(f"{where}: the map function {name} returned field {key!r} = {what}; {FIELD_HOLDS}")
