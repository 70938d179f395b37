"""Command-line flags made from an option dataclass, so that flags and options cannot drift.

Each field with ``help`` metadata of an option class (:class:`~shardload.plan.Batching`,
:class:`~shardload.plan.EpochSpec`, the demo's ``DemoConfig``) becomes one flag
(``max_tokens`` -> ``--max-tokens``). The class itself checks the values when
:func:`options_from_args` builds it: one rule for Python and the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from shardload.cli._common import int_at_least

__all__ = ["add_option_flags", "flag_of", "options_from_args"]

T = TypeVar("T")


def flag_of(name: str) -> str:
    """The flag of a field: ``"max_tokens"`` -> ``"--max-tokens"``."""
    return "--" + name.replace("_", "-")


def _parser_of(hint: Any, minimum: int | None) -> tuple[Any, dict[str, Any]]:
    """``(type, extra argparse keywords)`` for a field's type hint."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [arg for arg in get_args(hint) if arg is not type(None)]
        return _parser_of(inner, minimum)
    if get_origin(hint) is Literal:
        return str, {"choices": get_args(hint)}
    if hint is bool:
        return None, {"action": argparse.BooleanOptionalAction}
    if hint is int and minimum is not None:
        return int_at_least(minimum), {}
    if hint in (int, float, str, Path):
        return hint, {}
    raise TypeError(f"no command-line flag for a field of type {hint!r}")  # a new option type: add it here


def add_option_flags(parser: argparse.ArgumentParser | Any, cls: type[Any], *, one_of: tuple[str, ...] = ()) -> None:
    """Add one flag per field of the option dataclass ``cls`` to ``parser`` (or an argument group).

    ``choices`` for a ``Literal``, ``--x/--no-x`` for a bool, required without
    a default. The fields in ``one_of`` form a required group of which exactly
    one flag is given (a bool there is a plain switch). A field's ``metadata``
    gives ``help``, ``metavar`` and, for an int, ``min`` (a usage error below it).
    """
    hints = typing.get_type_hints(cls)
    group = parser.add_mutually_exclusive_group(required=True) if one_of else None
    for f in _flag_fields(cls):
        kind, extra = _parser_of(hints[f.name], f.metadata.get("min"))
        if f.name in one_of and hints[f.name] is bool:
            extra = {"action": "store_true"}  # a mode of the group: --packing, not --no-packing
        keywords: dict[str, Any] = {"dest": f.name, "help": f.metadata.get("help"), **extra}
        if kind is not None:
            keywords["type"] = kind
        if "metavar" in f.metadata:
            keywords["metavar"] = f.metadata["metavar"]
        if f.default is not dataclasses.MISSING:
            keywords["default"] = f.default
        elif f.default_factory is dataclasses.MISSING:
            keywords["required"] = True
        else:
            keywords["default"] = None  # "not given": the factory makes the default when the object is built
        (group if group is not None and f.name in one_of else parser).add_argument(flag_of(f.name), **keywords)


def options_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Build ``cls`` from the flags :func:`add_option_flags` added (it checks the values itself).

    A flag left at ``None`` is not passed: the field's default (``None`` too, or made by its factory).
    """
    given = {f.name: getattr(args, f.name) for f in _flag_fields(cls)}
    return cls(**{name: value for name, value in given.items() if value is not None})


def _flag_fields(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init and "help" in f.metadata]
