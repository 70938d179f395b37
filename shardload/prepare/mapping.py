"""The map step of ``prepare``/``write``: a user function applied to every sample as it is read.

Where it sits: prepare -> (read a source unit -> **map** -> check against the schema -> stage) -> lay
out -> write shards. The map runs in the ingest worker processes
(:func:`shardload.prepare.pipeline._ingest_unit`), before the schema check, so the schema is that of
the first *mapped* sample.

Guarantees: a run is identified by the function (:func:`map_identity`: ``module:qualname`` and a hash
of its source), so ``--resume`` refuses a run whose map changed; a function that cannot be pickled by
name to the workers (a lambda, a nested function) is refused up front (:func:`check_sendable`). What
the function may return and how its samples are located: docs/cli.md, "shardload prepare" (``--map``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from shardload.errors import InputError

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
    return f"raised {type(exc).__name__}: {exc}"


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
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise InputError(
                f"--map {spec!r}: no module named {exc.name!r} (looked in the current directory and the installed "
                "packages); run from the directory that holds it, or install its package"
            ) from exc
        raise InputError(f"--map {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    except (Exception, SystemExit) as exc:  # any error of the user's module is reported as its import failing
        detail = f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
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
            out = self._fn(sample if isinstance(sample, dict) else dict(sample))
        except (Exception, SystemExit) as exc:  # any error of the user's function, named with the sample
            raise InputError(f"{where}: the map function {name} {raised(exc)}") from exc
        if out is None:
            self.dropped += 1
            return []
        if isinstance(out, Mapping):
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
        if not out:
            self.dropped += 1
        n = len(out)
        return [(f"{where}, piece {j + 1} of {n} (mapped by {name})", piece) for j, piece in enumerate(out)]
