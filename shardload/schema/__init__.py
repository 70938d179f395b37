"""The schema layer: what a sample is, above the base and below everything that stores or reads one.

``fields`` (:class:`Schema`, :class:`Field`), ``text`` (text fields) and ``cast``
(the one rule for changing a dtype). The names of the 0.1.0 module
``shardload.schema`` are re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardload.schema import fields as _fields
from shardload.schema.fields import *  # noqa: F403  (every name of fields.__all__)

__all__ = list(_fields.__all__)


if not TYPE_CHECKING:  # hidden from type checkers, which would take any attribute as this one's

    def __getattr__(name: str) -> object:
        """Any other name the 0.1.0 module ``shardload.schema`` held (``text_kind``, ...), from ``fields``."""
        return getattr(_fields, name)
