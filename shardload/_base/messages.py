"""Small pieces of the library's error messages, shared so that every message says them the same way."""

from __future__ import annotations

import signal

__all__ = ["format_bytes", "one_line", "signal_name"]


def format_bytes(n: int | float) -> str:
    """``1536000`` -> ``"1.5 MB"`` (decimal units, like disk sizes).

    >>> format_bytes(1536000), format_bytes(999)
    ('1.5 MB', '999 B')
    """
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def one_line(exc: BaseException) -> str:
    """``exc`` as ``"Type: message"`` on one line (a third-party message may span several).

    >>> one_line(ValueError("bad\\n  value"))
    'ValueError: bad value'
    >>> one_line(KeyError())
    'KeyError'
    """
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def signal_name(number: int) -> str:
    """The name of signal ``number`` (``"SIGKILL"``), or ``"signal N"`` for one this platform does not name.

    >>> signal_name(9)
    'SIGKILL'
    """
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
